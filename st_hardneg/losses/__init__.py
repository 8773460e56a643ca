"""The st-hardneg losses: one module per method, all built on :mod:`st_hardneg.functional`."""

from st_hardneg.losses.adcse import AdversarialNegativesLoss
from st_hardneg.losses.base import HardNegativeLoss
from st_hardneg.losses.focal import FocalInfoNCELoss
from st_hardneg.losses.hncse import HNCSELoss
from st_hardneg.losses.mixcse import MixCSELoss
from st_hardneg.losses.options import QueueOptions, SharedOptions

__all__ = ["AdversarialNegativesLoss", "FocalInfoNCELoss", "HNCSELoss", "HardNegativeLoss", "MixCSELoss", "QueueOptions",
           "SharedOptions"]
