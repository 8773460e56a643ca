"""A cross-batch queue of past candidate embeddings: more negatives per step at almost no cost (XBM, MoCo).

:class:`CandidateQueue` keeps the detached candidate rows (in-batch positives and explicit negatives) of recent
optimizer steps with their text keys and the step that produced them. A loss built with ``queue_size > 0`` appends
the readable rows to every anchor's ``query_to_doc`` denominator, under the same similarity, temperature and logit
transform (Focal-InfoNCE's modulation) as its in-batch negatives; they carry no gradient.

What the known failure modes of such queues ask for, and what this does:

- **Filled once per optimizer step, never cleared.** A training forward *stages* its rows; they enter the queue only
  after the next completed ``optimizer.step()`` (a torch step post-hook, :mod:`st_hardneg.losses.stateful`): several
  forwards of one step (gradient accumulation) are staged together, GradCache's replay re-embeds without computing the
  loss (nothing is staged twice), and an evaluation forward (no gradient) stages nothing. A ContAccum-style queue that
  was cleared at every optimizer step stayed nearly empty.
- **Stale rows.** Nothing is read before ``warmup_steps`` optimizer steps, only the filled part is ever read, and
  rows older than ``max_age`` steps are skipped.
- **False negatives.** A row whose text key equals the anchor's or its positive's (the token-id hash of
  ``mask_duplicates``) is masked for that anchor, as is a row above the loss's false-negative ``margin``.
- **Hardest-negative choices.** The queue rows join the softmax denominator only: MixCSE's partner, HNCSE's top-k and
  AdCSE's adversaries are chosen from the batch, so a stale duplicate can never become the "hardest" negative.
- **Checkpoints.** The queue (vectors, keys, steps, pointer, and the key encoder of ``source="ema"``) is saved inside
  the optimizer's state like AdCSE's state (:class:`~st_hardneg.training.callbacks.StatefulLossCallback` restores it
  on resume), unless ``checkpoint=False``.

What feeds it (the loss's ``queue_source``):

- ``"online"`` (default, XBM): the detached candidate rows the loss computed anyway; no extra cost. Their encoder
  moves with every step, so older rows drift ("slow drift": close to today's for a few hundred steps).
- ``"ema"`` (MoCo / ESimCSE): a momentum key encoder re-embeds each training batch's candidate texts without gradient
  and its rows are queued instead. It is a :func:`~st_hardneg.losses.momentum.frozen_copy` of the model *as the loss
  is built* (after loading, so it starts from the pretrained weights, not from random ones as in ESimCSE's released
  code), kept in **evaluation mode (dropout off)** as in ESimCSE, and moved after every optimizer step by
  ``θ_k ← m·θ_k + (1 - m)·θ`` (``momentum`` m, default 0.995, ESimCSE's). It costs one no-gradient forward of the
  candidate columns per batch (in ``mini_batch_size`` pieces with GradCache) and one model copy. Its rows are
  consistent with each other, at the price of lagging the online model.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor, nn

from st_hardneg import functional as fn
from st_hardneg.functional import ranking as fr
from st_hardneg.losses import distributed as dist
from st_hardneg.losses.momentum import frozen_copy, update_momentum
from st_hardneg.losses.options import QueueOptions
from st_hardneg.losses.stateful import OptimizerDrivenLoss

if TYPE_CHECKING:
    from st_hardneg.losses.batch import Batch
    from st_hardneg.losses.false_negatives import FalseNegativeRule

__all__ = ["CandidateQueue", "QueueBanks", "QueueRead", "queue_columns"]

logger = logging.getLogger(__name__)


class CandidateQueue(OptimizerDrivenLoss, nn.Module):
    """A FIFO ring of ``size`` past candidate rows (see the module docstring).

    Args:
        model: the online model whose optimizer steps commit the staged rows.
        size: the number of rows kept.
        warmup_steps: optimizer steps before any row is read.
        max_age: rows produced more than this many optimizer steps ago are not read (``None``: no limit).
        checkpoint: save the queue with the optimizer's checkpoints.
        momentum: with a value, the queue keeps a momentum key encoder (``source="ema"``, see the module
            docstring) moved with this momentum after every optimizer step; ``None`` (default): no key encoder.
    """

    checkpoint_name = "CandidateQueue"

    def __init__(self, model: nn.Module, size: int, *, warmup_steps: int = 0, max_age: int | None = None,
                 checkpoint: bool = True, momentum: float | None = None) -> None:
        super().__init__()
        vars(self)["_online"] = model  # not a submodule: the loss owns the model
        self.momentum = momentum
        # not a submodule either: out of the loss's parameters(), state_dict() and the optimizer
        vars(self)["_key_encoder"] = self._new_key_encoder(model) if momentum is not None else None
        self.size = int(size)
        self.warmup_steps = int(warmup_steps)
        self.max_age = max_age
        self.checkpoint = checkpoint
        self.vectors: Tensor | None = None
        self.keys = torch.full((self.size,), -1, dtype=torch.long)
        self.produced_at = torch.zeros(self.size, dtype=torch.long)
        self.pointer = 0
        self.filled = 0
        self._pending: list[tuple[Tensor, Tensor]] = []
        self._start_listening()

    @property
    def online_model(self) -> nn.Module:
        return vars(self)["_online"]  # type: ignore[no-any-return]

    @property
    def key_encoder(self) -> nn.Module | None:
        """The momentum key encoder (``source="ema"``), or ``None``."""
        return vars(self)["_key_encoder"]  # type: ignore[no-any-return]

    @staticmethod
    def _new_key_encoder(model: nn.Module) -> nn.Module:
        encoder = frozen_copy(model)
        encoder.eval()  # dropout off (ESimCSE)
        return encoder

    def embed_keys(self, features: dict[str, Tensor], embed: Callable[[nn.Module, dict[str, Tensor]], Tensor]
                   ) -> Tensor:
        """The key encoder's detached embeddings of one input column, computed by ``embed(encoder, features)`` (the
        loss's own no-gradient embedding, in mini-batches with GradCache), the encoder in evaluation mode on the
        online model's device."""
        encoder = self.key_encoder
        if encoder is None:
            raise RuntimeError("this queue has no key encoder (queue_source='online')")
        online = next(self.online_model.parameters(), None)
        param = next(encoder.parameters(), None)
        if online is not None and param is not None and param.device != online.device:
            encoder.to(online.device)
        encoder.eval()
        with torch.no_grad():
            return embed(encoder, dict(features)).detach()  # a copy of the dict: the model writes into it

    # ------------------------------------------------------------------ staging and committing
    def stage(self, vectors: Tensor, keys: Tensor | None) -> None:
        """Stage the detached rows of a training forward (nothing in evaluation, i.e. without gradient); they enter
        the queue after the next optimizer step. ``keys``: one text key per row, or ``None`` (unknown: ``-1``)."""
        if not torch.is_grad_enabled():
            return
        vectors = vectors.detach().float()
        keys = (torch.full((vectors.size(0),), -1, dtype=torch.long, device=vectors.device) if keys is None
                else keys.detach().long().to(vectors.device))
        if keys.size(0) != vectors.size(0):
            raise ValueError(f"one key per queued row: {vectors.size(0)} rows, {keys.size(0)} keys")
        self._pending.append((vectors, keys))
        self._count_forward()

    def update_state(self) -> None:
        """At an optimizer step: move the key encoder (if any) towards the stepped model, then enqueue the staged rows
        (oldest first), stamped with the number of steps done."""
        if self.key_encoder is not None:
            update_momentum(self.online_model, self.key_encoder, cast(float, self.momentum))
        pending, self._pending = self._pending, []
        for vectors, keys in pending:
            self._enqueue(vectors, keys, step=self.step_clock.steps)

    def _enqueue(self, vectors: Tensor, keys: Tensor, step: int) -> None:
        if self.vectors is None or self.vectors.size(1) != vectors.size(1):
            if self.vectors is not None:
                raise ValueError(f"queued rows are {self.vectors.size(1)}-dimensional, new ones "
                                 f"{vectors.size(1)}-dimensional")
            self.vectors = vectors.new_zeros((self.size, vectors.size(1)))
        if self.vectors.device != vectors.device:
            self._move(vectors.device)
        vectors, keys = vectors[-self.size:], keys[-self.size:]
        positions = (self.pointer + torch.arange(vectors.size(0), device=vectors.device)) % self.size
        assert self.vectors is not None
        self.vectors[positions] = vectors
        self.keys[positions] = keys
        self.produced_at[positions] = step
        self.pointer = int((self.pointer + vectors.size(0)) % self.size)
        self.filled = min(self.size, self.filled + vectors.size(0))

    def _move(self, device: torch.device) -> None:
        if self.vectors is not None:
            self.vectors = self.vectors.to(device)
        self.keys = self.keys.to(device)
        self.produced_at = self.produced_at.to(device)

    # ------------------------------------------------------------------ reading
    def readable(self) -> tuple[Tensor, Tensor] | None:
        """``(vectors, keys)`` of the rows a forward may read now, or ``None`` (warm-up, empty, all too old)."""
        if self.vectors is None or self.filled == 0 or self.step_clock.steps < self.warmup_steps:
            return None
        mask = torch.zeros(self.size, dtype=torch.bool, device=self.vectors.device)
        mask[: self.filled] = True
        if self.max_age is not None:
            mask &= (self.step_clock.steps - self.produced_at.to(mask.device)) <= self.max_age
        if not bool(mask.any()):
            return None
        return self.vectors[mask], self.keys.to(mask.device)[mask]

    @property
    def memory_bytes(self) -> int:
        """The queue's memory (vectors, keys and steps; the key encoder's weights are counted apart)."""
        vectors = 0 if self.vectors is None else self.vectors.numel() * self.vectors.element_size()
        return vectors + self.keys.numel() * 8 + self.produced_at.numel() * 8

    @property
    def key_encoder_bytes(self) -> int:
        """The key encoder's parameters and buffers (0 without one)."""
        if self.key_encoder is None:
            return 0
        tensors = [*self.key_encoder.parameters(), *self.key_encoder.buffers()]
        return sum(t.numel() * t.element_size() for t in tensors)

    # ------------------------------------------------------------------ checkpoints
    def training_state_dict(self) -> dict[str, Any]:
        if not self.checkpoint:
            return {"steps": self.step_clock.steps, "saved": False}
        key = ({"key_encoder": {k: v.detach().cpu().clone() for k, v in self.key_encoder.state_dict().items()}}
               if self.key_encoder is not None else {})
        return {"steps": self.step_clock.steps, "saved": True, "pointer": self.pointer, "filled": self.filled, **key,
                "vectors": None if self.vectors is None else self.vectors.detach().cpu().clone(),
                "keys": self.keys.cpu().clone(), "produced_at": self.produced_at.cpu().clone()}

    def load_training_state_dict(self, state: dict[str, Any]) -> None:
        self.step_clock.steps = int(state["steps"])
        if not state.get("saved", True):
            logger.warning("the checkpoint holds no queue rows (checkpoint=False): the queue refills from empty%s",
                           " and its key encoder starts again from the resumed model" if self.key_encoder is not None
                           else "")
            if self.key_encoder is not None:
                vars(self)["_key_encoder"] = self._new_key_encoder(self.online_model)
            return
        if self.key_encoder is not None:
            if "key_encoder" not in state:
                raise ValueError("the checkpointed queue has no key encoder, this one has (queue_source='ema')")
            self.key_encoder.load_state_dict(state["key_encoder"])
        vectors = state["vectors"]
        if vectors is not None and vectors.size(0) != self.size:
            raise ValueError(f"the checkpointed queue holds {vectors.size(0)} rows, this one {self.size}")
        device = self.vectors.device if self.vectors is not None else torch.device("cpu")
        self.vectors = None if vectors is None else vectors.to(device).clone()
        self.keys = state["keys"].to(device).clone()
        self.produced_at = state["produced_at"].to(device).clone()
        self.pointer, self.filled = int(state["pointer"]), int(state["filled"])

    def extra_repr(self) -> str:
        return (f"size={self.size}, filled={self.filled}, warmup_steps={self.warmup_steps}, "
                f"max_age={self.max_age}, steps={self.step_clock.steps}"
                + (f", key encoder momentum={self.momentum}" if self.key_encoder is not None else ""))


def queue_columns(queue: CandidateQueue, batch: Batch, rows: Tensor, unit_rows: Tensor, *, dot: bool,
                  rule: FalseNegativeRule, anchor_bank: bool) -> tuple[Tensor, Tensor | None, Tensor,
                                                                       dict[str, Tensor]] | None:
    """``(similarity (R, Q), exclude (R, Q) or None, the queued rows (Q, d), stats)`` of the batch's rows (``rows``:
    as the loss scores them, ``unit_rows``: unit length, for the margin) against ``queue``'s readable rows, or
    ``None``. By the loss's false-negative ``rule``, a queued row is excluded for pair ``i`` when its text key equals the anchor's or the positive's
    (``mask_duplicates``), when ``known_positives`` marks it relevant to the anchor (``anchor_bank``: a queued anchor
    to which the row's positive is relevant, for ``doc_to_query``; counted in ``stats``), or when its cosine with
    the row exceeds pair ``i``'s false-negative threshold (``margin``)."""
    readable = queue.readable()
    if readable is None:
        return None
    vectors, keys = readable
    vectors = vectors.to(device=rows.device, dtype=rows.dtype)
    similarity = rows @ vectors.T
    exclude = None
    stats: dict[str, Tensor] = {}
    start, stop = batch.row_range
    known_positives, margin = rule.known_positives, rule.margin
    if rule.mask_duplicates and batch.text_keys is not None:
        keys = keys.to(rows.device)
        has_key = keys != -1  # -1: no key (Python's hash never returns -1)
        own = batch.text_keys[:2, start:stop].to(rows.device)  # anchor and positive keys, (2, R)
        exclude = ((own[0].unsqueeze(1) == keys.unsqueeze(0)) | (own[1].unsqueeze(1) == keys.unsqueeze(0)))
        exclude &= has_key.unsqueeze(0)
    if known_positives is not None and batch.text_keys is not None:
        keys = keys.to(rows.device)
        if not anchor_bank:  # queued documents known to be relevant to the row's anchor
            known = known_positives.mask(batch.text_keys[0, start:stop].to(rows.device), keys)
        else:  # queued anchors to which the row's positive is known to be relevant (doc_to_query)
            known = known_positives.mask(keys, batch.text_keys[1, start:stop].to(rows.device)).T
        exclude = known if exclude is None else exclude | known
        name = "anchor_queue_known_positives_masked_total" if anchor_bank else "queue_known_positives_masked_total"
        stats[name] = known.sum().float()
    if margin is not None:
        cosines = unit_rows.detach() @ (fn.normalize(vectors) if dot else vectors).T
        positive = (batch.row_anchors.detach() * batch.row_positives.detach()).sum(dim=1, keepdim=True)
        threshold = positive - margin if rule.margin_strategy == "absolute" else positive - positive.abs() * margin
        above = cosines > threshold
        exclude = above if exclude is None else exclude | above
    return similarity, exclude, vectors, stats


@dataclass
class QueueRead:
    """The queue's columns for the rows being computed (:meth:`QueueBanks.read`): passed to the paper (a choice
    that may take queued rows: ``queue_as_pool``) and joined to the blocks after it (:meth:`QueueBanks.join`)."""

    #: ``(similarity (R, Q), exclude (R, Q) or None)`` of the main bank's readable rows, or ``None``
    columns: tuple[Tensor, Tensor | None] | None
    #: (Q, d) the main bank's readable rows, as the loss scores them (the pool of a hardest-negative choice)
    vectors: Tensor | None
    #: the same as :attr:`columns` for the anchors' bank (``queue_anchors``, joined to ``doc_to_query``)
    anchor_columns: tuple[Tensor, Tensor | None] | None
    #: the counts of these rows (read, masked; a paper adds its own, e.g. MixCSE's ``queue_partner_fraction``)
    stats: dict[str, Tensor]

    @property
    def pool(self) -> tuple[Tensor, Tensor | None, Tensor] | None:
        """``(similarity, exclude, rows)`` of the main bank for a hardest-negative choice, or ``None``."""
        if self.columns is None or self.vectors is None:
            return None
        return self.columns[0], self.columns[1], self.vectors


class QueueBanks:
    """The queue part a loss owns (``loss.queues``): its options (:class:`~st_hardneg.losses.options.QueueOptions`,
    checked as they were made; what depends on the loss is checked here) and its banks (:attr:`queue`, and
    :attr:`anchor_queue` with ``anchors``), read for the rows being computed (:meth:`read`, joined by :meth:`join`)
    and fed with each training batch's candidates (:meth:`stage`, once per batch, after its rows); the compute
    template calls it only when the loss has a queue (``size=0``: no bank, and nothing here runs). The loss registers the banks as its child modules ``queue`` and ``anchor_queue``
    (stateful: :class:`CandidateQueue`, found among the loss's modules by the training callbacks).

    Args:
        loss_name: the loss's class name, for the messages.
        model: the online model (whose optimizer steps commit the staged rows).
        guide: the loss's guide model, or ``None`` (a queue with a guide is refused).
        options: the checked queue options.
        directions: the loss's ranking directions (``anchors`` needs ``doc_to_query``).
        dot: the loss scores with ``dot_score`` (raw rows) rather than cosines.
        rule: the loss's false-negative rule (:class:`~st_hardneg.losses.false_negatives.FalseNegativeRule`),
            applied to the queued rows too.
        chooses_from_pool: whether the loss has a hardest-negative choice that can take queued rows (``as_pool``).
        pool_refusal: why a loss with such a choice still refuses ``as_pool`` (``None``: it has no such choice).
        own_key_encoder: the loss's candidates already come from its own key encoder (AdCSE untied): those are
            queued, and ``source="ema"`` keeps no second one.
    """

    def __init__(self, loss_name: str, model: Any, guide: Any, options: QueueOptions, *,
                 directions: tuple[str, ...], dot: bool, rule: FalseNegativeRule, chooses_from_pool: bool,
                 pool_refusal: str | None, own_key_encoder: bool) -> None:
        name = loss_name
        self.loss_name = loss_name
        self.options = options
        self.dot = dot
        self.rule = rule
        if own_key_encoder and options.source == "ema" and options.momentum != 0.995:
            raise ValueError(f"{name}: with queue_source='ema' the queue is fed by the loss's own key encoder, which "
                             "moves with `momentum`; queue_momentum does not apply, leave it unset")
        if options.anchors and "doc_to_query" not in directions:
            raise ValueError(f"{name}: queue_anchors=True queues anchors for the doc_to_query direction, which "
                             f"directions={directions} does not have; add 'doc_to_query' or leave "
                             "queue_anchors off")
        if options.as_pool and not chooses_from_pool:
            reason = pool_refusal or (f"{name} makes no such choice from the candidates, so the queue is its "
                                      "denominator only")
            raise ValueError(f"{name}: queue_as_pool=True lets a hardest-negative choice pick queued rows; {reason}. "
                             "Only MixCSELoss(partner='hardest') takes it.")
        self.queue: CandidateQueue | None = None
        self.anchor_queue: CandidateQueue | None = None
        if options.size:
            if model is None:
                raise ValueError(f"{name}: queue_size needs the model whose optimizer steps fill the queue, got "
                                 "model=None")
            if guide is not None:
                raise ValueError(f"{name}: queue_size with a guide is not supported (the queued rows have no guide "
                                 "embeddings to apply its margin to); use margin without a guide")
            own_encoder = options.source == "ema" and not own_key_encoder
            self.queue = CandidateQueue(model, options.size, warmup_steps=options.warmup_steps,
                                        max_age=options.max_age, checkpoint=options.checkpoint,
                                        momentum=options.momentum if own_encoder else None)
            if options.anchors:  # the second bank: fed with the first's rows' source, by the same key encoder
                self.anchor_queue = CandidateQueue(model, options.size, warmup_steps=options.warmup_steps,
                                                   max_age=options.max_age, checkpoint=options.checkpoint)
            elif "doc_to_query" in directions:
                logger.info("%s: the queued rows join query_to_doc only; queue_anchors=True also queues the anchors "
                            "for doc_to_query", name)

    # ------------------------------------------------------------------ before the model runs
    def key_columns(self, sentence_features: list[dict[str, Tensor]],
                    embed: Callable[[nn.Module, dict[str, Tensor]], Tensor]) -> list[Tensor | None] | None:
        """``source="ema"``, in a training forward (gradients on: the queue stages rows exactly then): the key
        encoder's rows of the candidate columns (and the anchors' with ``anchors``, else ``None`` in their place) of
        this call, embedded by ``embed(encoder, features)``, for the call's context. Otherwise ``None``."""
        if self.queue is None or self.queue.key_encoder is None or not torch.is_grad_enabled():
            return None
        return [self.queue.embed_keys(features, embed) if column or self.anchor_queue is not None else None
                for column, features in enumerate(sentence_features)]

    # ------------------------------------------------------------------ one batch
    def read(self, batch: Batch) -> QueueRead | None:
        """The queue's columns for the rows of ``batch`` being computed (its readable rows scored as the loss scores
        them, their false-negative masks and counts; with ``anchors`` the anchors' bank for ``doc_to_query``), or
        ``None`` when the queue has no readable row yet. Nothing is staged here (:meth:`stage`)."""
        queue = cast(CandidateQueue, self.queue)
        queries = batch.raw_rows()[0] if self.dot else batch.row_anchors
        stats: dict[str, Tensor] = {}
        main = self._columns_for(queue, batch, queries, batch.row_anchors, stats)
        anchors = None
        if self.anchor_queue is not None:
            row_positives = batch.raw_rows()[1] if self.dot else batch.row_positives
            anchors = self._columns_for(self.anchor_queue, batch, row_positives, batch.row_positives, stats)
        if main is None and anchors is None:
            return QueueRead(None, None, None, stats) if stats else None
        return QueueRead(main[:2] if main is not None else None, main[2] if main is not None else None,
                         anchors[:2] if anchors is not None else None, stats)

    def stage(self, batch: Batch) -> None:
        """Stage this batch's candidates (and with ``anchors`` its anchors), once per batch, after its rows: they
        enter the queue after the optimizer step, so a batch never reads itself. With ``source="ema"`` in training
        the rows are the key encoder's (:attr:`Batch.queue_keys`, from the call's context)."""
        queue = cast(CandidateQueue, self.queue)
        dot, state = self.dot, batch.state
        ema = queue.key_encoder is not None and torch.is_grad_enabled()
        key_rows = self._key_encoder_rows(batch.queue_keys, state.local_rows is not None) if ema else None
        candidates = batch.raw_candidates if dot else batch.candidates
        if key_rows is not None:
            candidates = torch.cat(key_rows[1:])
        keys_now = batch.text_keys[1:].reshape(-1) if batch.text_keys is not None else None
        queue.stage(candidates, keys_now)
        if self.anchor_queue is not None:
            anchors = key_rows[0] if key_rows is not None else (batch.raw_anchors if dot else batch.anchors)
            self.anchor_queue.stage(cast(Tensor, anchors), batch.text_keys[0] if batch.text_keys is not None else None)

    def _columns_for(self, queue: CandidateQueue, batch: Batch, rows: Tensor, unit_rows: Tensor,
                     stats: dict[str, Tensor]) -> tuple[Tensor, Tensor | None, Tensor] | None:
        """:func:`queue_columns` with the loss's false-negative rule (its counts added to ``stats``)."""
        read = queue_columns(queue, batch, rows, unit_rows, dot=self.dot, rule=self.rule,
                             anchor_bank=queue is not self.queue)
        if read is None:
            return None
        similarity, exclude, vectors, counts = read
        stats.update(counts)
        return similarity, exclude, vectors

    def _key_encoder_rows(self, columns: list[Tensor | None] | None, gathered: bool) -> list[Tensor]:
        """``source="ema"``: the key encoder's rows of this batch (``columns``, :attr:`Batch.queue_keys`), one tensor
        per column (the anchors' only with ``anchors``, else an empty tensor), gathered from every process like the
        batch, normalised unless ``dot_score``."""
        if columns is None:
            raise ValueError(
                f"{self.loss_name}: queue_source='ema' queues the key encoder's embeddings of the input texts, "
                "so it needs forward(sentence_features, labels) in training; compute_loss_from_embeddings alone "
                "cannot feed it (use queue_source='online', or call the loss on the features)")
        out = []
        for column in columns:
            if column is None:
                out.append(torch.empty(0))
                continue
            column = column.float()
            if gathered:  # the batch was gathered: so are the keys, in rank order
                column = dist.gather(column)
            out.append(column if self.dot else fn.normalize(column))
        return out

    @staticmethod
    def join(blocks: dict[str, fr.Block], read: QueueRead) -> tuple[dict[str, fr.Block], dict[str, Tensor]]:
        """``blocks`` with the queue's columns appended to ``query_to_doc`` (and the anchors' bank's to
        ``doc_to_query``), after the loss chose its own negatives from the batch, and their counts."""
        stats: dict[str, Tensor] = {}
        if read.columns is not None:
            similarity, exclude = read.columns
            blocks = {**blocks, "query_to_doc": blocks["query_to_doc"].with_columns(similarity, exclude)}
            stats["queue_rows_read"] = torch.tensor(float(similarity.size(1)))
            if exclude is not None:
                stats["queue_rows_masked"] = exclude.sum(dim=1).float().mean().detach()
        if read.anchor_columns is not None and "doc_to_query" in blocks:
            similarity, exclude = read.anchor_columns
            blocks = {**blocks, "doc_to_query": blocks["doc_to_query"].with_columns(similarity, exclude)}
            stats["anchor_queue_rows_read"] = torch.tensor(float(similarity.size(1)))
        return blocks, stats

    # ------------------------------------------------------------------ reporting
    def diagnostics(self) -> dict[str, float]:
        """The queue's fill and memory for the loss's diagnostics (none without a queue)."""
        out: dict[str, float] = {}
        if self.queue is not None:
            out["queue_filled"] = float(self.queue.filled)
            out["queue_memory_bytes"] = float(self.queue.memory_bytes)
            if self.queue.key_encoder is not None:
                out["queue_key_encoder_bytes"] = float(self.queue.key_encoder_bytes)
        if self.anchor_queue is not None:
            out["anchor_queue_filled"] = float(self.anchor_queue.filled)
            out["queue_memory_bytes"] += float(self.anchor_queue.memory_bytes)
        return out

    def config(self) -> dict[str, Any]:
        """The ``queue_*`` options for ``get_config_dict`` (none without a queue)."""
        options = self.options
        if not options.size:
            return {}
        return {"queue_size": options.size, "queue_warmup_steps": options.warmup_steps,
                "queue_max_age": options.max_age, "queue_checkpoint": options.checkpoint,
                "queue_source": options.source, "queue_anchors": options.anchors,
                "queue_as_pool": options.as_pool,
                **({"queue_momentum": options.momentum} if options.source == "ema" else {})}
