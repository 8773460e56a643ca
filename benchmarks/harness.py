"""The benchmarks' shared pieces: where the repository, the results and the shared data are, a trial's own folder, and
the figures drawn over seeds. The studies' one runner is :mod:`benchmarks.studies` (it runs, resumes and records
every benchmark's trials); nothing here runs a matrix.

- :func:`trial_folder`: a fresh folder for one trial's files inside its study's work folder, removed after the trial;
- :func:`plot_seed_bars`: one bar per method, mean ± std over seeds with every seed as a dot;
- :func:`plot_seed_comparison`: those bars above each method's difference to a baseline at the same seed, and
  :func:`paired_differences` / :func:`mean_interval` / :func:`draw_differences`, the paired differences it draws;
- :func:`build`: the loss of a row of the table of methods (sentence-transformers' GIST and CachedMNRL included).

The JSON is the record; every ``.md`` / ``.png`` beside it is rendered from it (the study's ``report.outputs``).
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from st_hardneg.data.senteval import data_dir_from_env

#: the repository root, the benchmarks' results folder, and the shared data (``$ST_HARDNEG_DATA``, as for the library
#: and the tests, else ``../shared/data`` beside the repository: SentEval, the corpus, the BEIR folders), the default of
#: every script's ``--data-dir``
REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
SHARED_DATA = Path(data_dir_from_env() or REPO.parent / "shared" / "data")
#: the default training corpus (10k Wikipedia sentences)
WIKI10K = SHARED_DATA / "corpus" / "wiki10k.txt"


@contextmanager
def trial_folder(work_dir: str | Path, name: str) -> Iterator[Path]:
    """A new, empty folder for one trial's files (its checkpoints) inside ``work_dir`` (created when missing), named
    after ``name`` with a suffix of its own, so that it is never a folder that was there before; it is removed, with
    what the trial wrote in it, when the block ends (also on an error). Nothing else under ``work_dir`` is touched.

    Example:
        >>> import tempfile
        >>> with trial_folder(tempfile.mkdtemp(), "mixcse+ctl seed 0") as folder:
        ...     folder.name.startswith("mixcse+ctl_seed_0-"), list(folder.iterdir())
        (True, [])
    """
    parent = Path(work_dir)
    parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=re.sub(r"[^A-Za-z0-9._+@=-]", "_", name) + "-", dir=parent))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


#: the interval drawn around a mean of paired differences (Student's t)
CONFIDENCE = 0.95
#: the note an axis label carries when its axis does not start at 0
NOT_FROM_ZERO = "axis does not start at 0"


def paired_differences(scores: Mapping[Any, float], baseline: Mapping[Any, float]) -> dict[Any, float]:
    """``scores[seed] - baseline[seed]`` at every seed both have (a seed fixes the batches: a paired comparison),
    in seed order; seeds that are ``None`` (an untrained model) pair with nothing.

    Example:
        >>> paired_differences({0: 76.0, 1: 75.5, 2: 75.0}, {0: 75.0, 1: 75.0})
        {0: 1.0, 1: 0.5}
    """
    return {seed: float(scores[seed]) - float(baseline[seed])
            for seed in sorted(s for s in scores if s is not None and s in baseline)}


def mean_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float | None]:
    """The mean of ``values`` and the half-width of its Student-t interval at ``confidence`` (``None`` for a single
    value: one seed has no interval).

    Raises:
        ValueError: no values.

    Example:
        >>> mean, half = mean_interval([1.0, 2.0, 3.0])
        >>> mean, round(half, 4)  # t(0.975, 2) = 4.3027, std 1, sqrt(3)
        (2.0, 2.4841)
    """
    import statistics

    if not values:
        raise ValueError("no values: a mean needs at least one")
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    from scipy import stats

    half = float(stats.t.ppf(0.5 + confidence / 2, len(values) - 1)) * statistics.stdev(values) / len(values) ** 0.5
    return mean, half


def draw_differences(ax: Any, differences: Mapping[str, Mapping[Any, float]], *, vertical: bool = True,
                     color: str = "#3b75af", labels: tuple[str, str] | None = None) -> None:
    """Paired differences on ``ax``, one position per row of ``differences`` (``{row: {seed: difference}}``, in
    order): every seed's difference as a dot, and the mean with its :data:`CONFIDENCE` Student-t interval (a mean
    alone for one seed). ``vertical``: rows along x, differences on y (else rows along y). ``labels``: the legend
    labels of the dots and of the mean (none without)."""
    dot_label, mean_label = labels or (None, None)
    for i, values in enumerate(differences.values()):
        seeds = list(values.values())
        if not seeds:
            ax.text(*((i, 0.0) if vertical else (0.0, i)), "no paired seed", ha="center", va="bottom",
                    fontsize=7, color="#555555", rotation=90 if vertical else 0)
            continue
        at = [i] * len(seeds)
        ax.scatter(*((at, seeds) if vertical else (seeds, at)), color="black", s=10, zorder=3, label=dot_label)
        mean, half = mean_interval(seeds)
        error = None if half is None else [[half], [half]]
        ax.errorbar(*(([i], [mean]) if vertical else ([mean], [i])), **({"yerr": error} if vertical else
                    {"xerr": error}), fmt="D", color=color, ms=6, capsize=4, zorder=2, label=mean_label)
        dot_label = mean_label = None  # one legend entry each


def _include_origin(ax: Any, axis: str, origin: float = 0.0, pad: float = 0.08) -> None:
    """Widen ``ax``'s ``axis`` ("x" / "y") to hold ``origin``, with a margin beyond it where it is the edge."""
    low, high = ax.get_xlim() if axis == "x" else ax.get_ylim()
    low, high = min(low, origin), max(high, origin)
    span = (high - low) or 1.0
    low -= pad * span if low == origin else 0.0
    high += pad * span if high == origin else 0.0
    (ax.set_xlim if axis == "x" else ax.set_ylim)(low, high)


def _draw_seed_bars(ax: Any, per_seed: Mapping[str, Sequence[float]], *, ylabel: str, grey: Sequence[str],
                    reference: tuple[str, float] | None) -> None:
    """:func:`plot_seed_bars`'s drawing on ``ax``; the y-axis label says when the axis does not start at 0."""
    from st_hardneg.reporting import mean_std

    methods = list(per_seed)
    stats = [mean_std([float(v) for v in per_seed[m]]) for m in methods]
    means = [mean for mean, _ in stats]
    stds = [std for _, std in stats]
    x = list(range(len(methods)))
    ax.bar(x, means, yerr=stds, color=["#888888" if m in grey else "#3b75af" for m in methods], capsize=4)
    for i, method in enumerate(methods):
        ax.scatter([i] * len(per_seed[method]), per_seed[method], color="black", s=10, zorder=3)
        ax.text(i, means[i] + stds[i], f"{means[i]:.2f}", ha="center", va="bottom", fontsize=8)
    low = min(min(float(v) for v in per_seed[m]) for m in methods)
    high = max(m + s for m, s in zip(means, stds, strict=True))
    if reference is not None:
        label, value = reference
        ax.axhline(value, color="#c0392b", ls="--", lw=1, label=f"{label} ({value:.2f})")
        ax.legend(loc="lower right")
        low, high = min(low, value), max(high, value)
    span = max(high - low, 1.0)
    bottom = low - 0.3 * span
    ax.set_ylim(bottom, high + 0.2 * span)
    ax.set_xticks(x, methods, rotation=20, ha="right")
    ax.set_ylabel(ylabel if bottom <= 0 else f"{ylabel}\n({NOT_FROM_ZERO})")


def plot_seed_bars(
    per_seed: Mapping[str, Sequence[float]],
    path: str | Path,
    *,
    ylabel: str,
    title: str,
    grey: Sequence[str] = (),
    reference: tuple[str, float] | None = None,
    dpi: int = 120,
) -> Path:
    """Bars of mean ± sample std over seeds, one per method, each seed's score drawn as a dot and the mean written
    above the bar. The y-axis is fitted to the scores; its label says so (":data:`NOT_FROM_ZERO`") when it does not
    start at 0.

    Args:
        per_seed: ``{method: [score of each seed]}`` (bars in this order).
        path: the PNG file to write (parent folders are created).
        ylabel: y-axis label.
        title: figure title.
        grey: methods drawn in grey (baselines); the others in blue.
        reference: ``(label, value)`` of a dashed horizontal line (e.g. the untrained model), or ``None``.
        dpi: resolution.

    Returns:
        The path written.

    Raises:
        ValueError: no method, a method without scores, or a path that is not ``.png``.
    """
    from st_hardneg.plots import _check_png, _figure, _save  # the library's Agg canvas and PNG checks

    path = _check_png(path)
    _check_scores(per_seed)
    fig = _figure(figsize=(max(6.0, 1.1 * len(per_seed)), 4.0))
    ax = fig.subplots()
    _draw_seed_bars(ax, per_seed, ylabel=ylabel, grey=grey, reference=reference)
    ax.set_title(title, fontsize=10)
    return _save(fig, path, dpi)


def _check_scores(per_seed: Mapping[str, Any]) -> None:
    if not per_seed:
        raise ValueError("no method to plot: pass {method: [score per seed]}")
    empty = [m for m, scores in per_seed.items() if not scores]
    if empty:
        raise ValueError(f"method(s) {empty} have no scores")


def plot_seed_comparison(
    per_seed: Mapping[str, Mapping[Any, float]],
    path: str | Path,
    *,
    baseline: str,
    ylabel: str,
    title: str,
    grey: Sequence[str] = (),
    dpi: int = 120,
) -> Path:
    """Two panels over the same methods: above, :func:`plot_seed_bars` of the scores (mean ± std, every seed a dot,
    the baseline's mean a dashed line; the axis fitted to the scores, which its label says); below, each method's
    difference to ``baseline`` at the same seed (every seed a dot, the mean with its 95 % Student-t interval) on an
    axis that holds 0, the baseline. A method without a seed in common with the baseline (an untrained model) has
    no difference drawn; the baseline's own are 0.

    Args:
        per_seed: ``{method: {seed: score}}`` (columns in this order; seed ``None`` for a model without one).
        path: the PNG file to write (parent folders are created).
        baseline: the method the differences are taken to.
        ylabel: what the scores are (both panels' labels are built from it).
        title: figure title.
        grey: methods drawn in grey (baselines); the others in blue.
        dpi: resolution.

    Returns:
        The path written.

    Raises:
        ValueError: no method, a method without scores, a baseline not in ``per_seed``, or a path that is not
        ``.png``.
    """
    from st_hardneg.plots import _check_png, _figure, _save

    path = _check_png(path)
    _check_scores(per_seed)
    if baseline not in per_seed:
        raise ValueError(f"baseline {baseline!r} is not one of the methods {list(per_seed)}")
    import statistics

    fig = _figure(figsize=(max(6.0, 1.1 * len(per_seed)), 7.0))
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [1, 1]})
    scores = {m: list(v.values()) for m, v in per_seed.items()}
    _draw_seed_bars(top, scores, ylabel=ylabel, grey=grey,
                    reference=(f"{baseline} mean", statistics.fmean(scores[baseline])))
    top.set_title(title, fontsize=10)
    top.tick_params(labelbottom=False)
    differences = {m: paired_differences(v, per_seed[baseline]) for m, v in per_seed.items()}  # the baseline's: 0
    draw_differences(bottom, differences, labels=("each seed", f"mean, {CONFIDENCE:.0%} t interval"))
    bottom.axhline(0.0, color="#c0392b", ls="--", lw=1, label=f"0 = {baseline} at the same seed")
    _include_origin(bottom, "y")
    bottom.set_xticks(range(len(per_seed)), list(per_seed), rotation=20, ha="right")
    bottom.set_ylabel(f"difference to {baseline}\n(same seed; axis holds 0)")
    bottom.set_title(f"Paired by seed: each method minus {baseline} (the same batches)", fontsize=10)
    bottom.legend(loc="lower right", fontsize=8)
    bottom.grid(axis="y", color="#dddddd", lw=0.5)
    return _save(fig, path, dpi)


def build(loss_name: str, model, kwargs: dict[str, Any], guide: Callable[[], Any]):
    """The loss ``loss_name`` of a :mod:`benchmarks.methods` row on ``model``: sentence-transformers' GISTEmbedLoss
    (``gist``, guided by ``guide()``, an untrained copy of the model, frozen) and CachedMNRL (``cached_mnrl``, scale
    1 / temperature, 20 by default) here, every other name through ``st_hardneg.training.build_loss``."""
    from st_hardneg.training import build_loss

    if loss_name == "gist":
        from sentence_transformers.sentence_transformer.losses import GISTEmbedLoss

        guide_model = guide()
        guide_model.eval()
        for parameter in guide_model.parameters():
            parameter.requires_grad_(False)
        return GISTEmbedLoss(model, guide_model, **kwargs)
    if loss_name == "cached_mnrl":
        from sentence_transformers.sentence_transformer.losses import CachedMultipleNegativesRankingLoss

        kwargs = dict(kwargs)
        scale = 1.0 / float(kwargs.pop("temperature", 0.05))
        return CachedMultipleNegativesRankingLoss(model, scale=scale, **kwargs)
    return build_loss(loss_name, model, **kwargs)


def data_folder(spec: Any, point: Any, context: Mapping[str, Any], kind: str = "") -> Path:
    """The folder of a trial's dataset (its ``folder`` under ``context["data_dir"]``, the shared data by default).

    Raises:
        ValueError: a dataset without a folder, or a folder that is not there (``kind`` names it: ``"BEIR "``).
    """
    from st_hardneg.training.studies.beir import dataset_folder

    dataset = spec.datasets[point.dataset]
    if dataset.folder is None:
        raise ValueError(f"dataset {point.dataset!r} has no folder: this trial reads a {kind}data folder")
    path = dataset_folder(dataset, context.get("data_dir", SHARED_DATA))
    if not path.is_dir():
        raise ValueError(f"dataset {point.dataset!r}: no {kind}folder at {path}")
    return path
