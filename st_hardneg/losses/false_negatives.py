"""False-negative control, as functions: which candidates are not negatives of an anchor.

A candidate is masked for anchor ``i`` when it duplicates the anchor's positive (identical embedding, or identical
text when the loss saw token ids) or when it scores above a positive-aware threshold, optionally judged by a guide
model (sentence-transformers' ``GISTEmbedLoss`` filter). :func:`false_negative_mask` is a pure function of a
:class:`~st_hardneg.losses.batch.Batch` (a *miner* in pytorch-metric-learning's sense); the guide's embeddings and the
text keys are prepared by :func:`side_inputs` in ``forward`` and attached to the batch by :func:`attach_side_inputs`.
The loss base class (:class:`~st_hardneg.losses.base.HardNegativeLoss`) calls these three in that order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from sentence_transformers.base.losses.merged_forward import embed_columns
from torch import Tensor, nn

from st_hardneg import functional as fn
from st_hardneg.losses import distributed as dist
from st_hardneg.losses.batch import Batch, SideInputs
from st_hardneg.losses.keys import text_keys

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

    from st_hardneg.losses.relevance import KnownPositives

__all__ = ["FalseNegativeRule", "attach_side_inputs", "block_masks", "candidate_mask", "duplicate_ids",
           "false_negative_mask", "guide_embeddings", "known_mask", "side_inputs"]


@dataclass(frozen=True)
class FalseNegativeRule:
    """A loss's false-negative rule as one value, given to every part that masks candidates (the batch preparer for
    the batch's, the queue for its rows), as a miner is given to a loss in pytorch-metric-learning: exact
    duplicates (by text when the loss saw the token ids, else by embedding), a ``margin`` with its
    ``margin_strategy`` (judged by the guide model when the loss has one: ``guided``), and the ``known_positives``
    index. The loss builds it from its options (and again when one is assigned)."""

    mask_duplicates: bool = True
    margin: float | None = None
    margin_strategy: str = "absolute"
    known_positives: KnownPositives | None = None
    guided: bool = False

    @property
    def active(self) -> bool:
        """Whether any candidate can be masked (``mask_duplicates``, ``known_positives`` or a ``margin``)."""
        return self.mask_duplicates or self.margin is not None or self.known_positives is not None


def side_inputs(sentence_features: list[dict[str, Tensor]], *, mask_duplicates: bool, guide: SentenceTransformer | None,
                model: nn.Module, retokenize: bool) -> SideInputs | None:
    """What the false-negative mask needs besides the embeddings, read from the tokenised batch before the model
    runs: the rows' text keys (``mask_duplicates``) and the guide's embeddings (no gradient). ``None`` if neither."""
    inputs = SideInputs(text_keys=text_keys(sentence_features) if mask_duplicates else None,
                        guide=guide_embeddings(guide, model, sentence_features, retokenize) if guide is not None
                        else None)
    return inputs if inputs.text_keys is not None or inputs.guide is not None else None


@torch.no_grad()
def guide_embeddings(guide: SentenceTransformer, model: Any, sentence_features: list[dict[str, Tensor]],
                     retokenize: bool) -> list[Tensor]:
    """The guide's embeddings of every column; with ``retokenize`` the model's token ids are decoded and tokenised
    again with the guide's tokenizer (see :func:`st_hardneg.validation.check_guide`)."""
    from sentence_transformers.util import batch_to_device

    device = getattr(guide, "device", None)
    features: list[dict[str, Any]] | dict[str, Tensor]
    if not retokenize:
        # shallow copies: the guide writes its outputs into the dicts it is given
        features = [dict(f) if device is None else batch_to_device(dict(f), device) for f in sentence_features]
        return embed_columns(guide, features)
    columns = []
    input_ids: Tensor | list[list[int]]
    for features in sentence_features:
        if "input_ids" not in features:
            raise ValueError("guide: re-tokenising for a guide with another tokenizer needs `input_ids` in the features")
        input_ids = features["input_ids"]
        if "cu_seq_lens_q" in features:  # packed rows: cut the (1, total) sequence into its rows, as GIST does
            bounds = features["cu_seq_lens_q"].tolist()
            flat = input_ids.reshape(-1).tolist()
            input_ids = [flat[start:end] for start, end in zip(bounds[:-1], bounds[1:], strict=True)]
        texts = model.tokenizer.batch_decode(input_ids, skip_special_tokens=True)
        guide_features = batch_to_device(guide.preprocess(texts), device or features["input_ids"].device)
        columns.append(guide(guide_features)["sentence_embedding"])
    return columns


def attach_side_inputs(batch: Batch, inputs: SideInputs | None, num_columns: int, *, needs_guide: bool,
                       gathered: bool, loss_name: str) -> Batch:
    """Set ``batch.text_keys`` and ``batch.guide`` from ``inputs`` (this process's rows; ``gathered``: the batch holds
    every process's rows, so the inputs are gathered the same way). Raises if they do not match the batch, or if
    ``needs_guide`` and no guide embeddings were given."""
    keys = inputs.text_keys if inputs is not None else None
    guide = inputs.guide if inputs is not None else None
    if gathered:  # every process's text keys and guide embeddings, in rank order
        if keys is not None:
            keys = dist.gather(keys.to(batch.device).T.contiguous()).T
        if guide is not None:
            guide = [dist.gather(g.to(batch.device)) for g in guide]
    if keys is not None:
        if tuple(keys.shape) != (num_columns, batch.size):
            raise ValueError(f"{loss_name}: text keys of shape {tuple(keys.shape)} do not match the batch "
                             f"({num_columns} columns of {batch.size} rows)")
        batch.text_keys = keys.to(batch.device)
    if needs_guide or guide is not None:
        if guide is None:
            raise ValueError(f"{loss_name} has a guide model but received no guide embeddings: call the loss through "
                             "forward(), or set_false_negative_inputs(guide_embeddings=...) first")
        if len(guide) != num_columns or any(g.size(0) != batch.size for g in guide):
            raise ValueError(f"{loss_name}: the guide embeddings do not match the batch "
                             f"({num_columns} columns of {batch.size} rows)")
        batch.guide = Batch.from_units([fn.normalize(g.detach().to(batch.device)) for g in guide])
    return batch


def duplicate_ids(batch: Batch) -> Tensor | None:
    """(N + C,) long ids of the rows ``[anchors; candidates]`` of ``batch``, equal exactly for identical embeddings
    (``torch.unique`` over the detached rows), computed once per batch and kept on it; ``None`` on the meta device."""
    if batch.anchors.device.type == "meta":
        return None
    if batch.duplicate_ids is None:
        judged = batch.judged
        rows = torch.cat([judged.anchors.detach(), judged.candidates.detach()])
        batch.duplicate_ids = torch.unique(rows, dim=0, return_inverse=True)[1]
    return batch.duplicate_ids


def _thresholds(source: Batch, start: int, stop: int, margin: float, margin_strategy: str) -> Tensor:
    """(R, 1) the false-negative threshold of anchors ``start..stop``: positive similarity minus the margin."""
    positive = (source.anchors[start:stop].detach() * source.positives[start:stop].detach()).sum(-1, keepdim=True)
    return positive - margin if margin_strategy == "absolute" else positive - positive.abs() * margin


def known_mask(batch: Batch, anchors: tuple[int, int], columns: tuple[int, int]) -> Tensor | None:
    """(A, K) bool: True where candidate ``c`` (``columns`` of ``batch.candidates``) is known to be relevant to anchor
    ``i`` (``anchors``) by the loss's ``known_positives`` (``batch.known``, judged on the text keys), the anchor's own
    positive left out; ``None`` when the batch has no such index or no text keys."""
    if batch.known is None or batch.text_keys is None:
        return None
    i0, i1 = anchors
    c0, c1 = columns
    keys = batch.text_keys
    mask = batch.known.mask(keys[0, i0:i1], keys[1:].reshape(-1)[c0:c1])
    low, high = max(i0, c0), min(i1, c1)
    if low < high:
        step = torch.arange(high - low, device=mask.device)
        mask[step + (low - i0), step + (low - c0)] = False
    return mask.to(batch.device)


@torch.no_grad()
def candidate_mask(batch: Batch, anchors: tuple[int, int], columns: tuple[int, int], rule: FalseNegativeRule, *,
                   known: Tensor | None = None) -> Tensor:
    """(A, K) bool: True where candidate ``c`` (``batch.candidates`` order, ``columns`` = ``[c0, c1)``) is a masked
    false negative of anchor ``i`` (``anchors`` = ``[i0, i1)``) by the loss's ``rule``: it duplicates the anchor's
    positive (``mask_duplicates``: embedding, or text when ``batch.text_keys`` is set), or (``margin``) it scores above the anchor's threshold (in the guide's
    embeddings when ``batch.guide`` is set, else in the batch's own, detached), or the loss's ``known_positives``
    mark it relevant to the anchor (:func:`known_mask`; ``known``: that mask, when the caller computed it already).
    A positive is never masked for its own anchor."""
    i0, i1 = anchors
    c0, c1 = columns
    n = batch.size
    mask = known.clone() if known is not None else known_mask(batch, anchors, columns)
    if mask is None:
        mask = torch.zeros(i1 - i0, c1 - c0, dtype=torch.bool, device=batch.device)
    if rule.mask_duplicates:
        ids = duplicate_ids(batch)
        if ids is not None:
            candidate_ids = ids[n:]  # positive i is candidate i
            mask |= candidate_ids[i0:i1].unsqueeze(1) == candidate_ids[c0:c1].unsqueeze(0)
        if batch.text_keys is not None:
            keys = batch.text_keys
            candidate_keys = keys[1:].reshape(-1)  # positives, then negative_1, negative_2, ...
            mask |= keys[1, i0:i1].unsqueeze(1) == candidate_keys[c0:c1].unsqueeze(0)
    if rule.margin is not None:
        source = batch.guide if batch.guide is not None else batch.judged
        sim = source.anchors[i0:i1].detach() @ source.candidates[c0:c1].detach().T
        mask |= sim > _thresholds(source, i0, i1, rule.margin, rule.margin_strategy)
    low, high = max(i0, c0), min(i1, c1)  # the anchors whose positive is among these columns
    if low < high:
        step = torch.arange(high - low, device=batch.device)
        mask[step + (low - i0), step + (low - c0)] = False
    return mask


@torch.no_grad()
def false_negative_mask(batch: Batch, rule: FalseNegativeRule) -> tuple[Tensor, dict[str, Tensor]]:
    """The false negatives of the anchors of ``batch`` (its :attr:`~Batch.rows`, default all) by the loss's ``rule``,
    and their counts.

    Returns ``(mask, stats)``: ``mask`` is (R, N + N·k) bool, True where candidate ``c`` (``batch.candidates`` order)
    is not a negative of anchor ``i``, i.e.

    - ``mask_duplicates``: its embedding is identical to the anchor's positive, or (when ``batch.text_keys`` is set)
      its text is;
    - ``margin`` (not ``None``): ``sim(i, c) > sim(i, i) - margin`` (``margin_strategy="absolute"``) or
      ``sim(i, c) > sim(i, i) - |sim(i, i)|·margin`` (``"relative"``), with ``sim`` the cosines of ``batch.guide``
      when set, else of the batch itself (detached).

    - ``known_positives`` (``batch.known``): the loss's mapping marks it relevant to the anchor (:func:`known_mask`).

    A candidate masked for several reasons is masked once. The positive column ``c == i`` is never masked.
    ``stats``: ``masked_false_negatives`` (masked candidates per anchor, mean) and ``masked_false_negatives_total``
    (every reason); with ``known_positives`` also ``masked_known_positives`` / ``masked_known_positives_total``, the
    candidates the mapping marked (whether or not a duplicate or the margin masked them too).
    """
    columns = (0, batch.candidates.size(0))
    known = known_mask(batch, batch.row_range, columns)
    mask = candidate_mask(batch, batch.row_range, columns, rule, known=known)
    count = mask.sum(dim=1).float()
    stats = {"masked_false_negatives": count.mean(), "masked_false_negatives_total": count.sum()}
    if known is not None:
        marked = known.sum(dim=1).float()
        stats.update(masked_known_positives=marked.mean(), masked_known_positives_total=marked.sum())
    return mask, stats


@torch.no_grad()
def block_masks(batch: Batch, names: set[str] | frozenset[str], rule: FalseNegativeRule) -> dict[str, Tensor]:
    """The false negatives of the blocks other than ``query_to_doc`` (whose mask is :func:`false_negative_mask`)
    for the rows of ``batch`` (its :attr:`~Batch.rows`, default all) by the loss's ``rule``: one (R, C) bool mask
    per name in ``names``.

    - ``doc_to_query``: the transposed in-batch part of the ``query_to_doc`` mask (positive i vs query j is masked
      when positive i is a false negative of query j);
    - ``query_to_query`` / ``anchor_to_anchor``: query j is masked for row i when it duplicates query i or positive
      i (embedding, or text when known), or when ``sim(q_i, q_j) > threshold_i``;
    - ``doc_to_doc`` (every document) / ``positive_to_positive`` (the positives): a document is masked for row i when
      it duplicates positive i, or when ``sim(p_i, d) > threshold_i``.

    ``threshold_i`` is row i's positive similarity minus the margin (``"absolute"``) or minus ``|positive|·margin``
    (``"relative"``), in the guide's embeddings when ``batch.guide`` is set (GISTEmbedLoss's rule for its
    anchor-anchor and positive-positive blocks), else in the batch's own (detached).
    """
    n = batch.size
    start, stop = batch.row_range
    masks: dict[str, Tensor] = {}
    if "doc_to_query" in names:
        masks["doc_to_query"] = candidate_mask(batch, (0, n), (start, stop), rule).T.contiguous()
    same_type = {"query_to_query", "anchor_to_anchor", "doc_to_doc", "positive_to_positive"} & set(names)
    if not same_type:
        return masks
    source = batch.guide if batch.guide is not None else batch.judged
    margin, mask_duplicates = rule.margin, rule.mask_duplicates
    threshold = _thresholds(source, start, stop, margin, rule.margin_strategy) if margin is not None else None
    ids = duplicate_ids(batch) if mask_duplicates else None
    keys = batch.text_keys
    if {"query_to_query", "anchor_to_anchor"} & set(names):
        mask = torch.zeros(stop - start, n, dtype=torch.bool, device=batch.device)
        if ids is not None:
            query_ids, positive_ids = ids[:n], ids[n:2 * n]
            mask |= ((query_ids[start:stop].unsqueeze(1) == query_ids.unsqueeze(0))
                     | (positive_ids[start:stop].unsqueeze(1) == query_ids.unsqueeze(0)))
        if mask_duplicates and keys is not None:
            mask |= ((keys[0, start:stop].unsqueeze(1) == keys[0].unsqueeze(0))
                     | (keys[1, start:stop].unsqueeze(1) == keys[0].unsqueeze(0)))
        if threshold is not None:
            mask |= source.anchors[start:stop].detach() @ source.anchors.detach().T > threshold
        if batch.known is not None and keys is not None:  # another anchor known to be relevant to anchor i
            mask |= batch.known.mask(keys[0, start:stop], keys[0]).to(mask.device)
        for name in ("query_to_query", "anchor_to_anchor"):
            if name in names:
                masks[name] = mask
    if {"doc_to_doc", "positive_to_positive"} & set(names):
        candidates = batch.candidates
        mask = torch.zeros(stop - start, candidates.size(0), dtype=torch.bool, device=batch.device)
        if ids is not None:
            candidate_ids = ids[n:]
            mask |= candidate_ids[start:stop].unsqueeze(1) == candidate_ids.unsqueeze(0)
        if mask_duplicates and keys is not None:
            mask |= keys[1, start:stop].unsqueeze(1) == keys[1:].reshape(-1).unsqueeze(0)
        if threshold is not None:
            mask |= source.positives[start:stop].detach() @ source.candidates.detach().T > threshold
        known = known_mask(batch, (start, stop), (0, candidates.size(0)))
        if known is not None:  # a document known to be relevant to pair i's anchor
            mask |= known
        if "doc_to_doc" in names:
            masks["doc_to_doc"] = mask
        if "positive_to_positive" in names:
            masks["positive_to_positive"] = mask[:, :n]
    return masks
