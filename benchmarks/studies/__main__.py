"""The one runner of the project's benchmarks: a spec under ``benchmarks/studies/``, its committed records imported
as finished trials, the trials left run by the study engine (:func:`st_hardneg.training.studies.engine.run_study`:
Optuna's storage, its workers, a killed trial run again, none counted twice), the records file written from the
study's trials and every table and figure rendered from them (:mod:`benchmarks.studies.render`).

    python -m benchmarks.studies benchmarks/studies/cpu_protocol.json                  # tables from the records
    python -m benchmarks.studies benchmarks/studies/cpu_protocol.json --check          # == the committed tables?
    python -m benchmarks.studies benchmarks/studies/cpu_protocol.json --run            # run what is left, resumable
    python -m benchmarks.studies SPEC --run --workers 2                                # two processes here
    python -m benchmarks.studies SPEC --run --storage postgresql://host/db             # and more on other machines
    python -m benchmarks.studies SPEC --run --set model=/path/to/tiny --set max_steps=4   # a trial's options

``--set KEY=VALUE`` (a JSON value, else a string) goes into every trial's context beside ``data_dir`` (the shared
data), ``work_dir`` (the trials' folders and the default storage, ``output/<study>``) and ``provenance`` (the commit
and library tree of this checkout, recorded with every trial). With nothing left to run, ``--run`` writes nothing
but the tables and figures (and, for a spec with a ``write`` hook, which makes its records file from the trials'
records, that file again: the tables are rendered from what it holds).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness import SHARED_DATA


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings → ``{KEY: VALUE}`` (a JSON value, else the text).

    Raises:
        ValueError: an item without ``=`` or without a key.
    """
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        out[key.strip()] = _value(value)
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.studies", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", help="a study spec (benchmarks/studies/*.json)")
    parser.add_argument("--run", action="store_true", help="run the trials left, then write the records and tables")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 unless every table rendered from the records equals the committed one")
    parser.add_argument("--workers", type=int, default=1, help="worker processes on this machine (default: 1)")
    parser.add_argument("--storage", default=None,
                        help="the study's Optuna storage URL (default with --run: sqlite:///WORK_DIR/study.db; "
                             "else in memory); workers on other machines point at the same one")
    parser.add_argument("--heartbeat", type=int, default=30,
                        help="seconds between a trial's heartbeats; a trial silent for twice this is run again")
    parser.add_argument("--data-dir", default=str(SHARED_DATA), help="the shared data (default: $ST_HARDNEG_DATA)")
    parser.add_argument("--work-dir", default=None, help="the trials' folders (default: output/<study name>)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a value of every trial's context (e.g. model=PATH, limit=200, max_steps=4)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no tables on stdout")
    return parser


def run(args: argparse.Namespace) -> dict[Path, str]:
    """Import, run what is left (with ``--run``), write the records file when a trial ran, render; returns the
    tables ``{file: text}``."""
    from benchmarks.studies import render as r
    from st_hardneg import validation
    from st_hardneg.training.studies.engine import finished_records, open_storage, open_study, progress, provenance
    from st_hardneg.training.studies.engine import run_study as engine_run
    from st_hardneg.training.studies.spec import load_spec

    validation.check_count(args.workers, "--workers", minimum=1)
    spec = load_spec(args.spec)
    work = Path(args.work_dir or Path("output") / spec.name)
    if args.storage is None and args.run:
        work.mkdir(parents=True, exist_ok=True)
    url = args.storage or (f"sqlite:///{(work / 'study.db').resolve()}" if args.run else "sqlite:///:memory:")
    spec, study = r.import_study(args.spec, url, heartbeat=args.heartbeat)
    keys = [point.key for point in spec.points()]
    state = progress(study, keys)
    data = None
    if args.run and state.left:
        context = {"data_dir": args.data_dir, "work_dir": str(work), "provenance": provenance(),
                   "workers": args.workers, **parse_sets(args.set)}
        print(f"{spec.name}: {len(state.done) + len(state.failed)} of {len(keys)} trial(s) finished, "
              f"{len(state.left)} to run ({args.workers} worker(s), storage {url})", flush=True)
        if "prepare" in spec.report:
            r.hook(spec.report["prepare"])(spec, [p for p in spec.points() if p.key in state.left], context)
        state = engine_run(spec, url, None, context, workers=args.workers, heartbeat=args.heartbeat,
                           provenance=context["provenance"])
        study = open_study(spec, open_storage(url, args.heartbeat))
        meta = study.user_attrs.get("records_meta") or {}
        records = finished_records(study, spec, failed=True)
        if records or r.records_path(args.spec, spec).is_file():  # no record at all (every trial raised): no file
            data = r.write_records(args.spec, spec, records, meta)
        for key, error in state.failed.items():
            print(f"    failed: {key}: {error}", flush=True)
        if state.left:
            print(f"{len(state.left)} trial(s) not finished: run the same command again to resume", flush=True)
            return {}
        if data is None:  # nothing recorded: no table to render
            return {}
    elif state.left:
        raise ValueError(f"{len(state.left)} trial(s) of {spec.name} are left to run (e.g. {state.left[0]}): run "
                         "with --run, or render a finished study")
    elif args.run and "write" in spec.report:  # a records file its write hook makes: again from the trials
        data = r.write_records(args.spec, spec, finished_records(study, spec, failed=True),
                               study.user_attrs.get("records_meta") or {})
    tables = r.render(args.spec, spec, study, data)
    if not args.check:
        from st_hardneg.reporting import write_text

        for path, text in tables.items():
            write_text(path, text)
        r.draw(args.spec, spec, study, data)
    return tables


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        tables = run(args)
    except ValueError as exc:  # a bad spec, storage, worker count, record or data folder: one line
        parser.error(str(exc))
    from benchmarks.studies.render import show

    return show(tables, check=args.check, quiet=args.quiet)


if __name__ == "__main__":
    sys.exit(main())
