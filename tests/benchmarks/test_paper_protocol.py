"""benchmarks.paper_protocol: the GPU protocol's --dry-run on the CPU and the papers' table layouts."""

from __future__ import annotations

import importlib
import json

import pytest


def _load():
    return importlib.import_module("benchmarks.paper_protocol")


@pytest.mark.integration
def test_paper_protocol_dry_run(shared_data, tmp_path, capsys):
    from st_hardneg.training import LOSSES

    paper = _load()
    out = tmp_path / "paper.json"
    code = paper.main(["--dry-run", "--quiet", "--data-dir", str(shared_data), "--work-dir", str(tmp_path / "work"),
                       "--out", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    assert data["protocol"]["dry_run"]["max_steps"] == 2
    assert [r["method"] for r in data["runs"]] == list(LOSSES)  # every method of the registry
    for run in data["runs"]:
        assert run["steps"] == 2 and run["stsb_dev_best"] is not None and run["mlp_head"] is True
        assert set(run["sts"]) == {"STSBenchmark", "avg"}
        assert set(run["transfer"]) >= {"TREC", "avg"}
    printed = capsys.readouterr().out
    assert "| Method | STS-B | Avg. |" in printed and "| Method | TREC | Avg. |" in printed
    assert out.with_suffix(".md").is_file()
    # --report re-prints the tables of an existing JSON without training
    assert paper.main(["--report", "--out", str(out)]) == 0


def test_paper_tables_use_the_papers_layout():
    paper = _load()
    runs = [{"method": "mnrl", "seed": 0, "sts": {"STS12": 68.4, "STSBenchmark": 76.85, "SICKRelatedness": 72.2,
                                                  "avg": 72.48}, "transfer": None}]
    table = paper.paper_table(runs, "sts", paper.STS_COLUMNS)
    assert table.splitlines()[0] == "| Method | STS12 | STS-B | SICK-R | Avg. |"
    assert "| mnrl | 68.40 | 76.85 | 72.20 | 72.48 |" in table
    assert paper.paper_table(runs, "transfer", paper.TR_COLUMNS) == ""
    assert "no transfer results" in paper.report({"runs": runs})
