"""``SentenceTransformerTrainer.hyperparameter_search`` (Optuna) tunes an st-hardneg loss's option, as the docs'
usage page shows: each trial trains a fresh model with a loss built for it, at the trial's ``lam``, and the best run
is the trial with the best objective."""

from __future__ import annotations

import pytest

optuna = pytest.importorskip("optuna")


def test_hyperparameter_search_tunes_mixcses_lam_over_two_trials(tiny_model_dir, tmp_path):
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator

    from st_hardneg import MixCSELoss
    from st_hardneg.models import load_model

    built: list[tuple[float, MixCSELoss]] = []  # (the trial's lam, the loss that trial trained with)
    objectives: list[float] = []

    class LossSearchTrainer(SentenceTransformerTrainer):
        """Builds the loss for each trial from the trial's loss options (the loss's options are read-only)."""

        def call_model_init(self, trial=None):
            if trial is not None:
                lam = trial.suggest_float("lam", 0.05, 0.5)

                def make_loss(model):
                    loss = MixCSELoss(model, lam=lam)
                    built.append((lam, loss))
                    return loss

                self.loss = make_loss  # sentence-transformers builds it on the trial's fresh model
            return super().call_model_init(trial)

    def model_init(trial=None):
        return load_model(tiny_model_dir, pooling="cls", max_seq_length=16, device="cpu")

    texts = [f"sentence {i} about thing {i % 5}" for i in range(32)]
    train = Dataset.from_dict({"anchor": texts, "positive": texts})
    dev = EmbeddingSimilarityEvaluator([f"sentence {i}" for i in range(6)], [f"thing {i % 3}" for i in range(6)],
                                       [0.1, 0.5, 0.9, 0.2, 0.4, 0.8], name="dev")
    args = SentenceTransformerTrainingArguments(str(tmp_path), per_device_train_batch_size=8, max_steps=2,
                                                report_to="none", save_strategy="no", disable_tqdm=True,
                                                dataloader_pin_memory=False)
    trainer = LossSearchTrainer(model_init=model_init, args=args, train_dataset=train, evaluator=dev,
                                loss=lambda model: MixCSELoss(model))

    def objective(metrics):
        objectives.append(metrics["eval_dev_spearman_cosine"])
        return objectives[-1]

    best = trainer.hyperparameter_search(
        hp_space=lambda trial: {"learning_rate": trial.suggest_float("learning_rate", 1e-5, 1e-4, log=True)},
        backend="optuna", n_trials=2, direction="maximize", compute_objective=objective,
        sampler=optuna.samplers.RandomSampler(seed=0))
    assert len(built) == 2 and len(objectives) == 2
    lams = [lam for lam, _ in built]
    assert lams[0] != lams[1] and all(0.05 <= lam <= 0.5 for lam in lams)
    for lam, loss in built:
        assert loss.lam == lam  # the loss each trial trained with has that trial's option
        assert loss.diagnostics  # and it ran: its last batch's cosines are recorded
    winner = max(range(2), key=lambda i: objectives[i])
    assert best.objective == objectives[winner] and best.hyperparameters["lam"] == lams[winner]
    assert set(best.hyperparameters) == {"lam", "learning_rate"}
