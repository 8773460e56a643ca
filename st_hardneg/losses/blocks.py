"""The ranking part of every loss (:class:`Ranking`): sentence-transformers' ranking of a batch and the one rule for
the rows it cannot rank. The blocks (:func:`ranking_blocks`: the similarities of ``MultipleNegativesRankingLoss``'s
directions and ``GISTEmbedLoss``'s contrast blocks, with their exclusions and the hardness penalty, for the anchor
rows a loss computes), the per-row losses with their usable rows and counts (:meth:`Ranking.rows`, returning a
:class:`Ranked`; the rule for rows left without a negative or with a zero-norm embedding:
:meth:`Ranking.unusable_rows`; judged once per batch, warned, a batch of none refused: :meth:`Ranking.judge`) and the
reduction, the mean of the usable rows (:meth:`Ranking.usable_sum`, :meth:`Ranking.mean`); and the diagnostics of a
batch computed a chunk of rows at a time (:func:`combine_chunk_stats`). The ranking never calls the queue: the compute
template joins the queue's columns to the blocks before it hands them here.

This module imports nothing of :mod:`st_hardneg.losses.base`.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable
from typing import Any, NamedTuple, cast

import torch
from torch import Tensor

from st_hardneg import functional as fn
from st_hardneg.functional import ranking as fr
from st_hardneg.losses import distributed as dist
from st_hardneg.losses.batch import Batch, BatchState

__all__ = ["Ranked", "Ranking", "UnusableTally", "combine_chunk_stats", "count_negatives",
           "ranking_blocks", "unusable_causes", "unusable_stats", "usable_rows"]

logger = logging.getLogger(__name__)


class UnusableTally(NamedTuple):
    """The unusable rows of a batch (or of a chunk of its rows)."""

    rows: int
    empty: int  # rows without a negative left
    zero: int  # rows with a zero-norm anchor or positive
    unusable: int  # either
    masked: float  # masked candidate entries
    entries: int  # candidate entries (rows x candidates)
    counted: bool  # whether the negatives left were counted (something was masked, or a batch of one)

    def __add__(self, other: tuple[Any, ...]) -> UnusableTally:  # type: ignore[override]
        o = cast(UnusableTally, other)
        return UnusableTally(self.rows + o.rows, self.empty + o.empty, self.zero + o.zero,
                             self.unusable + o.unusable, self.masked + o.masked, self.entries + o.entries,
                             self.counted or o.counted)

    def as_tensor(self, device: torch.device | str) -> Tensor:
        """The counts as one float64 tensor (for one all-reduce across processes)."""
        return torch.tensor([self.rows, self.empty, self.zero, self.unusable, self.masked, self.entries,
                             float(self.counted)], dtype=torch.float64, device=device)

    @classmethod
    def from_values(cls, values: list[float]) -> UnusableTally:
        return cls(int(values[0]), int(values[1]), int(values[2]), int(values[3]), values[4], int(values[5]),
                   values[6] > 0)


class Ranked(NamedTuple):
    """The rows of one window (:meth:`Ranking.rows`): their losses, which of them count, and their counts."""

    #: (R,) the loss of each row
    losses: Tensor
    #: (R,) bool, the rows that count in the mean, or ``None``: every row
    usable: Tensor | None
    #: the window's unusable-row counts, or ``None`` (not counted: the meta device)
    tally: UnusableTally | None


def count_negatives(blocks: dict[str, fr.Block]) -> tuple[Tensor | None, int, Tensor, int]:
    """``(available, rows, masked, candidates)`` of the ranking ``blocks``: the (R,) negatives left to each row
    (every entry but the positive, the masked ones and the learned columns of ``query_to_doc``, AdCSE's adversaries,
    :attr:`~st_hardneg.functional.ranking.Block.learned_columns`; ``None`` when nothing was masked and R > 1: every
    row has negatives), the number of rows, the masked entries and the candidates per row."""
    q2d = blocks["query_to_doc"]
    n = q2d.similarity.size(0)
    available: Tensor | None = None
    total = 0
    masked = torch.zeros((), dtype=torch.long, device=q2d.similarity.device)
    if q2d.exclude is not None or n <= 1 or any(b.exclude is not None for b in blocks.values()):
        # the positive entry of a block is never excluded: a row's negatives are its other entries that are not
        available = torch.zeros(n, dtype=torch.long, device=q2d.similarity.device)
        for block in blocks.values():
            count = block.similarity.size(1) - int(block.has_positive)
            excluded = block.exclude.sum(dim=1) if block.exclude is not None else None
            available += count if excluded is None else count - excluded
            if block.learned_columns:  # not candidates: neither a negative left nor a maskable entry
                available -= block.learned_columns
                count -= block.learned_columns
            total += count
            if excluded is not None:
                masked = masked + excluded.sum()
    return available, n, masked, total


def usable_rows(available: Tensor | None, zero: Tensor | None) -> Tensor | None:
    """(n,) bool of the rows that count in the loss (a negative left, anchor and positive not near zero), or
    ``None`` when every row does. ``zero``: the rows with a (near-)zero anchor or positive, or ``None``."""
    usable = available > 0 if available is not None else None
    if zero is not None and bool(zero.any()):
        usable = ~zero if usable is None else usable & ~zero.to(usable.device)
    return usable


def unusable_stats(tally: UnusableTally, reporting: bool) -> dict[str, Tensor]:
    """The diagnostics of a batch's tally: ``rows_without_negatives`` and ``masked_fraction`` (when the negatives
    were counted and false negatives are reported, or some row is unusable), ``zero_norm_rows`` and
    ``unusable_fraction`` (when some row is unusable)."""
    out: dict[str, Tensor] = {}
    if tally.counted and (reporting or tally.unusable):
        out.update(rows_without_negatives=torch.tensor(float(tally.empty)),
                   masked_fraction=torch.tensor(tally.masked / max(tally.entries, 1)))
    if tally.unusable:
        out.update(zero_norm_rows=torch.tensor(float(tally.zero)),
                   unusable_fraction=torch.tensor(tally.unusable / tally.rows))
    return out


def unusable_causes(tally: UnusableTally, known_positives: bool = False) -> list[str]:
    """Why rows of the batch are unusable, one clause per cause (for the warning and the error)."""
    n = tally.rows
    causes = []
    if tally.empty:
        causes.append(f"{tally.empty} of {n} rows of a batch have no negative left (every candidate was masked as a "
                      "false negative, or the batch repeats one text; check margin / mask_duplicates"
                      + (" / known_positives (the mapping marks every candidate of these rows relevant)"
                         if known_positives else "")
                      + " and the data, e.g. BatchSamplers.NO_DUPLICATES)")
    if tally.zero:
        causes.append(f"{tally.zero} of {n} rows have an anchor or positive embedding of norm below "
                      f"{fn.NORM_EPS:g} (no direction to rank; a collapsed or broken model?)")
    return causes


def combine_chunk_stats(pieces: list[tuple[int, dict[str, Tensor]]]) -> dict[str, Tensor]:
    """The diagnostics of a batch from those of its chunks of rows: totals (``*_total``) add up, the queue's row
    count is the same for every chunk, every other entry is a mean over rows (weighted by the chunk's rows)."""
    if not pieces:
        return {}
    rows = sum(n for n, _ in pieces)
    out: dict[str, Tensor] = {}
    for key in dict.fromkeys(k for _, stats in pieces for k in stats):
        values = [(n, stats[key]) for n, stats in pieces if key in stats]
        if key.endswith("_total"):
            out[key] = sum((v.double().cpu() for _, v in values), torch.zeros((), dtype=torch.float64))
        elif key in ("queue_rows_read", "anchor_queue_rows_read"):
            out[key] = values[-1][1]
        else:
            # a chunk without the masked counts had nothing masked (they are reported from the first masked entry
            # on): it counts as 0 over its rows
            weight = rows if key in ("masked_false_negatives", "masked_known_positives") else (
                sum(n for n, _ in values) or rows)
            out[key] = sum((v.double().cpu() * n for n, v in values), torch.zeros((), dtype=torch.float64)) / weight
    return out


class Ranking:
    """The ranking part a loss owns (``loss.ranking``): sentence-transformers' blocks of a window's rows
    (:meth:`blocks`), their per-row losses with the unusable-row rule (:meth:`rows`), the batch's judgement
    (:meth:`judge`) and the reduction (:meth:`usable_sum`, :meth:`mean`). It is given blocks and returns values; it
    calls no other part.

    Args:
        loss_name: the loss's class name, for the messages.
        blocks: the blocks of the softmax (``directions`` plus GIST's contrast blocks).
        dot: score with ``dot_score`` on the raw rows (else cosines of the unit rows).
        temperature: τ; the logits are ``similarity / τ`` (sentence-transformers' ``scale`` = 1 / τ).
        partition_mode, hardness_mode, hardness_strength: sentence-transformers' options of the same names.
        known_positives: whether the loss masks known relevance (named in the unusable-row message).
    """

    def __init__(self, loss_name: str, *, blocks: tuple[str, ...], dot: bool, temperature: float,
                 partition_mode: fr.PartitionMode, hardness_mode: fr.HardnessMode | None, hardness_strength: float,
                 known_positives: bool) -> None:
        self.loss_name = loss_name
        self.names = blocks
        self.dot = dot
        self.temperature = temperature
        self.partition_mode, self.hardness_mode, self.hardness_strength = (partition_mode, hardness_mode,
                                                                           hardness_strength)
        self.known_positives = known_positives
        self._warned_unusable = False

    @property
    def scale(self) -> float:
        """sentence-transformers' name of the inverse temperature: the logits are ``similarity · scale``."""
        return 1.0 / self.temperature

    def blocks(self, batch: Batch) -> dict[str, fr.Block]:
        """sentence-transformers' blocks of the loss for the rows of ``batch`` (:func:`ranking_blocks` with the
        loss's similarity and hardness options). A paper appends its columns with :meth:`Block.with_columns`."""
        local = batch.state.local_rows
        return ranking_blocks(batch, self.names, dot=self.dot, hardness_mode=self.hardness_mode,
                              hardness_strength=self.hardness_strength,
                              rows_per_process=local[0].stop - local[0].start if local is not None else None)

    def rows(self, batch: Batch, blocks: dict[str, fr.Block], focal_m: float | None = None) -> Ranked:
        """The (R,) per-row losses of the blocks of ``batch``'s rows (:func:`st_hardneg.functional.ranking.ranking_rows`
        with the loss's scale and partition mode; ``focal_m``: Focal-InfoNCE's logit rule), with the rows that count
        and their counts (:meth:`unusable_rows`; the learned columns of a block do not make a row usable)."""
        available, n, masked, total = count_negatives(blocks)
        if batch.size == 1 and batch.negatives.size(0) == 0:
            # one pair and no explicit negative: no candidate was masked, there is none; the row is computed as
            # sentence-transformers' MNRL computes it (its positive alone, and any column a paper adds)
            available = None
        usable, tally = self.unusable_rows(batch, available, n, masked, total,
                                           start=blocks["query_to_doc"].row_offset)
        return Ranked(fr.ranking_rows(blocks, self.scale, self.partition_mode, focal_m), usable, tally)

    # ------------------------------------------------------------------ the unusable-row rule
    @staticmethod
    def _window_zero_rows(state: BatchState, start: int, n: int) -> Tensor | None:
        """(n,) bool: the rows ``start .. start + n`` whose anchor or positive has a (near-)zero norm, or ``None``."""
        zero = state.zero_rows
        if zero is None or zero.device.type == "meta" or zero.size(0) < start + n:
            return None
        return zero[start:start + n]

    def unusable_rows(self, batch: Batch, available: Tensor | None, n: int, masked: Tensor | int = 0,
                      total: int = 0, start: int = 0) -> tuple[Tensor | None, UnusableTally | None]:
        """The one rule for rows that cannot teach anything, for every loss and layout: ``(usable, tally)`` of the
        rows ``start .. start + n`` of the batch (a chunk of anchors, or this process's rows). A row is unusable
        when it has no unmasked negative (``available``, the (n,) count of negatives left to each row, is 0: every
        candidate was masked as a false negative; columns that are not data, AdCSE's adversaries, do not count) or
        when its anchor or positive has a norm below ``NORM_EPS`` (no direction: cosine 0 with everything). The
        reduction averages the usable rows only (``usable``: ``None`` when every row is); :meth:`judge` (once per
        batch, on :meth:`batch_tally`) refuses a batch with no usable row (``ValueError``) and warns once per loss
        about the first batch with some (``warnings`` and ``logging``), with the counts, which the diagnostics
        report as ``rows_without_negatives``, ``zero_norm_rows``, ``unusable_fraction`` and ``masked_fraction``
        (``masked`` of ``total`` × n candidates). ``available`` is ``None`` when nothing was masked and every row
        has negatives."""
        device = available.device if available is not None else None
        if device is not None and device.type == "meta":
            return None, None
        zero = self._window_zero_rows(batch.state, start, n)
        usable = usable_rows(available, zero)
        count_zero = int(zero.sum()) if zero is not None else 0
        count_empty = int((available == 0).sum()) if available is not None else 0
        count_unusable = n - int(usable.sum()) if usable is not None else 0
        tally = UnusableTally(n, count_empty, count_zero, count_unusable, float(masked), total * n,
                              available is not None)
        return (usable if count_unusable else None), tally

    @staticmethod
    def global_tally(state: BatchState, tally: UnusableTally) -> UnusableTally:
        """With a gathered batch of which this process computed its own rows only: the counts of every process
        (one all-reduce), so that every process judges the same global batch."""
        if state.local_rows is None or tally.rows == state.local_rows[1]:
            return tally
        device = state.zero_rows.device if state.zero_rows is not None else "cpu"
        return UnusableTally.from_values(dist.sum_across(tally.as_tensor(device)).tolist())

    def batch_tally(self, state: BatchState) -> UnusableTally | None:
        """The unusable rows of the whole batch: the tallies of its windows (``state.windows``) added up, of every
        process (``None``: nothing was counted, e.g. on the meta device)."""
        tallies = [record.tally for record in state.windows if record.tally is not None]
        if not tallies:
            return None
        return self.global_tally(state, sum(tallies[1:], tallies[0]))

    def judge(self, tally: UnusableTally | None) -> None:
        """Judge the batch's unusable rows once (:meth:`batch_tally`): raise ``ValueError`` when none is usable, warn
        once per loss when some are (their counts are the diagnostics of :func:`unusable_stats`)."""
        if tally is None:
            return
        name = self.loss_name
        causes = unusable_causes(tally, self.known_positives)
        if tally.unusable == tally.rows:
            raise ValueError(f"{name}: no usable row in this batch: " + "; ".join(causes) + ". There is nothing to "
                             "learn from it.")
        if tally.unusable and not self._warned_unusable:
            self._warned_unusable = True
            message = (f"{name}: " + "; ".join(causes) + ". They teach nothing and are left out of the batch's mean "
                       "loss. The diagnostics report rows_without_negatives, zero_norm_rows, unusable_fraction and "
                       "masked_fraction. This warning is shown once.")
            logger.warning(message)
            warnings.warn(message, UserWarning, stacklevel=5)

    # ------------------------------------------------------------------ the reduction
    def usable_sum(self, rows: Tensor, batch: Batch, usable: Tensor | None = None) -> tuple[Tensor, int, int | None]:
        """``(sum, count, global count)``: the sum of the losses of this process's usable rows among ``rows`` (the
        (R,) rows of ``batch``'s window, or the (N,) rows of a gathered batch computed whole), how many they are, and
        for rows computed whole after a gathering the usable rows of every process (else ``None``: :meth:`mean`
        adds the processes' counts up). ``usable``: the rows that count (:class:`Ranked`; ``None``: every row)."""
        state = batch.state
        if usable is not None and usable.size(0) != rows.size(0):
            usable = None
        start, stop = batch.row_range
        every: int | None = None
        if state.local_rows is not None:
            own, total = state.local_rows
            if rows.size(0) == total and total != own.stop - own.start and (start, stop) == (0, total):
                # every process's rows: this process's share, over the usable rows of the global batch
                every = int(usable.sum()) if usable is not None else total
                rows, usable = rows[own], (usable[own] if usable is not None else None)
            elif rows.size(0) != stop - start:
                raise ValueError(f"{self.loss_name}.reduce: expected one loss per row of the gathered batch "
                                 f"({total}) or of this process ({own.stop - own.start}), got {rows.size(0)}")
        elif rows.size(0) != stop - start:
            raise ValueError(f"{self.loss_name}.reduce: expected one loss per row computed ({stop - start}), got "
                             f"{rows.size(0)}")
        if usable is not None:
            return rows[usable].sum(), int(usable.sum()), every
        return rows.sum(), rows.size(0), every

    def mean(self, total: Tensor, count: int, state: BatchState, every: int | None = None
             ) -> tuple[Tensor, Tensor | float]:
        """The batch's loss from :meth:`usable_sum`'s totals of this process's rows, and the factor each row's loss
        (so its gradient) takes in it: the mean over the usable rows. After a gathering it is weighted so that the
        processes' mean (what DDP averages) is the mean over every process's usable rows (``every``, or the
        processes' counts added up: one all-reduce)."""
        if state.local_rows is not None:
            own, rows = state.local_rows
            world = rows // (own.stop - own.start)
            counted = torch.tensor(float(every if every is not None else count), dtype=total.dtype,
                                   device=total.device)
            global_count = (counted if every is not None else dist.sum_across(counted)).clamp_min(1)
            return total * world / global_count, world / global_count
        count = max(count, 1)
        return total / count, 1.0 / count

    def reduce(self, rows: Tensor, batch: Batch | None = None) -> Tensor:
        """The loss of a batch from the per-row losses of its rows: the mean of the usable rows (:meth:`usable_sum`,
        then :meth:`mean`). ``batch``: the batch the rows were computed on (its window, usable rows and gathering;
        ``None``: every row, one process)."""
        if batch is None:
            total, count, every = rows.sum(), rows.size(0), None
            return self.mean(total, count, BatchState(), every)[0]
        total, count, every = self.usable_sum(rows, batch, None)
        return self.mean(total, count, batch.state, every)[0]


def ranking_blocks(batch: Batch, names: Iterable[str], *, dot: bool, hardness_mode: fr.HardnessMode | None,
                   hardness_strength: float, rows_per_process: int | None = None) -> dict[str, fr.Block]:
    """The blocks ``names`` (``query_to_doc`` always) for the rows of ``batch`` as sentence-transformers'
    ``MultipleNegativesRankingLoss`` (and ``GISTEmbedLoss`` for the contrast blocks) builds them: similarities
    (cosines of the unit rows, or with ``dot`` dot products of the raw rows), the excluded entries (a row itself, the
    documents of its own pair in ``doc_to_doc``, other processes' anchors in ``anchor_to_anchor`` when the batch was
    gathered from processes of ``rows_per_process`` rows each, and the masked false negatives of ``batch``) and the
    hardness penalty of ``query_to_doc``. A loss appends its own columns with :meth:`Block.with_columns`."""
    queries, positives = cast(tuple[Tensor, Tensor], (batch.raw_anchors, batch.raw_positives) if dot
                              else (batch.anchors, batch.positives))
    row_queries, row_positives = batch.raw_rows() if dot else (batch.row_anchors, batch.row_positives)
    documents = batch.raw_candidates if dot else batch.candidates
    n, device = batch.size, batch.device
    start, stop = batch.row_range
    masks = batch.block_masks or {}
    local = torch.arange(stop - start, device=device)
    self_mask = torch.zeros(stop - start, n, dtype=torch.bool, device=device)
    self_mask[local, local + start] = True  # row r is the batch's row start + r
    out: dict[str, fr.Block] = {}
    q2d = row_queries @ documents.T
    out["query_to_doc"] = fr.Block(
        q2d, has_positive=True, exclude=batch.false_negatives, row_offset=start,
        penalty=fr.hardness_penalty(q2d, n, hardness_mode, hardness_strength, row_offset=start))
    for name in names:
        if name == "query_to_doc":
            continue
        if name in ("query_to_query", "anchor_to_anchor"):
            exclude = self_mask.clone()
            if name == "anchor_to_anchor" and rows_per_process is not None:
                # GISTEmbedLoss does not gather the anchors: only this process's anchors are contrasted
                process = torch.arange(n, device=device) // rows_per_process
                exclude |= process[start:stop].unsqueeze(1) != process.unsqueeze(0)
            block = fr.Block(row_queries @ queries.T, exclude=exclude, row_offset=start)
        elif name == "doc_to_query":
            block = fr.Block(row_positives @ queries.T, has_positive=True, row_offset=start)
        elif name == "doc_to_doc":
            block = fr.Block(row_positives @ documents.T, row_offset=start,
                             exclude=fr.own_pair_mask(n, documents.size(0), device, rows=(start, stop)))
        elif name == "positive_to_positive":
            block = fr.Block(row_positives @ positives.T, exclude=self_mask.clone(), row_offset=start)
        else:  # pragma: no cover - the constructor validated the names
            raise ValueError(f"unknown block {name!r}")
        out[name] = block.excluding(masks.get(name))
    return out


