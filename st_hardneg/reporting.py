"""Writing results: atomic JSON files, resumable results files, summaries over seeds and markdown tables (no torch
import).

>>> from st_hardneg.reporting import markdown_table, write_json
>>> print(markdown_table(["method", "avg"], [["mnrl", "75.10"]]), end="")
| method | avg |
|---|---|
| mnrl | 75.10 |
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any


def write_json(path: str | Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` as indented JSON, atomically (a crash never leaves half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        tmp.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")
        tmp.replace(path)
    finally:  # never leave the temporary file beside the target
        tmp.unlink(missing_ok=True)
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


def load_results(path: str | Path, protocol: dict[str, Any]) -> dict[str, Any]:
    """The results file at ``path`` (a benchmark resumes from it), or a new ``{"protocol": protocol, "runs": []}``.

    Raises:
        ValueError: the file exists but is not a JSON object with a ``runs`` list. It holds finished runs, so it is
            never rebuilt over (unlike a cache): the message names the file, to repair or move it.
    """
    path = Path(path)
    if path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise ValueError(f"the results file {path} cannot be read ({type(exc).__name__}: {exc}); it holds the "
                             "finished runs a benchmark resumes from: repair or move it") from exc
        if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
            raise ValueError(f"the results file {path} is not a results file (a JSON object with a 'runs' list); "
                             "repair or move it")
        return data
    return {"protocol": protocol, "runs": []}


def write_results(data: dict[str, Any], out: str | Path, markdown: Callable[[dict[str, Any]], str] | None = None,
                  plot: Callable[[dict[str, Any], Path], Any] | None = None) -> None:
    """Write ``data`` to ``out`` (JSON) and, once it holds runs, ``markdown(data)`` to ``out.md`` and
    ``plot(data, out.png)``."""
    out = Path(out)
    write_json(out, data)
    if data["runs"]:
        if markdown is not None:
            out.with_suffix(".md").write_text(markdown(data))
        if plot is not None:
            plot(data, out.with_suffix(".png"))


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value).

    Raises:
        statistics.StatisticsError: no values.
    """
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def mean_std_text(values: Sequence[float]) -> str:
    """``"mean ± std"`` to 2 decimals (sample std), the single value for one, ``"–"`` for none: a results cell."""
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def median_or_none(values: Iterable[float | None]) -> float | None:
    """The median of the values that are set (not ``None`` or 0: a run without that measurement), else ``None``."""
    kept = [v for v in values if v]
    return statistics.median(kept) if kept else None


def group_by_method(runs: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Runs grouped by their ``"method"``, methods in order of first appearance; failed runs (a ``"failed"`` entry,
    see ``benchmarks/harness.py``'s ``run_pending``) are left out."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        if run.get("failed"):
            continue
        groups.setdefault(run["method"], []).append(run)
    return groups


def failed_runs(runs: Iterable[dict[str, Any]]) -> list[str]:
    """One line per failed run: ``method (seed s): why``."""
    return [f"{run['method']} (seed {run['seed']}): {run['failed']}" for run in runs if run.get("failed")]
