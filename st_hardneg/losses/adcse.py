"""AdCSE (Li et al., DASFAA 2022): a momentum key encoder and learnable negative adversaries.

The only *stateful* st-hardneg loss, assembled from reusable pieces: the key encoder is a
:func:`~st_hardneg.losses.momentum.frozen_copy` moved by :func:`~st_hardneg.losses.momentum.update_momentum`, the adversaries a
:class:`~st_hardneg.losses.adversaries.NegativeAdversaries` bank, and the training-loop attachment (an optimizer
step post-hook, plus :class:`~st_hardneg.training.callbacks.StatefulLossCallback` for resuming) is explained in
:mod:`st_hardneg.losses.stateful`.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Unpack, cast

import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.losses.merged_forward import embed_columns
from torch import Tensor, nn

from st_hardneg import functional as fn
from st_hardneg import validation
from st_hardneg.functional import ranking as fr
from st_hardneg.losses import distributed as dist
from st_hardneg.losses import stateful
from st_hardneg.losses.adversaries import NegativeAdversaries
from st_hardneg.losses.base import HardNegativeLoss, LossOptions, SharedOptions
from st_hardneg.losses.batch import Batch
from st_hardneg.losses.momentum import frozen_copy, update_momentum
from st_hardneg.losses.routes import column_routes

if TYPE_CHECKING:
    from st_hardneg.losses.queue import QueueRead

_STATE_FORMAT = 1


def _unwrapped(model: nn.Module) -> nn.Module:
    """``model`` without the wrappers that share its parameters (DDP ``.module``, ``torch.compile``'s
    ``._orig_mod``)."""
    for _ in range(8):
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            break
        model = inner
    return model


class AdversarialNegativesLoss(stateful.OptimizerDrivenLoss, HardNegativeLoss):
    queue_pool_refusal = ("AdCSE's adversaries are learned vectors, not chosen from the candidates, so the queue is "
                          "its denominator only")

    #: name of this loss's entry in optimizer checkpoints (see :mod:`st_hardneg.losses.stateful`)
    checkpoint_name = "AdversarialNegativesLoss"
    _state_synced = False
    # set in __dict__ by __init__ (not child modules)
    _online: nn.Module
    _key_encoder: nn.Module | None

    def __init__(
        self,
        model: SentenceTransformer,
        guide: SentenceTransformer | None = None,
        *,
        num_adversaries: int = 64,
        momentum: float = 0.995,
        adversary_lr: float = 3e-3,
        adversary_momentum: float = 0.9,
        adversary_weight_decay: float = 1e-4,
        adversary_temperature: float = 0.05,
        untied: bool = True,
        in_batch_keys: bool = True,
        **options: Unpack[LossOptions],
    ) -> None:
        """
        AdCSE: InfoNCE between an online encoder and a momentum (EMA) key encoder, with ``M`` learnable negative
        adversaries that are trained to *maximise* the same loss (Li et al., DASFAA 2022, following AdCo).

        With ``q_i`` the online embedding of anchor ``i``, ``k_j`` the key-encoder embedding of the positive of pair
        ``j`` (unsupervised: the same sentence, so the key encoder's weights and dropout are the only difference) and
        ``n_1..n_M`` the adversaries (all L2-normalised), row ``i`` is a cross-entropy with target ``i`` over::

            [q_i·k_1, ..., q_i·k_N, q_i·(explicit negatives), q_i·n_1, ..., q_i·n_M] / τ

        After every optimizer step the key encoder moves towards the online encoder,
        ``θ_k ← m·θ_k + (1-m)·θ_q``, and the adversaries take one momentum-SGD *ascent* step on the same loss
        at ``adversary_temperature`` (``v ← μ·v - ∇_n L + wd·n``; ``n ← n - lr·v``, as in the authors' code): a
        min-max game ``min_θq max_n L``. See the module docstring for how this follows the training loop.

        Differences from the paper (Eq. 5) and the authors' code (lirenhao1997/AdCSE), all deliberate:

        - **Denominator.** By default it also holds the other pairs' keys ``k_j`` (j ≠ i), as in the authors'
          code and SimCSE; Eq. 5 has only the positive and the adversaries: ``in_batch_keys=False``.
        - **Key-side head.** The paper's key encoder has its own pooling head ``g_θp``; here the key encoder is an
          EMA copy of the *whole* online model, so an MLP head (``load_model(..., mlp_head=True)``) is EMA-copied
          with it. The loss adds no head of its own (the authors' code trains one and drops it for evaluation).
        - The key encoder starts as an exact copy of the online encoder (the released code copies it before loading
          the pretrained weights); token type ids are the model's own; the EMA runs once per optimizer step, not
          per forward; explicit negatives in extra columns are supported (embedded by the key encoder).

        Args:
            model: SentenceTransformer model (the online encoder ``q``).
            guide: optional guide model for false-negative filtering, as in ``GISTEmbedLoss(model, guide)``.
            num_adversaries: ``M`` >= 0 (paper: 64, the batch size). ``0`` is the paper's "w/o negative
                adversaries" ablation (MoCo-style in-batch InfoNCE with a momentum encoder).
            temperature: τ > 0 of the encoder's loss (paper: 0.05).
            momentum: ``m`` in [0, 1), the EMA momentum of the key encoder (paper: 0.995).
            adversary_lr: learning rate >= 0 of the adversaries' momentum-SGD (paper: 3e-3), with no warm-up or
                decay; ``0`` freezes them.
            adversary_momentum: momentum μ in [0, 1) of the adversaries' SGD (paper: 0.9).
            adversary_weight_decay: L2 weight decay >= 0 of the adversaries (paper: 1e-4).
            adversary_temperature: τ > 0 of the loss whose gradient the adversaries ascend (paper: 0.05).
            untied: ``True`` (paper): positives (and explicit negatives) are embedded by the momentum key encoder.
                ``False`` is the "w/o untied dual-encoder" ablation: embedded by the online encoder with its own
                dropout, as in SimCSE; no key encoder is created. On a ``Router`` model (query and document towers,
                ``router_mapping``) only the columns that take the anchors' route go through the key encoder; the
                columns routed to the other tower go through the live model, with gradient, so that both towers
                train (:meth:`key_columns` says why this is the paper's case: the Router already unties the
                encoders of queries and documents); with ``queue_source="ema"`` that is refused (use ``"online"``). With a queue (``queue_size``): untied, the queued
                rows are the key encoder's under either ``queue_source`` (``queue_momentum`` does not apply: the
                encoder moves with ``momentum``, dropout on in training as in the paper); tied with ``queue_source="ema"``, the
                queue keeps its own key encoder like the other losses.
            in_batch_keys: ``True`` (default): the other pairs' keys and all explicit negatives are negatives of
                every anchor. ``False``: paper Eq. 5, row ``i`` sees only its positive, its own explicit negatives
                and the adversaries (needs ``num_adversaries > 0``).
            **options: the options of sentence-transformers' ``MultipleNegativesRankingLoss`` / ``GISTEmbedLoss`` and
                st-hardneg's shared ones, keyword-only, documented on :class:`~st_hardneg.HardNegativeLoss`:
                ``scale`` or ``temperature``, ``similarity_fct``, ``directions``, ``partition_mode``,
                ``hardness_mode``, ``hardness_strength``, ``seed``, ``mask_duplicates`` (default on), ``margin``,
                ``margin_strategy``, ``contrast_anchors``, ``contrast_positives``, ``gather_across_devices``,
                ``mini_batch_size``, ``mini_batch_num_tokens``, ``show_progress_bar``.
                Here: the adversaries are extra columns of the ``query_to_doc`` direction (the paper's); further
                ``directions`` use the keys as documents; ST's hardness penalty applies to ST's columns, not to the
                adversaries; ``similarity_fct=dot_score`` needs ``num_adversaries=0`` (the adversaries live on the
                unit sphere, as in AdCo).
                Here: a masked key or explicit negative leaves the denominator of the encoder's and of the
                adversaries' loss (the adversaries are never masked). The adversaries alone do not make a row
                usable (the rule of every loss, :meth:`~st_hardneg.losses.blocks.Ranking.unusable_rows`): with
                ``in_batch_keys=True`` a row whose every in-batch key and explicit negative is masked is left out of
                the mean and counted in ``rows_without_negatives`` (the first such batch warns), and a batch of
                only such rows is a ``ValueError``; the adversaries' ascent gradient still reads every row. The margin's similarities are the online
                encoder's; ``seed`` seeds the adversaries' standard-normal initialisation (``None``: torch's global
                generator; a loss factory ``loss=lambda m: AdversarialNegativesLoss(m)`` is built after the Trainer
                seeds it). ``gather_across_devices`` gathers the online anchors and the key-encoder keys (and explicit
                negatives); the adversaries' ascent gradient is computed on the global batch, so the adversaries and
                the EMA key encoder stay identical on all processes. ``mini_batch_size``: with ``untied=True`` only
                the online (anchor) column is cached; the key encoder embeds the other columns mini-batch by
                mini-batch without gradient; either way ``compute_loss_from_embeddings`` (and the adversaries'
                gradient) runs once per batch.

        References:
            - Li et al., "AdCSE: An Adversarial Method for Contrastive Learning of Sentence Embeddings", DASFAA 2022.
            - Code: https://github.com/lirenhao1997/AdCSE
            - Hu et al., "AdCo: Adversarial Contrast for Efficient Learning of Unsupervised Representations from
              Self-Trained Negative Adversaries", CVPR 2021.

        Requirements:
            1. (anchor, positive) pairs; for unsupervised training the same sentence twice. Optionally explicit
               negatives in further columns.
            2. A batch of at least 2 pairs when ``num_adversaries=0``.
            3. The model's embedding dimension (``model.get_embedding_dimension()``) when ``num_adversaries > 0``.
            4. No FSDP / DeepSpeed ZeRO-3 (flattened parameters are detected and refused); DDP is fine: the
               adversaries' gradient is averaged over the processes, so they stay identical on all ranks.

        Inputs:
            +-------------------------------------------------+--------+
            | Texts                                           | Labels |
            +=================================================+========+
            | (anchor, positive) pairs                        | none   |
            +-------------------------------------------------+--------+
            | (anchor, positive, negative_1, ..., negative_n) | none   |
            +-------------------------------------------------+--------+

        Recommendations:
            - Memory: ``untied=True`` keeps one frozen copy of the encoder (no gradients, optimizer state or
              activations); the adversaries cost ``2·M·d`` floats.
            - Checkpoints: the loss state (key encoder, adversaries, velocity, counters) is stored in the
              optimizer's ``state_dict`` (``optimizer.pt``). Resume with ``trainer.train(resume_from_checkpoint=...)``
              and a :class:`~st_hardneg.training.callbacks.StatefulLossCallback` (automatic in ``st_hardneg.training.loop.train``).
              A checkpoint without that state (``save_only_model=True``) resumes with a warning: the key encoder
              and the adversaries restart. The saved model is the online encoder only.
            - ``model.fit`` takes no callbacks: it trains the same, but a resume restores the loss state at the
              first optimizer step (one step late, with a warning). Prefer the Trainer for resumable runs.
            - Gradient accumulation: every training forward until the optimizer step adds to the adversaries'
              gradient (their mean is used), also several forwards before a single backward.
            - Use ``BatchSamplers.NO_DUPLICATES``: a duplicate sentence in a batch is a false negative of itself
              (``mask_duplicates``, on by default, removes exact duplicates from the denominator).

        Relations:
            - With ``num_adversaries=0`` and ``untied=False`` this is ST's ``MultipleNegativesRankingLoss`` (SimCSE).
            - MixCSE and HNCSE *construct* hard negatives from the batch; here they are *learned* adversarially.

        Example:
            ::

                from datasets import Dataset
                from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
                from st_hardneg import AdversarialNegativesLoss
                from st_hardneg.training.callbacks import add_stateful_loss_callback
                from st_hardneg.models import load_default_model

                model = load_default_model()
                sentences = ["A man is playing a guitar.", "A woman is slicing an onion.", "The sky is blue."]
                train_dataset = Dataset.from_dict({"anchor": sentences, "positive": sentences})
                args = SentenceTransformerTrainingArguments(output_dir="out", learning_rate=3e-5, save_steps=125)
                trainer = SentenceTransformerTrainer(
                    model=model, args=args, train_dataset=train_dataset,
                    loss=lambda m: AdversarialNegativesLoss(m, num_adversaries=64),  # seeded by args.seed
                )
                add_stateful_loss_callback(trainer)  # restores the loss state on resume
                trainer.train()  # later: trainer.train(resume_from_checkpoint=True)
        """
        # untied, the candidates (and so the queued rows) already come from the key encoder (read by the
        # constructor of the base class: queues_own_key_encoder_rows); tied with queue_source="ema", the queue keeps
        # its own key encoder (dropout off) as for the other losses
        self.untied = validation.check_bool(untied, "untied")
        super().__init__(model, guide, **options)
        self.num_adversaries = validation.check_count(num_adversaries, "num_adversaries (M)", minimum=0)
        self.check_options(self.options)
        self.in_batch_keys = validation.check_bool(in_batch_keys, "in_batch_keys")
        if not in_batch_keys and not num_adversaries:
            raise ValueError("in_batch_keys=False (paper Eq. 5) needs num_adversaries > 0: no negatives are left")
        self.momentum = validation.check_momentum(momentum, "momentum (m, the key encoder's EMA momentum)")
        self._ema_updates = 0
        self._state_synced = False
        self.adversary_temperature = validation.check_temperature(adversary_temperature, "adversary_temperature")
        if num_adversaries > 0 and self.embedding_dimension is None:
            raise ValueError("AdversarialNegativesLoss needs the model's embedding dimension for its adversaries, "
                             "but model.get_embedding_dimension() returned None.")
        self.embedding_dim = self.embedding_dimension or 0
        param = next(model.parameters(), None)
        self.adversary_bank = NegativeAdversaries(
            num_adversaries, self.embedding_dim, lr=adversary_lr, momentum=adversary_momentum,
            weight_decay=adversary_weight_decay, device=param.device if param is not None else None,
            generator=torch.Generator().manual_seed(self.options.seed) if self.options.seed is not None else None)
        # Not child modules (set in __dict__): out of parameters(), state_dict(), override_model_in_loss, optimizers.
        vars(self).update(_online=model, _key_encoder=frozen_copy(model) if untied else None)
        self._start_listening()

    def check_options(self, options: SharedOptions) -> None:
        """The shared options' rules, and the adversaries' similarity: cosines."""
        super().check_options(options)
        if vars(self).get("num_adversaries") and options.similarity_fct != "cos_sim":
            raise ValueError("AdversarialNegativesLoss with num_adversaries > 0 needs similarity_fct=cos_sim: the "
                             "adversaries are points on the unit sphere (AdCo), scored by their cosines")

    def follow_model(self, model: nn.Module) -> bool:
        """Tied (``untied=False``) the loss keeps no copy of the old model (its adversaries are vectors of the
        embedding space, not of a model's weights): it follows the model the Trainer's ``model_init`` made, as
        sentence-transformers' MNRL does. Untied, the key encoder is the old model's copy: refused."""
        if self.key_encoder is not None:
            return False
        vars(self).update(_online=_unwrapped(model))
        return True

    def queues_own_key_encoder_rows(self) -> bool:
        """Untied, the candidates come from the key encoder: the queue queues those rows."""
        return self.untied

    # ------------------------------------------------------------------ public state
    @property
    def key_encoder(self) -> nn.Module | None:
        """The momentum (EMA) key encoder; ``None`` when ``untied=False``. Frozen; each forward puts it in the online
        model's train / eval mode (dropout on in training, as in the paper; off in evaluation)."""
        return self._key_encoder

    @property
    def online_model(self) -> nn.Module:
        """The (unwrapped) online encoder this loss was built for."""
        return self._online

    @property
    def adversaries(self) -> Tensor:
        """(M, d) the negative adversaries (``adversary_bank.weight``)."""
        return self.adversary_bank.weight

    @property
    def adversary_velocity(self) -> Tensor:
        return self.adversary_bank.velocity

    @property
    def ema_updates(self) -> int:
        """Number of EMA updates of the key encoder so far (= optimizer steps of the online model)."""
        return self._ema_updates

    @property
    def adversary_updates(self) -> int:
        """Number of momentum-SGD ascent steps of the adversaries so far."""
        return self.adversary_bank.updates

    def training_state_dict(self) -> dict[str, Any]:
        """Everything training changes besides the online model (tensors are references, like ``state_dict()``)."""
        key = {"key_encoder": self.key_encoder.state_dict()} if self.key_encoder is not None else {}
        return {"format": _STATE_FORMAT, "num_adversaries": self.num_adversaries, "embedding_dim": self.embedding_dim,
                "untied": self.untied, "adversaries": self.adversaries, "adversary_velocity": self.adversary_velocity,
                "ema_updates": self._ema_updates, "adversary_updates": self.adversary_updates, "steps": self.step_clock.steps,
                **key}

    @torch.no_grad()
    def load_training_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`training_state_dict` (from a checkpoint of the same configuration)."""
        if state.get("format") != _STATE_FORMAT:
            raise ValueError(f"Unknown AdversarialNegativesLoss state format {state.get('format')!r}")
        expected = {"num_adversaries": self.num_adversaries, "embedding_dim": self.embedding_dim, "untied": self.untied}
        found = {key: state.get(key) for key in expected}
        if found != expected:
            raise ValueError(f"The saved AdversarialNegativesLoss state was made with {found}, this one has {expected}")
        self.adversaries.copy_(state["adversaries"])
        self.adversary_velocity.copy_(state["adversary_velocity"])
        if self.key_encoder is not None:
            self.key_encoder.load_state_dict(state["key_encoder"])
        self._ema_updates = int(state["ema_updates"])
        self.adversary_bank.updates = int(state["adversary_updates"])
        self.step_clock.steps = int(state.get("steps", max(self._ema_updates, self.adversary_bank.updates)))
        self.adversary_bank.reset_window()

    # ------------------------------------------------------------------ forward
    def before_embedding(self, sentence_features: list[dict[str, Tensor]]) -> None:
        """Before either embedding path (plain or GradCache): the online model's check, the forward count, the
        state's first sync across processes, and the key encoder on the online model's device, in the online
        model's train / eval mode: in training its dropout is on, as in the paper (the key encoder's dropout is
        part of the noise between a query and its key); in evaluation it is off, as the online model's, so that an
        evaluation loss is deterministic (two calls on one batch give one value)."""
        self._check_online_model()
        self._count_forward()
        self._sync_state_across_processes()
        if self.key_columns(sentence_features):
            key_encoder = cast(nn.Module, self.key_encoder)  # untied: the key encoder exists
            param, online = next(key_encoder.parameters(), None), next(self.online_model.parameters(), None)
            if param is not None and online is not None and param.device != online.device:
                key_encoder.to(online.device)
            key_encoder.train(self.model.training)

    def key_columns(self, sentence_features: list[dict[str, Tensor]]) -> list[int]:
        """The input columns the momentum key encoder embeds (without gradient): with ``untied=True`` every column
        after the anchors that takes the anchors' route through the model; none with ``untied=False``.

        On a model without a ``Router`` (the paper's single encoder) that is every column after the anchors. On a
        ``Router`` model (``Router.for_query_document`` with ``router_mapping``) a column routed to another tower
        than the anchors (the documents) goes through the live model, with gradient: the key encoder is the momentum
        copy of the encoder the anchors train, and a tower the anchors never take would only ever be the momentum
        copy of its untrained self. The paper's momentum encoder unties the encoders of queries and keys; a
        query/document Router unties them by construction, so its document tower is trained as the online encoder
        of the documents (the paper's symmetric case: one route, every key from the key encoder, is unchanged)."""
        if not self.untied or len(sentence_features) < 2:
            return []
        routes = column_routes(self.online_model, sentence_features)
        columns = [column for column in range(1, len(sentence_features)) if routes[column] == routes[0]]
        if len(columns) < len(sentence_features) - 1 and self.queue is not None and self.queue_source == "ema":
            raise ValueError(
                "AdversarialNegativesLoss(untied=True, queue_source='ema') on a Router model whose candidate columns "
                "take another route than the anchors (router_mapping): those columns go through the live model, so "
                "the loss's key encoder does not embed them and cannot feed the queue. Use queue_source='online', or "
                "untied=False (the queue then keeps its own key encoder, which follows every route).")
        return columns

    def embed(self, sentence_features: list[dict[str, Tensor]]) -> list[Tensor]:
        """``untied=True``: the anchors by the online model, the columns of :meth:`key_columns` by the key encoder
        without gradient, any other column (a Router's other tower) by the online model (GradCache embeds them the
        same way: :meth:`frozen_columns`)."""
        keyed = self.key_columns(sentence_features)
        if not keyed:
            return super().embed(sentence_features)
        anchors = self.model(sentence_features[0])["sentence_embedding"]
        with torch.no_grad():
            keys = embed_columns(cast(nn.Module, self.key_encoder), [sentence_features[c] for c in keyed],
                                 separate_first=False)
        live = [c for c in range(1, len(sentence_features)) if c not in keyed]
        online = embed_columns(self.model, [sentence_features[c] for c in live], separate_first=False) if live else []
        by_column = {**dict(zip(keyed, keys, strict=True)), **dict(zip(live, online, strict=True))}
        return [anchors, *(by_column[c] for c in range(1, len(sentence_features)))]

    def frozen_columns(self, sentence_features: list[dict[str, Tensor]]) -> dict[int, nn.Module]:
        """GradCache: the columns of :meth:`key_columns` are embedded by the key encoder, without gradient."""
        return {column: cast(nn.Module, self.key_encoder) for column in self.key_columns(sentence_features)}

    def _sync_state_across_processes(self) -> None:
        """Under ``torch.distributed``, at the first training forward: copy rank 0's key encoder and adversaries to
        every process (a loss built before the process group, or with unseeded random initialisations, could
        differ). From then on the identical EMA and averaged adversary steps keep them identical."""
        if self._state_synced or not dist.is_distributed() or not (self.training and torch.is_grad_enabled()):
            return
        tensors = [self.adversary_bank.weight, self.adversary_bank.velocity]
        if self.key_encoder is not None:
            tensors += list(self.key_encoder.parameters()) + list(self.key_encoder.buffers())
        with torch.no_grad():
            for tensor in tensors:
                tensor.copy_(dist.broadcast_from_rank0(tensor))
        self._state_synced = True

    def paper_columns(self, batch: Batch, blocks: dict[str, fr.Block], queue: QueueRead | None
                      ) -> dict[str, fr.Block]:
        """AdCSE (paper Eq. 5 with the in-batch keys, as the authors' code) on the embeddings ``[anchors (online),
        keys, explicit negatives...]``: the adversaries appended to ``query_to_doc``, marked as learned vectors (not
        data: they never make a row usable, and are never masked), the other pairs' keys dropped for Eq. 5
        (``in_batch_keys=False``, where the adversaries are the row's negatives by design). While training, the
        rows' share of the adversaries' ascent gradient is added up on the batch for :meth:`end_batch`."""
        masked = batch.false_negatives
        start, stop = batch.row_range
        q2d = blocks["query_to_doc"]
        if not self.in_batch_keys:  # paper Eq. 5: drop the other rows' keys and explicit negatives
            q2d = q2d.excluding(~fr.own_pair_mask(batch.size, q2d.similarity.size(1), q2d.similarity.device,
                                                  rows=(start, stop)))
        if self.num_adversaries:  # never masked; inside MatryoshkaLoss the first `width` dimensions of each
            adversaries = self._prefix(self.adversaries.detach(), batch.anchors.size(1)).to(batch.anchors.dtype)
            q2d = q2d.with_columns(batch.row_anchors @ fn.normalize(adversaries).T, learned=self.in_batch_keys)
        summed = batch.state.draws.get("adversary_gradient")
        if summed is not None:
            local = batch.state.local_rows  # this process's rows of a gathered batch
            own_start, own_stop = (local[0].start, local[0].stop) if local is not None else (0, batch.size)
            grad = self._adversary_gradient(batch.row_anchors, batch.candidates, masked, row_offset=start,
                                            num_pairs=batch.size)
            weighted = grad * ((stop - start) / (own_stop - own_start))  # the chunk's share of the rows' mean
            batch.state.draws["adversary_gradient"] = weighted if not len(summed) else summed + weighted
        return {**blocks, "query_to_doc": q2d}

    def begin_batch(self, batch: Batch) -> Batch:
        """Before the rows of a batch: start summing the adversaries' gradient on the batch (while training:
        ``batch.state.draws["adversary_gradient"]``, the sum of its windows' shares)."""
        if self.num_adversaries and self.training and torch.is_grad_enabled():
            self._prepare_accumulation(batch.anchors)
            batch.state.draws["adversary_gradient"] = batch.anchors.new_zeros(0)
        return batch

    def end_batch(self, batch: Batch) -> None:
        """After the rows of a batch: add the summed adversary gradient to the ascent window, once per batch (a batch
        that raised never gets here, and its sum goes with it)."""
        pending = batch.state.draws.get("adversary_gradient")
        if pending is not None and len(pending):
            self.adversary_bank.add(pending)

    @staticmethod
    def _prefix(adversaries: Tensor, width: int) -> Tensor:
        """The adversaries cut to the embeddings' width: inside ``MatryoshkaLoss`` the model's output is truncated
        to its first dimensions, and the adversaries' first dimensions are their Matryoshka counterpart."""
        return adversaries if adversaries.size(1) == width else adversaries[:, :width]

    def adversary_loss(self, anchors: Tensor, candidates: Tensor, adversaries: Tensor,
                       exclude: Tensor | None = None, row_offset: int = 0, num_pairs: int | None = None) -> Tensor:
        """The loss whose gradient the adversaries ascend: the encoder's loss at ``adversary_temperature`` (with the
        same masked false negatives ``exclude``), the mean over the ``anchors`` rows. ``row_offset``: the batch
        index of the first of them (a chunk of anchors: row ``r``'s positive is ``candidates[row_offset + r]``);
        ``num_pairs``: the batch's N (default: one anchor per pair)."""
        logits = self._cosines_and_logits(anchors, candidates, self._prefix(adversaries, anchors.size(1)),
                                          self.adversary_temperature, exclude, row_offset, num_pairs)[1]
        positives = torch.arange(anchors.size(0), device=logits.device) + row_offset
        return fn.info_nce(logits, positives)

    def _cosines_and_logits(self, anchors: Tensor, candidates: Tensor, adversaries: Tensor, tau: float,
                            exclude: Tensor | None = None, row_offset: int = 0,
                            num_pairs: int | None = None) -> tuple[Tensor, Tensor]:
        cos = fn.candidate_cosines(anchors, torch.cat([candidates, adversaries.to(candidates.dtype)], dim=0))
        logits = fn.mask_columns(fn.contrastive_logits(cos, tau), exclude)  # adversaries are never masked
        if not self.in_batch_keys:  # paper Eq. 5: drop the other rows' keys and explicit negatives
            n = num_pairs if num_pairs is not None else anchors.size(0)
            drop = ~fr.own_pair_mask(n, candidates.size(0), cos.device, rows=(row_offset, row_offset + anchors.size(0)))
            drop = torch.cat([drop, drop.new_zeros(anchors.size(0), adversaries.size(0))], dim=1)
            logits = logits.masked_fill(drop, float("-inf"))
        return cos, logits

    def _prepare_accumulation(self, anchors: Tensor) -> None:
        bank = self.adversary_bank
        if bank.pending_micro_batches and bank.backward_seen and not any(
                p.grad is not None for p in self.online_model.parameters()):
            bank.reset_window()  # gradients cleared without a step reaching us (GradScaler skip): new window
        bank.watch_backward(anchors)  # a backward through this micro-batch marks the window as backpropagated

    def _adversary_gradient(self, anchors: Tensor, candidates: Tensor, exclude: Tensor | None = None,
                            row_offset: int = 0, num_pairs: int | None = None) -> Tensor:
        """The adversaries' ascent gradient of the mean adversary loss of these anchor rows (rows
        ``row_offset ...`` of the batch)."""
        loss_fn = functools.partial(self.adversary_loss, exclude=exclude, row_offset=row_offset,
                                    num_pairs=num_pairs)
        return self.adversary_bank.gradient(loss_fn, anchors, candidates)

    # ------------------------------------------------------------------ training-loop integration
    def update_state(self) -> None:
        """The per-step update: EMA of the key encoder and one ascent step of the adversaries. Called after every
        completed optimizer step of the online model by :mod:`st_hardneg.losses.stateful`'s optimizer hook (any
        training loop); call it by hand only in a loop that steps without a torch optimizer."""
        if self.untied:
            update_momentum(self.online_model, cast(nn.Module, self.key_encoder), self.momentum)
            self._ema_updates += 1
        self.adversary_bank.step()  # and a new window

    # ------------------------------------------------------------------ config
    def paper_config(self) -> dict[str, Any]:
        bank = self.adversary_bank
        return {"num_adversaries": self.num_adversaries, "momentum": self.momentum, "adversary_lr": bank.lr,
                "adversary_momentum": bank.momentum, "adversary_weight_decay": bank.weight_decay,
                "adversary_temperature": self.adversary_temperature, "untied": self.untied,
                "in_batch_keys": self.in_batch_keys}

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
