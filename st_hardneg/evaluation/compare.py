"""Paired comparison of retrieval runs over the same queries: is method B better than method A, per data set?

:func:`compare_runs` reads the per-query metrics that every retrieval evaluation writes beside its results
(:func:`st_hardneg.evaluation.runs.write_per_query`), averages the seeds of each method per query, and for each data
set and each method against the baseline (the first one) reports the mean difference, a 95 % bootstrap interval, a
paired randomization test and a paired t-test, and win / tie / loss counts; across all data sets and methods the
p-values are Holm-corrected.

Why these tests (scipy's implementations, not hand-written ones):

- the unit is the query: both methods answered the same queries, so each query gives one *paired* difference; the
  tests are on those differences, which removes the (large) spread of difficulty between queries;
- ``scipy.stats.permutation_test(..., permutation_type="samples")`` is the paired randomization test of IR
  evaluation (Smucker et al., 2007): under the null the two methods' scores of a query are exchangeable, so each
  difference's sign is flipped at random; with ``2**n`` at most ``permutations`` scipy enumerates every sign flip
  (an exact p-value), otherwise it draws ``permutations`` of them. It assumes nothing about the shape of the
  per-query differences (nDCG differences are bounded, skewed and often zero);
- ``scipy.stats.ttest_rel`` is the paired t-test, reported beside it because it is what most papers report; it is
  close to the randomization test on a few hundred queries;
- ``scipy.stats.bootstrap`` (BCa) gives the interval of the mean difference, resampling queries;
- Holm's step-down correction (by hand below; scipy has none) controls the family-wise error over all data sets and
  comparisons without assuming independence between them.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from st_hardneg.evaluation.runs import RunFormatError, read_per_query

__all__ = ["ComparisonResult", "DatasetComparison", "compare_runs", "holm", "parse_run_specs"]

#: per-query values as the per-query files hold them: ``{task: {query id: {metric: value}}}``
PerQuery = Mapping[str, Mapping[str, Mapping[str, float]]]


@dataclass
class DatasetComparison:
    """One data set, one method against the baseline (differences are ``method - baseline``, x 100)."""

    dataset: str
    baseline: str
    method: str
    queries: int
    baseline_mean: float
    method_mean: float
    mean_difference: float
    ci_low: float
    ci_high: float
    p_randomization: float
    p_ttest: float
    wins: int
    ties: int
    losses: int
    p_randomization_holm: float = math.nan
    p_ttest_holm: float = math.nan
    #: the per-query differences (method - baseline, x 100, queries sorted by id), for :func:`plot_comparison`; not
    #: part of the JSON form
    differences: list[float] = field(default_factory=list, repr=False)


@dataclass
class ComparisonResult:
    """What :func:`compare_runs` returns: the rows and the settings they were computed with."""

    metric: str
    methods: dict[str, list[str]]
    rows: list[DatasetComparison]
    permutations: int
    confidence: float
    seed: int
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (NaN written as ``null``)."""

        def clean(value: Any) -> Any:
            return None if isinstance(value, float) and math.isnan(value) else value

        return {"metric": self.metric, "methods": self.methods, "permutations": self.permutations,
                "confidence": self.confidence, "seed": self.seed, "notes": self.notes,
                "rows": [{k: clean(v) for k, v in asdict(row).items() if k != "differences"} for row in self.rows]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def to_markdown(self) -> str:
        """One table: a row per (data set, method), then the notes."""
        from st_hardneg.reporting import markdown_table

        def p(value: float) -> str:
            return "-" if math.isnan(value) else (f"{value:.4f}" if value >= 1e-4 else f"{value:.1e}")

        level = f"{100 * self.confidence:g}"
        header = ["data set", "method", "vs", "queries", f"{self.metric} (vs)", f"{self.metric} (method)",
                  "difference", f"{level} % CI", "p randomization", "p t-test", "p rand. (Holm)", "p t (Holm)",
                  "wins / ties / losses"]
        rows = [[r.dataset, r.method, r.baseline, str(r.queries), f"{r.baseline_mean:.2f}", f"{r.method_mean:.2f}",
                 f"{r.mean_difference:+.2f}", f"[{r.ci_low:+.2f}, {r.ci_high:+.2f}]", p(r.p_randomization),
                 p(r.p_ttest), p(r.p_randomization_holm), p(r.p_ttest_holm), f"{r.wins} / {r.ties} / {r.losses}"]
                for r in self.rows]
        notes = [f"Per-query {self.metric} x 100, seeds averaged per query first; paired randomization test with "
                 f"{self.permutations:,} sign flips (exact when 2^n is fewer), paired t-test, BCa bootstrap interval; "
                 f"Holm over the {len(self.rows)} comparisons."] + self.notes
        return markdown_table(header, rows) + "\n" + "\n".join(notes) + "\n"


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (NaN stays NaN and is not counted): the i-th smallest of m p-values
    becomes ``max_{j <= i} min(1, (m - j) * p_(j))`` (0-based j)."""
    indexed = sorted((p, i) for i, p in enumerate(pvalues) if not math.isnan(p))
    m = len(indexed)
    out = [math.nan] * len(pvalues)
    running = 0.0
    for rank, (value, index) in enumerate(indexed):
        running = max(running, min(1.0, (m - rank) * value))
        out[index] = running
    return out


def parse_run_specs(specs: Sequence[str]) -> dict[str, list[str]]:
    """``["A=run_s0.tsv,run_s1.tsv", "B=run.tsv"]`` → ``{"A": [...], "B": [...]}``; a spec without ``=`` is one
    method named after its file (without the suffixes).

    Raises:
        ValueError: an empty name or path, or a method named twice.
    """
    out: dict[str, list[str]] = {}
    for spec in specs:
        name, _, paths = spec.partition("=") if "=" in spec else ("", "", spec)
        files = [p.strip() for p in paths.split(",")]
        if not name:
            name = Path(files[0]).name.split(".")[0]
        if not name.strip() or not all(files):
            raise ValueError(f"run {spec!r}: expected NAME=PATH[,PATH...] or PATH")
        if name in out:
            raise ValueError(f"run {spec!r}: the method {name!r} is named twice")
        out[name] = files
    return out


def _load(source: str | Path | PerQuery) -> tuple[str, dict[str, dict[str, dict[str, float]]]]:
    if isinstance(source, Mapping):
        return "<mapping>", {t: {q: dict(v) for q, v in qs.items()} for t, qs in source.items()}
    path = Path(source)
    if path.is_dir():  # a run folder (st-hardneg train --task beir, or an eval folder): its results file or its file
        found = [path / name for name in ("results.json", "eval.json", "per_query.tsv") if (path / name).is_file()]
        if not found:
            raise RunFormatError(f"{path}: a folder without results.json, eval.json or per_query.tsv (give a run "
                                 "folder of `st-hardneg train --task beir` or the per-query file itself)")
        path = found[0]
    if path.suffix == ".json" and path.is_file():  # a results file: its per-query file beside it
        try:
            recorded = json.loads(path.read_text()).get("files", {}).get("per_query")
        except (json.JSONDecodeError, AttributeError):
            recorded = None
        if not recorded:
            raise RunFormatError(f"{path}: a results file without a per-query file (files.per_query)")
        if not isinstance(recorded, str) or Path(recorded).name != recorded or recorded in (".", ".."):
            raise RunFormatError(f"{path}: files.per_query must name a file beside it, got {recorded!r}")
        path = path.parent / recorded
    return str(path), read_per_query(path)


def _average_seeds(name: str, sources: Sequence[str | Path | PerQuery], metric: str
                   ) -> dict[str, dict[str, float]]:
    """``{task: {query: mean over seeds of metric}}``; every seed must cover the same tasks and queries."""
    loaded = [_load(source) for source in sources]
    first_label, first = loaded[0]
    for label, table in loaded:
        if set(table) != set(first):
            raise ValueError(f"runs of {name!r} cover different data sets: {label} has {sorted(table)}, "
                             f"{first_label} has {sorted(first)}")
        for task, queries in table.items():
            if set(queries) != set(first[task]):
                extra = sorted(set(queries) ^ set(first[task]))
                raise ValueError(f"runs of {name!r} differ in the queries of {task!r}: {label} vs {first_label} "
                                 f"({len(extra)} differ, e.g. {extra[0]!r})")
            missing = [q for q, values in queries.items() if metric not in values]
            if missing:
                raise ValueError(f"{label}: no {metric!r} for query {missing[0]!r} of {task!r}; metrics there: "
                                 f"{sorted(queries[missing[0]])}")
    return {task: {q: float(np.mean([table[task][q][metric] for _, table in loaded])) for q in first[task]}
            for task in first}


def _compare(a: np.ndarray, b: np.ndarray, *, permutations: int, confidence: float, seed: int,
             tolerance: float) -> tuple[float, float, float, float, float, int, int, int]:
    from scipy import stats

    diff = b - a
    mean = float(diff.mean())
    rng = np.random.default_rng(seed)
    test = stats.permutation_test((b, a), lambda x, y, axis: np.mean(x - y, axis=axis), permutation_type="samples",
                                  n_resamples=permutations, vectorized=True, alternative="two-sided",
                                  random_state=rng)
    p_rand = float(test.pvalue)
    if np.all(diff == diff[0]):  # no spread: the interval is the value, the t statistic is undefined
        low = high = mean
        p_t = math.nan
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            boot = stats.bootstrap((diff,), np.mean, confidence_level=confidence, n_resamples=permutations,
                                   method="BCa", random_state=rng)
        low, high = float(boot.confidence_interval.low), float(boot.confidence_interval.high)
        if math.isnan(low) or math.isnan(high):  # BCa undefined (e.g. all values but one equal): percentile
            boot = stats.bootstrap((diff,), np.mean, confidence_level=confidence, n_resamples=permutations,
                                   method="percentile", random_state=rng)
            low, high = float(boot.confidence_interval.low), float(boot.confidence_interval.high)
        p_t = float(stats.ttest_rel(b, a).pvalue)
    wins = int((diff > tolerance).sum())
    losses = int((diff < -tolerance).sum())
    return mean, low, high, p_rand, p_t, wins, len(diff) - wins - losses, losses


def compare_runs(runs: Mapping[str, Sequence[str | Path | PerQuery]], *, metric: str = "ndcg@10",
                 baseline: str | None = None, permutations: int = 10_000, confidence: float = 0.95, seed: int = 0,
                 tie_tolerance: float = 1e-9) -> ComparisonResult:
    """Compare methods on the same queries, per data set (module docstring).

    Args:
        runs: ``{method name: [per-query files or mappings, one per seed]}``; a file is what
            :func:`~st_hardneg.evaluation.runs.write_per_query` writes (or the results JSON that names it). The
            seeds of a method are averaged per query before any test.
        metric: the per-query metric compared (``"ndcg@10"``, ``"mrr@10"``, ``"recall@100"`` …).
        baseline: the method every other one is compared with (default: the first).
        permutations: sign flips drawn by the randomization test (and bootstrap resamples); at least 10,000.
        confidence: the bootstrap interval's level.
        seed: seeds the draws (the result is reproducible).
        tie_tolerance: a per-query difference within it counts as a tie.

    Returns:
        A :class:`ComparisonResult` (``to_markdown()``, ``to_json()``).

    Raises:
        ValueError: fewer than two methods, a method without runs, an unknown baseline, fewer than 10,000
            permutations, runs that cover different data sets or different queries (naming the files), or a file
            without ``metric``.

    Example:
        ::

            from st_hardneg.evaluation import compare_runs

            result = compare_runs({"mnrl": ["mnrl_s0/per_query.tsv", "mnrl_s1/per_query.tsv"],
                                   "recipe": ["recipe_s0/per_query.tsv", "recipe_s1/per_query.tsv"]})
            print(result.to_markdown())
    """
    from st_hardneg.validation import check_count, check_number

    if len(runs) < 2:
        raise ValueError(f"compare needs the runs of at least two methods, got {len(runs)} ({', '.join(runs)})")
    empty = [name for name, sources in runs.items() if not sources or isinstance(sources, str | Path)]
    if empty:
        raise ValueError(f"method {empty[0]!r} needs a list of runs (one per seed)")
    permutations = check_count(permutations, "permutations", minimum=10_000)
    confidence = check_number(confidence, "confidence", minimum=0.5, maximum=1.0, maximum_open=True)
    seed = check_count(seed, "seed", minimum=0)
    tie_tolerance = check_number(tie_tolerance, "tie_tolerance", minimum=0.0)
    for name, given in runs.items():  # one file is one seed: listed twice, it would count twice
        files = [str(Path(s).resolve()) for s in given if isinstance(s, str | Path)]
        twice = sorted({f for f in files if files.count(f) > 1})
        if twice:
            raise ValueError(f"method {name!r} lists {twice[0]} twice: each run (one seed) counts once")
    names = list(runs)
    baseline = names[0] if baseline is None else baseline
    if baseline not in runs:
        raise ValueError(f"baseline {baseline!r} is not one of the methods {names}")
    averaged = {name: _average_seeds(name, runs[name], metric) for name in names}
    reference = averaged[baseline]
    rows: list[DatasetComparison] = []
    for name in names:
        if name == baseline:
            continue
        table = averaged[name]
        if set(table) != set(reference):
            raise ValueError(f"{name!r} and {baseline!r} cover different data sets: {sorted(table)} vs "
                             f"{sorted(reference)}")
        for dataset in reference:
            if set(table[dataset]) != set(reference[dataset]):
                extra = sorted(set(table[dataset]) ^ set(reference[dataset]))
                raise ValueError(f"{name!r} and {baseline!r} differ in the queries of {dataset!r} ({len(extra)} "
                                 f"differ, e.g. {extra[0]!r}): runs over different query sets cannot be paired")
            queries = sorted(reference[dataset])
            if len(queries) < 2:
                raise ValueError(f"{dataset!r} has {len(queries)} query: a paired test needs at least 2 queries")
            a = np.array([reference[dataset][q] for q in queries])
            b = np.array([table[dataset][q] for q in queries])
            mean, low, high, p_rand, p_t, wins, ties, losses = _compare(
                a, b, permutations=permutations, confidence=confidence, seed=seed, tolerance=tie_tolerance)
            rows.append(DatasetComparison(dataset=dataset, baseline=baseline, method=name, queries=len(queries),
                                          baseline_mean=float(a.mean()), method_mean=float(b.mean()),
                                          mean_difference=mean, ci_low=low, ci_high=high, p_randomization=p_rand,
                                          p_ttest=p_t, wins=wins, ties=ties, losses=losses,
                                          differences=[float(v) for v in b - a]))
    for attribute in ("p_randomization", "p_ttest"):
        for row, adjusted in zip(rows, holm([getattr(r, attribute) for r in rows]), strict=True):
            setattr(row, f"{attribute}_holm", adjusted)
    sources = {name: [s if isinstance(s, str) else str(s) if isinstance(s, Path) else "<mapping>"
                      for s in runs[name]] for name in names}
    return ComparisonResult(metric=metric, methods=sources, rows=rows, permutations=permutations,
                            confidence=confidence, seed=seed)
