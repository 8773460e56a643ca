"""Plot helpers (matplotlib, Agg backend) that write PNG files.

Figures are drawn on matplotlib's Agg canvas directly (``matplotlib.figure.Figure``), never through ``pyplot``: the
helpers work headless and leave the caller's backend and open figures alone (e.g. inline plots in a notebook).

- :func:`plot_alignment_uniformity`: the alignment–uniformity plane (SimCSE Fig. 2, MixCSE Fig. 5, AdCSE Fig. 3),
  one point per model, coloured by its STS average.
- :func:`plot_training_curves`: metrics over training steps (STS-B dev Spearman, loss, the cosines logged by
  :class:`~st_hardneg.training.callbacks.LossDiagnosticsCallback`), from ``trainer.state.log_history`` or lists of dicts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

#: log_history keys that are bookkeeping, not metrics
_NOT_METRICS = {"step", "epoch", "total_flos", "train_runtime", "train_samples_per_second", "train_steps_per_second",
                "eval_runtime", "eval_samples_per_second", "eval_steps_per_second", "train_loss"}


def _figure(**kwargs: Any) -> Figure:
    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig


def _check_png(path: str | Path) -> Path:
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ValueError(f"plots are written as PNG; got {str(path)!r}")
    return path


def _save(fig: Figure, path: Path, dpi: int, inside: str | Path | None = None) -> Path:
    """Write ``fig`` as PNG through the output-folder guard: atomically, inside ``inside`` (default: ``path``'s own
    folder), never through a symbolic link (:func:`st_hardneg.reporting.atomic_write`)."""
    from st_hardneg.reporting import atomic_write

    with atomic_write(path, inside) as handle:
        fig.savefig(handle, format="png", dpi=dpi, bbox_inches="tight",
                    metadata={"Software": None})  # no version stamp: the same figure, the same bytes
    return path


def plot_alignment_uniformity(
    points: Mapping[str, Mapping[str, float]],
    path: str | Path,
    *,
    score_key: str = "sts_avg",
    title: str = "Alignment vs. uniformity (STS-B; lower is better on both axes)",
    dpi: int = 150,
) -> Path:
    """Scatter of models in the alignment–uniformity plane, coloured by their STS average.

    Args:
        points: ``{model name: {"alignment": a, "uniformity": u, "sts_avg": s}}``; the first two as returned by
            :func:`~st_hardneg.evaluation.alignment_uniformity`. ``score_key`` may be missing for some models
            (drawn hollow, without colour).
        path: the PNG file to write (parent folders are created).
        score_key: the key of the colour value (e.g. ``"avg"`` of :func:`~st_hardneg.evaluation.evaluate_sts`).
        title: figure title.
        dpi: resolution.

    Returns:
        The path written.

    Example:
        ::

            from st_hardneg.plots import plot_alignment_uniformity

            points = {"MiniLM (CLS)": {**alignment_uniformity(base, data), "sts_avg": 61.2},
                      "+ MixCSE": {**alignment_uniformity(tuned, data), "sts_avg": 74.5}}
            plot_alignment_uniformity(points, "figures/align_uniform.png")
    """
    path = _check_png(path)
    if not points:
        raise ValueError("no points to plot: pass {model name: {'alignment': ..., 'uniformity': ...}}")
    for name, point in points.items():
        missing = [k for k in ("alignment", "uniformity") if k not in point]
        if missing:
            raise ValueError(f"point {name!r} lacks {missing}; use alignment_uniformity(model, data_dir)")
    fig = _figure(figsize=(6.4, 4.8))
    ax = fig.subplots()
    scored = {n: p for n, p in points.items() if p.get(score_key) is not None}
    unscored = {n: p for n, p in points.items() if p.get(score_key) is None}
    if scored:
        values = [float(p[score_key]) for p in scored.values()]
        lo, hi = min(values), max(values)
        if lo == hi:
            lo, hi = lo - 0.5, hi + 0.5
        sc = ax.scatter([p["uniformity"] for p in scored.values()], [p["alignment"] for p in scored.values()],
                        c=values, cmap="viridis", vmin=lo, vmax=hi, s=90, edgecolors="black", linewidths=0.6,
                        zorder=3)
        fig.colorbar(sc, ax=ax, label=f"STS ({score_key})")
    if unscored:
        ax.scatter([p["uniformity"] for p in unscored.values()], [p["alignment"] for p in unscored.values()],
                   facecolors="none", edgecolors="gray", s=90, zorder=3, label="no STS score")
        ax.legend(loc="best", fontsize=8)
    xs = [p["uniformity"] for p in points.values()]
    middle = (min(xs) + max(xs)) / 2
    for name, p in points.items():
        label = name if p.get(score_key) is None else f"{name} ({float(p[score_key]):.1f})"
        right_half = p["uniformity"] > middle and len(points) > 1  # labels point inwards, away from the frame
        ax.annotate(label, (p["uniformity"], p["alignment"]), textcoords="offset points",
                    xytext=(-7, 6) if right_half else (7, 6), ha="right" if right_half else "left", fontsize=8)
    ax.set_xlabel(r"$\ell_{\mathrm{uniform}}$ (uniformity)")
    ax.set_ylabel(r"$\ell_{\mathrm{align}}$ (alignment)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.margins(0.15)
    return _save(fig, path, dpi)


def _as_runs(history: Any) -> dict[str, list[dict[str, Any]]]:
    if hasattr(history, "log_history"):  # a TrainerState
        history = history.log_history
    if isinstance(history, Mapping):
        return {str(name): list(cast(Iterable[dict[str, Any]], getattr(h, "log_history", h)))
                for name, h in history.items()}
    return {"": list(history)}


def plot_training_curves(
    history: Any,
    path: str | Path,
    metrics: Sequence[str] | None = None,
    *,
    title: str | None = None,
    dpi: int = 150,
    inside: str | Path | None = None,
) -> Path:
    """Metrics over training steps, one panel per metric, one line per run.

    Args:
        history: ``trainer.state.log_history`` (a list of dicts with a ``"step"`` key), a ``TrainerState``, or
            ``{run name: log_history}`` to compare runs.
        path: the PNG file to write (parent folders are created).
        metrics: keys to plot (e.g. ``["eval_sts-dev_spearman", "loss", "cos_positive", "cos_negative"]``);
            default: every numeric key found except bookkeeping (step, epoch, runtimes …).
        title: figure title.
        dpi: resolution.
        inside: the output folder the file must stay inside (default: its own folder): a symbolic link out of it, or
            a dangling one, is refused (:func:`st_hardneg.reporting.check_output_path`).

    Returns:
        The path written.

    Raises:
        ValueError: no entry has a step, or a requested metric never occurs; ``path`` leads out of ``inside``.

    Example:
        ::

            from st_hardneg.plots import plot_training_curves

            plot_training_curves({"SimCSE": simcse_trainer.state.log_history,
                                  "MixCSE": mixcse_trainer.state.log_history},
                                 "figures/curves.png", metrics=["eval_sts-dev_spearman", "cos_negative"])
    """
    path = _check_png(path)
    runs = _as_runs(history)
    found: dict[str, None] = {}
    for entries in runs.values():
        for entry in entries:
            if "step" not in entry:
                continue
            for key, value in entry.items():
                if key not in _NOT_METRICS and isinstance(value, (int, float)) and not isinstance(value, bool):
                    found[key] = None
    if not found:
        raise ValueError("no metric with a 'step' in the history; pass trainer.state.log_history")
    if metrics is None:
        metrics = list(found)
    else:
        missing = [m for m in metrics if m not in found]
        if missing:
            raise ValueError(f"metric(s) {missing} not in the history; available: {', '.join(found)}")
    cols = min(3, len(metrics))
    rows = math.ceil(len(metrics) / cols)
    fig = _figure(figsize=(4.6 * cols, 3.3 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, metric in zip(axes.flat, metrics, strict=False):
        for name, entries in runs.items():
            points = sorted((e["step"], float(e[metric])) for e in entries if metric in e and "step" in e)
            if points:
                steps, values = zip(*points, strict=True)
                ax.plot(steps, values, marker="o" if len(points) < 30 else None, markersize=3,
                        label=name or None)
        ax.set_title(metric, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        if len(runs) > 1:
            ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(metrics):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path, dpi, inside)


def plot_comparison(result: Any, path: str | Path, *, dpi: int = 150) -> Path:
    """The per-query differences of a comparison (:func:`st_hardneg.evaluation.compare.compare_runs`): one row per
    (data set, method), each query a dot (method - baseline, x 100), the mean as a bar with its bootstrap interval,
    zero marked; the wins / ties / losses beside it.

    Args:
        result: a :class:`~st_hardneg.evaluation.compare.ComparisonResult`.
        path: the PNG file to write.
        dpi: resolution.

    Returns:
        The path written.
    """
    import numpy as np

    path = _check_png(path)
    rows = list(result.rows)
    if not rows:
        raise ValueError("the comparison has no rows to draw")
    fig = _figure(figsize=(7.5, 1.0 + 0.8 * len(rows)))
    ax = fig.subplots()
    jitter = np.random.default_rng(0)
    for y, row in enumerate(rows):
        values = np.asarray(row.differences, dtype=float)
        ax.scatter(values, y + jitter.uniform(-0.22, 0.22, len(values)), s=6, alpha=0.35, color="tab:gray",
                   linewidths=0)
        ax.errorbar([row.mean_difference], [y], xerr=[[row.mean_difference - row.ci_low],
                                                      [row.ci_high - row.mean_difference]],
                    fmt="o", color="tab:red", capsize=4, markersize=5)
        ax.annotate(f"{row.mean_difference:+.2f} [{row.ci_low:+.2f}, {row.ci_high:+.2f}]  "
                    f"{row.wins}/{row.ties}/{row.losses}", (1.01, y), xycoords=("axes fraction", "data"),
                    va="center", fontsize=8)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(rows)), [f"{row.dataset}\n{row.method} vs {row.baseline}" for row in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"per-query {result.metric} difference (x 100); red: mean, {100 * result.confidence:g} % interval; "
                  "right: mean [interval] wins/ties/losses", fontsize=8)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return _save(fig, path, dpi)


#: the fewest logged loss values a run's curve is drawn from (:func:`plot_run_curve`)
MIN_CURVE_POINTS = 2


def plot_run_curve(log_history: Sequence[Mapping[str, Any]], path: str | Path, *, title: str | None = None,
                   dpi: int = 150, inside: str | Path | None = None) -> Path | None:
    """A training run's curve beside its ``results.json``: the training loss and, when the run was evaluated, its dev
    metric(s), per step (:func:`plot_training_curves` on the metrics the run logged), written inside ``inside``
    (default: its own folder). Returns ``None`` when the run logged its loss at fewer than :data:`MIN_CURVE_POINTS`
    steps (a run shorter than twice ``logging_steps``): one point is not a curve."""
    logged = [entry for entry in log_history if "step" in entry]
    metrics = [key for key in ("loss", "grad_norm", "learning_rate") if any(key in e for e in logged)]
    metrics += sorted({key for e in logged for key in e if key.startswith("eval_") and key.endswith(("spearman",
                                                                                                    "ndcg@10"))})
    if sum(1 for entry in logged if "loss" in entry) < MIN_CURVE_POINTS:
        return None
    return plot_training_curves(logged, path, metrics=metrics, title=title, dpi=dpi, inside=inside)
