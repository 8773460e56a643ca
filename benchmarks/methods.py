"""The benchmarks' one table of methods: every label a benchmark runs → its loss, options and what it is.

A label is what a results JSON records as a run's ``method``; :data:`METHODS` says which configuration it names:
the loss (a name of ``st_hardneg.training.LOSSES``, or ``gist`` / ``cached_mnrl``, sentence-transformers' losses
that ``benchmarks.retrieval`` builds itself), its options, its family (dev selection keeps the best of each family),
whether it is a sentence-transformers loss (a baseline) and one line on what it is. Each benchmark lists the labels
it runs (the tuples below) and turns them into its ``{label: (loss, options)}`` with :func:`table`, so a label means
the same configuration everywhere. One label differs by the training data and says so: ``mnrl_hardness`` weights
every negative (``all_negatives``) where there are mined negatives and keeps the registry's in-batch form on the
STS protocols' pairs (``sts_options``).

``benchmarks.retrieval_beir`` keeps its own rows (``BUILTIN`` / ``CANDIDATES``) for now.

Example:
    >>> from benchmarks.methods import CPU_PROTOCOL, METHODS, table
    >>> METHODS["mixcse_hardest"].options
    {'partner': 'hardest'}
    >>> table(CPU_PROTOCOL, sts=True)["mnrl_hardness"]
    ('mnrl_hardness', {})
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Method:
    """One benchmark configuration.

    Args:
        loss: a name of ``st_hardneg.training.LOSSES``, or ``gist`` / ``cached_mnrl`` (built by the retrieval
            benchmark: GISTEmbedLoss with the untrained model as guide, CachedMultipleNegativesRankingLoss).
        options: the loss's keyword arguments (``batch_factor`` is the retrieval benchmark's own: the batch that many
            times the protocol's, in mini-batches of the protocol's).
        about: what the configuration is, in one line.
        family: the loss family; dev selection keeps the best configuration of each.
        builtin: a sentence-transformers loss (a baseline), not one of st-hardneg's.
        sts_options: the options on the STS protocols' training pairs (no mined negative), where they differ.
    """

    loss: str
    options: Mapping[str, Any]
    about: str
    family: str
    builtin: bool = False
    sts_options: Mapping[str, Any] | None = field(default=None)


def _queue_rows() -> dict[str, Method]:
    """The queue screen's 12 configurations: mnrl (through the queued MNRL) and Focal-InfoNCE with a queue of 1x, 2.5x
    and 8x the batch of 64, fed online (XBM) or by a momentum key encoder (ESimCSE's 0.995); the first 8 steps (5 %
    of the 156) read no queue row."""
    return {
        f"{loss}_queue{size}_{source}": Method(
            "mnrl_queue" if loss == "mnrl" else loss,
            {"queue_size": size, "queue_warmup_steps": 8, **({"queue_source": "ema"} if source == "ema" else {})},
            f"queue of {size} rows ({size / 64:g}x the batch), {source} source", loss)
        for loss in ("mnrl", "focal") for size in (64, 160, 512) for source in ("online", "ema")
    }


#: every label → its configuration
METHODS: dict[str, Method] = {
    # ---- sentence-transformers' losses (the baselines)
    "mnrl": Method("mnrl", {}, "MultipleNegativesRankingLoss, scale 20 (temperature 0.05): SimCSE's loss", "mnrl",
                   builtin=True),
    "mnrl_symmetric": Method("mnrl_symmetric", {}, "MultipleNegativesSymmetricRankingLoss: both directions", "mnrl",
                             builtin=True),
    "mnrl_hardness": Method("mnrl_hardness", {"hardness_mode": "all_negatives"},
                            "MNRL with hardness weighting (Lan et al. 2025, alpha 9) of every negative; on the STS "
                            "pairs the registry's in-batch form", "mnrl", builtin=True, sts_options={}),
    "gist": Method("gist", {}, "GISTEmbedLoss, the untrained model as guide, temperature 0.01", "gist", builtin=True),
    "cached_mnrl": Method("cached_mnrl", {"mini_batch_size": 16},
                          "CachedMultipleNegativesRankingLoss: MNRL's loss and gradients exactly, in mini-batches "
                          "(the scale benchmarks pass their own mini_batch_size)", "mnrl", builtin=True),
    "cached_mnrl_4x": Method("cached_mnrl", {"batch_factor": 4},
                             "CachedMNRL at 4x the protocol's batch in mini-batches of the protocol's batch (same "
                             "epochs, a quarter of the steps)", "mnrl", builtin=True),
    # ---- st-hardneg's losses at their defaults
    "mixcse": Method("mixcse_two_way", {}, "MixCSE at its defaults", "mixcse"),
    "focal": Method("focal", {}, "Focal-InfoNCE at its defaults (mask_duplicates on)", "focal"),
    "hncse_pm": Method("hncse_pm", {}, "HNCSE positive mixing", "hncse"),
    "hncse_hnm": Method("hncse_hnm", {}, "HNCSE hard-negative mixing", "hncse"),
    "adcse": Method("adcse", {}, "AdCSE at the paper's defaults (untied EMA key encoder)", "adcse"),
    # ---- options screened on a dev task, ablations
    "focal_no_fnc": Method("focal", {"mask_duplicates": False},
                           "Focal-InfoNCE with no false-negative control at all", "focal"),
    "focal_margin_rel0.05": Method("focal", {"margin": 0.05, "margin_strategy": "relative"},
                                   "Focal-InfoNCE with NV-Retriever's TopK-PercPos margin (relative 0.05)", "focal"),
    "mixcse_explicit": Method("mixcse_two_way", {"partner": "explicit"}, "MixCSE mixing with the anchor's mined negative",
                              "mixcse"),
    "mixcse_hardest": Method("mixcse_two_way", {"partner": "hardest"}, "MixCSE mixing with the hardest in-batch negative",
                             "mixcse"),
    "hncse_hnm_hard_negatives": Method("hncse_hnm", {"hnm_pool": "hard_negatives"},
                                       "HNCSE HNM mixing among the mined negatives", "hncse"),
    "hncse_hnm_all_negatives": Method("hncse_hnm", {"hnm_pool": "all_negatives"},
                                      "HNCSE HNM mixing among every negative", "hncse"),
    "adcse_tied": Method("adcse", {"untied": False},
                         "AdCSE with keys from the online encoder (SimCSE + adversaries, no EMA key encoder: the "
                         "paper's \"w/o untied\" ablation)", "adcse"),
    # ---- the queue at equal memory (SciFact): batch 32 + 192 queued rows = cached_mnrl_4x's 256 candidates per
    # anchor; cpu_protocol.json's focal_queue / mnrl_queue rows were --variant runs (512 rows, online, warm-up 8:
    # their loss_config is in the JSON)
    "focal_queue": Method("focal", {"queue_size": 192, "queue_warmup_steps": 1},
                          "Focal-InfoNCE with the candidates of the last 3 steps queued (online source, warm-up 1 "
                          "step)", "focal"),
    # ---- the STS-B dev hyperparameter screen (cpu_protocol --screen)
    "focal_m0.5": Method("focal", {"m": 0.5}, "Focal-InfoNCE: a larger hardness margin m", "focal"),
    "mixcse_lam0.4": Method("mixcse_two_way", {"lam": 0.4}, "MixCSE: more of the negative in the mixed negative", "mixcse"),
    "mixcse+focal": Method("mixcse_two_way", {"focal_m": 0.3},
                           "combination: focal modulation with MixCSE's mixed negatives", "mixcse"),
    "hncse_pm_thr0.3": Method("hncse_pm", {"pm_threshold": 0.3}, "HNCSE PM mixes 2-8% of anchors at 0.1; mix more",
                              "hncse"),
    "hncse_hnm+focal": Method("hncse_hnm", {"focal_m": 0.3},
                              "combination: focal modulation with HNM's synthetic negatives", "hncse"),
    "hncse_both+focal": Method("hncse_both", {"focal_m": 0.3, "pm_threshold": 0.3},
                               "combination: PM + HNM + focal modulation", "hncse"),
    "adcse_m0.99": Method("adcse", {"momentum": 0.99}, "AdCSE: a faster key encoder (EMA 0.99 instead of 0.995)",
                          "adcse"),
    **_queue_rows(),
}

# --------------------------------------------------------------------------- each benchmark's rows (labels)
#: st-hardneg's losses at their defaults: the rows of the cost and scale benchmarks (next to their references)
OURS = ("mixcse", "focal", "hncse_pm", "hncse_hnm", "adcse")
#: the CPU STS protocol (``benchmarks.cpu_protocol``): every method at its defaults
CPU_PROTOCOL = ("mnrl", "mnrl_symmetric", "mnrl_hardness", "mixcse", "focal", "hncse_pm", "hncse_hnm", "adcse")
#: its STS-B dev hyperparameter screen (``cpu_protocol --screen``)
SCREEN = ("focal_m0.5", "mixcse_lam0.4", "mixcse+focal", "hncse_pm_thr0.3", "hncse_hnm+focal", "hncse_both+focal",
          "adcse_m0.99", "adcse_tied")
#: its queue screen (``cpu_protocol --screen queue``)
QUEUE_SCREEN = tuple(_queue_rows())
#: the options screened on a retrieval dev task (``retrieval --select``, MRPC and SciFact alike); within a family
#: the best dev nDCG@10 is the configuration the test rows run
SELECTION = ("mnrl", "focal", "focal_margin_rel0.05", "mixcse_explicit", "mixcse_hardest", "hncse_hnm_hard_negatives",
             "hncse_hnm_all_negatives", "adcse", "adcse_tied")
#: MRPC paraphrase retrieval: the baselines, then each of ours with its best option on the dev split
#: (retrieval_selection.md), the false-negative ablation (focal's mask_duplicates masks nothing under
#: NO_DUPLICATES, the margin does) and the mined negative as MixCSE's partner (second on dev)
MRPC = ("mnrl", "mnrl_hardness", "gist", "focal", "mixcse_hardest", "hncse_hnm_all_negatives", "adcse_tied",
        "focal_margin_rel0.05", "mixcse_explicit")
#: MRPC rows run only on request: CachedMNRL repeats mnrl's numbers more slowly; focal_no_fnc equals focal whenever
#: mask_duplicates masks nothing (its 3 seeds are committed); adcse was second to adcse_tied on dev
MRPC_OPTIONAL = ("cached_mnrl", "focal_no_fnc", "adcse")
#: SciFact: the baselines, then each of ours with its dev-selected option (scifact_selection.md)
SCIFACT = ("mnrl", "mnrl_hardness", "cached_mnrl_4x", "gist", "focal", "mixcse_explicit", "hncse_hnm_hard_negatives",
           "adcse")
#: SciFact's ablation rows: which ingredient carries a difference (false-negative control, the mined partner)
SCIFACT_ABLATIONS = ("focal_no_fnc", "focal_margin_rel0.05", "mixcse_hardest")
#: SciFact's queue rows (equal memory with cached_mnrl_4x)
SCIFACT_QUEUE = ("focal_queue",)


def table(labels: Iterable[str], *, sts: bool = False) -> dict[str, tuple[str, dict[str, Any]]]:
    """``{label: (loss, options)}`` of ``labels`` (fresh option dicts), for ``benchmarks.harness.benchmark_jobs``.

    Args:
        labels: keys of :data:`METHODS`.
        sts: the STS protocols' options (``Method.sts_options`` where a method has them).

    Raises:
        KeyError: a label not in :data:`METHODS`.
    """
    out = {}
    for label in labels:
        method = METHODS[label]
        options = method.sts_options if sts and method.sts_options is not None else method.options
        out[label] = (method.loss, dict(options))
    return out


def selection_table() -> dict[str, tuple[str, str, dict[str, Any]]]:
    """:data:`SELECTION` as ``{label: (family, loss, options)}``: the configurations the MRPC and SciFact benchmarks
    screen on their dev tasks (fresh option dicts)."""
    return {label: (METHODS[label].family, loss, options) for label, (loss, options) in table(SELECTION).items()}


def builtin(labels: Iterable[str]) -> tuple[str, ...]:
    """The labels among ``labels`` that are sentence-transformers' losses (the baselines), in order."""
    return tuple(label for label in labels if METHODS[label].builtin)


def registry_loss(label: str) -> str:
    """The registry name (:data:`st_hardneg.training.registry.LOSSES`) a label runs: its row's loss (``"mixcse"``, the
    label every committed result recorded, runs ``mixcse_two_way``), or the label itself when it is a registry name
    without a row."""
    return METHODS[label].loss if label in METHODS else label


#: registry names the committed results recorded before one name meant one loss (st-hardneg 0.3): the name each
#: now has. ``mixcse`` built MixCSE's two-direction form (now ``mixcse_two_way``), ``hncse`` HNCSE's ``mode="both"``
#: (now ``hncse_both``); each run's ``loss_config`` shows the form it trained.
RENAMED_LOSSES = {"mixcse": "mixcse_two_way", "hncse": "hncse_both"}


def recorded_loss(run: dict[str, Any]) -> str:
    """The registry name of the loss a committed run trained, under today's names (:data:`RENAMED_LOSSES` for a run
    recorded before the rename, told apart by its ``loss_config``: the two-direction MixCSE, HNCSE's ``mode``)."""
    name = run["loss"]
    config = run.get("loss_config") or {}
    if name == "mixcse" and (len(config.get("directions") or ()) == 2 or config.get("symmetric") is True):
        return RENAMED_LOSSES[name]  # 0.1's configs said symmetric=True for the same form
    if name == "hncse" and config.get("mode") == "both":
        return RENAMED_LOSSES[name]
    return str(name)
