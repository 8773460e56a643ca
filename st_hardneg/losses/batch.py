"""What a loss computes on: :class:`Batch`, the float32 unit embeddings of one training batch split by role, and the
column helpers that read the tokenised inputs (:func:`text_keys`, :func:`column_name`).

This module imports nothing else from :mod:`st_hardneg.losses`: every other loss module may import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from st_hardneg.losses.relevance import KnownPositives

__all__ = ["Batch", "SideInputs", "column_name", "text_keys"]


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
    def row_count(self) -> int:
        start, stop = self.row_range
        return stop - start

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

    def row_index(self) -> Tensor:
        """(R,) the global index of each row computed (its positive's column in ``query_to_doc``)."""
        start, stop = self.row_range
        return torch.arange(start, stop, device=self.device)

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

    #: (num_columns, N) text ids (:func:`text_keys`), or ``None``
    text_keys: Tensor | None = None
    #: the guide model's embeddings, one (N, d') tensor per column, or ``None``
    guide: list[Tensor] | None = None


def column_name(index: int) -> str:
    """``anchor``, ``positive``, ``negative_1``, ... for input column ``index``."""
    return ("anchor", "positive")[index] if index < 2 else f"negative_{index - 1}"


#: the primes (below 2**31) and bases of :func:`text_keys`' two polynomial hashes; fixed, as every process must agree
KEY_PRIMES = (2_147_483_647, 2_147_483_629)
KEY_BASES = (1_000_003, 911_382_323)
#: rows hashed at a time (a few (rows, L) int64 buffers: 2 MB each at L = 32)
KEY_BLOCK_ROWS = 8192


def _powers(base: int, prime: int, length: int, device: torch.device) -> Tensor:
    """``base ** j mod prime`` for ``j < length``, int64 (exact: Python integers)."""
    values, value = [], 1
    for _ in range(length):
        values.append(value)
        value = value * base % prime
    return torch.tensor(values, dtype=torch.long, device=device)


def _hash_terms(tokens: Tensor, positions: Tensor, prime: int, powers: Tensor) -> Tensor:
    """``(token + 1) * base ** position mod prime``, elementwise (every factor < 2**31: no int64 overflow)."""
    return (tokens.remainder(prime).add_(1).remainder_(prime) * powers[positions]).remainder_(prime)


def _combine(hashes: list[Tensor]) -> Tensor:
    """Two hashes below 2**31 packed into one int64 key (62 bits)."""
    return hashes[0].bitwise_left_shift(31).bitwise_or_(hashes[1])


def _padded_keys(input_ids: Tensor, attention: Tensor | None) -> Tensor:
    """(N,) keys of a padded (N, L) column, ``KEY_BLOCK_ROWS`` rows at a time; masked positions are skipped, so the
    padding's side and length do not matter."""
    n, length = input_ids.shape
    device = input_ids.device
    tables = [_powers(b, p, length, device) for b, p in zip(KEY_BASES, KEY_PRIMES, strict=True)]
    keys = torch.empty(n, dtype=torch.long, device=device)
    for start in range(0, n, KEY_BLOCK_ROWS):
        ids = input_ids[start:start + KEY_BLOCK_ROWS].long()
        keep = torch.ones_like(ids, dtype=torch.bool) if attention is None \
            else attention[start:start + KEY_BLOCK_ROWS].bool()
        positions = keep.cumsum(1).sub_(1).clamp_(min=0)  # a kept token's position among the kept ones
        hashes = [_hash_terms(ids, positions, p, t).masked_fill_(~keep, 0).sum(1).remainder_(p)
                  for p, t in zip(KEY_PRIMES, tables, strict=True)]
        keys[start:start + KEY_BLOCK_ROWS] = _combine(hashes)
    return keys


def _packed_keys(input_ids: Tensor, bounds: Tensor) -> Tensor:
    """(R,) keys of a packed (1, total) column cut at ``bounds`` (``cu_seq_lens_q``, R + 1 offsets)."""
    flat = input_ids.reshape(-1).long()
    bounds = bounds.to(device=flat.device, dtype=torch.long)
    rows = bounds.numel() - 1
    index = torch.arange(int(bounds[0]), int(bounds[-1]), device=flat.device)  # the tokens of some row
    flat = flat[index]
    row = torch.searchsorted(bounds[1:], index, right=True)  # the row of every token
    positions = index - bounds[row]
    longest = int((bounds[1:] - bounds[:-1]).max()) if rows > 0 else 0
    hashes = []
    for b, p in zip(KEY_BASES, KEY_PRIMES, strict=True):
        terms = _hash_terms(flat, positions, p, _powers(b, p, max(longest, 1), flat.device))
        hashes.append(torch.zeros(rows, dtype=torch.long, device=flat.device).index_add_(0, row, terms).remainder_(p))
    return _combine(hashes)


def text_keys(sentence_features: list[dict[str, Tensor]]) -> Tensor | None:
    """(num_columns, N) long ids of the rows' texts, equal for identical token ids under the attention mask (i.e.
    identical texts), compared across all columns; packed inputs (``cu_seq_lens_q``, flash-attention style) are cut
    into their rows first. ``None`` if a column has no ``input_ids``.

    The id packs two polynomial hashes of the kept token ids, ``sum_j (t_j + 1) * B**j mod P`` for two fixed primes
    ``P`` below 2**31 (:data:`KEY_PRIMES`, :data:`KEY_BASES`), into 62 bits. It is computed with tensor operations on
    the ids' own device, ``KEY_BLOCK_ROWS`` rows at a time, so its memory does not grow with the batch (hashing
    Python tuples of a batch of 65,536 rows of 32 tokens held 165 MB of Python integers for a moment) and it is the
    same on every process and device, so ids from different processes can be compared after gathering. Two different
    texts of at most L tokens share an id only if both hashes collide, each with probability at most about L / 2**31
    for random texts."""
    keys = []
    for features in sentence_features:
        input_ids = features.get("input_ids") if isinstance(features, Mapping) else None  # dict or BatchEncoding
        if isinstance(input_ids, Tensor) and "cu_seq_lens_q" in features:
            keys.append(_packed_keys(input_ids, torch.as_tensor(features["cu_seq_lens_q"])))
            continue
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
            return None
        attention = features.get("attention_mask")
        keys.append(_padded_keys(input_ids, attention if isinstance(attention, Tensor)
                                 and attention.shape == input_ids.shape else None))
    return torch.stack([k.to(keys[0].device) for k in keys]) if keys else None
