"""The text ids of a batch's inputs (:func:`text_keys`): two polynomial hashes of each row's kept token ids, equal for
identical texts, the same on every process and device. Duplicate-text masking and the known-positives index
(:mod:`st_hardneg.losses.relevance`) compare them.

This module imports nothing else from :mod:`st_hardneg.losses`.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

__all__ = ["KEY_BASES", "KEY_BLOCK_ROWS", "KEY_PRIMES", "text_keys"]


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
