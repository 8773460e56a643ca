"""Any BEIR-format folder as a retrieval task: read, validated, split, and turned into training pairs.

The BEIR layout (Thakur et al., 2021), which ``beir``'s ``GenericDataLoader`` and mteb also read::

    corpus.jsonl        {"_id": ..., "title": ..., "text": ...} one document a line
    queries.jsonl       {"_id": ..., "text": ...} one query a line (the queries of every split)
    qrels/<split>.tsv   query-id <TAB> corpus-id <TAB> score, one judgement a line (a header line is optional)

A document's text is its title and text joined by a space (``"title text"``, stripped), exactly the string mteb
encodes for a retrieval corpus, so :mod:`st_hardneg.evaluation`'s scores and mteb's are computed on the same inputs.
A judgement with score > 0 makes a document relevant (BEIR's and mteb's rule); the scores are kept as graded
relevance (``GradedRetrievalTask.qrels``), which nDCG uses as gains, as mteb does. Scores must be non-negative integers.

:func:`beir_retrieval` splits a folder into what a benchmark needs:

- the **test task** (``eval_split``'s queries against the whole corpus), never read for training;
- a **dev task** carved from the training split's queries: a seeded hash order of the query ids picks
  ``dev_fraction`` of them (deterministic, independent of file order); their judgements become the dev task and they
  never appear in training;
- the **training pairs**: one (query, relevant document) pair per remaining training judgement. A training query whose
  text equals a dev or test query's (SciFact has two) is dropped, so no evaluated query is ever trained on;
- the **mining corpus**: every document. The corpus is shared by all splits, as in BEIR, so documents relevant to a test
  query can be mined as a training query's negative; no test judgement is used, and a training query's own relevant
  documents (``known_paraphrases``) are never its negatives.

>>> from st_hardneg.data.beir import load_beir, beir_retrieval
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from st_hardneg.data.mrpc import RetrievalTask
from st_hardneg.data.senteval import DataNotFoundError

__all__ = ["BEIRData", "BEIRFormatError", "BEIRRetrieval", "GradedRetrievalTask", "beir_retrieval", "load_beir"]

logger = logging.getLogger(__name__)

#: the files every BEIR folder has (plus at least one ``qrels/<split>.tsv``)
BEIR_FILES = ("corpus.jsonl", "queries.jsonl")
#: the header BEIR writes on its qrels files (skipped when present)
QRELS_HEADER = ("query-id", "corpus-id", "score")


class BEIRFormatError(ValueError):
    """A BEIR file that does not follow the layout; the message names the file and line."""


@dataclass
class GradedRetrievalTask(RetrievalTask):
    """A :class:`~st_hardneg.data.mrpc.RetrievalTask` that keeps the judgements' grades.

    Attributes:
        qrels: query id → document id → grade (non-negative integer) of the task's queries, as in the qrels file;
            :func:`st_hardneg.evaluation.retrieval.evaluate_beir` scores nDCG with these gains (mteb's rule).
            ``relevant_docs`` holds the ids whose grade is > 0.
    """

    qrels: dict[str, dict[str, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class BEIRData:
    """A BEIR folder as read by :func:`load_beir`.

    Attributes:
        name: the data set's name (default: the folder's name).
        root: the folder.
        corpus: document id → its text as encoded (``"title text"``, stripped).
        titles: document id → title (``""`` when it has none).
        texts: document id → text (without the title).
        queries: query id → text (every split's queries).
        qrels: split → query id → document id → score, as in the files (scores ≤ 0 included).
    """

    name: str
    root: Path
    corpus: dict[str, str]
    titles: dict[str, str]
    texts: dict[str, str]
    queries: dict[str, str]
    qrels: dict[str, dict[str, dict[str, int]]]

    @property
    def splits(self) -> tuple[str, ...]:
        """The splits with a qrels file, sorted."""
        return tuple(sorted(self.qrels))

    def relevant(self, split: str) -> dict[str, set[str]]:
        """Query id → ids of its relevant documents (score > 0) in ``split``; queries without one are left out.

        Raises:
            ValueError: an unknown split, or a split with no relevant judgement.
        """
        if split not in self.qrels:
            raise ValueError(f"{self.name} has no split {split!r}; its qrels files are: {', '.join(self.splits)}")
        relevant = {q: {d for d, s in docs.items() if s > 0} for q, docs in self.qrels[split].items()}
        relevant = {q: docs for q, docs in relevant.items() if docs}
        if not relevant:
            raise ValueError(f"split {split!r} of {self.name} has no relevant judgement (score > 0) in "
                             f"{self.root / 'qrels' / (split + '.tsv')}")
        return relevant

    def task(self, split: str, name: str | None = None) -> RetrievalTask:
        """``split``'s queries (those with a relevant document) against the whole corpus, as a
        :class:`~st_hardneg.data.mrpc.RetrievalTask` (named ``"<name>-<split>"`` by default)."""
        relevant = self.relevant(split)
        return GradedRetrievalTask(name=name or f"{self.name}-{split}",
                                   queries={q: self.queries[q] for q in relevant}, corpus=dict(self.corpus),
                                   relevant_docs=relevant, qrels={q: dict(self.qrels[split][q]) for q in relevant})

    def files(self) -> list[Path]:
        """The files read: corpus, queries, then the qrels of each split."""
        return [self.root / f for f in BEIR_FILES] + [self.root / "qrels" / f"{s}.tsv" for s in self.splits]

    def digest(self) -> str:
        """SHA-256 (12 hex digits) of :meth:`files`' bytes: a cache key that follows the data."""
        from st_hardneg.data.mining import file_digest

        return file_digest(self.files())


@dataclass
class BEIRRetrieval:
    """An evaluation task and the training data that may be used with it (see :func:`beir_retrieval`).

    It has the fields of :class:`~st_hardneg.data.mrpc.MRPCRetrieval` that mining and training read, so
    :func:`st_hardneg.training.protocol.mined_triplets` mines it the same way.

    Attributes:
        task: the test task (``eval_split``'s queries against the whole corpus).
        dev_task: the dev task carved from the training queries (``None`` with ``dev_fraction=0``).
        train_pairs: (query text, relevant document text), one per training judgement, dev queries excluded.
        train_corpus: every distinct document text, the mining candidates.
        known_paraphrases: training query text → the texts of all its relevant documents (never its negatives).
        stats: counts (queries per split, pairs kept and dropped, corpus size).
    """

    task: RetrievalTask
    dev_task: RetrievalTask | None
    train_pairs: list[tuple[str, str]]
    train_corpus: list[str]
    known_paraphrases: dict[str, set[str]]
    stats: dict[str, int] = field(default_factory=dict)

    def protected_sentences(self) -> set[str]:
        """The texts that must never be training data: the test and dev queries (documents are shared)."""
        texts = set(self.task.queries.values())
        if self.dev_task is not None:
            texts.update(self.dev_task.queries.values())
        return texts

    def dev(self) -> BEIRRetrieval:
        """The same split with the dev task as :attr:`task` (what option selection evaluates)."""
        if self.dev_task is None:
            raise ValueError("this split has no dev task (dev_fraction=0)")
        return BEIRRetrieval(task=self.dev_task, dev_task=self.task, train_pairs=self.train_pairs,
                             train_corpus=self.train_corpus, known_paraphrases=self.known_paraphrases,
                             stats=dict(self.stats))

    def train_dataset(self) -> Any:
        """The training pairs as a ``datasets.Dataset`` with columns ``anchor``, ``positive``."""
        from datasets import Dataset

        return Dataset.from_dict({"anchor": [a for a, _ in self.train_pairs],
                                  "positive": [p for _, p in self.train_pairs]})


def _where(path: Path, line: int) -> str:
    return f"{path}, line {line}"


def _check_text_file(path: Path) -> None:
    """A gzip file is named as one (BEIR's downloads are ``.gz``); read with :func:`_decoded`."""
    with path.open("rb") as handle:
        if handle.read(2) == b"\x1f\x8b":
            raise BEIRFormatError(f"{path} is gzip-compressed: decompress it first (gunzip {path.name})")


class _decoded:
    """Within the block, a file that is not UTF-8 text is a :class:`BEIRFormatError` naming it (a UTF-16 export, a
    Latin-1 file)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        _check_text_file(self.path)

    def __exit__(self, kind: Any, error: Any, trace: Any) -> None:
        if isinstance(error, UnicodeDecodeError):
            utf16 = error.object[:2] in (b"\xff\xfe", b"\xfe\xff") if isinstance(error.object, bytes) else False
            hint = "it is UTF-16: save it as UTF-8" if utf16 else "save it as UTF-8"
            raise BEIRFormatError(f"{self.path} is not UTF-8 text (byte {error.start}: {error.reason}); {hint}") \
                from None


def _read_jsonl(path: Path, what: str, *, title: bool) -> tuple[dict[str, str], dict[str, str]]:
    """id → text (and id → title) of a BEIR ``.jsonl`` file, checked line by line (a BOM at its start is dropped; ids
    are stripped of surrounding white space, as in the qrels)."""
    texts: dict[str, str] = {}
    titles: dict[str, str] = {}
    first_line: dict[str, int] = {}
    with _decoded(path), path.open(encoding="utf-8-sig") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise BEIRFormatError(f"{_where(path, number)}: not a JSON object ({error.msg})") from None
            if not isinstance(row, dict):
                raise BEIRFormatError(f"{_where(path, number)}: expected a JSON object, got {type(row).__name__}")
            if "_id" not in row or "text" not in row:
                missing = [k for k in ("_id", "text") if k not in row]
                raise BEIRFormatError(f"{_where(path, number)}: a {what} needs the key(s) {missing}")
            raw_id = row["_id"]
            if isinstance(raw_id, bool) or not isinstance(raw_id, str | int) or str(raw_id) == "":
                raise BEIRFormatError(f"{_where(path, number)}: _id must be a non-empty string, got {raw_id!r}")
            key = str(raw_id).strip()
            if not key:
                raise BEIRFormatError(f"{_where(path, number)}: _id must be a non-empty string, got {raw_id!r}")
            text = row["text"]
            head = row.get("title", "") if title else ""
            head = "" if head is None else head
            if not isinstance(text, str) or not isinstance(head, str):
                raise BEIRFormatError(f"{_where(path, number)}: title and text must be strings")
            if key in first_line:
                raise BEIRFormatError(f"{_where(path, number)}: duplicate {what} id {key!r} (first on line "
                                      f"{first_line[key]})")
            first_line[key] = number
            texts[key] = text
            titles[key] = head
    if not texts:
        raise BEIRFormatError(f"{path}: no {what} in the file")
    return texts, titles


def _read_qrels(path: Path, corpus: dict[str, str], queries: dict[str, str]) -> dict[str, dict[str, int]]:
    """query id → document id → score of a qrels file; every id must exist, each pair once."""
    qrels: dict[str, dict[str, int]] = {}
    with _decoded(path), path.open(encoding="utf-8-sig", newline="") as handle:
        for number, row in enumerate(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE), start=1):
            if not row or not "".join(row).strip():
                continue
            if number == 1 and tuple(c.strip() for c in row) == QRELS_HEADER:
                continue
            if len(row) != 3:
                raise BEIRFormatError(f"{_where(path, number)}: expected 3 tab-separated fields (query-id, "
                                      f"corpus-id, score), got {len(row)}")
            query, doc, raw = (c.strip() for c in row)
            try:
                if not raw.isascii() or not raw.lstrip("-").isdigit():  # int() would read "1_0" as 10, " 1" as 1
                    raise ValueError(raw)
                score = int(raw)
            except ValueError:
                raise BEIRFormatError(f"{_where(path, number)}: the score must be an integer, got {raw!r} (a grade: "
                                      "0 = not relevant, 1, 2 … = relevant)") from None
            if score < 0:
                raise BEIRFormatError(f"{_where(path, number)}: the score must be a non-negative integer grade, got "
                                      f"{raw!r}")
            if score > 2**31 - 1:
                raise BEIRFormatError(f"{_where(path, number)}: the grade {raw} is above 2,147,483,647, which "
                                      "pytrec_eval cannot score exactly")
            if query not in queries:
                raise BEIRFormatError(f"{_where(path, number)}: query id {query!r} is not in queries.jsonl")
            if doc not in corpus:
                raise BEIRFormatError(f"{_where(path, number)}: corpus id {doc!r} is not in corpus.jsonl")
            judged = qrels.setdefault(query, {})
            if doc in judged:
                raise BEIRFormatError(f"{_where(path, number)}: the pair ({query!r}, {doc!r}) is judged twice")
            judged[doc] = score
    if not qrels:
        raise BEIRFormatError(f"{path}: no judgement in the file (an empty split)")
    return qrels


def load_beir(path: str | Path, name: str | None = None) -> BEIRData:
    """Read and validate a BEIR folder.

    Args:
        path: the folder holding ``corpus.jsonl``, ``queries.jsonl`` and ``qrels/<split>.tsv``.
        name: the data set's name (default: the folder's name).

    Returns:
        A :class:`BEIRData`.

    Raises:
        DataNotFoundError: the folder, a required file or every qrels file is missing.
        BEIRFormatError: a malformed line, a duplicate id, an empty query, a qrels id absent from the corpus or the
            queries, a pair judged twice, or an empty file; the message names the file and line.

    Example:
        ::

            from st_hardneg.data.beir import load_beir

            scifact = load_beir("path/to/scifact")
            test = scifact.task("test")   # 300 queries, 5,183 documents
    """
    root = Path(path).expanduser()
    if root.is_file():
        raise DataNotFoundError(f"{root} is a file, not a BEIR folder (expected a folder holding corpus.jsonl, "
                                "queries.jsonl, qrels/*.tsv)")
    if not root.is_dir():
        raise DataNotFoundError(f"no BEIR folder at {root} (expected corpus.jsonl, queries.jsonl, qrels/*.tsv)")
    folders = [str(root / f) for f in BEIR_FILES if (root / f).is_dir()]
    if folders:
        raise DataNotFoundError(f"{folders[0]} is a folder, not the BEIR file it should be")
    missing = [str(root / f) for f in BEIR_FILES if not (root / f).is_file()]
    qrels_files = sorted((root / "qrels").glob("*.tsv")) if (root / "qrels").is_dir() else []
    if not qrels_files:
        missing.append(str(root / "qrels" / "<split>.tsv"))
    if missing:
        raise DataNotFoundError(f"Missing files of the BEIR folder {root}: {', '.join(missing)}")
    texts, titles = _read_jsonl(root / "corpus.jsonl", "document", title=True)
    queries, _ = _read_jsonl(root / "queries.jsonl", "query", title=False)
    empty = [q for q, t in queries.items() if not t.strip()]
    if empty:
        raise BEIRFormatError(f"{root / 'queries.jsonl'}: {len(empty)} empty query text(s), e.g. id {empty[0]!r}")
    corpus = {d: f"{titles[d]} {texts[d]}".strip() for d in texts}
    blank = [d for d, t in corpus.items() if not t]
    if blank:
        logger.warning("%s: %d document(s) have no title and no text (kept, as mteb keeps them), e.g. id %r",
                       root / "corpus.jsonl", len(blank), blank[0])
    qrels = {f.stem: _read_qrels(f, corpus, queries) for f in qrels_files}
    return BEIRData(name=name or root.name, root=root, corpus=corpus, titles=titles, texts=texts,
                    queries=queries, qrels=qrels)


def _hash_order(seed: int, key: str) -> str:
    return hashlib.sha256(f"{seed}\t{key}".encode()).hexdigest()


def beir_retrieval(data: BEIRData | str | Path, *, eval_split: str = "test", train_split: str = "train",
                   dev_fraction: float = 0.2, seed: int = 0) -> BEIRRetrieval:
    """The test task, a dev task carved from the training queries, and the training data (module docstring).

    Args:
        data: a :class:`BEIRData` or a BEIR folder.
        eval_split: the split evaluated as the test task.
        train_split: the split whose judgements become training pairs (and the dev task).
        dev_fraction: share of the training queries held out as the dev task, in [0, 1); 0 = no dev task.
        seed: the hash seed that orders the training queries for the dev draw.

    Raises:
        ValueError: the same split for training and evaluation, ``dev_fraction`` outside [0, 1), a dev task or a
            training set that would be empty, or a split without a relevant judgement.
    """
    if not isinstance(data, BEIRData):
        data = load_beir(data)
    if eval_split == train_split:
        raise ValueError(f"eval_split and train_split are both {eval_split!r}: training on the evaluated queries")
    if isinstance(dev_fraction, bool) or not isinstance(dev_fraction, int | float) or not 0.0 <= dev_fraction < 1.0:
        raise ValueError(f"dev_fraction must be a number in [0, 1), got {dev_fraction!r}")
    test = data.task(eval_split)
    train_relevant = data.relevant(train_split)
    ordered = sorted(train_relevant, key=lambda q: _hash_order(seed, q))
    want = round(dev_fraction * len(ordered))
    if dev_fraction > 0 and not 1 <= want < len(ordered):
        raise ValueError(f"a dev split of {dev_fraction} of {len(ordered)} training queries leaves no dev query or no "
                         "training query")
    test_texts = set(test.queries.values())
    dev_ids = [q for q in ordered if data.queries[q] not in test_texts][:want]
    dev_task = None
    if dev_ids:
        dev_task = GradedRetrievalTask(name=f"{data.name}-dev", queries={q: data.queries[q] for q in sorted(dev_ids)},
                                       corpus=dict(data.corpus), relevant_docs={q: train_relevant[q] for q in dev_ids},
                                       qrels={q: dict(data.qrels[train_split][q]) for q in dev_ids})
    held_out = test_texts | {data.queries[q] for q in dev_ids}
    pairs: list[tuple[str, str]] = []
    known: dict[str, set[str]] = {}
    dropped_queries = 0
    for query in sorted(train_relevant, key=_natural):
        text = data.queries[query]
        if text in held_out:
            dropped_queries += query not in dev_ids
            continue
        docs = sorted(train_relevant[query], key=_natural)
        known.setdefault(text, set()).update(data.corpus[d] for d in docs)
        pairs.extend((text, data.corpus[d]) for d in docs)
    pairs = list(dict.fromkeys(pairs))
    if not pairs:
        raise ValueError(f"no training pair is left in split {train_split!r} after holding out the dev and test "
                         "queries")
    result = BEIRRetrieval(
        task=test, dev_task=dev_task, train_pairs=pairs, train_corpus=list(dict.fromkeys(data.corpus.values())),
        known_paraphrases=known,
        stats={"corpus": len(data.corpus), "test_queries": len(test.queries),
               "test_judgements": sum(map(len, test.relevant_docs.values())),
               "train_queries": len(train_relevant) - len(dev_ids) - dropped_queries,
               "dev_queries": len(dev_ids),
               "dev_judgements": sum(len(train_relevant[q]) for q in dev_ids),
               "train_queries_dropped_same_text_as_test": dropped_queries,
               "train_pairs": len(pairs)},
    )
    leaked = result.protected_sentences().intersection(s for pair in pairs for s in pair[:1])
    if leaked:  # pragma: no cover - the loop above removes them
        raise ValueError(f"{len(leaked)} evaluated query text(s) in the training pairs, e.g. {sorted(leaked)[0]!r}")
    return result


def _natural(key: str) -> tuple[int, str]:
    """Numeric ids in numeric order, then the others (a stable order for the training pairs)."""
    return (int(key), "") if key.isdigit() else (1 << 62, key)

