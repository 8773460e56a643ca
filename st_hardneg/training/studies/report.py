"""A study's report from its records: one short table, the dev choice (or a tie), the paired tests against the
baseline (:func:`~st_hardneg.evaluation.compare.compare_runs`, Holm) and a figure of the paired differences.

- :func:`summary`: per row its dev metric (pooled over the datasets, mean ± sd over seeds), its test metric per
  dataset (mean ± sd), its seeds and its step cost, best dev first;
- :func:`choice`: the row dev chooses, or the rows dev cannot tell apart (within ``tie_sds`` seed standard deviations
  of the best; seed noise unknown with one seed);
- :func:`comparison`: every row's per-query test scores against the baseline's;
- :func:`write_report`: ``study.md``, ``study.json`` and ``study_differences.png`` in the study's folder.

>>> from st_hardneg.training.studies.report import choice, summary
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from st_hardneg.training.studies.spec import StudySpec

__all__ = ["DevChoice", "choice", "comparison", "dev_by_seed", "markdown", "summary", "write_report"]


def _rows(spec: StudySpec, records: Sequence[Mapping[str, Any]], label: str) -> list[Mapping[str, Any]]:
    return [r for r in records if r["row"] == label]


def _seed_order(seed: Any) -> tuple[int, int]:
    """Seeds in numeric order, a row without training (seed ``None``) first."""
    return (0, 0) if seed is None else (1, int(seed))


def dev_by_seed(spec: StudySpec, records: Sequence[Mapping[str, Any]], label: str) -> dict[Any, float]:
    """``{seed: dev metric pooled over the datasets}`` of a row, the seeds it has on every dataset of the grid."""
    metric = spec.choice.metric
    per: dict[Any, dict[str, float]] = {}
    for record in _rows(spec, records, label):
        per.setdefault(record["seed"], {})[record["dataset"]] = float(record["dev"][metric])
    names = {point.dataset for point in spec.points() if point.row == label}
    return {seed: statistics.fmean(values.values()) for seed, values in sorted(per.items(), key=lambda i: _seed_order(i[0]))
            if set(values) == names}


@dataclass
class DevChoice:
    """What dev says: ``ranking`` (row, mean dev) best first, ``noise`` (the pooled seed-to-seed sd of dev;
    ``None`` with one seed), ``tied`` (the rows within ``tie_sds`` × noise of the best, the best included), and
    ``verdict`` (one sentence)."""

    ranking: list[tuple[str, float]]
    noise: float | None
    tied: list[str]
    verdict: str


def choice(spec: StudySpec, records: Sequence[Mapping[str, Any]]) -> DevChoice:
    """The dev choice among the trained rows (a row without a loss is a reference, never chosen): rows by their mean
    pooled dev over seeds; the seed noise is the pooled standard deviation over seeds (the square root of the mean
    of the rows' sample variances, rows with two or more seeds); the rows within ``spec.choice.tie_sds`` noise of the
    best tie with it, and the verdict names a winner only when no other row does."""
    metric = spec.choice.metric
    means = {label: statistics.fmean(by.values()) for label, row in spec.rows.items()
             if row.loss is not None and (by := dev_by_seed(spec, records, label))}
    ranking = sorted(means.items(), key=lambda item: (-item[1], item[0]))
    variances = [statistics.variance(by.values()) for label in means
                 if len(by := dev_by_seed(spec, records, label)) > 1]
    noise = math.sqrt(statistics.fmean(variances)) if variances else None
    if not ranking:
        return DevChoice([], noise, [], "no row has finished on every dataset yet")
    best, top = ranking[0]
    if noise is None:
        tied = [label for label, _ in ranking] if len(ranking) > 1 else [best]
        verdict = (f"`{best}` is the only row" if len(ranking) == 1 else
                   f"one seed a row: dev cannot say whether `{best}` ({top:.2f}) is better than the rest (no seed "
                   "noise to judge by); run two or more seeds")
        return DevChoice(ranking, None, tied, verdict)
    margin = spec.choice.tie_sds * noise
    tied = [label for label, value in ranking if top - value <= margin]
    if len(tied) == 1:
        second = f"; the next, `{ranking[1][0]}`, {top - ranking[1][1]:.2f} behind" if len(ranking) > 1 else ""
        verdict = (f"dev chooses `{best}` ({metric} {top:.2f}): more than {spec.choice.tie_sds:g} seed standard "
                   f"deviations ({margin:.2f}) ahead of every other row{second}")
    else:
        verdict = (f"dev cannot tell {', '.join(f'`{t}`' for t in tied)} apart: within {spec.choice.tie_sds:g} seed "
                   f"standard deviations ({margin:.2f}) of the best dev {metric} ({top:.2f}); they tie")
    return DevChoice(ranking, noise, tied, verdict)


def summary(spec: StudySpec, records: Sequence[Mapping[str, Any]]) -> str:
    """The study's table: row, dev (pooled, mean ± sd over seeds), test per dataset (mean ± sd), seeds, step cost
    (median step seconds, mean training seconds); rows by dev, best first, then rows without training."""
    from st_hardneg.reporting import markdown_table, mean_std_text

    metric = spec.choice.metric
    names = list(spec.datasets)
    dev = {label: dev_by_seed(spec, records, label) for label in spec.rows}
    labels = sorted(spec.rows, key=lambda label: (spec.rows[label].loss is None,
                                                  -(statistics.fmean(dev[label].values()) if dev[label] else -1e9),
                                                  list(spec.rows).index(label)))
    body = []
    for label in labels:
        rows = _rows(spec, records, label)
        tests = {name: [float(r["test"][metric]) for r in sorted(rows, key=lambda r: _seed_order(r["seed"]))
                        if r["dataset"] == name] for name in names}
        steps = [r["median_step_seconds"] for r in rows if r.get("median_step_seconds")]
        train = [r["train_seconds"] for r in rows if r.get("train_seconds")]
        seeds = sorted({r["seed"] for r in rows}, key=_seed_order)
        body.append([f"`{label}`", mean_std_text(list(dev[label].values())),
                     *(mean_std_text(tests[name]) if tests[name] else "not run" for name in names),
                     ", ".join("-" if s is None else str(s) for s in seeds) or "none yet",
                     f"{statistics.median(steps):.3f} s, {statistics.fmean(train):.0f} s" if steps else "–"])
    header = ["row", f"dev {metric}" + (" (pooled)" if len(names) > 1 else ""),
              *(f"{name} test {metric}" for name in names), "seeds", "step cost (median step, train s)"]
    return markdown_table(header, body).rstrip("\n")


def _per_query(output_dir: Path, record: Mapping[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    from st_hardneg.evaluation.runs import read_per_query

    return read_per_query(output_dir / str(record["per_query"]))


def comparison(spec: StudySpec, records: Sequence[Mapping[str, Any]], output_dir: str | Path) -> Any:
    """:func:`~st_hardneg.evaluation.compare.compare_runs` of every row that has the baseline's datasets against
    the baseline (``spec.choice.baseline``), on per-query test scores (each row's seeds averaged per query first;
    Holm over every (dataset, row)); ``None`` without a baseline or a second row."""
    from st_hardneg.evaluation.compare import compare_runs

    baseline = spec.choice.baseline
    if baseline is None:
        return None
    runs: dict[str, list[dict[str, Any]]] = {}
    for label in [baseline, *(label for label in spec.rows if label != baseline)]:
        by_seed: dict[Any, dict[str, Any]] = {}
        for record in _rows(spec, records, label):
            by_seed.setdefault(record["seed"], {}).update(_per_query(Path(output_dir), record))
        names = {point.dataset for point in spec.points() if point.row == label}
        complete = [tables for seed, tables in sorted(by_seed.items(), key=lambda i: _seed_order(i[0]))
                    if len(tables) == len(names)]
        if complete:
            runs[label] = complete
    if baseline not in runs or len(runs) < 2:
        return None
    reference = set(runs[baseline][0])
    runs = {label: sources for label, sources in runs.items() if set(sources[0]) == reference}
    metric = spec.choice.metric
    return compare_runs(runs, metric=metric, baseline=baseline) if metric is not None and len(runs) > 1 else None


def markdown(spec: StudySpec, records: Sequence[Mapping[str, Any]], output_dir: str | Path,
             left: Sequence[str] = (), failed: Mapping[str, str] | None = None) -> str:
    """``study.md``: the table, the dev choice, the paired tests, then what is left or failed."""
    chosen = choice(spec, records)
    lines = [f"# Study `{spec.name}`", "", summary(spec, records), "",
             f"**Choice on dev**: {chosen.verdict}."
             + (f" Seed noise (pooled sd of dev over seeds): {chosen.noise:.2f}." if chosen.noise is not None else ""),
             "", "The test split is scored once per trial and never used to choose.", ""]
    result = comparison(spec, records, output_dir)
    if result is not None:
        lines += [f"## Paired tests against `{spec.choice.baseline}` (per-query test {spec.choice.metric})", "",
                  result.to_markdown().rstrip("\n"), ""]
    if left:
        lines += [f"{len(left)} trial(s) not finished: re-run the same command to resume.", ""]
    for key, error in (failed or {}).items():
        lines += [f"- failed: {key}: {error}"]
    return "\n".join(lines).rstrip("\n") + "\n"


def write_report(spec: StudySpec, records: Sequence[Mapping[str, Any]], output_dir: str | Path,
                 left: Sequence[str] = (), failed: Mapping[str, str] | None = None) -> dict[str, Path]:
    """Write ``study.md``, ``study.json`` (the spec and the records) and, with a comparison, the figure of its paired
    differences ``study_differences.png`` (:func:`~st_hardneg.plots.plot_comparison`) in ``output_dir``; returns
    them by name."""
    from st_hardneg.plots import plot_comparison
    from st_hardneg.reporting import write_json

    folder = Path(output_dir)
    out = {"markdown": folder / "study.md", "json": folder / "study.json"}
    out["markdown"].write_text(markdown(spec, records, folder, left, failed))
    write_json(out["json"], {"spec": spec.to_dict(), "records": list(records), "left": list(left),
                             "failed": dict(failed or {})})
    result = comparison(spec, records, folder)
    if result is not None:
        out["figure"] = plot_comparison(result, folder / "study_differences.png")
    return out
