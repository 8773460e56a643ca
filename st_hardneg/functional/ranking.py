"""The ranking formulation of sentence-transformers' ``MultipleNegativesRankingLoss`` (6.2) as pure functions, with
room for each paper's extra columns.

A batch of N (query, document) pairs, optionally with explicit negative documents, is scored in up to four
*directions* (ST's names): ``query_to_doc`` (query i against every document: all positives, then every negative
column), ``query_to_query`` (query i against the other queries), ``doc_to_query`` (positive i against every query) and
``doc_to_doc`` (positive i against every document that does not belong to pair i). GISTEmbedLoss's two extra blocks
are ``anchor_to_anchor`` (``contrast_anchors``: as ``query_to_query``, but only the queries of the same process) and
``positive_to_positive`` (``contrast_positives``: positive i against the other positives, no negatives).

Each direction is a :class:`Block`: an (N, C) similarity matrix, the entries that leave the softmax (``exclude``) and
an additive logit ``penalty`` (ST's hardness weighting). A loss may append per-row columns to a block (a paper's
synthetic negatives: :meth:`Block.with_columns`). :func:`ranking_rows` turns the blocks into the loss of every row,
exactly as ST does: the positive logit is ``query_to_doc[i, i]``; ``"joint"`` takes one log-sum-exp over all blocks,
``"per_direction"`` the mean of one log-sum-exp per block.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
from torch import Tensor

__all__ = [
    "DIRECTIONS",
    "Block",
    "Direction",
    "HardnessMode",
    "PartitionMode",
    "block_logits",
    "hardness_penalty",
    "own_pair_mask",
    "ranking_rows",
]

Direction = Literal["query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc"]
PartitionMode = Literal["joint", "per_direction"]
HardnessMode = Literal["in_batch_negatives", "hard_negatives", "all_negatives"]

#: sentence-transformers' four directions, in its order
DIRECTIONS: tuple[str, ...] = ("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc")
#: the blocks whose column ``i`` is row ``i``'s positive
POSITIVE_BLOCKS = frozenset({"query_to_doc", "doc_to_query"})


@dataclass
class Block:
    """One direction's candidates for every row.

    ``similarity`` (R, C): the raw similarities of R rows (cosines, or dot products); ``exclude`` (R, C) bool or
    ``None``: entries that leave the softmax (logit ``-inf``); ``penalty`` (R, C) or ``None``: added to the logits
    after the scaling (no gradient); ``has_positive``: column ``row_offset + r`` of row ``r`` is the row's positive
    (``query_to_doc``, ``doc_to_query``), which matters for a logit transform that treats positives differently
    (Focal-InfoNCE). ``row_offset``: the global index of the block's first row (0 for a whole batch; the chunk's
    start when a loss computes its rows a chunk of anchors at a time). ``learned_columns``: how many of its columns
    are learned vectors rather than data (AdCSE's adversaries): negatives in the softmax, but not candidates that
    make a row usable (a row whose every data candidate is masked teaches nothing).
    """

    similarity: Tensor
    has_positive: bool = False
    exclude: Tensor | None = None
    penalty: Tensor | None = None
    row_offset: int = 0
    learned_columns: int = 0

    def positive_columns(self) -> Tensor:
        """(R,) the column of each row's positive (``row_offset + r``)."""
        return torch.arange(self.similarity.size(0), device=self.similarity.device) + self.row_offset

    def with_columns(self, similarity: Tensor, exclude: Tensor | None = None, *, learned: bool = False) -> Block:
        """This block with per-row ``similarity`` columns (N, S) appended (a paper's extra negatives; no penalty);
        ``exclude`` (N, S) removes some of them; ``learned``: the columns are learned vectors, not data
        (:attr:`learned_columns`)."""
        n, s = similarity.shape
        if n != self.similarity.size(0):
            raise ValueError(f"extra columns have {n} rows, the block has {self.similarity.size(0)}")
        if s == 0:
            return self
        old = self.similarity.size(1)
        if self.exclude is None and exclude is None:
            new_exclude = None
        else:
            left = self.exclude if self.exclude is not None else self.similarity.new_zeros((n, old), dtype=torch.bool)
            right = exclude if exclude is not None else similarity.new_zeros((n, s), dtype=torch.bool)
            new_exclude = torch.cat([left, right.to(left.device)], dim=1)
        penalty = None if self.penalty is None else torch.cat([self.penalty, self.penalty.new_zeros(n, s)], dim=1)
        return replace(self, similarity=torch.cat([self.similarity, similarity], dim=1), exclude=new_exclude,
                       penalty=penalty, learned_columns=self.learned_columns + (s if learned else 0))

    def excluding(self, exclude: Tensor | None) -> Block:
        """This block with the entries of ``exclude`` (its first columns) also excluded."""
        if exclude is None:
            return self
        if exclude.size(1) < self.similarity.size(1):
            pad = exclude.new_zeros(exclude.size(0), self.similarity.size(1) - exclude.size(1))
            exclude = torch.cat([exclude, pad], dim=1)
        return replace(self, exclude=exclude if self.exclude is None else self.exclude | exclude)


def own_pair_mask(num_rows: int, num_columns: int, device: torch.device | str | None = None,
                  rows: tuple[int, int] | None = None) -> Tensor:
    """(R, num_columns) bool, True where a column belongs to the row's own pair: the columns are
    ``[positives (num_rows) | negative_1 (num_rows) | ...]``, column ``c`` belongs to pair ``c mod num_rows``.
    ``rows``: the ``[start, stop)`` rows to build (default all ``num_rows``)."""
    start, stop = rows if rows is not None else (0, num_rows)
    columns = torch.arange(num_columns, device=device) % num_rows
    return columns.unsqueeze(0) == torch.arange(start, stop, device=device).unsqueeze(1)


def hardness_penalty(similarity: Tensor, num_rows: int, mode: HardnessMode | None, strength: float,
                     row_offset: int = 0) -> Tensor | None:
    """ST's hardness weighting of the ``query_to_doc`` block (Lan et al. 2025, Eq. 5): ``strength · sg(similarity)``
    on the selected negatives, added to the scaled logits; ``None`` when off.

    Columns are ``[positives (num_rows) | negative_1 (num_rows) | ...]``, column ``c`` belongs to pair ``c mod
    num_rows``. ``"in_batch_negatives"``: every column of another pair; ``"hard_negatives"``: the row's own explicit
    negatives; ``"all_negatives"``: every column but the row's positive. ``similarity`` holds the rows
    ``row_offset ...`` of the batch (a chunk of anchors).
    """
    if mode is None or strength == 0.0:
        return None
    n, c = similarity.shape
    columns = torch.arange(c, device=similarity.device)
    own = own_pair_mask(num_rows, c, similarity.device, rows=(row_offset, row_offset + n))
    if mode == "in_batch_negatives":
        selected = ~own
    elif mode == "hard_negatives":
        selected = own & (columns >= num_rows).unsqueeze(0)
    elif mode == "all_negatives":
        selected = ~(own & (columns < num_rows).unsqueeze(0))
    else:
        raise ValueError(f"hardness_mode must be None, 'in_batch_negatives', 'hard_negatives' or 'all_negatives', "
                         f"got {mode!r}")
    return (strength * similarity.detach()).masked_fill(~selected, 0.0)


class _FocalLogits(torch.autograd.Function):
    """Focal-InfoNCE's scaled logits of a similarity block, ``s (s + m) · scale`` with ``s² · scale`` at the rows'
    positive entries, keeping only the similarity for the backward (``∂/∂s = (2s + m) · scale``, ``2s · scale`` at the
    positives), computed in one buffer; composed from autograd's ops, a chunk of rows would hold three more."""

    @staticmethod
    def forward(ctx: Any, sim: Tensor, rows: Tensor | None, columns: Tensor | None,  # type: ignore[override]
                m: float, scale: float) -> Tensor:
        logits = sim.square()
        logits.add_(sim, alpha=m)
        if rows is not None:
            logits[rows, columns] = sim[rows, columns].square()
        logits.mul_(scale)
        ctx.save_for_backward(sim, rows, columns)
        ctx.m, ctx.scale = m, scale
        return logits

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None, None]:  # type: ignore[override]
        sim, rows, columns = ctx.saved_tensors
        slope = sim * 2.0
        slope.add_(ctx.m)
        if rows is not None:
            slope[rows, columns] -= ctx.m
        slope.mul_(grad).mul_(ctx.scale)
        return slope, None, None, None, None


def block_logits(block: Block, scale: float, focal_m: float | None = None) -> Tensor:
    """The logits of a block: ``similarity · scale`` (Focal-InfoNCE with ``focal_m``: ``s² · scale`` for the
    positive, ``s (s + m) · scale`` for every other column), plus the penalty, with excluded entries at ``-inf``.

    A new tensor, updated in place after its first operation: autograd keeps at most the similarity of it, so a
    chunk of rows holds one (rows, columns) buffer here, not one per operation (the loss-side memory at batch
    65,536)."""
    sim = block.similarity
    if focal_m is None:
        logits = sim * scale
    elif block.has_positive:
        rows = torch.arange(sim.size(0), device=sim.device)
        logits = _FocalLogits.apply(sim, rows, block.positive_columns(), focal_m, scale)
    else:
        logits = _FocalLogits.apply(sim, None, None, focal_m, scale)
    if block.penalty is not None:
        logits.add_(block.penalty)
    if block.exclude is not None:
        logits.masked_fill_(block.exclude, float("-inf"))
    return logits


def ranking_rows(blocks: dict[str, Block], scale: float, partition_mode: PartitionMode = "joint",
                 focal_m: float | None = None) -> Tensor:
    """The (R,) loss of every row: ``log Z_i - positive_i`` with the positive logit ``query_to_doc[i, i]`` (column
    ``row_offset + r`` of row ``r`` for a chunk of anchors) and ``Z``
    the joint softmax denominator over every block (``"joint"``) or the geometric mean of one denominator per block
    (``"per_direction"``), as in sentence-transformers' ``MultipleNegativesRankingLoss``."""
    if "query_to_doc" not in blocks:
        raise ValueError("the query_to_doc block (which holds the positive pairs) is required")
    logits = {name: block_logits(block, scale, focal_m) for name, block in blocks.items()}
    q2d = logits["query_to_doc"]
    rows = torch.arange(q2d.size(0), device=q2d.device)
    # log Z - positive = logsumexp(logits - positive): subtracting first keeps the small losses of well-separated
    # rows accurate in float32 (the positive's own entry becomes exactly 0), as a cross-entropy does
    # (the logits are fresh tensors of block_logits: the subtractions run in place, nothing saved them)
    positive = q2d[rows, blocks["query_to_doc"].positive_columns()].unsqueeze(1)
    if partition_mode == "joint":
        joint = torch.cat(list(logits.values()), dim=1) if len(logits) > 1 else q2d
        return torch.logsumexp(joint.sub_(positive), dim=1)
    if partition_mode == "per_direction":
        # every block here holds the positive pair; a block's own diagonal is the same similarity as query_to_doc's
        # (up to float rounding), and subtracting it keeps that entry exactly 0
        own = {name: value[rows, blocks[name].positive_columns()].unsqueeze(1) if blocks[name].has_positive
               else positive for name, value in logits.items()}
        parts = [torch.logsumexp(value.sub_(own[name]), dim=1) for name, value in logits.items()]
        return torch.stack(parts).mean(dim=0)
    raise ValueError(f"partition_mode must be 'joint' or 'per_direction', got {partition_mode!r}")
