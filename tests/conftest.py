"""Shared fixtures: a tiny random BERT (unit tests) and the shared data directory (integration tests)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from st_hardneg.testing import WORDS, make_tiny_model_dir  # noqa: F401 - re-exported for the tests

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("ST_HARDNEG_SHARED_DATA", REPO.parent / "shared" / "data"))


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
    """The shared SentEval data directory; the tests that need it fail loudly if it is absent."""
    if not (SHARED_DATA / "senteval").is_dir():
        pytest.fail(f"shared data not found at {SHARED_DATA} (set ST_HARDNEG_SHARED_DATA)")
    return SHARED_DATA
