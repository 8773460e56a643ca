"""``st-hardneg train --model <a saved SentenceTransformer>`` trains the model as published: its modules (pooling
mode, Normalize), ``max_seq_length``, prompts and similarity come back in ``final/``; ``--pooling`` /
``--max-seq-length`` change it on purpose, in one printed line; the papers' STS protocol is a named preset of the
embedded encoder only."""

from __future__ import annotations

import json

import pytest

from st_hardneg import cli

PROMPTS = {"query": "query: ", "document": "passage: "}


@pytest.fixture
def published(tiny_model_dir, tmp_path):
    """A team's published model: Transformer -> Pooling(mean) -> Normalize, 48 tokens, query/document prompts."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling

    transformer = Transformer(str(tiny_model_dir), max_seq_length=48)
    model = SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), "mean"),
                                         Normalize()], prompts=dict(PROMPTS), similarity_fn_name="dot", device="cpu")
    model.save(str(tmp_path / "published"))
    return tmp_path / "published"


def _train(published, tmp_path, *extra):
    from st_hardneg.testing.beir import make_tiny_beir

    folder = make_tiny_beir(tmp_path / "beir")
    return ["train", "--task", "beir", "--data", str(folder), "--model", str(published), "--loss", "mnrl",
            "--max-steps", "2", "--batch-size", "4", "--cache-dir", str(tmp_path / "cache"),
            "--mining-arg", "relative_margin=None",
            "--output-dir", str(tmp_path / "out"), *extra]


def _stack(folder):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    modules = [type(module).__name__ for module in model]
    return model, modules


def test_a_saved_model_comes_back_with_its_modules_length_and_prompts(published, tmp_path, capsys):
    assert cli.main(_train(published, tmp_path)) == 0
    printed = capsys.readouterr().out
    # nothing changed, nothing announced: the one "model:" line is where it was saved
    assert [line for line in printed.splitlines() if line.startswith("model: ")] == [
        f"model: {tmp_path / 'out' / 'final'}"]
    trained, modules = _stack(tmp_path / "out" / "final")
    assert modules == ["Transformer", "Pooling", "Normalize"]
    assert trained[1].get_config_dict()["pooling_mode"] == "mean"
    assert trained.max_seq_length == 48 and trained.prompts == PROMPTS
    assert trained.similarity_fn_name == "dot"
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["model_changes"] == [] and results["steps"] == 2
    # trained: the weights moved
    import torch

    untrained, _ = _stack(published)
    assert not torch.equal(untrained[0].auto_model.embeddings.word_embeddings.weight,
                           trained[0].auto_model.embeddings.word_embeddings.weight)


def test_pooling_and_length_given_on_purpose_change_it_and_say_so(published, tmp_path, capsys):
    assert cli.main(_train(published, tmp_path, "--pooling", "cls", "--max-seq-length", "40")) == 0
    printed = capsys.readouterr().out
    assert "model: --pooling cls: Pooling(mean) -> Pooling(cls)\n" in printed
    assert "model: --max-seq-length 40: 48 -> 40 tokens\n" in printed
    trained, modules = _stack(tmp_path / "out" / "final")
    assert modules == ["Transformer", "Pooling", "Normalize"] and trained.prompts == PROMPTS
    assert trained[1].get_config_dict()["pooling_mode"] == "cls" and trained.max_seq_length == 40


def test_the_sts_preset_is_named_and_the_saved_model_keeps_the_encoders_length(tiny_model_dir, monkeypatch):
    """The preset of ``--task sts`` on the embedded encoder: CLS, no Normalize, 32 training tokens, printed; saved
    with the encoder's own length, at which every evaluation scores it."""
    from st_hardneg import models

    monkeypatch.setattr(models, "default_model_path", lambda verify=True: tiny_model_dir)
    built = models.training_model(None, preset=models.STS_PRESET)
    assert [type(m).__name__ for m in built.model] == ["Transformer", "Pooling"]
    assert built.model[1].get_config_dict()["pooling_mode"] == "cls"
    assert built.train_length == built.model.max_seq_length == 32
    own = models.load_model(tiny_model_dir, max_seq_length=None).max_seq_length
    assert built.saved_length == own and built.for_saving().max_seq_length == own
    assert built.changes[0].startswith("preset papers-sts: all-MiniLM-L6-v2's encoder with Pooling(cls), no Normalize, "
                                       f"trained at 32 tokens, saved with {own}")
    assert "preset papers-sts" in built.model.model_card_data.model_name
    # a model a user gives is never changed by the preset
    given = models.training_model(tiny_model_dir, preset=models.STS_PRESET, bare_pooling="cls", train_length=32)
    assert given.changes[0].startswith(f"{tiny_model_dir} is an encoder without modules.json: Pooling(cls), 32 tokens")


def test_a_bad_pooling_for_a_model_without_pooling_is_named(tiny_model_dir, tmp_path):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Transformer

    from st_hardneg.models import training_model

    SentenceTransformer(modules=[Transformer(str(tiny_model_dir))], device="cpu").save(str(tmp_path / "bare"))
    with pytest.raises(ValueError, match="--pooling cls: .* has no Pooling module to change"):
        training_model(tmp_path / "bare", pooling="cls")
    with pytest.raises(ValueError, match="pooling must be one of"):
        training_model(tmp_path / "bare", pooling="first")
    with pytest.raises(ValueError, match="max_seq_length must be a positive integer"):
        training_model(tmp_path / "bare", max_seq_length=0)


def test_a_beir_run_writes_its_per_query_file_and_run_and_compare_takes_run_folders(published, tmp_path, capsys):
    import csv

    assert cli.main(_train(published, tmp_path)) == 0
    assert cli.main(_train(published, tmp_path)[:-2] + ["--output-dir", str(tmp_path / "s1"), "--seed", "1"]) == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    test = results["test"]
    assert results["files"] == {"per_query": "per_query.tsv", "runs": {"beir-test": "beir-test.trec"}}
    with (tmp_path / "out" / "per_query.tsv").open() as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    assert len(rows) == test["queries"]
    assert sum(float(r["ndcg@10"]) for r in rows) / len(rows) == pytest.approx(test["ndcg@10"], abs=1e-9)
    run = (tmp_path / "out" / "beir-test.trec").read_text().splitlines()
    assert run and run[0].split()[-1] == "st-hardneg-mnrl"
    capsys.readouterr()
    assert cli.main(["compare", f"A={tmp_path / 'out'}", f"B={tmp_path / 's1'}"]) == 0
    assert f"| beir-test | B | A | {test['queries']} |" in capsys.readouterr().out
