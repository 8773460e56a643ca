"""A tiny BEIR folder written on the fly, for tests and the notebook's smoke mode.

>>> from st_hardneg.testing.beir import make_tiny_beir
"""

from __future__ import annotations

import json
import random
from pathlib import Path

__all__ = ["TINY_TOPICS", "make_tiny_beir"]

#: the topics of the tiny corpus: each document is about one, each query asks about one
TINY_TOPICS = ("protein folding", "vaccine response", "tumor growth", "heart rate", "sleep quality", "bone density",
               "gut bacteria", "blood pressure", "insulin signalling", "memory decline", "lung function",
               "skin healing")


def make_tiny_beir(path: str | Path, *, docs_per_topic: int = 4, train_queries: int = 24, test_queries: int = 8,
                   seed: int = 0, header: bool = True) -> Path:
    """Write a BEIR folder (``corpus.jsonl``, ``queries.jsonl``, ``qrels/{train,test}.tsv``) of synthetic claims and
    abstracts: ``docs_per_topic`` documents per topic of :data:`TINY_TOPICS` (every other one with a title), and
    queries relevant to one or two documents of their topic. Returns the folder."""
    rng = random.Random(seed)
    root = Path(path)
    (root / "qrels").mkdir(parents=True, exist_ok=True)
    docs: list[dict[str, str]] = []
    by_topic: dict[str, list[str]] = {}
    for t, topic in enumerate(TINY_TOPICS):
        for k in range(docs_per_topic):
            doc_id = str(1000 + t * docs_per_topic + k)
            verb = rng.choice(("increases", "reduces", "changes", "does not affect"))
            docs.append({"_id": doc_id, "title": f"Study {k} of {topic}" if k % 2 == 0 else "",
                         "text": f"We measured how {topic} {verb} outcome {k} in cohort {rng.randint(1, 99)}."})
            by_topic.setdefault(topic, []).append(doc_id)
    queries: list[dict[str, str]] = []
    qrels: dict[str, list[tuple[str, str]]] = {"train": [], "test": []}
    for i in range(train_queries + test_queries):
        split = "train" if i < train_queries else "test"
        topic = TINY_TOPICS[i % len(TINY_TOPICS)]
        query_id = str(i + 1)
        queries.append({"_id": query_id, "text": f"Claim {i}: {topic} matters for outcome {i % docs_per_topic}."})
        relevant = rng.sample(by_topic[topic], 2 if i % 3 == 0 else 1)
        qrels[split].extend((query_id, doc_id) for doc_id in relevant)
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    for split, rows in qrels.items():
        lines = (["query-id\tcorpus-id\tscore"] if header else []) + [f"{q}\t{d}\t1" for q, d in rows]
        (root / "qrels" / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    return root
