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


#: the documented object types a role may point at
_ROLE_TYPES = {
    "attr": {"attribute", "property", "data"}, "data": {"data", "attribute"}, "meth": {"method", "function"},
    "func": {"function", "method"}, "class": {"class", "exception"}, "exc": {"exception", "class"},
    "obj": None, "mod": {"module"}, "const": {"data", "attribute"},
}


def _related(owner: Any, context: type) -> bool:
    """Whether ``owner`` is a class that ``context`` derives from or that derives from it (``TypedDict`` classes
    refuse ``issubclass``: unrelated)."""
    if not isinstance(owner, type):
        return False
    try:
        return issubclass(owner, context) or issubclass(context, owner)
    except TypeError:
        return False


def _owner(name: str) -> Any:
    return _import(name.rsplit(".", 1)[0])


def _by_suffix(target: str, node: Any, objects: Any) -> str | None:
    """The documented name ending in ``target`` (its last part for a full path, within its package), narrowed to
    the object types the role can name, then to the classes related to the referring class (its bases or
    subclasses: a mixin's docstring naming the loss's method), then to the referring module; ``None`` unless one
    is left."""
    short = target.lstrip(".~")
    if short.startswith("st_hardneg."):
        tail, package = "." + short.rsplit(".", 1)[-1], short.rsplit(".", 1)[0] + "."
    else:
        tail, package = "." + short, "st_hardneg."
    matches = sorted(k for k in objects if k.startswith(package) and k.endswith(tail))
    if not matches and "." in short and not short.startswith("st_hardneg."):
        # ``Cls.member`` where ``member`` is inherited by the documented class ``Cls``
        owner, member = short.rsplit(".", 1)
        classes = [k for k in objects if k.endswith("." + owner) and objects[k].objtype == "class"]
        if len(classes) == 1:
            cls = _import(classes[0])
            for base in getattr(cls, "__mro__", ()):
                if f"{base.__module__}.{base.__qualname__}.{member}" in objects:
                    return f"{base.__module__}.{base.__qualname__}.{member}"
    types = _ROLE_TYPES.get(node.get("reftype", ""))
    if types is not None and len(matches) > 1:
        matches = [k for k in matches if objects[k].objtype in types] or matches
    context = node.get("py:class") and _import(f"{node.get('py:module')}.{node.get('py:class')}")
    if isinstance(context, type) and len(matches) > 1:
        related = [k for k in matches if _related(_owner(k), context)]
        matches = related or matches
    if len(matches) > 1 and node.get("py:module"):
        matches = [k for k in matches if k.startswith(node["py:module"] + ".")] or matches
    return matches[0] if len(matches) == 1 else None


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
        found = _by_suffix(target, node, objects)
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
