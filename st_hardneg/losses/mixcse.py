from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor

from st_hardneg import functional as fn
from st_hardneg.losses.base import Batch, HardNegativeLoss, check_focal_m

Layout = Literal["paper", "official"]


class MixCSELoss(HardNegativeLoss):
    def __init__(
        self,
        model,
        lam: float = 0.2,
        temperature: float = 0.05,
        symmetric: bool = True,
        stop_gradient: bool = True,
        partner: fn.PartnerMode = "shift",
        layout: Layout = "paper",
        focal_m: float | None = None,
        seed: int | None = None,
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
            lam: λ, the weight of the positive in the mix, in [0, 1]. The paper uses 0.2 and warns that a large λ
                can turn the "negative" into a second positive.
            temperature: τ > 0 (paper: 0.05, i.e. ``scale=20`` in ST terms).
            symmetric: also treat ``h'_i`` as an anchor, with candidates ``h_1..h_N`` and mixed negative
                ``normalize(λ·h_i + (1-λ)·h_π(i))``; the loss is the mean of both directions (the paper's full model).
                ``False`` is the paper's MixCSE_single ablation. Explicit negatives are candidates of the
                anchor → positive direction only (as in ST's ``MultipleNegativesRankingLoss`` ``doc_to_query``).
            stop_gradient: detach the mixed negatives (paper). ``False`` is the "w/o sg" ablation.
            partner: how ``π(i)`` is chosen: ``"shift"`` (``i+1 mod N``, the authors' code), ``"random"`` (a random
                derangement per batch) or ``"hardest"`` (the in-batch negative most similar to the anchor).
            layout: ``"paper"`` (the equation above, one mixed negative per anchor) or ``"official"``, the loss as the
                released code (BDBC-KG-NLP/MixCSE_AAAI2022) computes it, for reproducing the published numbers: a
                single N×3N cross-entropy over ``[cos(h_a, h'_b) | cos(h_a, mix_b) | cos(mix'_a, h'_b)] / τ`` with
                ``mix_b = λh'_b + (1-λ)h'_π(b)`` and ``mix'_a = λh_a + (1-λ)h_π(a)``, where the entries in which the
                anchor's own sample enters a mix at weight 1-λ (``π(b) = a`` in block 2, ``b = π(a)`` in block 3)
                are set to logit 0 rather than removed. Every anchor therefore sees all N mixes as negatives
                (not only its own), and block 3 compares a *mixed anchor* with the positives. ``symmetric=False``
                drops block 3. Needs a permutation partner (``"shift"`` or ``"random"``).
            focal_m: if set, apply the Focal-InfoNCE modulation (positive ``s²/τ``, negatives ``s(s+m)/τ``, also to the
                mixed negatives) with margin ``m``; ``None`` (default) = the paper's plain InfoNCE. Combining hardness
                weighting with synthetic hard negatives is an st-hardneg extension.
            seed: seed of the generator used by ``partner="random"``; ``None`` uses torch's global generator
                (seeded by the Trainer's ``seed``).

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
              itself, and with ``partner="hardest"`` it would even be chosen as the mixing partner. Unsupervised
              corpora such as wiki1m contain duplicate lines.

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
        super().__init__(model, temperature)
        try:
            lam = float(lam)
        except (TypeError, ValueError):
            raise ValueError(f"lam must be a number in [0, 1], got {lam!r}") from None
        if not 0.0 <= lam <= 1.0:
            raise ValueError(f"lam (λ, the weight of the positive in the mix) must be in [0, 1], got {lam}")
        if partner not in ("shift", "random", "hardest"):
            raise ValueError(f"partner must be 'shift', 'random' or 'hardest', got {partner!r}")
        if layout not in ("paper", "official"):
            raise ValueError(f"layout must be 'paper' or 'official', got {layout!r}")
        if layout == "official" and partner == "hardest":
            raise ValueError(
                "layout='official' needs the mixing partners to form a permutation (partner='shift' or 'random'); "
                "partner='hardest' can pick the same partner for several anchors."
            )
        self.lam = lam
        self.symmetric = bool(symmetric)
        self.stop_gradient = bool(stop_gradient)
        self.partner = partner
        self.layout = layout
        self.focal_m = check_focal_m(focal_m)
        self.seed = seed
        self._generator: torch.Generator | None = None

    # ------------------------------------------------------------------ helpers
    def _partners(self, n: int, similarity: Tensor | None, shared: Tensor | None = None) -> Tensor:
        if self.partner == "hardest":
            return fn.partner_indices(n, "hardest", similarity=similarity)
        if shared is not None:
            return shared
        generator = None
        if self.partner == "random" and self.seed is not None:
            device = similarity.device if similarity is not None else "cpu"
            if self._generator is None or self._generator.device != torch.device(device):
                self._generator = torch.Generator(device=device).manual_seed(self.seed)
            generator = self._generator
        device = similarity.device if similarity is not None else None
        return fn.partner_indices(n, self.partner, generator=generator, device=device)

    def _mix(self, source: Tensor, partners: Tensor) -> Tensor:
        mixed = fn.mix(source, source[partners], self.lam)
        return mixed.detach() if self.stop_gradient else mixed

    def _direction(self, anchors: Tensor, candidates: Tensor, mixed: Tensor) -> tuple[Tensor, Tensor]:
        cos = fn.candidate_cosines(anchors, candidates, mixed.unsqueeze(1))
        return fn.info_nce(fn.contrastive_logits(cos, self.temperature, self.focal_m)), cos

    # ------------------------------------------------------------------ loss
    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        batch = self.split_batch(embeddings)
        if self.layout == "official":
            return self._official(batch)
        return self._paper(batch)

    def _paper(self, batch: Batch) -> Tensor:
        h, h_pos, n = batch.anchors, batch.positives, batch.size
        forward_sim = h @ h_pos.T
        partners = self._partners(n, forward_sim.detach())
        loss, cos = self._direction(h, batch.candidates, self._mix(h_pos, partners))
        self.record_stats(cos, num_in_batch=n, num_synthetic=1)
        if not self.symmetric:
            return loss
        # h'_i as the anchor: candidates h_1..h_N, mixed negative normalize(λ h_i + (1-λ) h_π(i)).
        reverse_partners = self._partners(n, forward_sim.T.detach(), shared=partners)
        reverse_loss, _ = self._direction(h_pos, h, self._mix(h, reverse_partners))
        return (loss + reverse_loss) / 2

    def _official(self, batch: Batch) -> Tensor:
        z1, z2, n = batch.anchors, batch.positives, batch.size
        partners = self._partners(n, None)
        rows = torch.arange(n, device=z1.device)
        # Block 1 (+ explicit negatives): the SimCSE logits.
        blocks = [z1 @ batch.candidates.T]
        # Block 2: anchor a vs every mix_b = λ z2_b + (1-λ) z2_π(b); mix_b contains a's own positive when π(b) = a.
        block2 = z1 @ self._mix(z2, partners).T
        blocks.append(block2)
        inverse = torch.empty_like(partners)
        inverse[partners] = rows
        zeroed = [(rows, n + batch.negatives.size(0) + inverse)]
        if self.symmetric:
            # Block 3: mixed anchor mix'_a = λ z1_a + (1-λ) z1_π(a) vs every positive z2_b; zero b = π(a).
            blocks.append(self._mix(z1, partners) @ z2.T)
            zeroed.append((rows, n + batch.negatives.size(0) + n + partners))
        cos = torch.cat(blocks, dim=1)
        logits = fn.contrastive_logits(cos, self.temperature, self.focal_m)
        keep = torch.ones_like(logits, dtype=torch.bool)
        for r, c in zeroed:
            keep[r, c] = False
        logits = logits.masked_fill(~keep, 0.0)
        num_shared = n + batch.negatives.size(0)
        own_mix = block2[rows, rows].unsqueeze(1)
        self.record_stats(torch.cat([cos[:, :num_shared], own_mix], dim=1), num_in_batch=n, num_synthetic=1)
        return fn.info_nce(logits)

    def get_config_dict(self) -> dict[str, Any]:
        return {
            "lam": self.lam,
            "temperature": self.temperature,
            "symmetric": self.symmetric,
            "stop_gradient": self.stop_gradient,
            "partner": self.partner,
            "layout": self.layout,
            "focal_m": self.focal_m,
            "seed": self.seed,
        }

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
