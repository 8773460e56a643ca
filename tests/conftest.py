"""Shared fixtures: a tiny random BERT (unit tests), the shared data directory (integration tests), and a working
directory of each test's own (no test reads or writes the repository's output folders)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from st_hardneg.data.senteval import ENV_DATA_DIR, data_dir_from_env
from st_hardneg.testing import WORDS, make_tiny_model_dir  # noqa: F401 - re-exported for the tests

REPO = Path(__file__).resolve().parents[1]
#: ``$ST_HARDNEG_DATA`` (the library's one data variable), else ``../shared/data`` beside the repository
SHARED_DATA = Path(data_dir_from_env() or REPO.parent / "shared" / "data")
#: set to 1 (``.ci/run`` does) to make missing shared data a failure instead of a skip
REQUIRE_DATA = os.environ.get("ST_HARDNEG_REQUIRE_DATA", "") not in ("", "0")
#: the most pytest-xdist workers ``-n auto`` starts: each holds its own torch and, in the integration tests, a MiniLM
MAX_AUTO_WORKERS = 4


def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto`` (the README's test command): one worker per core, at most :data:`MAX_AUTO_WORKERS`."""
    return max(1, min(MAX_AUTO_WORKERS, os.cpu_count() or 1))


def pytest_configure(config) -> None:
    """In a pytest-xdist worker, torch gets the worker's share of the cores (``torch.set_num_threads``, and
    ``OMP_NUM_THREADS`` for the commands the tests start): workers at torch's default of every core each would
    oversubscribe the cores, and torch's waiting threads then spin instead of computing."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers:
        import torch

        threads = max(1, (os.cpu_count() or 1) // workers)
        torch.set_num_threads(threads)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))


@pytest.fixture(autouse=True)
def own_working_directory(tmp_path_factory, monkeypatch):
    """Every test runs in an empty working directory of its own: the README's commands may have left
    ``output/``, ``results/`` or ``out/`` in the clone, and no test reads or writes them."""
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture
def tiny_model(tiny_model_dir):
    """A fresh SentenceTransformer (tiny random BERT + CLS pooling, max_seq_length 32) for each test."""
    from st_hardneg.models import load_model

    return load_model(tiny_model_dir, pooling="cls", max_seq_length=32, device="cpu")


@pytest.fixture
def tiny_sentences() -> list[str]:
    return [
        "a man plays the guitar.", "a woman plays the piano.", "the dog runs in the park.",
        "the cat eats food.", "children read a book.", "the sky is blue.", "people walk to the station.",
        "one car drives on the road.", "the sun is hot.", "rain in the city at night.",
        "two children eat bread.", "a train at the station.", "the house is red.", "she writes a letter.",
        "snow is cold.", "three apples and water.",
    ]


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared data directory (SentEval, the corpus, the BEIR folders). Without it the tests that need it are
    skipped with the reason and the way to get it, unless ``ST_HARDNEG_REQUIRE_DATA=1`` makes that a failure."""
    if not (SHARED_DATA / "senteval").is_dir():
        message = (f"shared data not found at {SHARED_DATA}: set {ENV_DATA_DIR} to the folder holding senteval/, "
                   "corpus/ and retrieval/ (`st-hardneg download senteval --dest DIR` fetches SentEval)")
        if REQUIRE_DATA:
            pytest.fail(message + " (ST_HARDNEG_REQUIRE_DATA is set)")
        pytest.skip(message)
    return SHARED_DATA
