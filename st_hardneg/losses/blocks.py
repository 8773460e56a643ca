"""Sentence-transformers' ranking blocks of a batch, as a function (:func:`ranking_blocks`): the similarities of
``MultipleNegativesRankingLoss``'s directions and ``GISTEmbedLoss``'s contrast blocks, with their exclusions and the
hardness penalty, for the anchor rows a loss computes.

This module imports nothing of :mod:`st_hardneg.losses.base`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import torch
from torch import Tensor

from st_hardneg.functional import ranking as fr
from st_hardneg.losses.batch import Batch
from st_hardneg.losses.prepare import PrepareMixin
from st_hardneg.losses.queue import QueueMixin
from st_hardneg.losses.unusable import UnusableMixin

__all__ = ["RankingMixin", "ranking_blocks"]


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


class RankingMixin(PrepareMixin, QueueMixin, UnusableMixin):
    """Sentence-transformers' ranking of :class:`~st_hardneg.losses.base.HardNegativeLoss`: a paper's
    ``window_rows`` builds the blocks of its rows (:meth:`ranking_blocks`), appends its own columns and turns them
    into per-row losses (:meth:`ranking_rows`), the queue's columns and the unusable-row count included."""

    temperature: float
    partition_mode: fr.PartitionMode
    hardness_mode: fr.HardnessMode | None
    hardness_strength: float

    @property
    def scale(self) -> float:
        """sentence-transformers' name of the inverse temperature: the logits are ``similarity · scale``."""
        return 1.0 / self.temperature

    def ranking_blocks(self, batch: Batch) -> dict[str, fr.Block]:
        """The blocks of :attr:`blocks` for the rows of ``batch`` (:func:`st_hardneg.losses.blocks.ranking_blocks`
        with this loss's similarity and hardness options); then the queue's columns for these rows are read and this
        batch's candidates staged. A loss appends its own columns with :meth:`Block.with_columns`."""
        dot = self.similarity_fct_name == "dot_score"
        local = batch.state.local_rows
        out = ranking_blocks(batch, self.blocks, dot=dot, hardness_mode=self.hardness_mode,
                             hardness_strength=self.hardness_strength,
                             rows_per_process=local[0].stop - local[0].start if local is not None else None)
        row_queries = batch.raw_rows()[0] if dot else batch.row_anchors
        batch.state.queue_columns = self._read_and_stage_queue(batch, row_queries)
        return out

    def ranking_rows(self, batch: Batch, blocks: dict[str, fr.Block], focal_m: float | None = None,
                     uncounted_columns: int = 0) -> Tensor:
        """The (N,) per-row losses of the blocks of ``batch``'s rows (:func:`st_hardneg.functional.ranking.ranking_rows` with this
        loss's scale and partition mode); warns once when rows have no negative left (every candidate masked).
        With a queue its readable rows join ``query_to_doc`` here, after the loss chose its own negatives from the
        batch. ``uncounted_columns``: columns of ``query_to_doc`` that are negatives in the loss but do not make a
        row usable (AdCSE's adversaries: learned vectors, not data; they are never masked)."""
        blocks = self.join_queue_columns(batch, blocks)
        self._count_unusable_rows(batch, blocks, uncounted_columns)
        return fr.ranking_rows(blocks, self.scale, self.partition_mode, focal_m)
