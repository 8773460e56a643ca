"""``st_hardneg.models``' saving: a model with SimCSE's train-only head saves as the inference model by default (it
loads with plain sentence-transformers in a process where st_hardneg cannot be imported), keeps the head on request
and in the Trainer's checkpoints."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from st_hardneg.models import load_checkpoint, load_model, save_inference_model
from st_hardneg.testing.blocked import BlockedLoad, load_without_st_hardneg


def _types(path) -> list[str]:
    return [m["type"].rsplit(".", 1)[-1] for m in json.loads((path / "modules.json").read_text())]


def _blocked(path) -> BlockedLoad:
    return load_without_st_hardneg(path, "the cat eats food.")


def test_every_save_writes_the_inference_model_unless_asked(tiny_model_dir, tmp_path):
    model = load_model(tiny_model_dir, mlp_head=True, device="cpu")
    with torch.no_grad():
        model[-1].linear.weight.mul_(3.0)  # the head changes train-mode outputs, not eval-mode ones
    model.save(str(tmp_path / "save"))
    model.save_pretrained(str(tmp_path / "save_pretrained"))
    save_inference_model(model, tmp_path / "inference")
    model.save(str(tmp_path / "kept"), keep_train_only_modules=True)
    for name in ("save", "save_pretrained", "inference"):
        assert _types(tmp_path / name) == ["Transformer", "Pooling"], name
    assert _types(tmp_path / "kept") == ["Transformer", "Pooling", "TrainOnlyDense"]
    assert _types(tmp_path / "kept") == [type(m).__name__ for m in model]  # the model itself keeps its head

    expected = model.encode(["the cat eats food."], convert_to_tensor=True)[0]
    blocked = _blocked(tmp_path / "save")
    assert blocked.returncode == 0, blocked.stderr
    vector, facts = blocked.read()
    assert facts == {"modules": ["Transformer", "Pooling"], "loaded": False, "blocked": True}  # never loaded, and could not be
    assert torch.allclose(torch.tensor(vector), expected, atol=1e-5)
    # the folder with the head does not load with plain sentence-transformers
    refused = _blocked(tmp_path / "kept")
    assert refused.returncode != 0 and "st_hardneg.models.TrainOnlyDense" in refused.stderr
    reloaded = load_checkpoint(tmp_path / "kept")
    assert [type(m).__name__ for m in reloaded][-1] == "TrainOnlyDense"
    reloaded.save(str(tmp_path / "resaved"))  # a reloaded checkpoint saves without its head too
    assert _types(tmp_path / "resaved") == ["Transformer", "Pooling"]


def test_a_copy_saves_itself(tiny_model_dir, tmp_path):
    model = load_model(tiny_model_dir, mlp_head=True, device="cpu")
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin[0].auto_model.embeddings.word_embeddings.weight.add_(1.0)
    twin.save(str(tmp_path / "twin"))
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "twin" / "model.safetensors"))
    key = next(k for k in saved if k.endswith("word_embeddings.weight"))
    assert torch.equal(saved[key], twin[0].auto_model.embeddings.word_embeddings.weight)
    assert not torch.equal(saved[key], model[0].auto_model.embeddings.word_embeddings.weight)


@pytest.mark.parametrize("keep", [False, True])
def test_trainer_checkpoints_keep_the_head_and_the_final_save_drops_it(tiny_model_dir, tiny_sentences, tmp_path,
                                                                        keep):
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments

    from st_hardneg.data.senteval import pair_dataset
    from st_hardneg.training.registry import build_loss

    model = load_model(tiny_model_dir, mlp_head=True, device="cpu")
    args = SentenceTransformerTrainingArguments(output_dir=str(tmp_path / "ckpt"), per_device_train_batch_size=8,
                                                max_steps=2, save_strategy="steps", save_steps=1, report_to=[],
                                                disable_tqdm=True, use_cpu=True, dataloader_pin_memory=False)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=pair_dataset(tiny_sentences),
                                         loss=build_loss("focal", model))
    trainer.train()
    assert _types(tmp_path / "ckpt" / "checkpoint-2") == ["Transformer", "Pooling", "TrainOnlyDense"]
    trainer.save_model(str(tmp_path / "final"))
    assert _types(tmp_path / "final") == ["Transformer", "Pooling"]
    if keep:  # resuming from a checkpoint with the head works (its weights load back strictly)
        resumed = SentenceTransformerTrainer(model=model, args=args, train_dataset=pair_dataset(tiny_sentences),
                                             loss=build_loss("focal", model))
        resumed.train(resume_from_checkpoint=str(tmp_path / "ckpt" / "checkpoint-1"))
        assert resumed.state.global_step == 2


# --------------------------------------------------------------------------- no code from a model folder runs
def _saved(tiny_model_dir, tmp_path):
    model = load_model(tiny_model_dir, pooling="mean", max_seq_length=16, device="cpu")
    model.save(str(tmp_path / "saved"))
    return tmp_path / "saved"


def test_a_model_folder_that_needs_custom_code_is_refused(tiny_model_dir, tmp_path, monkeypatch):
    folder = _saved(tiny_model_dir, tmp_path)
    modules = json.loads((folder / "modules.json").read_text())
    modules[1]["type"] = "my_package.CustomPooling"
    (folder / "modules.json").write_text(json.dumps(modules))
    imported = []
    monkeypatch.setattr("importlib.import_module", lambda name, *a: imported.append(name))  # nothing may import it
    with pytest.raises(ValueError, match=r"'my_package.CustomPooling', custom code outside sentence-transformers: "
                                         r"st-hardneg never runs code from a model folder"):
        load_checkpoint(folder)
    assert imported == []


@pytest.mark.parametrize("content, reason", [("{not json", "Expecting property name"), ("{}", "not a non-empty list"),
                                             ('[{"path": ""}]', "no 'type'")])
def test_a_damaged_modules_json_is_named(tiny_model_dir, tmp_path, content, reason):
    folder = _saved(tiny_model_dir, tmp_path)
    (folder / "modules.json").write_text(content)
    with pytest.raises(ValueError, match=rf"modules.json is damaged \({reason}.*save the model again"):
        load_checkpoint(folder)


def test_the_cache_key_of_a_model_follows_its_content_not_its_path(tiny_model_dir, tmp_path):
    """New weights saved at the same path get a new key (so new mined negatives); the same files elsewhere share the
    folder's content digest."""
    import shutil

    from st_hardneg.models import model_cache_key

    folder = tmp_path / "m"
    shutil.copytree(tiny_model_dir, folder)
    first = model_cache_key(folder)
    assert first.startswith("m@") and model_cache_key(folder) == first
    weights = next(p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # one byte of the weights changes
    weights.write_bytes(bytes(data))
    assert model_cache_key(folder) != first
    assert model_cache_key(None) == model_cache_key("default") == "default"
    assert model_cache_key("org/hub-name") == "org/hub-name"


def test_each_encoding_names_its_progress_bar(tiny_model, capsys):
    """The bars of mining, corpus, dev and test encodings say what they encode, not "Batches:"."""
    from st_hardneg.evaluation.encoding import encode_unique
    from st_hardneg.models import named_progress

    encode_unique(tiny_model, ["a b", "c d"], show_progress_bar=True, role="document", check=False)
    encode_unique(tiny_model, ["a b"], show_progress_bar=True, check=False, desc="scifact-dev: encoding 1 queries")
    err = capsys.readouterr().err
    assert "encoding 2 documents" in err and "scifact-dev: encoding 1 queries" in err and "Batches" not in err
    with named_progress("mining: encoding"):
        pass
    tiny_model.encode(["x"], show_progress_bar=True)  # restored after the block: sentence-transformers' own label
    assert "Batches" in capsys.readouterr().err


def test_no_named_bar_while_the_libraries_bars_are_off(tiny_model, capsys):
    """``-q`` turns transformers' bars off; a named bar (mining's, whose encode always asks for one) follows it."""
    from transformers.utils import logging as hf_logging

    from st_hardneg.models import named_progress

    hf_logging.disable_progress_bar()
    try:
        with named_progress("mining: encoding"):
            tiny_model.encode(["a b", "c d"], show_progress_bar=True)
    finally:
        hf_logging.enable_progress_bar()
    assert "mining: encoding" not in capsys.readouterr().err
    with named_progress("mining: encoding"):
        tiny_model.encode(["a b", "c d"], show_progress_bar=True)
    assert "mining: encoding" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["truncated weights", "no 1_Pooling"])
def test_a_damaged_model_folder_is_named(tiny_model_dir, tmp_path, damage):
    import shutil

    from st_hardneg.models import BrokenModelError

    folder = _saved(tiny_model_dir, tmp_path)
    if damage == "truncated weights":
        weights = folder / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:100])
    else:
        shutil.rmtree(folder / "1_Pooling")
    with pytest.raises(BrokenModelError, match=rf"{folder} is a damaged model folder: "):
        load_checkpoint(folder)


def test_model_meta_records_what_mteb_asks_of_a_saved_model(tiny_model, tmp_path, caplog):
    from st_hardneg.models import MODEL_META_FILE, count_parameters, mteb_model_name, read_model_meta, write_model_meta

    folder = tmp_path / "final"
    folder.mkdir()
    assert read_model_meta(folder) is None
    write_model_meta(folder, tiny_model, name="mixcse-run", adapted_from="bert-base-uncased",
                     training_datasets=["wiki1m"], st_hardneg={"version": "x"})
    meta = read_model_meta(folder)
    expected = sum(p.numel() for p in {id(p): p for p in tiny_model.parameters()}.values())
    assert meta is not None and meta["n_parameters"] == count_parameters(tiny_model) == expected > 0
    assert meta["name"] == "local/mixcse-run" and meta["adapted_from"] == "bert-base-uncased"
    assert meta["training_datasets"] == ["wiki1m"] and meta["embed_dim"] == 32 and meta["max_tokens"] == 32
    assert meta["st_hardneg"] == {"version": "x"}
    assert mteb_model_name("me/x") == "me/x"
    (folder / MODEL_META_FILE).write_text("{oops")
    assert read_model_meta(folder) is None  # damaged: a warning in the log, no name taken from it
    assert f"{folder / MODEL_META_FILE} is damaged" in caplog.text
