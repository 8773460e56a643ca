"""The st-hardneg losses: one module per method, all built on :mod:`st_hardneg.functional`."""

from st_hardneg.losses.base import HardNegativeLoss
from st_hardneg.losses.mixcse import MixCSELoss

__all__ = ["HardNegativeLoss", "MixCSELoss"]
