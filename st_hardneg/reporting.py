"""Writing results: atomic JSON files and markdown tables (no torch import).

>>> from st_hardneg.reporting import markdown_table, write_json
>>> print(markdown_table(["method", "avg"], [["mnrl", "75.10"]]), end="")
| method | avg |
|---|---|
| mnrl | 75.10 |
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def write_json(path: str | Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` as indented JSON, atomically (a crash never leaves half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)
    return path


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]], align: Sequence[str] | None = None) -> str:
    """A GitHub markdown table, one line per row, ending with a newline.

    Args:
        header: column titles.
        rows: cells (converted with ``str``); every row must have ``len(header)`` cells.
        align: per column ``"l"``, ``"r"``, ``"c"`` or ``""`` (default ``---``, no alignment).

    Raises:
        ValueError: a row or ``align`` of the wrong length, or an unknown alignment.
    """
    rules = {"": "---", "l": ":---", "r": "---:", "c": ":---:"}
    align = list(align) if align is not None else [""] * len(header)
    if len(align) != len(header):
        raise ValueError(f"align has {len(align)} entries for {len(header)} columns")
    unknown = [a for a in align if a not in rules]
    if unknown:
        raise ValueError(f"unknown alignment(s) {unknown}; use 'l', 'r', 'c' or ''")
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "".join(rules[a] + "|" for a in align)]
    for number, row in enumerate(rows):
        if len(row) != len(header):
            raise ValueError(f"row {number} has {len(row)} cells for {len(header)} columns: {list(row)}")
        lines.append("| " + " | ".join(map(str, row)) + " |")
    return "\n".join(lines) + "\n"
