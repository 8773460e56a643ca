"""Models checked where they enter (check_model_source, used by train and eval): saved lengths, tokenizer and
weight files, a file given as --model, Router models at train; and one pooling rule for a bare encoder in the
library and the command line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from st_hardneg.cli import app, evaluate
from st_hardneg.models import check_model_source, resolve_model
from st_hardneg.testing import make_tiny_model_dir

TEXTS = ["a man plays the guitar .", "the dog runs in the park .", "one red car drives on the road ."]


@pytest.fixture(scope="module")
def saved_dir(tmp_path_factory, ) -> Path:
    """A saved SentenceTransformer (tiny BERT, 48 tokens, mean pooling) with its encoder at the top of the folder."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    root = tmp_path_factory.mktemp("sources")
    transformer = Transformer(str(make_tiny_model_dir(root / "bert")), max_seq_length=48)
    model = SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), "mean")],
                                device="cpu")
    model.save(str(root / "saved"))
    return root / "saved"


@pytest.fixture(scope="module")
def router_dir(tmp_path_factory) -> Path:
    """A saved ``Router.for_query_document`` model of two tiny BERTs."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Router, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    root = tmp_path_factory.mktemp("router")

    def tower(path: Path) -> list:
        transformer = Transformer(str(path), max_seq_length=32)
        return [transformer, Pooling(transformer.get_embedding_dimension(), "cls")]

    router = Router.for_query_document(tower(make_tiny_model_dir(root / "q", seed=0)),
                                       tower(make_tiny_model_dir(root / "d", seed=1)))
    SentenceTransformer(modules=[router], device="cpu").save(str(root / "model"))
    return root / "model"


def _copy(folder: Path, tmp_path: Path) -> Path:
    target = tmp_path / folder.name
    shutil.copytree(folder, target)
    return target


def _set_length(folder: Path, value) -> None:
    config = folder / "sentence_bert_config.json"
    saved = json.loads(config.read_text())
    saved["max_seq_length"] = value
    config.write_text(json.dumps(saved))


@pytest.fixture
def no_model_load(monkeypatch):
    """Any model load fails the test: the checks must answer before it."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(evaluate, "load_for_eval", refuse)
    import st_hardneg.models as models

    monkeypatch.setattr(models, "training_model", refuse)


def _one_line_exit_2(argv: list[str], capsys) -> str:
    assert app.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize(("value", "shown"), [(0, "0"), (-4, "-4"), ("64", "'64'"), (4096, "4096"), (True, "True")])
def test_a_saved_length_outside_one_to_the_position_embeddings_is_refused(saved_dir, tmp_path, value, shown):
    folder = _copy(saved_dir, tmp_path)
    _set_length(folder, value)
    with pytest.raises(ValueError, match=rf"--model {folder}: the saved max_seq_length {shown} in "
                                         rf".*sentence_bert_config\.json must be a whole number of tokens from 1 to "
                                         r"128 \(its max_position_embeddings\)"):
        check_model_source(str(folder))
    _set_length(folder, 128)  # the limit itself is a valid length
    assert check_model_source(str(folder)).saved


def test_missing_tokenizer_or_weights_and_truncated_weights_are_named(saved_dir, tmp_path):
    folder = _copy(saved_dir, tmp_path)
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) - 100])
    with pytest.raises(ValueError, match=r"model\.safetensors cannot be read \(.*incomplete metadata.*\): the file "
                                         "is damaged or truncated"):
        check_model_source(folder)
    weights.unlink()
    with pytest.raises(ValueError, match=r"no weights in .* \(none of model\.safetensors"):
        check_model_source(folder)
    weights.write_bytes(data)
    for name in ("tokenizer.json", "vocab.txt"):
        (folder / name).unlink(missing_ok=True)
    with pytest.raises(ValueError, match=r"no tokenizer files in .* \(none of tokenizer\.json, vocab\.txt"):
        check_model_source(folder)


def test_a_file_or_a_folder_that_is_no_model_is_refused(saved_dir, tmp_path):
    with pytest.raises(ValueError, match=r"--model .*model\.safetensors is a file, not a model: give the model's "
                                         "folder"):
        check_model_source(saved_dir / "model.safetensors")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="is not a model folder"):
        check_model_source(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        check_model_source(tmp_path / "missing")
    assert check_model_source(None).folder is None and check_model_source("org/not-cached-here").folder is None
    bare = make_tiny_model_dir(tmp_path / "bare")
    assert (check_model_source(bare).saved, check_model_source(saved_dir).saved) == (False, True)


def test_a_router_model_is_checked_tower_by_tower(router_dir, tmp_path):
    assert check_model_source(router_dir).router
    folder = _copy(router_dir, tmp_path)
    tower = next(p for p in folder.iterdir() if p.name.startswith("query") and p.name.endswith("Transformer"))
    _set_length(tower, 0)
    with pytest.raises(ValueError, match=rf"--model {folder} \({tower}\): the saved max_seq_length 0"):
        check_model_source(folder)


@pytest.mark.parametrize("command", ["eval", "train"])
def test_the_command_line_refuses_a_bad_model_folder_before_it_loads(saved_dir, tmp_path, capsys, no_model_load,
                                                                     command):
    folder = _copy(saved_dir, tmp_path)
    for name in ("tokenizer.json", "vocab.txt"):
        (folder / name).unlink(missing_ok=True)  # once reported as "the model produced the same embedding for all texts"
    extra = ["--output-dir", str(tmp_path / "out")]
    err = _one_line_exit_2([command, "--model", str(folder), *extra], capsys)
    assert f"--model {folder}: no tokenizer files in {folder}" in err
    err = _one_line_exit_2([command, "--model", str(saved_dir / "config.json"), *extra], capsys)
    assert "config.json is a file, not a model" in err
    shutil.copy(saved_dir / "tokenizer.json", folder)
    _set_length(folder, -1)
    err = _one_line_exit_2([command, "--model", str(folder), *extra], capsys)
    assert "the saved max_seq_length -1" in err


def test_eval_refuses_a_model_name_with_dot_dot_before_the_model_loads(saved_dir, tmp_path, capsys, no_model_load):
    for option, value in (("--model-name", ".."), ("--model-name", "org/.."), ("--revision", "..")):
        err = _one_line_exit_2(["eval", "--model", str(saved_dir), option, value, "--output-dir",
                                str(tmp_path / "out")], capsys)
        assert option in err


def test_a_bare_encoder_pools_by_mean_at_its_own_length_in_the_library_and_the_command_line(tmp_path):
    from sentence_transformers import SentenceTransformer

    bare = make_tiny_model_dir(tmp_path / "bare")
    reference = SentenceTransformer(str(bare), device="cpu")  # what sentence-transformers builds for it
    library = resolve_model(bare, saved="as_is", device="cpu")
    command_line = evaluate.load_for_eval(str(bare), None)
    assert reference[1].get_config_dict()["pooling_mode"] == "mean"
    for model in (library, command_line):
        assert model[1].get_config_dict()["pooling_mode"] == "mean"
        assert model.max_seq_length == reference.max_seq_length == 128
    long_text = " ".join(["the dog runs in the park"] * 12)  # past 32 tokens: the old library rule cut it there
    texts = [*TEXTS, long_text]
    expected = reference.encode(texts, convert_to_tensor=True)
    torch.testing.assert_close(library.encode(texts, convert_to_tensor=True), expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(command_line.encode(texts, convert_to_tensor=True), expected, rtol=0, atol=1e-6)
    from st_hardneg.models import BARE_ENCODER_POOLING

    assert evaluate.BARE_ENCODER_POOLING == BARE_ENCODER_POOLING == "mean"  # one rule, stated in both places
    rebuilt = resolve_model(bare, device="cpu")  # "rebuild": the training defaults, CLS at 32 tokens
    assert rebuilt[1].get_config_dict()["pooling_mode"] == "cls" and rebuilt.max_seq_length == 32


# --------------------------------------------------------------------------- Router models at train
def _rows(tmp_path: Path) -> Path:
    adjectives, nouns = ("red", "blue", "green", "old", "new", "big"), ("cat", "dog", "car", "house", "tree", "boat")
    rows = [{"anchor": f"my {a} {n} .", "positive": f"your {a} {n} today ."} for a in adjectives for n in nouns]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_a_router_model_without_its_routes_or_with_pooling_is_refused_before_it_loads(router_dir, tmp_path, capsys,
                                                                                       no_model_load):
    rows = _rows(tmp_path)
    base = ["train", "--model", str(router_dir), "--output-dir", str(tmp_path / "out")]
    err = _one_line_exit_2([*base, "--task", "retrieval", "--train-file", str(rows)], capsys)
    assert "is a Router model (query / document towers) and --training-arg router_mapping is missing" in err
    assert '\'router_mapping={"anchor": "query", "positive": "document"}\'' in err
    mapping = ["--training-arg", 'router_mapping={"anchor": "query", "positive": "document"}']
    err = _one_line_exit_2([*base, "--task", "retrieval", "--train-file", str(rows), "--pooling", "mean", *mapping],
                           capsys)
    assert "--pooling mean:" in err and "is a Router model" in err and "drop --pooling" in err
    err = _one_line_exit_2([*base, "--task", "sts"], capsys)
    assert 'router_mapping={"anchor": "query", "positive": "document"}' in err
    for task in (["--task", "beir", "--data", str(tmp_path)], ["--task", "retrieval"]):
        err = _one_line_exit_2([*base, *task, *mapping], capsys)
        assert "is a Router model" in err and "--train-file FILE" in err
    err = _one_line_exit_2(["eval", "--model", str(router_dir), "--pooling", "cls", "--output-dir",
                            str(tmp_path / "eval")], capsys)
    assert "--pooling cls:" in err and "is a Router model" in err


@pytest.mark.parametrize("loss", ["mixcse", "focal", "hncse", "adcse"])
def test_a_router_model_with_its_routes_trains_with_every_loss(router_dir, tmp_path, capsys, loss, shared_data):
    from sentence_transformers import SentenceTransformer

    before = SentenceTransformer(str(router_dir), device="cpu")
    argv = ["train", "--task", "retrieval", "--train-file", str(_rows(tmp_path)), "--model", str(router_dir),
            "--data-dir", str(shared_data),
            "--loss", loss, "--no-sts", "--max-steps", "2", "--batch-size", "8", "--lr", "1e-3",
            "--output-dir", str(tmp_path / "out"), "-q",
            "--training-arg", 'router_mapping={"anchor": "query", "positive": "document"}']
    assert app.main(argv) == 0, capsys.readouterr().err
    trained = SentenceTransformer(str(tmp_path / "out" / "final"), device="cpu")
    changed = {"query": 0.0, "document": 0.0}
    old = dict(before.named_parameters())
    for name, parameter in trained.named_parameters():
        tower = "query" if ".query." in name or name.startswith("0.query") else "document"
        changed[tower] = max(changed[tower], float((parameter.detach() - old[name].detach()).abs().max()))
    assert changed["query"] > 0 and changed["document"] > 0  # both towers trained, each on its own column
