"""SimCSE's train-only MLP head (``load_model(..., mlp_head=True)``): active in training, the identity at test time,
left out of the saved model, kept in (and reloaded from) the Trainer's checkpoints."""

from __future__ import annotations

import json

import pytest
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.evaluation.evaluator import BaseEvaluator

from st_hardneg import cli, models
from st_hardneg.cli.evaluate import load_for_eval
from st_hardneg.models import TrainOnlyDense, load_checkpoint, load_model, save_inference_model

SENTENCES = ["a man plays the guitar.", "the dog runs in the park.", "the sky is blue.", "she writes a letter."]


@pytest.fixture
def mlp_model(tiny_model_dir):
    torch.manual_seed(0)
    return load_model(tiny_model_dir, pooling="cls", max_seq_length=32, device="cpu", mlp_head=True)


def _forward(model, sentences, seed=0):
    features = model.preprocess(sentences)
    torch.manual_seed(seed)  # same dropout masks for every call with the same seed
    return model(features)["sentence_embedding"]


def test_mlp_head_is_appended_with_simcse_init(mlp_model, tiny_model):
    assert len(mlp_model) == 3 and isinstance(mlp_model[2], TrainOnlyDense)
    head = mlp_model[2]
    assert head.in_features == head.out_features == 32
    assert isinstance(head.activation_function, torch.nn.Tanh)
    # BERT's initializer_range (0.02), zero bias: SimCSE's MLPLayer initialised by BertPreTrainedModel._init_weights
    assert head.linear.weight.std().item() == pytest.approx(0.02, rel=0.25)
    assert torch.count_nonzero(head.linear.bias) == 0
    assert mlp_model.get_embedding_dimension() == tiny_model.get_embedding_dimension()
    assert len(tiny_model) == 2  # the option is off by default
    with pytest.raises(ValueError, match="already has"):
        models.add_mlp_head(mlp_model)


def test_head_active_in_train_mode(mlp_model, tiny_model):
    mlp_model.train()
    tiny_model.train()
    with torch.no_grad():
        out = _forward(mlp_model, SENTENCES)
        pooled = _forward(tiny_model, SENTENCES)  # same encoder weights, same dropout masks
        head = mlp_model[2]
        expected = torch.tanh(pooled @ head.linear.weight.T + head.linear.bias)
    assert torch.allclose(out, expected, atol=1e-6)
    assert not torch.allclose(out, pooled, atol=1e-3)


def test_head_is_identity_in_eval_mode(mlp_model, tiny_model):
    mlp_model.eval()
    tiny_model.eval()
    with torch.no_grad():
        assert torch.equal(_forward(mlp_model, SENTENCES), _forward(tiny_model, SENTENCES))
    # encode() switches to eval mode itself: the head never reaches an embedding used for evaluation
    mlp_model.train()
    assert torch.allclose(mlp_model.encode(SENTENCES, convert_to_tensor=True),
                          tiny_model.encode(SENTENCES, convert_to_tensor=True), atol=1e-6)


def test_gradients_reach_the_head_in_training(mlp_model):
    mlp_model.train()
    _forward(mlp_model, SENTENCES).pow(2).sum().backward()
    assert mlp_model[2].linear.weight.grad is not None and mlp_model[2].linear.weight.grad.abs().sum() > 0


def test_stripped_saved_model_loads_with_plain_sentence_transformer(mlp_model, tmp_path):
    mlp_model[2].linear.weight.data.normal_()  # a "trained" head: must not matter at test time
    expected = mlp_model.encode(SENTENCES, convert_to_tensor=True)
    path = save_inference_model(mlp_model, tmp_path / "final")
    assert len(mlp_model) == 3 and isinstance(mlp_model[2], TrainOnlyDense)  # the model itself keeps its head
    types = [m["type"] for m in json.loads((path / "modules.json").read_text())]
    assert all(t.startswith("sentence_transformers.") for t in types) and len(types) == 2
    reloaded = SentenceTransformer(str(path), device="cpu")  # no trust_remote_code, no st_hardneg class needed
    assert [type(m).__name__ for m in reloaded] == ["Transformer", "Pooling"]
    assert torch.allclose(reloaded.encode(SENTENCES, convert_to_tensor=True), expected, atol=1e-6)


def test_strip_in_place(mlp_model):
    expected = mlp_model.encode(SENTENCES, convert_to_tensor=True)
    removed = models.strip_train_only_modules(mlp_model)
    assert len(removed) == 1 and isinstance(removed[0], TrainOnlyDense) and len(mlp_model) == 2
    assert models.train_only_module_names(mlp_model) == []
    assert torch.allclose(mlp_model.encode(SENTENCES, convert_to_tensor=True), expected, atol=1e-6)


def test_full_save_keeps_the_head_and_reloads(mlp_model, tmp_path):
    mlp_model[2].linear.weight.data.normal_()
    # what the Trainer writes at every checkpoint (a plain model.save writes the inference model: tests/test_models.py)
    mlp_model.save(str(tmp_path / "checkpoint"), keep_train_only_modules=True)
    reloaded = load_checkpoint(tmp_path / "checkpoint", device="cpu")
    assert isinstance(reloaded[2], TrainOnlyDense)
    assert torch.equal(reloaded[2].linear.weight, mlp_model[2].linear.weight)
    with pytest.raises(ValueError, match="trust_remote_code"):  # why load_checkpoint exists
        SentenceTransformer(str(tmp_path / "checkpoint"), device="cpu")
    with pytest.raises(FileNotFoundError, match="modules.json"):
        load_checkpoint(tmp_path / "nothing-here")
    # `st-hardneg eval --model CHECKPOINT` loads it as well
    assert isinstance(load_for_eval(str(tmp_path / "checkpoint"), None)[2], TrainOnlyDense)


class _FirstIsBest(BaseEvaluator):
    """Scores that decrease with every call, so the first checkpoint is the best one."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.primary_metric = "spearman"
        self.greater_is_better = True

    def __call__(self, model, output_path=None, epoch=-1, steps=-1):
        self.calls += 1
        return {"sts-dev_spearman": 100.0 - self.calls}


def test_trainer_reloads_best_checkpoint_with_head(mlp_model, tiny_sentences, tmp_path):
    """load_best_model_at_end must bring back the head of the best checkpoint, not fail silently (the Trainer
    only logs an error when a checkpoint cannot be loaded)."""
    from st_hardneg.data import pair_dataset
    from st_hardneg.training import TrainConfig, build_loss, train

    loss = build_loss("mixcse", mlp_model)
    config = TrainConfig(output_dir=str(tmp_path / "ckpt"), batch_size=8, learning_rate=1e-2, max_steps=3,
                         eval_steps=1, logging_steps=1, show_progress_bar=False)
    result = train(mlp_model, pair_dataset(tiny_sentences), loss, config, evaluator=_FirstIsBest())
    assert result.steps == 3 and result.best_checkpoint.endswith("checkpoint-1")
    best = load_checkpoint(result.best_checkpoint, device="cpu")
    assert isinstance(best[2], TrainOnlyDense)
    for (name, p_model), (_, p_best) in zip(mlp_model.state_dict().items(), best.state_dict().items(), strict=True):
        assert torch.equal(p_model, p_best), name  # the model in memory is checkpoint-1, head included


@pytest.mark.integration
def test_cli_train_with_mlp_head(tiny_model_dir, tiny_sentences, shared_data, tmp_path, capsys, monkeypatch):
    from st_hardneg import evaluation

    # the 7-task table is not what this test is about: score STS-B test only
    full = evaluation.evaluate_sts
    monkeypatch.setattr(evaluation, "evaluate_sts",
                        lambda model, data_dir, **kw: full(model, data_dir, **{**kw, "tasks": ["STSBenchmark"]}))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(tiny_sentences * 2) + "\n")
    out = tmp_path / "run"
    code = cli.main(["train", "--loss", "mnrl", "--mlp-head", "--model", str(tiny_model_dir), "--corpus", str(corpus),
                     "--data-dir", str(shared_data), "--batch-size", "8", "--eval-steps", "1", "--max-steps", "2",
                     "--output-dir", str(out), "--quiet"])
    assert code == 0, capsys.readouterr().err
    results = json.loads((out / "results.json").read_text())
    assert results["mlp_head"] is True and results["steps"] == 2
    types = [m["type"] for m in json.loads((out / "final" / "modules.json").read_text())]
    assert not any("TrainOnlyDense" in t for t in types)
    assert SentenceTransformer(str(out / "final"), device="cpu").encode(["a dog."]).shape == (1, 32)
