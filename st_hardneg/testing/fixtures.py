"""Test helpers: a tiny, randomly initialised BERT that builds offline in a second.

Used by the test suite, the benchmarks' dry runs (``benchmarks/studies/paper_protocol_dry_run.json``,
a spec run with ``--set model=PATH``) and the notebooks' smoke mode, so every code path can be exercised without
downloading a model.

>>> from st_hardneg.testing.fixtures import make_tiny_model_dir
>>> path = make_tiny_model_dir(Path("/tmp/tiny-bert"))  # doctest: +SKIP
"""

from __future__ import annotations

import math
import string
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor, nn

    from st_hardneg.functional import Alpha, PositiveMix
    from st_hardneg.losses.hncse import HNCSELoss

#: the words of the tiny WordPiece vocabulary (enough for the test sentences; the rest falls back to characters)
WORDS = (
    "a an the is are was be to of and in on at for with by from man woman dog cat plays playing guitar piano "
    "music sky blue red green car drives road house city people child children eats food apple bread water "
    "runs walks park sun rain snow cold hot day night book reads writes letter train station one two three"
).split()


#: sentence-transformers' symmetric form (MultipleNegativesSymmetricRankingLoss): both directions, one softmax each
SYMMETRIC = {"directions": ("query_to_doc", "doc_to_query"), "partition_mode": "per_direction"}


def two_way(symmetric: bool) -> dict:
    """The keyword arguments of a loss's symmetric form (:data:`SYMMETRIC`) when ``symmetric``, else none."""
    return dict(SYMMETRIC) if symmetric else {}


def make_tiny_model_dir(path: str | Path, seed: int = 0, hidden: int = 32) -> Path:
    """Save a randomly initialised 2-layer BERT with a small WordPiece vocabulary to ``path``; returns ``path``.

    The directory holds ``config.json``, ``model.safetensors`` and the tokenizer files, i.e. what
    :func:`st_hardneg.models.load_model` expects from a Hugging Face encoder.

    Args:
        path: target directory (created if needed).
        seed: seed of the random weights.
        hidden: hidden size (2 attention heads, intermediate size ``2 * hidden``, 128 positions).
    """
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *string.ascii_lowercase, *string.digits, ".", ",", "!",
             "?", "'", *WORDS]
    vocab += ["##" + c for c in string.ascii_lowercase]
    return _save_tiny_bert(path, vocab, seed, hidden)


def make_text_model_dir(path: str | Path, texts: Iterable[str], seed: int = 0, hidden: int = 32) -> Path:
    """Like :func:`make_tiny_model_dir`, but the vocabulary holds every whitespace-separated word of ``texts`` (and
    ``##`` pieces for every letter and digit), so that distinct texts get distinct embeddings: what equality tests
    against another evaluator need (no artificial ties). Returns ``path``.

    Raises:
        AssertionError: the saved tokenizer does not split the first text into its words.
    """
    from transformers import BertTokenizerFast  # type: ignore[attr-defined]  # a lazy alias of BertTokenizer

    texts = list(texts)
    words = sorted({w for text in texts for w in text.lower().split()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *string.ascii_lowercase, *string.digits, *".,!?'-",
             *words, *("##" + c for c in string.ascii_lowercase + string.digits)]
    path = _save_tiny_bert(path, vocab, seed, hidden)
    if texts:
        tokens = BertTokenizerFast.from_pretrained(path).tokenize(texts[0])
        assert tokens == texts[0].lower().split(), f"tokenizer splits {texts[0]!r} into {tokens}"
    return path


def _save_tiny_bert(path: str | Path, vocab: list[str], seed: int, hidden: int) -> Path:
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast  # type: ignore[attr-defined]  # lazy alias

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("\n".join(dict.fromkeys(vocab)) + "\n")
    tokenizer = BertTokenizerFast(vocab=str(path / "vocab.txt"), do_lower_case=True)
    tokenizer.save_pretrained(path)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=2 * hidden, max_position_embeddings=128, hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
    )
    BertModel(config).save_pretrained(path)
    return path


#: the SentEval files of :func:`make_mini_senteval` → keep every k-th line (STS-B dev / test: 300 / 276 pairs,
#: TREC train / test: 546 / 250 questions)
MINI_SENTEVAL_FILES = {"STS/STSBenchmark/sts-dev.csv": 5, "STS/STSBenchmark/sts-test.csv": 5,
                       "TREC/train_5500.label": 10, "TREC/TREC_10.label": 2}


def make_mini_senteval(source: str | Path | None, dest: str | Path) -> Path:
    """A small SentEval directory for smoke runs: every k-th line of the files in :data:`MINI_SENTEVAL_FILES`.

    It holds the tasks ``STSBenchmark-dev``, ``STSBenchmark`` and ``TREC`` (enough for model selection, an STS
    score, an alignment–uniformity plot and one transfer task), in the original formats, so every evaluation code path
    runs unchanged, in seconds.

    Args:
        source: the full SentEval data (anything :func:`st_hardneg.data.senteval.resolve_senteval_dir` accepts).
        dest: target directory (created); usable as ``data_dir``.

    Returns:
        ``dest``.
    """
    from st_hardneg.data.senteval import resolve_senteval_dir

    root = resolve_senteval_dir(source)
    dest = Path(dest)
    for rel, every in MINI_SENTEVAL_FILES.items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        lines = (root / rel).read_bytes().splitlines(keepends=True)  # bytes: TREC's train file is Latin-1
        target.write_bytes(b"".join(lines[::every]))
    return dest


def parameter_snapshot(model: nn.Module) -> dict:
    """A detached copy of every named parameter, to check later that training changed the weights."""
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def parameters_changed(model: nn.Module, before: dict) -> bool:
    """Whether any parameter differs from the :func:`parameter_snapshot` ``before``."""
    import torch

    return any(not torch.equal(before[name], p.detach()) for name, p in model.named_parameters())


def record_loss_values(loss: nn.Module) -> list[float]:
    """A list that receives the value of every forward of ``loss`` (a forward hook)."""
    values: list[float] = []
    loss.register_forward_hook(lambda module, args, output: values.append(output.detach().item()))
    return values


# --------------------------------------------------------------------------- reference math for the loss tests
def cosf(a: Tensor, b: Tensor) -> float:
    """Cosine of two vectors in float64, written out (an independent reference, not the library's normalize)."""
    a, b = a.double(), b.double()
    return float((a * b).sum() / (a.norm() * b.norm()))


def unit(v: Tensor) -> Tensor:
    """``v`` scaled to unit length in float64."""
    v = v.double()
    return v / v.norm()


def ce(logits: Sequence[float], target: int) -> float:
    """Cross-entropy of a list of logits with the ``target`` index, via a stable log-sum-exp in plain Python."""
    top = max(logits)
    return -(logits[target] - top - math.log(sum(math.exp(x - top) for x in logits)))


# --------------------------------------------------------------------------- HNCSE's mixing steps, standalone
# HNCSELoss runs these steps inside compute_loss_from_embeddings; the tests call them through the functional API with
# a loss's settings (and its random generator) to check the mixtures themselves against hand computations.
def hncse_positive_mixing(loss: HNCSELoss, anchors: Tensor, positives: Tensor) -> PositiveMix:
    """Positive mixing (HNCSE Eq. 2) of ``anchors`` / ``positives`` with ``loss``'s settings: a ``PositiveMix``."""
    from st_hardneg import functional as fn

    return fn.positive_mixing(anchors, positives, loss.pm_threshold, loss.w1, loss.w2, single=loss.pm_single,
                              detach_mix=not loss.pm_gradient, weight_gradient=loss.pm_weight_gradient)


def hncse_synthetic_negatives(loss: HNCSELoss, anchors: Tensor, pool: Tensor) -> Tensor:
    """The (N, S, d) explicit HNM mixtures of each anchor, mined in ``pool``, drawn from ``loss``'s generator."""
    from st_hardneg import functional as fn

    synthetic = fn.hard_negative_mixing(anchors, pool, loss.effective_k(anchors.size(0)), loss.num_mixed,
                                        alpha=_hncse_alpha(loss), generator=loss.generator(anchors.device),
                                        single=loss.hnm_single)
    return synthetic if loss.hnm_gradient else synthetic.detach()


def hncse_synthetic_cosines(loss: HNCSELoss, anchors: Tensor, pool: Tensor) -> Tensor:
    """The (N, S) cosines with the same mixtures (same draws), computed without building them."""
    from st_hardneg import functional as fn

    anchors, pool = fn.normalize(anchors), fn.normalize(pool)
    return fn.hard_negative_mixing_cosines(
        anchors, pool, loss.effective_k(anchors.size(0)), loss.num_mixed, alpha=_hncse_alpha(loss),
        generator=loss.generator(anchors.device), detach_pool=not loss.hnm_gradient, similarity=anchors @ pool.T,
        assume_normalized=True)


def _hncse_alpha(loss: HNCSELoss) -> Alpha:
    from st_hardneg import functional as fn

    return fn.ALPHA_FUNCTIONS[loss.alpha] if isinstance(loss.alpha, str) else loss.alpha
