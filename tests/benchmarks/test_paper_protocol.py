"""benchmarks.paper_protocol: its study's dry run on the CPU (through the one runner, ``python -m benchmarks.studies``),
the specs' rows and protocols, and the papers' table layouts."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STUDIES = REPO / "benchmarks" / "studies"


def _load():
    return importlib.import_module("benchmarks.paper_protocol")


def _spec_copy(tmp_path: Path, name: str) -> Path:
    """The committed spec ``name`` with its records and tables in ``tmp_path``."""
    raw = json.loads((STUDIES / f"{name}.json").read_text())
    raw["report"]["records"] = str(tmp_path / "paper.json")
    raw["report"]["outputs"] = [dict(o, file=str(tmp_path / "paper.md")) for o in raw["report"]["outputs"]]
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(raw))
    return path


def runner(*argv: str) -> int:
    from benchmarks.studies.__main__ import main

    return main(list(argv))


@pytest.mark.integration
def test_paper_protocol_dry_run(shared_data, tmp_path, capsys):
    """The dry run's spec through the runner: every method of the registry trains 2 steps on a tiny BERT made in the
    work folder and is scored on STS-B test and TREC; nothing is downloaded."""
    from st_hardneg.training import LOSSES

    spec = _spec_copy(tmp_path, "paper_protocol_dry_run")
    out = tmp_path / "paper.json"
    work = tmp_path / "work"
    code = runner(str(spec), "--run", "--data-dir", str(shared_data), "--work-dir", str(work), "--set", "quiet=true")
    assert code == 0
    data = json.loads(out.read_text())
    assert data["protocol"]["dry_run"]["max_steps"] == 2 and data["protocol"] == _load().dry_run_protocol()
    assert [r["method"] for r in data["runs"]] == list(LOSSES)  # every method of the registry, in its order
    for run in data["runs"]:
        assert run["steps"] == 2 and run["stsb_dev_best"] is not None and run["mlp_head"] is True
        assert set(run["sts"]) == {"STSBenchmark", "avg"}
        assert set(run["transfer"]) >= {"TREC", "avg"}
        assert run["commit"] and run["library"]  # the provenance of a new record
    printed = capsys.readouterr().out
    assert "| Method | STS-B | Avg. |" in printed and "| Method | TREC | Avg. |" in printed
    assert (tmp_path / "paper.md").read_text() == _load().report(data)
    # each trial's checkpoints went to a folder of its own, removed after it: the work folder keeps the inputs only
    assert sorted(p.name for p in work.iterdir()) == ["mini-senteval", "study.db", "tiny-bert"]
    # the tables of an existing records file again, without training (a fresh in-memory storage)
    (tmp_path / "paper.md").unlink()
    assert runner(str(spec)) == 0
    assert (tmp_path / "paper.md").read_text() == _load().report(data)


def test_the_specs_are_every_registry_loss_at_its_defaults_under_their_protocols():
    from benchmarks.studies.render import records_path
    from st_hardneg.training import LOSSES
    from st_hardneg.training.studies.spec import load_spec

    paper = _load()
    for name, protocol in (("paper_protocol", paper.PROTOCOL), ("paper_protocol_dry_run", paper.dry_run_protocol())):
        spec = load_spec(STUDIES / f"{name}.json")
        assert dict(spec.protocol) == protocol
        assert {label: (row.loss, dict(row.options), row.control) for label, row in spec.rows.items()} == \
            {name: (name, {}, False) for name in LOSSES}
        assert [(p.row, p.seed) for p in spec.points()] == [(name, 0) for name in LOSSES]
        assert spec.trial == "benchmarks.paper_protocol:run_trial" and spec.choice.metric == "stsb_dev_best"
    # no committed records: the first run makes the file
    spec = load_spec(STUDIES / "paper_protocol.json")
    assert records_path(STUDIES / "paper_protocol.json", spec) == REPO / "benchmarks" / "results" / "paper_protocol.json"
    assert not (REPO / "benchmarks" / "results" / "paper_protocol.json").exists()


def test_a_fresh_records_file_holds_its_protocol_and_the_registry_order():
    from st_hardneg.training import LOSSES

    paper = _load()
    runs = [{"method": "focal", "seed": 1}, {"method": "mnrl", "seed": 1}, {"method": "focal", "seed": 0}]
    data = paper.records_file(runs, {})
    assert data == {"protocol": paper.PROTOCOL, "runs": [runs[1], runs[2], runs[0]]}
    assert list(LOSSES).index("mnrl") < list(LOSSES).index("focal")
    assert paper.dry_run_records_file(runs, {})["protocol"]["dry_run"]["limit"] == 32
    assert paper.records_file(runs, {"protocol": {"kept": 1}, "runs": None})["protocol"] == {"kept": 1}


def test_a_spec_under_another_protocol_is_refused_before_any_input_is_made(tmp_path):
    from st_hardneg.training.studies.spec import load_spec

    raw = json.loads((STUDIES / "paper_protocol_dry_run.json").read_text())
    raw["protocol"]["batch_size"] = 32
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(raw))
    spec = load_spec(path)
    with pytest.raises(ValueError, match="protocol is neither the papers'"):
        _load().prepare(spec, spec.points(), {"work_dir": str(tmp_path / "work"), "data_dir": str(tmp_path)})
    assert not (tmp_path / "work").exists()


def test_paper_tables_use_the_papers_layout():
    paper = _load()
    runs = [{"method": "mnrl", "seed": 0, "sts": {"STS12": 68.4, "STSBenchmark": 76.85, "SICKRelatedness": 72.2,
                                                  "avg": 72.48}, "transfer": None}]
    table = paper.paper_table(runs, "sts", paper.STS_COLUMNS)
    assert table.splitlines()[0] == "| Method | STS12 | STS-B | SICK-R | Avg. |"
    assert "| mnrl | 68.40 | 76.85 | 72.20 | 72.48 |" in table
    assert paper.paper_table(runs, "transfer", paper.TR_COLUMNS) == ""
    assert "no transfer results" in paper.report({"runs": runs})


def test_inputs_that_cannot_be_fetched_are_refused_in_one_line_before_any_trial(tmp_path, capsys, monkeypatch):
    """The papers' run downloads its corpus when it is not there: offline, the runner stops in one line (exit 2)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = _spec_copy(tmp_path, "paper_protocol")
    with pytest.raises(SystemExit) as stop:
        runner(str(spec), "--run", "--work-dir", str(tmp_path / "work"), "--set", f"download_dir={tmp_path / 'dl'}")
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "paper_protocol: its inputs cannot be fetched: cannot download" in err and "Traceback" not in err
    assert not (tmp_path / "paper.json").exists() and not (tmp_path / "dl" / "wiki1m_for_simcse.txt").exists()
