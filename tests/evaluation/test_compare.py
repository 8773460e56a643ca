"""compare_runs: the randomization p-value against an exact enumeration, Holm by hand, seeds averaged, bad inputs."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from st_hardneg.evaluation.compare import compare_runs, holm, parse_run_specs
from st_hardneg.evaluation.runs import write_per_query


def _per_query(values: dict[str, float], task: str = "data-test") -> dict:
    return {task: {q: {"ndcg@10": v, "mrr@10": v / 2} for q, v in values.items()}}


def _exact_two_sided(diff: np.ndarray) -> float:
    """All 2^n sign flips of the paired differences, enumerated here; two-sided p = 2 min(P(T >= t), P(T <= t))."""
    observed = diff.mean()
    means = np.array([np.mean(diff * np.array(signs)) for signs in itertools.product((1, -1), repeat=len(diff))])
    tolerance = 1e-12
    greater = np.mean(means >= observed - tolerance)
    less = np.mean(means <= observed + tolerance)
    return min(1.0, 2 * min(greater, less))


def test_randomization_p_value_equals_the_exact_enumeration_of_all_sign_flips():
    rng = np.random.default_rng(3)
    a = rng.uniform(20, 60, size=10)
    b = a + rng.normal(4.0, 6.0, size=10)
    queries = [f"q{i}" for i in range(10)]
    result = compare_runs({"A": [_per_query(dict(zip(queries, a, strict=True)))],
                           "B": [_per_query(dict(zip(queries, b, strict=True)))]})
    row = result.rows[0]
    expected = _exact_two_sided(b - a)
    assert 0.001 < expected < 0.5  # a case where the p-value says something
    assert row.p_randomization == pytest.approx(expected, abs=1e-12)
    assert row.mean_difference == pytest.approx(float(np.mean(b - a)))
    from scipy import stats

    assert row.p_ttest == pytest.approx(float(stats.ttest_rel(b, a).pvalue))
    assert row.ci_low < row.mean_difference < row.ci_high
    assert (row.wins, row.ties, row.losses) == (int((b > a).sum()), 0, int((b < a).sum()))


def test_holm_against_a_hand_computation():
    # sorted 0.01, 0.03, 0.04, 0.20 -> 4 x 0.01 = 0.04; 3 x 0.03 = 0.09; max(0.09, 2 x 0.04) = 0.09; max(0.09, 0.20)
    assert holm([0.01, 0.04, 0.03, 0.20]) == pytest.approx([0.04, 0.09, 0.09, 0.20])
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])  # capped at 1
    adjusted = holm([0.02, float("nan"), 0.01])
    assert adjusted[0] == pytest.approx(0.02) and np.isnan(adjusted[1]) and adjusted[2] == pytest.approx(0.02)


def test_seeds_are_averaged_per_query_and_holm_spans_the_data_sets(tmp_path):
    base = {"data-test": {"q1": {"ndcg@10": 10.0}, "q2": {"ndcg@10": 20.0}, "q3": {"ndcg@10": 30.0}},
            "other-test": {"p1": {"ndcg@10": 50.0}, "p2": {"ndcg@10": 40.0}, "p3": {"ndcg@10": 45.0}}}
    seeds = []
    for seed, shift in enumerate((2.0, 6.0)):
        table = {t: {q: {"ndcg@10": v["ndcg@10"] + shift * (1 if q != "q3" else -1)} for q, v in qs.items()}
                 for t, qs in base.items()}
        seeds.append(write_per_query(tmp_path / f"b{seed}.tsv", table, metrics=("ndcg@10",)))
    a = write_per_query(tmp_path / "a.tsv", base, metrics=("ndcg@10",))
    result = compare_runs({"A": [a], "B": seeds})
    rows = {row.dataset: row for row in result.rows}
    # seed mean: +4 on every query but q3 (-4)
    assert rows["data-test"].method_mean == pytest.approx((14 + 24 + 26) / 3)
    assert rows["data-test"].mean_difference == pytest.approx(4 / 3)
    assert (rows["data-test"].wins, rows["data-test"].ties, rows["data-test"].losses) == (2, 0, 1)
    assert rows["other-test"].mean_difference == pytest.approx(4.0)
    raw = [rows[d].p_randomization for d in ("data-test", "other-test")]
    assert [rows[d].p_randomization_holm for d in ("data-test", "other-test")] == pytest.approx(holm(raw))
    payload = json.loads(result.to_json())
    assert payload["metric"] == "ndcg@10" and len(payload["rows"]) == 2 and payload["permutations"] == 10_000
    assert "| data-test | B | A | 3 |" in result.to_markdown()


def test_compare_with_one_run_is_refused():
    with pytest.raises(ValueError, match="at least two methods, got 1"):
        compare_runs({"A": [_per_query({"q1": 1.0})]})


def test_runs_over_different_query_sets_are_refused_naming_them(tmp_path):
    metrics = ("ndcg@10", "mrr@10")
    a = write_per_query(tmp_path / "a.tsv", _per_query({"q1": 1.0, "q2": 2.0}), metrics=metrics)
    b = write_per_query(tmp_path / "b.tsv", _per_query({"q1": 1.0, "q3": 2.0}), metrics=metrics)
    with pytest.raises(ValueError, match="differ in the queries of 'data-test'.*different query sets"):
        compare_runs({"A": [a], "B": [b]})
    c = write_per_query(tmp_path / "c.tsv", _per_query({"q1": 1.0, "q3": 2.0}), metrics=metrics)
    with pytest.raises(ValueError, match=r"runs of 'A' differ in the queries of 'data-test': .*c\.tsv"):
        compare_runs({"A": [a, c], "B": [b]})


def test_fewer_than_ten_thousand_permutations_are_refused():
    runs = {"A": [_per_query({"q1": 1.0, "q2": 3.0})], "B": [_per_query({"q1": 2.0, "q2": 2.5})]}
    with pytest.raises(ValueError, match="permutations must be"):
        compare_runs(runs, permutations=999)


def test_run_specs_name_methods_and_refuse_a_name_twice():
    assert parse_run_specs(["A=a0.tsv,a1.tsv", "runs/b.per_query.tsv"]) == {"A": ["a0.tsv", "a1.tsv"],
                                                                           "b": ["runs/b.per_query.tsv"]}
    with pytest.raises(ValueError, match="named twice"):
        parse_run_specs(["A=a.tsv", "A=b.tsv"])
    with pytest.raises(ValueError, match="NAME=PATH"):
        parse_run_specs(["A="])


def test_blocks_give_the_all_at_once_p_values_and_interval_exactly():
    from st_hardneg.evaluation.compare import _compare, block_size

    rng = np.random.default_rng(11)
    a = rng.uniform(10, 70, size=60)
    b = np.clip(a + rng.normal(2.0, 9.0, size=60), 0, 100)
    whole = _compare(a, b, permutations=10_000, confidence=0.95, seed=4, tolerance=1e-9, block=10_000)
    assert block_size(10_000, 60, elements=60 * 500) == 500
    for block in (None, 1_000, 500, 80, 16):
        assert _compare(a, b, permutations=10_000, confidence=0.95, seed=4, tolerance=1e-9, block=block) == whole
    assert 0.0 < whole[3] < 0.5 and whole[1] < whole[0] < whole[2]  # a p-value and an interval that say something


def test_block_size_divides_the_permutations_and_bounds_the_block():
    from st_hardneg.evaluation.compare import BLOCK_ELEMENTS, block_size

    for permutations, queries in ((10_000, 10_000), (10_000, 7), (12_345, 3_000), (10_007, 500), (20_000, 1)):
        size = block_size(permutations, queries)
        assert permutations % size == 0 and 1 <= size <= permutations
        assert size * queries <= max(BLOCK_ELEMENTS, queries)
    assert block_size(10_000, 10_000) == 100  # the largest divisor of 10,000 within 2^20 / 10,000 = 104
    assert block_size(10_007, 500) == 1  # a prime: one resample at a time, never a short last block


def test_compare_of_ten_thousand_queries_peaks_under_one_gigabyte(tmp_path):
    import subprocess
    import sys

    # the resident high-water mark of the process image (VmHWM: ru_maxrss would carry over the forking parent's,
    # here pytest's, since Linux keeps it across exec)
    script = (
        "import resource, numpy as np\n"
        "from st_hardneg.evaluation.compare import compare_runs\n"
        "rng = np.random.default_rng(0)\n"
        "a = rng.uniform(0, 100, 10_000); b = np.clip(a + rng.normal(0.5, 10, 10_000), 0, 100)\n"
        "q = [f'q{i:05d}' for i in range(10_000)]\n"
        "run = lambda v: [{'quora-test': {k: {'ndcg@10': float(x)} for k, x in zip(q, v)}}]\n"
        "runs = {'A': run(a), 'B': run(b)}\n"
        "row = compare_runs(runs).rows[0]\n"
        "try:\n"
        "    status = open('/proc/self/status').read().split('VmHWM:')[1]\n"
        "    peak = int(status.split()[0])\n"
        "except (OSError, IndexError):\n"
        "    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print(peak, row.p_randomization, row.ci_low, row.ci_high)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True)
    peak_kib, p_value, low, high = done.stdout.split()
    assert int(peak_kib) < 1024 * 1024  # the whole process, imports included: under 1 GiB (all at once: 7.4 GB)
    # the values the all-at-once computation gives for this case and seed (measured before the blocks)
    assert float(p_value) == pytest.approx(0.00019998000199980003, abs=0)
    assert (float(low), float(high)) == (0.33056278725746746, 0.6884099629160838)


def test_run_specs_keep_paths_that_hold_equals_signs_and_commas(tmp_path):
    odd = tmp_path / "lr=2e-5,bs=64"
    odd.mkdir()
    for name in ("s0.tsv", "s1.tsv"):
        (odd / name).write_text("x")
    s0, s1 = str(odd / "s0.tsv"), str(odd / "s1.tsv")
    assert parse_run_specs([f"A={s0},{s1}"]) == {"A": [s0, s1]}  # the pieces joined back where only the join exists
    assert parse_run_specs([s0]) == {"s0": [s0]}  # an existing path as a whole: a bare path, "=" and all
    assert parse_run_specs([f'B="{s0}","{s1}"']) == {"B": [s0, s1]}  # quoted
    assert parse_run_specs(["runs/lr=2e-5/per_query.tsv"]) == {"per_query": ["runs/lr=2e-5/per_query.tsv"]}
    with pytest.raises(ValueError, match="unclosed or misplaced quote"):
        parse_run_specs(['C="a.tsv'])


def test_one_run_given_as_its_folder_and_as_its_file_counts_once(tmp_path):
    folder = tmp_path / "run0"
    folder.mkdir()
    a = write_per_query(folder / "per_query.tsv", _per_query({"q1": 10.0, "q2": 20.0, "q3": 35.0}), metrics=("ndcg@10",))
    (folder / "results.json").write_text(json.dumps({"files": {"per_query": "per_query.tsv"}}))
    b = write_per_query(tmp_path / "b.tsv", _per_query({"q1": 12.0, "q2": 26.0, "q3": 30.0}), metrics=("ndcg@10",))
    once = compare_runs({"A": [a], "B": [b]})
    for spellings in ([folder, a], [folder / "results.json", folder], [a, folder / "results.json"]):
        with pytest.warns(UserWarning, match="counts once"):
            twice = compare_runs({"A": spellings, "B": [b]})
        assert twice.to_dict()["rows"] == once.to_dict()["rows"]
        assert len(twice.methods["A"]) == 1


def test_a_results_or_per_query_file_that_is_not_utf8_is_named():
    import tempfile
    from pathlib import Path

    from st_hardneg.evaluation.runs import RunFormatError

    with tempfile.TemporaryDirectory() as tmp:
        good = write_per_query(Path(tmp) / "good.tsv", _per_query({"q1": 1.0, "q2": 2.0}), metrics=("ndcg@10",))
        bad = Path(tmp) / "latin1.tsv"
        bad.write_bytes("task\tquery-id\tndcg@10\nt\tq\xe9\t1.0\n".encode("latin-1"))
        with pytest.raises(RunFormatError, match=r"latin1\.tsv: the per-query file is not UTF-8 text"):
            compare_runs({"A": [bad], "B": [good]})
        results = Path(tmp) / "results.json"
        results.write_bytes(b'{"files": {"per_query": "caf\xe9.tsv"}}')
        with pytest.raises(RunFormatError, match=r"results\.json: the results file is not UTF-8 text"):
            compare_runs({"A": [results], "B": [good]})
