"""The benchmarks' one table of methods: every label a benchmark runs → its loss, options and what it is.

A label is what a results JSON records as a run's ``method``; :data:`METHODS` says which configuration it names:
the loss (a name of ``st_hardneg.training.LOSSES``, or ``cached_mnrl``, sentence-transformers' loss that the
scale benchmarks build themselves), its options, its family (dev selection keeps the best of each family),
whether it is a sentence-transformers loss (a baseline) and one line on what it is. Each benchmark lists the labels
it runs (the tuples below) and turns them into its ``{label: (loss, options)}`` with :func:`table`, so a label means
the same configuration everywhere. One label differs by the training data and says so: ``mnrl_hardness`` weights
every negative (``all_negatives``) where there are mined negatives and keeps the registry's in-batch form on the
STS protocols' pairs (``sts_options``).

The retrieval benchmark (``benchmarks.retrieval_beir_round2``) names its rows in ``benchmarks.retrieval_beir_rows``.

Example:
    >>> from benchmarks.methods import CPU_PROTOCOL, METHODS, table
    >>> METHODS["mixcse_lam0.4"].options
    {'lam': 0.4}
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
        loss: a name of ``st_hardneg.training.LOSSES``, or ``cached_mnrl`` (sentence-transformers'
            CachedMultipleNegativesRankingLoss, built by the scale benchmarks).
        options: the loss's keyword arguments.
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
    "cached_mnrl": Method("cached_mnrl", {"mini_batch_size": 16},
                          "CachedMultipleNegativesRankingLoss: MNRL's loss and gradients exactly, in mini-batches "
                          "(the scale benchmarks pass their own mini_batch_size)", "mnrl", builtin=True),
    # ---- st-hardneg's losses at their defaults
    "mixcse": Method("mixcse_two_way", {}, "MixCSE at its defaults", "mixcse"),
    "focal": Method("focal", {}, "Focal-InfoNCE at its defaults (mask_duplicates on)", "focal"),
    "hncse_pm": Method("hncse_pm", {}, "HNCSE positive mixing", "hncse"),
    "hncse_hnm": Method("hncse_hnm", {}, "HNCSE hard-negative mixing", "hncse"),
    "adcse": Method("adcse", {}, "AdCSE at the paper's defaults (untied EMA key encoder)", "adcse"),
    # ---- options screened on a dev task
    "adcse_tied": Method("adcse", {"untied": False},
                         "AdCSE with keys from the online encoder (SimCSE + adversaries, no EMA key encoder: the "
                         "paper's \"w/o untied\" ablation)", "adcse"),
    # ---- the STS-B dev hyperparameter screen (benchmarks/studies/tuning.json)
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
#: its STS-B dev hyperparameter screen (``benchmarks/studies/tuning.json``)
SCREEN = ("focal_m0.5", "mixcse_lam0.4", "mixcse+focal", "hncse_pm_thr0.3", "hncse_hnm+focal", "hncse_both+focal",
          "adcse_m0.99", "adcse_tied")
#: its queue screen (``benchmarks/studies/tuning_queue.json``)
QUEUE_SCREEN = tuple(_queue_rows())


def table(labels: Iterable[str], *, sts: bool = False) -> dict[str, tuple[str, dict[str, Any]]]:
    """``{label: (loss, options)}`` of ``labels`` (fresh option dicts): a benchmark's rows.

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


def builtin(labels: Iterable[str]) -> tuple[str, ...]:
    """The labels among ``labels`` that are sentence-transformers' losses (the baselines), in order."""
    return tuple(label for label in labels if METHODS[label].builtin)


def registry_loss(label: str) -> str:
    """The registry name (:data:`st_hardneg.training.registry.LOSSES`) a label runs: its row's loss (``"mixcse"``, the
    label the committed STS results are recorded under, runs ``mixcse_two_way``), or the label itself when it is a
    registry name without a row."""
    return METHODS[label].loss if label in METHODS else label


def recorded_loss(run: dict[str, Any]) -> str:
    """The registry name of the loss a committed run trained, read from the run's own record: its ``loss`` and the
    form its ``loss_config`` shows (a run recorded as ``mixcse`` with both directions trained ``mixcse_two_way``; one
    recorded as ``hncse`` trained ``hncse_<mode>``)."""
    name = run["loss"]
    config = run.get("loss_config") or {}
    if name == "mixcse" and (len(config.get("directions") or ()) == 2 or config.get("symmetric") is True):
        return "mixcse_two_way"  # st-hardneg 0.1's configs said symmetric=True for the same form
    if name == "hncse" and config.get("mode") in ("pm", "hnm", "both"):
        return f"hncse_{config['mode']}"
    return str(name)


def benchmark_loss(record: dict[str, Any]) -> str:
    """The registry name of the loss a cost or scale benchmark's record trained: :func:`recorded_loss` where the record
    keeps its ``loss`` (and ``loss_config``), else the loss its ``method`` label runs (:func:`registry_loss`, which is
    how ``benchmarks.scale`` and ``benchmarks.scale_gpu`` build a label: a ``mixcse`` row trained ``mixcse_two_way``).

    Example:
        >>> benchmark_loss({"method": "mixcse"})
        'mixcse_two_way'
        >>> benchmark_loss({"method": "mixcse", "loss": "mixcse", "loss_config": {"directions": ["query_to_doc"]}})
        'mixcse'
    """
    if "loss" in record:
        return recorded_loss(record)
    return registry_loss(record["method"])
