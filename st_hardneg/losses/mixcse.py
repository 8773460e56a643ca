"""MixCSE (Zhang et al., AAAI 2022): one synthetic hard negative per anchor, the positive mixed with a partner."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Unpack, cast

import torch
from sentence_transformers import SentenceTransformer
from torch import Tensor

from st_hardneg import functional as fn
from st_hardneg import validation
from st_hardneg.functional import ranking as fr
from st_hardneg.losses.base import HardNegativeLoss, LossOptions, SharedOptions
from st_hardneg.losses.batch import Batch, WindowRecord

if TYPE_CHECKING:
    from st_hardneg.losses.queue import QueueRead

Layout = Literal["paper", "official"]


class MixCSELoss(HardNegativeLoss):
    chooses_from_queue_pool = True  # partner="hardest" may pick queued rows (queue_as_pool)
    min_batch_size = 2  # the mixed negative needs another pair's positive

    def __init__(
        self,
        model: SentenceTransformer,
        guide: SentenceTransformer | None = None,
        *,
        lam: float = 0.2,
        stop_gradient: bool = True,
        partner: fn.PartnerMode = "shift",
        layout: Layout = "paper",
        focal_m: float | None = None,
        reverse_mix: bool | None = None,
        **options: Unpack[LossOptions],
    ) -> None:
        """
        MixCSE: InfoNCE with in-batch negatives plus, for every anchor, one synthetic hard negative made by
        mixing its positive with an in-batch negative (Zhang et al., AAAI 2022).

        With ``h`` the anchor embeddings, ``h'`` the positive embeddings (all L2-normalised) and ``π(i)`` the mixing
        partner of anchor ``i``, the mixed negative is ``mix_i = normalize(λ·h'_i + (1-λ)·h'_π(i))`` and row ``i`` of
        the loss is a cross-entropy with target ``i`` over::

            [h_i·h'_1, ..., h_i·h'_N, h_i·(explicit negatives), h_i·SG(mix_i)] / τ

        The mixed negative is closer to the anchor than a random negative (its cosine is about
        ``λ / sqrt(λ² + (1-λ)²)`` once ``h_i ≈ h'_i``), which keeps the gradient of the contrastive loss from
        vanishing as training separates the in-batch negatives. The stop-gradient ``SG`` keeps the mix from pulling
        ``h'_i`` away from its anchor.

        Args:
            model: SentenceTransformer model.
            guide: optional guide model for false-negative filtering, as in ``GISTEmbedLoss(model, guide)``.
            lam: λ, the weight of the positive in the mix, in [0, 1]. The paper uses 0.2 and warns that a large λ
                can turn the "negative" into a second positive; the released training script
                (``run_unsup_example.sh``, ``--lambdas 0.6``) uses 0.6, with the same meaning (weight of the positive).
            reverse_mix: with ``"doc_to_query"`` in ``directions``, give that direction its own mixed negative
                ``normalize(λ·h_i + (1-λ)·h_π(i))`` too (``layout="official"``: block 3). Default: ``True`` when
                ``"doc_to_query"`` is a direction (and for ``layout="official"``), else ``False``. Mapping to the
                paper's ablations: MixCSE (the paper's Eq. 2) = the default ``directions=("query_to_doc",)``; the
                two-directional form with both mixed negatives = ``directions=("query_to_doc", "doc_to_query"),
                partition_mode="per_direction"``; **MixCSE_single** (both InfoNCE directions, one mixed negative) =
                the same with ``reverse_mix=False``.
            stop_gradient: detach the mixed negatives (paper). ``False`` is the "w/o sg" ablation.
            partner: how ``π(i)`` is chosen: ``"shift"`` (``i+1 mod N``, the authors' code), ``"random"`` (a random
                derangement per batch, drawn from :meth:`generator`), ``"hardest"`` (the in-batch negative most
                similar to the anchor) or ``"explicit"``: the anchor's own mined negative (its ``negative_1`` column)
                is the partner, ``mix_i = normalize(λ·h'_i + (1-λ)·n_i)`` (reverse direction:
                ``normalize(λ·h_i + (1-λ)·n_i)``); needs at least one negative column. Masked false negatives (see
                ``mask_duplicates``) are never partners: ``"hardest"`` takes the most similar unmasked negative,
                ``"shift"`` / ``"random"`` move a masked partner on to the next unmasked in-batch negative (cyclic
                order), and a row with no unmasked partner (or whose explicit negative is masked) gets no mixed
                negative in that batch (its mixed column leaves the denominator). With a queue and
                ``queue_as_pool=True``, ``"hardest"`` also considers the queue's unmasked rows (the query → doc
                partner only; the reverse mix keeps in-batch partners); ``diagnostics["queue_partner_fraction"]``
                is the share of rows whose partner came from the queue.
            layout: ``"paper"`` (the equation above, one mixed negative per anchor) or ``"official"``, the loss as the
                released code (BDBC-KG-NLP/MixCSE_AAAI2022, ``mixcse/models_mix.py``) computes it, for reproducing the
                published numbers: a single N×3N cross-entropy over
                ``[cos(z1_a, z2_b) | cos(z1_a, mix_b) | cos(mix'_a, z2_b)] / τ`` with ``mix_b = λ z2_b + (1-λ) z2_π(b)``
                and ``mix'_a = λ z1_a + (1-λ) z1_π(a)`` mixing the **raw, unnormalised** embeddings (the released code
                mixes the pooler outputs and only the cosine normalises), where the entries in which the anchor's own
                sample enters a mix at weight 1-λ (``π(b) = a`` in block 2, ``b = π(a)`` in block 3) are set to logit
                0 rather than removed. Every anchor therefore sees all N mixes as negatives (not only its own), and
                block 3 compares a *mixed anchor* with the positives. ``reverse_mix=False``
                drops block 3. Needs a permutation partner (``"shift"`` as released, or ``"random"``).
            focal_m: if set, apply the Focal-InfoNCE modulation (positive ``s²/τ``, negatives ``s(s+m)/τ``, also to the
                mixed negatives) with margin ``m``; ``None`` (default) = the paper's plain InfoNCE. Combining hardness
                weighting with synthetic hard negatives is an st-hardneg extension. τ must keep ``(1 + m) / τ``
                representable (tiny temperatures are rejected).
            **options: the options of sentence-transformers' ``MultipleNegativesRankingLoss`` / ``GISTEmbedLoss`` and
                st-hardneg's shared ones, keyword-only, documented on :class:`~st_hardneg.HardNegativeLoss`:
                ``scale`` or ``temperature`` (paper: τ = 0.05, ``scale=20``), ``similarity_fct``, ``directions``,
                ``partition_mode``, ``hardness_mode``, ``hardness_strength``, ``seed``, ``mask_duplicates`` (default
                on), ``margin``, ``margin_strategy``, ``contrast_anchors``, ``contrast_positives``,
                ``gather_across_devices``, ``mini_batch_size``, ``mini_batch_num_tokens``, ``show_progress_bar``.
                Here: the mixed negative is one more column of the ``query_to_doc`` direction (and, with
                ``reverse_mix``, of ``doc_to_query``); ST's hardness penalty applies to ST's columns, not to the mixed
                negatives (they are hard by construction); with ``similarity_fct=dot_score`` the mix is the linear
                interpolation of the raw embeddings, ``λ·h'_i + (1-λ)·h'_π(i)``, scored by its dot product (no
                normalisation). A masked candidate (``mask_duplicates``, ``margin``) also cannot be a mixing partner
                (see ``partner``); ``seed`` seeds ``partner="random"``; ``gather_across_devices`` gathers the anchors,
                positives and explicit negatives, so the in-batch negatives, the mixing partner (shift / random /
                hardest) and both mixed negatives come from the global batch. ``layout="official"`` is the released
                code's own equation: it takes none of ``directions``, ``partition_mode``, ``hardness_mode``,
                ``contrast_*`` or ``dot_score`` (a ``ValueError`` says so).

        Deviations from the paper:
            - ``layout="paper"`` mixes the normalised embeddings (the paper's equation); ``layout="official"`` mixes
              the raw ones like the released code.
            - ``partner="random"`` / ``"hardest"`` and ``focal_m`` are st-hardneg extensions.

        References:
            - Zhang et al., "Unsupervised Sentence Representation via Contrastive Learning with Mixing Negatives",
              AAAI 2022. https://ojs.aaai.org/index.php/AAAI/article/view/21428
            - Code: https://github.com/BDBC-KG-NLP/MixCSE_AAAI2022

        Requirements:
            1. (anchor, positive) pairs; for unsupervised SimCSE the same sentence twice (dropout is the
               augmentation). Optionally explicit negatives in further columns.
            2. A batch of at least 2 pairs (the mix needs an in-batch partner).

        Inputs:
            +-------------------------------------------------+--------+
            | Texts                                           | Labels |
            +=================================================+========+
            | (anchor, positive) pairs                        | none   |
            +-------------------------------------------------+--------+
            | (anchor, positive, negative_1, ..., negative_n) | none   |
            +-------------------------------------------------+--------+

        Recommendations:
            - Use ``BatchSamplers.NO_DUPLICATES``: a sentence that occurs twice in a batch is a false negative of
              itself, and with ``partner="hardest"`` it would even be chosen as the mixing partner (unsupervised
              corpora such as wiki1m contain duplicate lines). ``mask_duplicates`` (default) catches exact duplicates
              in the batch; near-duplicates and false mined negatives need ``margin`` (optionally
              with a ``guide``).
            - With mined negatives, ``partner="explicit"`` makes each anchor's own mined negative the source of
              hardness: the mix lies between the positive and that negative.

        Relations:
            - With ``lam`` irrelevant and no mixed negative this is ST's ``MultipleNegativesRankingLoss`` (SimCSE).
            - :class:`~st_hardneg.HNCSELoss` mixes the *positive* with the hardest negative and mixes pairs of hard
              negatives; :class:`~st_hardneg.FocalInfoNCELoss` re-weights the existing negatives instead.

        Example:
            ::

                from datasets import Dataset
                from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
                from sentence_transformers.base.sampler import BatchSamplers
                from st_hardneg import MixCSELoss
                from st_hardneg.models import load_default_model

                model = load_default_model()  # all-MiniLM-L6-v2 with CLS pooling, max_seq_length 32
                sentences = ["A man is playing a guitar.", "A woman is slicing an onion.", "The sky is blue."]
                train_dataset = Dataset.from_dict({"anchor": sentences, "positive": sentences})
                loss = MixCSELoss(model, lam=0.2)
                args = SentenceTransformerTrainingArguments(
                    output_dir="out", batch_sampler=BatchSamplers.NO_DUPLICATES, per_device_train_batch_size=64
                )
                trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train_dataset, loss=loss)
                trainer.train()
        """
        super().__init__(model, guide, **options)
        self.lam = validation.check_unit_interval(lam, "lam (λ, the weight of the positive in the mix)")
        self.stop_gradient = validation.check_bool(stop_gradient, "stop_gradient")
        self.partner = validation.check_choice(partner, "partner", ("shift", "random", "hardest", "explicit"))
        self.layout = validation.check_choice(layout, "layout", ("paper", "official"))
        two_way = "doc_to_query" in self.options.directions
        if reverse_mix is None:
            reverse_mix = two_way or self.layout == "official"
        self.reverse_mix = validation.check_bool(reverse_mix, "reverse_mix")
        self.focal_m = validation.check_optional_non_negative(focal_m, "focal_m (the Focal-InfoNCE margin m)")
        self.check_options(self.options)

    def check_options(self, options: SharedOptions) -> None:
        """The shared options' rules, and MixCSE's with them: ``reverse_mix`` needs ``doc_to_query`` (paper layout),
        the official layout takes none of sentence-transformers' extra options, ``queue_as_pool`` needs the hardest
        partner, ``focal_m`` needs cosines and a logit in range at the temperature."""
        super().check_options(options)
        two_way = "doc_to_query" in options.directions
        similarity = options.similarity_fct
        if self.layout == "paper" and self.reverse_mix and not two_way:
            raise ValueError(
                "reverse_mix=True needs 'doc_to_query' in directions with layout='paper': the reverse mixed negative "
                "belongs to the reverse (positive → anchor) direction. Use directions=('query_to_doc', "
                "'doc_to_query'), partition_mode='per_direction', reverse_mix=False for MixCSE_single.")
        if self.layout == "official":
            changed = [f"{key}={value!r}" for key, value, default in (
                ("directions", options.directions, ("query_to_doc",)), ("partition_mode", options.partition_mode, "joint"),
                ("hardness_mode", options.hardness_mode, None), ("similarity_fct", similarity, "cos_sim"),
                ("contrast_anchors", options.contrast_anchors, False),
                ("contrast_positives", options.contrast_positives, False)) if value != default]
            if changed:
                raise ValueError(f"layout='official' is the released code's N×3N cross-entropy over cosines and takes "
                                 f"none of {', '.join(changed)} (its block 3 is reverse_mix); use layout='paper'")
            if self.partner in ("hardest", "explicit"):
                raise ValueError(
                    "layout='official' needs the mixing partners to form a permutation (partner='shift' or 'random'); "
                    f"partner={self.partner!r} does not."
                )
        if options.queue.as_pool and (self.partner != "hardest" or self.layout != "paper"):
            raise ValueError("MixCSELoss: queue_as_pool=True lets the hardest-partner choice pick queued rows; it "
                             f"needs partner='hardest' and layout='paper', got partner={self.partner!r}, "
                             f"layout={self.layout!r}")
        if self.focal_m is not None and similarity != "cos_sim":
            raise ValueError("MixCSELoss: focal_m needs similarity_fct=cos_sim (the Focal-InfoNCE logits s² and "
                             "s (s + m) are defined on cosines)")
        validation.check_focal_margin_range(self.focal_m, "focal_m (the Focal-InfoNCE margin m)", options.temperature)

    # ------------------------------------------------------------------ helpers
    def _partners(self, batch: Batch, similarity: Tensor | None) -> Tensor:
        """π: the mixing partner of each anchor, on the batch's device; ``similarity`` is needed for "hardest"."""
        generator = self.generator(batch.device) if self.partner == "random" else None
        return fn.partner_indices(batch.size, cast(fn.PartnerMode, self.partner), similarity=similarity,
                                  generator=generator, device=batch.device)

    def _allowed_partners(self, batch: Batch, similarity: Tensor, exclude: Tensor | None,
                          proposed: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """π and whether each row has one, for the rows of ``batch`` (:attr:`Batch.rows`): ``similarity`` and the
        ``exclude`` mask of masked false negatives are (R, N) over the in-batch candidates. ``proposed``: the shift
        / random partners of every row of the batch, drawn once per batch (:meth:`begin_batch`)."""
        start, stop = batch.row_range
        local = torch.arange(stop - start, device=batch.device)
        if self.partner != "hardest":
            rows_proposed = cast(Tensor, proposed)[start:stop]
            if exclude is None:
                return rows_proposed, torch.ones_like(rows_proposed, dtype=torch.bool)
        self_mask = torch.zeros(stop - start, batch.size, dtype=torch.bool, device=batch.device)
        self_mask[local, local + start] = True
        exclude = self_mask if exclude is None else exclude | self_mask
        if self.partner == "hardest":
            partners, valid = fn.top_candidates(similarity, 1, exclude)
            return partners.squeeze(1), valid.squeeze(1)
        return fn.allowed_partners(rows_proposed, exclude)

    @property
    def supports_row_chunks(self) -> bool:
        """The paper layout computes its rows a chunk of anchors at a time (the official layout's N×3N
        cross-entropy is computed whole)."""
        return self.layout == "paper"

    def begin_batch(self, batch: Batch) -> Batch:
        """Draw the shift / random partners of every row once per batch, kept on the batch
        (``batch.state.draws["partners"]``; a chunk of rows reads its own)."""
        if self.partner in ("shift", "random") and self.layout == "paper":
            batch.state.draws["partners"] = self._partners(batch, None)
        return batch

    # ------------------------------------------------------------------ loss
    def whole_batch_rows(self, batch: Batch) -> Tensor:
        """``layout="official"``: the rows of the released code's N×3N cross-entropy, computed whole (its window
        recorded for the batch, as the template's per-window step records its windows)."""
        return self._official_rows(batch)

    def paper_columns(self, batch: Batch, blocks: dict[str, fr.Block], queue: QueueRead | None
                      ) -> dict[str, fr.Block]:
        """MixCSE (paper Eq. 2-3), row i of the anchor → positive direction, with ``s(a, b) = cos(a, b) / τ``::

            mix_i = normalize(λ h'_i + (1-λ) h'_π(i))                                      (SG: detached)
            ℓ_i   = -log  e^{s(h_i, h'_i)} / (Σ_j e^{s(h_i, h'_j)} + Σ_k e^{s(h_i, n_k)} + e^{s(h_i, SG(mix_i))})

        Further ``directions`` are sentence-transformers' (``partition_mode`` combines them); ``reverse_mix`` gives
        ``doc_to_query`` (h'_i as anchor, h as candidates) the mixed negative ``normalize(λ h_i + (1-λ) h_π(i))``.
        ``layout="official"``: row i of the released code's N×3N cross-entropy (see the class docstring;
        :meth:`whole_batch_rows`). The paper layout's mixed column for ``batch``'s anchors (:attr:`Batch.rows`); each
        row's partner is its own (drawn once per batch, or its hardest unmasked in-batch negative, or with
        ``queue_as_pool`` a harder queued row)."""
        if self.layout == "official":
            raise NotImplementedError("layout='official' is computed whole (compute_loss_from_embeddings)")
        n = batch.size
        start, stop = batch.row_range
        local = torch.arange(stop - start, device=batch.device)
        blocks = dict(blocks)
        q2d = blocks["query_to_doc"]
        in_batch = q2d.similarity[:, :n].detach()  # (R, N): the hardest partner
        masked = batch.false_negatives  # (R, N + N·k) or None
        in_batch_masked = masked[:, :n] if masked is not None else None
        dot = self.similarity_fct_name == "dot_score"
        anchors = cast(Tensor, batch.raw_anchors) if dot else batch.anchors
        positives = cast(Tensor, batch.raw_positives) if dot else batch.positives
        row_anchors, row_positives = anchors[start:stop], positives[start:stop]
        if self.partner == "explicit":
            if batch.negatives.size(0) == 0:
                raise ValueError("MixCSELoss(partner='explicit') mixes each positive with the anchor's own mined "
                                 "negative, but the batch has no negative column: pass (anchor, positive, negative) "
                                 "triplets or use partner='shift' / 'random' / 'hardest'.")
            own_negatives = (cast(Tensor, batch.raw_negatives) if dot else batch.negatives)[start:stop]
            has_partner = torch.ones(stop - start, dtype=torch.bool, device=batch.device)
            if masked is not None:
                has_partner = ~masked[local, n + start + local]
            mixed = self._mix(row_positives, own_negatives)
        else:
            partners, has_partner = self._allowed_partners(batch, in_batch, in_batch_masked,
                                                                batch.state.draws.get("partners"))
            partner_rows = positives[partners]
            if self.queue_as_pool and queue is not None and queue.pool is not None:
                partner_rows, has_partner = self._hardest_of_batch_and_queue(queue, in_batch, partners, has_partner,
                                                                             partner_rows)
            mixed = self._mix(row_positives, partner_rows)
        no_mix = (~has_partner).unsqueeze(1) if masked is not None else None
        blocks["query_to_doc"] = q2d.with_columns((row_anchors * mixed).sum(-1, keepdim=True), no_mix)
        if self.reverse_mix:
            # h'_i as the anchor: mixed negative normalize(λ h_i + (1-λ) h_π(i)); its false negatives are the
            # transposed in-batch mask (the doc_to_query block's)
            reverse_has_partner = has_partner
            d2q = blocks["doc_to_query"]
            if self.partner == "explicit":
                reverse_mixed = self._mix(row_anchors, own_negatives)
            else:
                reverse_masked = (batch.block_masks or {}).get("doc_to_query") if masked is not None else None
                reverse_partners, reverse_has_partner = self._allowed_partners(
                    batch, d2q.similarity[:, :n].detach(), reverse_masked, batch.state.draws.get("partners"))
                reverse_mixed = self._mix(row_anchors, anchors[reverse_partners])
            reverse_no_mix = (~reverse_has_partner).unsqueeze(1) if masked is not None else None
            blocks["doc_to_query"] = d2q.with_columns((row_positives * reverse_mixed).sum(-1, keepdim=True),
                                                      reverse_no_mix)
        return blocks

    @staticmethod
    def _hardest_of_batch_and_queue(queue: QueueRead, in_batch: Tensor, partners: Tensor, has_partner: Tensor,
                                    partner_rows: Tensor) -> tuple[Tensor, Tensor]:
        """``queue_as_pool``: each row's partner becomes its hardest unmasked queued row where that one scores above
        the hardest in-batch partner (or the row has none); returns the partner rows and whether each row has one
        (the share that took a queued row joins the queue's counts, ``queue_partner_fraction``)."""
        similarity, exclude, vectors = cast(tuple[Tensor, Tensor | None, Tensor], queue.pool)
        if exclude is None:
            exclude = torch.zeros_like(similarity, dtype=torch.bool)
        best, valid = fn.top_candidates(similarity, 1, exclude)
        best, valid = best.squeeze(1), valid.squeeze(1)
        queue_score = similarity.detach().gather(1, best.unsqueeze(1)).squeeze(1)
        batch_score = in_batch.gather(1, partners.unsqueeze(1)).squeeze(1)
        use_queue = valid & (~has_partner | (queue_score > batch_score))
        queue.stats["queue_partner_fraction"] = use_queue.float().mean().detach()
        rows = torch.where(use_queue.unsqueeze(1), vectors[best].to(partner_rows.dtype), partner_rows)
        return rows, has_partner | valid

    def _mix(self, own: Tensor, partner_rows: Tensor) -> Tensor:
        """The mixed negative of every row, detached under stop-gradient: ``normalize(λ·own + (1-λ)·partner)`` of
        unit rows (cosines), or the raw interpolation ``λ·own + (1-λ)·partner`` (``dot_score``)."""
        if self.similarity_fct_name == "dot_score":
            mixed = self.lam * own + (1.0 - self.lam) * partner_rows
        else:
            mixed = fn.mix(own, partner_rows, self.lam, assume_normalized=True)
        return mixed.detach() if self.stop_gradient else mixed

    def _official_rows(self, batch: Batch) -> Tensor:
        """Row a of ``CE([cos(z1_a, z2_b) | cos(z1_a, mix_b) | cos(mix'_a, z2_b)] / τ)``, mixes of the RAW vectors."""
        z1, z2, n = batch.anchors, batch.positives, batch.size
        partners = self._partners(batch, None)
        rows = torch.arange(n, device=batch.device)
        num_shared = n + batch.negatives.size(0)
        # Block 1 (+ explicit negatives): the SimCSE logits.
        blocks = [z1 @ batch.candidates.T]
        # Block 2: anchor a vs every mix_b = λ z2_b + (1-λ) z2_π(b) (raw, then normalised once for the cosine);
        # mix_b contains a's own positive when π(b) = a: that entry's logit is set to 0.
        block2 = z1 @ self._raw_mix(cast(Tensor, batch.raw_positives), partners).T
        blocks.append(block2)
        inverse = torch.empty_like(partners)
        inverse[partners] = rows
        zeroed = [(rows, num_shared + inverse)]
        if self.reverse_mix:
            # Block 3: mixed anchor mix'_a = λ z1_a + (1-λ) z1_π(a) vs every positive z2_b; zero b = π(a).
            blocks.append(self._raw_mix(cast(Tensor, batch.raw_anchors), partners) @ z2.T)
            zeroed.append((rows, num_shared + n + partners))
        cos = torch.cat(blocks, dim=1)
        logits = fn.contrastive_logits(cos, self.options.temperature, self.focal_m)
        keep = torch.ones_like(logits, dtype=torch.bool)
        for r, c in zeroed:
            keep[r, c] = False
        logits = logits.masked_fill(~keep, 0.0)
        masked = batch.false_negatives
        excluded: Tensor | None = None
        if masked is not None:
            # Masked false negatives leave the denominator: in block 1 directly; in block 2 every mix_b built from a
            # false negative of a (b or π(b)); in block 3 the positives z2_b that are false negatives of a.
            in_batch = masked[:, :n]
            exclude = [masked, in_batch | in_batch[:, partners]]
            if self.reverse_mix:
                exclude.append(in_batch)
            excluded = torch.cat(exclude, dim=1)
            logits = fn.mask_columns(logits, excluded)
            keep[:, : excluded.size(1)] &= ~excluded
        own_mix = block2[rows, rows].unsqueeze(1)
        stats = fn.contrastive_stats(torch.cat([cos[:, :num_shared], own_mix], dim=1).detach(), n, 1)
        stats.update(batch.false_negative_stats)
        # the negatives left to each row: every entry but its positive, the zeroed ones and the masked ones (the
        # zeroed entries stay in the denominator as exp(0), as in the released code, but teach nothing); the
        # released code's matrix is not sentence-transformers' blocks, so the rule is applied to it here
        keep[rows, rows] = False
        usable, tally = self.ranking.unusable_rows(batch, keep.sum(dim=1) if excluded is not None or n <= 1 else None,
                                                   n, excluded.sum() if excluded is not None else 0, keep.size(1) - 1)
        batch.state.windows.append(WindowRecord(usable, tally, stats, n))
        return fn.info_nce_rows(logits)

    def _raw_mix(self, raw: Tensor, partners: Tensor) -> Tensor:
        """``normalize(λ x_b + (1-λ) x_π(b))`` of the unnormalised rows ``x`` (the released code mixes raw vectors)."""
        mixed = fn.normalize(self.lam * raw + (1.0 - self.lam) * raw[partners])
        return mixed.detach() if self.stop_gradient else mixed

    def paper_config(self) -> dict[str, Any]:
        return {"lam": self.lam, "stop_gradient": self.stop_gradient,
                "partner": self.partner, "layout": self.layout, "focal_m": self.focal_m, "reverse_mix": self.reverse_mix}

    @property
    def logit_margin(self) -> float | None:
        """``focal_m``: Focal-InfoNCE's logit rule on every entry, the mixed negative included (``None``: plain)."""
        return self.focal_m

    @property
    def citation(self) -> str:
        return """
@inproceedings{zhang2022mixcse,
    title={Unsupervised Sentence Representation via Contrastive Learning with Mixing Negatives},
    author={Zhang, Yanzhao and Zhang, Richong and Mensah, Samuel and Liu, Xudong and Mao, Yongyi},
    booktitle={Proceedings of the AAAI Conference on Artificial Intelligence},
    year={2022}
}
"""
