"""Focal-InfoNCE (Hou & Li, Findings of EMNLP 2023): InfoNCE with self-paced modulation of the positive and negative
logits."""

from __future__ import annotations

from typing import Any, Unpack

from sentence_transformers import SentenceTransformer

from st_hardneg import validation
from st_hardneg.losses.base import HardNegativeLoss, LossOptions, SharedOptions


class FocalInfoNCELoss(HardNegativeLoss):
    def __init__(
        self,
        model: SentenceTransformer,
        guide: SentenceTransformer | None = None,
        *,
        m: float = 0.3,
        **options: Unpack[LossOptions],
    ) -> None:
        """
        Focal-InfoNCE: InfoNCE with self-paced modulation terms that weight hard negatives up and easy negatives down
        (Hou & Li, EMNLP Findings 2023).

        With ``h`` the anchor embeddings and ``h'`` the positive embeddings (all L2-normalised),
        ``s_p = cos(h_i, h'_i)`` and ``s_n = cos(h_i, c)`` for every other candidate ``c``, row ``i`` of the loss is a
        cross-entropy with target ``i`` over::

            [s_p² / τ,  s_n (s_n + m) / τ  for every other in-batch positive h'_j and every explicit negative]

        The positive stays in the denominator (the paper's Eq. 2 and the authors' code). A negative's logit is scaled by
        ``(s_n + m)``, so its gradient weight ``(2 s_n + m) / τ`` grows with its similarity: negatives with
        ``s_n > 1 - m`` are weighted up relative to InfoNCE, easier ones down. The positive logit ``s_p² / τ`` gives a
        dissimilar positive pair (a lossy dropout view) a smaller gradient ``2 s_p / τ``.

        Caveats of the formula (not of this implementation): the negative logit is minimal at ``s_n = -m/2``, so
        negatives that are already more dissimilar than that are pulled back towards ``-m/2``; and ``s_p²`` is even in
        ``s_p``, so a positive pair with ``s_p < 0`` is pushed further apart. Both are harmless from a pre-trained
        encoder, where ``s_p`` is near 0.85 (SimCSE dropout views) and in-batch ``s_n`` are mostly positive.

        Args:
            model: SentenceTransformer model.
            guide: optional guide model for false-negative filtering, as in ``GISTEmbedLoss(model, guide)``.
            m: the hardness margin, >= 0 (paper: 0.3; Table 5 finds 0.2-0.3 best). ``m = 0`` keeps the squared logits.
            **options: the options of sentence-transformers' ``MultipleNegativesRankingLoss`` / ``GISTEmbedLoss`` and
                st-hardneg's shared ones, keyword-only, documented on :class:`~st_hardneg.HardNegativeLoss`:
                ``scale`` or ``temperature`` (τ = 0.05, ``scale=20``, is the SimCSE default and inside the best range
                of the paper's ablation, Table 4: 0.05-0.07 on STS-B), ``directions`` and ``partition_mode`` (default:
                the paper's one-directional loss; ``directions=("query_to_doc", "doc_to_query"),
                partition_mode="per_direction"`` is the symmetric form, every direction with the same modulation:
                its positive ``s_p²`` and every other entry ``s (s + m)``), ``hardness_mode`` /
                ``hardness_strength`` (ST's penalty is added after the modulation), ``seed``, ``mask_duplicates``,
                ``margin``, ``margin_strategy``, ``contrast_anchors``, ``contrast_positives``,
                ``gather_across_devices``, ``mini_batch_size``, ``mini_batch_num_tokens``, ``show_progress_bar``.
                Here: a masked duplicate leaves the denominator, so it is not weighted up as the hardest negative;
                ``gather_across_devices`` gathers the anchors, positives and explicit negatives (every anchor's
                negatives are the global batch's); Focal-InfoNCE makes no random draws. ``similarity_fct`` must be
                ``cos_sim``: the modulation ``s_p²`` and ``s_n (s_n + m)`` is defined on cosines.

        References:
            - Hou & Li, "Improving Contrastive Learning of Sentence Embeddings with Focal-InfoNCE", Findings of EMNLP
              2023. https://aclanthology.org/2023.findings-emnlp.315
            - Code: https://github.com/puerrrr/Focal-InfoNCE

        Requirements:
            1. (anchor, positive) pairs; for unsupervised SimCSE the same sentence twice (dropout is the
               augmentation). Optionally explicit negatives in further columns, which get the same negative
               modulation ``s_n (s_n + m) / τ`` as the in-batch negatives.
            2. A batch of at least 2 pairs.

        Inputs:
            +-------------------------------------------------+--------+
            | Texts                                           | Labels |
            +=================================================+========+
            | (anchor, positive) pairs                        | none   |
            +-------------------------------------------------+--------+
            | (anchor, positive, negative_1, ..., negative_n) | none   |
            +-------------------------------------------------+--------+

        Recommendations:
            - Use ``BatchSamplers.NO_DUPLICATES``: a duplicate of the anchor in the batch is a false negative, and
              Focal-InfoNCE weights it up because it is the hardest one. ``mask_duplicates`` (default) removes exact
              duplicates; ``margin`` also removes near-duplicates and false mined negatives.

        Relations:
            - With ``m`` irrelevant and plain ``s / τ`` logits this is ST's ``MultipleNegativesRankingLoss`` (SimCSE).
            - ``MultipleNegativesRankingLoss(hardness_mode="in_batch_negatives" | "hard_negatives" | "all_negatives",
              hardness_strength=α)`` (Lan et al. 2025) is the closest built-in peer. It adds ``α · stop_grad(s_n)`` to
              the negative logits ``s_n / τ``: the hardness only re-weights each negative's softmax probability by
              ``exp(α s_n)``, its gradient per logit stays ``1 / τ``, and the positive logit is untouched. Focal-InfoNCE
              instead changes the logits themselves, with gradient: the negative logit ``(s_n² + m s_n) / τ`` has the
              slope ``(2 s_n + m) / τ`` (hard negatives are pushed harder, not only more often), the margin term
              ``m s_n / τ`` is in the same place as ``α s_n`` with ``α = m / τ`` but without stop-gradient, and the
              positive logit is modulated too (``s_p² / τ``). ``MultipleNegativesRankingLoss`` applies it to in-batch
              and/or explicit negatives selectively; Focal-InfoNCE to all negatives.
            - The same modulation is available inside the synthetic-negative losses through ``focal_m``:
              :class:`~st_hardneg.MixCSELoss` and :class:`~st_hardneg.HNCSELoss` (where it also applies to the
              synthetic negatives).

        Example:
            ::

                from datasets import Dataset
                from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
                from sentence_transformers.base.sampler import BatchSamplers
                from st_hardneg import FocalInfoNCELoss
                from st_hardneg.models import load_default_model

                model = load_default_model()  # all-MiniLM-L6-v2 with CLS pooling, max_seq_length 32
                sentences = ["A man is playing a guitar.", "A woman is slicing an onion.", "The sky is blue."]
                train_dataset = Dataset.from_dict({"anchor": sentences, "positive": sentences})
                loss = FocalInfoNCELoss(model, temperature=0.05, m=0.3)
                args = SentenceTransformerTrainingArguments(
                    output_dir="out", batch_sampler=BatchSamplers.NO_DUPLICATES, per_device_train_batch_size=64
                )
                trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train_dataset, loss=loss)
                trainer.train()
        """
        super().__init__(model, guide, **options)
        self.m = validation.check_number(m, "m (the Focal-InfoNCE margin)", minimum=0.0, maximum=1e6)
        self.check_options(self.options)

    def check_options(self, options: SharedOptions) -> None:
        """The shared options' rules, and the largest negative logit, ``(1 + m) / τ``: an overflow blames ``m``."""
        super().check_options(options)
        validation.check_focal_margin_range(self.m, "m (the Focal-InfoNCE margin)", options.temperature)

    def cosine_only_reason(self) -> str | None:
        return "the Focal-InfoNCE logits s_p² and s_n (s_n + m) are defined on cosines"

    @property
    def logit_margin(self) -> float | None:
        """Focal-InfoNCE (paper Eq. 2) is a logit rule, row i, with ``s_p = cos(h_i, h'_i)`` and ``s_n`` the other
        candidates::

            ℓ_i = -log  e^{s_p² / τ} / (e^{s_p² / τ} + Σ_n e^{s_n (s_n + m) / τ})

        Other ``directions`` get the same modulation (their positive ``s_p²``, every other entry ``s (s + m)``), and
        ``partition_mode`` combines them as in sentence-transformers' ``MultipleNegativesRankingLoss``; it adds no
        column (the template's InfoNCE with this rule)."""
        return self.m

    def paper_config(self) -> dict[str, Any]:
        return {"m": self.m}

    @property
    def citation(self) -> str:
        return """
@inproceedings{hou2023focalinfonce,
    title={Improving Contrastive Learning of Sentence Embeddings with Focal-{InfoNCE}},
    author={Hou, Pengyue and Li, Xingyu},
    booktitle={Findings of the Association for Computational Linguistics: EMNLP 2023},
    year={2023}
}
"""
