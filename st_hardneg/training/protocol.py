"""The retrieval protocol (MRPC and BEIR) shared by ``st-hardneg train --task retrieval`` / ``--task beir``,
the BEIR benchmark and the notebooks: mine one hard negative per (query, positive)
pair, train with the protocol's settings, score retrieval. (The chosen st-hardneg recipe on top of it, its loss and
options, is :mod:`st_hardneg.training.recipe`; this module was ``st_hardneg.training.retrieval``, which still
imports it.)

- :data:`MINING`: the mining settings (``mine_hard_negatives``, TopK-PercPos 95 %); :func:`check_mining` checks
  overrides of them.
- :data:`TRAINING`: the fine-tuning protocol (the model's own mean pooling, 128 tokens, 1 epoch at batch 64,
  lr 2e-5 with 10 % warm-up).
- :func:`mined_triplets`: the (anchor, positive, negative) training set of an :class:`MRPCRetrieval` split, mined once
  and cached as JSON (keyed by the model, the settings and the data files' bytes).
- :func:`mined_mrpc_triplets`: :func:`mined_triplets` of the MRPC test split under the one cache key that the command
  line and the benchmark share, mined by :func:`load_recipe_model`.
- :func:`read_training_file`: your own (anchor, positive[, negative ...]) rows from a JSON lines / JSON / CSV / TSV
  file, checked (``st-hardneg train --task retrieval --train-file``).
- :func:`train_config`: a :class:`~st_hardneg.training.loop.TrainConfig` with :data:`TRAINING`'s values.
- :func:`evaluate_recipe` and :func:`recipe_table`: the recipe's scores (retrieval on the MRPC test task, the 7-task
  STS average) and their markdown table.

>>> from st_hardneg.training.protocol import MINING, TRAINING, mined_triplets
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

    from st_hardneg.data.beir import BEIRData, BEIRRetrieval
    from st_hardneg.data.mrpc import MRPCRetrieval, RetrievalTask
    from st_hardneg.training.loop import TrainConfig

#: mine_hard_negatives settings: top-5 candidates below 95 % of the anchor-positive score (NV-Retriever's
#: TopK-PercPos), then the first that is not the anchor, the positive or a labelled paraphrase of the anchor
#: (``known_as_positives``: the labelled paraphrases leave the ranking first; see
#: :func:`~st_hardneg.data.mining.mine_training_negatives`)
MINING: dict[str, Any] = {"num_candidates": 5, "relative_margin": 0.05, "range_min": 0, "range_max": None,
                          "known_as_positives": False}
#: the fine-tuning protocol of the retrieval benchmark and ``st-hardneg train --task retrieval``
TRAINING: dict[str, Any] = {"pooling": "mean", "max_seq_length": 128, "batch_size": 64, "learning_rate": 2e-5,
                            "epochs": 1, "warmup_ratio": 0.1}
#: where mined training sets are cached
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "st_hardneg" / "retrieval"
#: the file types :func:`read_training_file` reads: suffix → (``datasets.Dataset`` reader, its keyword arguments)
TRAIN_FILE_FORMATS: dict[str, tuple[str, dict[str, Any]]] = {
    ".jsonl": ("from_json", {}), ".json": ("from_json", {}), ".csv": ("from_csv", {}), ".tsv": ("from_csv", {"sep": "\t"}),
}
#: column names that sentence-transformers reads as labels, not as texts
LABEL_COLUMNS = ("label", "labels", "score", "scores")

logger = logging.getLogger(__name__)


class TrainingSplit(Protocol):
    """What mining reads of a split (:class:`~st_hardneg.data.mrpc.MRPCRetrieval`,
    :class:`~st_hardneg.data.beir.BEIRRetrieval`)."""

    train_pairs: list[tuple[str, str]]
    train_corpus: list[str]
    known_paraphrases: dict[str, set[str]]

    def protected_sentences(self) -> set[str]: ...


def check_mining(mining: dict[str, Any] | None, option: str = "mining") -> dict[str, Any]:
    """:data:`MINING` with the settings of ``mining`` on top, each checked before any model is loaded or any set
    mined: ``num_candidates`` an integer >= 1, ``relative_margin`` ``None`` or in [0, 1), ``range_min`` an integer
    >= 0, ``range_max`` ``None`` or an integer that leaves ``num_candidates`` candidates after ``range_min``,
    ``known_as_positives`` a bool. ``option`` names the settings in the messages (``--mining-arg`` on the command
    line).

    Raises:
        ValueError: an unknown setting or a bad value, naming it.
    """
    from st_hardneg import validation

    unknown = sorted(set(mining or {}) - set(MINING))
    if unknown:
        raise ValueError(f"unknown mining setting(s) {unknown}; choose from {', '.join(MINING)}")
    settings = {**MINING, **(mining or {})}
    validation.check_count(settings["num_candidates"], f"{option} num_candidates")
    if settings["relative_margin"] is not None:
        validation.check_number(settings["relative_margin"], f"{option} relative_margin (None: no margin)",
                                minimum=0.0, maximum=1.0, maximum_open=True)
    validation.check_count(settings["range_min"], f"{option} range_min", minimum=0)
    if settings["range_max"] is not None:
        validation.check_count(settings["range_max"], f"{option} range_max (None: num_candidates + range_min + 10)")
        if settings["range_max"] - settings["range_min"] < settings["num_candidates"]:
            raise ValueError(f"{option}: range_max - range_min must leave at least num_candidates="
                             f"{settings['num_candidates']} candidates, got range_min={settings['range_min']}, "
                             f"range_max={settings['range_max']}")
    validation.check_bool(settings["known_as_positives"], f"{option} known_as_positives")
    return settings


def mined_triplets(
    data: TrainingSplit,
    load_model: Callable[[], Any],
    *,
    model_key: str,
    data_key: str,
    mining: dict[str, Any] | None = None,
    cache_dir: str | Path = DEFAULT_CACHE_DIR,
    prefix: str = "mrpc-mined",
    limit: int = 0,
    min_rows: int = 1,
    batch_size: int = 128,
    max_seq_length: int = TRAINING["max_seq_length"],
) -> tuple[Any, dict[str, Any]]:
    """One mined hard negative per training pair of ``data`` (see
    :func:`st_hardneg.data.mining.mine_training_negatives`), mined once and cached.

    Args:
        data: a split from :func:`~st_hardneg.data.mrpc.build_mrpc_retrieval` or
            :func:`~st_hardneg.data.mrpc.dev_split`: its ``train_pairs`` are mined against its ``train_corpus``,
            never against its task's sentences.
        load_model: returns the model that ranks the candidates (called only when the set is not cached yet).
        model_key: names that model's content in the cache key (:func:`st_hardneg.models.model_cache_key`: a digest
            of its files, never its path alone).
        data_key: identifies the data in the cache key (e.g. :func:`st_hardneg.data.mining.file_digest` of the files and
            the split's settings).
        mining: :data:`MINING`'s keys to override.
        cache_dir: the cache folder.
        prefix: the cache file's name prefix.
        limit: mine only the first ``limit`` pairs (0 = all; smoke runs).
        min_rows: fewer mined triplets than this (e.g. one batch) raise ``ValueError``.
        batch_size: encoding batch size of the mining.
        max_seq_length: the mining model's length (part of the cache key).

    Returns:
        ``(dataset, info)``: a ``datasets.Dataset`` with columns ``anchor``, ``positive``, ``negative``, and what a
        results file should record (cache file, pair and triplet counts, mining seconds, settings).

    Raises:
        ValueError: an unknown mining setting, a test-task sentence in the mined set, or fewer than ``min_rows``
            triplets.
    """
    from st_hardneg import validation
    from st_hardneg.data.mining import cached_dataset, mine_training_negatives

    validation.check_count(limit, "limit", minimum=0)
    validation.check_count(min_rows, "min_rows", minimum=1)
    settings = check_mining(mining)
    pairs = data.train_pairs[:limit] if limit else data.train_pairs
    key = {"model": model_key, "pooling": TRAINING["pooling"], "max_seq_length": max_seq_length,
           "mining": settings, "data": data_key, "limit": limit}
    dataset, path, seconds = cached_dataset(
        cache_dir, prefix, key,
        lambda: mine_training_negatives(load_model(), pairs, data.train_corpus, known_positives=data.known_paraphrases,
                                        forbidden=data.protected_sentences(), batch_size=batch_size, **settings))
    protected = data.protected_sentences()
    leaked = sorted({s for column in dataset.column_names for s in dataset[column] if s in protected})
    if leaked:
        raise ValueError(f"{len(leaked)} evaluated (test or dev) sentence(s) in the mined training set, e.g. "
                         f"{leaked[0]!r}; delete {path} and mine again")
    if len(dataset) < min_rows:
        raise ValueError(f"mining kept {len(dataset)} triplets from {len(pairs)} pairs, fewer than one batch "
                         f"({min_rows}); loosen the mining filters (relative_margin) or use more pairs. Cached in {path}.")
    info = {"cache_file": str(path), "pairs": len(pairs), "triplets": len(dataset), "mining_seconds": seconds,
            "mining": settings}
    return dataset, info


def train_config(output_dir: str | Path, seed: int = 0, **overrides: Any) -> TrainConfig:
    """The :class:`~st_hardneg.training.loop.TrainConfig` of the retrieval protocol (:data:`TRAINING`, final model kept, no
    checkpoints); ``overrides`` replace any of its fields."""
    from st_hardneg.training.loop import TrainConfig

    values: dict[str, Any] = {"output_dir": str(output_dir), "batch_size": TRAINING["batch_size"],
                              "learning_rate": TRAINING["learning_rate"], "epochs": TRAINING["epochs"],
                              "warmup_ratio": TRAINING["warmup_ratio"], "seed": seed, "eval_steps": 0,
                              "save_checkpoints": False}
    values.update(overrides)
    return TrainConfig(**values)


def load_recipe_model(model_name: str | None = None) -> SentenceTransformer:
    """The untrained model of the recipe: ``model_name`` (``None`` or ``"default"``: the embedded all-MiniLM-L6-v2;
    see :func:`st_hardneg.models.resolve_model`) with :data:`TRAINING`'s pooling and length. It mines the training set
    (the cache key of :func:`mined_triplets` names exactly these settings)."""
    from st_hardneg.models import resolve_model

    return resolve_model(model_name, pooling=TRAINING["pooling"], max_seq_length=TRAINING["max_seq_length"])


def mined_mrpc_triplets(
    data_dir: str | Path | None = None,
    model_name: str | None = None,
    *,
    data: MRPCRetrieval | None = None,
    mining: dict[str, Any] | None = None,
    cache_dir: str | Path = DEFAULT_CACHE_DIR,
    limit: int = 0,
    min_rows: int = 1,
) -> tuple[Any, dict[str, Any]]:
    """The mined training set of the MRPC test split: :func:`mined_triplets` under the cache key that
    ``st-hardneg train --task retrieval`` uses (model key ``model_name`` or ``"default"``, data key
    :func:`st_hardneg.data.mining.file_digest` of the two MRPC files, prefix ``"mrpc-mined"``), so every run with the
    same model and data reuses one cache file; mined by :func:`load_recipe_model` when it is not cached yet.

    Args:
        data_dir: the SentEval directory holding ``MRPC/``.
        model_name: the model to train (``None``: the embedded default).
        data: :func:`~st_hardneg.data.mrpc.build_mrpc_retrieval` of ``data_dir``, if already built.
        mining, cache_dir, limit, min_rows: see :func:`mined_triplets`.

    Returns:
        ``(dataset, info)`` as :func:`mined_triplets`, ``info["source"]`` naming the data.
    """
    from st_hardneg.data.mining import file_digest
    from st_hardneg.data.mrpc import build_mrpc_retrieval, mrpc_files
    from st_hardneg.models import model_cache_key

    data = data if data is not None else build_mrpc_retrieval(data_dir)
    data_key = file_digest(mrpc_files(data_dir).values())
    dataset, info = mined_triplets(data, lambda: load_recipe_model(model_name), model_key=model_cache_key(model_name),
                                   data_key=data_key, mining=mining, cache_dir=cache_dir, prefix="mrpc-mined",
                                   limit=limit, min_rows=min_rows)
    return dataset, {"source": "mined MRPC train pairs", **info}


def read_training_file(path: str | Path, *, min_rows: int = 1, limit: int = 0,
                       data: MRPCRetrieval | None = None) -> tuple[Any, dict[str, Any]]:
    """Your own training rows (e.g. triplets you mined) from a ``.jsonl`` / ``.json`` / ``.csv`` / ``.tsv`` file, read
    with ``datasets`` and checked.

    The columns are taken in file order as anchor, positive, then any number of negatives (e.g. ``anchor``,
    ``positive``, ``negative``), every one text; rows are used as they are (no mining, no filtering).

    Args:
        path: the file (CSV / TSV with a header line).
        min_rows: fewer rows than this (e.g. one batch) raise ``ValueError``.
        limit: use only the first ``limit`` rows (0 = all).
        data: an :class:`~st_hardneg.data.mrpc.MRPCRetrieval`: its test-task sentences found in the rows are
            counted (``info["test_task_overlap"]``) and logged as a warning, since they make its scores optimistic.

    Returns:
        ``(dataset, info)``: the ``datasets.Dataset`` and what a results file should record (file, rows, columns).

    Raises:
        ValueError: a missing or empty file, an unknown extension, a file the reader rejects, fewer than 2 columns, a
            label or non-text column, an empty value (the message names the 1-based row, header not counted and the
            column) or fewer than ``min_rows`` rows.
    """
    import datasets
    from datasets import Dataset

    from st_hardneg import validation

    validation.check_count(limit, "limit", minimum=0)
    validation.check_count(min_rows, "min_rows", minimum=1)
    path = Path(path).expanduser()
    where = f"training file {path}"
    if not path.is_file():
        raise ValueError(f"{where} does not exist")
    if path.suffix.lower() not in TRAIN_FILE_FORMATS:
        raise ValueError(f"{where}: unknown extension {path.suffix or '(none)'!r}; use one of "
                         f"{', '.join(TRAIN_FILE_FORMATS)}")
    with path.open("rb") as handle:
        if not handle.read(1 << 16).strip():
            raise ValueError(f"{where} is empty")
    reader, kwargs = TRAIN_FILE_FORMATS[path.suffix.lower()]
    bars = not datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()  # reading a local file: no "Generating train split" bars around our messages
    # nor datasets' own "Failed to load JSON from file ..." log line before the error below, which says the same
    verbosity = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    try:
        dataset = getattr(Dataset, reader)(str(path), **kwargs)
    except Exception as exc:  # datasets wraps the parsers' errors (pyarrow, pandas) in its own types
        cause = exc.__cause__ or exc
        message = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        raise ValueError(f"{where} cannot be read as {path.suffix.lower()[1:]}: {message}") from exc
    finally:
        datasets.logging.set_verbosity(verbosity)
        if bars:
            datasets.enable_progress_bars()
    columns = list(dataset.column_names)
    if len(columns) < 2:
        raise ValueError(f"{where} has {len(columns)} column(s) {columns}; need at least 2: anchor, positive"
                         "[, negative ...]")
    for column in columns:
        dtype = getattr(dataset.features[column], "dtype", type(dataset.features[column]).__name__)
        if column.lower() in LABEL_COLUMNS or dtype not in ("string", "large_string"):
            what = "is a label column" if column.lower() in LABEL_COLUMNS else f"holds {dtype} values"
            raise ValueError(f"{where}: column {column!r} {what}; every column must be text (anchor, positive"
                             "[, negative ...])")
    if limit:
        dataset = dataset.select(range(min(limit, len(dataset))))
    for column in columns:
        for number, text in enumerate(dataset[column], start=1):
            if text is None or not text.strip():
                raise ValueError(f"{where}: row {number}, column {column!r} is empty")
    if len(dataset) < min_rows:
        first = f" (the first {limit})" if limit else ""
        raise ValueError(f"{where} has {len(dataset)} row(s){first}, fewer than one batch ({min_rows}); add rows or "
                         "use a smaller batch size")
    info: dict[str, Any] = {"source": "file", "file": str(path), "rows": len(dataset), "columns": columns,
                            "limit": limit}
    if data is not None:
        protected = data.protected_sentences()
        overlap = {text for column in columns for text in dataset[column] if text in protected}
        info["test_task_overlap"] = len(overlap)
        if overlap:
            logger.warning("%s holds %d sentence(s) of the test task %s: its retrieval scores are optimistic", where,
                           len(overlap), data.task.name)
    return dataset, info


def evaluate_recipe(model: SentenceTransformer, data_dir: str | Path | None = None, *,
                    task: RetrievalTask | None = None, sts: bool = True, batch_size: int = 128,
                    show_progress_bar: bool = False) -> dict[str, Any]:
    """The recipe's scores of ``model``: :func:`~st_hardneg.evaluation.evaluate_retrieval` on ``task`` (default: the
    MRPC test task of ``data_dir``) and, with ``sts``, :func:`~st_hardneg.evaluation.evaluate_sts` (the 7 tasks).

    Returns:
        ``{"retrieval": {...}, "sts": {...} or None, "eval_seconds": {"retrieval": s, "sts": s}}``.
    """
    from st_hardneg.evaluation import evaluate_retrieval, evaluate_sts

    start = time.perf_counter()
    retrieval = evaluate_retrieval(model, data_dir, task=task, batch_size=batch_size,
                                   show_progress_bar=show_progress_bar)
    middle = time.perf_counter()
    scores = evaluate_sts(model, data_dir, batch_size=batch_size, show_progress_bar=show_progress_bar) if sts else None
    return {"retrieval": retrieval, "sts": scores,
            "eval_seconds": {"retrieval": round(middle - start, 1), "sts": round(time.perf_counter() - middle, 1)}}


def recipe_table(rows: dict[str, dict[str, Any]]) -> str:
    """A markdown table of :func:`evaluate_recipe` results, one row per ``{name: result}``: nDCG@10, MRR@10, R@1
    (x 100) and the STS average (``–`` without STS)."""
    from st_hardneg.reporting import markdown_table

    body = [[name, *(f"{result['retrieval'][m]:.2f}" for m in ("ndcg@10", "mrr@10", "recall@1")),
             f"{result['sts']['avg']:.2f}" if result.get("sts") else "–"] for name, result in rows.items()]
    return markdown_table(["model", "nDCG@10", "MRR@10", "R@1", "STS avg"], body).rstrip("\n")


# --------------------------------------------------------------------------- BEIR folders
#: the BEIR fine-tuning protocol (``st-hardneg train --task beir``): the
#: model's mean pooling, training at 128 tokens (queries are short; abstracts are cut to their first 128 tokens, which
#: halves a step's cost), evaluation and mining at 256 (MTEB's length for all-MiniLM-L6-v2), batch 32, lr 2e-5 with
#: 10 % warm-up, 1 epoch; the dev task is 20 % of the training queries (seed 0)
BEIR_TRAINING: dict[str, Any] = {**TRAINING, "batch_size": 32, "eval_max_seq_length": 256, "dev_fraction": 0.2,
                                 "dev_seed": 0}


def beir_split(path: str | Path, name: str | None = None, *, dev_fraction: float = BEIR_TRAINING["dev_fraction"],
               seed: int = BEIR_TRAINING["dev_seed"], eval_split: str = "test") -> tuple[BEIRData, BEIRRetrieval]:
    """A BEIR folder read (:func:`~st_hardneg.data.beir.load_beir`) and split into test task, dev task and training
    pairs (:func:`~st_hardneg.data.beir.beir_retrieval`) with the recipe's dev settings."""
    from st_hardneg.data.beir import beir_retrieval, load_beir

    data = load_beir(path, name=name)
    return data, beir_retrieval(data, eval_split=eval_split, dev_fraction=dev_fraction, seed=seed)


def mined_beir_triplets(
    data: BEIRData,
    split: BEIRRetrieval,
    model_name: str | None = None,
    *,
    mining: dict[str, Any] | None = None,
    cache_dir: str | Path = DEFAULT_CACHE_DIR,
    limit: int = 0,
    min_rows: int = 1,
) -> tuple[Any, dict[str, Any]]:
    """One hard negative per training pair of a BEIR split, mined from the whole corpus (:func:`mined_triplets` with
    :data:`MINING`) by the untrained ``model_name`` at :data:`BEIR_TRAINING`'s evaluation length, and cached on disk
    under the data's content hash and the exact training pairs.

    A query's relevant documents are never its negatives (``known_paraphrases`` holds every one of them, not just the
    pair's positive), nor are the dev and test queries ever mined or trained on.

    Returns:
        ``(dataset, info)`` as :func:`mined_triplets`, ``info["source"]`` naming the data.
    """
    import hashlib

    from st_hardneg.models import model_cache_key, resolve_model

    length = BEIR_TRAINING["eval_max_seq_length"]
    pairs_digest = hashlib.sha256("\n".join(f"{a}\t{p}" for a, p in split.train_pairs).encode()).hexdigest()[:12]
    dataset, info = mined_triplets(
        split, lambda: resolve_model(model_name, pooling=BEIR_TRAINING["pooling"], max_seq_length=length),
        model_key=model_cache_key(model_name), data_key=f"{data.digest()}-{pairs_digest}", mining=mining,
        cache_dir=cache_dir, prefix=f"beir-{data.name}-mined", limit=limit, min_rows=min_rows,
        batch_size=64, max_seq_length=length)
    return dataset, {"source": f"mined {data.name} training pairs (whole corpus, {len(data.corpus)} documents)",
                     **info}


def evaluate_beir_recipe(model: SentenceTransformer, split: BEIRRetrieval, *, dev: bool = True, test: bool = True,
                         batch_size: int = 64, show_progress_bar: bool = False,
                         cache_dir: str | Path | None = None,
                         max_seq_length: int | None = BEIR_TRAINING["eval_max_seq_length"],
                         files_dir: str | Path | None = None, tag: str = "st-hardneg") -> dict[str, Any]:
    """BEIR scores of ``model`` (:func:`~st_hardneg.evaluation.retrieval.retrieve`, as
    :func:`~st_hardneg.evaluation.retrieval.evaluate_beir` scores, at ``max_seq_length``, default
    :data:`BEIR_TRAINING`'s evaluation length; the command line passes the length the model is saved with):
    ``{"dev": {...}, "test": {...}, "eval_seconds": s}``, the dev and test tasks sharing one corpus encoding.

    With ``files_dir``, the test task's per-query file (``per_query.tsv``, what ``st-hardneg compare`` reads) and TREC
    run (``<task>.trec``, tagged ``tag``) are written there too, named under ``"files"``."""
    from st_hardneg.evaluation.retrieval import BEIR_METRICS, retrieve

    tasks = {"dev": split.dev_task if dev else None, "test": split.task if test else None}
    chosen = {role: task for role, task in tasks.items() if task is not None}
    if not chosen:
        raise ValueError("nothing to evaluate: dev=False and test=False (or the split has no dev task)")
    start = time.perf_counter()
    results = retrieve(model, list(chosen.values()), max_seq_length=max_seq_length, batch_size=batch_size,
                       show_progress_bar=show_progress_bar, cache_dir=cache_dir)
    out: dict[str, Any] = {}
    for role, task in chosen.items():
        scores = results[task.name].scores
        out[role] = {**{m: scores[m] for m in BEIR_METRICS}, "queries": scores["queries"], "corpus": scores["corpus"]}
    out["eval_seconds"] = round(time.perf_counter() - start, 1)
    if files_dir is not None and "test" in chosen:
        from st_hardneg.evaluation.runs import write_per_query, write_trec_run

        folder = Path(files_dir)
        test_task = chosen["test"].name  # both written inside files_dir, never through a link out of it
        per_query = write_per_query(folder / "per_query.tsv", {test_task: results[test_task].per_query}, inside=folder)
        run = write_trec_run(folder / f"{test_task}.trec", results[test_task].run, tag=tag, inside=folder)
        out["files"] = {"per_query": per_query.name, "runs": {test_task: run.name}}
    return out


def beir_table(rows: dict[str, dict[str, Any]], role: str = "test") -> str:
    """A markdown table of :func:`evaluate_beir_recipe` results, one row per ``{name: result}``: nDCG@10, MRR@10,
    R@100 (x 100) of the ``role`` task."""
    from st_hardneg.reporting import markdown_table

    body = [[name, *(f"{result[role][m]:.2f}" for m in ("ndcg@10", "mrr@10", "recall@100"))]
            for name, result in rows.items()]
    return markdown_table(["model", "nDCG@10", "MRR@10", "R@100"], body).rstrip("\n")

