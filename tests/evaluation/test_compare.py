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
