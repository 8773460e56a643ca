"""Rows that cannot teach anything, as functions of the ranking blocks: the negatives left to each row, the tally
of a batch's unusable rows, its diagnostics and its message (the rule: :meth:`HardNegativeLoss.note_unusable_rows`);
and the diagnostics of a batch computed a chunk of rows at a time.

This module imports nothing of :mod:`st_hardneg.losses.base`.
"""

from __future__ import annotations

from typing import Any, NamedTuple, cast

import torch
from torch import Tensor

from st_hardneg import functional as fn
from st_hardneg.functional import ranking as fr

__all__ = ["UnusableTally", "combine_chunk_stats", "count_negatives", "unusable_causes", "unusable_stats",
           "usable_rows"]


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


def count_negatives(blocks: dict[str, fr.Block], uncounted_columns: int = 0
                    ) -> tuple[Tensor | None, int, Tensor, int]:
    """``(available, rows, masked, candidates)`` of the ranking ``blocks``: the (R,) negatives left to each row
    (every entry but the positive, the masked ones and ``uncounted_columns`` never-masked columns of
    ``query_to_doc``, AdCSE's adversaries; ``None`` when nothing was masked and R > 1: every row has negatives), the
    number of rows, the masked entries and the candidates per row."""
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
            if block is q2d:  # not candidates: neither a negative left nor a maskable entry
                available -= uncounted_columns
                count -= uncounted_columns
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
