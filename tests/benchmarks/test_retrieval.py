"""benchmarks.retrieval --task scifact / --task beir (handed to benchmarks.retrieval_scifact): smoke runs on a tiny
folder, resuming, the queue row's record; the selection table shared by the MRPC and SciFact tasks. The SciFact
report's numbers: tests/benchmarks/test_retrieval_scifact.py."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

from st_hardneg.testing.beir import make_tiny_beir

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
RESULTS = BENCHMARKS / "results"


def _load(name: str):
    return importlib.import_module(f"benchmarks.{name}")


def test_smoke_run_through_retrieval_py_resumes(tiny_model_dir, tmp_path, capsys):
    retrieval = _load("retrieval")
    folder = make_tiny_beir(tmp_path / "tiny", train_queries=48)
    out = tmp_path / "tiny.json"
    argv = ["--task", "beir", "--data", str(folder), "--model", str(tiny_model_dir), "--max-steps", "1",
            "--batch-size", "4", "--seeds", "0", "--methods", "mnrl", "focal", "--out", str(out), "--cache-dir",
            str(tmp_path / "cache"), "--work-dir", str(tmp_path / "work"), "--relative-margin", "none", "--quiet"]
    assert retrieval.main(argv) == 0
    data = json.loads(out.read_text())
    runs = {r["method"]: r for r in data["runs"]}
    assert set(runs) == {"mnrl", "focal"} and data["task"] == "tiny"
    for run in runs.values():
        assert run["steps"] == 1 and run["batch_size"] == 4
        assert 0 <= run["test"]["ndcg@10"] <= 100 and run["dev"]["queries"] == data["split"]["dev_queries"]
    assert data["protocol"]["mining_override"] == {"relative_margin": None}
    capsys.readouterr()
    assert retrieval.main(argv) == 0  # resumed: nothing run again
    assert "skip mnrl seed 0" in capsys.readouterr().out
    assert json.loads(out.read_text())["runs"] == data["runs"]
    text = out.with_suffix(".md").read_text()
    assert f"| mnrl | {runs['mnrl']['test']['ndcg@10']:.2f} |" in text


def test_smoke_queue_row_reads_the_queue(tiny_model_dir, tmp_path):
    """A 3-step focal_queue run with warm-up 1 records its queue: the last batch read the 2 earlier steps' candidate
    rows (positive + mined negative per query) and the queue holds all 3 steps'."""
    retrieval = _load("retrieval")
    folder = make_tiny_beir(tmp_path / "tiny", train_queries=48)
    out = tmp_path / "tiny.json"
    argv = ["--task", "beir", "--data", str(folder), "--model", str(tiny_model_dir), "--max-steps", "3",
            "--batch-size", "4", "--seeds", "0", "--methods", "focal_queue", "--out", str(out), "--cache-dir",
            str(tmp_path / "cache"), "--work-dir", str(tmp_path / "work"), "--relative-margin", "none", "--quiet"]
    assert retrieval.main(argv) == 0
    (run,) = json.loads(out.read_text())["runs"]
    assert run["method"] == "focal_queue" and run["steps"] == 3 and run["loss_config"]["queue_size"] == 192
    assert run["queue"]["queue_filled"] == 3 * 2 * 4 and run["queue"]["queue_rows_read"] == 2 * 2 * 4


def test_one_selection_table_for_both_tasks_from_the_methods_table():
    """MRPC and SciFact screen the same configurations on their dev tasks: one SELECTION, built from
    benchmarks.methods, whose families and options are the table's."""
    bench = _load("retrieval")
    scifact = _load("retrieval_scifact")
    from benchmarks import methods

    assert list(bench.SELECTION) == list(methods.SELECTION)
    for label, (family, loss, options) in bench.SELECTION.items():
        row = methods.METHODS[label]
        assert (family, loss, options) == (row.family, row.loss, dict(row.options))
    assert scifact.SCIFACT_METHODS == methods.table(methods.SCIFACT) and scifact.SELECTION == bench.SELECTION
    assert scifact.BEIR_BUILTIN == ("mnrl", "mnrl_hardness", "cached_mnrl_4x", "gist")
    assert bench.BUILTIN == ("mnrl", "mnrl_hardness", "gist") and bench.OPTIONAL_BUILTIN == ("cached_mnrl",)
