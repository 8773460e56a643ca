"""The benchmarks' one runner (``python -m benchmarks.studies``) and renderer (:mod:`benchmarks.studies.render`) on
the real engine: committed records imported as trials and never run again, the trials left run and written back,
a failed configuration kept as a failed trial, every table rendered from the records, bad input refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("optuna")


def spec_file(tmp_path: Path, **report) -> Path:
    spec = {"name": "bench", "protocol": {"steps": 3},
            "rows": {"good": {"loss": "mnrl"}, "bad": {"loss": "mnrl"}},
            "datasets": {"only": {}}, "grid": [{"datasets": ["only"], "rows": ["good", "bad"], "seeds": [0, 1]}],
            "choice": {"metric": "ndcg@10"}, "trial": "tests.studies.trials:failing_trial",
            "report": {"records": "results/bench.json", "point": {"row": "row"},
                       "outputs": [{"file": "results/bench.md", "renderer": "tests.studies.trials:table"},
                                   {"file": "results/bench.txt", "renderer": "tests.studies.trials:figure",
                                    "figure": True}], **report}}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(spec))
    return path


def runner(*argv: str) -> int:
    from benchmarks.studies.__main__ import main

    return main(list(argv))


def test_run_imports_committed_records_runs_the_rest_and_renders_from_the_trials(tmp_path, capsys):
    spec = spec_file(tmp_path)
    (tmp_path / "results").mkdir()
    committed = {"protocol": {"steps": 3}, "note": "kept", "runs": [
        {"row": "good", "seed": 0, "dev": {"ndcg@10": 99.0}}]}  # a committed record: not what fast_trial gives
    (tmp_path / "results" / "bench.json").write_text(json.dumps(committed))
    log = tmp_path / "log"
    assert runner(str(spec), "--run", "--work-dir", str(tmp_path / "work"), "--set", f"log={log}", "-q") == 0
    assert sorted(log.read_text().split()) == ["only/bad/0", "only/bad/1", "only/good/1"]  # not only/good/0
    data = json.loads((tmp_path / "results" / "bench.json").read_text())
    assert data["note"] == "kept" and data["protocol"] == {"steps": 3}
    assert data["runs"][0] == committed["runs"][0]  # the imported record first, as committed
    by = {(r["row"], r["seed"]): r for r in data["runs"]}
    assert set(by) == {("good", 0), ("good", 1), ("bad", 0), ("bad", 1)}
    assert by[("good", 1)]["dev"]["ndcg@10"] == 11.0 and by[("bad", 0)]["failed"] == "no usable row in this batch"
    table = (tmp_path / "results" / "bench.md").read_text().splitlines()
    assert table[0] == "good 0 99.0" and sorted(table[1:]) == ["bad 0 failed", "bad 1 failed", "good 1 11.0"]
    assert (tmp_path / "results" / "bench.txt").read_text() == "4 records\n"
    # again: nothing left (a failed configuration is a result, not run again), the same tables
    log.unlink()
    assert runner(str(spec), "--run", "--work-dir", str(tmp_path / "work"), "--set", f"log={log}", "--check") == 0
    assert not log.exists()
    assert "bench.md: identical" in capsys.readouterr().out
    # the committed records alone (a fresh in-memory storage) render the same table
    assert runner(str(spec), "--check") == 0


def test_a_record_file_layout_and_point_fields_of_its_own(tmp_path):
    """A file that keeps its seed at the top (a screen at one seed) and its rows under another key."""
    from benchmarks.studies.render import import_study, render

    spec = spec_file(tmp_path, read="tests.studies.test_benchmark_runner:read",
                     layout="tests.studies.test_benchmark_runner:layout")
    raw = json.loads(spec.read_text())
    raw["grid"] = [{"datasets": ["only"], "rows": ["good", "bad"], "seeds": [1]}]
    spec.write_text(json.dumps(raw))
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "bench.json").write_text(json.dumps({"seed": 1, "configs": [
        {"row": "good", "dev": {"ndcg@10": 5.0}}, {"row": "bad", "failed": "no usable row in this batch"}]}))
    loaded, study = import_study(spec)
    assert sorted(t.state.name for t in study.get_trials()) == ["COMPLETE", "FAIL"]
    assert render(spec, loaded, study)[tmp_path / "results" / "bench.md"] == "good 1 5.0\nbad 1 failed\n"


def read(data):
    return data["configs"], {"seed": data["seed"]}


def layout(records, meta):
    return {"seed": meta["seed"], "runs": records}


@pytest.mark.parametrize(("change", "message"), [
    ({"protocol": {"steps": 4}}, "made under another protocol than the spec's (changed: steps)"),
    ({"runs": [{"row": "nope", "seed": 0, "dev": {"ndcg@10": 1.0}}]}, "which is not a point of the study's grid"),
    ({"runs": [{"row": "good", "seed": 0}]}, "has no dev ndcg@10"),
])
def test_committed_records_that_do_not_fit_the_spec_are_refused_in_one_line(tmp_path, capsys, change, message):
    spec = spec_file(tmp_path)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "bench.json").write_text(json.dumps({"protocol": {"steps": 3}, "runs": [], **change}))
    with pytest.raises(SystemExit) as stop:
        runner(str(spec), "--check")
    assert stop.value.code == 2
    assert message in capsys.readouterr().err


def test_a_study_with_trials_left_is_not_rendered_and_bad_options_are_refused(tmp_path, capsys):
    spec = spec_file(tmp_path)
    for argv, message in (([str(spec)], "4 trial(s) of bench are left to run"),
                          ([str(spec), "--run", "--workers", "0"], "--workers"),
                          ([str(spec), "--run", "--set", "novalue"], "--set expects KEY=VALUE"),
                          ([str(spec), "--run", "--heartbeat", "0"], "heartbeat must be an integer >= 1"),
                          ([str(spec), "--storage", "nosuch://x"], "cannot be opened")):
        with pytest.raises(SystemExit) as stop:
            runner(*argv, "--work-dir", str(tmp_path / "work"))
        assert stop.value.code == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "results").exists()


def test_a_new_records_file_holds_the_specs_protocol_first(tmp_path):
    spec = spec_file(tmp_path)
    log = tmp_path / "log"
    assert runner(str(spec), "--run", "--work-dir", str(tmp_path / "work"), "--set", f"log={log}", "-q") == 0
    data = json.loads((tmp_path / "results" / "bench.json").read_text())
    assert list(data) == ["protocol", "runs"] and data["protocol"] == {"steps": 3} and len(data["runs"]) == 4
