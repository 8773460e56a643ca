"""Retrieval data from the MSR paraphrase corpus (MRPC): a test retrieval task and leak-free training triplets.

The **test task** is paraphrase retrieval:

- queries: sentence 1 of every paraphrase pair (label 1) of the MRPC *test* file;
- corpus: every distinct MRPC sentence of both files (train and test, paraphrases or not), except the query
  sentences themselves (a query would otherwise retrieve its own text at rank 1). The sentences 2 of the
  non-paraphrase pairs stay in the corpus: they are near-duplicates of their sentence 1, i.e. natural hard
  distractors;
- relevant: the sentence(s) 2 of the query's test paraphrase pairs. A sentence 2 that is also another pair's query
  sentence is not in the corpus; a query left with no relevant document is dropped (counted in
  :attr:`MRPCRetrieval.stats`).

The **training data** are the paraphrase pairs of the MRPC *train* file, minus every pair that contains a sentence
of the test task (a query or one of its relevant documents): MRPC's two files share no pair, but they do share some
sentences. Hard negatives are mined from the train sentences (same exclusion) with sentence-transformers'
``mine_hard_negatives`` (see :func:`st_hardneg.data.mining.mine_training_negatives`). The exclusion is asserted in code,
not only documented.

Sentences are whitespace-normalised (``" ".join(text.split())``), as :mod:`st_hardneg.data.senteval` reads SentEval.
Identifiers are deterministic: ``q<MRPC id of sentence 1>`` for queries and ``d<smallest MRPC id of the text>`` for
documents.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from st_hardneg.data.mining import mine_training_negatives  # noqa: F401 - re-exported: the data's mining step
from st_hardneg.data.senteval import DataNotFoundError, resolve_senteval_dir
from st_hardneg.validation import check_relevant_docs  # noqa: F401 - re-exported (moved to validation)

if TYPE_CHECKING:
    from datasets import Dataset

MRPC_FILES = {"train": "MRPC/msr_paraphrase_train.txt", "test": "MRPC/msr_paraphrase_test.txt"}
MRPC_HEADER = ("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String")


class MRPCFormatError(ValueError):
    """A malformed MRPC file; the message names the file and the line."""


@dataclass(frozen=True)
class MRPCPair:
    """One line of an MRPC file."""

    label: int
    id1: str
    id2: str
    sentence1: str
    sentence2: str


@dataclass
class RetrievalTask:
    """A retrieval task in sentence-transformers' ``InformationRetrievalEvaluator`` format.

    ``relevant_docs`` maps a query id to a collection of document ids (a set, list or tuple of strings, stored as a
    set). A single id given as a string is refused (``TypeError`` naming the query): iterating it would make every
    character an id; so is a mapping (graded qrels: pass the ids whose score is > 0).
    """

    name: str
    queries: dict[str, str]
    corpus: dict[str, str]
    relevant_docs: dict[str, set[str]]

    def __post_init__(self) -> None:
        self.relevant_docs = check_relevant_docs(self.relevant_docs)

    def sentences(self) -> list[str]:
        """Every text of the task (queries, then documents)."""
        return [*self.queries.values(), *self.corpus.values()]


@dataclass
class MRPCRetrieval:
    """The MRPC test retrieval task, the leak-free training split and what was excluded.

    Attributes:
        task: the test :class:`RetrievalTask`.
        train_pairs: (anchor, positive) = (sentence 1, sentence 2) of the kept MRPC train paraphrase pairs.
        train_corpus: the distinct train sentences allowed as mined negatives (no test-task sentence).
        known_paraphrases: every train sentence → the set of sentences it is labelled a paraphrase of (both
            directions; used to keep mined negatives free of known positives).
        stats: counts (queries, corpus size, excluded pairs / sentences, dropped queries …).
    """

    task: RetrievalTask
    train_pairs: list[tuple[str, str]]
    train_corpus: list[str]
    known_paraphrases: dict[str, set[str]]
    stats: dict[str, int] = field(default_factory=dict)

    def protected_sentences(self) -> set[str]:
        """The texts that must never appear in training data: the queries and their relevant documents."""
        texts = set(self.task.queries.values())
        texts.update(self.task.corpus[d] for docs in self.task.relevant_docs.values() for d in docs)
        return texts

    def train_dataset(self) -> Dataset:
        """The training pairs as a ``datasets.Dataset`` with columns ``anchor``, ``positive``."""
        from datasets import Dataset

        return Dataset.from_dict({"anchor": [a for a, _ in self.train_pairs],
                                  "positive": [p for _, p in self.train_pairs]})


def _normalise(text: str) -> str:
    return " ".join(text.split())


def senteval_root(data_dir: str | Path | None = None) -> Path:
    """The SentEval directory holding ``MRPC/``: ``data_dir`` itself or its ``senteval/`` child when either contains
    ``MRPC/``, else :func:`st_hardneg.data.senteval.resolve_senteval_dir` (which recognises a directory by its STS, SICK or
    MR folders)."""
    if data_dir is not None:
        path = Path(data_dir).expanduser()
        for candidate in (path, path / "senteval"):
            if (candidate / "MRPC").is_dir():
                return candidate
    return resolve_senteval_dir(data_dir)


def mrpc_files(data_dir: str | Path | None = None) -> dict[str, Path]:
    """Paths of the two MRPC files under the SentEval directory; raises :class:`DataNotFoundError` naming the
    missing ones."""
    root = senteval_root(data_dir)
    paths = {split: root / rel for split, rel in MRPC_FILES.items()}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        raise DataNotFoundError(
            "Missing MRPC files: " + ", ".join(missing) + ". They are the MSR paraphrase corpus TSV files "
            "(msr_paraphrase_train.txt / msr_paraphrase_test.txt) that SentEval's get_transfer_data.bash downloads "
            "into its MRPC/ folder."
        )
    return paths


def read_mrpc(path: str | Path) -> list[MRPCPair]:
    """Read one MRPC file: a header line, then ``Quality<TAB>#1 ID<TAB>#2 ID<TAB>#1 String<TAB>#2 String``.

    Raises:
        DataNotFoundError: the file does not exist.
        MRPCFormatError: wrong header, wrong number of fields, a label other than 0/1, an empty sentence or id
            (the message names the file and the 1-based line number).
    """
    path = Path(path)
    if not path.is_file():
        raise DataNotFoundError(f"MRPC file not found: {path}")
    lines = path.read_text(encoding="utf-8-sig").splitlines()
    if not lines:
        raise MRPCFormatError(f"{path}: empty file (expected the header {' / '.join(MRPC_HEADER)})")
    header = tuple(field.strip() for field in lines[0].split("\t"))
    if header != MRPC_HEADER:
        raise MRPCFormatError(f"{path}, line 1: expected the header {'<TAB>'.join(MRPC_HEADER)!r}, got {lines[0]!r}")
    pairs: list[MRPCPair] = []
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 5:
            raise MRPCFormatError(f"{path}, line {number}: expected 5 tab-separated fields, got {len(fields)}: "
                                  f"{line[:120]!r}")
        label, id1, id2, s1, s2 = (f.strip() for f in fields)
        if label not in ("0", "1"):
            raise MRPCFormatError(f"{path}, line {number}: the label (Quality) must be 0 or 1, got {label!r}")
        s1, s2 = _normalise(s1), _normalise(s2)
        if not (id1 and id2 and s1 and s2):
            raise MRPCFormatError(f"{path}, line {number}: empty sentence id or sentence")
        pairs.append(MRPCPair(int(label), id1, id2, s1, s2))
    if not pairs:
        raise MRPCFormatError(f"{path}: no sentence pair after the header")
    return pairs


def _doc_ids(pairs: Iterable[MRPCPair]) -> dict[str, str]:
    """text → ``d<smallest MRPC id of the text>`` (ids compared numerically when they are numbers)."""
    ids: dict[str, list[str]] = {}
    for pair in pairs:
        ids.setdefault(pair.sentence1, []).append(pair.id1)
        ids.setdefault(pair.sentence2, []).append(pair.id2)

    def key(value: str) -> tuple[int, int, str]:
        return (0, int(value), "") if value.isdigit() else (1, 0, value)

    result = {text: "d" + min(found, key=key) for text, found in ids.items()}
    if len(set(result.values())) != len(result):  # two texts share their smallest id: disambiguate by a counter
        seen: dict[str, int] = {}
        for text in sorted(result, key=lambda t: (key(result[t][1:]), t)):
            base = result[text]
            seen[base] = seen.get(base, 0) + 1
            if seen[base] > 1:
                result[text] = f"{base}-{seen[base]}"
    return result


def build_mrpc_retrieval(data_dir: str | Path | None = None, name: str = "MRPC-paraphrase-retrieval"
                         ) -> MRPCRetrieval:
    """The MRPC paraphrase-retrieval test task and the leak-free training split (see the module docstring).

    Args:
        data_dir: the SentEval directory (see :func:`st_hardneg.data.senteval.resolve_senteval_dir`).
        name: the task name (used by the evaluator's metric prefix).
    """
    files = mrpc_files(data_dir)
    train = read_mrpc(files["train"])
    test = read_mrpc(files["test"])
    doc_id = _doc_ids([*train, *test])

    query_text: dict[str, str] = {}
    relevant_texts: dict[str, list[str]] = {}
    text_to_qid: dict[str, str] = {}
    for pair in test:
        if pair.label != 1:
            continue
        qid = text_to_qid.setdefault(pair.sentence1, f"q{pair.id1}")
        query_text.setdefault(qid, pair.sentence1)
        relevant_texts.setdefault(qid, [])
        if pair.sentence2 != pair.sentence1 and pair.sentence2 not in relevant_texts[qid]:
            relevant_texts[qid].append(pair.sentence2)
    query_set = set(query_text.values())
    corpus = {doc_id[t]: t for t in doc_id if t not in query_set}
    corpus = dict(sorted(corpus.items(), key=lambda item: item[0]))
    queries: dict[str, str] = {}
    relevant: dict[str, set[str]] = {}
    dropped_relevant = 0
    for qid, text in query_text.items():
        kept = {doc_id[t] for t in relevant_texts[qid] if t not in query_set}
        dropped_relevant += len(relevant_texts[qid]) - len(kept)
        if kept:
            queries[qid] = text
            relevant[qid] = kept
    task = RetrievalTask(name=name, queries=queries, corpus=corpus, relevant_docs=relevant)

    protected = set(queries.values()) | {corpus[d] for docs in relevant.values() for d in docs}
    train_pairs: list[tuple[str, str]] = []
    seen_pairs: set[tuple[str, str]] = set()
    excluded_pairs = 0
    known: dict[str, set[str]] = {}
    for pair in train:
        if pair.label != 1:
            continue
        if pair.sentence1 in protected or pair.sentence2 in protected:
            excluded_pairs += 1
            continue
        known.setdefault(pair.sentence1, set()).add(pair.sentence2)
        known.setdefault(pair.sentence2, set()).add(pair.sentence1)
        if pair.sentence1 != pair.sentence2 and (pair.sentence1, pair.sentence2) not in seen_pairs:
            seen_pairs.add((pair.sentence1, pair.sentence2))
            train_pairs.append((pair.sentence1, pair.sentence2))
    train_sentences = list(dict.fromkeys(s for pair in train for s in (pair.sentence1, pair.sentence2)))
    train_corpus = [s for s in train_sentences if s not in protected]
    result = MRPCRetrieval(
        task=task,
        train_pairs=train_pairs,
        train_corpus=train_corpus,
        known_paraphrases=known,
        stats={
            "test_paraphrase_pairs": sum(p.label for p in test),
            "queries": len(queries),
            "queries_dropped_no_relevant_left": len(query_text) - len(queries),
            "relevant_docs_dropped_as_queries": dropped_relevant,
            "corpus": len(corpus),
            "distinct_sentences_both_files": len(doc_id),
            "train_paraphrase_pairs": sum(p.label for p in train),
            "train_pairs_kept": len(train_pairs),
            "train_pairs_excluded_test_overlap": excluded_pairs,
            "train_sentences": len(train_sentences),
            "train_sentences_excluded_test_overlap": len(train_sentences) - len(train_corpus),
        },
    )
    assert_no_test_leak(result, [s for pair in train_pairs for s in pair] + train_corpus)
    return result


def dev_split(data: MRPCRetrieval, fraction: float = 0.2, seed: int = 0,
              name: str = "MRPC-dev-retrieval") -> MRPCRetrieval:
    """A retrieval *dev* task carved from the training pairs, for option selection without the test task.

    Queries are sentences 1 of about ``fraction`` of ``data.train_pairs`` (a seeded hash order, so the split is
    deterministic and independent of file order); a query's relevant documents are all its labelled train paraphrases
    (``data.known_paraphrases``); the corpus is every sentence of ``data.train_corpus`` except the queries. A sentence
    becomes a query only if it is neither a chosen query's relevant document nor a paraphrase of a chosen query, so
    no query is another query's answer. The returned split trains on the remaining pairs, minus every pair that
    touches a dev query or relevant document, and mines negatives from ``data.train_corpus`` minus those sentences
    (:func:`assert_no_test_leak` on the result checks exactly this). The test task is never read.

    Args:
        data: the full split from :func:`build_mrpc_retrieval`.
        fraction: share of the training pairs whose sentence 1 is a dev query, in (0, 1).
        seed: the hash seed of the query order.
        name: the dev task's name (the evaluator's metric prefix).

    Returns:
        An :class:`MRPCRetrieval` whose ``task`` is the dev task and whose training fields are the reduced ones.

    Raises:
        ValueError: ``fraction`` outside (0, 1), or too few training pairs for a dev task and a training set.
    """
    import hashlib

    if not isinstance(fraction, int | float) or isinstance(fraction, bool) or not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must be a number in (0, 1), got {fraction!r}")
    want = round(fraction * len(data.train_pairs))
    if want < 1 or want >= len(data.train_pairs):
        raise ValueError(f"a dev split of {fraction} of {len(data.train_pairs)} training pair(s) leaves no dev query "
                         "or no training pair")

    def order(text: str) -> str:
        return hashlib.sha256(f"{seed}\t{text}".encode()).hexdigest()

    queries: list[str] = []
    answers: set[str] = set()
    for anchor in sorted(dict.fromkeys(a for a, _ in data.train_pairs), key=order):
        if len(queries) >= want:
            break
        paraphrases = data.known_paraphrases.get(anchor, set())
        if anchor in answers or paraphrases & set(queries) or not paraphrases:
            continue
        queries.append(anchor)
        answers.update(paraphrases)
    protected = set(queries) | answers
    ids = {text: f"d{i}" for i, text in enumerate(data.train_corpus)}
    missing = sorted(answers - set(ids))
    if missing:  # a labelled paraphrase outside the train corpus would be an unanswerable query
        raise ValueError(f"{len(missing)} dev answer(s) are not in the training corpus, e.g. {missing[0]!r}")
    query_set = set(queries)
    task = RetrievalTask(
        name=name,
        queries={f"q{i}": text for i, text in enumerate(queries)},
        corpus={ids[t]: t for t in data.train_corpus if t not in query_set},
        relevant_docs={f"q{i}": {ids[t] for t in data.known_paraphrases[text]} for i, text in enumerate(queries)},
    )
    train_pairs = [(a, p) for a, p in data.train_pairs if a not in protected and p not in protected]
    known = {t: {p for p in ps if p not in protected} for t, ps in data.known_paraphrases.items() if t not in protected}
    result = MRPCRetrieval(
        task=task,
        train_pairs=train_pairs,
        train_corpus=[t for t in data.train_corpus if t not in protected],
        known_paraphrases=known,
        stats={"dev_queries": len(task.queries), "dev_corpus": len(task.corpus),
               "dev_relevant_docs": sum(map(len, task.relevant_docs.values())), "train_pairs_kept": len(train_pairs),
               "train_pairs_excluded_dev_overlap": len(data.train_pairs) - len(train_pairs),
               "train_corpus": len(data.train_corpus) - len(protected)},
    )
    assert_no_test_leak(result, [s for pair in train_pairs for s in pair] + result.train_corpus)
    return result


def assert_no_test_leak(data: MRPCRetrieval, texts: Iterable[str]) -> None:
    """Raise ``ValueError`` if any of ``texts`` is a test query or one of its relevant documents."""
    protected = data.protected_sentences()
    leaked = sorted({t for t in texts if t in protected})
    if leaked:
        raise ValueError(f"{len(leaked)} test-task sentence(s) found in training data, e.g. {leaked[0]!r}")


#: local retrieval tasks: name → (builder(data_dir) → RetrievalTask, files relative to the SentEval root)
RETRIEVAL_TASKS: dict[str, tuple[Any, tuple[str, ...]]] = {
    "MRPC": (lambda data_dir: build_mrpc_retrieval(data_dir).task, tuple(MRPC_FILES.values())),
}


def retrieval_task_files(name: str, data_dir: str | Path | None = None) -> list[Path]:
    """The files a local retrieval task reads; raises :class:`DataNotFoundError` naming the missing ones."""
    if name not in RETRIEVAL_TASKS:
        raise ValueError(f"unknown retrieval task {name!r}; choose from {', '.join(RETRIEVAL_TASKS)}")
    root = senteval_root(data_dir)
    paths = [root / rel for rel in RETRIEVAL_TASKS[name][1]]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise DataNotFoundError(f"Missing files of the retrieval task {name}: {', '.join(missing)}")
    return paths


def build_retrieval_task(name: str, data_dir: str | Path | None = None) -> RetrievalTask:
    """The local retrieval task ``name`` (see :data:`RETRIEVAL_TASKS`)."""
    retrieval_task_files(name, data_dir)
    return RETRIEVAL_TASKS[name][0](data_dir)
