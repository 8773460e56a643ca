"""False-negative control of the st-hardneg losses: masking candidates that duplicate the anchor's positive
(by embedding or by text) or that score above a positive-aware threshold (optionally judged by a guide model)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from sentence_transformers.base.losses.merged_forward import embed_columns
from torch import Tensor, nn

from st_hardneg import functional as fn
from st_hardneg import validation
from st_hardneg.losses import distributed as dist

if TYPE_CHECKING:
    from st_hardneg.losses.base import Batch


def text_keys(sentence_features: list[dict[str, Tensor]]) -> Tensor | None:
    """(num_columns, N) long ids of the rows' texts, equal for identical token ids under the attention mask (i.e.
    identical texts), compared across all columns; ``None`` if a column has no padded ``input_ids``.

    The id is the hash of the token-id tuple: Python hashes tuples of ints deterministically (no per-process
    randomisation, unlike strings), so ids from different processes can be compared after gathering."""
    keys = []
    for features in sentence_features:
        input_ids = features.get("input_ids") if isinstance(features, Mapping) else None  # dict or BatchEncoding
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 2 or "cu_seq_lens_q" in features:
            return None
        attention = features.get("attention_mask")
        tokens = input_ids.tolist()
        if isinstance(attention, Tensor) and attention.shape == input_ids.shape:
            tokens = [[t for t, a in zip(row, keep, strict=True) if a]
                      for row, keep in zip(tokens, attention.tolist(), strict=True)]
        keys.append([hash(tuple(row)) for row in tokens])
    return torch.tensor(keys, dtype=torch.long)


class FalseNegativeControl:
    """Mixin of :class:`st_hardneg.losses.base.HardNegativeLoss`: the false-negative options and mask.

    Each loss's constructor calls :meth:`configure_false_negatives`; ``forward`` calls
    :meth:`remember_false_negative_inputs` before the model runs, and ``prepare_batch`` calls
    :meth:`attach_false_negatives`, which sets ``Batch.false_negatives`` (see :meth:`false_negative_mask`). The host
    class provides ``model`` and, after a gathering ``prepare_batch``, ``_local_rows``.
    """

    #: mask candidates identical to the anchor's positive (embedding, or text when ``forward`` sees token ids)
    mask_duplicates: bool = False
    #: the positive-aware threshold's margin (``None``: off); see :meth:`configure_false_negatives`
    false_negative_margin: float | None = None
    margin_strategy: str = "absolute"
    guide: nn.Module | None = None

    def configure_false_negatives(self, mask_duplicates: bool = True, false_negative_margin: float | None = None,
                                  margin_strategy: str = "absolute", guide: nn.Module | None = None) -> None:
        """Set up false-negative control (called by each loss's constructor).

        Args:
            mask_duplicates: a candidate ``c`` other than anchor ``i``'s own positive is not a negative of anchor ``i``
                if its embedding is identical to the positive's, or, when the loss is called through ``forward`` on
                tokenised text, if its token ids under the attention mask (its text) are identical to the positive's.
            false_negative_margin: ``None`` (off) or a margin >= 0: candidate ``c`` of anchor ``i`` is masked when
                ``sim(i, c) > sim(i, i) - margin`` (``margin_strategy="absolute"``) or
                ``sim(i, c) > sim(i, i) - |sim(i, i)|·margin`` (``"relative"``), the false-negative filter of
                sentence-transformers' ``GISTEmbedLoss``. ``sim`` is the cosine of the guide's embeddings if a
                ``guide`` is given, else of the trained model's own (detached) embeddings.
            margin_strategy: ``"absolute"`` or ``"relative"``.
            guide: optional SentenceTransformer whose embeddings (computed without gradient in ``forward``) decide the
                threshold. If its tokenizer differs from the model's (or its ``max_seq_length`` is shorter), the
                model's token ids are decoded and re-tokenised for the guide. Needs ``false_negative_margin``.
        """
        self.mask_duplicates = validation.check_bool(mask_duplicates, "mask_duplicates")
        self.false_negative_margin = validation.check_optional_non_negative(
            false_negative_margin, "false_negative_margin")
        self.margin_strategy = validation.check_choice(margin_strategy, "margin_strategy", ("absolute", "relative"))
        self._must_retokenize = False
        if guide is not None:
            if self.false_negative_margin is None:
                raise ValueError("guide is only used by the false-negative threshold: also set false_negative_margin "
                                 "(e.g. 0.0 masks every candidate the guide finds closer than the positive)")
            if not isinstance(guide, nn.Module) or not callable(guide):
                raise ValueError(f"guide must be a SentenceTransformer model, got {type(guide).__name__}")
            model_tok, guide_tok = getattr(self.model, "tokenizer", None), getattr(guide, "tokenizer", None)
            if model_tok is None or guide_tok is None or not hasattr(model_tok, "get_vocab") or not hasattr(
                    guide_tok, "get_vocab"):
                raise ValueError("guide: the model and the guide must both have a Hugging Face tokenizer "
                                 "(`.tokenizer` with `get_vocab()`), to re-tokenise the texts for the guide if needed")
            self._must_retokenize = bool(
                model_tok.get_vocab() != guide_tok.get_vocab()
                or getattr(guide, "max_seq_length", 0) < getattr(self.model, "max_seq_length", 0))
            if self._must_retokenize and not hasattr(model_tok, "batch_decode"):
                raise ValueError("guide: the guide's tokenizer differs from the model's, and the model's tokenizer "
                                 "cannot decode token ids back to text (no batch_decode)")
        # kept out of the module tree (as AdCSE's key encoder): not trained, not in state_dict(), not in the optimizer
        vars(self)["guide"] = guide
        self._reports_false_negatives = False
        self._false_negative_inputs: dict[str, Any] | None = None
        self._false_negative_stats: dict[str, Tensor] = {}

    def false_negative_config(self) -> dict[str, Any]:
        """The false-negative options for :meth:`get_config_dict`: those that differ from their defaults (so the
        configuration of a loss that uses the defaults reads as before these options existed)."""
        config: dict[str, Any] = {}
        if not self.mask_duplicates:
            config["mask_duplicates"] = False
        if self.false_negative_margin is not None:
            config["false_negative_margin"] = self.false_negative_margin
            config["margin_strategy"] = self.margin_strategy
        if self.guide is not None:
            card = getattr(self.guide, "model_card_data", None)
            config["guide"] = getattr(card, "base_model", None) or type(self.guide).__name__
        return config

    @property
    def controls_false_negatives(self) -> bool:
        return self.mask_duplicates or self.false_negative_margin is not None

    def remember_false_negative_inputs(self, sentence_features: Iterable[dict[str, Tensor]]) -> list[dict[str, Tensor]]:
        """Called by ``forward`` before the model runs: keep each row's text key (for ``mask_duplicates``) and the
        guide's embeddings (computed without gradient) for the next :meth:`prepare_batch`. Returns the features."""
        sentence_features = list(sentence_features)
        inputs: dict[str, Any] = {}
        if self.mask_duplicates:
            inputs["text_keys"] = text_keys(sentence_features)
        if self.guide is not None:
            inputs["guide"] = self._guide_embeddings(sentence_features)
        self._false_negative_inputs = inputs or None
        return sentence_features

    def set_false_negative_inputs(self, text_keys: Tensor | None = None,
                                  guide_embeddings: list[Tensor] | None = None) -> None:
        """Provide the text keys ((num_columns, N) ids, equal = identical text) and/or the guide's embeddings (one
        (N, d') tensor per column) for the next :meth:`compute_loss_from_embeddings` call (``forward`` does this
        itself)."""
        inputs = {}
        if text_keys is not None:
            inputs["text_keys"] = torch.as_tensor(text_keys, dtype=torch.long)
        if guide_embeddings is not None:
            inputs["guide"] = [g.detach() for g in guide_embeddings]
        self._false_negative_inputs = inputs or None

    @torch.no_grad()
    def _guide_embeddings(self, sentence_features: list[dict[str, Tensor]]) -> list[Tensor]:
        from sentence_transformers.util import batch_to_device

        guide = self.guide
        device = getattr(guide, "device", None)
        if not self._must_retokenize:
            # shallow copies: the guide writes its outputs into the dicts it is given
            features = [dict(f) if device is None else batch_to_device(dict(f), device) for f in sentence_features]
            return embed_columns(guide, features)
        columns = []
        for features in sentence_features:
            if "input_ids" not in features or "cu_seq_lens_q" in features:
                raise ValueError("guide: re-tokenising for a guide with another tokenizer needs padded `input_ids` "
                                 "in the features")
            texts = self.model.tokenizer.batch_decode(features["input_ids"], skip_special_tokens=True)
            guide_features = batch_to_device(guide.preprocess(texts), device or features["input_ids"].device)
            columns.append(guide(guide_features)["sentence_embedding"])
        return columns

    def attach_false_negatives(self, batch: Batch, num_columns: int) -> Batch:
        """Attach the remembered text keys / guide embeddings to ``batch`` and compute its false-negative mask
        (:meth:`false_negative_mask`); records the masked counts for :attr:`diagnostics`."""
        inputs, self._false_negative_inputs = getattr(self, "_false_negative_inputs", None), None
        self._false_negative_stats = {}
        if not self.controls_false_negatives:
            return batch
        inputs = inputs or {}
        if getattr(self, "_local_rows", None) is not None:
            # gathered batch: the text keys and the guide's embeddings of every process, in rank order
            if inputs.get("text_keys") is not None:
                keys = inputs["text_keys"].to(batch.device)
                inputs["text_keys"] = dist.gather(keys.T.contiguous()).T
            if inputs.get("guide") is not None:
                inputs["guide"] = [dist.gather(g.to(batch.device)) for g in inputs["guide"]]
        keys = inputs.get("text_keys")
        if keys is not None:
            if tuple(keys.shape) != (num_columns, batch.size):
                raise ValueError(f"{type(self).__name__}: text keys of shape {tuple(keys.shape)} do not match the "
                                 f"batch ({num_columns} columns of {batch.size} rows)")
            batch.text_keys = keys.to(batch.device)
        if self.guide is not None or "guide" in inputs:
            guide = inputs.get("guide")
            if guide is None:
                raise ValueError(f"{type(self).__name__} has a guide model but received no guide embeddings: call the "
                                 "loss through forward(), or set_false_negative_inputs(guide_embeddings=...) first")
            if len(guide) != num_columns or any(g.size(0) != batch.size for g in guide):
                raise ValueError(f"{type(self).__name__}: the guide embeddings do not match the batch "
                                 f"({num_columns} columns of {batch.size} rows)")
            from st_hardneg.losses.base import Batch  # base imports this module: resolve at call time

            units = [fn.normalize(g.detach().to(batch.device)) for g in guide]
            negatives = torch.cat(units[2:]) if num_columns > 2 else units[0].new_zeros((0, units[0].size(1)))
            batch.guide = Batch(units[0], units[1], negatives)
        batch.false_negatives = self.false_negative_mask(batch)
        count = batch.false_negatives.sum(dim=1).float()
        # Reported once anything can be masked beyond exact duplicates (a threshold is set), or from the first batch
        # in which a duplicate was masked on: on duplicate-free data the default diagnostics stay as they were.
        if not self._reports_false_negatives and (
                self.false_negative_margin is not None or (count.device.type != "meta" and bool(count.any()))):
            self._reports_false_negatives = True
        if self._reports_false_negatives:
            self._false_negative_stats = {"masked_false_negatives": count.mean(),
                                          "masked_false_negatives_total": count.sum()}
        return batch

    @torch.no_grad()
    def false_negative_mask(self, batch: Batch) -> Tensor:
        """(N, N + N·k) bool: True where candidate ``c`` (``batch.candidates`` order) is not a negative of anchor
        ``i``: a duplicate of its positive (``mask_duplicates``) or above the positive-aware threshold
        (``false_negative_margin``). The positive column ``c == i`` is never masked."""
        n = batch.size
        candidates = batch.candidates.detach()
        mask = torch.zeros(n, candidates.size(0), dtype=torch.bool, device=batch.device)
        if self.mask_duplicates:
            rows = torch.cat([batch.positives.detach(), candidates])
            if rows.device.type != "meta":
                ids = torch.unique(rows, dim=0, return_inverse=True)[1]
                mask |= ids[:n].unsqueeze(1) == ids[n:].unsqueeze(0)
            if batch.text_keys is not None:
                keys = batch.text_keys
                candidate_keys = keys[1:].reshape(-1)  # positives, then negative_1, negative_2, ...
                mask |= keys[1].unsqueeze(1) == candidate_keys.unsqueeze(0)
        if self.false_negative_margin is not None:
            source = batch.guide if batch.guide is not None else batch
            sim = source.anchors.detach() @ source.candidates.detach().T
            positive = sim.diagonal().unsqueeze(1)
            margin = self.false_negative_margin
            threshold = positive - margin if self.margin_strategy == "absolute" else positive - positive.abs() * margin
            mask |= sim > threshold
        mask.fill_diagonal_(False)
        return mask
