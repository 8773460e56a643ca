"""st-hardneg: hard-negative contrastive losses for sentence-transformers.

>>> from st_hardneg import MixCSELoss
"""

from st_hardneg.losses import AdversarialNegativesLoss, FocalInfoNCELoss, HardNegativeLoss, HNCSELoss, MixCSELoss

__version__ = "0.1.0"

__all__ = ["AdversarialNegativesLoss", "FocalInfoNCELoss", "HNCSELoss", "HardNegativeLoss", "MixCSELoss", "__version__"]
