"""Two-dataset retrieval benchmark, second round: every st-hardneg loss with the recipe's false-negative
control beside the same loss without it, sentence-transformers' built-ins on their own dev-chosen mining, and a
longer NFCorpus protocol. The round is a study spec (:data:`SPEC`: its protocol, rows, datasets and grid as data) run
by the one runner (:mod:`benchmarks.studies`: the study engine's storage, its workers, a killed trial run again);
this module holds its trial (:func:`run_trial`, the round's mining per dataset), the runner's hooks (:func:`mine_left`
before the workers start, :func:`write_results` for the records file and its per-query file) and its report
(:func:`markdown`, :func:`plot`).

The protocol (:data:`~benchmarks.retrieval_beir_rows.PROTOCOL`: all-MiniLM-L6-v2 as published, 128 / 256 tokens,
batch 32, lr 2e-5, 10 % warm-up, 1 epoch, graded nDCG@10 on SciFact and NFCorpus, options chosen on pooled dev at
seed 0):

- **Mining** (:data:`~benchmarks.retrieval_beir_rows.MINING_SETTINGS`): ``mine_hard_negatives`` is given every
  training judgement of each sampled query, 1 negative a query; a pair whose query keeps no candidate stays in
  training as a pair (the Trainer's proportional multi-dataset batches: a batch is all triplets or all pairs).
  st-hardneg's rows train on ``top1_nomargin`` (the hardest candidate outside the training qrels); the built-ins on
  the setting MNRL's pooled dev chooses among the four (``mnrl@<setting>``, seed 0).
- **The control** (``+ctl``): the untrained model as the loss's guide, the relative 0.05 margin, the training qrels as
  ``known_positives``: GIST's rows plus known relevance, for Focal, MixCSE (explicit partner), HNCSE HNM (mined
  pool) and PM, and AdCSE with tied keys. Each loss's screen (seed 0, pooled dev): temperature 0.05 and 0.01, then its
  own option (:data:`~benchmarks.retrieval_beir_rows.LOSSES`) at the better temperature.
- **Longer NFCorpus** (dataset ``nfcorpus_long``): ~5,000 pairs (156 steps) for the best rows of each side.

How the grid was chosen (:func:`plan`; each item runs on both datasets): the seed-0 screens, most informative
first; ties closer than two dev standard deviations settled on seeds 0-2; the built-ins on the chosen mining; each
chosen loss without the control; the recipe and the best built-in (ties settled likewise); their 5 paired seeds and
MNRL's on the chosen mining; the longer NFCorpus protocol. The spec holds the grid it reached; its committed records
are imported as finished trials, so a run resumes (and the committed round has nothing left to run). The records
hold the commit and the library tree each run ran from.

    python -m benchmarks.studies benchmarks/studies/retrieval_beir_round2.json --run          # what is left
    python -m benchmarks.studies benchmarks/studies/retrieval_beir_round2.json --run --workers 2
    python -m benchmarks.studies benchmarks/studies/retrieval_beir_round2.json --run --storage postgresql://host/db
    python -m benchmarks.studies benchmarks/studies/retrieval_beir_round2.json --check        # == the committed?

A trial's options come with ``--set``: ``model=PATH`` (default: the embedded all-MiniLM-L6-v2),
``cache_dir=DIR`` (the mined negatives, default :data:`DEFAULT_CACHE_DIR`), ``eval_batch_size=N`` (64) and
``max_steps=N`` (smoke runs only: it changes the protocol's length).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import statistics
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import REPO, SHARED_DATA
from benchmarks.retrieval_beir_rows import (
    BUILTINS,
    DEV_FRACTION,
    LOSSES,
    MAIN,
    MINING_SETTINGS,
    OURS_MINING,
    PROTOCOL,
    TIE_SEEDS,
    all_rows,
    best_temperature,
    dev_sd,
    loss_choice,
    loss_configs,
    loss_key,
    mining_choice,
    pooled_dev,
    row_label,
    sampling,
    screened,
    settled,
    side_choice,
    side_labels,
    side_ranking,
    tied,
    twin,
)
from benchmarks.studies.render import TREES, per_query_rows
from st_hardneg.training.studies.spec import Point, Row, StudySpec

#: the round as a study spec: its protocol, rows, datasets and grid (the points :func:`plan` reached), its trial,
#: hooks and outputs
SPEC = REPO / "benchmarks" / "studies" / "retrieval_beir_round2.json"
#: where the mined negatives are kept, unless a trial's context names a ``cache_dir``
DEFAULT_CACHE_DIR = str(Path.home() / ".cache" / "st_hardneg" / "negatives")
#: the markers around the summary table in the report, where the docs' "which loss" page includes it from
SUMMARY_START, SUMMARY_END = "<!-- summary -->", "<!-- /summary -->"
#: the markers around the per-data-shape table, which the "which loss" page includes too
SHAPES_START, SHAPES_END = "<!-- shapes -->", "<!-- /shapes -->"
#: the markers around the longer protocol's table of rows, which the "which loss" page includes too
LONG_START, LONG_END = "<!-- long -->", "<!-- /long -->"
#: the data shape each dataset stands for (the share of training rows whose batch of 32 holds a candidate the training
#: qrels mark relevant to the row's query: ``benchmarks/results/known_relevance_share.md``)
SHAPES = {"scifact": "few judged documents per query (SciFact-like: 0.7-1.1 % of rows hold a known relevant "
                     "in-batch candidate)",
          "nfcorpus": "many judged documents per query (NFCorpus-like: 29-34 % of rows hold one)"}
#: the seeds of the recipe, the best built-in and MNRL on the chosen mining (5 paired seeds)
PAIRED_SEEDS = (0, 1, 2, 3, 4)
#: the longer protocol's dataset key: NFCorpus's folder, dev and test (:data:`LONG_TEST`), ~5,000 training pairs
LONG, LONG_TEST = "nfcorpus_long", "nfcorpus"
#: the seed-0 screen, most informative first: HNCSE's mixup (best on SciFact, hurt on NFCorpus) and Focal (NFCorpus
#: -11) with the control, the mining of sentence-transformers' reference run, then the rest
FIRST = ("hncse_hnm+ctl", "mnrl@skip10_rel0.05", "focal+ctl", "mnrl@rel0.05", "mixcse+ctl", "hncse_pm+ctl",
         "adcse_tied+ctl", "mnrl@top1_nomargin", "mnrl@pairs")


# --------------------------------------------------------------------------- one run
@dataclass
class Prepared:
    """A dataset ready for the protocol: the BEIR data, its split (test, dev, sampled training pairs) and counts."""

    name: str
    data: Any
    split: Any
    dev_split: str  # the qrels split whose grades score the dev task
    stats: dict[str, Any]


def prepare(name: str, root: Path, dev_fraction: float | None, sampling: dict[str, Any]) -> Prepared:
    """Read a BEIR folder and make its test task, dev task and sampled training pairs.

    Raises:
        ValueError: no ``qrels/dev.tsv`` and no ``dev_fraction``, or a sampling rule that leaves no pair (both before
            any model is loaded).
    """
    from st_hardneg.data.beir import BEIRRetrieval, beir_retrieval, load_beir
    from st_hardneg.training.sampling import sample_training_pairs

    data = load_beir(root, name=name)
    if "dev" in data.qrels:
        test, dev = data.task("test"), data.task("dev")
        dev_split = "dev"
    elif dev_fraction:
        carved = beir_retrieval(data, dev_fraction=dev_fraction, seed=0)
        test, dev = carved.task, carved.dev_task
        dev_split = "train"
    else:
        raise ValueError(f"the BEIR folder {root} has no dev split (qrels/dev.tsv) and no --dev-fraction was given: "
                         "pass --dev-fraction (a share of the training queries) or add qrels/dev.tsv")
    protected = set(test.queries.values()) | set(dev.queries.values())
    train_relevant = data.relevant("train")
    exclude = {q for q in train_relevant if q in dev.queries or q in test.queries or data.queries[q] in protected}
    pairs = sample_training_pairs(train_relevant, exclude=exclude, **sampling)
    kept = {q for q in train_relevant if q not in exclude}
    known: dict[str, set[str]] = {}
    for q in sorted(kept):  # queries with the same text share their relevant documents
        known.setdefault(data.queries[q], set()).update(data.corpus[d] for d in train_relevant[q])
    def natural(key: str) -> tuple[int, str]:  # beir_retrieval's order: the earlier scifact.json runs' data order
        return (int(key), "") if key.isdigit() else (1 << 62, key)

    ordered = sorted(pairs, key=lambda p: (natural(p[0]), natural(p[1])))
    split = BEIRRetrieval(task=test, dev_task=dev, train_pairs=[(data.queries[q], data.corpus[d]) for q, d in ordered],
                          train_corpus=list(dict.fromkeys(data.corpus.values())), known_paraphrases=known)
    stats = {"test_queries": len(test.queries), "dev_queries": len(dev.queries), "corpus": len(data.corpus),
             "training_queries": len(kept), "sampled_pairs": len(pairs),
             "sampled_queries": len({q for q, _ in pairs}), "digest": data.digest()}
    return Prepared(name=name, data=data, split=split, dev_split=dev_split, stats=stats)


def negatives_key(prep: Prepared, model_digest: str, mining: dict[str, Any]) -> dict[str, Any]:
    """What a negatives file was mined from: corpus, training pairs, known relevance, model weights, settings."""
    def sha(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    return {"corpus": sha("\n".join(prep.split.train_corpus)),
            "pairs": sha("\n".join(f"{a}\t{p}" for a, p in prep.split.train_pairs)),
            "known": sha("\n".join(f"{q}\t{d}" for q in sorted(prep.split.known_paraphrases)
                                   for d in sorted(prep.split.known_paraphrases[q]))),
            "model": model_digest, "max_seq_length": PROTOCOL["eval_max_seq_length"], "mining": mining}


def evaluate(model: Any, prep: Prepared, roles: tuple[str, ...], batch_size: int) -> tuple[dict, dict]:
    """``({role: mean metrics}, {role: {query id: nDCG@10}})`` of ``model`` on the dev and / or test task, scored as
    ``mteb.evaluate`` scores them (:func:`st_hardneg.evaluation.retrieval.retrieve`: top 1000, graded metrics by
    pytrec_eval), the tasks sharing one corpus encoding."""
    from st_hardneg.evaluation.retrieval import retrieve

    tasks = {role: prep.split.dev_task if role == "dev" else prep.split.task for role in roles}
    results = retrieve(model, list(tasks.values()), max_seq_length=PROTOCOL["eval_max_seq_length"],
                       batch_size=batch_size)
    means, per_query = {}, {}
    for role, task in tasks.items():
        result = results[task.name]
        means[role] = {m: result.scores[m] for m in ("ndcg@10", "mrr@10", "recall@100")}
        means[role]["queries"] = result.scores["queries"]
        per_query[role] = {q: round(v["ndcg@10"], 4) for q, v in result.per_query.items()}
    return means, per_query


@dataclass(frozen=True)
class Options:
    """A trial's options (:func:`trial_options`, from its context): the model trained (``None``: the embedded
    all-MiniLM-L6-v2), the folder its run writes in, the steps (``-1``: the protocol's epoch) and the evaluation's
    batch."""

    model: str | None = None
    work_dir: str = "output/retrieval_beir_round2"
    max_steps: int = -1
    eval_batch_size: int = 64


def load_model(options: Options, max_seq_length: int) -> Any:
    from st_hardneg.models import resolve_model

    return resolve_model(options.model, pooling="mean", max_seq_length=max_seq_length)


def frozen_guide(options: Options) -> Any:
    """The untrained model at the training length, in eval mode and without gradients: GIST's guide."""
    guide = load_model(options, PROTOCOL["train_max_seq_length"])
    guide.eval()
    for parameter in guide.parameters():
        parameter.requires_grad_(False)
    return guide


def build_loss(row: Row, model: Any, options: Options, known: dict[str, set[str]] | None = None) -> Any:
    """``row``'s loss on ``model`` through the shared :func:`benchmarks.harness.build` (GISTEmbedLoss guided by the
    frozen untrained model, CachedMNRL in mini-batches of the protocol's batch); a row with the control gets the
    frozen untrained model as its guide and ``known`` as its known positives."""
    from benchmarks.harness import build

    kwargs = dict(row.options)
    if row.control:
        kwargs["guide"] = frozen_guide(options)
        kwargs["known_positives"] = known
    if row.loss == "cached_mnrl":
        kwargs.setdefault("mini_batch_size", PROTOCOL["batch_size"])
    return build(str(row.loss), model, kwargs, lambda: frozen_guide(options))


def run_one(label: str, row: Row, seed: int, prep: Prepared, negatives: Any, roles: tuple[str, ...],
            options: Options) -> tuple[dict[str, Any], dict[str, Any]]:
    """Train one (row, seed) on the shared negatives and score it; returns ``(record, per-query nDCG@10)``."""
    from transformers import set_seed

    from st_hardneg.training.loop import train
    from st_hardneg.training.protocol import train_config

    work = Path(options.work_dir) / f"{prep.name}-{label}-seed{seed}"
    shutil.rmtree(work, ignore_errors=True)
    set_seed(seed)
    model = load_model(options, PROTOCOL["train_max_seq_length"])
    loss = build_loss(row, model, options, prep.split.known_paraphrases)
    batch_size = int(row.extra.get("batch_size", PROTOCOL["batch_size"]))
    config = train_config(work, seed=seed, batch_size=batch_size, learning_rate=PROTOCOL["learning_rate"],
                          warmup_ratio=PROTOCOL["warmup_ratio"], epochs=PROTOCOL["epochs"],
                          max_steps=options.max_steps, show_progress_bar=False)
    result = train(model, negatives, loss, config)
    start = time.perf_counter()
    means, per_query = evaluate(model, prep, roles, options.eval_batch_size)
    shutil.rmtree(work, ignore_errors=True)
    record = {"dataset": prep.name, "method": label, "seed": seed, "loss": row.loss, "options": dict(row.options),
              "builtin": bool(row.extra.get("builtin", False)), "known_positives": row.control,
              "batch_size": batch_size, **means,
              "train_seconds": round(result.train_seconds, 1),
              "median_step_seconds": round(result.median_step_seconds, 4) if result.median_step_seconds else None,
              "steps": result.steps, "eval_seconds": round(time.perf_counter() - start, 1),
              "device": str(model.device), "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
    return record, per_query


def mine(prep: Prepared, setting: str, model: Any, cache_dir: Path) -> tuple[Any, dict[str, Any]]:
    """The training data of ``setting`` for ``prep``'s sampled pairs: a ``Dataset`` of triplets, a ``DatasetDict``
    ``{"triplets", "pairs"}`` when some queries keep no candidate, or the pairs alone (``pairs``). The negative of
    each query is cached under the content hash of corpus, pairs, known relevance, model and setting; the
    embeddings under the model's digest, so the settings share one encoding of the corpus."""
    from datasets import Dataset, DatasetDict
    from sentence_transformers.util import mine_hard_negatives

    from st_hardneg.models import weights_digest

    pairs = prep.split.train_pairs
    spec = MINING_SETTINGS[setting]
    if spec is None:
        return (Dataset.from_dict({"anchor": [a for a, _ in pairs], "positive": [p for _, p in pairs]}),
                {"triplets": 0, "pairs": len(pairs), "mining_seconds": 0.0})
    known = prep.split.known_paraphrases
    digest = weights_digest(model)
    key = negatives_key(prep, digest, {"round2": setting, **spec})
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    path = cache_dir / f"round2-negatives-{prep.name}-{setting}-{name}.json"
    corpus = prep.split.train_corpus
    if path.is_file():
        stored = json.loads(path.read_text())
        negative_of, seconds = stored["negatives"], stored["mining_seconds"]
    else:
        forbidden = prep.split.protected_sentences()
        leaked = forbidden.intersection(corpus) | forbidden.intersection(s for pair in pairs for s in pair)
        if leaked:
            raise ValueError(f"{len(leaked)} test or dev text(s) in the training pairs or the mining corpus")
        queries = list(dict.fromkeys(a for a, _ in pairs))
        rows = [(q, d) for q in queries for d in sorted(known[q])]
        start = time.perf_counter()
        mined = mine_hard_negatives(
            Dataset.from_dict({"anchor": [q for q, _ in rows], "positive": [d for _, d in rows]}), model,
            corpus=list(corpus), range_min=spec["range_min"], range_max=spec["range_max"] or len(corpus),
            relative_margin=spec["relative_margin"], num_negatives=1, sampling_strategy="top",
            output_format="triplet", batch_size=64, verbose=False,
            cache_folder=str(cache_dir / f"round2-embeddings-{digest}-{PROTOCOL['eval_max_seq_length']}"))
        seconds = round(time.perf_counter() - start, 1)
        negative_of = {}
        for anchor, negative in zip(mined["anchor"], mined["negative"], strict=True):
            negative_of.setdefault(anchor, negative)
        bad = [q for q, n in negative_of.items() if n == q or n in known.get(q, ())]
        if bad:
            raise ValueError(f"mine_hard_negatives returned a known relevant document as the negative of {len(bad)} "
                             "queries")
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")  # a process of its own writes its own file, then renames it
        tmp.write_text(json.dumps({"key": key, "mining_seconds": seconds, "negatives": negative_of}))
        tmp.replace(path)
    triplets = [(a, p, negative_of[a]) for a, p in pairs if a in negative_of]
    left = [(a, p) for a, p in pairs if a not in negative_of]
    data = Dataset.from_dict({c: [t[i] for t in triplets] for i, c in enumerate(("anchor", "positive", "negative"))})
    info = {"triplets": len(triplets), "pairs": len(left), "mining_seconds": seconds, "file": path.name}
    if left:
        data = DatasetDict({"triplets": data,
                            "pairs": Dataset.from_dict({"anchor": [a for a, _ in left],
                                                        "positive": [p for _, p in left]})})
    return data, info


# --------------------------------------------------------------------------- the trial and the runner's hooks
#: this round's processes' prepared datasets and mined training data (a worker runs many trials of one dataset)
_PREPARED: dict[tuple[str, str], Prepared] = {}
_MINED: dict[tuple[str, str, str, str], tuple[Any, dict[str, Any]]] = {}


def _data_dir(context: Mapping[str, Any]) -> Path:
    """The data root of a trial's context: the runner's ``data_dir``, ``st-hardneg study``'s ``data_root``."""
    return Path(context.get("data_dir") or context.get("data_root") or SHARED_DATA)


def trial_options(context: Mapping[str, Any]) -> Options:
    """A trial's :class:`Options` from its context: ``model``, ``max_steps`` and ``eval_batch_size`` (``--set``), and
    the folder (the runner's ``work_dir``, or ``st-hardneg study``'s ``output_dir``).

    Raises:
        ValueError: ``max_steps`` or ``eval_batch_size`` that is not an integer (``eval_batch_size`` below 1).
    """
    def integer(name: str, default: int, minimum: int) -> int:
        value = context.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"--set {name} expects an integer of at least {minimum}, got {value!r}")
        return value

    work = context.get("work_dir") or context.get("output_dir") or Options.work_dir
    model = context.get("model")
    return Options(model=None if model is None else str(model), work_dir=str(work),
                   max_steps=integer("max_steps", -1, -1), eval_batch_size=integer("eval_batch_size", 64, 1))


def prepared(spec: StudySpec, name: str, context: Mapping[str, Any]) -> Prepared:
    """Dataset ``name`` of the spec, prepared once per process (:func:`prepare`): its folder under the context's
    data root, its dev split (``carve``: :data:`~benchmarks.retrieval_beir_rows.DEV_FRACTION` of the training
    queries) and its pair sampling (the dataset's ``extra``).

    Raises:
        ValueError: no BEIR folder there (naming it), or what :func:`prepare` refuses.
    """
    dataset = spec.datasets[name]
    root = _data_dir(context) / str(dataset.folder)
    if (name, str(root)) not in _PREPARED:
        fraction = DEV_FRACTION if dataset.dev == "carve" else None
        try:
            _PREPARED[(name, str(root))] = prepare(name, root, fraction,
                                                   dict(dataset.extra.get("pair_sampling") or sampling()))
        except FileNotFoundError as exc:  # the data root given is not the one the spec's folders are under
            raise ValueError(f"dataset {name!r} of {spec.name}: {exc}") from None
    return _PREPARED[(name, str(root))]


def training_data(spec: StudySpec, name: str, setting: str, context: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The training data of mining ``setting`` on dataset ``name`` and what its mining recorded (:func:`mine`, once
    per process; the negatives are cached in ``context["cache_dir"]``, so a second process reads them)."""
    cache = str(context.get("cache_dir", DEFAULT_CACHE_DIR))
    key = (name, setting, str(_data_dir(context)), cache)
    if key not in _MINED:
        prep = prepared(spec, name, context)  # the data first: a folder that is not there, before any model loads
        model = load_model(trial_options(context), PROTOCOL["eval_max_seq_length"])
        _MINED[key] = mine(prep, setting, model, Path(cache))
    return _MINED[key]


def _mining(spec: StudySpec, label: str) -> str:
    """The mining setting of a trained row (its ``extra``).

    Raises:
        ValueError: a row that names none of :data:`~benchmarks.retrieval_beir_rows.MINING_SETTINGS`.
    """
    setting = spec.rows[label].extra.get("mining")
    if setting not in MINING_SETTINGS:
        raise ValueError(f"row {label!r} of {spec.name} names no mining setting of this round (extra.mining "
                         f"{setting!r}; one of {', '.join(MINING_SETTINGS)})")
    return str(setting)


def run_trial(spec: StudySpec, point: Point, context: Mapping[str, Any]) -> dict[str, Any]:
    """One trial of this round (the spec's ``trial``): the untrained model evaluated, or the point's row (the spec's
    row: its loss, options and control, its mining in ``extra``) trained at the point's seed on its dataset and
    scored on dev and test (:func:`run_one`). Returns the record the report reads, with the dataset's counts
    (``split``), its mining's (``negatives``), the commit and library tree (``context["provenance"]``), the workers
    of the run (``runners``) and the per-query nDCG@10 by role (``scores_by_query``, which :func:`write_results`
    moves to the per-query file).

    Raises:
        ValueError: a row without a mining setting of this round, or what :func:`prepare` / :func:`mine` refuse.
    """
    row = spec.rows[point.row]
    setting = _mining(spec, point.row) if row.loss is not None else None
    prep = prepared(spec, point.dataset, context)
    provenance = {k: v for k, v in dict(context.get("provenance") or {}).items() if k in ("commit", "library")}
    common = {"split": prep.stats, "runners": int(context.get("workers", 1)), **provenance}
    if setting is None:  # the model as published, the same evaluation
        start = time.perf_counter()
        model = load_model(trial_options(context), PROTOCOL["eval_max_seq_length"])
        means, _ = evaluate(model, prep, ("dev", "test"), trial_options(context).eval_batch_size)
        return {"stage": "untrained", "dataset": point.dataset, "method": point.row, "seed": point.seed, **means,
                "eval_seconds": round(time.perf_counter() - start, 1), **common}
    negatives, info = training_data(spec, point.dataset, setting, context)
    record, per_query = run_one(point.row, row, int(point.seed or 0), prep, negatives, ("dev", "test"),
                                trial_options(context))
    record.update(stage="main", mining=setting, negatives=info, scores_by_query=per_query, **common)
    return record


def mine_left(spec: StudySpec, points: Sequence[Point], context: Mapping[str, Any]) -> None:
    """The runner's ``prepare`` hook: check the trials' options and every left point's row and data, then prepare and
    mine, here and once, the data of every trained point left to run (:func:`training_data`), so that the workers
    read the negatives from the cache.

    Raises:
        ValueError: a bad option (:func:`trial_options`), a row without a mining setting of this round, a dataset
            folder that is not there, or what :func:`prepare` / :func:`mine` refuse; all but the last before any
            model loads.
    """
    trial_options(context)
    for point in points:
        if spec.rows[point.row].loss is not None:
            _mining(spec, point.row)
        prepared(spec, point.dataset, context)
    for point in points:
        if spec.rows[point.row].loss is not None:
            training_data(spec, point.dataset, _mining(spec, point.row), context)


def write_results(records: list[dict[str, Any]], meta: dict[str, Any], path: Path) -> dict[str, Any]:
    """The runner's ``write`` hook: the round's records file at ``path`` (and its per-query file beside it,
    ``<stem>_per_query.jsonl``) from the study's finished records, in the engine's order (imported records first, in
    their own order), and the file's other fields (``meta``); returns what the file now holds. Each new record's
    per-query scores become a line of the per-query file it points to; an imported record keeps its line; the
    datasets' and minings' counts, the commits and their library trees are gathered from the records."""
    from st_hardneg.reporting import write_json

    per_query_path = path.with_name(path.stem + "_per_query.jsonl")
    data: dict[str, Any] = {"protocol": None, "runs": None, **json.loads(json.dumps(meta))}  # the file's own order
    data.update(protocol=dict(PROTOCOL), runs=[])
    kept = {row["run"]: row for row in per_query_rows(per_query_path, records)}
    lines: list[dict[str, Any]] = []
    for number, original in enumerate(records):
        record = dict(original)
        split, info = record.pop("split", None), record.pop("negatives", None)
        if split is not None:
            data.setdefault("datasets", {})[record["dataset"]] = split
        if info is not None:
            data.setdefault("negatives", {})[f"{record['dataset']}/{record['mining']}"] = info
        scores = record.pop("scores_by_query", None)
        if scores is not None:
            record["per_query"] = f"{per_query_path.name}#{number}"
            lines.append({"run": number, "dataset": record["dataset"], "method": record["method"],
                          "seed": record["seed"], "stage": record.get("stage", "main"), "ndcg@10": scores})
        elif number in kept:
            lines.append(kept[number])
        if record.get("commit") and record["commit"] not in data.setdefault("commits", []):
            data["commits"].append(record["commit"])
            data.setdefault(TREES, {}).setdefault(record["commit"], record.get("library", "unknown"))
        data["runs"].append(record)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = per_query_path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(line) + "\n" for line in lines))
    tmp.replace(per_query_path)
    write_json(path, data)
    return data


def plan(data: dict[str, Any]) -> Iterator[tuple[str, str, int]]:
    """How the round chose its grid: ``(dataset, row, seed)`` in order, read lazily, each choice made from the runs
    in ``data`` when it is reached.

    1. the seed-0 screen on both datasets: :data:`FIRST`, each loss with the control at temperature 0.01, then its
       own option at its better temperature;
    2. ties: where a loss's configurations, or MNRL's mining settings, are closer on pooled dev at seed 0 than two
       dev standard deviations (:func:`~benchmarks.retrieval_beir_rows.tied`), the tied rows (the best three
       at most) at seeds 1-2, and the choice is made on the three seeds;
    3. the built-ins on the dev-chosen mining (seed 0) and each loss's chosen configuration without the control;
    4. the recipe (st-hardneg's best row) and the best built-in, ties on each side to seeds 1-2 as in 2;
    5. 5 paired seeds (0-4) of the recipe, the best built-in and MNRL on the chosen mining;
    6. the longer NFCorpus protocol: the best two rows of each side (the chosen one first), seeds 0-2.

    The round's spec (:data:`SPEC`) holds the grid this order reached: the points the study engine runs.
    """
    def both(label: str, seed: int = 0) -> Iterator[tuple[str, str, int]]:
        for name in MAIN:
            yield name, label, seed

    def settle(labels: list[str]) -> Iterator[tuple[str, str, int]]:
        ties = tied(data, labels)
        for seed in TIE_SEEDS[1:] if len(ties) > 1 else ():
            for label in ties:
                yield from both(label, seed)

    for label in FIRST:
        yield from both(label)
    for key in LOSSES:
        yield from both(row_label(key, temperature=0.01))
    for key in LOSSES:
        yield from both(row_label(key, temperature=best_temperature(data, key), option=True))
    for key in LOSSES:
        yield from settle(loss_configs(key))
    yield from settle([f"mnrl@{s}" for s in MINING_SETTINGS])
    setting = mining_choice(data) or OURS_MINING
    for name in BUILTINS:
        yield from both(f"{name}@{setting}")
    for key in LOSSES:
        chosen = loss_choice(data, key)
        if chosen:
            yield from both(twin(chosen))
    for builtin in (False, True):
        yield from settle(side_labels(data, builtin))
    finalists = [c for c in (side_choice(data, builtin=False), side_choice(data, builtin=True),
                             f"mnrl@{setting}") if c]
    for seed in PAIRED_SEEDS:
        for label in dict.fromkeys(finalists):
            yield from both(label, seed)
    long: list[str] = []
    for builtin in (False, True):
        chosen = side_choice(data, builtin)
        ranked = [label for label, _ in side_ranking(data, builtin)]
        long += list(dict.fromkeys([*([chosen] if chosen else []), *ranked]))[:2]
    for seed in (0, 1, 2):
        for label in long:
            yield LONG, label, seed


# --------------------------------------------------------------------------- report
def per_query_runs(path: Path, runs: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The per-query file's rows (one per run: dataset, method, seed, stage, nDCG@10 by role and query).

    With ``runs`` (the results file's runs), only the rows their records point to
    (:func:`benchmarks.studies.render.per_query_rows`: ``"per_query": "<file>#<n>"`` with the same dataset, row, seed
    and stage), whatever the file's order: a row left by a runner stopped between
    its two writes, or the row of a run replaced since, is not read. Records that point to no row at all (results
    written by hand) leave every row read."""
    if runs is None or not any("per_query" in record for record in runs):  # nothing to check the rows against
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    return per_query_rows(path, runs)


def per_query_by_row(per_query: list[dict[str, Any]]) -> dict[tuple[str, str], dict[int, dict[str, float]]]:
    """``{(dataset, row): {seed: {query: test nDCG@10}}}`` of the main stage's runs."""
    by: dict[tuple[str, str], dict[int, dict[str, float]]] = {}
    for row in per_query:
        if row.get("stage") == "main" and "test" in row["ndcg@10"]:
            by.setdefault((row["dataset"], row["method"]), {})[row["seed"]] = row["ndcg@10"]["test"]
    return by


def compare_rows(by: dict[tuple[str, str], dict[int, dict[str, float]]], names: list[str], seeds: list[int],
                 method: str, baseline: str) -> Any:
    """:func:`st_hardneg.evaluation.compare_runs` of ``method`` against ``baseline`` on the per-query test nDCG@10 of
    datasets ``names`` at ``seeds``."""
    from st_hardneg.evaluation import compare_runs

    runs = {label: [{name: {q: {"ndcg@10": v} for q, v in by[(name, label)][s].items()} for name in names}
                    for s in seeds] for label in (baseline, method)}
    return compare_runs(runs, baseline=baseline)


def paired_section(by: dict[tuple[str, str], dict[int, dict[str, float]]], method: str, baseline: str,
                   title: str) -> list[str]:
    """``method`` against ``baseline`` with :func:`st_hardneg.evaluation.compare_runs` on the test queries of every
    dataset where both have per-query scores (per-query nDCG@10 averaged over their common seeds; one comparison with
    Holm over the datasets when both datasets have the same common seeds, else one per dataset over its own)."""

    common = {name: sorted(set(by.get((name, method), {})) & set(by.get((name, baseline), {}))) for name in MAIN}
    joint = sorted(set.intersection(*(set(v) for v in common.values())))
    same = joint and all(seeds == joint for seeds in common.values())  # else each dataset over all its seeds
    groups = [(list(MAIN), joint)] if same else [([name], seeds) for name, seeds in common.items()]
    lines: list[str] = []
    for names, seeds in groups:
        if not seeds:
            lines += [f"- {title} on {names[0]}: not run (no seed with per-query scores for both rows)", ""]
            continue
        result = compare_rows(by, names, seeds, method, baseline)
        lines += [f"{title} on {', '.join(names)}, seeds {', '.join(map(str, seeds))}:", "",
                  result.to_markdown().rstrip("\n"), ""]
    return lines


def _runs(data: dict[str, Any], name: str, label: str) -> list[dict[str, Any]]:
    return sorted((r for r in data["runs"] if r["dataset"] == name and r["method"] == label and "test" in r
                   and "failed" not in r), key=lambda r: r["seed"] or 0)


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def side(label: str) -> str:
    if label == "untrained":
        return "published model"
    if loss_key(label) is None:
        return "sentence-transformers"
    return "st-hardneg + control" if "+ctl" in label else "st-hardneg, no control"


def summary(data: dict[str, Any]) -> str:
    """One line a row: test nDCG@10 (mean ± std over seeds) on each dataset, their mean, pooled dev at seed 0 (what
    chooses), seeds, the step cost; best pooled dev first."""
    from st_hardneg.reporting import markdown_table, mean_std_text

    labels = list(dict.fromkeys(r["method"] for r in data["runs"] if r["dataset"] in MAIN and "test" in r))
    dev = screened(data, labels)
    untrained = pooled_dev(data, "untrained", "untrained")
    if untrained is not None:
        dev["untrained"] = untrained
    labels.sort(key=lambda label: (label != "untrained", -(dev.get(label) or -1.0), label))
    body = []
    for label in labels:
        per = {name: [r["test"]["ndcg@10"] for r in _runs(data, name, label)] for name in MAIN}
        means = [_mean(v) for v in per.values()]
        steps = [r["median_step_seconds"] for name in MAIN for r in _runs(data, name, label)
                 if r.get("median_step_seconds")]
        train = [r["train_seconds"] for name in MAIN for r in _runs(data, name, label) if r.get("train_seconds")]
        body.append([label, side(label), *(mean_std_text(v) if v else "not run" for v in per.values()),
                     f"{statistics.fmean(means):.2f}" if None not in means else "–",
                     f"{dev[label]:.2f}" if label in dev else "–", " / ".join(str(len(v)) for v in per.values()),
                     f"{statistics.median(steps):.2f} s, {statistics.fmean(train):.0f} s" if steps else "–"])
    return markdown_table(["row", "side", "SciFact test nDCG@10", "NFCorpus test nDCG@10", "mean",
                           "pooled dev (seed 0)", "seeds (SciFact / NFCorpus)", "step cost (median step, train s)"],
                          body).rstrip("\n")


#: the round's target for the recipe against the best built-in: the two datasets' mean difference of test nDCG@10,
#: ahead on each, Holm-corrected per-query randomization p below this on each
TARGET_MEAN, TARGET_P = 1.0, 0.05


def target_line(by: dict[tuple[str, str], dict[int, dict[str, float]]], recipe: str, best: str) -> str:
    """Whether the recipe meets the target against the best built-in (:data:`TARGET_MEAN`, ahead on each dataset,
    Holm p below :data:`TARGET_P` on each), on the per-query test scores over the seeds both rows share on both
    datasets; or why it cannot be judged yet."""
    seeds = sorted(set.intersection(*(set(by.get((name, label), {})) for name in MAIN for label in (recipe, best))))
    if not seeds:
        return "- target: not judged yet (no seed with per-query scores of both rows on both datasets)"
    rows = compare_rows(by, list(MAIN), seeds, recipe, best).rows
    mean = statistics.fmean(r.mean_difference for r in rows)
    parts = [f"{r.dataset} {r.mean_difference:+.2f} (Holm p {r.p_randomization_holm:.3g}; detectable "
             f"{detectable_difference(query_differences(by, r.dataset, seeds, recipe, best), len(rows)):.2f})"
             for r in rows]
    met = mean >= TARGET_MEAN and all(r.mean_difference > 0 and r.p_randomization_holm < TARGET_P for r in rows)
    verdict = "met" if met else (f"not met: {TARGET_MEAN - mean:.2f} short on the mean" if mean < TARGET_MEAN
                                 else "not met: not ahead, or not significant, on each dataset")
    return (f"- target (+{TARGET_MEAN:.1f} on the two datasets' mean, ahead on each, Holm p < {TARGET_P} on each), "
            f"{len(seeds)} paired seed(s): mean {mean:+.2f}; {'; '.join(parts)}: **{verdict}**"
            + ("" if len(seeds) >= len(PAIRED_SEEDS) else f" (provisional: {len(PAIRED_SEEDS)} seeds planned)")
            + ". Detectable: the smallest difference this test would find significant after Holm with 80 % power, "
            "at the per-query spread of the differences (`detectable_difference`)")


def query_differences(by: dict[tuple[str, str], dict[int, dict[str, float]]], name: str, seeds: list[int],
                      method: str, baseline: str) -> list[float]:
    """Per query of ``name``'s test set, ``method`` minus ``baseline`` (nDCG@10 x 100), each averaged over ``seeds``
    first, as :func:`st_hardneg.evaluation.compare_runs` pairs them."""
    mean = {label: {q: statistics.fmean(by[(name, label)][s][q] for s in seeds) for q in by[(name, label)][seeds[0]]}
            for label in (method, baseline)}
    return [mean[method][q] - mean[baseline][q] for q in sorted(mean[baseline]) if q in mean[method]]


def detectable_difference(differences: list[float], comparisons: int, power: float = 0.8) -> float:
    """The smallest mean difference a paired test over these queries finds significant at :data:`TARGET_P` after
    Holm over ``comparisons`` (the strictest level, ``TARGET_P / comparisons``, two-sided) with probability
    ``power``: ``(z(1 - alpha / 2) + z(power)) * sd / sqrt(n)`` of the per-query differences (normal
    approximation)."""
    from statistics import NormalDist

    if len(differences) < 2:
        return float("nan")
    z = NormalDist().inv_cdf
    alpha = TARGET_P / comparisons
    return (z(1 - alpha / 2) + z(power)) * statistics.stdev(differences) / len(differences) ** 0.5


def tie_table(data: dict[str, Any]) -> str:
    """Each choice whose rows were tied at seed 0 (:func:`~benchmarks.retrieval_beir_rows.tied`): the tied
    rows' pooled dev at seed 0 and over the tie seeds, and the choice; empty when no choice had a tie."""
    from st_hardneg.reporting import markdown_table

    sd = dev_sd()
    choices = {f"{key} (configuration)": (loss_configs(key), loss_choice(data, key))
               for key in LOSSES}
    choices["mining of the built-ins"] = ([f"mnrl@{s}" for s in MINING_SETTINGS],
                                          f"mnrl@{mining_choice(data)}")
    choices["the recipe"] = (side_labels(data, False), side_choice(data, False))
    choices["the best built-in"] = (side_labels(data, True), side_choice(data, True))
    body = []
    for choice, (labels, chosen) in choices.items():
        ties = tied(data, labels, sd)
        if len(ties) < 2:
            continue
        for label in ties:
            at0, over_seeds = pooled_dev(data, "main", label, (0,)), settled(data, label)
            body.append([choice, f"`{label}`", f"{at0:.2f}" if at0 is not None else "–",
                         f"{over_seeds:.2f}" if over_seeds is not None else "not yet run",
                         "chosen" if label == chosen else ""])
    if not body:
        return ""
    return (f"Two dev standard deviations: {2 * sd:.2f} (the median seed-to-seed standard deviation of pooled dev "
            f"over the first round's rows run at 3 or more seeds, {sd:.3f}).\n\n"
            + markdown_table(["choice", "row", "pooled dev, seed 0", "pooled dev, seeds 0-2", ""], body).rstrip("\n"))


def best_on(data: dict[str, Any], name: str, builtin: bool) -> str | None:
    """The row of one side with the best dev nDCG@10 on dataset ``name`` alone at seed 0: what a team with data of
    that shape would choose on its own dev split, among every configuration of st-hardneg's losses (with and without
    the control) or every built-in row."""
    labels = side_labels(data, True) if builtin else [label for label in all_rows() if loss_key(label)]
    scored = {label: values[0] for label in labels
              if (values := [r["dev"]["ndcg@10"] for r in _runs(data, name, label) if r["seed"] == 0])}
    return max(scored, key=lambda k: scored[k]) if scored else None


def _seeds(count: int) -> str:
    return f"{count} seed" + ("s" if count != 1 else "")


def shape_table(data: dict[str, Any]) -> str:
    """Per data shape (:data:`SHAPES`): the best row of st-hardneg and of sentence-transformers on that dataset's own
    dev (seed 0), their test nDCG@10 (mean ± std over their seeds) and the difference of the means."""
    from st_hardneg.reporting import markdown_table, mean_std_text

    body = []
    for name in MAIN:
        ours, theirs = best_on(data, name, builtin=False), best_on(data, name, builtin=True)
        tests = {label: [r["test"]["ndcg@10"] for r in _runs(data, name, label)] for label in (ours, theirs) if label}
        difference = (f"{statistics.fmean(tests[ours]) - statistics.fmean(tests[theirs]):+.2f}"
                      if ours and theirs else "–")
        body.append([SHAPES[name], *(f"`{label}`: {mean_std_text(tests[label])} ({_seeds(len(tests[label]))})"
                                     if label else "not run" for label in (ours, theirs)), difference])
    return markdown_table(["data shape", "st-hardneg, best on this dataset's dev", "sentence-transformers, best on "
                           "this dataset's dev", "difference (test)"], body).rstrip("\n")


def dataset_table(data: dict[str, Any], name: str) -> str:
    from st_hardneg.reporting import markdown_table, mean_std_text

    labels = list(dict.fromkeys(r["method"] for r in data["runs"] if r["dataset"] == name and "test" in r))
    body = []
    for label in labels:
        rows = _runs(data, name, label)
        test = [r["test"]["ndcg@10"] for r in rows]
        steps = [r["median_step_seconds"] for r in rows if r.get("median_step_seconds")]
        train = [r["train_seconds"] for r in rows if r.get("train_seconds")]
        body.append([label, mean_std_text(test), mean_std_text([r["dev"]["ndcg@10"] for r in rows]),
                     mean_std_text([r["test"]["mrr@10"] for r in rows if "mrr@10" in r["test"]]),
                     mean_std_text([r["test"]["recall@100"] for r in rows if "recall@100" in r["test"]]),
                     ", ".join(f"{v:.2f}" for v in test), rows[0].get("mining", "–"),
                     str(rows[0].get("steps", "–")), f"{statistics.fmean(train):.0f}" if train else "–",
                     f"{statistics.median(steps):.3f}" if steps else "–"])
    return markdown_table(["row", "test nDCG@10", "dev nDCG@10", "test MRR@10", "test R@100", "test per seed",
                           "mining", "steps", "train s", "median step s"], body).rstrip("\n")


def loss_screen(data: dict[str, Any]) -> str:
    from st_hardneg.reporting import markdown_table

    body = []
    for key in LOSSES:
        chosen = loss_choice(data, key)
        for label in [*loss_configs(key), *loss_configs(key, control=False)]:
            devs = [[r["dev"]["ndcg@10"] for r in _runs(data, name, label) if r["seed"] == 0] for name in MAIN]
            if not any(devs):
                continue
            pooled = pooled_dev(data, "main", label, (0,))
            body.append([label, *(f"{d[0]:.2f}" if d else "not run" for d in devs),
                         f"{pooled:.2f}" if pooled is not None else "–", "chosen" if label == chosen else ""])
    return markdown_table(["configuration", "SciFact dev", "NFCorpus dev", "pooled dev", ""], body).rstrip("\n")


def mining_screen(data: dict[str, Any]) -> str:
    from st_hardneg.reporting import markdown_table

    chosen = mining_choice(data)
    body = []
    for setting in MINING_SETTINGS:
        label = f"mnrl@{setting}"
        cells = []
        for name in MAIN:
            info = data.get("negatives", {}).get(f"{name}/{setting}")
            kept = f"{info['triplets']} triplets + {info['pairs']} pairs" if info else "not mined"
            dev = [r["dev"]["ndcg@10"] for r in _runs(data, name, label) if r["seed"] == 0]
            cells += [kept, f"{dev[0]:.2f}" if dev else "not run"]
        pooled = pooled_dev(data, "main", label, (0,))
        body.append([f"`{setting}`", *cells, f"{pooled:.2f}" if pooled is not None else "–",
                     "chosen" if setting == chosen else ""])
    return markdown_table(["setting", "SciFact data", "SciFact MNRL dev", "NFCorpus data", "NFCorpus MNRL dev",
                           "pooled dev", ""], body).rstrip("\n")


def markdown(data: dict[str, Any], per_query: list[dict[str, Any]] | None = None) -> str:
    ours = side_ranking(data, builtin=False)
    builtins = side_ranking(data, builtin=True)
    lines = ["# Two-dataset retrieval benchmark, second round: SciFact + NFCorpus (all-MiniLM-L6-v2, x 100)",
             "", f"Runs from commit(s) {', '.join(f'`{c}`' for c in data.get('commits', []))}; "
             f"{sum(1 for r in data['runs'] if 'test' in r and 'source' not in r)} runs finished. "
             f"{library_line(data)}", ""]
    if data.get("reading"):
        lines += ["## Reading", "", *data["reading"], ""]
    lines += ["## Summary (test nDCG@10; rows by pooled dev nDCG@10 at seed 0, the choosing score)", "",
              SUMMARY_START, summary(data), SUMMARY_END, "",
              f"- best of st-hardneg on pooled dev: {', '.join(f'`{k}` {v:.2f}' for k, v in ours[:3]) or 'none yet'}",
              f"- best built-in on pooled dev: {', '.join(f'`{k}` {v:.2f}' for k, v in builtins[:3]) or 'none yet'}",
              f"- mining of the built-ins (MNRL's pooled dev): `{mining_choice(data) or 'not chosen yet'}`; "
              f"st-hardneg's rows: `{OURS_MINING}`", ""]
    lines += ["## By data shape (each side's best row on one dataset's dev, seed 0; test nDCG@10)", "",
              SHAPES_START, shape_table(data), SHAPES_END, ""]
    by = per_query_by_row(per_query or [])
    recipe, best = side_choice(data, builtin=False), side_choice(data, builtin=True)
    if recipe and best:
        mnrl = f"mnrl@{mining_choice(data) or OURS_MINING}"
        lines += ["## The recipe against the best built-in and MNRL on the chosen mining (per-query test nDCG@10; "
                  "Holm across the two datasets)", "",
                  f"The recipe (st-hardneg's best row on pooled dev) is `{recipe}`; the best built-in `{best}`.", "",
                  *paired_section(by, recipe, best, f"{recipe} vs {best}"), target_line(by, recipe, best), ""]
        if mnrl != best:
            lines += paired_section(by, recipe, mnrl, f"{recipe} vs {mnrl}")
    ties = tie_table(data)
    if ties:
        lines += ["## Ties (closer than two dev standard deviations at seed 0: settled on seeds 0-2)", "", ties, ""]
    control = [(c, twin(c)) for key in LOSSES if (c := loss_choice(data, key))]
    pairs = [(a, b) for a, b in control if any(k[1] == a for k in by) and any(k[1] == b for k in by)]
    if pairs:
        lines += ["## The control (each loss's chosen configuration with and without it, per-query test nDCG@10)",
                  ""]
        for a, b in pairs:
            lines += paired_section(by, a, b, f"{a} vs {b}")
    lines += ["## Loss screen (seed 0, dev nDCG@10; temperature 0.05 / 0.01, then the loss's own option at the "
              "better one)", "", loss_screen(data), "",
              "## Mining screen (MNRL, seed 0; the training data each setting leaves of the sampled pairs)", "",
              mining_screen(data), ""]
    for name in (*MAIN, LONG):
        if any(r["dataset"] == name for r in data["runs"]):
            title = {LONG: "nfcorpus, longer protocol (~5,000 pairs)"}.get(name, name)
            if name == LONG:
                lines += [f"## {title}", "", LONG_START, dataset_table(data, name), LONG_END, "",
                          *long_comparisons(data, by)]
            else:
                lines += [f"## {title}", "", dataset_table(data, name), ""]
    failed = [f"{r['dataset']} {r['method']} seed {r['seed']}: {r['failed']}" for r in data["runs"] if "failed" in r]
    if failed:
        lines += ["## Failed runs", "", *(f"- {f}" for f in failed), ""]
    lines += ["## Protocol", "", *(f"- {k}: {v}" for k, v in data["protocol"].items()), ""]
    return "\n".join(lines)


def _paired(by: dict[tuple[str, str], dict[int, dict[str, float]]],
            pairs: list[tuple[tuple[str, str], tuple[str, str]]], seeds: list[int]) -> Any:
    """:func:`st_hardneg.evaluation.compare_runs` of each ``(method, baseline)`` pair, each a ``(dataset key, row)``
    of ``by`` scored on NFCorpus's test queries (:data:`LONG_TEST`, the test set of both NFCorpus protocols; per-query
    nDCG@10 averaged over ``seeds``), with Holm over all the pairs: one
    :class:`~st_hardneg.evaluation.ComparisonResult` whose rows are named ``<dataset key>/<row>``."""
    from st_hardneg.evaluation.compare import ComparisonResult, compare_runs, holm

    results = []
    for method, baseline in pairs:
        runs = {"/".join(key): [{LONG_TEST: {q: {"ndcg@10": v} for q, v in by[key][s].items()}} for s in seeds]
                for key in (baseline, method)}
        results.append(compare_runs(runs, baseline="/".join(baseline)))
    rows = [row for result in results for row in result.rows]
    for attribute in ("p_randomization", "p_ttest"):
        for row, adjusted in zip(rows, holm([getattr(r, attribute) for r in rows]), strict=True):
            setattr(row, f"{attribute}_holm", adjusted)
    first = results[0]
    methods = {name: sources for result in results for name, sources in result.methods.items()}
    return ComparisonResult(metric=first.metric, methods=methods, rows=rows, permutations=first.permutations,
                            confidence=first.confidence, seed=first.seed)


def long_comparisons(data: dict[str, Any], by: dict[tuple[str, str], dict[int, dict[str, float]]]) -> list[str]:
    """The longer NFCorpus protocol read two ways, on the per-query test nDCG@10 of the seeds every one of its rows
    has: each st-hardneg row against each built-in row (Holm over those comparisons), and each row against itself on
    the 768-pair protocol at the same seeds (does training longer change it? Holm over the rows). Empty before two
    rows share a seed."""
    labels = list(dict.fromkeys(r["method"] for r in data["runs"] if r["dataset"] == LONG and "test" in r))
    labels = [label for label in labels if (LONG, label) in by]
    if not labels:
        return []
    seeds = sorted(set.intersection(*(set(by[(LONG, label)]) for label in labels)))
    ours = [label for label in labels if loss_key(label)]
    theirs = [label for label in labels if not loss_key(label)]
    lines: list[str] = []
    if seeds and ours and theirs:
        result = _paired(by, [((LONG, a), (LONG, b)) for b in theirs for a in ours], seeds)
        lines += [f"### st-hardneg against sentence-transformers, longer protocol (seeds {', '.join(map(str, seeds))})",
                  "", result.to_markdown().rstrip("\n"), ""]
    shorter = [label for label in labels if seeds and set(seeds) <= set(by.get((LONG_TEST, label), {}))]
    if shorter:
        result = _paired(by, [((LONG, label), (LONG_TEST, label)) for label in shorter], seeds)
        lines += [f"### Each row, longer protocol against the 768-pair protocol (seeds {', '.join(map(str, seeds))})",
                  "", result.to_markdown().rstrip("\n"), ""]
    return lines


def library_line(data: dict[str, Any]) -> str:
    """Which library code trained the runs: the ``st_hardneg/`` tree of each run's commit (commits that differ only in
    the benchmark driver share it), and how many ran beside another runner (one torch thread each)."""
    trees = data.get("library_trees", {})
    finished = [r for r in data["runs"] if "test" in r and "source" not in r]
    used = sorted({r.get("library") or trees.get(r.get("commit", ""), "unknown") for r in finished})
    side_by_side = sum(1 for r in finished if (r.get("runners") or 1) > 1)
    text = (f"Library (`st_hardneg/` tree) of every run: `{used[0]}`." if len(used) == 1 else
            f"Library trees of the runs: {', '.join(f'`{t}`' for t in used)} (runs from different trees are not "
            "paired)." if used else "")
    return text + (f" {side_by_side} run(s) ran beside another runner (one torch thread each, on 2 cores)."
                   if side_by_side else "")


def control_points(data: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per dataset, each loss's chosen configuration with the control and the same configuration without it: test
    nDCG@10 averaged over each row's seeds (``None`` where a row has not run), with the seeds; and the references:
    the untrained model, the best built-in and MNRL on the chosen mining."""
    out: dict[str, list[dict[str, Any]]] = {}
    for name in MAIN:
        points = []
        for key in LOSSES:
            chosen = loss_choice(data, key)
            if chosen is None:
                continue
            point: dict[str, Any] = {"loss": key, "label": chosen}
            for side_, label in (("with", chosen), ("without", twin(chosen))):
                values = [r["test"]["ndcg@10"] for r in _runs(data, name, label)]
                point[side_] = _mean(values)
                point[f"{side_}_seeds"] = len(values)
            points.append(point)
        out[name] = points
    return out


def reference_lines(data: dict[str, Any], name: str) -> dict[str, float]:
    """The references of ``name``'s rows: test nDCG@10 of the untrained model, of the best built-in and of MNRL on the
    chosen mining (mean over their seeds; those run), one entry where two are the same row."""
    rows = {"untrained": "untrained", "best built-in": side_choice(data, builtin=True),
            "MNRL, chosen mining": f"mnrl@{mining_choice(data)}" if mining_choice(data) else None}
    lines: dict[str, float] = {}
    drawn: dict[str, str] = {}
    for title, label in rows.items():
        values = [r["test"]["ndcg@10"] for r in _runs(data, name, label)] if label else []
        if not values:
            continue
        if label in drawn:  # the best built-in is MNRL on the chosen mining: one line, both titles
            key = drawn[label]
            lines[key.replace(f" ({label})", f", {title} ({label})")] = lines.pop(key)
            drawn[label] = key.replace(f" ({label})", f", {title} ({label})")
            continue
        drawn[label] = f"{title} ({label})" if label != "untrained" else title
        lines[drawn[label]] = statistics.fmean(values)
    return lines


def figure_differences(data: dict[str, Any]) -> dict[str, dict[str, dict[str, dict[int, float]]]]:
    """The figure's paired differences of test nDCG@10, per dataset, each ``{row: {seed: difference}}``:
    ``"baseline"``, each loss's chosen configuration with the control and the best built-in minus MNRL on the chosen
    mining at the same seed (the baseline itself left out); ``"control"``, each chosen configuration minus the same
    configuration without the control at the seeds both ran. Empty before a loss has a chosen configuration."""
    from benchmarks.harness import paired_differences

    def scores(name: str, label: str | None) -> dict[int, float]:
        return {r["seed"]: r["test"]["ndcg@10"] for r in _runs(data, name, label)} if label else {}

    mining = mining_choice(data)
    baseline = f"mnrl@{mining}" if mining else None
    best = side_choice(data, builtin=True)
    out: dict[str, dict[str, dict[str, dict[int, float]]]] = {}
    for name in MAIN:
        chosen = [c for key in LOSSES if (c := loss_choice(data, key)) is not None]
        if not chosen:
            continue
        base = scores(name, baseline)
        rows = [*chosen, *([best] if best and best != baseline else [])]
        out[name] = {"baseline": {label: paired_differences(scores(name, label), base) for label in rows},
                     "control": {label: paired_differences(scores(name, label), scores(name, twin(label)))
                                 for label in chosen}}
    return out


#: what the figure's row labels name where a label's loss part is not today's registry name (the table's labels)
FIGURE_NOTE = ("Rows are the report's labels: mixcse = --loss mixcse_two_way (both directions), adcse_tied = --loss "
               "adcse with untied=False; +ctl = the false-negative control; @t0.01 = temperature 0.01.")


def plot(data: dict[str, Any], path: Path) -> bool:
    """``path``, from the JSON: per dataset (a row of panels), test nDCG@10 differences paired by seed (every seed a
    dot, the mean with its 95 % Student-t interval where there are two seeds or more) on axes that hold 0. Left: each
    loss's chosen configuration with the false-negative control, and the best built-in, minus MNRL on the chosen
    mining (the baseline, 0); right: each chosen configuration minus the same configuration without the control
    (0: no effect), at the seeds both ran. ``False`` (nothing written) before any loss has a chosen configuration."""
    from benchmarks.harness import CONFIDENCE, _include_origin, draw_differences
    from st_hardneg.plots import _figure

    differences = figure_differences(data)
    if not differences:
        return False
    mining = mining_choice(data)
    baseline = f"mnrl@{mining}" if mining else "MNRL"
    names = list(differences)
    rows = max(len(d["baseline"]) for d in differences.values())
    fig = _figure(figsize=(12, 1.2 + (0.42 * rows + 1.8) * len(names)))
    axes = fig.subplots(len(names), 2, squeeze=False)
    legend = ("each seed", f"mean, {CONFIDENCE:.0%} t interval")
    for (left, right), name in zip(axes, names, strict=True):
        for ax, key, zero, what in ((left, "baseline", f"0 = {baseline} at the same seed",
                                     f"{name}: minus {baseline} (paired by seed)"),
                                    (right, "control", "0 = no effect of the control",
                                     f"{name}: with the control minus without it (paired by seed)")):
            panel = differences[name][key]
            several = any(len(seeds) > 1 for seeds in panel.values())
            draw_differences(ax, panel, vertical=False,
                             labels=legend if several else ("each seed", "mean (one seed: no interval)"))
            ax.axvline(0.0, color="#c0392b", ls="--", lw=1, label=zero)
            _include_origin(ax, "x")
            ax.set_yticks(range(len(panel)), [f"{label}\n({len(seeds)} seed{'s' if len(seeds) != 1 else ''})"
                                              for label, seeds in panel.items()], fontsize=8)
            ax.set_ylim(len(panel) - 0.5, -0.5)
            ax.set_xlabel("difference of test nDCG@10 x 100 (axis holds 0)", fontsize=8)
            ax.set_title(what, fontsize=9)
            ax.grid(axis="x", color="#dddddd", lw=0.5)
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)
    fig.suptitle("Round 2: test nDCG@10 differences paired by seed; 0 is the baseline", fontsize=10)
    fig.text(0.01, 0.005, FIGURE_NOTE, fontsize=7, ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=100, metadata={"Software": None})
    return True




__all__ = ["DEFAULT_CACHE_DIR", "FIRST", "SPEC", "Options", "Prepared", "build_loss", "compare_rows", "evaluate",
           "load_model", "markdown", "mine", "mine_left", "negatives_key", "paired_section",
           "per_query_by_row", "per_query_runs", "plan", "plot", "prepare", "prepared", "run_one", "run_trial",
           "summary", "training_data", "trial_options", "write_results"]
