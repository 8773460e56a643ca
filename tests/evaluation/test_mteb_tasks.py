"""MTEB wrapper on the real mteb package: local SentEval STS tasks vs evaluate_sts, offline errors, naming."""

from __future__ import annotations

import json
import random
import socket
from pathlib import Path

import numpy as np
import pytest
import torch

from st_hardneg.evaluation import (
    LOCAL_MTEB_TASKS,
    MTEBOfflineError,
    evaluate_sts,
    format_mteb_table,
    local_sts_task,
    run_mteb,
)

HANDMADE = [  # (score, sentence 1, sentence 2)
    (5.0, "a man plays the guitar .", "a man is playing a guitar ."),
    (4.2, "the dog runs in the park .", "a dog is running in a park ."),
    (0.4, "the sky is blue .", "she writes a letter ."),
    (3.6, "two children eat bread .", "children eat food ."),
    (1.0, "the cat eats food .", "a train at the station ."),
    (4.8, "snow is cold .", "the snow is cold ."),
    (2.5, "people walk to the station .", "people walk in the city ."),
    (0.0, "the house is red .", "one car drives on the road ."),
    (3.0, "rain in the city at night .", "it rains at night ."),
    (1.8, "a woman plays the piano .", "a man plays the guitar ."),
    (4.0, "the sun is hot .", "the sun is very hot today ."),
    (0.8, "three apples and water .", "the dog reads a book ."),
]


@pytest.fixture(scope="module")
def text_model_dir(tmp_path_factory) -> Path:
    """A tiny random BERT whose tokenizer knows the words of HANDMADE, so that different sentences get different
    embeddings (the STS equality tests need cosines free of artificial ties). conftest's tiny model passes
    ``vocab_file=`` to ``BertTokenizerFast``, which transformers 5 ignores: its tokenizer maps every word to [UNK]."""
    from st_hardneg.testing import make_text_model_dir

    texts = ["A man plays", *(f"{a} {b}" for _, a, b in HANDMADE)]
    return make_text_model_dir(tmp_path_factory.mktemp("tiny-text-bert"), texts)


@pytest.fixture
def text_model(text_model_dir):
    from st_hardneg.models import load_model

    return load_model(text_model_dir, pooling="mean", max_seq_length=32, device="cpu")


def write_stsb(root: Path, rows=HANDMADE, split: str = "test") -> Path:
    folder = root / "STS" / "STSBenchmark"
    folder.mkdir(parents=True, exist_ok=True)
    lines = [f"main-captions\tMSRvid\t2012test\t{i:04d}\t{score:.3f}\t{a}\t{b}" for i, (score, a, b) in enumerate(rows)]
    (folder / f"sts-{split}.csv").write_text("\n".join(lines) + "\n", encoding="utf8")
    return root


def test_local_task_is_an_mteb_sts_task(tmp_path):
    from mteb.abstasks.sts import AbsTaskSTS

    task = local_sts_task("STSBenchmark-local", write_stsb(tmp_path))
    assert isinstance(task, AbsTaskSTS)
    assert task.metadata.main_score == "cosine_spearman" and task.metadata.adapted_from == ["STSBenchmark",
                                                                                          "STSBenchmark.v2"]
    task.load_data()
    data = task.dataset["default"]["test"]
    assert data["sentence1"][0] == "a man plays the guitar ." and data["score"][:2] == [5.0, 4.2]
    task.unload_data()  # mteb drops instance metadata on unload; ours is class-level
    assert task.metadata.name == "STSBenchmark-local"
    with pytest.raises(ValueError, match="unknown local MTEB task"):
        local_sts_task("STS17-local", tmp_path)


def test_local_stsb_equals_evaluate_sts_on_handmade_data(tmp_path, text_model):
    root = write_stsb(tmp_path)
    reference = evaluate_sts(text_model, root, tasks=["STSBenchmark"], show_progress_bar=False)["STSBenchmark"]
    result = run_mteb(text_model, ["STSBenchmark-local"], data_dir=root, show_progress_bar=False)
    assert result["main_score"] == {"STSBenchmark-local": "cosine_spearman"}
    assert abs(result["scores"]["STSBenchmark-local"] - reference) < 1e-6
    assert abs(reference) > 1  # not a degenerate zero


def test_local_stsb_equals_evaluate_sts_on_the_real_test_set(shared_data, text_model):
    reference = evaluate_sts(text_model, shared_data, tasks=["STSBenchmark"], show_progress_bar=False)
    result = run_mteb(text_model, "STSBenchmark-local", data_dir=shared_data, show_progress_bar=False)
    assert abs(result["scores"]["STSBenchmark-local"] - reference["STSBenchmark"]) < 1e-6


def block_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("network access blocked by the test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_official_task_offline_mode_fails_fast_naming_local_equivalents(monkeypatch, tiny_model):
    block_network(monkeypatch)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    encoded = []
    monkeypatch.setattr(tiny_model, "encode", lambda *a, **k: encoded.append(a) or pytest.fail("encoded"))
    with pytest.raises(MTEBOfflineError) as err:
        run_mteb(tiny_model, ["STSBenchmark", "SICK-R", "STS12-local"], show_progress_bar=False)
    message = str(err.value)
    assert "STSBenchmark -> STSBenchmark-local" in message and "SICK-R -> SICK-R-local" in message
    assert "HF_HUB_OFFLINE" in message and not encoded


def test_official_task_download_failure_names_local_equivalents(monkeypatch, tiny_model):
    import huggingface_hub.constants
    import mteb.abstasks.abstask

    block_network(monkeypatch)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)

    def no_download(*args, **kwargs):  # what datasets raises after its retries when the Hub is unreachable
        raise ConnectionError("Couldn't reach 'mteb/stsbenchmark-sts' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(mteb.abstasks.abstask, "load_dataset", no_download)
    with pytest.raises(MTEBOfflineError, match="STSBenchmark -> STSBenchmark-local") as err:
        run_mteb(tiny_model, "STSBenchmark", show_progress_bar=False)
    assert isinstance(err.value.__cause__, ConnectionError) and "Couldn't reach" in str(err.value)


def test_unknown_task_names_list_the_local_tasks(tiny_model):
    with pytest.raises(ValueError, match="STSBenchmark-local") as err:
        run_mteb(tiny_model, ["STSBenchmrk"], show_progress_bar=False)
    assert "unknown MTEB task" in str(err.value)
    with pytest.raises(ValueError, match="no MTEB task"):
        run_mteb(tiny_model, " , ", show_progress_bar=False)


def test_no_stale_cache_results_named_and_rng_preserved(tmp_path, text_model):
    root = write_stsb(tmp_path / "data")
    out = tmp_path / "mteb"
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    before = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    first = run_mteb(text_model, "STSBenchmark-local", root, out, model_name="my-sts-model", show_progress_bar=False)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == before  # mteb's reseeding undone
    assert first["model"] == "local/my-sts-model" and first["revision"].startswith("weights-")
    files = list(out.glob("results/local__my-sts-model/*/STSBenchmark-local.json"))
    assert len(files) == 1 and files[0].parent.name == first["revision"]
    meta = json.loads((files[0].parent / "model_meta.json").read_text())
    assert meta["name"] == "local/my-sts-model"

    with torch.no_grad():  # a different checkpoint: new revision, fresh score (nothing served from a cache)
        for p in text_model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    second = run_mteb(text_model, "STSBenchmark-local", root, out, model_name="my-sts-model", show_progress_bar=False)
    reference = evaluate_sts(text_model, root, tasks=["STSBenchmark"], show_progress_bar=False)["STSBenchmark"]
    assert second["revision"] != first["revision"]
    assert abs(second["scores"]["STSBenchmark-local"] - reference) < 1e-6
    # same weights, same name, rerun into the same folder: overwritten with the fresh run, not read back
    third = run_mteb(text_model, "STSBenchmark-local", root, out, model_name="my-sts-model", show_progress_bar=False)
    assert third["scores"] == second["scores"]


def test_local_task_names_and_table():
    assert set(LOCAL_MTEB_TASKS.values()) >= {"STS12", "STS16", "STSBenchmark", "SICKRelatedness"}
    row = {"model": "local/x", "scores": {"STS12-local": 50.0, "STSBenchmark-local": 70.0}, "avg": 60.0}
    table = format_mteb_table({"x": row})
    assert table.splitlines()[0] == "| model | STS12-local | STSBenchmark-local | avg |"
    assert "| x | 50.00 | 70.00 | 60.00 |" in table


def test_missing_mteb_says_how_to_install(monkeypatch, tmp_path):
    """mteb is the optional [mteb] extra: without it, every entry point names the install command."""
    import sys

    from st_hardneg.evaluation import mteb_tasks

    monkeypatch.setitem(sys.modules, "mteb", None)  # makes `import mteb` raise ImportError
    expected = r"MTEB evaluation needs the optional 'mteb' package: pip install 'st-hardneg\[mteb\]'"
    with pytest.raises(ImportError, match=expected):
        mteb_tasks.require_mteb()
    with pytest.raises(ImportError, match=expected):
        run_mteb(object(), ["STSBenchmark-local"], data_dir=tmp_path)
    with pytest.raises(ImportError, match=expected):
        local_sts_task("STSBenchmark-local", tmp_path)
