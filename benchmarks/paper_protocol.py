"""Every method on the papers' GPU protocol (SimCSE / MixCSE / Focal-InfoNCE / HNCSE / AdCSE, unsupervised BERT-base),
printed in the papers' table layouts: the trial and the renderer of the study ``benchmarks/studies/paper_protocol.json``,
run and rendered by the one runner (:mod:`benchmarks.studies`). Needs a GPU and a network (model, corpus); its dry run
(``benchmarks/studies/paper_protocol_dry_run.json``) runs the whole code path on CPU in about a minute.

Protocol: bert-base-uncased (or ``--set model=...``), [CLS] pooling with SimCSE's MLP head in training only
(``--pooler_type cls --mlp_only_train``: the head is dropped at test time, "cls_before_pooler"),
max_seq_length 32, wiki1m_for_simcse (10^6 sentences, fetched with ``st_hardneg.data.download_wiki1m``), 1 epoch,
batch 64 (15,625 steps), lr 3e-5 with linear decay and no warm-up, random batches (SimCSE's sampler;
``--set no_duplicates=true`` for ST's NoDuplicatesBatchSampler), STS-B dev every 125 steps with the best checkpoint
kept, then the 7 SentEval STS tasks (Spearman x 100, "all" setting) and the 7 transfer tasks (SentEval's logistic
regression, "test" mode; ``--set transfer_fast=true`` for "fasttest"). Every method of ``st_hardneg.training.LOSSES``
runs at its paper defaults (a row of the spec each; one trial is one method at one seed).

    python -m benchmarks.studies benchmarks/studies/paper_protocol.json --run                  # on a GPU
    python -m benchmarks.studies benchmarks/studies/paper_protocol.json --run --set fp16=true
    python -m benchmarks.studies benchmarks/studies/paper_protocol.json                        # print the tables
    python -m benchmarks.studies benchmarks/studies/paper_protocol_dry_run.json --run          # CPU smoke run

Results go to ``benchmarks/results/paper_protocol.json`` (``{"protocol": {...}, "runs": [{"method", "seed", "sts",
"transfer", "stsb_dev_best", "train_seconds", "median_step_seconds", ...}]}``, made by the first run) plus a markdown
file of the tables; the runner runs only the trials the file lacks, so an interrupted run resumes where it stopped.
More methods or seeds: rows and seeds added to the spec.

A trial's context (``--set KEY=VALUE``) may give ``model``, ``corpus``, ``download_dir`` (where the corpus and
SentEval are downloaded when missing, default ``~/.cache/st_hardneg/data``), ``save_models`` (a folder: each final
model, without the head), ``fp16``, ``bf16``, ``eval_batch_size``, ``no_duplicates``, ``no_mlp_head``,
``no_transfer``, ``transfer_fast``, ``limit`` (the first N sentences), ``max_steps`` and ``quiet``.

The dry run's spec uses a tiny randomly initialised BERT (``st_hardneg.testing.make_tiny_model_dir``, made once in the
work folder) and the shared data: 32 sentences of ``corpus/wiki10k.txt``, batch 16, 2 steps, STS-B dev after each
step, STS-B test as the only STS task and TREC as the only transfer task (fast mode), both on a fifth or less of their
lines; every method; its records and tables go to ``output/paper_protocol_dry_run/``. Its scores mean nothing; it
checks that the code path runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.harness import trial_folder
from st_hardneg.training.studies.spec import Point, StudySpec

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
#: STS-B dev every this many steps, and the evaluations' encoding batch
EVAL_STEPS, EVAL_BATCH_SIZE = 125, 128

#: what the dry run overrides
DRY_RUN = {"batch_size": 16, "max_steps": 2, "eval_steps": 1, "limit": 32, "sts_tasks": ["STSBenchmark"],
           "transfer_tasks": ["TREC"], "transfer_fast": True}
#: the error of a configuration that leaves no usable row in a batch: a result, recorded as a failed trial
NO_USABLE_ROW = "no usable row in this batch"


def dry_run_protocol() -> dict[str, Any]:
    """The dry run's protocol (its spec's and its records'): :data:`PROTOCOL` with what :data:`DRY_RUN` overrides,
    the tiny model, the corpus and the lines of SentEval it keeps."""
    from st_hardneg.testing import MINI_SENTEVAL_FILES

    return {**PROTOCOL, "dry_run": dict(DRY_RUN, model="tiny random BERT",
                                        corpus="corpus/wiki10k.txt of the shared data",
                                        senteval_every_kth_line=dict(MINI_SENTEVAL_FILES))}


@dataclass(frozen=True)
class Settings:
    """What one run of the protocol takes besides its method and seed (the protocol's values, the resolved inputs
    and the context's options; see the module docstring)."""

    model: str
    corpus: str
    data_dir: str
    work_dir: str
    dry_run: bool = False
    batch_size: int = 64
    lr: float = 3e-5
    epochs: float = 1.0
    max_steps: int = -1
    max_seq_length: int = 32
    eval_steps: int = EVAL_STEPS
    eval_batch_size: int = EVAL_BATCH_SIZE
    limit: int = 0
    no_mlp_head: bool = False
    no_duplicates: bool = False
    fp16: bool = False
    bf16: bool = False
    no_transfer: bool = False
    transfer_fast: bool = False
    sts_tasks: Sequence[str] | None = None
    transfer_tasks: Sequence[str] | None = None
    save_models: str | None = None
    quiet: bool = False


def transfer_function():
    """``st_hardneg.evaluation.evaluate_transfer``, or ``None`` with a message if this installation lacks it."""
    try:
        from st_hardneg.evaluation import evaluate_transfer
    except ImportError as exc:
        print(f"transfer (TR) tasks skipped: st_hardneg.evaluation.evaluate_transfer is not available ({exc})",
              flush=True)
        return None
    return evaluate_transfer


def resolve_inputs(spec: StudySpec, context: Mapping[str, Any]) -> Settings:
    """The :class:`Settings` of the spec's protocol and the trial's ``context``, with its inputs there: for the dry
    run (a protocol with ``dry_run``) the tiny model and the small SentEval folder (made in the work folder when
    missing) and the shared corpus; otherwise the papers' corpus and SentEval data, downloaded when missing."""
    from st_hardneg.data import DataNotFoundError, download_senteval, download_wiki1m, resolve_senteval_dir

    work = Path(context["work_dir"])
    options = {key: context[key] for key in ("save_models", "fp16", "bf16", "eval_batch_size", "no_duplicates",
                                             "no_mlp_head", "no_transfer", "transfer_fast", "limit", "max_steps",
                                             "quiet") if key in context}
    protocol = {"batch_size": spec.protocol.get("batch_size", 64), "lr": spec.protocol.get("learning_rate", 3e-5),
                "epochs": spec.protocol.get("epochs", 1.0), "max_seq_length": spec.protocol.get("max_seq_length", 32)}
    if spec.protocol.get("dry_run"):
        from st_hardneg.testing import make_mini_senteval, make_tiny_model_dir

        model = context.get("model")
        if model is None:
            model = str(work / "tiny-bert")
            if not (Path(model) / "config.json").is_file():
                make_tiny_model_dir(model)
        senteval = work / "mini-senteval"
        if not senteval.is_dir():
            make_mini_senteval(context.get("data_dir"), senteval)
        corpus = context.get("corpus") or str(Path(context["data_dir"]) / "corpus" / "wiki10k.txt")
        settings = Settings(model=str(model), corpus=str(corpus), data_dir=str(senteval), work_dir=str(work),
                            dry_run=True, **protocol, **options)
        return replace(settings, **DRY_RUN)
    corpus = context.get("corpus") or str(download_wiki1m(context.get("download_dir")))  # at once if it is there
    data_dir = context.get("data_dir")
    try:
        resolve_senteval_dir(data_dir)
    except DataNotFoundError:
        print("SentEval data not found: downloading it (st_hardneg.data.download_senteval)", flush=True)
        data_dir = str(download_senteval(context.get("download_dir")))
    return Settings(model=str(context.get("model") or "bert-base-uncased"), corpus=str(corpus),
                    data_dir=str(data_dir), work_dir=str(work), **protocol, **options)


def run_one(method: str, loss: str, options: Mapping[str, Any], seed: int, args: Settings,
            evaluate_transfer) -> dict[str, Any]:
    """Train ``method`` (the loss ``loss`` with ``options``, ``{}``: its paper defaults) at ``seed`` on the protocol,
    in a fresh folder of the work folder removed after the run, then score STS (and TR if available)."""
    from transformers import set_seed

    from st_hardneg.data import read_corpus
    from st_hardneg.models import resolve_model, save_inference_model
    from st_hardneg.training import TrainConfig
    from st_hardneg.training.experiment import run_experiment

    sentences = read_corpus(args.corpus)
    if args.limit:
        sentences = sentences[: args.limit]
    with trial_folder(args.work_dir, f"{method}-seed{seed}") as work:
        config = TrainConfig(output_dir=str(work), batch_size=args.batch_size, learning_rate=args.lr,
                             epochs=args.epochs, max_steps=args.max_steps, seed=seed, eval_steps=args.eval_steps,
                             no_duplicates=args.no_duplicates, fp16=args.fp16, bf16=args.bf16,
                             show_progress_bar=not args.quiet)
        set_seed(seed)
        model = resolve_model(args.model, pooling="cls", max_seq_length=args.max_seq_length,
                              mlp_head=not args.no_mlp_head)
        experiment = run_experiment(model, loss, dict(options) or None, sentences, config, args.data_dir,
                                    sts_tasks=args.sts_tasks, eval_batch_size=args.eval_batch_size)
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
    return run


def run_trial(spec: StudySpec, point: Point, context: Mapping[str, Any]) -> dict[str, Any]:
    """One trial of the papers' protocol (its spec's ``trial``): the point's row (a registry loss at its paper
    defaults) trained at the point's seed and scored (:func:`run_one`). Returns the record the tables read, with the
    commit and library tree it ran from; a configuration that leaves no usable row is ``{"method", "seed",
    "failed"}``.

    Raises:
        ValueError: what the loss or the training refuses, besides a batch with no usable row.
    """
    row = spec.rows[point.row]
    settings = resolve_inputs(spec, context)
    provenance = {k: v for k, v in dict(context.get("provenance") or {}).items() if k in ("commit", "library")}
    evaluate_transfer = None if settings.no_transfer else transfer_function()
    try:
        record = run_one(point.row, str(row.loss), row.options, int(point.seed or 0), settings, evaluate_transfer)
    except ValueError as error:
        if NO_USABLE_ROW not in str(error):
            raise
        return {"method": point.row, "seed": point.seed, "failed": str(error), **provenance}
    return {**record, **provenance}


def prepare(spec: StudySpec, points: Sequence[Point], context: Mapping[str, Any]) -> None:
    """Before any trial runs (the spec's ``report.prepare``): refuse, in one line, a spec whose protocol is neither
    :data:`PROTOCOL` nor :func:`dry_run_protocol`, or a row without a loss or with the control; then make the
    inputs once (:func:`resolve_inputs`: the dry run's tiny model and SentEval folder, or the downloads), so that
    every worker finds them.

    Raises:
        ValueError: naming the value, or the download that failed.
    """
    if dict(spec.protocol) not in (PROTOCOL, dry_run_protocol()):
        raise ValueError(f"{spec.name}: the spec's protocol is neither the papers' ({__name__}.PROTOCOL) nor its dry "
                         "run's; another protocol is another benchmark")
    for label in sorted({p.row for p in points}):
        if spec.rows[label].loss is None or spec.rows[label].control:
            raise ValueError(f"{spec.name}: row {label!r}: the papers' protocol trains a registry loss, without the "
                             "control")
    try:
        resolve_inputs(spec, context)
    except OSError as exc:  # a download that cannot happen (no network, HF_HUB_OFFLINE), no space: one line
        raise ValueError(f"{spec.name}: its inputs cannot be fetched: {' '.join(str(exc).split())}") from None


def _ordered(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records in the registry's order of their method (then by seed), as the papers' tables list them."""
    from st_hardneg.training import LOSSES

    order = {name: i for i, name in enumerate(LOSSES)}
    return sorted(records, key=lambda r: (order.get(r.get("method"), len(order)), str(r.get("seed"))))


def records_file(records: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """``paper_protocol.json`` from the study's records (its ``report.layout``): the protocol (the file's, else
    :data:`PROTOCOL`) and the runs in the registry's order (:func:`_ordered`)."""
    return {"protocol": meta.get("protocol") or dict(PROTOCOL), "runs": _ordered(records)}


def dry_run_records_file(records: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """The dry run's records file: :func:`records_file` under :func:`dry_run_protocol`."""
    return {"protocol": meta.get("protocol") or dry_run_protocol(), "runs": _ordered(records)}


# --------------------------------------------------------------------------- the tables
def paper_table(runs: list[dict[str, Any]], key: str, columns: tuple[tuple[str, str], ...]) -> str:
    """A markdown table in a paper's layout: one row per (method, seed), the papers' column names, then Avg.
    (the mean over the columns present). Missing scores show as ``–``; returns ``""`` if no run has ``key``."""
    from st_hardneg.reporting import markdown_table

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
    """The tables of ``paper_protocol.md`` (the study's output): STS and transfer, in the papers' layouts."""
    runs = data["runs"]
    parts = ["### STS (Spearman x 100; the layout of SimCSE Table 5, MixCSE Table 1, Focal-InfoNCE Table 1, "
             "HNCSE Table 1, AdCSE Table 1)", "", paper_table(runs, "sts", STS_COLUMNS) or "(no STS results)", ""]
    tr = paper_table(runs, "transfer", TR_COLUMNS)
    parts += ["### Transfer (TR, accuracy; the layout of SimCSE Table 7 and the papers' transfer tables)", "",
              tr or "(no transfer results: evaluate_transfer unavailable or no_transfer)", ""]
    return "\n".join(parts)
