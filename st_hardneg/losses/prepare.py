"""The input side of every loss: the columns checked, in float32, normalised once (:class:`PrepareMixin`), as a
:class:`~st_hardneg.losses.batch.Batch` of the rows a loss computes, with their false-negative masks
(:mod:`~st_hardneg.losses.false_negatives`) and the text keys and guide embeddings ``forward`` saw.

This module imports nothing of :mod:`st_hardneg.losses.base`.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor

from st_hardneg import functional as fn
from st_hardneg.losses import columns, false_negatives
from st_hardneg.losses import distributed as dist
from st_hardneg.losses.batch import Batch, BatchState, SideInputs
from st_hardneg.losses.relevance import KnownPositives

__all__ = ["PrepareMixin"]


class PrepareMixin:
    """:meth:`prepare_batch` and its parts for :class:`~st_hardneg.losses.base.HardNegativeLoss` (the options it
    reads are set by the loss's constructor), and the hooks of the batch's life after it (:meth:`begin_batch`,
    :meth:`end_batch`, :meth:`close_batch`: a loss with per-batch state overrides them)."""

    #: smallest batch the loss accepts (in-batch mixing needs a partner)
    min_batch_size: int = 2
    #: whether the loss reads labels (the st-hardneg losses do not; a labelled dataset triggers a warning)
    uses_labels: bool = False
    model: Any
    guide: Any
    directions: tuple[str, ...]
    contrast_anchors: bool
    contrast_positives: bool
    mask_duplicates: bool
    margin: float | None
    margin_strategy: str
    known_positives: KnownPositives | None
    gather_across_devices: bool
    embedding_dimension: int | None
    _warned_labels: bool
    _reports_false_negatives: bool
    _side_inputs: SideInputs | None

    @property
    def blocks(self) -> tuple[str, ...]:
        """The blocks of the softmax: :attr:`directions` plus ``anchor_to_anchor`` / ``positive_to_positive`` for
        ``contrast_anchors`` / ``contrast_positives`` (GISTEmbedLoss)."""
        extra = (("anchor_to_anchor",) if self.contrast_anchors else ()) + (
            ("positive_to_positive",) if self.contrast_positives else ())
        return self.directions + extra


    @property
    def controls_false_negatives(self) -> bool:
        """Whether any candidate can be masked (``mask_duplicates``, ``known_positives`` or a ``margin``)."""
        return self.mask_duplicates or self.margin is not None or self.known_positives is not None


    def check_labels(self, labels: Tensor | None) -> None:
        """Warn once per loss if it receives labels it ignores. ``None`` and an all-zeros tensor (what
        sentence-transformers passes for a dataset without a label column: ``None`` in the Trainer, zeros from
        ``InputExample``'s default label in the legacy ``fit``) are silent."""
        if self.uses_labels or self._warned_labels or labels is None:
            return
        if isinstance(labels, Tensor):
            if labels.numel() == 0 or labels.device.type == "meta" or not bool(labels.ne(0).any()):
                return
        self._warned_labels = True
        warnings.warn(
            f"{type(self).__name__} does not use labels but received some (the dataset has a 'label'/'score' "
            "column). They are ignored; if they are similarity scores you probably want a loss that reads them, "
            "e.g. CoSENTLoss. This warning is shown once per loss.",
            UserWarning,
            stacklevel=3,
        )

    def prepare_batch(self, embeddings: list[Tensor], labels: Tensor | None = None, own_rows: bool = False) -> Batch:
        """Check the columns and return them in float32, normalised once, as a :class:`Batch` with the
        false-negative masks of its rows: every row of the (gathered) batch, or with ``own_rows`` this process's
        own rows (:meth:`prepare_columns`, then :meth:`window`)."""
        batch = self.prepare_columns(embeddings, labels)
        if own_rows and batch.state.local_rows is not None:
            own = batch.state.local_rows[0]
            return self.window(batch, own.start, own.stop)
        return self.window(batch, None)

    def own_row_range(self, batch: Batch) -> tuple[int, int]:
        """``[start, stop)`` of this process's rows in ``batch`` (all of them without a gathering)."""
        if batch.state.local_rows is not None:
            own = batch.state.local_rows[0]
            return own.start, own.stop
        return 0, batch.size

    def window(self, batch: Batch, start: int | None, stop: int | None = None) -> Batch:
        """``batch`` restricted to the anchor rows ``[start, stop)`` (``None``: every row), with the false-negative
        masks of those rows (``false_negatives``, ``block_masks``) and their counts in the diagnostics."""
        from dataclasses import replace

        rows = None if start is None else (int(start), int(stop if stop is not None else batch.size))
        if self.mask_duplicates:  # computed once on the batch the windows are cut from, not once per window
            false_negatives.duplicate_ids(batch)
        nothing_to_mask = self._nothing_to_mask(batch)
        batch = replace(batch, rows=rows, false_negatives=None, block_masks=None)
        batch.state.false_negative_stats = {}
        if not self.controls_false_negatives:
            return batch
        if nothing_to_mask:
            if self._reports_false_negatives:  # reported as 0 once reporting started
                zero = torch.zeros((), device=batch.device)
                batch.state.false_negative_stats = {"masked_false_negatives": zero,
                                                    "masked_false_negatives_total": zero}
            return batch
        batch.false_negatives, stats = false_negatives.false_negative_mask(
            batch, mask_duplicates=self.mask_duplicates, margin=self.margin,
            margin_strategy=self.margin_strategy)
        batch.block_masks = false_negatives.block_masks(
            batch, frozenset(self.blocks) - {"query_to_doc"}, mask_duplicates=self.mask_duplicates,
            margin=self.margin, margin_strategy=self.margin_strategy)
        # Reported once anything can be masked beyond exact duplicates (a threshold is set), or from the first batch
        # in which a duplicate was masked on: on duplicate-free data the default diagnostics stay as they were.
        total = stats["masked_false_negatives_total"]
        if not self._reports_false_negatives and (
                self.margin is not None or (total.device.type != "meta" and bool(total > 0))):
            self._reports_false_negatives = True
        if self._reports_false_negatives:
            batch.state.false_negative_stats = stats
        return batch

    def _nothing_to_mask(self, batch: Batch) -> bool:
        """Whether the false-negative mask of every row of ``batch`` is certainly empty, so that the windows carry
        none (``None`` is what an all-False mask computes, without its (rows x candidates) tensors and their
        per-chunk cost): only duplicates are masked (no ``margin``), the loss's blocks are ``query_to_doc`` and at
        most ``doc_to_query`` (its mask is the transposed in-batch part of the first), and no two candidates share an
        embedding id or a text key. Decided once per batch (kept on it)."""
        if (not self.mask_duplicates or self.margin is not None or self.known_positives is not None
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

    def prepare_columns(self, embeddings: list[Tensor], labels: Tensor | None = None) -> Batch:
        """Check the columns and return them in float32, normalised once, as a :class:`Batch` (with gathering: of
        every process's rows), with the text keys and guide embeddings that ``forward`` saw; no masks yet
        (:meth:`window` adds those of the rows a loss computes).

        Raises ``ValueError`` for fewer than 2 columns, columns that are not (batch, dim) tensors of one batch size
        and one width, a width that differs from the model's embedding dimension recorded at construction, a batch
        smaller than :attr:`min_batch_size`, and NaN / inf entries or a norm beyond float32's range (naming the
        column). Large but finite vectors (entries of 1e20, whose squares overflow) are normalised exactly.
        """
        self.check_labels(labels)
        name = type(self).__name__
        raw = columns.checked_columns(list(embeddings), name=name, min_batch_size=self.min_batch_size,
                                      embedding_dimension=self.embedding_dimension,
                                      in_matryoshka=self._in_matryoshka)
        embeddings, n = raw, raw[0].size(0)
        units = [fn.normalize(column) for column in raw]
        local_rows = None
        if self.gather_across_devices and dist.is_distributed():
            # Every column of every process, in rank order (with gradient), normalised again row by row (the same
            # float operations on the same rows); reduce() then averages this process's own rows.
            dist.check_equal_local_batches(n, raw[0].device)
            raw = [dist.gather_with_grad(column) for column in raw]
            units = [fn.normalize(column) for column in raw]
            local_rows = (dist.local_rows(n), raw[0].size(0))
        # a pair with a (near-)zero anchor or positive has no direction: it cannot be ranked (unusable)
        zero_rows = (fn.row_norms(raw[0].detach()).squeeze(-1) < fn.NORM_EPS) | (
            fn.row_norms(raw[1].detach()).squeeze(-1) < fn.NORM_EPS)
        batch = Batch.from_units(units, raw=raw)
        batch.state = BatchState(local_rows=local_rows, zero_rows=zero_rows)
        inputs, self._side_inputs = self._side_inputs, None
        if not self.controls_false_negatives:
            return batch
        batch = false_negatives.attach_side_inputs(
            batch, inputs, len(embeddings), needs_guide=self.guide is not None,
            gathered=local_rows is not None, loss_name=type(self).__name__)
        if self.known_positives is not None and batch.device.type != "meta":
            if batch.text_keys is None:
                raise ValueError(f"{name}: known_positives needs the rows' texts (their token ids), which only forward() "
                                 "sees; call the loss through forward() / the Trainer, or pass text_keys with "
                                 "set_false_negative_inputs() before compute_loss_from_embeddings()")
            batch.known = self.known_positives
            self.known_positives.note_batch(batch.text_keys[0], name)
        return batch

    def _in_matryoshka(self) -> bool:
        """Whether ``MatryoshkaLoss`` / ``Matryoshka2dLoss`` is calling this loss with truncated embeddings: it
        decorates the model's ``forward`` with its ``ForwardDecorator`` for the duration of the call, or (GradCache)
        this loss's ``calculate_loss`` with its ``CachedLossDecorator``."""
        from sentence_transformers.sentence_transformer.losses.matryoshka import CachedLossDecorator, ForwardDecorator

        return (isinstance(getattr(self.model, "forward", None), ForwardDecorator)
                or isinstance(self.__dict__.get("calculate_loss"), CachedLossDecorator))

    # ------------------------------------------------------------------ a batch's hooks, after prepare_batch
    def begin_batch(self, batch: Batch) -> Batch:
        """Called once per batch before its rows (all windows) are computed; returns the batch the rows are
        computed on. A loss with per-batch state prepares it here (random partners drawn once, AdCSE's adversary
        gradient) and a loss that replaces rows of the batch (HNCSE's mixed positives) does so here."""
        return batch

    def end_batch(self, batch: Batch) -> None:
        """Called once per batch after its rows were computed without error (see :meth:`begin_batch`): a loss that
        commits per-batch work (AdCSE's adversary gradient) does it here."""

    def close_batch(self) -> None:
        """Called after every batch, also one that raised: drop what :meth:`begin_batch` prepared."""
