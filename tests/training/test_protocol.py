"""The retrieval protocol's module name: ``st_hardneg.training.protocol`` (the recipe is ``training.recipe``); the
former name ``st_hardneg.training.retrieval`` still imports it, with a deprecation warning."""

from __future__ import annotations

import importlib
import sys

import pytest


def test_the_former_module_name_is_the_protocol_and_warns():
    from st_hardneg.training import protocol

    sys.modules.pop("st_hardneg.training.retrieval", None)
    with pytest.warns(DeprecationWarning, match="st_hardneg.training.protocol"):
        former = importlib.import_module("st_hardneg.training.retrieval")
    assert former is protocol and former.TRAINING is protocol.TRAINING
    from st_hardneg.training import retrieval  # the package attribute is the protocol too (cli imports it so)

    assert retrieval is protocol
