"""The benchmarks' shared harness: the method x seed matrix, resumed from the results JSON, and its output.

- :func:`run_pending`: the resumable loop: every (method, seed) not yet in ``data["runs"]`` is run, appended and saved
  at once, so an interrupted benchmark resumes where it stopped;
- :func:`benchmark_jobs` and :func:`parse_variant`: the methods of a script's table (its rows of the one table of
  methods, :mod:`benchmarks.methods`, e.g. ``benchmarks.cpu_protocol.METHODS``) and the ``--variant LABEL=LOSS:k=v,...``
  syntax;
- :func:`resume`: the results file to resume from, refused when it was made under another protocol;
- :func:`plot_seed_bars`: one bar per method, mean ± std over seeds with every seed as a dot;
- :func:`build`: the loss of a row of the table of methods (sentence-transformers' GIST and CachedMNRL included);

The JSON is the record; every ``.md`` / ``.png`` beside it is rendered from it (``--report`` of each script).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
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


def resume(path: str | Path, protocol: dict[str, Any]) -> dict[str, Any]:
    """The results file at ``path`` (or a new one) for ``protocol``.

    Raises:
        ValueError: the file was made under another protocol (the message names the changed keys).
    """
    from st_hardneg.reporting import load_results

    data = load_results(path, protocol)
    stored = data.get("protocol", {})
    if stored != protocol:
        changed = sorted(k for k in set(protocol) | set(stored) if stored.get(k) != protocol.get(k))
        raise ValueError(f"the results file {path} was made under another protocol (changed: {', '.join(changed)}); "
                         "move it away or restore the protocol before resuming")
    return data


def parse_variant(spec: str) -> tuple[str, str, dict[str, Any]]:
    """A benchmark's ``--variant`` ``label=loss:key=value,key=value`` → ``(label, loss, kwargs)``.

    Raises:
        ValueError: no label or no loss, or a malformed ``key=value``.
    """
    from st_hardneg.training.registry import parse_loss_args

    label, _, rest = spec.partition("=")
    loss, _, args = rest.partition(":")
    if not label or not loss:
        raise ValueError(f"--variant expects LABEL=LOSS[:k=v,k=v], got {spec!r}")
    return label, loss, parse_loss_args([a for a in args.split(",") if a])


def run_pending(
    data: dict[str, Any],
    jobs: Sequence[tuple],
    seeds: Sequence[int],
    run: Callable[[tuple, int], dict[str, Any]],
    save: Callable[[dict[str, Any]], None],
    where: str = "the results",
    untrained: Callable[[], dict[str, Any]] | None = None,
) -> None:
    """The benchmarks' resumable loop: for every seed, every job (``(label, ...)``) whose ``(label, seed)`` has no
    run in ``data["runs"]`` yet is run with ``run(job, seed)``, appended and saved with ``save(data)`` at once, so an
    interrupted benchmark resumes where it stopped; finished ones are reported as skipped. A run whose loss refuses a
    batch with no usable row (``ValueError``, e.g. a margin that masks every negative) is recorded as
    ``{"method", "seed", "failed": message}`` and the loop goes on; other errors propagate. ``untrained()`` (if given)
    makes the reference row of method ``"untrained"``, put first, when there is none yet."""
    if untrained is not None and not any(r["method"] == "untrained" for r in data["runs"]):
        data["runs"].insert(0, untrained())
        save(data)
    for seed in seeds:
        for job in jobs:
            label = job[0]
            if any(r["method"] == label and r["seed"] == seed for r in data["runs"]):
                print(f"skip {label} seed {seed}: already in {where}", flush=True)
                continue
            print(f"=== {label} seed {seed}", flush=True)
            try:
                data["runs"].append(run(job, seed))
            except ValueError as error:
                if "no usable row in this batch" not in str(error):
                    raise
                # a configuration that leaves no usable row (every negative masked) is a result, not a crash: it is
                # recorded as failed, reported under the tables and never selected; the other runs go on
                print(f"    failed: {error}", flush=True)
                data["runs"].append({"method": label, "seed": seed, "failed": str(error)})
            save(data)


def benchmark_jobs(methods: Sequence[str], table: dict[str, tuple[str, dict[str, Any]]],
                   variants: Sequence[str] = ()) -> list[tuple[str, str, dict[str, Any]]]:
    """``(label, loss name, hyperparameters)`` of each method in ``table`` and each ``--variant`` spec.

    Raises:
        ValueError: a method not in ``table`` or a malformed variant.
    """
    jobs = []
    for method in methods:
        if method not in table:
            raise ValueError(f"unknown method {method!r}; choose from {', '.join(table)}")
        jobs.append((method, *table[method]))
    return jobs + [parse_variant(spec) for spec in variants]


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
    above the bar.

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
    from st_hardneg.reporting import mean_std

    path = _check_png(path)
    if not per_seed:
        raise ValueError("no method to plot: pass {method: [score per seed]}")
    empty = [m for m, scores in per_seed.items() if not scores]
    if empty:
        raise ValueError(f"method(s) {empty} have no scores")
    methods = list(per_seed)
    stats = [mean_std([float(v) for v in per_seed[m]]) for m in methods]
    means = [mean for mean, _ in stats]
    stds = [std for _, std in stats]
    fig = _figure(figsize=(max(6.0, 1.1 * len(methods)), 4.0))
    ax = fig.subplots()
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
    ax.set_ylim(low - 0.3 * span, high + 0.2 * span)
    ax.set_xticks(x, methods, rotation=20, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
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
