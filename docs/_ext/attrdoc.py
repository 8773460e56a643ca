"""Keep napoleon from reading an attribute's first docstring line as ``type: description``.

Napoleon parses the first line of a data / attribute / property docstring as ``type: description`` when it holds a
colon, so ``#: the score a degenerate model gets: -100`` would render "the score a degenerate model gets" as a type
(and, with ``nitpicky``, fail as an unresolved class). The package's attribute docstrings are prose, never typed that
way (the type is in the annotation): their lines are kept before napoleon runs and put back after it.
"""

from __future__ import annotations

from typing import Any

_KEPT: dict[str, list[str]] = {}


def _keep(app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    if what in ("attribute", "data", "property"):
        _KEPT[name] = list(lines)


def _restore(app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    kept = _KEPT.pop(name, None)
    if kept is not None:
        lines[:] = kept


def setup(app: Any) -> dict[str, Any]:
    app.connect("autodoc-process-docstring", _keep, priority=100)  # before napoleon (500)
    app.connect("autodoc-process-docstring", _restore, priority=900)  # after it
    return {"parallel_read_safe": False, "parallel_write_safe": True}
