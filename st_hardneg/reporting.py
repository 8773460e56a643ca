"""Writing results: the output-folder guard every written or removed file of a run goes through, atomic files,
resumable results files, summaries over seeds and markdown tables (no torch import).

**The output-folder guard.** :func:`check_output_path` resolves a path a run is about to write or remove and checks
that it lies inside the run's output folder: a symbolic link whose target is outside is refused, naming the link and
its target, and so is a dangling link where a file goes. :func:`check_output_tree` does the same for a folder another
library writes into (``final/``, ``checkpoint-N``), and for every entry already in it (no symbolic link at all there:
the library would write through it). :func:`atomic_write` writes a file through a temporary file created exclusively
(``O_EXCL``, never following a link) in the target's own folder, then renamed over the target, so a crash never leaves
half a file and a link at the target is replaced, never written through; :func:`remove_output_file` removes one
file, never through a link. ``write_json``, the per-query and TREC files, the plots, the checkpoint ledger and the
command line's output files are all written through them.

>>> from st_hardneg.reporting import markdown_table, write_json
>>> print(markdown_table(["method", "avg"], [["mnrl", "75.10"]]), end="")
| method | avg |
|---|---|
| mnrl | 75.10 |
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


class OutsideOutputFolderError(ValueError):
    """A path a run would write or remove leads out of its output folder (through a symbolic link or ``..``), or is
    a dangling symbolic link: nothing is written or removed there."""


def _absolute(path: str | os.PathLike[str]) -> Path:
    return Path(path).expanduser().absolute()  # not normalised: '..' after a link is the kernel's, not lexical


def check_output_path(path: str | os.PathLike[str], folder: str | os.PathLike[str] | None = None) -> Path:
    """``path`` (a file or folder a run is about to write or remove) once checked to lie inside ``folder``, the
    run's output folder (default: ``path``'s own folder), with every symbolic link on the way followed.

    Args:
        path: the file or folder to be written or removed.
        folder: the output folder it must stay inside (it may itself be a symbolic link: its target is the folder).

    Returns:
        ``Path(path)`` (unchanged: the caller writes where it meant to).

    Raises:
        OutsideOutputFolderError: ``path`` is a symbolic link whose target lies outside ``folder``, a dangling
            symbolic link (a file would be created at its target), or resolves outside ``folder`` (a link among its
            parent folders, or ``..``); the message names the path and where it leads.

    Example:
        ::

            check_output_path("out/per_query.tsv", "out")      # Path('out/per_query.tsv')
            # out/per_query.tsv -> /etc/passwd: OutsideOutputFolderError naming both
    """
    target = Path(path)
    absolute = _absolute(target)
    root = _absolute(folder) if folder is not None else absolute.parent
    if absolute.is_symlink() and not absolute.exists():
        raise OutsideOutputFolderError(
            f"{target} is a dangling symbolic link (to {os.readlink(absolute)}): a file written there would be "
            "created at its target; nothing is written through it (remove the link)")
    resolved, inside = absolute.resolve(), root.resolve()
    if not resolved.is_relative_to(inside):
        link = "a symbolic link" if absolute.is_symlink() else "a path"
        raise OutsideOutputFolderError(
            f"{target} is {link} to {resolved}, outside the output folder {root}: nothing is written or removed "
            "outside it (remove the link or choose another folder)")
    return target


def check_output_tree(path: str | os.PathLike[str], folder: str | os.PathLike[str] | None = None) -> Path:
    """:func:`check_output_path` for a folder that another library writes into (a saved model, a checkpoint): the
    folder itself, and every entry already in it, which may not be a symbolic link at all (the library would write
    through it). A missing folder passes (its parent is checked).

    Raises:
        OutsideOutputFolderError: the folder leads outside ``folder``, or an entry in it is a symbolic link (named,
            with its target).
    """
    target = Path(path)
    check_output_path(target, folder)
    absolute = _absolute(target)
    if absolute.is_symlink():
        raise OutsideOutputFolderError(f"{target} is a symbolic link (to {os.readlink(absolute)}): a saved model or "
                                       "checkpoint is written into a real folder only (remove the link)")
    if absolute.is_dir():
        for dirpath, dirnames, filenames in os.walk(absolute):
            for name in (*dirnames, *filenames):
                entry = Path(dirpath) / name
                if entry.is_symlink():
                    raise OutsideOutputFolderError(
                        f"{entry} is a symbolic link (to {os.readlink(entry)}): the files saved into {target} would be "
                        "written through it; remove the link")
    return target


def _umask() -> int:
    """The process's umask (read by setting it, and set back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def atomic_write(path: str | os.PathLike[str], folder: str | os.PathLike[str] | None = None, *,
                 text: bool = False) -> Iterator[IO[Any]]:
    """Write the file ``path`` atomically inside the output folder ``folder`` (default: ``path``'s own folder): the
    block writes to an open handle of a temporary file created exclusively in ``path``'s folder (a random name,
    ``O_EXCL``: never an existing file, never through a link), which then replaces ``path`` (a link there is
    replaced, not followed). When the block fails, the temporary file is removed and ``path`` is untouched.

    Args:
        path: the file to write (its missing parent folders are created, once checked).
        folder: the output folder it must stay inside (:func:`check_output_path`).
        text: a text handle (UTF-8, ``\\n`` line ends) instead of a binary one.

    Raises:
        OutsideOutputFolderError: see :func:`check_output_path`.

    Example:
        ::

            with atomic_write(out / "training_curve.png", out) as handle:
                figure.savefig(handle, format="png")
    """
    target = check_output_path(path, folder)
    target.parent.mkdir(parents=True, exist_ok=True)
    check_output_path(target, folder)  # the folders just made hold no link either
    descriptor, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    tmp = Path(name)
    try:
        with (os.fdopen(descriptor, "w", encoding="utf-8", newline="") if text else os.fdopen(descriptor, "wb")) \
                as handle:
            yield handle
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600 would hide the file from the user's group: the usual mode
        tmp.replace(target)
    finally:  # never leave the temporary file beside the target
        tmp.unlink(missing_ok=True)


def write_text(path: str | os.PathLike[str], content: str, folder: str | os.PathLike[str] | None = None) -> Path:
    """Write ``content`` (UTF-8) to ``path`` through :func:`atomic_write`; returns ``Path(path)``."""
    with atomic_write(path, folder, text=True) as handle:
        handle.write(content)
    return Path(path)


def remove_output_file(path: str | os.PathLike[str], folder: str | os.PathLike[str] | None = None) -> bool:
    """Remove the regular file ``path`` inside ``folder`` (:func:`check_output_path`); a symbolic link, a folder or
    a missing path is left alone. Returns whether it removed the file."""
    target = Path(path)
    if target.is_symlink() or not target.is_file():
        return False
    check_output_path(target, folder)
    target.unlink()
    return True


def write_json(path: str | Path, payload: dict[str, Any], folder: str | os.PathLike[str] | None = None) -> Path:
    """Write ``payload`` as indented JSON, atomically (a crash never leaves half a file), through the output-folder
    guard (:func:`atomic_write`; ``folder``: the output folder it must stay inside, default its own folder)."""
    return write_text(path, json.dumps(payload, indent=2, sort_keys=False) + "\n", folder)


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
            write_text(out.with_suffix(".md"), markdown(data))
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
    """Runs grouped by their ``"method"``, methods in order of first appearance; failed runs (a ``"failed"`` entry:
    a configuration that left no usable row, a study's failed trial) are left out."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        if run.get("failed"):
            continue
        groups.setdefault(run["method"], []).append(run)
    return groups


def failed_runs(runs: Iterable[dict[str, Any]]) -> list[str]:
    """One line per failed run: ``method (seed s): why``."""
    return [f"{run['method']} (seed {run['seed']}): {run['failed']}" for run in runs if run.get("failed")]
