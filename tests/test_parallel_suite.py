"""The suite's own set-up for pytest-xdist (tests/conftest.py): how many workers ``-n auto`` starts, and that each
worker runs torch on its share of the cores."""

from __future__ import annotations

import os

import pytest
import torch

from tests import conftest


@pytest.mark.parametrize(("cores", "workers"), [(None, 1), (1, 1), (2, 2), (4, 4), (64, conftest.MAX_AUTO_WORKERS)])
def test_auto_starts_a_worker_per_core_up_to_the_cap(monkeypatch, cores, workers):
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    assert conftest.MAX_AUTO_WORKERS == 4 and conftest.pytest_xdist_auto_num_workers(None) == workers


@pytest.mark.parametrize(("cores", "workers", "threads"), [(2, 2, 1), (8, 2, 4), (3, 2, 1), (2, 4, 1)])
def test_a_worker_gives_torch_and_its_commands_its_share_of_the_cores(monkeypatch, cores, workers, threads):
    before = torch.get_num_threads()
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(workers))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    try:
        conftest.pytest_configure(None)
        assert torch.get_num_threads() == threads and os.environ["OMP_NUM_THREADS"] == str(threads)
    finally:
        torch.set_num_threads(before)


def test_outside_a_worker_torch_keeps_its_threads(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(3)
    try:
        conftest.pytest_configure(None)
        assert torch.get_num_threads() == 3 and "OMP_NUM_THREADS" not in os.environ
    finally:
        torch.set_num_threads(before)


def test_the_readme_command_runs_the_suite_in_workers(pytestconfig):
    """``python -m pytest -q`` takes ``-n auto --dist worksteal`` from pyproject's addopts."""
    assert pytestconfig.getini("addopts")[:4] == ["-n", "auto", "--dist", "worksteal"]
