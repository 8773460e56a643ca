"""Resolve a package cross-reference written under a re-exported or short name to the one place it is documented.

The docstrings refer to names the way users import them (``st_hardneg.evaluation.evaluate_sts``, re-exported from
``st_hardneg.evaluation.sts``), and, inside a module, by their short name (``normalize``, ``Batch.rows``). autodoc
documents each object once, under the module that defines it. This handler runs only for a reference Sphinx could not
resolve: it looks the name up among the documented objects — the object's defining module for an importable name,
else the unique documented name ending in it — and links there. A name it cannot place unambiguously stays unresolved,
so with ``nitpicky`` and ``-W`` a truly broken reference still fails the build.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


def _import(path: str) -> Any:
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


def _candidates(target: str, module: str | None, cls: str | None) -> list[str]:
    target = target.lstrip(".~")
    names = []
    if module and cls:
        names.append(f"{module}.{cls}.{target}")
    if module:
        names.append(f"{module}.{target}")
    names.append(target)
    return names


def _via_parent(name: str, objects: Any) -> str | None:
    """``pkg.Class.attr`` through the class's defining module and its bases (an attribute or property has no
    ``__qualname__`` of its own), and ``alias.Name`` where ``alias`` is a module imported under another name
    (``fr.Direction`` for ``st_hardneg.functional.ranking.Direction``)."""
    parent_name, _, attr = name.rpartition(".")
    parent = _import(parent_name) if parent_name else None
    if isinstance(parent, type):
        for base in parent.__mro__:
            candidate = f"{base.__module__}.{base.__qualname__}.{attr}"
            if candidate in objects:
                return candidate
    if isinstance(parent, ModuleType) and parent.__name__.startswith("st_hardneg"):
        if f"{parent.__name__}.{attr}" in objects:
            return f"{parent.__name__}.{attr}"
        if hasattr(parent, attr) and parent.__name__ in objects:
            # a type alias (``Direction = Literal[...]``) has no entry of its own: link its module
            return parent.__name__
    return None


def _missing_reference(app: Any, env: Any, node: Any, contnode: Any) -> Any:
    if node.get("refdomain") != "py":
        return None
    domain = env.get_domain("py")
    objects = domain.objects
    target = node["reftarget"]
    if not (target.startswith("st_hardneg") or node.get("py:module", "").startswith("st_hardneg")):
        return None
    found = None
    for name in _candidates(target, node.get("py:module"), node.get("py:class")):
        if name in objects:
            found = name
            break
        obj = _import(name) if name.startswith("st_hardneg") else None
        qual = getattr(obj, "__qualname__", None)
        mod = getattr(obj, "__module__", None)
        if obj is not None and qual and mod and f"{mod}.{qual}" in objects:
            found = f"{mod}.{qual}"
            break
        found = _via_parent(name, objects) if name.startswith("st_hardneg") else None
        if found:
            break
    if found is None and node.get("py:module") and node.get("py:class"):
        # an inherited member, referred to from a subclass (``:attr:`diagnostics``` in a loss's docstring)
        cls = _import(f"{node['py:module']}.{node['py:class']}")
        for base in getattr(cls, "__mro__", ()):
            name = f"{base.__module__}.{base.__qualname__}.{target.lstrip('.~')}"
            if name in objects:
                found = name
                break
    if found is None:
        # the unique documented name ending in the target's last part (a full path: within its package)
        short = target.lstrip(".~")
        tail = "." + (short.rsplit(".", 1)[-1] if short.startswith("st_hardneg.") else short)
        matches = sorted(k for k in objects if k.startswith("st_hardneg.") and k.endswith(tail))
        if target.startswith("st_hardneg."):
            package = target.rsplit(".", 1)[0]
            matches = [k for k in matches if k.startswith(package + ".")]
        if len(matches) == 1:
            found = matches[0]
    if found is None:
        return None
    refdoc = node.get("refdoc", "")
    resolved = domain.resolve_xref(env, refdoc, app.builder, node["reftype"], found, node, contnode)
    if resolved is None:  # e.g. :func: written for a method: any role of the object's own type
        matches = domain.resolve_any_xref(env, refdoc, app.builder, found, node, contnode)
        resolved = matches[0][1] if matches else None
    return resolved


def setup(app: Any) -> dict[str, Any]:
    app.connect("missing-reference", _missing_reference)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
