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


def test_the_package_and_the_benchmarks_never_import_the_former_name():
    """Only users' old code meets the deprecation warning: nothing of ours imports ``training.retrieval``."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    found = []
    for path in [*(root / "st_hardneg").rglob("*.py"), *(root / "benchmarks").rglob("*.py")]:
        if path == root / "st_hardneg" / "training" / "retrieval.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [f"{node.module}.{a.name}" for a in node.names] + [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            if "st_hardneg.training.retrieval" in names:
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    assert found == []


def test_the_cli_defaults_of_the_retrieval_tasks_import_without_a_deprecation_warning():
    import subprocess

    code = ("from st_hardneg.cli.checks import task_defaults; from st_hardneg.training.protocol import "
            "BEIR_TRAINING; assert task_defaults('beir')['batch_size'] == BEIR_TRAINING['batch_size']")
    result = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", code], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.parametrize(("mining", "message"), [
    ({"margin": 0.1}, "unknown mining setting(s) ['margin']; choose from num_candidates"),
    ({"num_candidates": 0}, "mining num_candidates must be an integer >= 1, got 0"),
    ({"num_candidates": True}, "mining num_candidates must be an integer >= 1, got True"),
    ({"relative_margin": 1.0}, "mining relative_margin (None: no margin) must be a finite number in [0, 1), got 1.0"),
    ({"relative_margin": "0.1"}, "relative_margin (None: no margin) must be a finite number in [0, 1), got '0.1'"),
    ({"range_min": -1}, "mining range_min must be a non-negative integer, got -1"),
    ({"range_max": 0}, "mining range_max (None: num_candidates + range_min + 10) must be an integer >= 1, got 0"),
    ({"range_min": 10, "range_max": 12}, "mining: range_max - range_min must leave at least num_candidates=5 "
                                         "candidates, got range_min=10, range_max=12"),
    ({"known_as_positives": "yes"}, "mining known_as_positives must be True or False, got 'yes'"),
])
def test_mining_settings_are_checked_before_any_model_loads(mining, message, tmp_path):
    from st_hardneg.training.protocol import check_mining, mined_triplets

    with pytest.raises(ValueError) as raised:
        check_mining(mining)
    assert message in str(raised.value)

    def never():
        raise AssertionError("the mining model was loaded")

    with pytest.raises(ValueError) as raised:
        mined_triplets(None, never, model_key="m", data_key="d", mining=mining, cache_dir=tmp_path)  # type: ignore[arg-type]
    assert message in str(raised.value) and not any(tmp_path.iterdir())


def test_checked_mining_settings_are_the_defaults_with_the_overrides_on_top():
    from st_hardneg.training.protocol import MINING, check_mining

    assert check_mining(None) == MINING and check_mining(None) is not MINING
    assert check_mining({"known_as_positives": True, "relative_margin": None, "num_candidates": 1}) == {
        **MINING, "known_as_positives": True, "relative_margin": None, "num_candidates": 1}
    assert check_mining({"range_min": 10, "range_max": 15})["range_max"] == 15  # exactly 5 candidates left
