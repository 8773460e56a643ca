"""The checkpoints a run writes, by name and file: what it may rotate away and remove, and nothing else.

A Trainer's output folder may hold what a user put there (notes, their own ``checkpoint-N`` folders, a project's
``checkpoints/my-best-model/`` under ``--output-dir .``, a file dropped into a checkpoint). transformers' rotation
(``save_total_limit``) deletes every ``checkpoint-*`` folder it finds, whole, and removing the whole folder after a
run deletes everything in it. st-hardneg does neither: every checkpoint an st-hardneg run writes is recorded in the
folder's ledger (:data:`LEDGER_FILE`) by name *and* with the files the run wrote into it (each with its size and
modification time), rotation and clean-up consider only the checkpoints this run wrote and remove them file by file,
only the files this run wrote and that are unchanged since (:func:`remove_checkpoint`; a file the user added or
changed stays, and is named in a warning), and the command line refuses a checkpoint folder that holds anything no
st-hardneg run of it wrote unless ``--overwrite`` is given (:func:`foreign_entries`), and even then leaves those
entries alone. A crashed run's checkpoints are not rewritten by a fresh run without ``--overwrite``
(:func:`check_checkpoint_folder`).

The ledger is input, and checked as input: a name it lists is trusted only when it is a ``checkpoint-N`` folder
(the name pattern), a real folder inside the checkpoint folder (not a symbolic link), with the record of its files;
anything else it lists is not the run's, never rotated or removed. It is written atomically through a temporary
file created exclusively, and never read or written through a symbolic link.

Only the standard library and :mod:`st_hardneg.reporting` (the output-folder guard) are imported here (the command
line checks before torch loads).
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path, PurePosixPath

from st_hardneg.reporting import check_output_path, check_output_tree, remove_output_file, write_text

__all__ = ["LEDGER_FILE", "RUN_FOLDERS", "CheckpointLedger", "check_checkpoint_folder", "file_record",
           "foreign_entries", "remove_checkpoint", "remove_written"]

#: the ledger of an output folder: the checkpoint folders written there by st-hardneg runs, with their files
LEDGER_FILE = ".st-hardneg-checkpoints.json"
#: folders other than checkpoints that a run's Trainer makes in the checkpoint folder (the evaluator's ``eval/``)
RUN_FOLDERS = ("eval",)
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")

#: the files of one checkpoint: relative POSIX path → ``[size, modification time in ns]``
FileRecord = dict[str, list[int]]


def _fingerprint(path: Path) -> list[int] | None:
    """``[size, mtime_ns]`` of the regular file ``path`` (a link is never followed), else ``None``."""
    try:
        stat = path.lstat()
    except OSError:
        return None
    import stat as stat_module

    return [stat.st_size, stat.st_mtime_ns] if stat_module.S_ISREG(stat.st_mode) else None


def file_record(folder: str | Path) -> FileRecord:
    """Every regular file under ``folder`` (symbolic links are neither followed nor listed), by relative POSIX
    path, with ``[size, mtime_ns]``: what a run records of a checkpoint it wrote."""
    root = Path(folder)
    record: FileRecord = {}
    if root.is_symlink() or not root.is_dir():
        return record
    for dirpath, _, filenames in os.walk(root):  # followlinks=False: a linked folder is not entered
        for name in filenames:
            path = Path(dirpath) / name
            fingerprint = _fingerprint(path)
            if fingerprint is not None:
                record[path.relative_to(root).as_posix()] = fingerprint
    return record


def _entries(folder: Path) -> list[str]:
    """Everything under ``folder`` (files, links, folders), by relative POSIX path, deepest entries included."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in (*dirnames, *filenames):
            found.append((Path(dirpath) / name).relative_to(folder).as_posix())
    return sorted(found)


def _safe_relative(name: str) -> bool:
    path = PurePosixPath(name)
    return bool(name) and "\\" not in name and "\0" not in name and not path.is_absolute() and \
        all(part not in ("", ".", "..") for part in path.parts) and path.as_posix() == name


class CheckpointLedger:
    """The checkpoint folders st-hardneg runs wrote inside ``folder``, with the files written into each, kept in
    ``folder/LEDGER_FILE``.

    Args:
        folder: the Trainer's output folder (``--output-dir``/``checkpoints`` on the command line).
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LEDGER_FILE

    # ------------------------------------------------------------------ reading, as input
    def _load(self) -> dict[str, object]:
        """The ledger file's content, its types checked (``written``, ``files``, ``folders``, ``created_folder``).

        Raises:
            ValueError: the ledger is a symbolic link, or exists but is not one (damaged): named, with the fix.
        """
        empty: dict[str, object] = {"written": [], "files": {}, "folders": [], "created_folder": False}
        if self.path.is_symlink():
            raise ValueError(f"{self.path} is a symbolic link: the checkpoint ledger is read and written in place "
                             "only, never through a link; remove the link")
        if not self.path.is_file():
            return empty
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise TypeError("not a JSON object")
            written = data["written"]
            if not isinstance(written, list) or not all(isinstance(name, str) for name in written):
                raise TypeError("written is not a list of names")
            files = data.get("files", {})
            if not isinstance(files, dict) or not all(
                    isinstance(record, dict) and all(
                        isinstance(rel, str) and isinstance(fp, list) and len(fp) == 2
                        and all(isinstance(v, int) and not isinstance(v, bool) for v in fp)
                        for rel, fp in record.items()) for record in files.values()):
                raise TypeError("files is not a mapping of checkpoint → {file: [size, mtime_ns]}")
            folders = data.get("folders", [])
            if not isinstance(folders, list) or not all(isinstance(name, str) for name in folders):
                raise TypeError("folders is not a list of names")
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{self.path} is damaged ({exc}); it lists the checkpoints st-hardneg wrote in "
                             f"{self.folder}: remove it only if nothing there is st-hardneg's") from None
        return {"written": written, "files": files, "folders": folders,
                "created_folder": bool(data.get("created_folder", False))}

    def _trusted(self, name: str, files: Mapping[str, object]) -> bool:
        """``name`` is a checkpoint the ledger's run wrote: the name pattern, a record of its files (each a plain
        relative path), and a real folder inside the checkpoint folder (or gone)."""
        record = files.get(name)
        if not _CHECKPOINT.match(name) or not isinstance(record, dict) or not all(map(_safe_relative, record)):
            return False
        path = self.folder / name
        if path.is_symlink():
            return False
        if not path.exists():
            return True
        return path.is_dir() and path.resolve().is_relative_to(self.folder.resolve())

    def read(self) -> dict[str, object]:
        """The ledger's content: ``{"written": [trusted names], "created_folder": bool}`` (empty when there is
        none); the names it lists that are not trusted (see the module) are left out, with a warning naming them.

        Raises:
            ValueError: the ledger file is a symbolic link, or exists but is not one (damaged).
        """
        state = self._load()
        files = state["files"]
        assert isinstance(files, dict)
        listed = list(state["written"])  # type: ignore[call-overload]
        trusted = [name for name in listed if self._trusted(name, files)]
        untrusted = [name for name in listed if name not in trusted]
        if untrusted:
            warnings.warn(f"{self.path} lists {', '.join(map(repr, untrusted[:5]))}, which is not a checkpoint-N "
                          "folder that the ledger's run wrote (name, record of its files, a real folder inside "
                          f"{self.folder}): not trusted, never rotated or removed", UserWarning, stacklevel=2)
        return {"written": trusted, "created_folder": state["created_folder"]}

    def written(self) -> list[str]:
        """The checkpoint folder names st-hardneg runs wrote in the folder (still listed, and trusted)."""
        return list(self.read()["written"])  # type: ignore[call-overload]

    def files(self, name: str) -> FileRecord:
        """The files the ledger records for the trusted checkpoint ``name`` (``{}`` for another name)."""
        state = self._load()
        files = state["files"]
        assert isinstance(files, dict)
        if name not in state["written"] or not self._trusted(name, files):  # type: ignore[operator]
            return {}
        return {rel: list(fp) for rel, fp in files[name].items()}

    def ours(self, name: str) -> FileRecord:
        """Of :meth:`files`, those still in place unchanged (same size and modification time): st-hardneg's."""
        folder = self.folder / name
        return {rel: fp for rel, fp in self.files(name).items() if _fingerprint(folder / rel) == fp}

    def run_folders(self) -> list[str]:
        """The folders of :data:`RUN_FOLDERS` a run recorded making here (real folders, not links)."""
        listed = self._load()["folders"]
        return [name for name in RUN_FOLDERS if name in listed  # type: ignore[operator]
                and not (self.folder / name).is_symlink()]

    # ------------------------------------------------------------------ writing
    def _write(self, state: dict[str, object]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        written = sorted(set(state["written"]), key=_order)  # type: ignore[call-overload]
        files = {name: state["files"][name] for name in written if name in state["files"]}  # type: ignore[index,operator]
        folders = sorted(set(state["folders"]))  # type: ignore[call-overload]
        # a temporary file created exclusively beside the ledger, then renamed over it (never through a link)
        write_text(self.path, json.dumps({"written": written, "files": files, "folders": folders,
                                          "created_folder": bool(state["created_folder"])}, indent=1), self.folder)

    def begin(self) -> None:
        """Called before a run writes anything: records whether the folder existed (a folder st-hardneg created is
        removed again once it holds nothing)."""
        state = self._load()
        state["created_folder"] = bool(state["created_folder"]) or not self.folder.exists()
        self._write(state)

    def add(self, name: str, files: Mapping[str, Sequence[int]] | None = None) -> None:
        """Record the checkpoint folder ``name`` as written by an st-hardneg run, with the files written into it
        (``None``: every regular file in it now, :func:`file_record`).

        Raises:
            ValueError: ``name`` is not a ``checkpoint-N`` name, or a file name leaves the folder.
        """
        if not _CHECKPOINT.match(name):
            raise ValueError(f"the checkpoint ledger records checkpoint-N folders only, got {name!r}")
        record = file_record(self.folder / name) if files is None else {rel: list(fp) for rel, fp in files.items()}
        bad = [rel for rel in record if not _safe_relative(rel)]
        if bad:
            raise ValueError(f"checkpoint {name}: {bad[0]!r} is not a plain relative file name")
        state = self._load()
        state["written"] = [*state["written"], name]  # type: ignore[misc]
        state["files"] = {**state["files"], name: record}  # type: ignore[dict-item]
        self._write(state)

    def add_folder(self, name: str) -> None:
        """Record that a run made the folder ``name`` (one of :data:`RUN_FOLDERS`) in the checkpoint folder."""
        if name not in RUN_FOLDERS:
            raise ValueError(f"the checkpoint ledger records the run folders {RUN_FOLDERS} only, got {name!r}")
        state = self._load()
        state["folders"] = [*state["folders"], name]  # type: ignore[misc]
        self._write(state)

    def forget(self, names: Iterable[str]) -> None:
        """Drop ``names`` from the ledger; with no checkpoint left, remove the run folders it recorded when empty,
        the ledger, and the folder too when st-hardneg created it and it is empty (never a symbolic link)."""
        state = self._load()
        gone = set(names)
        left = [name for name in state["written"] if name not in gone]  # type: ignore[attr-defined]
        if left:
            state["written"] = left
            self._write(state)
            return
        for name in self.run_folders():
            try:
                (self.folder / name).rmdir()  # only when empty
            except OSError:
                pass
        remove_output_file(self.path, self.folder)
        if state["created_folder"] and not self.folder.is_symlink():
            try:
                self.folder.rmdir()  # only when empty
            except OSError:
                pass


def _order(name: str) -> tuple[int, str]:
    match = _CHECKPOINT.match(name)
    return (int(match.group(1)) if match else -1, name)


def foreign_entries(folder: str | Path) -> list[str]:
    """The entries of ``folder`` that no st-hardneg run of it wrote, sorted: those its ledger does not list (or
    lists without trust), and inside a listed checkpoint the files it has no unchanged record of
    (``checkpoint-2/notes.txt``); ``[]`` for a missing folder."""
    root = Path(folder)
    if not root.is_dir():
        return []
    ledger = CheckpointLedger(root)
    written = ledger.written()
    ours = set(written) | set(ledger.run_folders()) | {LEDGER_FILE}
    found = [entry.name for entry in root.iterdir() if entry.name not in ours]
    for name in written:
        checkpoint = root / name
        if checkpoint.is_dir():
            record = ledger.ours(name)
            found += [f"{name}/{rel}" for rel in _entries(checkpoint)
                      if rel not in record and not (checkpoint / rel).is_dir()
                      or (checkpoint / rel).is_symlink()]
    return sorted(found)


def _resume_step(resume: str | Path | None) -> int:
    """The step of the checkpoint a run resumes from (0: a fresh run)."""
    if not resume:
        return 0
    match = _CHECKPOINT.match(Path(resume).name)
    return int(match.group(1)) if match else 0


def check_checkpoint_folder(folder: str | Path, overwrite: bool, *, planned_steps: int | None = None,
                            option: str = "--output-dir", leftovers: bool = False,
                            resume: str | Path | None = None) -> None:
    """Refuse a checkpoint folder that holds what no st-hardneg run of it wrote, unless ``overwrite``; with
    ``overwrite`` such entries stay untouched, but a foreign ``checkpoint-N`` the run could write into
    (``N <= planned_steps``) is refused all the same. With ``leftovers``, the checkpoints an earlier st-hardneg run
    of the folder left (a crashed run) that this run would save over are refused too, unless ``overwrite``: all of
    them for a fresh run, those after the step it resumes from (``resume``, a ``checkpoint-N`` folder) otherwise.

    Raises:
        ValueError: one line naming the folder, up to five entries, and the way out.
    """
    root = Path(folder)
    foreign = foreign_entries(root)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        if not overwrite:
            raise ValueError(f"{option}: {folder} holds {shown}, which no st-hardneg run of this folder wrote; choose "
                             "another --output-dir, or pass --overwrite to train beside them (they are left untouched)")
        if planned_steps is not None:
            clash = [name for name in foreign
                     if (m := _CHECKPOINT.match(name)) and 0 < int(m.group(1)) <= planned_steps]
            for name in clash:  # a link the Trainer would save through: named as one
                check_output_tree(root / name, root)
            if clash:
                raise ValueError(f"{option}: {folder} holds {', '.join(clash[:5])}, not written by st-hardneg, and "
                                 f"this run of {planned_steps} steps could save into it; move it or choose another "
                                 "--output-dir")
    if planned_steps is not None:  # a checkpoint of an earlier run the Trainer could save into: no link in it
        for name in CheckpointLedger(root).written():
            if int(name.split("-")[1]) <= planned_steps:
                check_output_tree(root / name, root)
    if leftovers and not overwrite:
        step = _resume_step(resume)
        left = [name for name in CheckpointLedger(root).written()
                if (root / name).is_dir() and int(_CHECKPOINT.match(name).group(1)) > step]  # type: ignore[union-attr]
        if left:
            shown = ", ".join(left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
            if step:
                raise ValueError(f"{option}: {folder} holds {shown}, saved by an earlier st-hardneg run after step "
                                 f"{step}, which this run resumes from: it would save over them; pass --overwrite "
                                 "to replace them, or resume from the latest one (resume_from_checkpoint=last)")
            raise ValueError(f"{option}: {folder} holds {shown}, left by an earlier st-hardneg run of this folder "
                             "that did not finish: a fresh run would save over them; pass --training-arg "
                             "resume_from_checkpoint=last to continue that run, or --overwrite to start afresh")


def remove_checkpoint(folder: str | Path, name: str, files: Mapping[str, Sequence[int]],
                      ledger: CheckpointLedger | None = None) -> list[str]:
    """Remove the checkpoint ``folder/name`` file by file: each file of ``files`` (relative path → ``[size,
    mtime_ns]``, what a run wrote) that is still a regular file with that size and modification time, then the
    folders that held them once empty, then the checkpoint folder once empty. Anything else stays (a file the user
    added or changed, a link) and is named in a warning. With ``ledger``, the checkpoint is forgotten once gone (or
    keeps the record of the st-hardneg files that stay). Returns what stays (relative paths; ``[]``: removed).

    A symbolic link at ``folder/name``, or a path that leads outside ``folder``, is never entered.
    """
    root = Path(folder)
    target = root / name
    if not _CHECKPOINT.match(name) or target.is_symlink() or not target.is_dir():
        return []
    check_output_path(target, root)
    parents: set[PurePosixPath] = set()
    for rel, fingerprint in files.items():
        if not _safe_relative(rel):
            continue
        path = target / rel
        if _fingerprint(path) == list(fingerprint) and not any(p.is_symlink() for p in path.parents
                                                                if p != target and p.is_relative_to(target)):
            remove_output_file(path, target)
            parents.update(PurePosixPath(rel).parents)
    for parent in sorted(parents - {PurePosixPath(".")}, key=lambda p: len(p.parts), reverse=True):
        try:
            (target / parent).rmdir()  # only when empty
        except OSError:
            pass
    try:
        target.rmdir()
    except OSError:
        pass
    left = _entries(target) if target.is_dir() else []
    if left:
        shown = ", ".join(left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
        warnings.warn(f"{target} is kept: it holds {shown}, which this run did not write (the run's own files in it "
                      "were removed)", UserWarning, stacklevel=2)
    if ledger is not None:
        keep = {rel: fp for rel, fp in ledger.ours(name).items() if rel in left}
        if target.is_dir() and keep:
            ledger.add(name, keep)
        else:
            ledger.forget([name])
    return left


def remove_written(folder: str | Path, names: Iterable[str]) -> list[str]:
    """Remove the checkpoints ``names`` (those one run wrote) from ``folder`` and from its ledger, file by file
    (:func:`remove_checkpoint`: only the files the ledger records, unchanged); a name that is not a trusted
    ``checkpoint-N`` of the ledger is never touched. Returns the names removed whole."""
    root = Path(folder)
    ledger = CheckpointLedger(root)
    listed = set(ledger.written())
    removed = []
    asked = list(names)
    for name in asked:
        target = root / name
        if name in listed and target.is_dir() and not target.is_symlink() and \
                not remove_checkpoint(root, name, ledger.files(name)):
            removed.append(name)
    ledger.forget([name for name in asked if name in listed and not (root / name).exists()])
    return removed
