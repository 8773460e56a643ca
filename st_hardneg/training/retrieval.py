"""Deprecated: the retrieval protocol is :mod:`st_hardneg.training.protocol` ("the retrieval recipe" is
:mod:`st_hardneg.training.recipe`). Importing this module warns (``DeprecationWarning``) and gives that module, so
``from st_hardneg.training.retrieval import TRAINING`` and ``st_hardneg.training.retrieval.TRAINING`` keep working.
"""

from __future__ import annotations

import sys
import warnings

from st_hardneg.training import protocol
from st_hardneg.training.protocol import *  # noqa: F403  (the names, for type checkers; the module is swapped below)

warnings.warn("st_hardneg.training.retrieval is now st_hardneg.training.protocol (the retrieval protocol)",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = protocol
