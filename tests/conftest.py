"""Shared fixtures: a tiny random BERT (unit tests) and the shared data directory (integration tests)."""

from __future__ import annotations

import os
import string
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("ST_HARDNEG_SHARED_DATA", REPO.parent / "shared" / "data"))

WORDS = (
    "a an the is are was be to of and in on at for with by from man woman dog cat plays playing guitar piano "
    "music sky blue red green car drives road house city people child children eats food apple bread water "
    "runs walks park sun rain snow cold hot day night book reads writes letter train station one two three"
).split()


def make_tiny_model_dir(path: Path, seed: int = 0, hidden: int = 32) -> Path:
    """Save a randomly initialised 2-layer BERT with a small WordPiece vocabulary to ``path``."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *string.ascii_lowercase, *string.digits, ".", ",", "!",
             "?", "'", *WORDS]
    vocab += ["##" + c for c in string.ascii_lowercase]
    (path / "vocab.txt").write_text("\n".join(dict.fromkeys(vocab)) + "\n")
    tokenizer = BertTokenizerFast(vocab_file=str(path / "vocab.txt"), do_lower_case=True)
    tokenizer.save_pretrained(path)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=2 * hidden, max_position_embeddings=128, hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
    )
    BertModel(config).save_pretrained(path)
    return path


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
