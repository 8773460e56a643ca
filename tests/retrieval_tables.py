"""The check of a hand-written retrieval table (the README's; GitHub renders no includes) against its committed JSON."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from st_hardneg.reporting import mean_std_text


def table_rows(table: str) -> dict[str, list[str]]:
    """A markdown table's body rows: first cell → the other cells (bold marks stripped)."""
    return {line.split(" | ")[0].strip("| "): [c.strip(" *|") for c in line.split(" | ")[1:]]
            for line in table.splitlines()[2:]}


def check_rows_are_runs(rows: dict[str, list[str]], labels: dict[str, str], runs: list[dict[str, Any]],
                        kept: Callable[[dict[str, Any]], bool] = lambda run: True) -> dict[str, list[int]]:
    """Assert that the row starting with each prefix of ``labels`` shows, per dataset (SciFact, NFCorpus), the mean ±
    std of the test nDCG@10 of ``runs`` of that label (those ``kept``), and their mean in the last column.

    Returns:
        label → how many runs each dataset's cell holds.
    """
    counts: dict[str, list[int]] = {}
    for prefix, label in labels.items():
        cells = next(cells for name, cells in rows.items() if name.strip("*").startswith(prefix))
        means, counts[label] = [], []
        for name, cell in zip(("scifact", "nfcorpus"), cells, strict=False):
            values = [r["test"]["ndcg@10"] for r in runs if r["dataset"] == name and r["method"] == label
                      and "test" in r and kept(r)]
            assert cell.startswith(mean_std_text(values)), (prefix, name, cell, mean_std_text(values))
            means.append(statistics.fmean(values))
            counts[label].append(len(values))
        assert cells[2] == f"{statistics.fmean(means):.2f}", (prefix, cells[2])
    return counts
