"""The ``st-hardneg`` command (:func:`main`): ``train`` (:mod:`~st_hardneg.cli.train`), ``eval`` and ``download``
(:mod:`~st_hardneg.cli.app`). Only the standard library is imported until a command runs, so ``--help`` is fast."""

from st_hardneg.cli.app import build_parser, main

__all__ = ["build_parser", "main"]
