"""Retrieval evaluation on the local retrieval tasks and BEIR folders, scored as mteb scores (``pytrec_eval``).

Every metric comes from :func:`st_hardneg.evaluation.runs.score_run` (graded relevance, ``pytrec_eval``, mteb's
MRR); :func:`retrieve` encodes as ``mteb.evaluate`` encodes a SentenceTransformer (``encode_query`` /
``encode_document`` with mteb's prompt resolution). :class:`LocalRetrievalEvaluator` (a Trainer ``evaluator``)
keeps sentence-transformers' search and scores its hits by the same function.

The tasks are built from the shared SentEval files by :mod:`st_hardneg.data.mrpc` (MRPC paraphrase retrieval;
see there for the exact definition). Each distinct text of a task is encoded once per role (query, document), at
the model's full length for MRPC and at 256 tokens for BEIR folders: the encoding that the task's mteb version
(``MRPC-retrieval-local`` or a BEIR folder's task in :func:`~st_hardneg.evaluation.run_mteb`) does, so the two
report the same metrics.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator
from sentence_transformers.util import cos_sim

from st_hardneg.evaluation.encoding import encode_unique
from st_hardneg.models import fitted_length
from st_hardneg.validation import check_relevant_docs

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer
    from torch import Tensor

    from st_hardneg.data.mrpc import RetrievalTask

#: the metrics :func:`evaluate_retrieval` returns (x 100), in the evaluator's naming without the score function
RETRIEVAL_METRICS = ("ndcg@10", "mrr@10", "recall@1", "recall@10", "accuracy@1", "map@100")


class LocalRetrievalEvaluator(InformationRetrievalEvaluator):
    """``InformationRetrievalEvaluator`` with cosine scoring, each distinct text encoded once at full length.

    Use it like the sentence-transformers evaluator (also as the Trainer's ``evaluator``); the metric keys are
    ``"{name}_cosine_ndcg@10"``, ``"{name}_cosine_mrr@10"``, ``"{name}_cosine_recall@1"`` …, fractions in [0, 1].
    Queries and corpus are embedded in one pass over the task's distinct texts (queries first, then documents) with
    the training ``max_seq_length`` lifted to the model's limit.
    """

    def __init__(self, queries: dict[str, str], corpus: dict[str, str], relevant_docs: dict[str, set[str]],
                 name: str = "", batch_size: int = 64, show_progress_bar: bool = False,
                 max_seq_length: int | None = None, **kwargs: Any) -> None:
        if not queries or not corpus:
            raise ValueError(f"a retrieval task needs queries and a corpus, got {len(queries)} / {len(corpus)}")
        relevant_docs = check_relevant_docs(relevant_docs)
        unknown = sorted({d for docs in relevant_docs.values() for d in docs} - set(corpus))
        if unknown:
            raise ValueError(f"{len(unknown)} relevant document id(s) are not in the corpus, e.g. {unknown[0]!r}")
        if not any(relevant_docs.get(q) for q in queries):
            raise ValueError("no query has a relevant document")
        kwargs.setdefault("mrr_at_k", [10])
        kwargs.setdefault("ndcg_at_k", [10])
        kwargs.setdefault("accuracy_at_k", [1, 3, 5, 10])
        kwargs.setdefault("precision_recall_at_k", [1, 3, 5, 10, 100])
        kwargs.setdefault("map_at_k", [100])
        kwargs.setdefault("write_csv", False)
        super().__init__(cast(dict[str, Any], queries), cast(dict[str, Any], corpus), relevant_docs, name=name,
                         batch_size=batch_size, show_progress_bar=show_progress_bar,
                         score_functions={"cosine": cos_sim}, main_score_function="cosine", **kwargs)
        self._texts = cast(list[str], [*self.queries, *self.corpus])
        self._table: dict[str, np.ndarray] | None = None
        if max_seq_length is not None:
            from st_hardneg import validation

            validation.check_count(max_seq_length, "max_seq_length", minimum=1)
        self.max_seq_length = max_seq_length

    # the signature of InformationRetrievalEvaluator.__call__, which narrows BaseEvaluator's model: BaseModel
    def __call__(  # type: ignore[override]
        self, model: SentenceTransformer, output_path: str | None = None, epoch: int = -1, steps: int = -1,
        *args: Any, **kwargs: Any,
    ) -> dict[str, float]:
        self._table = self.encode(model, self._texts)
        return self.score_table(model, self._table, output_path, epoch, steps, *args, **kwargs)

    def encode(self, model: SentenceTransformer, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """``{text: float32 embedding}`` of each distinct text, at ``self.max_seq_length`` tokens (``None``: the model's
        full length)."""
        return encode_at_length(model, texts, self.max_seq_length, batch_size=self.batch_size,
                                show_progress_bar=self.show_progress_bar)

    def score_table(self, model: SentenceTransformer, table: dict[str, np.ndarray], output_path: str | None = None,
                    epoch: int = -1, steps: int = -1, *args: Any, **kwargs: Any) -> dict[str, float]:
        """The evaluator's metrics from embeddings already computed (``table`` must hold every query and document
        text), e.g. one corpus encoding shared by a dev and a test task."""
        absent = [t for t in self._texts if t not in table]
        if absent:
            raise ValueError(f"{len(absent)} text(s) of the task have no embedding in the table, e.g. {absent[0]!r}")
        self._table = table
        try:
            return super().__call__(model, output_path, epoch, steps, *args, **kwargs)
        finally:
            self._table = None

    def compute_metrics(self, queries_result_list: list[object]) -> dict[str, dict[int, float]]:
        """The evaluator's metrics (fractions) by ``pytrec_eval``, as mteb computes them
        (:func:`~st_hardneg.evaluation.runs.score_run`), instead of sentence-transformers' own loops."""
        from st_hardneg.evaluation.runs import score_run

        run = {qid: {hit["corpus_id"]: float(hit["score"]) for hit in cast(list[dict[str, Any]], hits)}
               for qid, hits in zip(self.queries_ids, queries_result_list, strict=True)}
        qrels = {qid: {doc: 1 for doc in self.relevant_docs[qid]} for qid in self.queries_ids}
        ks = {*self.accuracy_at_k, *self.precision_recall_at_k, *self.mrr_at_k, *self.ndcg_at_k, *self.map_at_k}
        means, _ = score_run(run, qrels, k_values=sorted(ks))
        return {
            "accuracy@k": {k: means[f"accuracy@{k}"] / 100 for k in self.accuracy_at_k},
            "precision@k": {k: means[f"precision@{k}"] / 100 for k in self.precision_recall_at_k},
            "recall@k": {k: means[f"recall@{k}"] / 100 for k in self.precision_recall_at_k},
            "ndcg@k": {k: means[f"ndcg@{k}"] / 100 for k in self.ndcg_at_k},
            "mrr@k": {k: means[f"mrr@{k}"] / 100 for k in self.mrr_at_k},
            "map@k": {k: means[f"map@{k}"] / 100 for k in self.map_at_k},
        }

    # ST annotates the result np.ndarray, but its embed_inputs returns a Tensor (convert_to_tensor=True), as this does
    def embed_inputs(  # type: ignore[override]
        self, model: SentenceTransformer, sentences: Sequence[str], encode_fn_name: str | None = None,
        prompt_name: str | None = None, prompt: str | None = None, **kwargs: Any,
    ) -> Tensor:
        if self._table is None or prompt or prompt_name or self.truncate_dim is not None:
            return cast("Tensor", super().embed_inputs(model, sentences, encode_fn_name=encode_fn_name,
                                                       prompt_name=prompt_name, prompt=prompt, **kwargs))
        import torch

        return torch.from_numpy(np.stack([self._table[s] for s in sentences]))


@contextmanager
def at_length(model: SentenceTransformer, max_seq_length: int | None) -> Iterator[None]:
    """Encode at ``max_seq_length`` tokens for the duration of the block (``None``: leave it as it is), then
    restore the model's own value."""
    original = getattr(model, "max_seq_length", None)
    if max_seq_length is None or original is None:
        yield
        return
    model.max_seq_length = max_seq_length
    try:
        yield
    finally:
        model.max_seq_length = original


def encode_at_length(model: SentenceTransformer, texts: Sequence[str], max_seq_length: int | None, *,
                     batch_size: int = 64, show_progress_bar: bool = False, role: str | None = None,
                     prompt_name: str | None = None, desc: str | None = None) -> dict[str, np.ndarray]:
    """``{text: float32 embedding}`` of each distinct text at ``max_seq_length`` tokens (``None``: the model's full
    length, see :func:`~st_hardneg.evaluation.encoding.full_length`); ``role`` and ``prompt_name``: see
    :func:`~st_hardneg.evaluation.encoding.encode_unique`."""
    with at_length(model, max_seq_length):
        return encode_unique(model, texts, batch_size=batch_size, show_progress_bar=show_progress_bar,
                             whole=max_seq_length is None, role=role, prompt_name=prompt_name, desc=desc)


def retrieval_evaluator(task: RetrievalTask, batch_size: int = 64, show_progress_bar: bool = False,
                        **kwargs: Any) -> LocalRetrievalEvaluator:
    """A :class:`LocalRetrievalEvaluator` for a :class:`~st_hardneg.data.mrpc.RetrievalTask` (named after it)."""
    return LocalRetrievalEvaluator(task.queries, task.corpus, task.relevant_docs, name=task.name,
                                   batch_size=batch_size, show_progress_bar=show_progress_bar, **kwargs)


def mrpc_retrieval_evaluator(data_dir: str | Path | None = None, batch_size: int = 64, show_progress_bar: bool = False,
                             **kwargs: Any) -> LocalRetrievalEvaluator:
    """The sentence-transformers ``InformationRetrievalEvaluator`` of the MRPC paraphrase-retrieval test task.

    Args:
        data_dir: the SentEval directory (see :func:`st_hardneg.data.senteval.resolve_senteval_dir`).
        batch_size: encoding batch size.
        show_progress_bar: show the encoding progress bar.
        **kwargs: passed to ``InformationRetrievalEvaluator`` (e.g. ``mrr_at_k``).

    Example:
        ::

            from st_hardneg.evaluation import mrpc_retrieval_evaluator

            evaluator = mrpc_retrieval_evaluator("path/to/senteval")
            scores = evaluator(model)   # {"MRPC-paraphrase-retrieval_cosine_ndcg@10": ..., ...}
    """
    from st_hardneg.data.mrpc import build_mrpc_retrieval

    return retrieval_evaluator(build_mrpc_retrieval(data_dir).task, batch_size=batch_size,
                               show_progress_bar=show_progress_bar, **kwargs)


def evaluate_retrieval(model: SentenceTransformer, data_dir: str | Path | None = None,
                       task: RetrievalTask | None = None, batch_size: int = 64,
                       show_progress_bar: bool = False) -> dict[str, float]:
    """Retrieval metrics x 100 of ``model`` on a local retrieval task (default: MRPC paraphrase retrieval).

    Args:
        model: a SentenceTransformer.
        data_dir: the SentEval directory (used when ``task`` is None).
        task: a :class:`~st_hardneg.data.mrpc.RetrievalTask`; None builds the MRPC task from ``data_dir``.
        batch_size: encoding batch size.
        show_progress_bar: show the encoding progress bar.

    Returns:
        ``{"ndcg@10", "mrr@10", "recall@1", "recall@10", "accuracy@1", "map@100"}`` → value x 100 (cosine scoring,
        ``pytrec_eval`` as mteb, see :func:`retrieve`; queries encoded with ``encode_query``, documents with
        ``encode_document``, at the model's full length), plus ``"queries"`` and ``"corpus"`` (the task's sizes).
    """
    if task is None:
        from st_hardneg.data.mrpc import build_mrpc_retrieval

        task = build_mrpc_retrieval(data_dir).task
    retrieval_evaluator(task)  # the task's checks (ids in the corpus, a query with a relevant document)
    scored = retrieve(model, [task], max_seq_length=None, batch_size=batch_size,
                      show_progress_bar=show_progress_bar)[task.name]
    result = {metric: scored.scores[metric] for metric in RETRIEVAL_METRICS}
    result["queries"] = len(task.queries)
    result["corpus"] = len(task.corpus)
    return result


#: the metrics :func:`evaluate_beir` returns (x 100): BEIR's and MTEB's main score nDCG@10 first
BEIR_METRICS = ("ndcg@10", "mrr@10", "recall@10", "recall@100", "map@100")
#: the length MTEB evaluates all-MiniLM-L6-v2 at (its ``max_seq_length``); the BEIR protocol's encoding length
BEIR_MAX_SEQ_LENGTH = 256
#: the task type mteb resolves prompts with for a retrieval task
RETRIEVAL_TASK_TYPE = "Retrieval"


def prompt_names(model: SentenceTransformer, task_name: str | None = None, *, query_prompt_name: str | None = None,
                 document_prompt_name: str | None = None,
                 task_type: str = RETRIEVAL_TASK_TYPE) -> tuple[str | None, str | None]:
    """The prompt names (keys of ``model.prompts``) that queries and documents are encoded with.

    Given names are checked; otherwise each is resolved as mteb resolves a SentenceTransformer's prompts for a task
    (``mteb.models.abs_encoder.get_prompt_name``): ``"<task>-<query|document>"``, then ``"<task>"``, then
    ``"<type>-<query|document>"``, then ``"<type>"``, then ``"query"`` / ``"document"``; none of them defined →
    ``None`` (``encode_query`` / ``encode_document`` then use their own default prompt, as under mteb).

    Raises:
        ValueError: a given prompt name that the model does not define.
    """
    prompts = getattr(model, "prompts", None) or {}
    out: list[str | None] = []
    for role, given in (("query", query_prompt_name), ("document", document_prompt_name)):
        if given is not None:
            if given not in prompts:
                raise ValueError(f"{role}_prompt_name {given!r} is not a prompt of the model; its prompts are "
                                 f"{sorted(prompts) or 'none'}")
            out.append(given)
            continue
        candidates = [f"{task_name}-{role}", task_name] if task_name else []
        candidates += [f"{task_type}-{role}", task_type, role]
        out.append(next((c for c in candidates if c in prompts), None))
    return out[0], out[1]


def cached_embeddings(model: SentenceTransformer, texts: Sequence[str], *, max_seq_length: int | None,
                      batch_size: int = 64, show_progress_bar: bool = False,
                      cache_dir: str | Path | None = None, role: str | None = None,
                      prompt_name: str | None = None, desc: str | None = None) -> dict[str, np.ndarray]:
    """``{text: float32 embedding}`` of each distinct text, read from ``cache_dir`` when this model (a digest of its
    weights and module configs), length, prompt and text list were encoded before; written there (atomically)
    otherwise.

    Encoding a BEIR corpus takes minutes on a CPU: the untrained model's embeddings serve its evaluation, the GIST
    guide and reruns. ``cache_dir=None`` encodes without a cache. ``role``, ``prompt_name`` and ``desc`` (the progress
    bar's label): see :func:`~st_hardneg.evaluation.encoding.encode_unique`.
    """
    import hashlib
    import json

    unique = list(dict.fromkeys(texts))

    def encode() -> dict[str, np.ndarray]:
        return encode_at_length(model, unique, max_seq_length, batch_size=batch_size,
                                show_progress_bar=show_progress_bar, role=role, prompt_name=prompt_name, desc=desc)

    if cache_dir is None:
        return encode()
    from st_hardneg.models import weights_digest

    text_digest = hashlib.sha256("\n".join(unique).encode()).hexdigest()[:12]
    stem = f"emb-{weights_digest(model)}-{max_seq_length or 'full'}-{text_digest}"
    prompt = (getattr(model, "prompts", None) or {}).get(prompt_name) if prompt_name else None
    if prompt or role is not None:  # a prompted or role-routed encoding is another table
        stem += "-" + hashlib.sha256(f"{role}\t{prompt_name}\t{prompt}".encode()).hexdigest()[:8]
    path = Path(cache_dir).expanduser() / f"{stem}.npy"
    if path.is_file():
        try:
            matrix = np.load(path, allow_pickle=False)
            if matrix.shape[0] == len(unique):
                return dict(zip(unique, matrix, strict=True))
            raise ValueError(f"{matrix.shape[0]} rows for {len(unique)} texts")
        except (ValueError, OSError) as error:
            import logging

            logging.getLogger(__name__).warning("unreadable embedding cache %s (%s): encoding again", path, error)
    table = encode()
    from st_hardneg.reporting import atomic_write, write_text

    # through the output-folder guard: temporary files created exclusively in the cache folder, never via a link
    with atomic_write(path, path.parent) as handle:
        np.save(handle, np.stack([table[t] for t in unique]))
    write_text(path.with_suffix(".json"), json.dumps({"texts": len(unique), "max_seq_length": max_seq_length,
                                                      "role": role, "prompt_name": prompt_name}), path.parent)
    return table


@dataclass
class RetrievalResult:
    """One task's retrieval: the run, its per-query metrics and their means (all x 100).

    Attributes:
        task: the task's name.
        scores: ``{metric: mean x 100}`` (:func:`~st_hardneg.evaluation.runs.score_run`'s names: ``ndcg@10``,
            ``mrr@10``, ``recall@100`` …) plus ``"queries"`` and ``"corpus"`` (the task's sizes).
        per_query: ``{query id: {metric: value x 100}}``.
        run: ``{query id: {document id: similarity}}``, the top 1000 documents of each query.
        prompts: the prompt names queries and documents were encoded with (``None``: none).
    """

    task: str
    scores: dict[str, float]
    per_query: dict[str, dict[str, float]]
    run: dict[str, dict[str, float]]
    prompts: dict[str, str | None] = field(default_factory=dict)


def task_qrels(task: RetrievalTask) -> dict[str, dict[str, int]]:
    """The task's graded judgements: its ``qrels`` (a :class:`~st_hardneg.data.beir.GradedRetrievalTask`), else grade 1
    for every relevant document."""
    graded = getattr(task, "qrels", None)
    if graded:
        return {q: dict(graded[q]) for q in task.queries if q in graded}
    return {q: {d: 1 for d in task.relevant_docs.get(q, ())} for q in task.queries}


def retrieve(model: SentenceTransformer, tasks: Sequence[RetrievalTask], *,
             max_seq_length: int | None = BEIR_MAX_SEQ_LENGTH, batch_size: int = 64, show_progress_bar: bool = False,
             cache_dir: str | Path | None = None, query_prompt_name: str | None = None,
             document_prompt_name: str | None = None) -> dict[str, RetrievalResult]:
    """Runs and graded metrics of ``model`` on retrieval tasks, exactly as ``mteb.evaluate`` computes them for a
    SentenceTransformer: queries encoded with ``encode_query``, documents with ``encode_document`` (prompts resolved
    by :func:`prompt_names`), the model's ``similarity`` (cosine by default), top 1000 per query, metrics by
    ``pytrec_eval`` with the judgements' grades (:func:`~st_hardneg.evaluation.runs.score_run`).

    Each distinct text is encoded once per role for all the tasks (a dev and a test task share the corpus, the slow
    part), at ``max_seq_length`` tokens (``None``: the model's full length).

    Args:
        model: a SentenceTransformer.
        tasks: :class:`~st_hardneg.data.mrpc.RetrievalTask` s (graded ones from :mod:`st_hardneg.data.beir`).
        max_seq_length: the encoding length.
        batch_size: encoding batch size.
        show_progress_bar: show the encoding progress bars.
        cache_dir: where embeddings are cached per model (see :func:`cached_embeddings`); ``None`` = no cache.
        query_prompt_name, document_prompt_name: prompts of ``model.prompts`` (default: mteb's resolution).

    Returns:
        ``{task name: RetrievalResult}``.

    Raises:
        ValueError: no task, two tasks with one name, a ``max_seq_length`` that is not a positive integer (or
            ``None``), a prompt name the model does not define, or bad judgements.
    """
    from st_hardneg.evaluation.runs import score_run, search
    from st_hardneg.validation import check_count

    if max_seq_length is not None:  # 0 or a negative length would encode nothing and still score
        check_count(max_seq_length, "max_seq_length", minimum=1)
        max_seq_length = fitted_length(model, max_seq_length)  # an encoder with fewer positions: its limit
    if not tasks:
        raise ValueError("at least one retrieval task is needed")
    names = [task.name for task in tasks]
    if len(set(names)) != len(names):
        raise ValueError(f"task names must be distinct (they prefix the metrics), got {names}")
    qrels = {task.name: task_qrels(task) for task in tasks}
    resolved = {task.name: prompt_names(model, task.name, query_prompt_name=query_prompt_name,
                                        document_prompt_name=document_prompt_name) for task in tasks}
    tables: dict[tuple[str, str | None], dict[str, np.ndarray]] = {}
    for role, index, texts_of in (("query", 0, lambda t: t.queries.values()),
                                  ("document", 1, lambda t: t.corpus.values())):
        for prompt in dict.fromkeys(resolved[t.name][index] for t in tasks):
            texts = [x for t in tasks if resolved[t.name][index] == prompt for x in texts_of(t)]
            label = f"{', '.join(dict.fromkeys(t.name for t in tasks))}: encoding {len(set(texts)):,} {role}s"
            tables[role, prompt] = cached_embeddings(model, texts, max_seq_length=max_seq_length,
                                                     batch_size=batch_size, show_progress_bar=show_progress_bar,
                                                     cache_dir=cache_dir, role=role, prompt_name=prompt, desc=label)
    similarity = getattr(model, "similarity", None)
    out: dict[str, RetrievalResult] = {}
    for task in tasks:
        query_prompt, doc_prompt = resolved[task.name]
        judged = [q for q in task.queries if any(g > 0 for g in qrels[task.name].get(q, {}).values())]
        if not judged:
            raise ValueError(f"no query of {task.name} has a relevant document")
        doc_ids = list(task.corpus)
        query_table, doc_table = tables["query", query_prompt], tables["document", doc_prompt]
        run = search(np.stack([query_table[task.queries[q]] for q in judged]),
                     np.stack([doc_table[task.corpus[d]] for d in doc_ids]), judged, doc_ids,
                     similarity=similarity if callable(similarity) else None)
        means, per_query = score_run(run, {q: qrels[task.name][q] for q in judged})
        scores = dict(means)
        scores["queries"] = len(judged)
        scores["corpus"] = len(doc_ids)
        out[task.name] = RetrievalResult(task=task.name, scores=scores, per_query=per_query, run=run,
                                         prompts={"query": query_prompt, "document": doc_prompt})
    return out


def evaluate_beir(model: SentenceTransformer, tasks: Sequence[RetrievalTask], *,
                  max_seq_length: int | None = BEIR_MAX_SEQ_LENGTH, batch_size: int = 64,
                  show_progress_bar: bool = False, cache_dir: str | Path | None = None,
                  query_prompt_name: str | None = None,
                  document_prompt_name: str | None = None) -> dict[str, dict[str, float]]:
    """Retrieval metrics x 100 of ``model`` on BEIR tasks (e.g. a split's dev and test tasks), as ``mteb.evaluate``
    computes them (:func:`retrieve`: ``encode_query`` / ``encode_document`` with mteb's prompts, top 1000, graded
    nDCG by ``pytrec_eval``), each distinct text encoded once for all of them.

    Documents are the texts mteb encodes (``"title text"``), at ``max_seq_length`` tokens (default 256, MTEB's length
    for all-MiniLM-L6-v2), so the test score compares to the model's published MTEB score.

    Args:
        model: a SentenceTransformer.
        tasks: :class:`~st_hardneg.data.mrpc.RetrievalTask` s, e.g. ``BEIRData.task("test")`` or a
            :class:`~st_hardneg.data.beir.BEIRRetrieval` 's ``task`` and ``dev_task`` (graded: their ``qrels``).
        max_seq_length: the encoding length; ``None`` = the model's full length.
        batch_size: encoding batch size.
        show_progress_bar: show the encoding progress bar.
        cache_dir: where embeddings are cached per model (see :func:`cached_embeddings`); ``None`` = no cache.
        query_prompt_name, document_prompt_name: prompts of ``model.prompts`` (default: mteb's resolution, see
            :func:`prompt_names`).

    Returns:
        ``{task name: {metric: value x 100 for metric in BEIR_METRICS} | {"queries", "corpus"}}``.

    Example:
        ::

            from st_hardneg.data.beir import beir_retrieval
            from st_hardneg.evaluation.retrieval import evaluate_beir

            split = beir_retrieval("path/to/scifact")
            scores = evaluate_beir(model, [split.dev_task, split.task])
            scores["scifact-test"]["ndcg@10"]
    """
    if not tasks:
        raise ValueError("evaluate_beir needs at least one task")
    results = retrieve(model, tasks, max_seq_length=max_seq_length, batch_size=batch_size,
                       show_progress_bar=show_progress_bar, cache_dir=cache_dir,
                       query_prompt_name=query_prompt_name, document_prompt_name=document_prompt_name)
    return {name: {**{m: result.scores[m] for m in BEIR_METRICS}, "queries": result.scores["queries"],
                   "corpus": result.scores["corpus"]} for name, result in results.items()}


def per_query_ndcg(model: SentenceTransformer, task: RetrievalTask, k: int = 10, *,
                   max_seq_length: int | None = BEIR_MAX_SEQ_LENGTH, batch_size: int = 64,
                   show_progress_bar: bool = False, cache_dir: str | Path | None = None) -> dict[str, float]:
    """nDCG@k x 100 of each query of ``task`` (graded, ``pytrec_eval``; their mean is :func:`evaluate_beir`'s
    ``ndcg@10`` for ``k=10``): what a per-query gain histogram compares before and after training.

    Returns:
        ``{query id: nDCG@k x 100}`` in the task's query order (queries with a relevant document).
    """
    from st_hardneg import validation
    from st_hardneg.evaluation.runs import score_run

    validation.check_count(k, "k", minimum=1)
    result = retrieve(model, [task], max_seq_length=max_seq_length, batch_size=batch_size,
                      show_progress_bar=show_progress_bar, cache_dir=cache_dir)[task.name]
    if k in (1, 3, 5, 10, 20, 100, 1000):
        return {q: values[f"ndcg@{k}"] for q, values in result.per_query.items()}
    _, per_query = score_run(result.run, task_qrels(task), k_values=(k,))
    return {q: values[f"ndcg@{k}"] for q, values in per_query.items()}
