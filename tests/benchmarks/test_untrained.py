"""benchmarks.untrained: the committed reports of the untrained model (``sts``: untrained_eval, ``beir``:
untrained_beir) are what their JSON renders to; the subcommands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import untrained

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def test_sts_report_regenerates_byte_identical_from_the_committed_json():
    """The report code (one markdown-table helper for all) renders the committed results exactly as committed."""
    data = json.loads((RESULTS / "untrained_eval.json").read_text())
    assert untrained.sts_markdown(data) == (RESULTS / "untrained_eval.md").read_text()


def test_beir_report_regenerates_byte_identical_from_the_committed_json():
    data = json.loads((RESULTS / "untrained_beir.json").read_text())
    assert untrained.beir_render(data) == (RESULTS / "untrained_beir.md").read_text()
    assert {row["data"] for row in data["rows"]} == {"scifact", "nfcorpus"}


def test_subcommands(tmp_path, capsys):
    copy = tmp_path / "untrained_eval.json"
    copy.write_text((RESULTS / "untrained_eval.json").read_text())
    assert untrained.main(["sts", "--json", str(copy)]) == 0  # printed, nothing written
    assert capsys.readouterr().out == (RESULTS / "untrained_eval.md").read_text()
    assert not copy.with_suffix(".md").exists()
    assert untrained.main(["sts", "--json", str(copy), "--report"]) == 0
    assert copy.with_suffix(".md").read_text() == (RESULTS / "untrained_eval.md").read_text()
    for argv in ([], ["nope"], ["--help"]):
        with pytest.raises(SystemExit):
            untrained.main(argv)
