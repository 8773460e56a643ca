"""The ``st-hardneg`` command (:func:`main`, the parser and ``download`` in :mod:`~st_hardneg.cli.app`): ``train``
(:mod:`~st_hardneg.cli.train`, its checks before any model loads in :mod:`~st_hardneg.cli.checks`), ``eval`` and
``compare`` (:mod:`~st_hardneg.cli.evaluate`). Only the standard library is imported until a command runs, so
``--help`` is fast."""

from st_hardneg.cli.app import build_parser, main

__all__ = ["build_parser", "main"]
