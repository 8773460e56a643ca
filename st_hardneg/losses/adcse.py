"""AdCSE (Li et al., DASFAA 2022): a momentum key encoder and learnable negative adversaries.

This is the only *stateful* st-hardneg loss. Besides the online encoder (the model being trained) it owns

- a **key encoder**: an EMA copy of the online encoder, updated once per optimizer step;
- **negative adversaries**: ``M`` free vectors trained by gradient *ascent* on the contrastive loss with their own
  momentum-SGD, independent of the encoder's optimizer and learning-rate schedule.

How that state follows the training loop (the parts sentence-transformers does not provide; see
:mod:`st_hardneg.training_hooks` for the mechanisms and the library source they rely on):

- **When.** Both updates run in a torch optimizer *step post-hook*, once per completed ``optimizer.step()`` of an
  optimizer that holds the online model's parameters: never per forward, so gradient accumulation does not
  multiply them; with any optimizer (foreach or fused; fused AdamW does not bump ``param._version``, which is why
  versions are not used); and a step skipped by a ``GradScaler`` is not counted, because ``optimizer.step`` is
  then never called. ``model.fit`` (which builds its own optimizer and one LR for all parameters) and
  ``SentenceTransformerTrainer`` both end in ``optimizer.step()``, so both are covered without callbacks, which a
  loss cannot register with sentence-transformers anyway.
- **Adversary gradient.** Computed in ``forward`` with ``torch.autograd.grad`` of the loss at
  ``adversary_temperature`` with respect to a detached copy of the adversaries, with detached anchors and
  candidates, so it touches neither the encoder's graph nor its gradients and is unaffected by AMP loss scaling.
  It is averaged over the micro-batches of an accumulation window and applied at the optimizer step; the window
  restarts whenever the online model's gradients have been cleared (``zero_grad(set_to_none=True)``, the default
  of the Trainer and of torch), which also discards the gradient of a step skipped by a ``GradScaler``.
- **Out of every optimizer.** The adversaries and their velocity are buffers, not parameters, and the key encoder
  is held outside the module tree (not a child module), so ``loss.named_parameters()`` returns only the online
  model's parameters. This matters because the Trainer adds all ``requires_grad`` loss parameters to the
  encoder's optimizer (``BaseTrainer.get_optimizer_cls_and_kwargs``), ``learning_rate_mapping`` matches loss
  parameters without checking ``requires_grad``, and ``model.fit`` puts *every* ``named_parameters()`` entry of
  the loss into its AdamW. It also keeps the key encoder away from ``override_model_in_loss`` (which swaps loss
  children named ``model`` for the DDP-wrapped model) and out of the saved model.
- **Checkpoints.** The key encoder, the adversaries, their velocity and the update counters are stored inside the
  encoder optimizer's ``state_dict()``, which the HF Trainer saves as ``optimizer.pt`` in every checkpoint and
  reloads on ``trainer.train(resume_from_checkpoint=...)`` before the first training forward; at its first forward
  the loss finds the calling Trainer's optimizer and takes its state back. The dropout RNG needs nothing extra:
  the Trainer checkpoints and restores the torch RNG state (``rng_state.pth``). Custom loops: call
  :meth:`AdversarialNegativesLoss.attach_optimizer` before ``optimizer.load_state_dict``.
"""

from __future__ import annotations

import copy
import logging
import math
import operator
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from sentence_transformers.base.losses.merged_forward import embed_columns
from torch import Tensor, nn

from st_hardneg import functional as fn
from st_hardneg import training_hooks
from st_hardneg.losses.base import HardNegativeLoss, check_temperature

logger = logging.getLogger(__name__)

_STATE_FORMAT = 1


@dataclass
class _NotSubmodules:
    """Modules the loss uses but must not register as children (kept out of ``parameters()``, ``state_dict()``,
    ``override_model_in_loss`` and every optimizer)."""

    online: nn.Module
    key_encoder: nn.Module | None


def _check_unit_interval(value: float, name: str) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number in [0, 1), got {value!r}") from None
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value!r}")
    return value


def _check_non_negative(value: float, name: str) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a non-negative number, got {value!r}") from None
    if not (value >= 0.0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return value


class AdversarialNegativesLoss(HardNegativeLoss):
    #: name of this loss's entry in optimizer checkpoints (see :mod:`st_hardneg.training_hooks`)
    checkpoint_name = "AdversarialNegativesLoss"

    def __init__(
        self,
        model,
        num_adversaries: int = 64,
        temperature: float = 0.05,
        momentum: float = 0.995,
        adversary_lr: float = 3e-3,
        adversary_momentum: float = 0.9,
        adversary_weight_decay: float = 1e-4,
        adversary_temperature: float = 0.05,
        untied: bool = True,
        seed: int | None = None,
    ) -> None:
        """
        AdCSE: InfoNCE between an online encoder and a momentum (EMA) key encoder, with ``M`` learnable negative
        adversaries that are trained to *maximise* the same loss (Li et al., DASFAA 2022, following AdCo).

        With ``q_i`` the online embedding of anchor ``i``, ``k_j`` the key-encoder embedding of the positive of pair
        ``j`` (for unsupervised training the same sentence, so the key encoder's weights and dropout are the only
        difference) and ``n_1..n_M`` the adversaries (all L2-normalised), row ``i`` of the loss is a cross-entropy
        with target ``i`` over::

            [q_i·k_1, ..., q_i·k_N, q_i·(explicit negatives), q_i·n_1, ..., q_i·n_M] / τ

        After every optimizer step the key encoder moves towards the online encoder,
        ``θ_k ← m·θ_k + (1-m)·θ_q``, and the adversaries take one momentum-SGD *ascent* step on the same loss
        computed at ``adversary_temperature`` (``v ← μ·v - ∇_n L + wd·n``; ``n ← n - lr·v``, the update of the
        authors' code). The adversaries thus chase the anchors and become ever harder negatives, while the encoder
        learns to push them away: a min-max game over ``min_θq max_n L``.

        Differences from the authors' code (lirenhao1997/AdCSE), all deliberate:

        - The key encoder starts as an exact copy of the online encoder. In the released code it is copied inside
          ``__init__``, before ``from_pretrained`` loads the pretrained weights, so it starts from random weights.
        - Token type ids are the model's own; the released code builds them from the attention mask.
        - The EMA runs once per optimizer step, not once per forward (identical without gradient accumulation).
        - The loss adds no MLP head of its own: the released code trains one on top of [CLS] and drops it for
          evaluation; here that is a model option shared by every loss, ``load_model(..., mlp_head=True)``.
        - Explicit negatives in extra columns are supported, as extra candidates embedded by the key encoder.

        Args:
            model: SentenceTransformer model (the online encoder ``q``).
            num_adversaries: ``M``, the number of negative adversaries (paper: 64, the batch size). ``0`` is the
                paper's "w/o negative adversaries" ablation (MoCo-style in-batch InfoNCE with a momentum encoder).
            temperature: τ > 0 of the encoder's loss (paper: 0.05).
            momentum: ``m`` in [0, 1), the EMA momentum of the key encoder (paper: 0.995).
            adversary_lr: learning rate of the adversaries' momentum-SGD (paper: 3e-3), >= 0. Independent of the
                encoder's optimizer and learning-rate schedule (no warm-up, no decay); ``0`` freezes them.
            adversary_momentum: momentum μ in [0, 1) of the adversaries' SGD (paper: 0.9).
            adversary_weight_decay: L2 weight decay of the adversaries (paper: 1e-4), >= 0.
            adversary_temperature: τ > 0 of the loss whose gradient the adversaries ascend (paper: 0.05).
            untied: ``True`` (paper): positives (and explicit negatives) are embedded by the momentum key encoder.
                ``False`` is the paper's "w/o untied dual-encoder" ablation: they are embedded by the online encoder
                with its own dropout, as in SimCSE, and no key encoder is created.
            seed: seed of the adversaries' random initialisation (standard normal, as in AdCo/AdCSE). ``None`` uses
                torch's global generator: pass the loss to the Trainer as a factory
                (``loss=lambda model: AdversarialNegativesLoss(model)``), which it calls after seeding with
                ``args.seed``, or call ``transformers.set_seed`` before constructing it.

        References:
            - Li et al., "AdCSE: An Adversarial Method for Contrastive Learning of Sentence Embeddings", DASFAA 2022.
            - Code: https://github.com/lirenhao1997/AdCSE
            - Hu et al., "AdCo: Adversarial Contrast for Efficient Learning of Unsupervised Representations from
              Self-Trained Negative Adversaries", CVPR 2021.

        Requirements:
            1. (anchor, positive) pairs; for unsupervised training the same sentence twice. Optionally explicit
               negatives in further columns.
            2. A batch of at least 2 pairs when ``num_adversaries=0`` (the in-batch keys are the only negatives).
            3. A model whose embedding dimension is known (``model.get_embedding_dimension()``) when
               ``num_adversaries > 0``.

        Inputs:
            +-------------------------------------------------+--------+
            | Texts                                           | Labels |
            +=================================================+========+
            | (anchor, positive) pairs                        | none   |
            +-------------------------------------------------+--------+
            | (anchor, positive, negative_1, ..., negative_n) | none   |
            +-------------------------------------------------+--------+

        Recommendations:
            - Memory: ``untied=True`` keeps one extra copy of the encoder's weights and buffers (for BERT-base
              about 110M parameters, 440 MB in float32), on the model's device. It has no gradients and no optimizer
              state (a trainable copy with AdamW would cost three more), and its forward runs under ``no_grad``, so
              it stores no activations. The adversaries cost ``2·M·d`` floats.
            - Checkpoints need nothing extra with ``SentenceTransformerTrainer`` / ``model.fit``: the loss state is
              stored in the optimizer's ``state_dict`` (``optimizer.pt``) and restored by
              ``trainer.train(resume_from_checkpoint=...)``. In a custom loop call :meth:`attach_optimizer` before
              ``optimizer.load_state_dict(...)``, or save :meth:`training_state_dict` yourself. The saved model is
              the online encoder only and loads with plain ``SentenceTransformer(path)``.
            - Use ``BatchSamplers.NO_DUPLICATES``: a duplicate sentence in a batch is a false negative of itself.
            - Several AdCSE losses on one optimizer are checkpointed in the order in which they first run.
            - Under DDP the adversaries' gradient is averaged over the processes before each update, so they stay
              identical on all ranks.

        Relations:
            - With ``num_adversaries=0`` and ``untied=False`` this is ST's ``MultipleNegativesRankingLoss``
              (unsupervised SimCSE) with ``scale = 1/τ``.
            - :class:`~st_hardneg.MixCSELoss` and :class:`~st_hardneg.HNCSELoss` *construct* hard negatives from the
              batch; here they are *learned* adversarially and shared by all anchors.

        Example:
            ::

                from datasets import Dataset
                from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
                from sentence_transformers.base.sampler import BatchSamplers
                from st_hardneg import AdversarialNegativesLoss
                from st_hardneg.models import load_default_model

                model = load_default_model()  # all-MiniLM-L6-v2 with CLS pooling, max_seq_length 32
                sentences = ["A man is playing a guitar.", "A woman is slicing an onion.", "The sky is blue."]
                train_dataset = Dataset.from_dict({"anchor": sentences, "positive": sentences})
                args = SentenceTransformerTrainingArguments(
                    output_dir="out", batch_sampler=BatchSamplers.NO_DUPLICATES, per_device_train_batch_size=64,
                    learning_rate=3e-5, save_steps=125,
                )
                trainer = SentenceTransformerTrainer(
                    model=model, args=args, train_dataset=train_dataset,
                    loss=lambda m: AdversarialNegativesLoss(m, num_adversaries=64),  # seeded by args.seed
                )
                trainer.train()  # later: trainer.train(resume_from_checkpoint=True) restores the loss state too
        """
        super().__init__(model, temperature)
        if isinstance(num_adversaries, bool):
            raise ValueError(f"num_adversaries must be a non-negative integer, got {num_adversaries!r}")
        try:
            num_adversaries = operator.index(num_adversaries)
        except TypeError:
            raise ValueError(f"num_adversaries must be a non-negative integer, got {num_adversaries!r}") from None
        if num_adversaries < 0:
            raise ValueError(f"num_adversaries (M) must be >= 0, got {num_adversaries}")
        if not isinstance(untied, bool):
            raise ValueError(f"untied must be True or False, got {untied!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed must be an int or None, got {seed!r}")
        self.num_adversaries = num_adversaries
        self.momentum = _check_unit_interval(momentum, "momentum (m, the key encoder's EMA momentum)")
        self.adversary_lr = _check_non_negative(adversary_lr, "adversary_lr")
        self.adversary_momentum = _check_unit_interval(adversary_momentum, "adversary_momentum")
        self.adversary_weight_decay = _check_non_negative(adversary_weight_decay, "adversary_weight_decay")
        self.adversary_temperature = check_temperature(adversary_temperature, "adversary_temperature")
        self.untied = untied
        self.seed = seed
        # With adversaries a single pair still has negatives.
        self.min_batch_size = 1 if num_adversaries > 0 else 2

        dim = self._embedding_dimension(model)
        if num_adversaries > 0 and dim is None:
            raise ValueError(
                "AdversarialNegativesLoss needs the model's embedding dimension for its adversaries, but "
                "model.get_embedding_dimension() returned None."
            )
        self.embedding_dim = dim or 0
        device = self._device_of(model)
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        adversaries = torch.randn(num_adversaries, self.embedding_dim, generator=generator)
        self.register_buffer("adversaries", adversaries.to(device))
        self.register_buffer("adversary_velocity", torch.zeros_like(self.adversaries))

        key_encoder = self._copy_encoder(model) if untied else None
        self._modules_outside = _NotSubmodules(online=model, key_encoder=key_encoder)
        self._ema_updates = 0
        self._adversary_updates = 0
        self._adversary_grad: Tensor | None = None
        self._adversary_grad_count = 0
        self._owned_optimizers: Any = weakref.WeakSet()
        self._checked_model_id = id(model)
        training_hooks.add_step_listener(self)

    # ------------------------------------------------------------------ construction helpers
    @staticmethod
    def _embedding_dimension(model: nn.Module) -> int | None:
        for name in ("get_embedding_dimension", "get_sentence_embedding_dimension"):
            getter = getattr(model, name, None)
            if callable(getter):
                dim = getter()
                if dim is not None:
                    return int(dim)
        return None

    @staticmethod
    def _device_of(model: nn.Module) -> torch.device:
        param = next(model.parameters(), None)
        return param.device if param is not None else torch.device("cpu")

    @staticmethod
    def _copy_encoder(model: nn.Module) -> nn.Module:
        """An exact, frozen copy of ``model`` in train mode (dropout on); shares only the model card data."""
        memo = {}
        card = getattr(model, "model_card_data", None)
        if card is not None:
            memo[id(card)] = card  # metadata (datasets, widget, ...) need not be copied
        key_encoder = copy.deepcopy(model, memo)
        key_encoder.requires_grad_(False)
        key_encoder.train()
        return key_encoder

    def __setstate__(self, state: dict[str, Any]) -> None:
        # deepcopy / unpickling bypass __init__: keep the copy listening to optimizer steps.
        super().__setstate__(state)
        self._owned_optimizers = weakref.WeakSet()
        training_hooks.add_step_listener(self)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_owned_optimizers", None)  # weak references do not copy or pickle
        return state

    # ------------------------------------------------------------------ public state
    @property
    def key_encoder(self) -> nn.Module | None:
        """The momentum (EMA) key encoder; ``None`` when ``untied=False``. Frozen, always in train mode."""
        return self._modules_outside.key_encoder

    @property
    def online_model(self) -> nn.Module:
        """The (unwrapped) online encoder this loss was built for."""
        return self._modules_outside.online

    @property
    def ema_updates(self) -> int:
        """Number of EMA updates of the key encoder so far (= optimizer steps of the online model)."""
        return self._ema_updates

    @property
    def adversary_updates(self) -> int:
        """Number of momentum-SGD ascent steps of the adversaries so far."""
        return self._adversary_updates

    def attach_optimizer(self, optimizer: torch.optim.Optimizer) -> bool:
        """Checkpoint this loss inside ``optimizer.state_dict()`` and restore it from ``optimizer.load_state_dict``.

        Automatic with the sentence-transformers Trainer and ``model.fit``. In a custom training loop call it once,
        before ``optimizer.load_state_dict(...)`` when resuming. Returns ``True`` if a saved state was waiting in the
        optimizer and has been restored now.
        """
        return training_hooks.attach_to_optimizer(self, optimizer)

    def training_state_dict(self) -> dict[str, Any]:
        """Everything that training changes besides the online model: key encoder, adversaries, their velocity,
        update counters. The tensors are references (like ``state_dict()``), not copies."""
        state: dict[str, Any] = {
            "format": _STATE_FORMAT,
            "num_adversaries": self.num_adversaries,
            "embedding_dim": self.embedding_dim,
            "untied": self.untied,
            "adversaries": self.adversaries,
            "adversary_velocity": self.adversary_velocity,
            "ema_updates": self._ema_updates,
            "adversary_updates": self._adversary_updates,
        }
        if self.key_encoder is not None:
            state["key_encoder"] = self.key_encoder.state_dict()
        return state

    @torch.no_grad()
    def load_training_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`training_state_dict` (from a checkpoint of the same configuration)."""
        if state.get("format") != _STATE_FORMAT:
            raise ValueError(f"Unknown AdversarialNegativesLoss state format {state.get('format')!r}")
        expected = {"num_adversaries": self.num_adversaries, "embedding_dim": self.embedding_dim,
                    "untied": self.untied}
        found = {key: state.get(key) for key in expected}
        if found != expected:
            raise ValueError(f"The saved AdversarialNegativesLoss state was made with {found}, this loss has {expected}")
        self.adversaries.copy_(state["adversaries"])
        self.adversary_velocity.copy_(state["adversary_velocity"])
        if self.key_encoder is not None:
            self.key_encoder.load_state_dict(state["key_encoder"])
        self._ema_updates = int(state["ema_updates"])
        self._adversary_updates = int(state["adversary_updates"])
        self._reset_adversary_gradient()

    # ------------------------------------------------------------------ forward
    def forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor | None) -> Tensor:
        sentence_features = list(sentence_features)
        self._check_online_model()
        self._attach_to_calling_trainer()
        if not self.untied:
            embeddings = embed_columns(self.model, sentence_features)
        else:
            anchors = self.model(sentence_features[0])["sentence_embedding"]
            keys: list[Tensor] = []
            if len(sentence_features) > 1:
                key_encoder = self._key_encoder_on(anchors.device)
                with torch.no_grad():
                    keys = embed_columns(key_encoder, sentence_features[1:], separate_first=False)
            embeddings = [anchors, *keys]
        return self.compute_loss_from_embeddings(embeddings, labels)

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        """The loss on given embeddings ``[anchors (online), keys, explicit negatives...]``; while training (grad
        enabled), also accumulates the adversaries' ascent gradient for the next optimizer step."""
        batch = self.split_batch(embeddings)
        candidates = batch.candidates
        if self.num_adversaries:
            candidates = torch.cat([candidates, self.adversaries.detach()], dim=0)
        cos = fn.candidate_cosines(batch.anchors, candidates)
        loss = fn.info_nce(fn.contrastive_logits(cos, self.temperature))
        self.record_stats(cos, num_in_batch=batch.size, num_synthetic=self.num_adversaries)
        if self.num_adversaries and self.training and torch.is_grad_enabled():
            self._accumulate_adversary_gradient(batch.anchors.detach(), batch.candidates.detach())
        return loss

    # ------------------------------------------------------------------ adversaries
    def adversary_loss(self, anchors: Tensor, candidates: Tensor, adversaries: Tensor) -> Tensor:
        """The loss whose gradient the adversaries ascend: InfoNCE at ``adversary_temperature`` over
        ``[anchor·candidates, anchor·normalize(adversaries)]``."""
        cos = fn.candidate_cosines(anchors, torch.cat([candidates, adversaries], dim=0))
        return fn.info_nce(fn.contrastive_logits(cos, self.adversary_temperature))

    def _accumulate_adversary_gradient(self, anchors: Tensor, candidates: Tensor) -> None:
        if self._adversary_grad_count and not self._online_has_gradients():
            # The encoder's gradients were cleared since the last micro-batch without a step reaching us (e.g. a
            # GradScaler-skipped step): start a new accumulation window, as the encoder does.
            self._reset_adversary_gradient()
        with torch.enable_grad(), torch.autocast(device_type=anchors.device.type, enabled=False):
            adversaries = self.adversaries.detach().float().requires_grad_(True)
            loss = self.adversary_loss(anchors.float(), candidates.float(), adversaries)
            (grad,) = torch.autograd.grad(loss, adversaries)
        if self._adversary_grad is None:
            self._adversary_grad = grad
        else:
            self._adversary_grad += grad
        self._adversary_grad_count += 1

    def _reset_adversary_gradient(self) -> None:
        self._adversary_grad = None
        self._adversary_grad_count = 0

    def _online_has_gradients(self) -> bool:
        return any(p.grad is not None for p in self.online_model.parameters())

    @torch.no_grad()
    def _step_adversaries(self) -> None:
        grad = self._adversary_grad / self._adversary_grad_count
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            world_size = torch.distributed.get_world_size()
            if world_size > 1:
                torch.distributed.all_reduce(grad)
                grad /= world_size
        # Momentum SGD on -L (ascent), weight decay inside the velocity, as torch.optim.SGD and the authors' code.
        direction = (-grad).add_(self.adversaries.float(), alpha=self.adversary_weight_decay)
        self.adversary_velocity.mul_(self.adversary_momentum).add_(direction.to(self.adversary_velocity.dtype))
        self.adversaries.sub_(self.adversary_velocity, alpha=self.adversary_lr)
        self._adversary_updates += 1

    # ------------------------------------------------------------------ key encoder
    def _key_encoder_on(self, device: torch.device) -> nn.Module:
        key_encoder = self.key_encoder
        param = next(key_encoder.parameters(), None)
        if param is not None and param.device != device:
            key_encoder.to(device)
        if not key_encoder.training:
            key_encoder.train()
        return key_encoder

    @torch.no_grad()
    def _update_key_encoder(self) -> None:
        """θ_k ← m·θ_k + (1-m)·θ_q for every parameter (buffers are left as copied)."""
        online = dict(self.online_model.named_parameters())
        keys, sources = [], []
        for name, key_param in self.key_encoder.named_parameters():
            source = online.get(name)
            if source is None or source.shape != key_param.shape:
                raise RuntimeError(
                    f"The online model no longer matches its key encoder at parameter {name!r}; was the model "
                    "modified after AdversarialNegativesLoss was created?"
                )
            keys.append(key_param)
            sources.append(source.detach().to(device=key_param.device, dtype=key_param.dtype))
        if keys:
            torch._foreach_lerp_(keys, sources, 1.0 - self.momentum)
        self._ema_updates += 1

    # ------------------------------------------------------------------ training-loop integration
    def _check_online_model(self) -> None:
        """``self.model`` may be a wrapper of the online model (DDP, compile), never another model."""
        if id(self.model) == self._checked_model_id:
            return
        if next(self.model.parameters(), None) is not next(self.online_model.parameters(), None):
            raise RuntimeError(
                "AdversarialNegativesLoss is asked to train another model than the one it was built for (e.g. the "
                "Trainer's model_init replaced loss.model); its key encoder is a copy of the old model. Build the "
                "loss for the model that is trained; model_init is not supported."
            )
        self._checked_model_id = id(self.model)

    def _owns(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether ``optimizer`` steps the online model (cached per optimizer once true)."""
        if optimizer in self._owned_optimizers:
            return True
        online_ids = {id(p) for p in self.online_model.parameters()}
        if any(id(p) in online_ids for group in optimizer.param_groups for p in group["params"]):
            self._owned_optimizers.add(optimizer)
            return True
        return False

    def _attach_to_calling_trainer(self) -> None:
        trainer = training_hooks.find_calling_trainer()
        optimizer = getattr(trainer, "optimizer", None) if trainer is not None else None
        if optimizer is None:
            return
        optimizer = training_hooks.unwrap_optimizer(optimizer)
        if not training_hooks.is_attached(self, optimizer) and self._owns(optimizer):
            self.attach_optimizer(optimizer)

    def _after_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Called by :mod:`st_hardneg.training_hooks` after every completed ``step()`` of any optimizer."""
        if not self._owns(optimizer):
            return
        if not training_hooks.is_attached(self, optimizer) and self.attach_optimizer(optimizer):
            logger.warning(
                "AdversarialNegativesLoss restored its checkpointed state only at the first optimizer step after "
                "resuming, so that step used a fresh key encoder and fresh adversaries. In a custom training loop "
                "call loss.attach_optimizer(optimizer) before optimizer.load_state_dict(...)."
            )
        if self.untied:
            self._update_key_encoder()
        if self.num_adversaries and self._adversary_grad_count:
            self._step_adversaries()
        self._reset_adversary_gradient()

    # ------------------------------------------------------------------ config
    def get_config_dict(self) -> dict[str, Any]:
        return {
            "num_adversaries": self.num_adversaries,
            "temperature": self.temperature,
            "momentum": self.momentum,
            "adversary_lr": self.adversary_lr,
            "adversary_momentum": self.adversary_momentum,
            "adversary_weight_decay": self.adversary_weight_decay,
            "adversary_temperature": self.adversary_temperature,
            "untied": self.untied,
            "seed": self.seed,
        }

    @property
    def citation(self) -> str:
        return """
@inproceedings{li2022adcse,
    title={AdCSE: An Adversarial Method for Contrastive Learning of Sentence Embeddings},
    author={Li, Renhao and Duan, Lei and Xie, Guicai and Xiao, Shan and Jiang, Weipeng},
    booktitle={Database Systems for Advanced Applications (DASFAA 2022)},
    publisher={Springer},
    year={2022}
}
"""
