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


def test_compare_plot_draws_the_per_query_differences(tmp_path, capsys):
    from PIL import Image

    a0 = _write(tmp_path / "a0.tsv", {f"q{i}": 10.0 + i for i in range(8)})
    b0 = _write(tmp_path / "b0.tsv", {f"q{i}": 15.0 + i * (1 + (i % 3)) for i in range(8)})
    figure = tmp_path / "cmp.png"
    assert app.main(["compare", f"A={a0}", f"B={b0}", "--plot", str(figure)]) == 0
    assert f"figure: {figure}" in capsys.readouterr().out
    with Image.open(figure) as image:
        assert image.format == "PNG" and image.size[0] > 500
    # the differences it draws are the per-query ones, method - baseline, in query order
    [row] = compare_runs({"A": [a0], "B": [b0]}).rows
    assert row.differences == [5.0 + i * (i % 3) for i in sorted(range(8), key=lambda i: f"q{i}")]
    assert "differences" not in json.loads(compare_runs({"A": [a0], "B": [b0]}).to_json())["rows"][0]
    assert app.main(["compare", f"A={a0}", f"B={b0}", "--plot", str(figure)]) == 2  # nothing overwritten
    assert "--plot" in capsys.readouterr().err
    assert app.main(["compare", f"A={a0}", f"B={b0}", "--plot", str(tmp_path / "cmp.pdf")]) == 2
    assert "give a .png file" in capsys.readouterr().err


def test_compare_refuses_values_it_would_take_silently(tmp_path, capsys):
    import pytest

    a0 = _write(tmp_path / "a0.tsv", {f"q{i}": 10.0 + i for i in range(4)})
    b0 = _write(tmp_path / "b0.tsv", {f"q{i}": 12.0 + i for i in range(4)})
    # one file listed twice is one seed, not two
    with pytest.raises(ValueError, match=r"lists .*a0.tsv twice: each run \(one seed\) counts once"):
        compare_runs({"A": [a0, a0], "B": [b0]})
    for tolerance in (-0.1, float("nan")):
        with pytest.raises(ValueError, match="tie_tolerance"):
            compare_runs({"A": [a0], "B": [b0]}, tie_tolerance=tolerance)
    assert app.main(["compare", str(a0), str(b0), "--seed", "-1"]) == 2
    assert "seed must be a non-negative integer" in capsys.readouterr().err
    one_a, one_b = _write(tmp_path / "x.tsv", {"q1": 1.0}), _write(tmp_path / "y.tsv", {"q1": 2.0})
    assert app.main(["compare", str(one_a), str(one_b)]) == 2
    err = capsys.readouterr().err.strip()
    assert "has 1 query: a paired test needs at least 2 queries" in err and len(err.splitlines()) == 1
    for bad in ("250.0", "-5.0"):
        (tmp_path / "bad.tsv").write_text(f"task\tquery-id\tndcg@10\ndata-test\tq1\t{bad}\n")
        assert app.main(["compare", str(tmp_path / "bad.tsv"), str(b0)]) == 2
        assert "every metric is a share x 100 in [0, 100]" in capsys.readouterr().err


def test_compare_refuses_one_file_for_output_and_plot_and_names_a_file_that_is_not_utf8(tmp_path, capsys):
    a0 = _write(tmp_path / "a0.tsv", {f"q{i}": 10.0 + i for i in range(4)})
    b0 = _write(tmp_path / "b0.tsv", {f"q{i}": 12.0 + i for i in range(4)})
    same = tmp_path / "cmp.png"
    assert app.main(["compare", str(a0), str(b0), "--output", str(same), "--plot", str(tmp_path / "." / "cmp.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--output and --plot name the same file" in err and len(err.splitlines()) == 1
    assert not same.exists()
    bad = tmp_path / "bad.tsv"
    bad.write_bytes(b"task\tquery-id\tndcg@10\ndata-test\tq\xff\t1.0\n")
    assert app.main(["compare", str(bad), str(b0)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{bad}: the per-query file is not UTF-8 text" in err and len(err.splitlines()) == 1


def test_compare_counts_a_run_given_as_its_folder_and_its_file_once(tmp_path, capsys):
    run = tmp_path / "mnrl_s0"
    run.mkdir()
    a0 = _write(run / "per_query.tsv", {f"q{i}": 10.0 + i for i in range(6)})
    (run / "results.json").write_text(json.dumps({"files": {"per_query": "per_query.tsv"}}))
    b0 = _write(tmp_path / "b0.tsv", {f"q{i}": 12.0 + i * (i % 2) for i in range(6)})
    out1, out2 = tmp_path / "one.json", tmp_path / "two.json"
    assert app.main(["compare", f"A={a0}", f"B={b0}", "--output", str(out1)]) == 0
    assert app.main(["compare", f"A={run},{run / 'results.json'}", f"B={b0}", "--output", str(out2)]) == 0
    captured = capsys.readouterr()
    assert "counts once" in captured.err
    assert json.loads(out2.read_text())["rows"] == json.loads(out1.read_text())["rows"]
