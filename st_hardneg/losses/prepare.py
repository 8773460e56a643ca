"""The input side of every loss, one part (:class:`BatchPreparer`): the columns checked, in float32, normalised once,
as a :class:`~st_hardneg.losses.batch.Batch` of the rows a loss computes (:meth:`BatchPreparer.window`), with their
false-negative masks (:mod:`~st_hardneg.losses.false_negatives`), known relevance and the text keys and guide
embeddings that ``forward`` saw (the call's :class:`~st_hardneg.losses.batch.CallContext`).

This module imports nothing of :mod:`st_hardneg.losses.base`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import replace

import torch
from torch import Tensor

from st_hardneg import functional as fn
from st_hardneg.losses import columns, false_negatives
from st_hardneg.losses import distributed as dist
from st_hardneg.losses.batch import Batch, BatchState, CallContext

__all__ = ["BatchPreparer"]


class BatchPreparer:
    """The batch preparer a loss owns (``loss.preparer``): turns the embeddings of one call into a :class:`Batch`.

    It holds what it needs from the loss's options (given to it, never read back from the loss) and the little it
    learns across batches: whether false-negative counts are reported yet and whether the label warning was shown.
    What ``forward`` saw of a call (text keys, guide embeddings) comes with that call's :meth:`prepare`.

    Args:
        loss_name: the loss's class name, for the messages.
        blocks: the blocks of the loss's softmax (its ``directions`` plus GIST's contrast blocks).
        rule: the loss's false-negative rule (:class:`~st_hardneg.losses.false_negatives.FalseNegativeRule`: the
            duplicates, the margin and its strategy, the guide, the known positives).
        gather_across_devices: gather every process's rows (under ``torch.distributed``).
        uses_labels: whether the loss reads labels (otherwise labels warn once).
    """

    def __init__(self, loss_name: str, *, blocks: tuple[str, ...], rule: false_negatives.FalseNegativeRule,
                 gather_across_devices: bool, uses_labels: bool) -> None:
        self.loss_name = loss_name
        self.blocks = blocks
        self.rule = rule
        self.gather_across_devices = gather_across_devices
        self.uses_labels = uses_labels
        #: whether the false-negative counts are reported (from the first batch that can mask beyond duplicates or
        #: that masked one on)
        self.reports_false_negatives = False
        self.warned_labels = False

    @property
    def controls_false_negatives(self) -> bool:
        """Whether any candidate can be masked (``mask_duplicates``, ``known_positives`` or a ``margin``)."""
        return self.rule.active

    def check_labels(self, labels: Tensor | None) -> None:
        """Warn once per loss if it receives labels it ignores. ``None`` and an all-zeros tensor (what
        sentence-transformers passes for a dataset without a label column: ``None`` in the Trainer, zeros from
        ``InputExample``'s default label in the legacy ``fit``) are silent."""
        if self.uses_labels or self.warned_labels or labels is None:
            return
        if isinstance(labels, Tensor):
            if labels.numel() == 0 or labels.device.type == "meta" or not bool(labels.ne(0).any()):
                return
        self.warned_labels = True
        warnings.warn(
            f"{self.loss_name} does not use labels but received some (the dataset has a 'label'/'score' "
            "column). They are ignored; if they are similarity scores you probably want a loss that reads them, "
            "e.g. CoSENTLoss. This warning is shown once per loss.",
            UserWarning,
            stacklevel=4,
        )

    @staticmethod
    def own_rows(batch: Batch) -> tuple[int, int]:
        """``[start, stop)`` of this process's rows in ``batch`` (all of them without a gathering)."""
        if batch.state.local_rows is not None:
            own = batch.state.local_rows[0]
            return own.start, own.stop
        return 0, batch.size

    def window(self, batch: Batch, start: int | None, stop: int | None = None) -> Batch:
        """``batch`` restricted to the anchor rows ``[start, stop)`` (``None``: every row), with the false-negative
        masks of those rows (``false_negatives``, ``block_masks``) and their counts (``false_negative_stats``)."""
        rows = None if start is None else (int(start), int(stop if stop is not None else batch.size))
        rule = self.rule
        if rule.mask_duplicates:  # computed once on the batch the windows are cut from, not once per window
            false_negatives.duplicate_ids(batch)
        nothing_to_mask = self._nothing_to_mask(batch)
        batch = replace(batch, rows=rows, false_negatives=None, block_masks=None, false_negative_stats={})
        if not self.controls_false_negatives:
            return batch
        if nothing_to_mask:
            if self.reports_false_negatives:  # reported as 0 once reporting started
                zero = torch.zeros((), device=batch.device)
                batch.false_negative_stats = {"masked_false_negatives": zero, "masked_false_negatives_total": zero}
            return batch
        batch.false_negatives, stats = false_negatives.false_negative_mask(batch, rule)
        batch.block_masks = false_negatives.block_masks(batch, frozenset(self.blocks) - {"query_to_doc"}, rule)
        # Reported once anything can be masked beyond exact duplicates (a threshold is set), or from the first batch
        # in which a duplicate was masked on: on duplicate-free data the default diagnostics stay as they were.
        total = stats["masked_false_negatives_total"]
        if not self.reports_false_negatives and (
                rule.margin is not None or (total.device.type != "meta" and bool(total > 0))):
            self.reports_false_negatives = True
        if self.reports_false_negatives:
            batch.false_negative_stats = stats
        return batch

    def _nothing_to_mask(self, batch: Batch) -> bool:
        """Whether the false-negative mask of every row of ``batch`` is certainly empty, so that the windows carry
        none (``None`` is what an all-False mask computes, without its (rows x candidates) tensors and their
        per-chunk cost): only duplicates are masked (no ``margin``), the loss's blocks are ``query_to_doc`` and at
        most ``doc_to_query`` (its mask is the transposed in-batch part of the first), and no two candidates share an
        embedding id or a text key. Decided once per batch (kept on it)."""
        rule = self.rule
        if (not rule.mask_duplicates or rule.margin is not None or rule.known_positives is not None
                or not set(self.blocks) <= {"query_to_doc", "doc_to_query"}):
            return False
        cached = batch.nothing_to_mask
        if cached is None:
            ids = false_negatives.duplicate_ids(batch)
            if ids is None:  # the meta device: no values to decide on
                return False
            candidate_ids = ids[batch.size:]
            distinct = bool(torch.unique(candidate_ids).numel() == candidate_ids.numel())
            if distinct and batch.text_keys is not None:
                keys = batch.text_keys[1:].reshape(-1)
                distinct = bool(torch.unique(keys).numel() == keys.numel())
            cached = batch.nothing_to_mask = distinct
        return cached

    def prepare(self, embeddings: list[Tensor], labels: Tensor | None = None, *, min_batch_size: int = 2,
                embedding_dimension: int | None = None, in_matryoshka: Callable[[], bool] = lambda: False,
                context: CallContext | None = None) -> Batch:
        """Check the columns and return them in float32, normalised once, as a :class:`Batch` (with gathering: of
        every process's rows), with the text keys and guide embeddings that ``forward`` saw (``context``, the call's
        :class:`~st_hardneg.losses.batch.CallContext`; ``None``: nothing) and the queue's key-encoder rows; no masks
        yet (:meth:`window` adds those of the rows a loss computes).

        Raises ``ValueError`` for fewer than 2 columns, columns that are not (batch, dim) tensors of one batch size
        and one width, a width that differs from ``embedding_dimension`` (the model's, recorded by the loss), a batch
        smaller than ``min_batch_size`` (the loss's), and NaN / inf entries or a norm beyond float32's range (naming the
        column). Large but finite vectors (entries of 1e20, whose squares overflow) are normalised exactly.
        ``in_matryoshka``: whether ``MatryoshkaLoss`` truncates the embeddings (then a narrower width is accepted).
        """
        self.check_labels(labels)
        name = self.loss_name
        raw = columns.checked_columns(list(embeddings), name=name, min_batch_size=min_batch_size,
                                      embedding_dimension=embedding_dimension, in_matryoshka=in_matryoshka)
        embeddings, n = raw, raw[0].size(0)
        units = [fn.normalize(column) for column in raw]
        local_rows = None
        if self.gather_across_devices and dist.is_distributed():
            # Every column of every process, in rank order (with gradient), normalised again row by row (the same
            # float operations on the same rows); the reduction then averages this process's own rows.
            dist.check_equal_local_batches(n, raw[0].device)
            raw = [dist.gather_with_grad(column) for column in raw]
            units = [fn.normalize(column) for column in raw]
            local_rows = (dist.local_rows(n), raw[0].size(0))
        # a pair with a (near-)zero anchor or positive has no direction: it cannot be ranked (unusable)
        zero_rows = (fn.row_norms(raw[0].detach()).squeeze(-1) < fn.NORM_EPS) | (
            fn.row_norms(raw[1].detach()).squeeze(-1) < fn.NORM_EPS)
        batch = Batch.from_units(units, raw=raw)
        batch.state = BatchState(local_rows=local_rows, zero_rows=zero_rows)
        context = context if context is not None else CallContext()
        batch.queue_keys = context.queue_keys
        inputs = context.side_inputs
        if not self.controls_false_negatives:
            return batch
        batch = false_negatives.attach_side_inputs(
            batch, inputs, len(embeddings), needs_guide=self.rule.guided,
            gathered=local_rows is not None, loss_name=name)
        known = self.rule.known_positives
        if known is not None and batch.device.type != "meta":
            if batch.text_keys is None:
                raise ValueError(f"{name}: known_positives needs the rows' texts (their token ids), which only forward() "
                                 "sees; call the loss through forward() / the Trainer, or pass text_keys with "
                                 "set_false_negative_inputs() before compute_loss_from_embeddings()")
            batch.known = known
            known.note_batch(batch.text_keys[0], name)
        return batch
