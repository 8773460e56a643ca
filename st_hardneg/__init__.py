"""st-hardneg: hard-negative contrastive losses for sentence-transformers.

>>> from st_hardneg import MixCSELoss

The loss classes are imported on first access (PEP 562), so ``import st_hardneg`` and the ``st-hardneg`` command's
``--help`` do not load torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.3.0"  # the one place the version is written (pyproject reads it)

_LAZY = {
    "AdversarialNegativesLoss": "st_hardneg.losses",
    "FocalInfoNCELoss": "st_hardneg.losses",
    "HardNegativeLoss": "st_hardneg.losses",
    "HNCSELoss": "st_hardneg.losses",
    "MixCSELoss": "st_hardneg.losses",
    "QueueOptions": "st_hardneg.losses",
    "SharedOptions": "st_hardneg.losses",
}

__all__ = ["AdversarialNegativesLoss", "FocalInfoNCELoss", "HNCSELoss", "HardNegativeLoss", "MixCSELoss", "QueueOptions",
           "SharedOptions", "__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from st_hardneg.losses import (
        AdversarialNegativesLoss,
        FocalInfoNCELoss,
        HardNegativeLoss,
        HNCSELoss,
        MixCSELoss,
        QueueOptions,
        SharedOptions,
    )


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'st_hardneg' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
