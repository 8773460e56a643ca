"""Test helpers shared by the test suite, the benchmarks' dry runs and the notebooks' smoke mode.

- :mod:`~st_hardneg.testing.fixtures`: a tiny random BERT that builds offline, a mini SentEval folder, plain-Python
  reference math (re-exported here; torch-free to import);
- :mod:`~st_hardneg.testing.distributed`: the multi-process harness (gloo, ``torch.multiprocessing.spawn``);
- :mod:`~st_hardneg.testing.blocked`: a saved model loaded by plain sentence-transformers in a Python that cannot
  import st_hardneg.

>>> from st_hardneg.testing import make_tiny_model_dir
"""

from st_hardneg.testing.fixtures import (
    MINI_SENTEVAL_FILES,
    SYMMETRIC,
    WORDS,
    ce,
    cosf,
    make_mini_senteval,
    make_text_model_dir,
    make_tiny_model_dir,
    parameter_snapshot,
    parameters_changed,
    record_loss_values,
    two_way,
    unit,
)

__all__ = ["MINI_SENTEVAL_FILES", "SYMMETRIC", "WORDS", "ce", "cosf", "make_mini_senteval", "make_text_model_dir",
           "make_tiny_model_dir", "parameter_snapshot", "parameters_changed", "record_loss_values", "two_way", "unit"]
