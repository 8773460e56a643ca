"""st-hardneg eval: the model as published, its module stack, the files beside the results, mteb's names."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from st_hardneg.cli import app, evaluate
from st_hardneg.testing.beir import make_tiny_beir


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory, tiny_model_dir):
    """A saved SentenceTransformer (tiny BERT, mean pooling, Normalize): what eval must load as it is."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling

    transformer = Transformer(str(tiny_model_dir), max_seq_length=48)
    model = SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), "mean"),
                                         Normalize()], device="cpu")
    path = tmp_path_factory.mktemp("saved") / "tiny-st"
    model.save(str(path))
    return path


def test_eval_loads_a_saved_model_as_published_and_writes_runs_beside_the_results(saved_model, tmp_path, capsys):
    beir = make_tiny_beir(tmp_path / "tiny")
    out = tmp_path / "results"
    argv = ["eval", "--model", str(saved_model), "--tasks", "beir", "--data", str(beir), "--output-dir", str(out),
            "--max-seq-length", "48", "--quiet"]
    assert app.main(argv) == 0
    printed = capsys.readouterr().out
    assert "model: local/tiny-st (weights-" in printed
    assert "Transformer(BertModel, 48 tokens) -> Pooling(mean) -> Normalize" in printed
    [results_file] = list(out.glob("st-hardneg/local__tiny-st/weights-*/eval.json"))
    results = json.loads(results_file.read_text())
    assert results["modules"].endswith("Pooling(mean) -> Normalize")
    per_query = results_file.parent / results["files"]["per_query"]
    with per_query.open() as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    assert {r["task"] for r in rows} == {"tiny-test"} and len(rows) == results["beir"]["tiny-test"]["queries"]
    assert np.mean([float(r["ndcg@10"]) for r in rows]) == pytest.approx(results["beir"]["tiny-test"]["ndcg@10"])
    run = (results_file.parent / results["files"]["runs"]["tiny-test"]).read_text().splitlines()
    assert len(run) == len(rows) * min(100, results["beir"]["tiny-test"]["corpus"])
    # nothing overwritten without --overwrite: the same request computes nothing (mteb's habit) and leaves the file
    # as it was; a request that would replace a result (another length) is refused; with --overwrite, the same scores
    saved = results_file.read_bytes()
    assert app.main(argv) == 0
    printed = capsys.readouterr().out
    assert "already in" in printed and "beir tiny-test" in printed and "nothing to compute" in printed
    assert f"{results['beir']['tiny-test']['ndcg@10']:.2f}" in printed  # the stored scores' table
    assert results_file.read_bytes() == saved
    assert app.main([*argv[:-3], "--max-seq-length", "32", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "eval.json exists" in err and "pass --overwrite" in err and "max_seq_length 48, now 32" in err
    assert results_file.read_bytes() == saved
    assert app.main([*argv, "--overwrite"]) == 0
    assert json.loads(results_file.read_text())["beir"] == results["beir"]


def test_eval_into_an_existing_folder_computes_only_what_is_missing(saved_model, tmp_path, capsys, monkeypatch):
    first, second = make_tiny_beir(tmp_path / "tiny"), make_tiny_beir(tmp_path / "other", seed=1)
    out = tmp_path / "results"
    common = ["eval", "--model", str(saved_model), "--tasks", "beir", "--output-dir", str(out), "--quiet"]
    assert app.main([*common, "--data", str(first)]) == 0
    [results_file] = list(out.glob("st-hardneg/local__tiny-st/weights-*/eval.json"))
    alone = json.loads(results_file.read_text())
    folder = results_file.parent
    first_rows = (folder / "per_query.tsv").read_text().splitlines()
    first_run = (folder / "tiny-test.trec").read_bytes()
    capsys.readouterr()
    calls: list[list[str]] = []
    from st_hardneg.evaluation import retrieval

    original = retrieval.retrieve

    def recording(model, tasks, **kwargs):
        calls.append([task.name for task in tasks])
        return original(model, tasks, **kwargs)

    monkeypatch.setattr(retrieval, "retrieve", recording)
    assert app.main([*common, "--data", str(first), "--data", str(second)]) == 0
    printed = capsys.readouterr().out
    assert calls == [["other-test"]]  # the first folder is not encoded again
    assert "already in" in printed and "beir tiny-test" in printed
    assert "### tiny-test" in printed and "### other-test" in printed  # both tables, the reused one too
    both = json.loads(results_file.read_text())
    assert both["beir"]["tiny-test"] == alone["beir"]["tiny-test"] and set(both["beir"]) == {"tiny-test", "other-test"}
    assert set(both["settings"]["beir"]) == {"tiny-test", "other-test"}
    assert both["files"]["runs"] == {"tiny-test": "tiny-test.trec", "other-test": "other-test.trec"}
    assert (folder / "tiny-test.trec").read_bytes() == first_run
    rows = (folder / "per_query.tsv").read_text().splitlines()
    assert rows[: len(first_rows)] == first_rows  # the first task's rows kept, byte for byte
    assert {line.split("\t")[0] for line in rows[1:]} == {"tiny-test", "other-test"}
    assert len(rows) - 1 == both["beir"]["tiny-test"]["queries"] + both["beir"]["other-test"]["queries"]


def test_eval_refuses_an_older_eval_json_without_settings(saved_model, tmp_path, capsys):
    beir = make_tiny_beir(tmp_path / "tiny")
    out = tmp_path / "results"
    argv = ["eval", "--model", str(saved_model), "--tasks", "beir", "--data", str(beir), "--output-dir", str(out),
            "--quiet"]
    assert app.main(argv) == 0
    [results_file] = list(out.glob("st-hardneg/local__tiny-st/weights-*/eval.json"))
    old = json.loads(results_file.read_text())
    del old["settings"]  # as written before the settings were recorded
    results_file.write_text(json.dumps(old))
    capsys.readouterr()
    assert app.main(argv) == 2
    err = capsys.readouterr().err
    assert "beir tiny-test without its settings" in err and "pass --overwrite" in err
    assert json.loads(results_file.read_text()) == old
    results_file.write_text("{not json")
    assert app.main(argv) == 2
    assert "cannot be read as an eval.json" in capsys.readouterr().err


def test_pooling_flag_builds_a_fresh_pooling_and_says_so(saved_model, tmp_path, capsys):
    beir = make_tiny_beir(tmp_path / "tiny")
    out = tmp_path / "scores.json"
    assert app.main(["eval", "--model", str(saved_model), "--pooling", "cls", "--tasks", "beir", "--data", str(beir),
                     "--output", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "Pooling(cls)" in printed and "Normalize" not in printed.splitlines()[0]
    assert "[fresh cls pooling, --pooling]" in printed
    assert (tmp_path / "scores.per_query.tsv").is_file() and (tmp_path / "scores.tiny-test.trec").is_file()


def test_an_output_folder_that_cannot_be_written_fails_before_the_model_loads(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(evaluate, "load_for_eval", lambda *a: pytest.fail("model loaded"))
    (tmp_path / "file").write_text("x")
    assert app.main(["eval", "--output-folder", str(tmp_path / "file" / "results")]) == 2
    assert "--output-folder" in capsys.readouterr().err


def test_a_prompt_name_the_model_does_not_define_exits_2(saved_model, tmp_path, capsys):
    beir = make_tiny_beir(tmp_path / "tiny")
    assert app.main(["eval", "--model", str(saved_model), "--tasks", "beir", "--data", str(beir),
                     "--query-prompt-name", "search_query", "--output-dir", str(tmp_path / "r"), "--quiet"]) == 2
    assert "query_prompt_name 'search_query' is not a prompt of the model" in capsys.readouterr().err


@pytest.mark.integration
def test_embedded_model_through_eval_equals_sentence_transformers_own(shared_data, tmp_path, capsys):
    """`st-hardneg eval` with no --model scores all-MiniLM-L6-v2 as published: STS-B equals a plain
    SentenceTransformer(folder) within 0.01 (82.03; the old CLS rebuild gave 73.50)."""
    from scipy.stats import spearmanr
    from sentence_transformers import SentenceTransformer

    from st_hardneg.models import default_model_path

    out = tmp_path / "results"
    assert app.main(["eval", "--tasks", "mteb", "--mteb-tasks", "STSBenchmark-local", "--data-dir",
                     str(shared_data / "senteval"), "--output-dir", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "sentence-transformers/all-MiniLM-L6-v2" in printed and "Pooling(mean) -> Normalize" in printed
    [results_file] = list(out.glob("st-hardneg/sentence-transformers__all-MiniLM-L6-v2/weights-*/eval.json"))
    ours = json.loads(results_file.read_text())["mteb"]["scores"]["STSBenchmark-local"]
    assert list(out.glob("results/sentence-transformers__all-MiniLM-L6-v2/weights-*/STSBenchmark-local.json"))
    rows = [line.split("\t") for line in (shared_data / "senteval" / "STS" / "STSBenchmark" / "sts-test.csv")
            .read_text(encoding="utf8").splitlines() if line.strip()]
    model = SentenceTransformer(str(default_model_path()), device="cpu")
    a = model.encode([r[5] for r in rows], normalize_embeddings=True)
    b = model.encode([r[6] for r in rows], normalize_embeddings=True)
    expected = 100 * spearmanr((a * b).sum(1), [float(r[4]) for r in rows]).statistic
    assert ours == pytest.approx(expected, abs=0.01)
    assert ours == pytest.approx(82.03, abs=0.05)


# --------------------------------------------------------------------------- nothing written outside the output folder
@pytest.mark.parametrize("extra, fragment", [
    (["--revision", "../../x"], "--revision '../../x' must be a plain name"),
    (["--revision", "/tmp/abs"], "--revision '/tmp/abs' must be a plain name"),
    (["--model-name", "../escape"], "--model-name '..' must be a plain name"),
], ids=["revision-up", "revision-absolute", "model-name-up"])
def test_a_name_that_would_leave_the_output_folder_is_refused(saved_model, tmp_path, capsys, extra, fragment):
    beir = make_tiny_beir(tmp_path / "tiny")
    out = tmp_path / "deep" / "results"
    argv = ["eval", "--model", str(saved_model), "--tasks", "beir", "--data", str(beir), "--output-dir", str(out),
            "--quiet", *extra]
    assert app.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and len(err.splitlines()) == 1
    # nothing at all was written, inside or outside
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny"]


def test_output_json_never_overwrites_its_side_files_without_overwrite(saved_model, tmp_path, capsys):
    beir = make_tiny_beir(tmp_path / "tiny")
    (tmp_path / "r.per_query.tsv").write_text("the user's own file")
    argv = ["eval", "--model", str(saved_model), "--tasks", "beir", "--data", str(beir), "--output",
            str(tmp_path / "r.json"), "--quiet"]
    assert app.main(argv) == 2
    assert "r.per_query.tsv exist(s); pass --overwrite" in capsys.readouterr().err
    assert (tmp_path / "r.per_query.tsv").read_text() == "the user's own file" and not (tmp_path / "r.json").exists()
    assert app.main([*argv, "--overwrite"]) == 0
    assert (tmp_path / "r.per_query.tsv").read_text().startswith("task\t")


@pytest.mark.parametrize("recorded", ["/etc/passwd", "../elsewhere.tsv", "sub/dir.tsv", ".."])
def test_compare_reads_only_a_per_query_file_beside_the_results(tmp_path, recorded):
    from st_hardneg.evaluation.compare import _load
    from st_hardneg.evaluation.runs import RunFormatError

    results = tmp_path / "eval.json"
    results.write_text(json.dumps({"files": {"per_query": recorded}}))
    with pytest.raises(RunFormatError, match=r"files.per_query must name a file beside it"):
        _load(results)


# --------------------------------------------------------------------------- one pooling rule per model
def test_a_bare_encoder_gets_one_pooling_in_every_task_and_says_why(tiny_model_dir, tmp_path, capsys):
    """Without modules.json: mean pooling (what SentenceTransformer(path) gives) whatever the tasks, so the same
    weights score the same; a 1_Pooling config it cannot use is named."""
    import shutil

    beir = make_tiny_beir(tmp_path / "tiny")
    bare = tmp_path / "bare"
    shutil.copytree(tiny_model_dir, bare)
    (bare / "1_Pooling").mkdir()
    (bare / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "cls"}))
    out = tmp_path / "r.json"
    argv = ["eval", "--model", str(bare), "--tasks", "beir", "--data", str(beir), "--output", str(out), "--quiet"]
    assert app.main(argv) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "-> Pooling(mean)" in first
    assert ("[no modules.json: Pooling(mean), as SentenceTransformer(path) gives it; its 1_Pooling/config.json (cls) "
            "is not used without modules.json: pass --pooling cls]") in first
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(bare), device="cpu")  # what a user gets from the folder
    assert reference[1].get_config_dict()["pooling_mode"] == "mean"
    # one loader for every task group (load_for_eval takes no groups): the same mean pooling under beir, mteb, sts
    model = evaluate.load_for_eval(str(bare), None)
    assert model[1].get_config_dict()["pooling_mode"] == "mean"
