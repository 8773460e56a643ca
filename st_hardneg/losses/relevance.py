"""Known-relevance masking: the ``known_positives`` of every loss as an index of hashed text pairs.

The loss sees token ids, not texts. Duplicate masking already keys every row by a hash of its token ids
(:func:`st_hardneg.losses.keys.text_keys`); :class:`KnownPositives` tokenises the mapping's texts once, at the loss's
construction, with the model's own ``preprocess`` (so a text gets the key ``forward`` will compute for it), and keeps
three sorted int64 tables: the anchors' keys, the relevant texts' keys and the pairs, each pair as
``anchor position · documents + document position``. Its memory is O(mapping) (8 bytes a key, 8 a pair), never an
anchors × corpus table; a lookup (:meth:`KnownPositives.mask`) costs three binary searches per (row, candidate) entry
of a mask the loss builds anyway.

A text reaches the same key only if it is tokenised the same way: training prompts (``prompts=`` of the training
arguments) change the token ids; pass the prompted texts in the mapping then. The first batch in which no anchor is a
key of the mapping warns (:meth:`KnownPositives.note_batch`).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from st_hardneg import validation
from st_hardneg.losses.keys import text_keys

__all__ = ["KnownPositives"]

logger = logging.getLogger(__name__)

#: texts tokenised at a time when the index is built
TOKENIZE_BATCH = 1024


class KnownPositives:
    """The pairs ``(anchor, text known to be relevant to it)`` of a ``known_positives`` mapping, by text key.

    Args:
        anchor_keys: (P,) int64 keys of each pair's anchor (:func:`~st_hardneg.losses.keys.text_keys`).
        document_keys: (P,) int64 keys of each pair's relevant text.

    Build it from texts with :meth:`from_mapping`; every loss does so for its ``known_positives`` argument.
    """

    def __init__(self, anchor_keys: Tensor, document_keys: Tensor) -> None:
        anchor_keys = torch.as_tensor(anchor_keys, dtype=torch.long).reshape(-1).cpu()
        document_keys = torch.as_tensor(document_keys, dtype=torch.long).reshape(-1).cpu()
        if anchor_keys.numel() != document_keys.numel():
            raise ValueError(f"KnownPositives: {anchor_keys.numel()} anchor keys but {document_keys.numel()} "
                             "document keys; give one of each per pair")
        self.anchors, anchor_index = torch.unique(anchor_keys, return_inverse=True)
        self.documents, document_index = torch.unique(document_keys, return_inverse=True)
        self.pairs = torch.unique(anchor_index * max(self.documents.numel(), 1) + document_index)
        self._on: dict[torch.device, tuple[Tensor, Tensor, Tensor]] = {}
        self._warned_unmatched = False

    @classmethod
    def for_loss(cls, loss_name: str, known_positives: Any, model: Any) -> KnownPositives | None:
        """The index of a loss's ``known_positives`` option (``None``: off, also for an empty mapping, which warns):
        an index as given, or a mapping of texts tokenised with ``model``'s ``preprocess``."""
        if known_positives is None or isinstance(known_positives, KnownPositives):
            return known_positives
        if not isinstance(known_positives, Mapping):
            raise TypeError(f"{loss_name}: known_positives must map anchor texts to the texts known to be relevant to "
                            f"them (st_hardneg.data.relevance.known_positives_from_qrels builds one), got "
                            f"{type(known_positives).__name__}")
        if not validation.check_known_positives(known_positives):
            return None
        preprocess = getattr(model, "preprocess", None)
        if not callable(preprocess):
            raise ValueError(f"{loss_name}: known_positives are texts, tokenised with the model's preprocess to match "
                             f"the batch's token ids; the model {type(model).__name__} has none (pass a "
                             "st_hardneg.losses.relevance.KnownPositives built from text keys instead)")
        return cls.from_mapping(known_positives, preprocess)

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any], preprocess: Callable[[list[str]], dict[str, Tensor]], *,
                     name: str = "known_positives", show_progress_bar: bool = False) -> KnownPositives:
        """The index of ``mapping`` (anchor text → texts relevant to it; checked with
        :func:`st_hardneg.validation.check_known_positives`), each distinct text tokenised once with ``preprocess``
        (the model's ``preprocess``), :data:`TOKENIZE_BATCH` texts at a time."""
        checked = validation.check_known_positives(mapping, name)
        texts = list(dict.fromkeys([*checked, *(t for values in checked.values() for t in values)]))
        keys = _keys_of(texts, preprocess, show_progress_bar=show_progress_bar)
        key_of = dict(zip(texts, keys.tolist(), strict=True))
        anchors = [key_of[a] for a, values in checked.items() for _ in values]
        documents = [key_of[t] for values in checked.values() for t in values]
        return cls(torch.tensor(anchors, dtype=torch.long), torch.tensor(documents, dtype=torch.long))

    @property
    def num_pairs(self) -> int:
        """The (anchor, relevant text) pairs indexed."""
        return int(self.pairs.numel())

    @property
    def memory_bytes(self) -> int:
        """Bytes of the three tables (one copy; a copy per device a batch was on)."""
        return sum(t.numel() * t.element_size() for t in (self.anchors, self.documents, self.pairs))

    def _tables(self, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        if device not in self._on:
            self._on[device] = (self.anchors.to(device), self.documents.to(device), self.pairs.to(device))
        return self._on[device]

    @staticmethod
    def _find(table: Tensor, keys: Tensor) -> tuple[Tensor, Tensor]:
        """(position of each key in the sorted ``table``, whether it is there)."""
        if table.numel() == 0:
            return torch.zeros_like(keys), torch.zeros_like(keys, dtype=torch.bool)
        position = torch.searchsorted(table, keys).clamp_(max=table.numel() - 1)
        return position, table[position] == keys

    def known_anchors(self, anchor_keys: Tensor) -> Tensor:
        """(R,) bool: whether each key is an anchor of the mapping."""
        anchors, _, _ = self._tables(anchor_keys.device)
        return self._find(anchors, anchor_keys.long().contiguous())[1]

    def mask(self, anchor_keys: Tensor, candidate_keys: Tensor) -> Tensor:
        """(R, C) bool: True where candidate ``c`` is known to be relevant to anchor ``r`` (by their text keys)."""
        anchors, documents, pairs = self._tables(anchor_keys.device)
        anchor_keys = anchor_keys.long().contiguous()
        candidate_keys = candidate_keys.to(anchor_keys.device).long().contiguous()
        a_pos, a_found = self._find(anchors, anchor_keys)
        d_pos, d_found = self._find(documents, candidate_keys)
        out = a_found.unsqueeze(1) & d_found.unsqueeze(0)
        if pairs.numel() == 0 or not bool(out.any()):
            return out
        pair = a_pos.unsqueeze(1) * max(documents.numel(), 1) + d_pos.unsqueeze(0)
        return out & self._find(pairs, pair.reshape(-1))[1].reshape(pair.shape)

    def note_batch(self, anchor_keys: Tensor, loss_name: str) -> None:
        """Warn once, at the first batch in which no anchor is a key of the mapping (the texts are tokenised
        differently, e.g. with a training prompt, or the mapping belongs to other data)."""
        if self._warned_unmatched or anchor_keys.device.type == "meta":
            return
        self._warned_unmatched = True  # judged on the first batch only
        if not bool(self.known_anchors(anchor_keys).any()):
            message = (f"{loss_name}: none of the {anchor_keys.numel()} anchors of the first batch is a key of "
                       "known_positives, so nothing is masked for them; are the texts tokenised differently (a "
                       "training prompt changes the token ids: put the prompted texts in the mapping), or is the "
                       "mapping built from other data? This warning is shown once.")
            logger.warning(message)
            warnings.warn(message, UserWarning, stacklevel=4)

    def __repr__(self) -> str:
        return (f"KnownPositives(anchors={self.anchors.numel()}, texts={self.documents.numel()}, "
                f"pairs={self.num_pairs})")


def _keys_of(texts: Sequence[str], preprocess: Callable[[list[str]], dict[str, Tensor]], *,
             show_progress_bar: bool) -> Tensor:
    """(len(texts),) text keys, tokenised :data:`TOKENIZE_BATCH` at a time."""
    from tqdm.auto import tqdm

    keys = []
    starts = range(0, len(texts), TOKENIZE_BATCH)
    quiet = len(starts) < 2 or (len(starts) < 10 and not show_progress_bar)  # a bar from 10,000 texts on
    for start in tqdm(starts, desc="known_positives: tokenising", disable=quiet):
        features = preprocess(list(texts[start:start + TOKENIZE_BATCH]))
        block = text_keys([features])
        if block is None:
            raise ValueError("known_positives: the model's preprocess gave no input_ids, so its texts cannot be keyed "
                             "like the batch's rows")
        keys.append(block[0].cpu())
    return torch.cat(keys) if keys else torch.zeros(0, dtype=torch.long)
