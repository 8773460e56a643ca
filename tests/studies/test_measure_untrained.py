"""The untrained model's studies (``benchmarks/studies/untrained_sts.json``, ``untrained_beir.json``): their committed
records imported as finished trials and their tables rendered from them byte for byte; the runner's commands that
replace the old subcommands; a BEIR smoke run (a tiny random model on a tiny BEIR folder) through the runner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("optuna")

REPO = Path(__file__).resolve().parents[2]
STUDIES = REPO / "benchmarks" / "studies"
RESULTS = REPO / "benchmarks" / "results"
SPECS = {"untrained_sts": "untrained_eval", "untrained_beir": "untrained_beir"}


def runner(*argv: str) -> int:
    from benchmarks.studies.__main__ import main

    return main(list(argv))


@pytest.mark.parametrize(("spec_name", "results"), list(SPECS.items()))
def test_the_committed_records_are_the_finished_trials_and_render_byte_for_byte(spec_name, results):
    from benchmarks.studies.render import import_study, render
    from st_hardneg.training.studies.engine import progress

    path = STUDIES / f"{spec_name}.json"
    spec, study = import_study(path)
    state = progress(study, [point.key for point in spec.points()])
    assert state.left == [] and state.failed == {}
    committed = json.loads((RESULTS / f"{results}.json").read_text())
    records = [t.user_attrs["record"] for t in study.get_trials()]
    if spec_name == "untrained_sts":
        assert list(state.done) == ["senteval/untrained/-"] and records == [committed]
    else:
        assert sorted(state.done) == ["nfcorpus/untrained/-", "scifact/untrained/-"]
        assert records == committed["rows"]
    md = RESULTS / f"{results}.md"
    assert render(path, spec, study) == {md: md.read_text()}


def copy_of(tmp_path: Path, spec_name: str, results: str, records: bool = True) -> Path:
    raw = json.loads((STUDIES / f"{spec_name}.json").read_text())
    raw["report"]["records"] = str(tmp_path / f"{results}.json")
    raw["report"]["outputs"] = [{**raw["report"]["outputs"][0], "file": str(tmp_path / f"{results}.md")}]
    if records:
        (tmp_path / f"{results}.json").write_text((RESULTS / f"{results}.json").read_text())
    path = tmp_path / f"{spec_name}.spec.json"
    path.write_text(json.dumps(raw))
    return path


def test_the_runner_prints_and_writes_the_committed_reports(tmp_path, capsys):
    """What ``untrained sts`` / ``--report`` did: the renderer prints the report and writes nothing; the runner
    writes it; bad arguments stop with a usage message."""
    from benchmarks.studies import render

    spec = copy_of(tmp_path, "untrained_sts", "untrained_eval")
    assert render.main([str(spec)]) == 0  # printed, nothing written
    assert capsys.readouterr().out == (RESULTS / "untrained_eval.md").read_text()
    assert not (tmp_path / "untrained_eval.md").exists()
    assert runner(str(spec), "-q") == 0
    assert (tmp_path / "untrained_eval.md").read_text() == (RESULTS / "untrained_eval.md").read_text()
    for argv in ([], [str(tmp_path / "nope.json")], ["--help"]):
        with pytest.raises(SystemExit):
            runner(*argv)


def test_a_beir_smoke_run_scores_the_model_by_both_paths(tmp_path, tiny_model_dir):
    from benchmarks import untrained
    from st_hardneg.testing.beir import make_tiny_beir
    from st_hardneg.training.studies.engine import provenance

    folder = make_tiny_beir(tmp_path / "tiny")
    spec = copy_of(tmp_path, "untrained_beir", "untrained_beir", records=False)
    raw = json.loads(spec.read_text())
    raw["datasets"] = {"tiny": {"folder": str(folder)}}
    raw["grid"] = [{"datasets": ["tiny"], "rows": ["untrained"], "seeds": [None]}]
    spec.write_text(json.dumps(raw))
    work = tmp_path / "work"
    assert runner(str(spec), "--run", "--work-dir", str(work), "--set", f"model={tiny_model_dir}", "-q") == 0
    data = json.loads((tmp_path / "untrained_beir.json").read_text())
    assert (data["threads"], list(data)) == (1, ["threads", "machine", "rows"])
    (row,) = data["rows"]
    test_qrels = [line.split("\t") for line in (folder / "qrels" / "test.tsv").read_text().splitlines()[1:] if line]
    corpus = [line for line in (folder / "corpus.jsonl").read_text().splitlines() if line]
    assert (row["data"], row["queries"], row["corpus"], row["grades"]) == (
        "tiny", len({q for q, _, _ in test_qrels}), len(corpus), [1])
    for metric in untrained.METRICS:  # two scorers, one number
        assert row["ours"][metric] == pytest.approx(row["mteb"][metric], abs=1e-6)
        assert row["ours_minus_mteb"][metric] == row["ours"][metric] - row["mteb"][metric]
    assert 0 < row["ours"]["recall@100"] <= 100 and row["published_ndcg@10"] is None
    assert row["ours_minus_published"] is None and row["model"] == str(tiny_model_dir)
    assert row["commit"] == provenance()["commit"]
    text = (tmp_path / "untrained_beir.md").read_text()
    assert text == untrained.beir_render(data) and "| tiny | 8 | 48 | 1 | mteb.evaluate |" in text
    assert sorted(p.name for p in work.iterdir()) == ["beir-embeddings", "study.db"]  # its cache in its folder


def test_a_missing_folder_or_test_split_is_refused_in_one_line(tmp_path, capsys):
    from st_hardneg.testing.beir import make_tiny_beir

    spec = copy_of(tmp_path, "untrained_beir", "untrained_beir", records=False)
    root = tmp_path / "data"
    (make_tiny_beir(root / "retrieval" / "nfcorpus") / "qrels" / "test.tsv").unlink()
    make_tiny_beir(root / "retrieval" / "scifact")
    for data_dir, message in ((tmp_path / "none", "dataset 'nfcorpus': no folder at"),
                              (root, "nfcorpus has no qrels/test.tsv, which the study scores")):
        with pytest.raises(SystemExit) as stop:
            runner(str(spec), "--run", "--data-dir", str(data_dir), "--work-dir", str(tmp_path / "work"))
        assert stop.value.code == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "untrained_beir.json").exists()
