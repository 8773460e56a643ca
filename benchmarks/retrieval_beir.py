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
    python -m benchmarks.retrieval_beir --out F --choose         # a re-run file: the recipe / built-in chosen on it
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import REPO, RESULTS, SHARED_DATA
from benchmarks.retrieval_beir_report import (
    compare_rows,
    known_relevance,
    markdown,
    mining_table,
    paired,
    paired_section,
    per_query_by_row,
    per_query_runs,
    plot,
    plot_points,
    significance,
    table,
    write_report,
)
from benchmarks.retrieval_beir_rows import (
    ABLATION_ROLES,
    BUILTIN,
    CANDIDATES,
    DATASETS,
    MIN_MINED_SHARE,
    MINING_CHOICES,
    MINING_RULE,
    OURS,
    PROTOCOL,
    REL,
    SCIFACT_IMPORT,
    SCIFACT_IMPORT_FILE,
    SCREEN_PREFIX,
    TABLE_ROWS,
    Method,
    all_rows,
    choose_again,
    choose_rows,
    display,
    fixed_choice,
    mining_choice,
    mining_screen,
    pooled_dev,
    protocol,
    recipe_label,
    recipe_methods,
    row_role,
    rows_mining,
    run_label,
    sampling,
    screened_setting,
)

#: the benchmark's one namespace: the runner's names and those of its rows and report modules, re-exported
__all__ = [
    "ABLATION_ROLES",
    "BUILTIN",
    "CANDIDATES",
    "DATASETS",
    "DATA_DIR",
    "DEFAULT_OUT",
    "MINING_CHOICES",
    "MINING_RULE",
    "MIN_MINED_SHARE",
    "Method",
    "OURS",
    "PROTOCOL",
    "Prepared",
    "REL",
    "REPO",
    "RESULTS",
    "Runner",
    "SCIFACT_IMPORT",
    "SCIFACT_IMPORT_FILE",
    "SCREEN_PREFIX",
    "TABLE_ROWS",
    "all_rows",
    "build_loss",
    "choose_again",
    "choose_rows",
    "compare_rows",
    "display",
    "evaluate",
    "fixed_choice",
    "frozen_guide",
    "import_scifact",
    "known_relevance",
    "load_model",
    "load_results",
    "main",
    "markdown",
    "mining_choice",
    "mining_screen",
    "mining_table",
    "negatives_key",
    "paired",
    "paired_section",
    "per_query_by_row",
    "per_query_runs",
    "plot",
    "plot_points",
    "pooled_dev",
    "prepare",
    "protocol",
    "recipe_label",
    "recipe_methods",
    "row_role",
    "rows_mining",
    "run_all",
    "run_label",
    "run_one",
    "sampling",
    "screened_setting",
    "shared_negatives",
    "significance",
    "table",
    "write_report",
]

DEFAULT_OUT = RESULTS / "retrieval_beir.json"
DATA_DIR = SHARED_DATA


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
    """Row ``method``'s loss on ``model`` through the shared :func:`benchmarks.harness.build` (GISTEmbedLoss guided by
    the frozen untrained model, CachedMNRL in mini-batches of the protocol's batch), with the row's guide and known
    positives."""
    from benchmarks.harness import build

    kwargs = dict(method.kwargs)
    if method.guided:
        kwargs["guide"] = frozen_guide(args)
    if method.known_positives:
        kwargs["known_positives"] = known
    if method.loss == "cached_mnrl":
        kwargs.setdefault("mini_batch_size", PROTOCOL["batch_size"])
    return build(method.loss, model, kwargs, lambda: frozen_guide(args))


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
    parser.add_argument("--choose", action="store_true",
                        help="choose the recipe and the best built-in again on the JSON's pooled dev (seed 0), "
                             "replacing choices fixed by --recipe / --builtin, then rewrite the report (no run)")
    args = parser.parse_args(argv)
    if args.choose and (args.recipe or args.builtin or args.plan is not None):
        parser.error("--choose runs nothing and makes the choices itself: not with --recipe, --builtin or --plan")
    out = Path(args.out)
    if args.report or args.choose:
        if not out.is_file():
            parser.error(f"--report / --choose read the results file, and there is none at {out}")
        data = json.loads(out.read_text())
        if args.choose:
            from st_hardneg.reporting import write_json

            choose_again(data)
            write_json(out, data)
        write_report(data, out)
        plot(data, out.with_suffix(".png"), per_query_runs(out.with_name(out.stem + "_per_query.jsonl"), data["runs"]))
        print(out.with_suffix(".md").read_text())
        return 0
    if os.environ.get("OMP_NUM_THREADS") is None:
        import torch

        torch.set_num_threads(1)
    data = run_all(args)
    plot(data, out.with_suffix(".png"), per_query_runs(out.with_name(out.stem + "_per_query.jsonl"), data["runs"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
