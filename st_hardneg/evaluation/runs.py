"""Retrieval runs scored as mteb scores them: ``pytrec_eval`` with graded relevance, TREC run files, per-query metrics.

A *run* is ``{query id: {document id: score}}`` (the top documents of each query), *qrels* are
``{query id: {document id: grade}}`` with non-negative integer grades (0 = judged not relevant). Every retrieval
metric of :mod:`st_hardneg.evaluation` comes from :func:`score_run`, which hands both to ``pytrec_eval`` (the
``trec_eval`` port that mteb's retrieval evaluator uses) with mteb's settings:

- nDCG@k is ``ndcg_cut.k`` with the grades as gains (a grade-2 document counts twice a grade-1 one); recall@k,
  MAP@k, precision@k and accuracy@k (``success.k``) count a document as relevant when its grade is > 0;
- MRR@k is ``recip_rank`` of the run cut to each query's top k, ranked as ``trec_eval`` ranks (score descending,
  ties by document id descending), which is how mteb computes its ``mrr_at_k``;
- the means are over the queries that have a relevant document, unrounded (mteb rounds its means to 5 decimals).

:func:`search` builds the run from embeddings (the model's own similarity function, top 1000 per query, as mteb's
``SearchEncoderWrapper``); :func:`write_trec_run` / :func:`read_trec_run` and :func:`write_per_query` /
:func:`read_per_query` store it and the per-query metrics beside a results file, which
:func:`st_hardneg.evaluation.compare.compare_runs` reads.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from torch import Tensor

__all__ = [
    "DEFAULT_K_VALUES",
    "PER_QUERY_METRICS",
    "RunFormatError",
    "check_qrels",
    "read_per_query",
    "read_trec_run",
    "score_run",
    "search",
    "write_per_query",
    "write_trec_run",
]

#: the cut-offs mteb's retrieval tasks evaluate (``AbsTaskRetrieval.k_values``); the run keeps the top 1000
DEFAULT_K_VALUES = (1, 3, 5, 10, 20, 100, 1000)
#: the per-query metrics written beside a results file (x 100), main score first
PER_QUERY_METRICS = ("ndcg@10", "mrr@10", "recall@10", "recall@100", "map@100")
#: the documents per query a TREC run file keeps
RUN_FILE_DEPTH = 100


class RunFormatError(ValueError):
    """A run, qrels or per-query file that cannot be scored; the message names the file and line."""


#: the largest grade pytrec_eval scores exactly (it holds grades in a C ``int``)
MAX_GRADE = 2**31 - 1


def check_qrels(qrels: Mapping[str, Mapping[str, Any]], name: str = "qrels") -> dict[str, dict[str, int]]:
    """``{query id: {document id: grade}}`` with every grade a non-negative integer (a bool, float or negative
    grade is refused: pytrec_eval would silently truncate or mis-gain it).

    Raises:
        ValueError: a grade that is not a non-negative integer, or a query with no judgement.
    """
    if not isinstance(qrels, Mapping):
        raise ValueError(f"{name} must be a mapping query id -> {{document id: grade}}, got {type(qrels).__name__}")
    out: dict[str, dict[str, int]] = {}
    for query, docs in qrels.items():
        if not isinstance(docs, Mapping):
            raise ValueError(f"{name}[{query!r}] must be a mapping document id -> grade, got {type(docs).__name__}")
        graded: dict[str, int] = {}
        for doc, grade in docs.items():
            if isinstance(grade, bool) or not isinstance(grade, int | np.integer) or grade < 0:
                raise ValueError(f"{name}[{query!r}][{doc!r}] must be a non-negative integer grade, got {grade!r}")
            if grade > MAX_GRADE:  # pytrec_eval holds grades in a C int: a larger one wraps (a perfect run scores 0)
                raise ValueError(f"{name}[{query!r}][{doc!r}] = {grade}: grades above {MAX_GRADE:,} cannot be scored "
                                 "exactly by pytrec_eval")
            graded[str(doc)] = int(grade)
        out[str(query)] = graded
    return out


def _metric_names(k_values: Sequence[int]) -> set[str]:
    cuts = ",".join(str(k) for k in k_values)
    return {f"ndcg_cut.{cuts}", f"map_cut.{cuts}", f"recall.{cuts}", f"P.{cuts}", f"success.{cuts}"}


def _ranked(docs: Mapping[str, float]) -> list[tuple[str, float]]:
    """trec_eval's order: score descending, then document id descending."""
    return sorted(docs.items(), key=lambda item: (item[1], item[0]), reverse=True)


def score_run(run: Mapping[str, Mapping[str, float]], qrels: Mapping[str, Mapping[str, int]],
              k_values: Sequence[int] = DEFAULT_K_VALUES) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Retrieval metrics x 100 of ``run`` against graded ``qrels`` by ``pytrec_eval`` (module docstring).

    Args:
        run: ``{query id: {document id: score}}``; every query of ``qrels`` with a relevant document must be in it.
        qrels: ``{query id: {document id: grade}}``, grades non-negative integers; queries without a grade > 0 are
            not scored (as in mteb).
        k_values: the cut-offs.

    Returns:
        ``(means, per_query)``: ``{"ndcg@k", "mrr@k", "recall@k", "map@k", "precision@k", "accuracy@k": mean x 100}``
        and ``{query id: {metric: value x 100}}`` for the scored queries.

    Raises:
        ValueError: a bad grade, no query with a relevant document, a scored query absent from ``run``, or a score
            that is not a finite number (NaN would be ranked as if it were one).

    Example:
        ::

            from st_hardneg.evaluation.runs import score_run

            means, per_query = score_run({"q1": {"d1": 0.9, "d2": 0.5}}, {"q1": {"d2": 2, "d3": 1}})
            means["ndcg@10"]
    """
    import pytrec_eval

    qrels = check_qrels(qrels)
    ks = sorted({int(k) for k in k_values})
    if not ks or ks[0] < 1:
        raise ValueError(f"k_values must be positive integers, got {list(k_values)!r}")
    scored = {q: docs for q, docs in qrels.items() if any(g > 0 for g in docs.values())}
    if not scored:
        raise ValueError("no query of the qrels has a relevant document (grade > 0)")
    missing = [q for q in scored if q not in run]
    if missing:
        raise ValueError(f"{len(missing)} judged query id(s) have no ranking in the run, e.g. {missing[0]!r}")
    run = {q: {str(d): _finite_score(q, d, s) for d, s in run[q].items()} for q in scored}
    per_query_raw = pytrec_eval.RelevanceEvaluator(scored, _metric_names(ks)).evaluate(run)
    ranked = {q: _ranked(docs) for q, docs in run.items()}
    rr_evaluator = pytrec_eval.RelevanceEvaluator(scored, {"recip_rank"})
    per_query: dict[str, dict[str, float]] = {q: {} for q in scored}
    for k in ks:
        cut = {q: dict(docs[:k]) for q, docs in ranked.items()}
        reciprocal = rr_evaluator.evaluate(cut)
        for q in scored:
            raw = per_query_raw.get(q, {})
            values = per_query[q]
            values[f"ndcg@{k}"] = 100.0 * raw.get(f"ndcg_cut_{k}", 0.0)
            values[f"mrr@{k}"] = 100.0 * reciprocal.get(q, {}).get("recip_rank", 0.0)
            values[f"recall@{k}"] = 100.0 * raw.get(f"recall_{k}", 0.0)
            values[f"map@{k}"] = 100.0 * raw.get(f"map_cut_{k}", 0.0)
            values[f"precision@{k}"] = 100.0 * raw.get(f"P_{k}", 0.0)
            values[f"accuracy@{k}"] = 100.0 * raw.get(f"success_{k}", 0.0)
    names = list(next(iter(per_query.values())))
    means = {name: float(np.mean([values[name] for values in per_query.values()])) for name in names}
    return means, per_query


def _finite_score(query: str, doc: Any, value: Any) -> float:
    try:
        score = float(value)
    except (TypeError, ValueError):
        score = math.nan
    if isinstance(value, bool) or not math.isfinite(score):
        raise ValueError(f"the run's score of ({query!r}, {doc!r}) is {value!r}, not a finite number: a run with "
                         "NaN or infinite scores cannot be ranked (check the embeddings for NaN)")
    return score


def search(query_embeddings: Tensor | np.ndarray, doc_embeddings: Tensor | np.ndarray, query_ids: Sequence[str],
           doc_ids: Sequence[str], *, top_k: int = max(DEFAULT_K_VALUES),
           similarity: Callable[[Any, Any], Tensor] | None = None,
           chunk_size: int = 1024) -> dict[str, dict[str, float]]:
    """The run of a full-corpus search: each query's ``top_k`` documents by ``similarity`` (default cosine), ranked
    and cut as mteb's ``SearchEncoderWrapper`` does (ties at the cut by document id).

    Args:
        query_embeddings, doc_embeddings: one row per id (float32 as the model returns them).
        query_ids, doc_ids: the ids of the rows.
        top_k: documents kept per query.
        similarity: ``model.similarity`` (what mteb calls); ``None`` = sentence-transformers' ``cos_sim``.
        chunk_size: queries scored at once.

    Raises:
        ValueError: row counts that differ from the id counts, 1-D embeddings, or widths that differ.
    """
    import heapq

    import torch
    from sentence_transformers.util import cos_sim

    from st_hardneg.validation import check_count

    check_count(top_k, "top_k", minimum=1)
    check_count(chunk_size, "chunk_size", minimum=1)
    queries = torch.as_tensor(np.asarray(query_embeddings) if not torch.is_tensor(query_embeddings)
                              else query_embeddings)
    docs = torch.as_tensor(np.asarray(doc_embeddings) if not torch.is_tensor(doc_embeddings) else doc_embeddings)
    for what, matrix, ids in (("query_embeddings", queries, query_ids), ("doc_embeddings", docs, doc_ids)):
        if matrix.ndim != 2:
            raise ValueError(f"{what} must be a 2-D matrix (one row per id), got shape {tuple(matrix.shape)}")
        if matrix.shape[0] != len(ids):
            raise ValueError(f"{what} has {matrix.shape[0]} rows for {len(ids)} ids")
    if queries.shape[1] != docs.shape[1]:
        raise ValueError(f"query_embeddings are {queries.shape[1]} wide but doc_embeddings {docs.shape[1]}")
    score = similarity or cos_sim
    depth = min(top_k + 1, len(doc_ids))
    run: dict[str, dict[str, float]] = {}
    for start in range(0, len(query_ids), chunk_size):
        scores = torch.as_tensor(score(queries[start:start + chunk_size], docs))
        values, indices = torch.topk(scores, depth, dim=1, largest=True)
        for row, qid in enumerate(query_ids[start:start + chunk_size]):
            heap: list[tuple[float, str]] = []
            for index, value in zip(indices[row].tolist(), values[row].tolist(), strict=True):
                item = (value, doc_ids[index])
                if len(heap) < top_k:
                    heapq.heappush(heap, item)
                else:
                    heapq.heappushpop(heap, item)
            run[qid] = {doc: value for value, doc in sorted(heap, reverse=True)}
    return run


# --------------------------------------------------------------------------- files
def write_trec_run(path: str | Path, run: Mapping[str, Mapping[str, float]], *, tag: str = "st-hardneg",
                   depth: int = RUN_FILE_DEPTH, inside: str | Path | None = None) -> Path:
    """Write ``run`` as a TREC run file (``qid Q0 docid rank score tag``, the top ``depth`` documents per query in
    trec_eval's order); returns the path. The file is written atomically inside the output folder ``inside``
    (default: its own folder), never through a symbolic link (:func:`st_hardneg.reporting.atomic_write`).

    Raises:
        ValueError: an id or the tag is empty or holds white space, or a score is not finite: the file could not be
            read back by :func:`read_trec_run` (nothing is written).
        OutsideOutputFolderError: ``path`` is a symbolic link out of ``inside``, or a dangling one.
    """
    path = Path(path)
    names = [("tag", tag), *(("query id", q) for q in run), *(("document id", d) for docs in run.values() for d in docs)]
    for label, name in names:
        if not str(name) or any(ch.isspace() for ch in str(name)):
            raise ValueError(f"write_trec_run: the {label} {name!r} is empty or holds white space, which a TREC run "
                             "separates fields by: the file could not be read back")
    lines = []
    for qid, docs in run.items():
        for rank, (doc, value) in enumerate(_ranked(docs)[:depth], start=1):
            if not math.isfinite(value):
                raise ValueError(f"write_trec_run: the score of ({qid!r}, {doc!r}) is {value!r}, not a finite number")
            lines.append(f"{qid} Q0 {doc} {rank} {value!r} {tag}\n")
    from st_hardneg.reporting import write_text

    return write_text(path, "".join(lines), inside)


def read_trec_run(path: str | Path) -> dict[str, dict[str, float]]:
    """A TREC run file as ``{query id: {document id: score}}``.

    Every score must be a finite number, every rank a non-negative integer, and within a query the ranks must follow
    the scores (a document ranked after another never scores higher): a file whose rank and score columns are
    swapped, or whose ranks contradict its scores, is refused rather than scored by its scores alone.

    Raises:
        FileNotFoundError: no file at ``path``.
        RunFormatError: a folder, a file that is not UTF-8 text, a line without 6 fields, a score that is not a
            finite number, a rank that is not an integer, ranks that do not follow the scores, or a (query, document)
            pair listed twice; the message names the file and line.
    """
    path = Path(path)
    _check_file(path, "run file")
    run: dict[str, dict[str, float]] = {}
    first: dict[tuple[str, str], int] = {}
    ranked: dict[str, list[tuple[int, float, int]]] = {}
    with _utf8_lines(path, "run file") as lines:
        for number, line in lines:
            if not line.strip():
                continue
            fields = line.split()
            if len(fields) != 6:
                raise RunFormatError(f"{path}, line {number}: expected 6 fields (qid Q0 docid rank score tag), got "
                                     f"{len(fields)}")
            qid, _, doc, raw_rank, raw, _ = fields
            try:
                value = float(raw)
            except ValueError:
                value = math.nan
            if not math.isfinite(value):
                raise RunFormatError(f"{path}, line {number}: the score must be a finite number, got {raw!r}")
            if not raw_rank.isdigit():
                raise RunFormatError(f"{path}, line {number}: the rank (4th field) must be a non-negative integer, "
                                     f"got {raw_rank!r} (are the rank and score columns swapped? the format is qid "
                                     "Q0 docid rank score tag)")
            if (qid, doc) in first:
                raise RunFormatError(f"{path}, line {number}: the pair ({qid!r}, {doc!r}) is listed twice (first on "
                                     f"line {first[qid, doc]})")
            first[qid, doc] = number
            run.setdefault(qid, {})[doc] = value
            ranked.setdefault(qid, []).append((int(raw_rank), value, number))
    if not run:
        raise RunFormatError(f"{path}: the run file is empty")
    for qid, entries in ranked.items():
        entries.sort(key=lambda entry: (entry[0], entry[2]))
        for (rank, score, _), (next_rank, next_score, number) in zip(entries, entries[1:], strict=False):
            if next_score > score:
                raise RunFormatError(f"{path}, line {number}: query {qid!r} ranks a document scored {next_score!r} "
                                     f"at rank {next_rank}, after one scored {score!r} at rank {rank}: the ranks must "
                                     "follow the scores (are the rank and score columns swapped?)")
    return run


def write_per_query(path: str | Path, per_query: Mapping[str, Mapping[str, Mapping[str, float]]],
                    metrics: Sequence[str] = PER_QUERY_METRICS, *, inside: str | Path | None = None) -> Path:
    """Write ``{task: {query id: {metric: value}}}`` as a tab-separated file with a header ``task query-id
    <metric>...`` (values x 100); returns the path. The file is written atomically inside the output folder
    ``inside`` (default: its own folder), never through a symbolic link (:func:`st_hardneg.reporting.atomic_write`).

    Raises:
        ValueError: a query lacks one of ``metrics`` (nothing is written).
        OutsideOutputFolderError: ``path`` is a symbolic link out of ``inside``, or a dangling one.
    """
    from st_hardneg.reporting import atomic_write

    path = Path(path)
    with atomic_write(path, inside, text=True) as handle:
        writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
        writer.writerow(["task", "query-id", *metrics])
        for task, queries in per_query.items():
            for qid, values in queries.items():
                missing = [m for m in metrics if m not in values]
                if missing:
                    raise ValueError(f"query {qid!r} of task {task!r} has no {missing[0]!r}; it has {sorted(values)}")
                writer.writerow([task, qid, *(repr(float(values[m])) for m in metrics)])
    return path


def read_per_query(path: str | Path) -> dict[str, dict[str, dict[str, float]]]:
    """A per-query file of :func:`write_per_query` as ``{task: {query id: {metric: value}}}``.

    Raises:
        FileNotFoundError: no file at ``path``.
        RunFormatError: a folder, a file that is not UTF-8 text, a missing header, a short line, a value that is not
            a finite number or a query listed twice for one task; the message names the file and line.
    """
    path = Path(path)
    _check_file(path, "per-query file")
    out: dict[str, dict[str, dict[str, float]]] = {}
    with _utf8_lines(path, "per-query file") as lines:
        rows = csv.reader((line for _, line in lines), delimiter="\t")
        header = next(rows, None)
        if not header or header[:2] != ["task", "query-id"] or len(header) < 3:
            raise RunFormatError(f"{path}, line 1: expected the header 'task<TAB>query-id<TAB><metric>...', got "
                                 f"{header!r}")
        metrics = header[2:]
        for number, row in enumerate(rows, start=2):
            if not row:
                continue
            if len(row) != len(header):
                raise RunFormatError(f"{path}, line {number}: expected {len(header)} fields, got {len(row)}")
            task, qid = row[0], row[1]
            try:
                values = {m: float(v) for m, v in zip(metrics, row[2:], strict=True)}
            except ValueError:
                values = {m: math.nan for m in metrics}
            if not all(math.isfinite(v) for v in values.values()):
                raise RunFormatError(f"{path}, line {number}: every metric must be a finite number, got {row[2:]}")
            if not all(0.0 <= v <= 100.0 for v in values.values()):  # the metrics are shares x 100
                raise RunFormatError(f"{path}, line {number}: every metric is a share x 100 in [0, 100], got "
                                     f"{row[2:]}")
            queries = out.setdefault(task, {})
            if qid in queries:
                raise RunFormatError(f"{path}, line {number}: query {qid!r} of task {task!r} is listed twice")
            queries[qid] = values
    if not out:
        raise RunFormatError(f"{path}: no query in the per-query file")
    return out


@contextmanager
def _utf8_lines(path: Path, what: str) -> Iterator[Iterator[tuple[int, str]]]:
    """The numbered lines of a UTF-8 text file; a byte that is not UTF-8 is one :class:`RunFormatError` naming the
    file and line, not a bare codec error."""
    with path.open(encoding="utf-8", newline="") as handle:
        numbered = enumerate(handle, start=1)
        state = {"line": 0}

        def lines() -> Iterator[tuple[int, str]]:
            while True:
                try:
                    number, line = next(numbered)
                except StopIteration:
                    return
                except UnicodeDecodeError as error:
                    where = f" after line {state['line']}" if state["line"] else ""
                    raise RunFormatError(f"{path}: the {what} is not UTF-8 text ({error.reason}{where}): save it as "
                                         "UTF-8") from None
                state["line"] = number
                yield number, line

        yield lines()


def _check_file(path: Path, what: str) -> None:
    if path.is_dir():
        raise RunFormatError(f"{path} is a folder, not a {what}")
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
