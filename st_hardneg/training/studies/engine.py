"""A study's trials on Optuna: its storage, its grid, its workers, and finished records imported as trials.

Why Optuna (not Ray Tune): a study of fixed trials needs a store that several processes, and several machines, share
without a scheduler of their own. Optuna's RDB storage is that store (a SQLite file on one machine, a PostgreSQL or
MySQL URL for several), and it carries what a grid needs: :class:`optuna.samplers.GridSampler` gives trial ``n`` of
the first ``len(grid)`` its own grid point (trial numbers are handed out by the storage, once each), a trial's
heartbeat marks a worker that was killed (its trial goes from RUNNING to FAIL once the heartbeat is older than the
grace period, :func:`optuna.storages.fail_stale_trials`) and :class:`optuna.storages.RetryHeartbeatStaleTrialCallback` puts
the same grid point back as a WAITING trial, which exactly one worker takes (the storage's own claim of a waiting
trial). Ray Tune schedules trials from a driver process onto a Ray cluster: more than a grid of CPU training runs
needs, and a killed driver loses the schedule unless it is restored by hand. Nothing here locks, claims or checks a
process: every such decision is the storage's.

- :func:`open_storage`: an RDB URL (``sqlite:///study.db``, ``postgresql://...``) with heartbeats and the retry;
- :func:`open_study`: the spec's study in that storage (its grid a :class:`~optuna.samplers.GridSampler` over the
  points' keys), refused when the storage holds the same study made from another spec;
- :func:`trial_function`: the function one trial runs (the spec's ``trial``, else the BEIR trial);
- :func:`work`: one worker's loop (the engine's ``optimize``, one trial at a time, until no point is left);
- :func:`run_study`: ``workers`` such loops (processes on this machine; more machines point at the same storage);
- :func:`progress`: each point's state; :func:`finished_records`: the records of the finished trials;
- :func:`import_records`: committed records as finished trials, so a study resumes from them without a re-run.

>>> from st_hardneg.training.studies.engine import open_storage, open_study, run_study
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from st_hardneg.training.studies.spec import Point, StudySpec, spec_from_dict

if TYPE_CHECKING:
    import optuna

__all__ = ["DEFAULT_HEARTBEAT", "Progress", "dev_value", "finished_records", "import_records", "open_storage", "open_study",
           "progress", "run_study", "trial_function", "work"]

logger = logging.getLogger(__name__)

#: seconds between two heartbeats of a running trial; a trial whose heartbeat is older than twice this is a killed
#: worker's, run again
DEFAULT_HEARTBEAT = 30
#: the one search parameter of a study: the grid point's key (:attr:`~st_hardneg.training.studies.spec.Point.key`)
PARAM = "point"

#: ``run(spec, point, context) -> record``: one trial; the record holds its dev value (:func:`dev_value`), and a
#: record with a ``failed`` message is a trial that ran and failed (a configuration that leaves no usable row): kept as
#: a failed trial, with its record, never run again
RunPoint = Callable[[StudySpec, Point, Mapping[str, Any]], dict[str, Any]]


def dev_value(spec: StudySpec, record: Mapping[str, Any]) -> float | None:
    """A record's value for the engine: its ``dev[metric]`` for the spec's choice metric, else its own field
    ``metric``; ``0.0`` for a study that chooses nothing (metric ``None``); ``None`` when the record has no such
    number."""
    metric = spec.choice.metric
    if metric is None:
        return 0.0
    dev = record.get("dev")
    value = dev.get(metric) if isinstance(dev, Mapping) and metric in dev else record.get(metric)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def trial_function(spec: StudySpec) -> RunPoint:
    """The function each trial of ``spec`` runs: the one its ``trial`` names (``module:function``, a benchmark with
    its own protocol), else :func:`~st_hardneg.training.studies.beir.run_point`. A worker process imports it by that
    name, so it must be a module-level function.

    Raises:
        ValueError: a module that cannot be imported or that has no such function (one line naming it).
    """
    from importlib import import_module

    if spec.trial is None:
        from st_hardneg.training.studies.beir import run_point

        return run_point
    module, _, name = spec.trial.partition(":")
    try:
        function = getattr(import_module(module.strip()), name.strip(), None)
    except ImportError as exc:
        raise ValueError(f"the study's trial {spec.trial!r} cannot be imported: {exc}") from None
    if not callable(function):
        raise ValueError(f"the study's trial {spec.trial!r}: the module {module.strip()} has no function "
                         f"{name.strip()!r}")
    return function  # type: ignore[no-any-return]


class TrialError(Exception):
    """A trial that failed at run time (its message is the trial's ``error``); the worker goes on."""


def open_storage(url: str, heartbeat: int = DEFAULT_HEARTBEAT) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage at ``url`` with a heartbeat every ``heartbeat`` seconds (grace: twice that) and
    :class:`~optuna.storages.RetryHeartbeatStaleTrialCallback` for a trial whose heartbeat stopped (the engine's
    heartbeat and retry are marked experimental by Optuna; their warnings are silenced here).

    Raises:
        ValueError: a bad heartbeat, or a URL the engine cannot open (one line naming it).
    """
    from st_hardneg import validation

    validation.check_count(heartbeat, "heartbeat", minimum=1)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # a failed trial's error is in its record
    engine: dict[str, Any] = {"connect_args": {"timeout": 120}} if url.startswith("sqlite") else {}
    attempts = 5
    for attempt in range(attempts):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(
                    url, engine_kwargs=engine, heartbeat_interval=heartbeat, grace_period=2 * heartbeat,
                    heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback())
        except Exception as exc:  # sqlalchemy's errors (no driver, no server, a folder that does not exist, ...)
            message = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            # another process made the tables (or wrote the schema's version row) at the same moment: open it again
            if ("already exists" in message or "UNIQUE constraint failed: alembic_version" in message) \
                    and attempt < attempts - 1:
                time.sleep(1.0)
                continue
            raise ValueError(f"the storage {url} cannot be opened: {message}") from None
    raise AssertionError("unreachable")  # pragma: no cover


def open_study(spec: StudySpec, storage: optuna.storages.BaseStorage) -> optuna.Study:
    """The study named ``spec.name`` in ``storage`` (made when it is not there), its sampler a
    :class:`~optuna.samplers.GridSampler` over the keys of ``spec.points()``; the spec is kept as the study's user
    attribute ``spec``.

    Raises:
        ValueError: the storage holds a study of that name made from another spec (naming what changed).
    """
    import optuna

    keys = [point.key for point in spec.points()]
    sampler = optuna.samplers.GridSampler({PARAM: keys}, seed=0)
    study = optuna.create_study(study_name=spec.name, storage=storage, sampler=sampler, direction="maximize",
                                load_if_exists=True)
    stored = study.user_attrs.get("spec")
    wanted = spec.to_dict()
    if stored is None:
        study.set_user_attr("spec", wanted)
    elif stored != wanted:
        changed = sorted(k for k in set(stored) | set(wanted) if stored.get(k) != wanted.get(k))
        raise ValueError(f"the study {spec.name!r} in this storage was made from another spec (changed: "
                         f"{', '.join(changed)}); use another --storage, --output-dir or study name")
    return study


def _point_of(trial: optuna.trial.FrozenTrial) -> str | None:
    """The grid point a trial runs: its one parameter (suggested as the trial starts; a retry carries it over)."""
    value = trial.params.get(PARAM)
    return value if isinstance(value, str) else None


@dataclass
class Progress:
    """Each grid point's state: ``done`` (its finished trial's number), ``failed`` (its error), ``running``,
    ``waiting``, and ``left`` (neither done nor failed)."""

    done: dict[str, int] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    running: set[str] = field(default_factory=set)
    waiting: set[str] = field(default_factory=set)
    left: list[str] = field(default_factory=list)


def progress(study: optuna.Study, keys: Sequence[str]) -> Progress:
    """Where every point of ``keys`` stands in ``study``: the first COMPLETE trial of a point is its result; a point
    whose trials all FAILED with nothing waiting or running is failed (a killed trial's retry waits)."""
    from optuna.trial import TrialState

    out = Progress()
    errors: dict[str, str] = {}
    for trial in study.get_trials(deepcopy=False):
        key = _point_of(trial)
        if trial.state == TrialState.WAITING:
            out.waiting.add(key or "?")
        elif key is None:
            continue
        elif trial.state == TrialState.COMPLETE:
            out.done.setdefault(key, trial.number)
        elif trial.state == TrialState.RUNNING:
            out.running.add(key)
        elif trial.state == TrialState.FAIL:
            errors[key] = str(trial.user_attrs.get("error", "the worker stopped during the trial"))
    for key in keys:
        if key in out.done:
            continue
        if key in errors and key not in out.running and key not in out.waiting:
            out.failed[key] = errors[key]
            continue
        out.left.append(key)
    return out


def _objective(study: optuna.Study, spec: StudySpec, run: RunPoint, context: Mapping[str, Any],
               provenance: Mapping[str, Any]) -> Callable[[optuna.Trial], float]:
    points = {point.key: point for point in spec.points()}
    keys = list(points)

    def objective(trial: optuna.Trial) -> float:
        import optuna
        from optuna.trial import TrialState

        key = trial.suggest_categorical(PARAM, keys)
        for other in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING)):
            # the sampler gives a point twice only after every point has started (its random pick past the grid):
            # that trial runs nothing
            if other.number != trial.number and _point_of(other) == key:
                trial.set_user_attr("duplicate_of", other.number)
                raise optuna.TrialPruned(f"{key} is run by trial {other.number}")
        point = points[key]
        trial.set_user_attr("worker", {"host": socket.gethostname(), "pid": os.getpid()})
        trial.set_user_attr("config", {"dataset": point.dataset, "row": point.row, "seed": point.seed,
                                       **spec.rows[point.row].config()})
        for name, value in provenance.items():
            trial.set_user_attr(name, value)
        started = time.perf_counter()
        try:
            record = run(spec, point, context)
        except (ValueError, RuntimeError) as exc:  # recorded with the trial, never retried silently
            message = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
            trial.set_user_attr("error", message)
            raise TrialError(message) from exc
        for name in ("dev", "test", "per_query", "train_seconds", "median_step_seconds", "steps"):
            if name in record:
                trial.set_user_attr(name, record[name])
        trial.set_user_attr("record", record)
        trial.set_user_attr("wall_seconds", round(time.perf_counter() - started, 1))
        if record.get("failed"):  # the trial ran and its configuration failed: a result, kept, never retried
            trial.set_user_attr("error", str(record["failed"]))
            raise TrialError(str(record["failed"]))
        value = dev_value(spec, record)
        if value is None:
            message = f"{key}: the trial's record has no dev {spec.choice.metric}"
            trial.set_user_attr("error", message)
            raise TrialError(message)
        return value

    return objective


def work(spec: StudySpec, storage: optuna.storages.BaseStorage, run: RunPoint | None, context: Mapping[str, Any],
         provenance: Mapping[str, Any], poll_seconds: float | None = None) -> int:
    """One worker: until every point is done or failed, take the next trial from the engine (a waiting retry first,
    else the sampler's next grid point) and run it with ``run`` (``None``: :func:`trial_function` of the spec); while
    only other workers' trials are left, wait for them (a killed worker's trial comes back as a waiting retry once
    its heartbeat is stale). Returns the trials it ran.

    A trial that raises ``ValueError`` / ``RuntimeError`` is recorded as failed with its message and not retried."""
    import optuna

    study = open_study(spec, storage)
    keys = [point.key for point in spec.points()]
    heartbeat = storage.heartbeat_interval if isinstance(storage, optuna.storages.RDBStorage) else None
    poll = poll_seconds if poll_seconds is not None else float(heartbeat or 5)
    objective = _objective(study, spec, run if run is not None else trial_function(spec), context, provenance)
    ran = 0
    with warnings.catch_warnings():  # the engine's heartbeat is marked experimental: it is the one we rely on
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        while True:
            optuna.storages.fail_stale_trials(study)
            state = progress(study, keys)
            if not state.left:
                return ran
            if state.waiting or set(state.left) - state.running:
                study.optimize(objective, n_trials=1, catch=(TrialError,))
                ran += 1
            else:
                time.sleep(poll)


def _worker_main(spec: dict[str, Any], url: str, heartbeat: int, run: RunPoint | None, context: dict[str, Any],
                 provenance: dict[str, Any], threads: int) -> None:
    """A worker process (:func:`run_study`): its own storage connection, ``threads`` torch threads."""
    if threads and os.environ.get("OMP_NUM_THREADS") is None:
        import torch

        torch.set_num_threads(threads)
    work(spec_from_dict(spec), open_storage(url, heartbeat), run, context, provenance)


def run_study(spec: StudySpec, url: str, run: RunPoint | None, context: Mapping[str, Any], *, workers: int = 1,
              heartbeat: int = DEFAULT_HEARTBEAT, provenance: Mapping[str, Any] | None = None) -> Progress:
    """Run the study's left points with ``workers`` worker loops (:func:`work`): in this process for one, else as
    processes (``spawn``), each with its share of the cores. ``run`` is the trial (``None``: the one the spec names,
    :func:`trial_function`); a worker process imports it by its module and name. Workers on other machines are the
    same command pointed at the same ``url``. Returns the progress once every worker has stopped.

    Raises:
        ValueError: ``workers`` below 1, a storage that cannot be opened, a study made from another spec, a trial
            the spec names that cannot be imported.
    """
    from st_hardneg import validation

    validation.check_count(workers, "workers", minimum=1)
    if run is None:
        trial_function(spec)  # refused here, before any worker starts
    storage = open_storage(url, heartbeat)
    keys = [point.key for point in spec.points()]
    open_study(spec, storage)  # made (or refused) once, before any worker starts
    prov = dict(provenance or {})
    if workers == 1:
        work(spec, storage, run, context, prov)
    else:
        import multiprocessing

        threads = max(1, (os.cpu_count() or 1) // workers)
        ctx = multiprocessing.get_context("spawn")
        processes = [ctx.Process(target=_worker_main, args=(spec.to_dict(), url, heartbeat, run, dict(context),
                                                            prov, threads)) for _ in range(workers)]
        for process in processes:
            process.start()
        for process in processes:
            process.join()
        stopped = [p.exitcode for p in processes if p.exitcode]
        if stopped:
            logger.warning("%d worker(s) stopped with exit status %s", len(stopped), stopped)
    return progress(open_study(spec, storage), keys)


def finished_records(study: optuna.Study, spec: StudySpec, *, failed: bool = False) -> list[dict[str, Any]]:
    """The record of each point's first finished trial, in the order the trials finished (imported records first,
    in their own order); with ``failed``, also the record of each failed point's last trial that left one (a
    configuration that failed is a result a benchmark's table reports)."""
    from optuna.trial import TrialState

    keys = [point.key for point in spec.points()]
    state = progress(study, keys)
    chosen = set(state.done.values())
    if failed:
        last: dict[str, int] = {}
        for trial in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
            key = _point_of(trial)
            if key in state.failed and "record" in trial.user_attrs:
                last[key] = trial.number
        chosen |= set(last.values())
    trials = [t for t in study.get_trials(deepcopy=False) if t.number in chosen]
    imported = [t for t in trials if "imported" in t.user_attrs]
    ran = sorted((t for t in trials if "imported" not in t.user_attrs),
                 key=lambda t: (t.datetime_complete.timestamp() if t.datetime_complete else 0.0, t.number))
    return [dict(t.user_attrs["record"]) for t in (*imported, *ran)]


def import_records(study: optuna.Study, spec: StudySpec, records: Iterable[Mapping[str, Any]],
                   point_of: Callable[[Mapping[str, Any]], Point], *, source: str,
                   provenance_of: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None) -> int:
    """Add committed ``records`` to ``study`` as finished trials (COMPLETE, the dev value (:func:`dev_value`) as
    value, the record and its provenance as user attributes, the grid point as its parameter), in order; a record
    with a ``failed`` message becomes a failed trial with its record (never run again); a point already finished or
    failed is left as it is. Returns how many were added. (The sampler does not count them as visited: a trial it
    gives an imported point runs nothing, as a duplicate.)

    Raises:
        ValueError: a record whose point is not in the spec's grid, a point recorded twice, or a record without its
            dev value.
    """
    import optuna
    from optuna.distributions import CategoricalDistribution

    keys = [point.key for point in spec.points()]
    index = set(keys)
    state = progress(study, keys)
    done = set(state.done) | set(state.failed)
    seen: set[str] = set()
    added = 0
    for number, record in enumerate(records):
        key = point_of(record).key
        if key not in index:
            raise ValueError(f"{source}: record {number} is {key}, which is not a point of the study's grid")
        if key in seen:
            raise ValueError(f"{source}: {key} is recorded twice (records {number} and an earlier one)")
        seen.add(key)
        if key in done:
            continue
        attrs = {"record": json.loads(json.dumps(record)), "imported": f"{source}#{number}",
                 **{k: record[k] for k in ("dev", "test", "per_query") if k in record},
                 **dict(provenance_of(record) if provenance_of else {})}
        if record.get("failed"):
            study.add_trial(optuna.trial.create_trial(
                state=optuna.trial.TrialState.FAIL, params={PARAM: key},
                distributions={PARAM: CategoricalDistribution(keys)}, user_attrs={**attrs, "error": str(record["failed"])}))
            added += 1
            continue
        value = dev_value(spec, record)
        if value is None:
            raise ValueError(f"{source}: record {number} ({key}) has no dev {spec.choice.metric}")
        study.add_trial(optuna.trial.create_trial(
            state=optuna.trial.TrialState.COMPLETE, value=value,
            params={PARAM: key}, distributions={PARAM: CategoricalDistribution(keys)}, user_attrs=attrs))
        added += 1
    return added


def provenance() -> dict[str, str]:
    """What a trial ran from: ``commit`` (the git commit of the checkout holding ``st_hardneg``, ``+dirty`` when its
    tracked files differ), ``library`` (the git tree of ``st_hardneg/`` there: commits that differ only outside the
    library trained with the same code) and ``version``; ``unknown`` where the package is not in a git checkout."""
    import subprocess
    from pathlib import Path

    from st_hardneg.training.registry import package_version

    root = Path(__file__).resolve().parents[3]

    def git(*argv: str) -> str:
        try:
            done = subprocess.run(["git", "-C", str(root), *argv], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return ""
        return done.stdout.strip() if done.returncode == 0 else ""

    if not (root / ".git").exists():
        return {"commit": "unknown", "library": "unknown", "version": package_version()}
    dirty = git("status", "--porcelain", "--untracked-files=no")
    library_dirty = git("status", "--porcelain", "--untracked-files=no", "--", "st_hardneg")
    return {"commit": (git("rev-parse", "HEAD") or "unknown") + ("+dirty" if dirty else ""),
            "library": (git("rev-parse", "HEAD:st_hardneg") or "unknown") + ("+dirty" if library_dirty else ""),
            "version": package_version()}
