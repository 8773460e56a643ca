"""Every method on the papers' GPU protocol (SimCSE / MixCSE / Focal-InfoNCE / HNCSE / AdCSE, unsupervised BERT-base),
printed in the papers' table layouts. Needs a GPU and a network (model, corpus); ``--dry-run`` runs the whole code
path on CPU in about a minute.

Protocol: bert-base-uncased (or ``--model``), [CLS] pooling with SimCSE's MLP head in training only
(``--pooler_type cls --mlp_only_train``: the head is dropped at test time, "cls_before_pooler"),
max_seq_length 32, wiki1m_for_simcse (10^6 sentences, fetched with ``st_hardneg.data.download_wiki1m``), 1 epoch,
batch 64 (15,625 steps), lr 3e-5 with linear decay and no warm-up, random batches (SimCSE's sampler;
``--no-duplicates`` for ST's NoDuplicatesBatchSampler), STS-B dev every 125 steps with the best checkpoint kept,
then the 7 SentEval STS tasks (Spearman x 100, "all" setting) and the 7 transfer tasks (SentEval's logistic
regression, "test" mode; ``--transfer-fast`` for "fasttest"). Every method of ``st_hardneg.training.LOSSES`` runs at
its paper defaults.

    python -m benchmarks.paper_protocol                                   # all methods, seed 0, on a GPU
    python -m benchmarks.paper_protocol --methods mnrl mixcse --seeds 0 1 2 --fp16
    python -m benchmarks.paper_protocol --report                          # only print the tables of the JSON
    python -m benchmarks.paper_protocol --dry-run                         # CPU smoke run: tiny random BERT

Results go to ``benchmarks/results/paper_protocol.json`` (``{"protocol": {...}, "runs": [{"method", "seed", "sts",
"transfer", "stsb_dev_best", "train_seconds", "median_step_seconds", ...}]}``) plus a markdown file of the tables.
A finished (method, seed) already in the JSON is skipped, so an interrupted run resumes where it stopped.

``--dry-run`` uses a tiny randomly initialised BERT (``st_hardneg.testing.make_tiny_model_dir``) and the shared data
(``../shared/data``): 32 sentences of ``corpus/wiki10k.txt``, batch 16, 2 steps, STS-B dev after each step, STS-B test
as the only STS task and TREC as the only transfer task (fast mode), both on a fifth or less of their lines; every
method; its JSON goes to the work directory unless ``--out`` is given. Its scores mean nothing; it checks that the
code path runs.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import REPO, RESULTS, SHARED_DATA

DEFAULT_OUT = RESULTS / "paper_protocol.json"

#: (key in evaluate_sts results, column name in the papers' STS tables)
STS_COLUMNS = (("STS12", "STS12"), ("STS13", "STS13"), ("STS14", "STS14"), ("STS15", "STS15"), ("STS16", "STS16"),
               ("STSBenchmark", "STS-B"), ("SICKRelatedness", "SICK-R"))
#: (key in evaluate_transfer results, column name in the papers' transfer (TR) tables)
TR_COLUMNS = (("MR", "MR"), ("CR", "CR"), ("SUBJ", "SUBJ"), ("MPQA", "MPQA"), ("SST2", "SST"), ("TREC", "TREC"),
              ("MRPC", "MRPC"))

PROTOCOL: dict[str, Any] = {
    "model": "bert-base-uncased",
    "pooling": "cls, MLP head (Dense + tanh) in training only (SimCSE mlp_only_train; cls_before_pooler at test)",
    "max_seq_length": 32,
    "corpus": "wiki1m_for_simcse.txt (10^6 Wikipedia sentences)",
    "epochs": 1,
    "batch_size": 64,
    "learning_rate": 3e-5,
    "scheduler": "linear decay, no warm-up",
    "batch_sampler": "random (SimCSE)",
    "eval": "STS-B dev every 125 steps and at the end; best checkpoint kept",
    "sts": "SentEval STS12-16 ('all' setting), STS-B test, SICK-R; Spearman x 100 of cosine",
    "transfer": "SentEval MR CR SUBJ MPQA SST2 TREC MRPC, logistic regression on frozen embeddings ('test' mode)",
}

#: what --dry-run overrides
DRY_RUN = {"batch_size": 16, "max_steps": 2, "eval_steps": 1, "limit": 32, "sts_tasks": ["STSBenchmark"],
           "transfer_tasks": ["TREC"], "transfer_fast": True}


def load(path: Path) -> dict[str, Any]:
    from st_hardneg.reporting import load_results

    return load_results(path, PROTOCOL)


def transfer_function():
    """``st_hardneg.evaluation.evaluate_transfer``, or ``None`` with a message if this installation lacks it."""
    try:
        from st_hardneg.evaluation import evaluate_transfer
    except ImportError as exc:
        print(f"transfer (TR) tasks skipped: st_hardneg.evaluation.evaluate_transfer is not available ({exc})",
              flush=True)
        return None
    return evaluate_transfer


def resolve_inputs(args) -> None:
    """Fill in ``args.model``, ``args.corpus`` and ``args.data_dir`` (tiny model and shared data for --dry-run;
    the papers' corpus and SentEval data, downloaded when missing, otherwise)."""
    from st_hardneg.data import DataNotFoundError, download_senteval, download_wiki1m, resolve_senteval_dir

    if args.dry_run:
        from st_hardneg.testing import make_mini_senteval, make_tiny_model_dir

        if args.model is None:
            args.model = str(make_tiny_model_dir(Path(args.work_dir) / "tiny-bert"))
        args.corpus = args.corpus or str(SHARED_DATA / "corpus" / "wiki10k.txt")
        args.data_dir = str(make_mini_senteval(args.data_dir or SHARED_DATA, Path(args.work_dir) / "mini-senteval"))
        for key, value in DRY_RUN.items():
            setattr(args, key, value)
        return
    args.model = args.model or "bert-base-uncased"
    if args.corpus is None:
        args.corpus = str(download_wiki1m(args.download_dir))  # returns the file at once if already there
    try:
        resolve_senteval_dir(args.data_dir)
    except DataNotFoundError:
        print("SentEval data not found: downloading it (st_hardneg.data.download_senteval)", flush=True)
        args.data_dir = str(download_senteval(args.download_dir))


def run_one(method: str, seed: int, args, evaluate_transfer) -> dict[str, Any]:
    """Train ``method`` at ``seed`` on the protocol, then score STS (and TR if available)."""
    from transformers import set_seed

    from st_hardneg.data import read_corpus
    from st_hardneg.models import resolve_model, save_inference_model
    from st_hardneg.training import TrainConfig
    from st_hardneg.training.experiment import run_experiment

    sentences = read_corpus(args.corpus)
    if args.limit:
        sentences = sentences[: args.limit]
    work = Path(args.work_dir) / f"{method}-seed{seed}"
    shutil.rmtree(work, ignore_errors=True)
    config = TrainConfig(output_dir=str(work), batch_size=args.batch_size, learning_rate=args.lr, epochs=args.epochs,
                         max_steps=args.max_steps, seed=seed, eval_steps=args.eval_steps,
                         no_duplicates=args.no_duplicates, fp16=args.fp16, bf16=args.bf16,
                         show_progress_bar=not args.quiet)
    set_seed(seed)
    model = resolve_model(args.model, pooling="cls", max_seq_length=args.max_seq_length,
                          mlp_head=not args.no_mlp_head)
    experiment = run_experiment(model, method, None, sentences, config, args.data_dir, sts_tasks=args.sts_tasks,
                                eval_batch_size=args.eval_batch_size)
    result = experiment.train
    if args.save_models:
        save_inference_model(model, Path(args.save_models) / f"{method}-seed{seed}")
    show = not args.quiet
    run = experiment.record(method, seed, model=args.model if not args.dry_run else "tiny random BERT (dry run)",
                            mlp_head=not args.no_mlp_head, sts=experiment.sts, transfer=None,
                            stsb_dev_best=result.best_metric, device=str(model.device))
    if evaluate_transfer is not None and not args.no_transfer:
        run["transfer"] = evaluate_transfer(model, args.data_dir, tasks=args.transfer_tasks, fast=args.transfer_fast,
                                            batch_size=args.eval_batch_size, show_progress_bar=show)
    shutil.rmtree(work, ignore_errors=True)
    return run


# --------------------------------------------------------------------------- report
def paper_table(runs: list[dict[str, Any]], key: str, columns: tuple[tuple[str, str], ...]) -> str:
    from st_hardneg.reporting import markdown_table

    """A markdown table in a paper's layout: one row per (method, seed), the papers' column names, then Avg.
    (the mean over the columns present). Missing scores show as ``–``; returns ``""`` if no run has ``key``."""
    rows = [r for r in runs if r.get(key)]
    if not rows:
        return ""
    present = [(k, name) for k, name in columns if any(k in r[key] for r in rows)]
    header = ["Method", *(name for _, name in present), "Avg."]
    body = []
    one_seed = len({r.get("seed") for r in rows}) == 1
    for r in rows:
        scores = r[key]
        label = r["method"] if one_seed else f"{r['method']} (seed {r.get('seed')})"
        cells = [f"{scores[k]:.2f}" if k in scores else "–" for k, _ in present]
        avg = scores.get("avg")
        body.append([label, *cells, f"{avg:.2f}" if avg is not None else "–"])
    return markdown_table(header, body).rstrip("\n")


def report(data: dict[str, Any]) -> str:
    runs = data["runs"]
    parts = ["### STS (Spearman x 100; the layout of SimCSE Table 5, MixCSE Table 1, Focal-InfoNCE Table 1, "
             "HNCSE Table 1, AdCSE Table 1)", "", paper_table(runs, "sts", STS_COLUMNS) or "(no STS results)", ""]
    tr = paper_table(runs, "transfer", TR_COLUMNS)
    parts += ["### Transfer (TR, accuracy; the layout of SimCSE Table 7 and the papers' transfer tables)", "",
              tr or "(no transfer results: evaluate_transfer unavailable or --no-transfer)", ""]
    return "\n".join(parts)


def write_results(data: dict[str, Any], out: Path) -> None:
    from st_hardneg.reporting import write_json

    write_json(out, data)
    out.with_suffix(".md").write_text(report(data))


def main(argv: list[str] | None = None) -> int:
    from benchmarks.harness import run_pending
    from st_hardneg.training import LOSSES

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="*", default=list(LOSSES), help=f"from {', '.join(LOSSES)}")
    parser.add_argument("--seeds", nargs="*", type=int, default=[0])
    parser.add_argument("--model", default=None, help="encoder name or path (default: bert-base-uncased)")
    parser.add_argument("--corpus", default=None,
                        help="training sentences (default: wiki1m_for_simcse.txt, downloaded to --download-dir)")
    parser.add_argument("--data-dir", default=None, help="SentEval directory (default: st_hardneg's search path; "
                                                         "downloaded when absent)")
    parser.add_argument("--download-dir", default=None, help="where the corpus / SentEval data are downloaded "
                                                             "(default ~/.cache/st_hardneg/data)")
    parser.add_argument("--out", default=None, help=f"results JSON (default {DEFAULT_OUT.relative_to(REPO)}; with "
                                                    "--dry-run: WORK_DIR/paper_protocol_dry_run.json)")
    parser.add_argument("--work-dir", default="/tmp/st-hardneg-paper", help="checkpoints (deleted after each run)")
    parser.add_argument("--save-models", default=None, metavar="DIR", help="also save each final model (no head)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--max-steps", type=int, default=-1, help="stop after N steps (overrides --epochs)")
    parser.add_argument("--max-seq-length", type=int, default=32)
    parser.add_argument("--eval-steps", type=int, default=125)
    parser.add_argument("--eval-batch-size", type=int, default=128)
    parser.add_argument("--limit", type=int, default=0, help="first N sentences only (0 = all)")
    parser.add_argument("--no-mlp-head", action="store_true", help="plain [CLS] in training too")
    parser.add_argument("--no-duplicates", action="store_true",
                        help="ST's NoDuplicatesBatchSampler instead of SimCSE's random batches")
    parser.add_argument("--fp16", action="store_true", help="mixed precision (SimCSE trains with --fp16)")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--no-transfer", action="store_true", help="skip the transfer (TR) tasks")
    parser.add_argument("--transfer-fast", action="store_true", help="TR in 'fasttest' mode (5 folds, smaller grid)")
    parser.add_argument("--report", action="store_true", help="only print (and rewrite) the tables of --out")
    parser.add_argument("--dry-run", action="store_true", help="the full code path in about a minute on CPU: tiny "
                                                               "random BERT, shared data, 2 steps per method")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    args.sts_tasks, args.transfer_tasks = None, None
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    unknown = [m for m in args.methods if m not in LOSSES]
    if unknown:
        parser.error(f"unknown method(s) {unknown}; choose from {', '.join(LOSSES)}")
    if args.out is None:
        args.out = str(Path(args.work_dir) / "paper_protocol_dry_run.json") if args.dry_run else str(DEFAULT_OUT)
    out = Path(args.out)

    if args.report:
        data = load(out)
        print(report(data))
        if data["runs"]:
            write_results(data, out)
        return 0

    resolve_inputs(args)
    if args.dry_run:
        from st_hardneg.testing import MINI_SENTEVAL_FILES

        dry = dict(DRY_RUN, model="tiny random BERT", corpus=str(args.corpus),
                   senteval_every_kth_line=MINI_SENTEVAL_FILES)
        data = {"protocol": {**PROTOCOL, "dry_run": dry}, "runs": []}
    else:
        data = load(out)
    evaluate_transfer = None if args.no_transfer else transfer_function()
    start = time.perf_counter()
    run_pending(data, [(m,) for m in args.methods], args.seeds,
                lambda job, seed: run_one(job[0], seed, args, evaluate_transfer),
                lambda d: write_results(d, out), where=str(out))
    write_results(data, out)
    print(report(data))
    print(f"results: {out} ({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
