"""st-hardneg eval reads its eval.json back as input: fields of the wrong type or paths out of the folder are one
line naming the file and the key; a result is reused only for the same weights, revision and data content; an
--overwrite of one task keeps the others."""

from __future__ import annotations

import csv
import json

import pytest

from st_hardneg.cli import app, evaluate
from st_hardneg.testing.beir import make_tiny_beir


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory, tiny_model_dir):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    transformer = Transformer(str(tiny_model_dir), max_seq_length=48)
    model = SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), "mean")],
                                device="cpu")
    path = tmp_path_factory.mktemp("saved") / "tiny-st"
    model.save(str(path))
    return path


def _argv(model, out, *folders, extra=()):
    data = [arg for folder in folders for arg in ("--data", str(folder))]
    return ["eval", "--model", str(model), "--tasks", "beir", *data, "--output-dir", str(out), "--quiet", *extra]


def _record(out):
    [path] = list(out.glob("st-hardneg/local__tiny-st/*/eval.json"))
    return path, json.loads(path.read_text())


def _one_line_exit_2(argv, capsys) -> str:
    capsys.readouterr()
    assert app.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize(("edit", "message"), [
    (lambda r: {**r, "files": ["per_query.tsv"]}, "'files' must be a mapping of file names, got list"),
    (lambda r: {**r, "seconds": "ten"}, "'seconds' must be a number of seconds >= 0, got 'ten'"),
    (lambda r: {**r, "files": {**r["files"], "per_query": "../../outside.tsv"}},
     "'files.per_query' must name a file in the record's own folder, got '../../outside.tsv'"),
    (lambda r: {**r, "files": {**r["files"], "runs": {"tiny-test": "/etc/passwd"}}},
     "'files.runs.tiny-test' must name a file in the record's own folder, got '/etc/passwd'"),
])
def test_an_eval_json_of_the_wrong_shape_is_one_line_naming_it_and_the_key(saved_model, tmp_path, capsys, edit,
                                                                           message):
    beir = make_tiny_beir(tmp_path / "tiny")
    other = make_tiny_beir(tmp_path / "other", seed=3)
    out = tmp_path / "results"
    assert app.main(_argv(saved_model, out, beir)) == 0
    path, record = _record(out)
    bad = edit(record)
    path.write_text(json.dumps(bad))
    err = _one_line_exit_2(_argv(saved_model, out, beir, other), capsys)
    assert f"{path}: {message}" in err and "pass --overwrite" in err
    assert json.loads(path.read_text()) == bad  # nothing written, nothing followed
    assert not (tmp_path / "outside.tsv").exists()
    assert app.main(_argv(saved_model, out, beir, other, extra=["--overwrite"])) == 0  # replaced when asked
    assert set(_record(out)[1]["beir"]) == {"tiny-test", "other-test"}


def test_a_record_at_a_known_place_is_checked_before_the_model_loads(saved_model, tmp_path, capsys, monkeypatch):
    beir = make_tiny_beir(tmp_path / "tiny")
    out = tmp_path / "results"
    folder = out / "st-hardneg" / "local__tiny-st" / "r1"
    folder.mkdir(parents=True)
    (folder / "eval.json").write_text(json.dumps({"files": {"per_query": "../x.tsv"}}))

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before eval.json was checked")

    monkeypatch.setattr(evaluate, "load_for_eval", refuse)
    err = _one_line_exit_2(_argv(saved_model, out, beir, extra=["--revision", "r1"]), capsys)
    assert f"{folder / 'eval.json'}: 'files.per_query' must name a file in the record's own folder" in err


def test_a_changed_beir_folder_is_not_answered_from_the_record(saved_model, tmp_path, capsys):
    from st_hardneg.data.beir import load_beir
    from st_hardneg.evaluation.retrieval import retrieve
    from st_hardneg.models import resolve_model

    beir = make_tiny_beir(tmp_path / "tiny")
    out = tmp_path / "results"
    assert app.main(_argv(saved_model, out, beir, extra=["--max-seq-length", "48"])) == 0
    path, before = _record(out)
    qrels = beir / "qrels" / "test.tsv"
    lines = qrels.read_text().splitlines()
    queries = dict.fromkeys(line.split("\t")[0] for line in lines[1:])
    qrels.write_text("\n".join([lines[0], *(f"{q}\t{1000 + (7 * int(q)) % 48}\t1" for q in queries)]) + "\n")
    err = _one_line_exit_2(_argv(saved_model, out, beir, extra=["--max-seq-length", "48"]), capsys)
    assert "beir tiny-test with other settings (data_digest" in err and "pass --overwrite" in err
    assert json.loads(path.read_text()) == before
    assert app.main(_argv(saved_model, out, beir, extra=["--max-seq-length", "48", "--overwrite"])) == 0
    after = json.loads(path.read_text())["beir"]["tiny-test"]["ndcg@10"]
    model = resolve_model(str(saved_model), saved="as_is", device="cpu")
    task = load_beir(beir).task("test")
    expected = retrieve(model, [task], max_seq_length=48)[task.name].scores["ndcg@10"]
    assert after == pytest.approx(expected, abs=1e-9) and abs(after - before["beir"]["tiny-test"]["ndcg@10"]) > 1.0


def test_another_revision_into_one_results_file_recomputes(saved_model, tmp_path, capsys):
    beir = make_tiny_beir(tmp_path / "tiny")
    out = tmp_path / "scores.json"
    assert app.main(_argv(saved_model, out, beir, extra=["--revision", "r1"])) == 0
    capsys.readouterr()
    assert app.main(_argv(saved_model, out, beir, extra=["--revision", "r2", "--overwrite"])) == 0
    printed = capsys.readouterr().out
    assert "already in" not in printed  # not reused from the r1 record
    record = json.loads(out.read_text())
    assert record["revision"] == "r2" and record["settings"]["beir"]["tiny-test"]["revision"] == "r2"


def test_overwrite_of_one_task_keeps_the_other_tasks_results_and_rows(saved_model, tmp_path, capsys):
    first, second = make_tiny_beir(tmp_path / "first"), make_tiny_beir(tmp_path / "second", seed=5)
    out = tmp_path / "results"
    assert app.main(_argv(saved_model, out, first, second)) == 0
    path, before = _record(out)
    assert app.main(_argv(saved_model, out, first, extra=["--overwrite"])) == 0
    after = json.loads(path.read_text())
    assert set(after["beir"]) == {"first-test", "second-test"}
    assert after["beir"]["second-test"] == before["beir"]["second-test"]
    assert after["settings"]["beir"]["second-test"] == before["settings"]["beir"]["second-test"]
    assert set(after["files"]["runs"]) == {"first-test", "second-test"}
    with (path.parent / after["files"]["per_query"]).open() as handle:
        tasks = [row["task"] for row in csv.DictReader(handle, delimiter="\t")]
    assert tasks.count("second-test") == before["beir"]["second-test"]["queries"]
    assert tasks.count("first-test") == before["beir"]["first-test"]["queries"]
    capsys.readouterr()
    assert app.main(_argv(saved_model, out, first, second)) == 0  # both reused now
    assert "already in" in capsys.readouterr().out
