"""HNCSE (Liu et al., 2024): positive mixing with the hardest negative (PM) and mixup of the top-k hard negatives
(HNM)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal, Unpack, cast

import torch
from sentence_transformers import SentenceTransformer
from torch import Tensor

from st_hardneg import functional as fn
from st_hardneg import validation
from st_hardneg.functional import ranking as fr
from st_hardneg.losses import false_negatives
from st_hardneg.losses.base import HardNegativeLoss, LossOptions, SharedOptions
from st_hardneg.losses.batch import Batch

if TYPE_CHECKING:
    from st_hardneg.losses.queue import QueueRead

Mode = Literal["pm", "hnm", "both"]
HnmPool = Literal["in_batch_negatives", "hard_negatives", "all_negatives"]
Alpha = float | str | Callable[[Tensor], Tensor | float]


class HNCSELoss(HardNegativeLoss):
    queue_pool_refusal = ("HNCSE's PM partner and HNM top-k pool are chosen from the batch only (taking them from the "
                          "queue is not built: its stale near-duplicates are the rows a top-k would pick first)")

    def __init__(
        self,
        model: SentenceTransformer,
        guide: SentenceTransformer | None = None,
        *,
        mode: Mode = "pm",
        pm_threshold: float = 0.1,
        w1: float = 0.8,
        w2: float = 0.2,
        pm_gradient: bool = True,
        pm_single: bool = False,
        pm_weight_gradient: bool = False,
        k: int = 10,
        num_mixed: int = 40,
        alpha: Alpha = 0.5,
        hnm_single: bool = False,
        hnm_gradient: bool = True,
        focal_m: float | None = None,
        hnm_pool: HnmPool = "in_batch_negatives",
        **options: Unpack[LossOptions],
    ) -> None:
        """
        HNCSE: SimCSE's InfoNCE with the hardest in-batch negatives used twice: mixed into the positive (positive
        mixing, PM) and mixed with each other into synthetic hard negatives (hard-negative mixing, HNM)
        (Liu et al., 2024).

        With ``h`` the anchor and ``h'`` the positive embeddings (all L2-normalised), row ``i`` of the loss is a
        cross-entropy with target ``i`` over::

            [h_i·p_1, ..., h_i·p_N, h_i·(explicit negatives), h_i·u_i1, ..., h_i·u_im] / τ

        **Positive mixing** (``mode="pm"`` or ``"both"``; paper §3.1, Eq. 2). ``d1 = cos(h_i, h'_i)``,
        ``j* = argmax_{j≠i} cos(h_i, h'_j)``, ``d2 = cos(h_i, h'_j*)``, ``r = (d1 - d2) / d1``:

        - ``0 < r <= pm_threshold``: ``p_i = normalize(w1·h'_i + w2·h'_j*)``;
        - ``r > pm_threshold``: ``p_i = h'_i``;
        - ``d1 <= d2``: ``p_i = normalize(d1/(d1+d2)·h'_i + d2/(d1+d2)·h'_j*)``. The printed Eq. 2 has the coefficients
          ``(d1-d2)/d1`` and ``(d1-d2)/d2`` here, which are negative and would invert the positive; we use the convex
          weights of the authors' code (Rcrossmeister/HNCSE, ``model/method1_models.py``);
        - ``d1 <= 0`` or ``d1 + d2 <= 0``: ``p_i = h'_i``. Not in the paper: there ``r`` changes sign and the weights
          above stop being convex (the authors' code would mix with e.g. -2 and 3); this takes precedence over the
          other cases.

        The mixed ``p`` replaces ``h'`` everywhere: as the positive of its anchor and as the in-batch negative of the
        other anchors (as in the authors' code, so ``p_j`` can contain ``h'_i`` when ``j* = i`` for anchor ``j``). The
        case and ``j*`` are constants; so are the weights unless ``pm_weight_gradient=True``.

        **Hard-negative mixing** (``mode="hnm"`` or ``"both"``; paper §3.2, Eq. 7-8). For anchor ``i``, ``G`` = its
        top-``k`` in-batch negatives by ``cos(h_i, p_j)``, ``j ≠ i``. ``num_mixed`` ordered pairs ``(a, b)`` of distinct
        indices into ``G`` are drawn uniformly (with replacement across pairs) and give the synthetic negatives
        ``u = normalize(α·G_a + (1-α)·G_b)``, appended to anchor ``i``'s candidates only. Like MixCSE's mixes, the
        inputs are normalised before mixing (the authors' code mixes the raw vectors); with ``α = 0.5`` the order of
        ``(a, b)`` does not matter, as in the code, which draws unordered pairs.

        **mode="both"** (not reported in the paper, which evaluates PM and HNM separately) composes them in order: PM
        rewrites the in-batch candidates, then HNM mines the top-``k`` among the rewritten ``p_j`` and mixes those.

        **Deviations from the authors' code**, each documented where it applies: PM treats the mixing weights
        ``d1/(d1+d2)`` as constants by default (the code differentiates through them: ``pm_weight_gradient=True``);
        PM and HNM mix the *normalised* vectors (the code mixes raw ones); HNM mines the top-``k`` in the *current*
        batch (the code mines the previous batch's embeddings); the ``d1 <= 0`` / ``d1 + d2 <= 0`` rows are kept.

        HNCSE is one-directional (the paper's Eq. 1 and 3; no ``symmetric`` option). Explicit negatives (third column
        on) are shared candidates, as in ST's ``MultipleNegativesRankingLoss``; they are not mixed into the positive,
        and HNM mines them only with ``hnm_pool="hard_negatives"`` or ``"all_negatives"`` (the paper's definition
        uses in-batch negatives only).

        :attr:`diagnostics` reports, besides the mean ``positive`` (``cos(h_i, p_i)``), ``negative`` and ``synthetic``
        cosines, ``pm_mixed``: the share of the anchors whose positive was mixed in the last batch.

        Args:
            model: SentenceTransformer model.
            guide: optional guide model for false-negative filtering, as in ``GISTEmbedLoss(model, guide)``.
            mode: ``"pm"`` (HNCSE-PM), ``"hnm"`` (HNCSE-HNM) or ``"both"``.
            temperature: τ > 0 (SimCSE's 0.05; the paper follows SimCSE's protocol).
            pm_threshold: the bound on ``r`` below which the positive is mixed (paper: 0.1), >= 0.
            w1: weight of ``h'_i`` in the ``0 < r <= pm_threshold`` case, >= 0. The mix is re-normalised, so only
                ``w1 / (w1 + w2)`` matters. The paper gives no value and the authors' code keeps the weights of the last
                of 2000 Optuna trials drawn in [0, 2] on every step (the search result is discarded), i.e. no usable
                default. **Provisional default 0.8** (with ``w2=0.2``): the positive keeps the larger weight, so
                ``p_i`` stays closer to ``h'_i`` than to the negative (any ``w1 > w2``), while 0.2 on the hard negative
                is the mixing share MixCSE found effective (``λ = 0.2``) and keeps ``cos(p_i, h'_i) >= 0.97`` for
                ``cos(h'_i, h'_j*) >= 0``; it sits between the ``d1 <= d2`` case at the boundary (weights ≈ 1/2) and no
                mixing (weight 1). Tune it on STS-B dev for a new setting.
            w2: weight of ``h'_j*`` in that case, >= 0 (``w1 + w2 > 0``). Provisional default 0.2, see ``w1``.
            pm_gradient: let gradients flow through the mixed positives into ``h'_i`` and ``h'_j*`` (the authors' code
                does). ``False`` detaches the mixed rows (the rows that are not mixed keep their gradient).
            pm_weight_gradient: let gradients flow through the ``d1 <= d2`` case's weights ``d1/(d1+d2)`` into the
                cosines ``d1``, ``d2`` (the authors' code does). ``False`` (default) treats them as constants.
            pm_single: the paper's HNCSE-PM_single ablation: only the ``d1 > d2`` case mixes; rows with ``d1 <= d2``
                keep ``h'_i`` (they stay in the loss).
            k: how many hard negatives per anchor are mined (paper: 10), >= 1 (>= 2 for mixing). **If the batch has
                fewer in-batch negatives (k >= batch size), k is clamped to batch size - 1 and a warning is issued once
                per loss**: the last batch of an epoch is often smaller, and an error would stop training there.
            num_mixed: ``m``, synthetic negatives per anchor (paper's code: 40), >= 1. More than the ``k (k - 1)``
                ordered pairs of distinct hard negatives could only repeat mixtures: it is clamped to ``k (k - 1)``
                with a warning (at construction; and for a batch whose size clamps ``k``, to that ``k``'s pairs, once
                per loss). The rule for every count: :func:`st_hardneg.validation.clamp_count`.
            alpha: the weight ``α`` of ``G_a``: a float in [0, 1] (default 0.5, as in the authors' code); a function
                ``f(cos(G_a, G_b)) -> α`` on the (N, m) cosine tensor (the paper's adaptive Eq. 8; evaluated without
                gradient; must return values in [0, 1]); or ``"adaptive"`` for :func:`st_hardneg.functional.adaptive_alpha`,
                ``α = (3 - c) / 4``, which mixes near-duplicate negatives evenly and leans towards ``G_a`` as the pair
                diverges, so that the normalised mix is not artificially harder than both parents.
            hnm_single: the paper's HNCSE-HNM_single ablation: append the top-``k`` negatives themselves (``k`` columns,
                hardest first) instead of ``num_mixed`` mixtures. (The paper's wording "replace ``u_o`` with ``G_i``"
                would draw ``num_mixed`` of them with replacement; we use each once, deterministically.)
            hnm_gradient: let gradients flow through the synthetic negatives into the mined ``p_j`` (the authors' code
                does). ``False`` treats them as constants, as MoCHi (Kalantidis et al. 2020) does with its memory bank.
            focal_m: if set, apply the Focal-InfoNCE modulation (positive ``s²/τ``, negatives ``s(s+m)/τ``, including
                the synthetic ones) with margin ``m``; ``None`` (default) = the paper's plain InfoNCE. An st-hardneg
                extension.
            hnm_pool: where HNM mines its top-``k`` (the ``hardness_mode`` vocabulary of sentence-transformers'
                ``MultipleNegativesRankingLoss``): ``"in_batch_negatives"`` (default, the paper: the other pairs'
                positives ``p_j``), ``"hard_negatives"`` (the explicit, e.g. mined, negatives of the batch: every
                negative column of every pair, as they are shared candidates; needs a negative column) or
                ``"all_negatives"`` (both). ``k`` is clamped to the size of the pool.
            **options: the options of sentence-transformers' ``MultipleNegativesRankingLoss`` / ``GISTEmbedLoss`` and
                st-hardneg's shared ones, keyword-only, documented on :class:`~st_hardneg.HardNegativeLoss`:
                ``scale`` or ``temperature``, ``similarity_fct``, ``directions``, ``partition_mode``,
                ``hardness_mode``, ``hardness_strength``, ``seed``, ``mask_duplicates`` (default on), ``margin``,
                ``margin_strategy``, ``contrast_anchors``, ``contrast_positives``, ``gather_across_devices``,
                ``mini_batch_size``, ``mini_batch_num_tokens``, ``show_progress_bar``.
                Here: PM and HNM act on the ``query_to_doc`` direction (the paper's); further ``directions`` see the
                mixed positives; ST's hardness penalty applies to ST's columns, not to the synthetic negatives;
                ``similarity_fct`` must be ``cos_sim``.
                Here: masked candidates leave the denominator, are never PM's ``j*`` (the hardest *unmasked*
                negative is used; a row without one keeps its positive) and never enter the HNM pool (a row with fewer
                unmasked candidates than the mixing needs loses the synthetic negatives that would use a masked one);
                the margin is computed on the embeddings before PM. ``seed`` seeds the generator of the HNM pairs
                (created on the embeddings' device at the first batch). ``gather_across_devices`` gathers the anchors,
                positives and explicit negatives, so PM's ``j*`` and HNM's top-``k`` pool are mined in the global
                batch; the HNM pairs are drawn identically on every process.

        References:
            - Liu et al., "HNCSE: Advancing Sentence Embeddings via Hybrid Contrastive Learning with Hard Negatives",
              2024. https://arxiv.org/abs/2411.12156
            - Code (does not run as published): https://github.com/Rcrossmeister/HNCSE
            - Kalantidis et al., "Hard Negative Mixing for Contrastive Learning", NeurIPS 2020 (MoCHi, the origin of
              HNM).

        Requirements:
            1. (anchor, positive) pairs; for unsupervised SimCSE the same sentence twice (dropout is the
               augmentation). Optionally explicit negatives in further columns.
            2. A batch of at least 2 pairs, or 3 when hard negatives are mixed (``mode`` "hnm"/"both" without
               ``hnm_single``): a pair of distinct negatives needs 2 other pairs in the batch.

        Inputs:
            +-------------------------------------------------+--------+
            | Texts                                           | Labels |
            +=================================================+========+
            | (anchor, positive) pairs                        | none   |
            +-------------------------------------------------+--------+
            | (anchor, positive, negative_1, ..., negative_n) | none   |
            +-------------------------------------------------+--------+

        Recommendations:
            - Use ``BatchSamplers.NO_DUPLICATES``: a duplicate of the anchor is its hardest in-batch negative, so PM
              would mix it into the positive and HNM would mix it into the synthetic negatives. ``mask_duplicates``
              (default) keeps exact duplicates out of PM and HNM; ``margin`` also near-duplicates.
            - With mined negatives, ``hnm_pool="hard_negatives"`` (or ``"all_negatives"``) mixes them into the
              synthetic negatives.
            - Batch size 64, the paper's best (its Fig. 4a) and well above ``k + 1``.

        Relations:
            - :class:`~st_hardneg.MixCSELoss` mixes the positive with a negative to make a *negative*; HNCSE-PM mixes
              them to make the *positive*, and HNCSE-HNM mixes negatives with each other.
            - Without PM and HNM this is ST's ``MultipleNegativesRankingLoss`` (SimCSE).
            - :class:`~st_hardneg.FocalInfoNCELoss` re-weights the negatives instead of synthesising new ones;
              ``focal_m`` combines both.

        Example:
            ::

                from datasets import Dataset
                from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
                from sentence_transformers.base.sampler import BatchSamplers
                from st_hardneg import HNCSELoss
                from st_hardneg.models import load_default_model

                model = load_default_model()  # all-MiniLM-L6-v2 with CLS pooling, max_seq_length 32
                sentences = ["A man is playing a guitar.", "A woman is slicing an onion.", "The sky is blue."]
                train_dataset = Dataset.from_dict({"anchor": sentences, "positive": sentences})
                loss = HNCSELoss(model, mode="hnm", k=10, num_mixed=40)
                args = SentenceTransformerTrainingArguments(
                    output_dir="out", batch_sampler=BatchSamplers.NO_DUPLICATES, per_device_train_batch_size=64
                )
                trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train_dataset, loss=loss)
                trainer.train()
        """
        super().__init__(model, guide, **options)
        self.mode = validation.check_choice(mode, "mode", ("pm", "hnm", "both"))
        self.pm_threshold = validation.check_non_negative(pm_threshold, "pm_threshold")
        self.w1 = validation.check_non_negative(w1, "w1")
        self.w2 = validation.check_non_negative(w2, "w2")
        if self.w1 + self.w2 <= 0:
            raise ValueError(f"w1 + w2 must be positive (the mix is normalised by it), got w1={w1!r}, w2={w2!r}")
        self.pm_gradient = validation.check_bool(pm_gradient, "pm_gradient")
        self.pm_single = validation.check_bool(pm_single, "pm_single")
        self.pm_weight_gradient = validation.check_bool(pm_weight_gradient, "pm_weight_gradient")
        self.hnm_single = validation.check_bool(hnm_single, "hnm_single")
        self.k = validation.check_count(k, "k", minimum=1 if self.hnm_single else 2)
        self.num_mixed = validation.check_count(num_mixed, "num_mixed")
        if not self.hnm_single:  # more mixtures than ordered pairs would repeat mixtures (copies in the denominator)
            self.num_mixed = validation.clamp_count(
                self.num_mixed, "num_mixed", self.k * (self.k - 1),
                f"k={self.k} hard negatives make only {self.k * (self.k - 1)} distinct ordered pairs (a, b) to mix",
                owner="HNCSELoss", remedy="Raise k or lower num_mixed")
        self.alpha = validation.check_weight_or_callable(alpha, "alpha (the weight of G_a in the mix)",
                                                         names=fn.ALPHA_FUNCTIONS)
        self.hnm_gradient = validation.check_bool(hnm_gradient, "hnm_gradient")
        self.focal_m = validation.check_optional_non_negative(focal_m, "focal_m (the Focal-InfoNCE margin m)")
        self.check_options(self.options)
        self._warned_k = False
        self._warned_num_mixed = False
        #: per batch (begin_batch): the positive-mixing share for the diagnostics, HNM's random pair positions
        self.hnm_pool = validation.check_choice(hnm_pool, "hnm_pool",
                                                ("in_batch_negatives", "hard_negatives", "all_negatives"))
        if not self.uses_hnm and self.hnm_pool != "in_batch_negatives":
            raise ValueError(f"HNCSELoss: hnm_pool={self.hnm_pool!r} is where HNM mines, and mode={self.mode!r} runs no "
                             "HNM, so it would be ignored; use mode='hnm' or 'both', or drop hnm_pool")
        # a pair of distinct in-batch negatives needs two other pairs in the batch
        self.min_batch_size = 3 if self.uses_hnm and not self.hnm_single else 2

    def check_options(self, options: SharedOptions) -> None:
        """The shared options' rules, and ``focal_m``'s largest logit at the temperature."""
        super().check_options(options)
        validation.check_focal_margin_range(self.focal_m, "focal_m (the Focal-InfoNCE margin m)", options.temperature)

    @property
    def uses_pm(self) -> bool:
        return self.mode in ("pm", "both")

    @property
    def uses_hnm(self) -> bool:
        return self.mode in ("hnm", "both")

    @property
    def _alpha_function(self) -> fn.Alpha:
        return fn.ALPHA_FUNCTIONS[self.alpha] if isinstance(self.alpha, str) else self.alpha

    # ------------------------------------------------------------------ helpers
    def effective_k(self, batch_size: int, available: int | None = None) -> int:
        """``k`` clamped to the ``available`` negatives of the HNM pool (default ``batch_size - 1``, the in-batch
        negatives); warns once per loss when it clamps."""
        in_batch = available is None
        available = batch_size - 1 if in_batch else cast(int, available)
        if self.k <= available:
            return self.k
        if not self._warned_k:
            what = (f"a batch of {batch_size} pairs has only {available} in-batch negatives per anchor" if in_batch
                    else f"the HNM pool ({self.hnm_pool}) has only {available} negatives per anchor")
            warnings.warn(validation.clamped_count_message("HNCSELoss", "k", self.k, available, what,
                                                           "Increase the batch size or lower k"),
                          UserWarning, stacklevel=3)
            self._warned_k = True
        return available

    def effective_num_mixed(self, k: int) -> int:
        """``num_mixed`` clamped to the ``k (k - 1)`` ordered pairs of the batch's (clamped) ``k``; warns once per
        loss when it clamps (more draws would only repeat mixtures)."""
        pairs = k * (k - 1)
        if self.num_mixed <= pairs:
            return self.num_mixed
        if not self._warned_num_mixed:
            warnings.warn(validation.clamped_count_message(
                "HNCSELoss", "num_mixed", self.num_mixed, pairs,
                f"this batch's k={k} hard negatives make only {pairs} distinct ordered pairs to mix",
                "Increase the batch size or lower num_mixed"), UserWarning, stacklevel=3)
            self._warned_num_mixed = True
        return pairs

    # ------------------------------------------------------------------ loss
    def begin_batch(self, batch: Batch) -> Batch:
        """Once per batch, before its rows: positive mixing of every row of the (global) batch (each row's hardest
        unmasked in-batch negative is found a chunk of :attr:`loss_chunk_size` rows at a time, so no (N, N) matrix
        is held), which replaces the positives (the false negatives are still judged on the unmixed batch); and the
        random pairs of HNM, drawn once for every row."""
        if self.uses_hnm and self.hnm_pool == "hard_negatives" and batch.negatives.size(0) == 0:
            raise ValueError("HNCSELoss(hnm_pool='hard_negatives') mines the explicit negatives, but the batch has no "
                             "negative column: pass (anchor, positive, negative...) or use "
                             "hnm_pool='in_batch_negatives'.")
        n = batch.size
        if self.uses_pm:
            partners, has_partner = self._pm_partners(batch)
            pm = fn.positive_mixing(
                batch.anchors, batch.positives, self.pm_threshold, self.w1, self.w2, single=self.pm_single,
                detach_mix=not self.pm_gradient, weight_gradient=self.pm_weight_gradient, assume_normalized=True,
                partners=partners, has_partner=has_partner)
            batch = replace(batch, positives=pm.positives, unmixed=batch.judged)
            batch.state.draws["pm_mixed"] = pm.mixed.float().mean()  # share of the anchors whose positive was mixed
        if self.uses_hnm and not self.hnm_single:
            k = self.effective_k(n, None if self.hnm_pool == "in_batch_negatives" else self._pool_size(batch))
            if k >= 2:
                # kept for the whole batch, drawn in the narrowest dtype positions < k fit (8 bits up to k = 128:
                # an eighth of int64's (N, num_mixed) pairs, and no int64 draw on the way)
                batch.state.draws["hnm_pairs"] = fn.sample_distinct_pairs(n, k, self.effective_num_mixed(k),
                                                           generator=self.generator(batch.device),
                                                           device=batch.device, dtype=fn.compact_index_dtype(k))
        return batch

    def _pm_partners(self, batch: Batch) -> tuple[Tensor, Tensor | None]:
        """``j*``, the hardest unmasked in-batch negative of every row (and whether it has one; ``None``: all do),
        chunk by chunk."""
        n = batch.size
        chunk = self.loss_chunk_size if self.uses_gradient_cache else n
        partners, valid = [], []
        for start in range(0, n, chunk):
            stop = min(start + chunk, n)
            with torch.no_grad():
                similarity = batch.anchors[start:stop] @ batch.positives.T
                exclude = torch.zeros(stop - start, n, dtype=torch.bool, device=batch.device)
                local = torch.arange(stop - start, device=batch.device)
                exclude[local, local + start] = True
                if self.controls_false_negatives:
                    exclude |= false_negatives.candidate_mask(batch, (start, stop), (0, n), self.preparer.rule)
                best, ok = fn.top_candidates(similarity, 1, exclude)
            partners.append(best.squeeze(1))
            valid.append(ok.squeeze(1))
        has_partner = torch.cat(valid)
        return torch.cat(partners), (has_partner if self.controls_false_negatives else None)

    def _pool_size(self, batch: Batch) -> int:
        """The negatives per anchor in the HNM pool (for k's clamp)."""
        n, num_explicit = batch.size, batch.negatives.size(0)
        return {"in_batch_negatives": n - 1, "hard_negatives": num_explicit,
                "all_negatives": n + num_explicit - 1}[self.hnm_pool]

    def paper_columns(self, batch: Batch, blocks: dict[str, fr.Block], queue: QueueRead | None
                      ) -> dict[str, fr.Block]:
        """HNCSE (paper Eq. 1-3, 7), row i, with ``s(a, b) = cos(a, b) / τ``, ``p`` the positives after PM (``h'``
        without PM: :meth:`begin_batch` swapped them in) and ``u_i1..u_im`` the HNM mixtures of anchor i (none
        without HNM), appended to ``query_to_doc``::

            ℓ_i = -log  e^{s(h_i, p_i)} / (Σ_j e^{s(h_i, p_j)} + Σ_k e^{s(h_i, n_k)} + Σ_o e^{s(h_i, u_io)})
        """
        if not self.uses_hnm:
            return blocks
        masked = batch.false_negatives
        q2d = blocks["query_to_doc"]
        synthetic, dropped = self._hnm_cosines(batch, q2d.similarity, masked)
        return {**blocks, "query_to_doc": q2d.with_columns(synthetic, dropped if masked is not None else None)}

    def paper_stats(self, batch: Batch) -> dict[str, Tensor]:
        """``pm_mixed``: the share of the batch's positives PM replaced (with positive mixing)."""
        mixed = batch.state.draws.get("pm_mixed")
        return {"pm_mixed": mixed.detach() if isinstance(mixed, Tensor) else torch.as_tensor(mixed)} \
            if mixed is not None else {}

    @property
    def logit_margin(self) -> float | None:
        """``focal_m``: Focal-InfoNCE's logit rule on every entry, the mixtures included (``None``: plain)."""
        return self.focal_m

    def cosine_only_reason(self) -> str | None:
        return ("positive mixing compares the ratio (d1 - d2) / d1 of cosines and both mixes weight unit "
                "directions")

    def _hnm_cosines(self, batch: Batch, cos: Tensor, masked: Tensor | None) -> tuple[Tensor, Tensor]:
        """The (R, S) cosines of the rows of ``batch`` with the synthetic negatives mined in :attr:`hnm_pool`
        (unmasked candidates only) and the (R, S) bool mask of those that use a masked candidate (rows with too few
        unmasked ones). ``cos``: the rows' (R, C) similarities."""
        n, num_explicit = batch.size, batch.negatives.size(0)
        start, stop = batch.row_range
        first, last = {"in_batch_negatives": (0, n), "hard_negatives": (n, n + num_explicit),
                       "all_negatives": (0, n + num_explicit)}[self.hnm_pool]
        pool, similarity = batch.candidates[first:last], cos[:, first:last]
        exclude = torch.zeros(stop - start, last - first, dtype=torch.bool, device=batch.device)
        if first == 0:  # the pool holds the in-batch candidates: the own positive is not a negative
            local = torch.arange(stop - start, device=batch.device)
            exclude[local, local + start] = True
        if masked is not None:
            exclude |= masked[:, first:last]
        k = self.effective_k(n, None if self.hnm_pool == "in_batch_negatives" else self._pool_size(batch))
        hard, _ = fn.top_candidates(similarity, k, exclude)
        row_anchors = batch.row_anchors
        if self.hnm_single:
            synthetic = similarity.gather(1, hard)
            if not self.hnm_gradient:  # the mined negatives are constants: the gradient reaches the anchors only
                synthetic = torch.einsum("nd,nkd->nk", row_anchors, pool.detach()[hard])
            return synthetic, exclude.gather(1, hard)
        draws = batch.state.draws.get("hnm_pairs")
        if draws is None:  # called outside begin_batch: draw for these rows now
            draws = fn.sample_distinct_pairs(n, k, self.effective_num_mixed(k), generator=self.generator(batch.device),
                                             device=batch.device)
        parents_a, parents_b = (hard.gather(1, draws[0][start:stop].long()), hard.gather(1, draws[1][start:stop].long()))
        synthetic = fn.mixed_negative_cosines(
            row_anchors, pool, parents_a, parents_b, alpha=self._alpha_function, detach_pool=not self.hnm_gradient,
            similarity=similarity, assume_normalized=True,
        )
        return synthetic, exclude.gather(1, parents_a) | exclude.gather(1, parents_b)

    def paper_config(self) -> dict[str, Any]:
        alpha = self.alpha if isinstance(self.alpha, str | float) else getattr(self.alpha, "__name__", repr(self.alpha))
        return {"mode": self.mode, "pm_threshold": self.pm_threshold, "w1": self.w1, "w2": self.w2,
                "pm_gradient": self.pm_gradient, "pm_single": self.pm_single,
                "pm_weight_gradient": self.pm_weight_gradient, "k": self.k, "num_mixed": self.num_mixed,
                "alpha": alpha, "hnm_single": self.hnm_single, "hnm_gradient": self.hnm_gradient,
                "focal_m": self.focal_m, "hnm_pool": self.hnm_pool}

    @property
    def citation(self) -> str:
        return """
@misc{liu2024hncse,
    title={{HNCSE}: Advancing Sentence Embeddings via Hybrid Contrastive Learning with Hard Negatives},
    author={Liu, Wenxiao and Yang, Zihong and Li, Chaozhuo and Hong, Zijin and Ma, Jianfeng and Liu, Zhiquan and Zhang, Litian and Huang, Feiran},
    year={2024},
    eprint={2411.12156},
    archivePrefix={arXiv},
    primaryClass={cs.CL},
    url={https://arxiv.org/abs/2411.12156}
}
"""
