"""The checkpoints a run writes, by name: what it may rotate away and remove, and nothing else.

A Trainer's output folder may hold what a user put there (notes, their own ``checkpoint-N`` folders, a project's
``checkpoints/my-best-model/`` under ``--output-dir .``). transformers' rotation (``save_total_limit``) deletes every
``checkpoint-*`` folder it finds, and removing the whole folder after a run deletes everything in it. st-hardneg
does neither: every checkpoint an st-hardneg run writes is recorded by name in the folder's ledger
(:data:`LEDGER_FILE`), rotation and clean-up consider only the folders this run wrote
(:class:`st_hardneg.training.callbacks.CheckpointLedgerCallback`), and the command line refuses a checkpoint folder
that holds anything no st-hardneg run of it wrote unless ``--overwrite`` is given (:func:`foreign_entries`), and
even then leaves those entries alone.

Only the standard library is imported here (the command line checks before torch loads).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = ["LEDGER_FILE", "CheckpointLedger", "check_checkpoint_folder", "foreign_entries", "remove_written"]

#: the ledger of an output folder: the checkpoint folders written there by st-hardneg runs
LEDGER_FILE = ".st-hardneg-checkpoints.json"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


class CheckpointLedger:
    """The names of the checkpoint folders st-hardneg runs wrote inside ``folder``, kept in ``folder/LEDGER_FILE``.

    Args:
        folder: the Trainer's output folder (``--output-dir``/``checkpoints`` on the command line).
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LEDGER_FILE

    def read(self) -> dict[str, object]:
        """The ledger's content: ``{"written": [names], "created_folder": bool}`` (empty when there is none).

        Raises:
            ValueError: the ledger file exists but is not one (damaged): named, with the fix.
        """
        if not self.path.is_file():
            return {"written": [], "created_folder": False}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            written = data["written"]
            if not isinstance(written, list) or not all(isinstance(name, str) for name in written):
                raise TypeError("written is not a list of names")
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{self.path} is damaged ({exc}); it lists the checkpoints st-hardneg wrote in "
                             f"{self.folder}: remove it only if nothing there is st-hardneg's") from None
        return {"written": written, "created_folder": bool(data.get("created_folder", False))}

    def written(self) -> list[str]:
        """The checkpoint folder names st-hardneg runs wrote in the folder (still listed)."""
        return list(self.read()["written"])  # type: ignore[call-overload]

    def _write(self, written: Sequence[str], created_folder: bool) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({"written": sorted(set(written), key=_order), "created_folder": created_folder},
                                  indent=1), encoding="utf-8")
        tmp.replace(self.path)

    def begin(self) -> None:
        """Called before a run writes anything: records whether the folder existed (a folder st-hardneg created is
        removed again once it holds nothing)."""
        state = self.read()
        created = bool(state["created_folder"]) or not self.folder.exists()
        self._write(self.written(), created)

    def add(self, name: str) -> None:
        """Record the checkpoint folder ``name`` as written by an st-hardneg run."""
        state = self.read()
        self._write([*self.written(), name], bool(state["created_folder"]))

    def forget(self, names: Iterable[str]) -> None:
        """Drop ``names`` from the ledger; with nothing left, remove the ledger, and the folder too when st-hardneg
        created it and it is empty (never a symbolic link)."""
        state = self.read()
        gone = set(names)
        left = [name for name in self.written() if name not in gone]
        if left:
            self._write(left, bool(state["created_folder"]))
            return
        self.path.unlink(missing_ok=True)
        if state["created_folder"] and not self.folder.is_symlink():
            try:
                self.folder.rmdir()  # only when empty
            except OSError:
                pass


def _order(name: str) -> tuple[int, str]:
    match = _CHECKPOINT.match(name)
    return (int(match.group(1)) if match else -1, name)


def foreign_entries(folder: str | Path) -> list[str]:
    """The entries of ``folder`` that no st-hardneg run of it wrote (not in its ledger), sorted; ``[]`` for a missing
    folder."""
    root = Path(folder)
    if not root.is_dir():
        return []
    ours = set(CheckpointLedger(root).written()) | {LEDGER_FILE}
    return sorted(entry.name for entry in root.iterdir() if entry.name not in ours)


def check_checkpoint_folder(folder: str | Path, overwrite: bool, *, planned_steps: int | None = None,
                            option: str = "--output-dir") -> None:
    """Refuse a checkpoint folder that holds what no st-hardneg run of it wrote, unless ``overwrite``; with
    ``overwrite`` such entries stay untouched, but a foreign ``checkpoint-N`` the run could write into
    (``N <= planned_steps``) is refused all the same.

    Raises:
        ValueError: one line naming the folder, up to five foreign entries, and the way out.
    """
    foreign = foreign_entries(folder)
    if not foreign:
        return
    shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
    if not overwrite:
        raise ValueError(f"{option}: {folder} holds {shown}, which no st-hardneg run of this folder wrote; choose "
                         "another --output-dir, or pass --overwrite to train beside them (they are left untouched)")
    if planned_steps is not None:
        clash = [name for name in foreign if (m := _CHECKPOINT.match(name)) and 0 < int(m.group(1)) <= planned_steps]
        if clash:
            raise ValueError(f"{option}: {folder} holds {', '.join(clash[:5])}, not written by st-hardneg, and this "
                             f"run of {planned_steps} steps could save into it; move it or choose another --output-dir")


def remove_written(folder: str | Path, names: Iterable[str]) -> list[str]:
    """Remove the checkpoint folders ``names`` (those one run wrote) from ``folder`` and from its ledger; a name
    that is not a ``checkpoint-N`` folder listed in the ledger is never removed. Returns the names removed."""
    root = Path(folder)
    ledger = CheckpointLedger(root)
    listed = set(ledger.written())
    removed = []
    for name in names:
        target = root / name
        if name in listed and _CHECKPOINT.match(name) and target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
            removed.append(name)
    ledger.forget([name for name in names if name in listed])
    return removed
