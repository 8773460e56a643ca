"""st-hardneg: hard-negative contrastive losses for sentence-transformers.

>>> from st_hardneg import MixCSELoss
"""

from st_hardneg.losses import HardNegativeLoss, MixCSELoss

__version__ = "0.1.0"

__all__ = ["HardNegativeLoss", "MixCSELoss", "__version__"]
