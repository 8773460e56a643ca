"""What a loss computes on: :class:`Batch`, the float32 unit embeddings of one training batch split by role, and
:func:`column_name` (the text ids of the inputs are :func:`st_hardneg.losses.keys.text_keys`).

This module imports nothing else from :mod:`st_hardneg.losses`: every other loss module may import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from st_hardneg.losses.relevance import KnownPositives

__all__ = ["Batch", "BatchState", "CallContext", "SideInputs", "WindowRecord", "column_name"]


@dataclass
class WindowRecord:
    """What the compute template learned from one window of rows, kept until the batch's windows are done: the
    usable rows (``None``: every row), their unusable-row counts (``blocks.UnusableTally``; not imported here, as
    blocks.py imports this module) and the window's statistics (mean cosines and counts)."""

    usable: Tensor | None
    tally: Any
    stats: dict[str, Tensor]
    #: how many rows the window has (the weight of its statistics in the batch's)
    rows: int


@dataclass
class BatchState:
    """What spans the windows of one batch (every window cut from it shares one): the gathering's rows, the rows
    that cannot be ranked, the paper's per-batch draws and the template's record of each window computed. Nothing
    here is written by one part for another to read and clear: every other value a part computes is returned."""

    #: (this process's rows, global rows) after a gathering preparer, else ``None``
    local_rows: tuple[slice, int] | None = None
    #: (N,) bool: the rows whose anchor or positive has a (near-)zero norm (unusable), or ``None``
    zero_rows: Tensor | None = None
    #: the paper's draws for this batch, by name, made once by its ``begin_batch`` (MixCSE's partners, HNCSE's
    #: pairs to mix) and what its windows add up for ``end_batch`` (AdCSE's adversary gradient)
    draws: dict[str, Any] = field(default_factory=dict)
    #: the compute template's record of each window computed, in order (judged and reported once per batch)
    windows: list[WindowRecord] = field(default_factory=list)


@dataclass
class Batch:
    """The embeddings of one training batch in float32, split by role.

    ``anchors`` (N, d), ``positives`` (N, d) and ``negatives`` (N·k, d) are unit rows (normalised exactly once, by
    :func:`st_hardneg.functional.normalize`); ``negatives`` stacks the k explicit negative columns column after column
    (as sentence-transformers orders its candidate columns). ``raw_anchors`` / ``raw_positives`` are the same rows
    before normalisation (float32), for methods defined on unnormalised vectors.
    """

    anchors: Tensor
    positives: Tensor
    negatives: Tensor
    raw_anchors: Tensor | None = None
    raw_positives: Tensor | None = None
    #: (num_columns, N) long text ids of every input row (equal id = identical text), when ``forward`` saw token ids
    text_keys: Tensor | None = None
    #: the guide model's unit embeddings of the same rows (a :class:`Batch`), when a ``guide`` is configured
    guide: Batch | None = None
    #: (N, N + N·k) bool, True where candidate ``c`` is a masked false negative of anchor ``i`` (never ``c == i``);
    #: ``None`` when false-negative control is off
    false_negatives: Tensor | None = None
    #: the raw (float32, unnormalised) explicit negatives, stacked as ``negatives``
    raw_negatives: Tensor | None = None
    #: the masked false negatives of the other ranking blocks (``doc_to_query``, ``query_to_query``...), by name
    block_masks: dict[str, Tensor] | None = None
    #: the ``[start, stop)`` anchor rows a loss computes on this batch (a chunk of anchors, or this process's own
    #: rows of a gathered batch); ``None``: every row. ``false_negatives`` and ``block_masks`` hold these rows only.
    rows: tuple[int, int] | None = None
    #: (N + C,) ids of ``[anchors; candidates]``, equal for identical embeddings (``false_negatives.duplicate_ids``)
    duplicate_ids: Tensor | None = None
    #: whether no two candidates share an embedding id or a text key (``HardNegativeLoss._nothing_to_mask``)
    nothing_to_mask: bool | None = None
    #: the batch before the loss replaced some of its rows (HNCSE's mixed positives): false negatives are judged
    #: on it (duplicates and the margin without a guide), as before the replacement
    unmixed: Batch | None = None
    #: the loss's ``known_positives`` index: a candidate whose text key it pairs with anchor ``i``'s is masked
    #: (needs :attr:`text_keys`)
    known: KnownPositives | None = None
    #: the false-negative counts of the rows computed (their masks' totals), set by the preparer's ``window``
    false_negative_stats: dict[str, Tensor] = field(default_factory=dict)
    #: with ``queue_source="ema"`` in training: the queue's key encoder's rows of this batch's input columns (one per
    #: column, ``None`` for the anchors without ``queue_anchors``), from the call's :class:`CallContext`
    queue_keys: list[Tensor | None] | None = None
    #: what the loss learned about the batch while computing it (shared by every window cut from it)
    state: BatchState = field(default_factory=BatchState)

    @property
    def judged(self) -> Batch:
        """The embeddings whose duplicates and (without a guide) similarities decide the false negatives."""
        return self.unmixed if self.unmixed is not None else self

    @property
    def size(self) -> int:
        """N, the pairs of the (global) batch: every column holds N rows (explicit negatives N per column)."""
        return self.anchors.size(0)

    @property
    def row_range(self) -> tuple[int, int]:
        """``[start, stop)`` of the rows computed (:attr:`rows`, or all N)."""
        return self.rows if self.rows is not None else (0, self.size)

    @property
    def row_anchors(self) -> Tensor:
        """The unit anchors of the rows computed (the query side of ``query_to_doc``)."""
        start, stop = self.row_range
        return self.anchors[start:stop]

    @property
    def row_positives(self) -> Tensor:
        """The unit positives of the rows computed (the query side of ``doc_to_query`` / ``doc_to_doc``)."""
        start, stop = self.row_range
        return self.positives[start:stop]

    def raw_rows(self) -> tuple[Tensor, Tensor]:
        """``(raw anchors, raw positives)`` of the rows computed (for ``dot_score``)."""
        if self.raw_anchors is None or self.raw_positives is None:
            raise ValueError("this batch has no raw (unnormalised) rows")
        start, stop = self.row_range
        return self.raw_anchors[start:stop], self.raw_positives[start:stop]

    @property
    def device(self) -> torch.device:
        return self.anchors.device

    @property
    def candidates(self) -> Tensor:
        """Shared candidates of the anchor → positive direction: in-batch positives, then explicit negatives."""
        if self.negatives.size(0) == 0:
            return self.positives
        return torch.cat([self.positives, self.negatives], dim=0)

    @property
    def raw_candidates(self) -> Tensor:
        """:attr:`candidates` before normalisation (for ``dot_score``)."""
        if self.raw_anchors is None or self.raw_positives is None:
            raise ValueError("this batch has no raw (unnormalised) rows")
        if self.raw_negatives is None or self.raw_negatives.size(0) == 0:
            return self.raw_positives
        return torch.cat([self.raw_positives, self.raw_negatives], dim=0)

    @classmethod
    def from_units(cls, units: list[Tensor], raw: list[Tensor] | None = None, **fields: Tensor | None) -> Batch:
        """A batch from per-column unit rows ``[anchors, positives, negative_1, ...]`` and, optionally, the same
        columns before normalisation (``raw``)."""
        width = units[0].size(1)
        negatives = torch.cat(units[2:], dim=0) if len(units) > 2 else units[0].new_zeros((0, width))
        if raw is not None:
            fields = {"raw_anchors": raw[0], "raw_positives": raw[1],
                      "raw_negatives": torch.cat(raw[2:], dim=0) if len(raw) > 2 else raw[0].new_zeros((0, width)),
                      **fields}
        return cls(units[0], units[1], negatives, **fields)  # type: ignore[arg-type]


@dataclass
class SideInputs:
    """What ``forward`` knows about a batch besides its embeddings, for the false-negative mask of the
    ``compute_loss_from_embeddings`` call that follows it."""

    #: (num_columns, N) text ids (:func:`~st_hardneg.losses.keys.text_keys`), or ``None``
    text_keys: Tensor | None = None
    #: the guide model's embeddings, one (N, d') tensor per column, or ``None``
    guide: list[Tensor] | None = None


@dataclass(frozen=True)
class CallContext:
    """What one call of a loss knows about its batch besides the embeddings, built by ``forward`` before the model
    runs and passed to :meth:`~st_hardneg.losses.base.HardNegativeLoss.compute` with them.

    It lives exactly as long as the call: under GradCache every ``calculate_loss`` of one cached forward computes
    with it (``MatryoshkaLoss`` calls ``calculate_loss`` once per dimension), and nothing of it is left on the loss
    afterwards. ``compute_loss_from_embeddings`` passes an empty one (or what
    :meth:`~st_hardneg.losses.base.HardNegativeLoss.set_false_negative_inputs` gave for that call).
    """

    #: the rows' text keys and the guide's embeddings, for the false-negative masks (``None``: none)
    side_inputs: SideInputs | None = None
    #: with ``queue_source="ema"`` in training: the queue's key encoder's rows of every input column
    queue_keys: list[Tensor | None] | None = None
    #: under GradCache: ``{column: its embeddings without gradient}`` of the columns another module embeds (AdCSE's
    #: key encoder; :meth:`~st_hardneg.losses.gradcache.GradCacheMixin.frozen_columns`), put in their places among
    #: the cached columns by :meth:`~st_hardneg.losses.gradcache.GradCacheEngine.columns`
    frozen_columns: dict[int, Tensor] = field(default_factory=dict)


def column_name(index: int) -> str:
    """``anchor``, ``positive``, ``negative_1``, ... for input column ``index``."""
    return ("anchor", "positive")[index] if index < 2 else f"negative_{index - 1}"
