"""The study's dev choice, its tie rule and its table, against numbers computed here."""

from __future__ import annotations

import math
import statistics

import pytest

from st_hardneg.training.studies.report import choice, dev_by_seed, summary
from st_hardneg.training.studies.spec import Dataset, spec_from_methods


def _spec(tie_sds: float = 2.0, seeds=(0, 1, 2)):
    return spec_from_methods(["a=mnrl", "b=focal", "c=mixcse"], datasets={"x": Dataset("x"), "y": Dataset("y")},
                             seeds=list(seeds), tie_sds=tie_sds)


def _records(dev: dict[str, list[tuple[float, float]]]):
    """``{row: [(dev on x, dev on y) per seed]}`` → records (test = dev + 1)."""
    out = []
    for row, values in dev.items():
        for seed, pair in enumerate(values):
            for name, value in zip(("x", "y"), pair, strict=True):
                out.append({"dataset": name, "row": row, "seed": seed, "dev": {"ndcg@10": value},
                            "test": {"ndcg@10": value + 1}, "median_step_seconds": 0.5, "train_seconds": 10.0})
    return out


DEV = {"a": [(50.0, 40.0), (51.0, 41.0), (52.0, 42.0)],   # pooled 45, 46, 47
       "b": [(50.5, 40.5), (51.5, 41.5), (52.5, 42.5)],   # pooled 45.5, 46.5, 47.5
       "c": [(60.0, 50.0), (61.0, 51.0), (62.0, 52.0)]}   # pooled 55, 56, 57


def test_dev_is_pooled_over_the_datasets_per_seed():
    assert dev_by_seed(_spec(), _records(DEV), "b") == {0: 45.5, 1: 46.5, 2: 47.5}


def test_a_row_far_ahead_of_the_seed_noise_is_chosen():
    result = choice(_spec(), _records(DEV))
    assert result.ranking[0] == ("c", 56.0) and result.tied == ["c"]
    assert result.noise == pytest.approx(1.0)  # every row's pooled dev has sd 1 over its seeds
    assert "dev chooses `c`" in result.verdict


def test_rows_within_two_seed_sds_of_the_best_tie_and_no_winner_is_named():
    dev = {**DEV, "c": [(51.0, 41.0), (51.5, 41.5), (52.5, 42.5)]}  # pooled 46, 46.5, 47.5: 0.17 ahead of b
    result = choice(_spec(), _records(dev))
    variances = [statistics.variance([45, 46, 47]), statistics.variance([45.5, 46.5, 47.5]),
                 statistics.variance([46, 46.5, 47.5])]
    assert result.noise == pytest.approx(math.sqrt(statistics.fmean(variances)))
    assert result.ranking[0][0] == "c" and set(result.tied) == {"a", "b", "c"}
    assert "they tie" in result.verdict and "chooses" not in result.verdict
    # a tighter rule (0.1 sd, below c's 0.17 lead) separates them
    assert choice(_spec(tie_sds=0.1), _records(dev)).tied == ["c"]


def test_one_seed_names_no_winner():
    one = {row: values[:1] for row, values in DEV.items()}
    result = choice(_spec(seeds=(0,)), _records(one))
    assert result.noise is None and len(result.tied) == 3 and "chooses" not in result.verdict


def test_the_table_lists_rows_best_dev_first_with_their_numbers():
    lines = summary(_spec(), _records(DEV)).splitlines()
    assert lines[0] == ("| row | dev ndcg@10 (pooled) | x test ndcg@10 | y test ndcg@10 | seeds | "
                        "step cost (median step, train s) |")
    assert [line.split("|")[1].strip() for line in lines[2:]] == ["`c`", "`b`", "`a`"]
    assert lines[2] == "| `c` | 56.00 ± 1.00 | 62.00 ± 1.00 | 52.00 ± 1.00 | 0, 1, 2 | 0.500 s, 10 s |"
