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

__all__ = ["ComparisonResult", "DatasetComparison", "block_size", "compare_runs", "holm", "parse_run_specs",
           "resolve_run_file"]

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

    A path may hold ``=`` or ``,``: a spec that is an existing path as a whole is one bare path (``runs/lr=2e-5``);
    the part after ``NAME=`` that is an existing path as a whole is one path; otherwise it is split at the commas,
    and pieces are joined back where only their join (``a,b``) exists. A path can also be quoted, ``NAME="a,b"``
    (double quotes, each path on its own between commas). The name is what comes before the first ``=`` and holds no
    ``/``.

    Raises:
        ValueError: an empty name or path, an unclosed quote, or a method named twice.
    """
    out: dict[str, list[str]] = {}
    for spec in specs:
        name, paths = _split_spec(spec)
        files = _split_paths(spec, paths)
        if not name:
            name = Path(files[0]).name.split(".")[0] if files and files[0] else ""
        if not name.strip() or not files or not all(files):
            raise ValueError(f"run {spec!r}: expected NAME=PATH[,PATH...] or PATH")
        if name in out:
            raise ValueError(f"run {spec!r}: the method {name!r} is named twice")
        out[name] = files
    return out


def _split_spec(spec: str) -> tuple[str, str]:
    """``(name, paths)`` of a spec: ``("", spec)`` for a bare path (an existing path, no ``=``, or a ``/`` before the
    first ``=``)."""
    if Path(spec).expanduser().exists() or "=" not in spec:
        return "", spec
    name, _, paths = spec.partition("=")
    if "/" in name or "\\" in name or name.startswith(("'", '"')):  # a path with "=" in it, not a name
        return "", spec
    return name.strip(), paths


def _split_paths(spec: str, paths: str) -> list[str]:
    """The paths of ``NAME=PATHS``: quoted ones as written, else at the commas, joining back pieces whose join is
    an existing path (``a,b`` beside ``a`` and ``b`` that do not exist)."""
    if '"' in paths:
        import csv

        try:
            [fields] = list(csv.reader([paths], delimiter=",", quotechar='"', strict=True))
        except (csv.Error, ValueError):
            raise ValueError(f"run {spec!r}: an unclosed or misplaced quote; quote a whole path, "
                             'NAME="PATH,WITH,COMMAS"') from None
        return [field.strip() for field in fields]
    if Path(paths.strip()).expanduser().exists():
        return [paths.strip()]
    pieces = paths.split(",")
    files: list[str] = []
    start = 0
    while start < len(pieces):
        end = next((stop for stop in range(len(pieces), start + 1, -1)
                    if Path(",".join(pieces[start:stop]).strip()).expanduser().exists()), start + 1)
        files.append(",".join(pieces[start:end]).strip())
        start = end
    return files


def resolve_run_file(source: str | Path) -> Path:
    """The per-query file a run source stands for: the file itself, the ``files.per_query`` of a results file
    (``results.json`` / ``eval.json``), or that of a run folder's results file; resolved (symlinks followed), so
    that one run given as its folder and as its file is recognised as one.

    Raises:
        FileNotFoundError: no such file or folder.
        RunFormatError: a folder without a results or per-query file, a results file that is not UTF-8 JSON or
            names no per-query file beside it.
    """
    path = Path(source).expanduser()
    if path.is_dir():  # a run folder (st-hardneg train --task beir, or an eval folder): its results file or its file
        found = [path / name for name in ("results.json", "eval.json", "per_query.tsv") if (path / name).is_file()]
        if not found:
            raise RunFormatError(f"{path}: a folder without results.json, eval.json or per_query.tsv (give a run "
                                 "folder of `st-hardneg train --task beir` or the per-query file itself)")
        path = found[0]
    if path.suffix == ".json" and path.is_file():  # a results file: its per-query file beside it
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as error:
            raise RunFormatError(f"{path}: the results file is not UTF-8 text ({error.reason}): save it as UTF-8"
                                 ) from None
        except json.JSONDecodeError as error:
            raise RunFormatError(f"{path}: the results file is not JSON ({error.msg}, line {error.lineno})") from None
        files = record.get("files") if isinstance(record, dict) else None
        recorded = files.get("per_query") if isinstance(files, dict) else None
        if not recorded:
            raise RunFormatError(f"{path}: a results file without a per-query file (files.per_query)")
        if not isinstance(recorded, str) or Path(recorded).name != recorded or recorded in (".", ".."):
            raise RunFormatError(f"{path}: files.per_query must name a file beside it, got {recorded!r}")
        path = path.parent / recorded
    if not path.exists():
        raise FileNotFoundError(f"run not found: {path}")
    return path.resolve()


def _load(source: str | Path | PerQuery) -> tuple[str, dict[str, dict[str, dict[str, float]]]]:
    if isinstance(source, Mapping):
        return "<mapping>", {t: {q: dict(v) for q, v in qs.items()} for t, qs in source.items()}
    path = resolve_run_file(source)
    return str(path), read_per_query(path)


def _distinct_runs(name: str, given: Sequence[str | Path | PerQuery]) -> list[str | Path | PerQuery]:
    """The runs of one method, each counted once: the same path given twice is refused (a slip), one run given as
    two spellings (its folder and its ``results.json`` or ``per_query.tsv``) is kept once, with a warning."""
    paths = [str(Path(s).expanduser().resolve()) for s in given if isinstance(s, str | Path)]
    twice = sorted({f for f in paths if paths.count(f) > 1})
    if twice:
        raise ValueError(f"method {name!r} lists {twice[0]} twice: each run (one seed) counts once")
    kept: list[str | Path | PerQuery] = []
    seen: dict[Path, str | Path] = {}
    for source in given:
        if isinstance(source, str | Path):
            file = resolve_run_file(source)
            if file in seen:
                warnings.warn(f"method {name!r}: {source} is the run {seen[file]} already lists (both are {file}); "
                              "it counts once", UserWarning, stacklevel=3)
                continue
            seen[file] = source
        kept.append(source)
    return kept


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


#: the values one block of the paired tests holds (resamples x queries): about 16 MB of indices and values at once,
#: whatever the number of queries and permutations
BLOCK_ELEMENTS = 1 << 20


def block_size(permutations: int, queries: int, elements: int = BLOCK_ELEMENTS) -> int:
    """The sign flips (and bootstrap resamples) computed at once: the largest divisor of ``permutations`` whose block
    of ``block x queries`` values fits in ``elements`` (at least 1).

    A divisor, because scipy draws a whole block of sign flips at a time: a last block cut short would draw more
    random numbers than the test uses and shift the bootstrap's draws that follow it on the same generator. With a
    divisor, the blocks draw exactly the numbers one all-at-once call draws, in the same order, so the p-values and
    the interval are those of the unblocked computation for the same seed.
    """
    limit = max(1, min(permutations, elements // max(1, queries)))
    return next(size for size in range(limit, 0, -1) if permutations % size == 0)


def _compare(a: np.ndarray, b: np.ndarray, *, permutations: int, confidence: float, seed: int,
             tolerance: float, block: int | None = None) -> tuple[float, float, float, float, float, int, int, int]:
    """The paired tests of one data set, computed ``block`` resamples at a time (default :func:`block_size`): memory
    is O(block x queries), never O(permutations x queries)."""
    from scipy import stats

    diff = b - a
    mean = float(diff.mean())
    rng = np.random.default_rng(seed)
    block = block_size(permutations, len(diff)) if block is None else block
    test = stats.permutation_test((b, a), lambda x, y, axis: np.mean(x - y, axis=axis), permutation_type="samples",
                                  n_resamples=permutations, vectorized=True, alternative="two-sided",
                                  random_state=rng, batch=block)
    p_rand = float(test.pvalue)
    if np.all(diff == diff[0]):  # no spread: the interval is the value, the t statistic is undefined
        low = high = mean
        p_t = math.nan
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            boot = stats.bootstrap((diff,), np.mean, confidence_level=confidence, n_resamples=permutations,
                                   method="BCa", random_state=rng, batch=block)
        low, high = float(boot.confidence_interval.low), float(boot.confidence_interval.high)
        if math.isnan(low) or math.isnan(high):  # BCa undefined (e.g. all values but one equal): percentile
            boot = stats.bootstrap((diff,), np.mean, confidence_level=confidence, n_resamples=permutations,
                                   method="percentile", random_state=rng, batch=block)
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
            :func:`~st_hardneg.evaluation.runs.write_per_query` writes, the results JSON that names it, or a run
            folder (:func:`resolve_run_file`). The seeds of a method are averaged per query before any test; one run
            given twice under two spellings (its folder and its file) counts once, with a warning.
        metric: the per-query metric compared (``"ndcg@10"``, ``"mrr@10"``, ``"recall@100"`` …).
        baseline: the method every other one is compared with (default: the first).
        permutations: sign flips drawn by the randomization test (and bootstrap resamples); at least 10,000. They
            are computed in blocks (:func:`block_size`), so memory does not grow with permutations x queries, and
            the p-values and interval are those of the all-at-once computation for the same seed.
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
    runs = {name: _distinct_runs(name, given) for name, given in runs.items()}  # one run is one seed, counted once
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
