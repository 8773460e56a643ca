"""Output paths of the command line, proven writable before any model is loaded.

``os.access`` is not proof: as root it says yes to ``/proc`` or a read-only mount, and the run then fails after
the work. :func:`ensure_writable_dir` and :func:`ensure_writable_file` create (and remove) a probe file in the very
folder the run will write to, creating missing folders for the probe and removing them again, so nothing is left
behind by the check. ``st-hardneg train --output-dir`` and ``st-hardneg eval --output-dir`` both use them::

    from st_hardneg.cli.paths import ensure_writable_dir, ensure_writable_file

    ensure_writable_dir(args.output_dir, "--output-dir")          # a folder for checkpoints, models, results
    ensure_writable_file(args.output, "--output")                 # one JSON file

A run holds its output folder for its whole life (:func:`output_lock`): a second run into the same folder is
refused ("the folder is in use by pid N"), never interleaved with the first::

    with output_lock(args.output_dir, "--output-dir"):
        ...  # check what is there, train, write

Only the standard library and :mod:`st_hardneg.reporting` (the output-folder guard) are imported here (``--help``
stays fast).
"""

from __future__ import annotations

import errno
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from st_hardneg.reporting import OutsideOutputFolderError, check_output_path

__all__ = ["LOCK_FILE", "FolderInUseError", "check_path_component", "ensure_inside", "ensure_writable_dir",
           "ensure_writable_file", "holding_output_folder", "output_lock"]

#: the lock file a run holds inside its output folder while it runs (removed when it ends)
LOCK_FILE = ".st-hardneg.lock"


class FolderInUseError(ValueError):
    """Another st-hardneg run holds the output folder (:func:`output_lock`): this run is refused before it starts."""


def check_path_component(value: str, option: str) -> str:
    """``value`` as one file or folder name inside an output folder (``--revision``, a model or task name): not
    empty, not ``.`` or ``..``, no path separator, no NUL byte. Returns ``value``.

    Raises:
        ValueError: one line naming ``option`` and the value, which would leave its folder.
    """
    text = str(value)
    if not text.strip() or text in (".", "..") or any(sep in text for sep in ("/", "\\", "\0")) or \
            Path(text).is_absolute():
        raise ValueError(f"{option} {text!r} must be a plain name (no '/', '\\', '..' or absolute path): it becomes "
                         "a folder or file name inside the output folder")
    return text


def ensure_inside(path: str | os.PathLike[str], folder: str | os.PathLike[str], what: str) -> Path:
    """``path`` if it lies inside ``folder`` once both are resolved (symbolic links followed), else an error.

    Raises:
        ValueError: naming ``what`` and both paths.
    """
    try:
        check_output_path(Path(path).expanduser(), Path(folder).expanduser())  # the one guard of every written path
    except OutsideOutputFolderError as exc:
        raise OutsideOutputFolderError(f"{what}: {exc}") from None
    target = Path(path).expanduser().resolve()
    root = Path(folder).expanduser().resolve()
    if not target.is_relative_to(root):
        raise ValueError(f"{what} {path} lies outside {folder}; nothing is written outside the output folder")
    return Path(path)


@contextmanager
def output_lock(folder: str | os.PathLike[str], option: str = "--output-dir") -> Iterator[Path]:
    """Hold the output folder ``folder`` for the block: an exclusive advisory lock (``fcntl.flock``) on
    ``folder/LOCK_FILE``, which holds the process id. A second run into the same folder is refused at once; the
    kernel releases the lock when the process ends, however it ends (a crashed run never blocks the next one). At
    the end of the block the lock file is removed, and the folders made for it when they are still empty. Where
    ``fcntl`` does not exist (Windows) the block runs unlocked.

    Args:
        folder: the run's output folder (made when missing).
        option: the command-line option named in the error message.

    Returns:
        The folder, as a context manager's value.

    Raises:
        FolderInUseError: another process holds the lock (named by its process id).
        OutsideOutputFolderError: the lock file is a symbolic link, or leads outside ``folder``.

    Example:
        ::

            with output_lock("output/run1"):    # a second `st-hardneg train --output-dir output/run1` is refused
                ...
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: no advisory locks of this kind
        yield Path(folder)
        return
    root = Path(folder).expanduser()
    created: list[Path] = []
    missing = root
    while not missing.exists() and not missing.is_symlink() and missing.parent != missing:
        created.append(missing)
        missing = missing.parent
    root.mkdir(parents=True, exist_ok=True)
    lock = root / LOCK_FILE
    descriptor = -1
    try:
        for _ in range(10):  # the file may be removed by the run that held it between our open and our lock
            check_output_path(lock, root)
            if lock.is_symlink():
                raise OutsideOutputFolderError(f"{lock} is a symbolic link; the lock file is never followed: remove it")
            descriptor = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
                holder = os.read(descriptor, 64).decode("ascii", "replace").strip() or "unknown"
                os.close(descriptor)
                descriptor = -1
                raise FolderInUseError(
                    f"{option} {root}: the folder is in use by pid {holder} (another st-hardneg run holds {lock}); "
                    "wait for it to end, or choose another folder") from None
            try:
                same = os.stat(lock, follow_symlinks=False).st_ino == os.fstat(descriptor).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(descriptor)  # we locked a file that is no longer the lock file: try again
            descriptor = -1
        else:
            raise FolderInUseError(f"{option} {root}: the folder's lock file {lock} keeps changing; another "
                                   "st-hardneg run is starting there")
        os.ftruncate(descriptor, 0)
        os.write(descriptor, f"{os.getpid()}\n".encode())
        yield root
    finally:
        if descriptor >= 0:
            try:
                lock.unlink()  # while still held: a run waiting on this file sees it gone and opens a new one
            except OSError:
                pass
            os.close(descriptor)
        for path in created:  # deepest first; only folders made for the lock that are empty again
            try:
                path.rmdir()
            except OSError:
                pass


def _probe(folder: Path, option: str, shown: Path) -> None:
    """Create the missing part of ``folder``, write and remove a probe file in it, remove what was created."""
    created: list[Path] = []
    missing = folder
    while not missing.exists():
        created.append(missing)
        if missing.parent == missing:
            break
        missing = missing.parent
    try:
        for path in reversed(created):
            path.mkdir()
        probe = folder / f".st-hardneg-write-test-{uuid.uuid4().hex[:12]}"
        with open(probe, "wb") as handle:
            handle.write(b"ok")
        probe.unlink()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ValueError(f"{option} {shown} cannot be written ({reason}: {exc.filename or folder})") from None
    finally:
        for path in created:  # deepest first; a folder the check made holds nothing now
            try:
                path.rmdir()
            except OSError:
                pass


def ensure_writable_dir(path: str | os.PathLike[str], option: str = "--output-dir") -> Path:
    """Prove that the folder ``path`` can be written: create a probe file in it (and the missing folders on the
    way), then remove them all. Returns the expanded path; nothing is left behind.

    Args:
        path: the folder the run will write to (it may not exist yet).
        option: the command-line option named in the error message.

    Returns:
        ``Path(path).expanduser()``.

    Raises:
        ValueError: an empty path, a path that is a file, or a folder that cannot be written (one line naming
            ``option``, the path and the reason).

    Example:
        ::

            ensure_writable_dir("output/run1")        # Path('output/run1'); output/ and run1/ are not left behind
            ensure_writable_dir("/proc/run1")          # ValueError: --output-dir /proc/run1 cannot be written (...)
    """
    if not str(path).strip():
        raise ValueError(f"{option} is empty; give a folder path")
    folder = Path(path).expanduser()
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{option} {folder} is a file, not a folder")
    ancestor = folder
    while not ancestor.exists() and ancestor.parent != ancestor:
        ancestor = ancestor.parent
    if ancestor.exists() and not ancestor.is_dir():
        raise ValueError(f"{option} {folder} cannot be written ({ancestor} is a file, not a folder)")
    _probe(folder, option, folder)
    return folder


def ensure_writable_file(path: str | os.PathLike[str], option: str = "--output") -> Path:
    """Prove that the file ``path`` can be written: its folder must take a probe file (see
    :func:`ensure_writable_dir`); the file itself is neither created nor changed. Returns the expanded path.

    Raises:
        ValueError: an empty path, a path that is a folder, or a place that cannot be written.
    """
    if not str(path).strip():
        raise ValueError(f"{option} is empty; give a file path")
    target = Path(path).expanduser()
    if target.is_dir():
        raise ValueError(f"{option} {target} is a folder; give a file path")
    ancestor = target.parent
    while not ancestor.exists() and ancestor.parent != ancestor:
        ancestor = ancestor.parent
    if ancestor.exists() and not ancestor.is_dir():
        raise ValueError(f"{option} {target} cannot be written ({ancestor} is a file, not a folder)")
    _probe(target.parent, option, target)
    return target


def holding_output_folder(command: Callable[[Any], int]) -> Callable[[Any], int]:
    """``command`` (a command of the command line, e.g. ``eval``) run holding its output folder: ``args.output_dir``,
    or the folder of a ``.json`` file given there, proven writable first (:func:`ensure_writable_dir` /
    :func:`ensure_writable_file`), then held with :func:`output_lock` while the command runs."""

    def run(args: Any) -> int:
        option = getattr(args, "output_option", "--output-dir")
        target = str(args.output_dir)
        if target.endswith(".json"):
            folder = ensure_writable_file(target, option).parent
        else:
            folder = ensure_writable_dir(target, option)
        with output_lock(folder, option):
            return command(args)

    run.__doc__, run.__name__ = command.__doc__, getattr(command, "__name__", "command")
    return run
