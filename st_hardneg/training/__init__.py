"""Training: the Trainer recipe, the losses by name, the experiment runner, the retrieval protocol and recipe, and
every callback.

- :mod:`~st_hardneg.training.loop`: :class:`TrainConfig`, :func:`train` (the papers' protocol on the
  sentence-transformers Trainer);
- :mod:`~st_hardneg.training.registry`: :data:`LOSSES`, :func:`build_loss`, :func:`parse_loss_args`;
- :mod:`~st_hardneg.training.experiment`: train → evaluate → one result record, for the CLI and every benchmark;
- :mod:`~st_hardneg.training.protocol`: the retrieval protocol (mined triplets, settings, scores; formerly
  ``st_hardneg.training.retrieval``), with :mod:`~st_hardneg.training.sampling` (pair sampling, known-relevance
  batches);
- :mod:`~st_hardneg.training.recipe`: the st-hardneg retrieval recipe (:func:`retrieval_recipe`, :func:`recipe_loss`);
- :mod:`~st_hardneg.training.callbacks`: every ``TrainerCallback`` of the package.

>>> from st_hardneg.training import TrainConfig, build_loss, train

Names are imported on first access (PEP 562): ``import st_hardneg.training`` loads neither torch nor transformers, so
the command line can read :data:`LOSSES` for ``--help``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY = {
    "TrainConfig": "loop", "TrainResult": "loop", "train": "loop", "training_arguments": "loop",
    "LOSSES": "registry", "build_loss": "registry", "parse_loss_args": "registry",
    "ExperimentResult": "experiment", "run_experiment": "experiment", "run_training": "experiment",
    "planned_steps": "experiment",
    "retrieval_recipe": "recipe", "recipe_loss": "recipe", "RETRIEVAL_RECIPE": "recipe",
    "KnownRelevanceBatchSampler": "sampling", "sample_training_pairs": "sampling",
    "EvaluateAtEnd": "callbacks", "FalseNegativeLog": "callbacks", "LossDiagnosticsCallback": "callbacks",
    "StatefulLossCallback": "callbacks", "StepTimer": "callbacks", "StopAfterSteps": "callbacks",
    "add_stateful_loss_callback": "callbacks", "LossModelCheck": "callbacks", "check_loss_model": "callbacks",
}

__all__ = [
    "LOSSES", "RETRIEVAL_RECIPE", "EvaluateAtEnd", "ExperimentResult", "FalseNegativeLog", "KnownRelevanceBatchSampler",
    "LossDiagnosticsCallback", "LossModelCheck", "StatefulLossCallback", "StepTimer", "StopAfterSteps", "TrainConfig",
    "TrainResult", "add_stateful_loss_callback", "build_loss", "check_loss_model", "parse_loss_args", "planned_steps",
    "recipe_loss", "retrieval_recipe", "run_experiment", "run_training", "sample_training_pairs", "train",
    "training_arguments",
]

if TYPE_CHECKING:  # pragma: no cover
    from st_hardneg.training.callbacks import (
        EvaluateAtEnd,
        FalseNegativeLog,
        LossDiagnosticsCallback,
        LossModelCheck,
        StatefulLossCallback,
        StepTimer,
        StopAfterSteps,
        add_stateful_loss_callback,
        check_loss_model,
    )
    from st_hardneg.training.experiment import ExperimentResult, planned_steps, run_experiment, run_training
    from st_hardneg.training.loop import TrainConfig, TrainResult, train, training_arguments
    from st_hardneg.training.recipe import RETRIEVAL_RECIPE, recipe_loss, retrieval_recipe
    from st_hardneg.training.registry import LOSSES, build_loss, parse_loss_args
    from st_hardneg.training.sampling import KnownRelevanceBatchSampler, sample_training_pairs


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
