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
