"""``st-hardneg study``: which loss (and which false-negative control) for a team's own BEIR data::

    st-hardneg study --data path/to/beir --method mnrl=mnrl --method focal=focal --control --seeds 0 1 2
    st-hardneg study --data path/to/beir --method mnrl=mnrl --method mix=mixcse_two_way:partner=explicit \\
        --workers 2 --storage postgresql://user@host/studies     # the same command on more machines joins in

Every row (``--method LABEL=LOSS[:key=value,...]``, with ``--control`` also each st-hardneg row with the recipe's
control) is trained at every seed on every folder, scored on dev (the folder's ``qrels/dev.tsv``, else 20 % of the
training queries carved as the protocol does) and, once, on test; dev chooses, or says that the top rows tie. The
trials live in Optuna's storage (default: ``OUTPUT/study.db``), so the same command resumes, and a killed worker's
trial is run again. Every input is checked before any model loads; the run writes only inside ``--output-dir``
(and the ``--storage`` you give).

Only the standard library is imported at module level (``--help`` stays fast).
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: the seeds of a study when ``--seeds`` is not given
DEFAULT_SEEDS = (0, 1, 2)


def add_parser(sub: Any, parents: list[argparse.ArgumentParser], epilog: str) -> argparse.ArgumentParser:
    """The ``study`` subcommand's options on ``sub`` (the main parser's subparsers)."""
    s = sub.add_parser("study", parents=parents, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter,
                       help="which loss for your data: train every row x seed on a BEIR folder, choose on dev (or "
                            "say it ties), score test once, paired tests against the baseline (resumable, parallel)",
                       description=__doc__.split("\n\n")[2])  # the paragraph after the examples
    s.add_argument("--data", action="append", default=None, metavar="FOLDER",
                   help="a BEIR folder (corpus.jsonl, queries.jsonl, qrels/train.tsv and test.tsv, optional dev.tsv); "
                        "repeatable: dev is pooled over the folders")
    s.add_argument("--spec", default=None, metavar="FILE",
                   help="a study written as data (JSON or TOML: protocol, rows, datasets, grid, choice) instead of "
                        "--data / --method / --seeds; its folders are relative to --data-root")
    s.add_argument("--data-root", default=None, help="--spec: the folder its datasets' folders are relative to "
                                                     "(default: $ST_HARDNEG_DATA)")
    s.add_argument("--method", action="append", default=None, metavar="LABEL=LOSS[:KEY=VALUE,...]",
                   help="a row: a loss of the registry (or gist, cached_mnrl) with its options, e.g. "
                        "mix=mixcse_two_way:partner=explicit,lam=0.3; a label ending in +ctl, or control=true, "
                        "gives it the recipe's false-negative control; the first row is the baseline")
    s.add_argument("--control", action="store_true",
                   help="also run each st-hardneg row with the recipe's false-negative control (LABEL+ctl)")
    s.add_argument("--seeds", type=int, nargs="+", default=None, help="training seeds (default: 0 1 2)")
    s.add_argument("--baseline", default=None, help="the row the paired tests compare against (default: the first)")
    s.add_argument("--workers", type=int, default=1,
                   help="worker processes on this machine (1 to the number of cores); more machines: the same "
                        "command with the same --storage")
    s.add_argument("--storage", default=None, metavar="URL",
                   help="Optuna's RDB storage: sqlite:///FILE on one machine, postgresql:// or mysql:// shared by "
                        "several (default: sqlite:///OUTPUT/study.db)")
    s.add_argument("--study-name", default="study", help="the study's name in the storage")
    s.add_argument("--output-dir", default="output/study",
                   help="study.md, study.json, study_differences.png, each trial's per-query file, the mined "
                        "negatives, the default storage")
    s.add_argument("--limit", type=int, default=0, help="train on the first N training pairs only (0 = all)")
    s.add_argument("--model", default=None, help="the model to fine-tune (default: the embedded all-MiniLM-L6-v2)")
    s.add_argument("--mining-arg", action="append", metavar="KEY=VALUE",
                   help="a mining setting of st_hardneg.training.protocol.MINING, repeatable, e.g. --mining-arg "
                        "relative_margin=None (the negatives are mined once per folder by the untrained --model)")
    s.add_argument("--max-steps", type=int, default=-1, help="train N steps (default: one epoch)")
    s.add_argument("--batch-size", type=int, default=None, help="training batch size (default: 32, the protocol's)")
    s.add_argument("--lr", type=float, default=None, help="learning rate (default: 2e-5, the protocol's)")
    s.add_argument("--eval-batch-size", type=int, default=64,
                   help="encoding batch size of the dev and test scoring (default: 64)")
    s.add_argument("--tie-sds", type=float, default=2.0,
                   help="rows whose dev is within this many seed standard deviations of the best tie with it")
    s.add_argument("--heartbeat", type=int, default=30,
                   help="seconds between a trial's heartbeats; a trial silent for twice this is run again")
    s.set_defaults(func=cmd_study)
    return s


def _spec(args: argparse.Namespace) -> Any:
    """The study's spec from ``--spec`` or from ``--data`` / ``--method`` / ``--seeds``, checked."""
    from st_hardneg.training.studies.spec import Dataset, load_spec, spec_from_methods

    if args.spec:
        given = [option for option, value in (("--data", args.data), ("--method", args.method),
                                              ("--seeds", args.seeds), ("--control", args.control),
                                              ("--mining-arg", args.mining_arg)) if value]
        if given:
            raise ValueError(f"--spec holds the rows, datasets and seeds: drop {', '.join(given)}")
        spec = load_spec(args.spec)
        own = [label for label, row in spec.rows.items() if row.extra] + [name for name, d in spec.datasets.items()
                                                                          if d.extra]
        if own and spec.trial is None:
            raise ValueError(f"--spec {args.spec}: {own[0]!r} carries settings of a benchmark's own trials (extra), "
                             "and the spec names no trial function (trial: 'module:function') to run them")
        if spec.trial is not None:
            from st_hardneg.training.studies.engine import trial_function

            trial_function(spec)  # importable, before any model loads
        return spec
    if not args.data:
        raise ValueError("give a BEIR folder (--data FOLDER) or a study spec (--spec FILE)")
    if not args.method:
        raise ValueError("give the rows to try: --method LABEL=LOSS[:key=value,...] (e.g. --method mnrl=mnrl)")
    datasets: dict[str, Dataset] = {}
    for folder in args.data:
        name = Path(folder).expanduser().resolve().name
        if name in datasets:
            raise ValueError(f"--data: two folders are named {name!r}; give each dataset a folder of its own name")
        datasets[name] = Dataset(folder=str(Path(folder).expanduser().resolve()))
    protocol: dict[str, Any] = {"limit": args.limit, "max_steps": args.max_steps}
    if args.batch_size is not None:
        protocol["batch_size"] = args.batch_size
    if args.lr is not None:
        protocol["learning_rate"] = args.lr
    if args.mining_arg:
        from st_hardneg.training.protocol import check_mining
        from st_hardneg.training.registry import parse_loss_args

        protocol["mining"] = check_mining(parse_loss_args(args.mining_arg, "--mining-arg"), "--mining-arg")
    if args.model is not None:
        protocol["model"] = str(args.model)
    seeds = list(args.seeds if args.seeds is not None else DEFAULT_SEEDS)
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds gives a seed twice ({' '.join(map(str, seeds))}): each seed is one run")
    return spec_from_methods(args.method, datasets=datasets, seeds=seeds, control=args.control, protocol=protocol,
                             name=args.study_name, baseline=args.baseline, tie_sds=args.tie_sds)


def check_study_args(args: argparse.Namespace) -> tuple[Any, str]:
    """Every check of ``study`` before any model loads: the spec (rows, losses, options, seeds), ``--workers``,
    ``--limit``, ``--max-steps``, the BEIR folders and their splits, the output folder, the storage (opened, and
    the study in it made from this spec). Returns ``(spec, storage URL)``.

    Raises:
        ValueError: one line naming the value, option, folder or URL.
    """
    from st_hardneg import validation
    from st_hardneg.cli.paths import ensure_writable_dir
    from st_hardneg.training.studies.beir import check_dataset, protocol_values

    spec = _spec(args)
    cores = os.cpu_count() or 1
    validation.check_count(args.workers, "--workers", minimum=1)
    if args.workers > cores:
        raise ValueError(f"--workers {args.workers} is more than this machine's {cores} core(s); run more workers "
                         "on other machines with the same --storage")
    validation.check_count(args.limit, "--limit", minimum=0)
    validation.check_count(args.heartbeat, "--heartbeat", minimum=1)
    validation.check_count(args.eval_batch_size, "--eval-batch-size", minimum=1)
    protocol = protocol_values(spec)
    validation.check_count(protocol["batch_size"], "--batch-size", minimum=1)
    if validation.check_number(protocol["learning_rate"], "--lr", minimum=0.0) == 0:
        raise ValueError("--lr must be > 0, got 0")
    if protocol["max_steps"] != -1:
        validation.check_count(protocol["max_steps"], "--max-steps (-1: one epoch)", minimum=1)
    if args.limit and args.limit < protocol["batch_size"]:
        raise ValueError(f"--limit {args.limit} is fewer training pairs than one batch ({protocol['batch_size']})")
    root = args.data_root or os.environ.get("ST_HARDNEG_DATA")
    for name, dataset in spec.datasets.items():
        check_dataset(name, dataset, root)
    output = ensure_writable_dir(args.output_dir, "--output-dir")
    url = args.storage or f"sqlite:///{(output / 'study.db').resolve()}"
    from st_hardneg.training.studies.engine import open_storage, open_study

    if args.storage is None:
        output.mkdir(parents=True, exist_ok=True)
    open_study(spec, open_storage(url, args.heartbeat))
    return spec, url


def cmd_study(args: argparse.Namespace) -> int:
    """``st-hardneg study``: check, run the left trials with ``--workers`` workers, write and print the report."""
    try:
        import optuna  # noqa: F401
    except ImportError:
        raise ImportError("st-hardneg study needs Optuna: pip install 'st-hardneg[study]'") from None
    spec, url = check_study_args(args)
    from st_hardneg.training.studies.beir import prepare, run_point
    from st_hardneg.training.studies.engine import (
        finished_records,
        open_storage,
        open_study,
        progress,
        provenance,
        run_study,
    )
    from st_hardneg.training.studies.report import write_report

    output = Path(args.output_dir).resolve()
    # the model: --model, else a BEIR spec's protocol "model" (a benchmark's own trial reads its protocol itself:
    # there "model" describes the records, e.g. "all-MiniLM-L6-v2 as published", and is no name to load)
    model = args.model if args.model is not None else (spec.protocol.get("model") if spec.trial is None else None)
    context = {"output_dir": str(output), "cache_dir": str(output / "cache"), "model": model,
               "data_root": args.data_root or os.environ.get("ST_HARDNEG_DATA"),
               "eval_batch_size": args.eval_batch_size}
    keys = [point.key for point in spec.points()]
    study = open_study(spec, open_storage(url, args.heartbeat))
    state = progress(study, keys)
    if state.left:
        print(f"study {spec.name!r}: {len(state.done)} of {len(keys)} trial(s) finished, {len(state.left)} to run "
              f"({args.workers} worker(s), storage {url})", flush=True)
        for name in dict.fromkeys(point.dataset for point in spec.points() if point.key in state.left):
            if spec.trial is None:  # a benchmark's own trial prepares its own data
                prepare(spec, name, context)  # mined once here: the workers read the negatives from the cache
        state = run_study(spec, url, run_point if spec.trial is None else None, context, workers=args.workers, heartbeat=args.heartbeat,
                          provenance=provenance())
    records = finished_records(open_study(spec, open_storage(url, args.heartbeat)), spec)
    if spec.trial is not None:  # a benchmark's own records: its own renderer makes its tables
        from st_hardneg.reporting import write_json

        write_json(output / "study.json", {"spec": spec.to_dict(), "records": records, "left": state.left,
                                           "failed": state.failed})
        print(f"records: {output / 'study.json'} ({len(records)} finished; the spec's renderer makes its tables)")
        if state.left or state.failed:
            from st_hardneg.cli.train import RunFailed

            raise RunFailed(f"{len(state.left)} trial(s) not finished, {len(state.failed)} failed")
        return 0
    written = write_report(spec, records, output, state.left, state.failed)
    print(written["markdown"].read_text())
    print(f"report: {written['markdown']}\nrecords: {written['json']}"
          + (f"\nfigure: {written['figure']}" if "figure" in written else ""))
    if state.left or state.failed:
        from st_hardneg.cli.train import RunFailed

        parts = ([f"{len(state.left)} trial(s) not finished (re-run the same command to resume)"] if state.left else [])
        parts += [f"{len(state.failed)} trial(s) failed (their errors are in {written['markdown']})"] if state.failed \
            else []
        raise RunFailed("; ".join(parts))
    return 0
