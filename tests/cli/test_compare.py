"""st-hardneg compare: the table, the JSON form, and the bad inputs (one run, different queries, overwriting)."""

from __future__ import annotations

import json

from st_hardneg.cli import app
from st_hardneg.evaluation.compare import compare_runs
from st_hardneg.evaluation.runs import write_per_query


def _write(path, values):
    return write_per_query(path, {"data-test": {q: {"ndcg@10": v} for q, v in values.items()}},
                           metrics=("ndcg@10",))


def test_compare_prints_the_table_and_writes_the_json_of_the_library_function(tmp_path, capsys):
    a0 = _write(tmp_path / "a0.tsv", {f"q{i}": 10.0 + i for i in range(8)})
    a1 = _write(tmp_path / "a1.tsv", {f"q{i}": 12.0 + i for i in range(8)})
    b0 = _write(tmp_path / "b0.tsv", {f"q{i}": 15.0 + i * (1 + (i % 3)) for i in range(8)})
    out = tmp_path / "cmp.json"
    assert app.main(["compare", f"A={a0},{a1}", f"B={b0}", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| data-test | B | A | 8 |" in printed
    expected = compare_runs({"A": [a0, a1], "B": [b0]})
    assert json.loads(out.read_text())["rows"] == json.loads(expected.to_json())["rows"]
    assert app.main(["compare", f"A={a0}", f"B={b0}", "--output", str(out)]) == 2  # nothing overwritten
    assert "exists; pass --overwrite" in capsys.readouterr().err


def test_compare_with_one_run_exits_2(tmp_path, capsys):
    a0 = _write(tmp_path / "a0.tsv", {"q1": 1.0})
    assert app.main(["compare", f"A={a0}"]) == 2
    assert "at least two methods" in capsys.readouterr().err


def test_compare_of_runs_over_different_queries_exits_2(tmp_path, capsys):
    a0 = _write(tmp_path / "a0.tsv", {"q1": 1.0, "q2": 2.0})
    b0 = _write(tmp_path / "b0.tsv", {"q1": 1.0, "q9": 2.0})
    assert app.main(["compare", str(a0), str(b0)]) == 2
    assert "different query sets" in capsys.readouterr().err
