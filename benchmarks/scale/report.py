"""The report half of ``benchmarks.scale``: the configuration keys, the summary with its target ratios, the markdown
table and the plot of a scale results file (no torch import)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: ST's CachedMultipleNegativesRankingLoss, the reference of the cached step time
REFERENCE = "cached_mnrl"
#: the same with both directions (``per_direction``): the like-for-like reference of MixCSE's benchmark form, which is
#: two-way; listed beside the others, not judged against the targets
REFERENCE_TWO_WAY = "cached_mnrl_two_way"
REFERENCES = (REFERENCE, REFERENCE_TWO_WAY)
#: targets, as ratios in one run: the cached peak at the largest batch / at batch 64; the cached peak and
#: step time / cached_mnrl's at the same batch (the step time from batch TIME_FROM_BATCH on); 2 processes / 1 process
#: at the same global batch
MEMORY_TARGET = 1.3
PEAK_TARGET = 1.2
TIME_TARGET = 1.15
TIME_FROM_BATCH = 1024
DDP_TARGET = 0.6


def config_key(method: str, variant: str, batch: int, processes: int = 1) -> str:
    return f"{method}/{variant}/b{batch}" + (f"/p{processes}" if processes > 1 else "")


def _fmt(value: float | None, spec: str = ".0f") -> str:
    return "–" if value is None else format(value, spec)


def _ok(runs: dict[str, Any], key: str) -> dict[str, Any] | None:
    run = runs.get(key)
    return run if run is not None and run.get("status") == "ok" else None


def summarize(data: dict[str, Any]) -> dict[str, Any]:
    """Rows of the single-process table, the target checks and the 2-process comparison, from ``data["runs"]``."""
    runs = data["runs"]
    single = [r for r in runs.values() if r.get("processes", 1) == 1]
    methods = list(dict.fromkeys(r["method"] for r in single))
    batches = sorted({r["batch_size"] for r in single})
    rows, memory, timing, peaks = [], [], [], []
    for method in methods:
        for batch in batches:
            un = _ok(runs, config_key(method, "uncached", batch))
            ca = _ok(runs, config_key(method, "cached", batch))
            ref = _ok(runs, config_key(REFERENCE, "cached", batch))
            cached_run = runs.get(config_key(method, "cached", batch))
            uncached_run = runs.get(config_key(method, "uncached", batch))
            time_ratio = ca["step_ms"] / ref["step_ms"] if ca and ref else None
            rows.append({"method": method, "batch_size": batch,
                         "uncached_step_ms": un and un["step_ms"], "uncached_peak_mb": un and un["peak_mb"],
                         "cached_step_ms": ca and ca["step_ms"], "cached_peak_mb": ca and ca["peak_mb"],
                         "cached_default_malloc_peak_mb": ca and ca.get("default_malloc_peak_mb"),
                         "cached_status": cached_run["status"] if cached_run else "not run",
                         "uncached_status": uncached_run["status"] if uncached_run else "not run",
                         "cached_time_vs_reference": time_ratio})
            if time_ratio is not None and method not in REFERENCES:
                timing.append({"method": method, "batch_size": batch, "ratio": time_ratio,
                               "meets_target": time_ratio <= TIME_TARGET if batch >= TIME_FROM_BATCH else None})
            if ca and ref and method not in REFERENCES:
                ratio = ca["peak_mb"] / max(ref["peak_mb"], 1e-9)
                peaks.append({"method": method, "batch_size": batch, "ratio": ratio, "meets_target": ratio <= PEAK_TARGET})
        cached = {b: _ok(runs, config_key(method, "cached", b)) for b in batches}
        measured = [b for b in batches if cached[b]]
        if len(measured) >= 2:
            low, high = measured[0], measured[-1]
            ratio = cached[high]["peak_mb"] / max(cached[low]["peak_mb"], 1e-9)
            memory.append({"method": method, "from_batch": low, "to_batch": high, "ratio": ratio,
                           "meets_target": ratio <= MEMORY_TARGET})
    ddp = []
    for run in runs.values():
        if run.get("processes", 1) < 2:
            continue
        one = _ok(runs, config_key(run["method"], run["variant"], run["batch_size"]))
        two = run if run.get("status") == "ok" else None
        ddp.append({"method": run["method"], "variant": run["variant"], "global_batch": run["batch_size"],
                    "processes": run["processes"], "status": run["status"],
                    "one_process_ms": one and one["step_ms"], "two_process_ms": two and two["step_ms"],
                    "ratio": two["step_ms"] / one["step_ms"] if one and two else None,
                    "two_process_peak_mb": two and two["peak_mb"],
                    "round_ratios": _round_ratios(one, two)})
    for row in ddp:
        row["meets_target"] = None if row["ratio"] is None else row["ratio"] <= DDP_TARGET
    return {"rows": rows, "memory": memory, "timing": timing, "peaks": peaks, "ddp": ddp}


def _round_ratios(one: dict[str, Any] | None, two: dict[str, Any] | None) -> list[float]:
    """Round by round, 2 processes' step over 1 process's, where both were timed in several (interleaved) rounds."""
    if not one or not two:
        return []
    first, second = one.get("step_ms_rounds") or [], two.get("step_ms_rounds") or []
    if min(len(first), len(second)) < 2:
        return []
    return [b / a for a, b in zip(first, second, strict=False)]  # a failed round leaves one side shorter


def _steps_text(data: dict[str, Any]) -> str:
    """"3 steps", or with configurations timed over different numbers of steps "3 steps (batch 65536: 2)", naming
    the variant where a batch's variants differ: "3 steps (cached batch 1024: 9)"."""
    default = data.get("_meta", {}).get("steps")
    by_group: dict[tuple[int, str], set[int]] = {}
    for run in data["runs"].values():
        by_group.setdefault((run["batch_size"], run.get("variant", "")), set()).add(run.get("steps", default))
    counts = [c for steps in by_group.values() for c in steps if c is not None]
    if not counts:
        return f"{default} steps"
    common = max(set(counts), key=counts.count)
    extra = []
    for batch in sorted({b for b, _ in by_group}):
        groups = {v: s - {None} for (b, v), s in sorted(by_group.items()) if b == batch}
        if not any(s - {common} for s in groups.values()):
            continue
        if len({frozenset(s) for s in groups.values()}) == 1:  # every variant alike: name the batch only
            extra.append(f"batch {batch}: {', '.join(map(str, sorted(next(iter(groups.values())) - {common})))}")
        else:
            extra += [f"{v} batch {batch}: {', '.join(map(str, sorted(s - {common})))}"
                      for v, s in groups.items() if s - {common}]
    return f"{common} steps" + (f" ({'; '.join(extra)})" if extra else "")


def _rounds_text(data: dict[str, Any]) -> str:
    """A sentence on the configurations timed in several interleaved rounds (``benchmarks.scale --rounds``), else ''."""
    rounds = sorted({len(r["step_ms_rounds"]) for r in data["runs"].values() if len(r.get("step_ms_rounds") or []) > 1})
    if not rounds:
        return ""
    return (f" Rounds: some configurations were timed in {' or '.join(map(str, rounds))} interleaved rounds "
            "(`scale.py --rounds`: every configuration once per round, in turn, so that a drift of the machine's "
            "speed hits them alike); their step is the median of the rounds' steps, and the 2-process table lists "
            "each round's ratio where both sides have rounds.")


def _met(value: bool | None) -> str:
    return "–" if value is None else ("yes" if value else "**no**")


def markdown(data: dict[str, Any]) -> str:
    from st_hardneg.reporting import markdown_table

    meta = data.get("_meta", {})
    summary = summarize(data)
    names = loss_names(data)

    def name(method: str) -> str:
        return names.get(method, method)

    out = []
    mbs = meta.get("mini_batch_size", "mini_batch_size")
    header = ["method", "batch", "uncached step (ms)", "uncached peak (MB)", f"cached ({mbs}) step (ms)",
              "cached peak (MB)", "cached peak, default malloc (MB)", f"cached step / {REFERENCE}"]
    body = []
    for row in summary["rows"]:
        cached_ms = _fmt(row["cached_step_ms"]) if row["cached_status"] in ("ok", "not run") else row["cached_status"]
        ratio = row["cached_time_vs_reference"]
        uncached_ms = _fmt(row["uncached_step_ms"]) if row["uncached_status"] in ("ok", "not run") \
            else row["uncached_status"]
        body.append([name(row["method"]), row["batch_size"], uncached_ms, _fmt(row["uncached_peak_mb"]),
                     cached_ms, _fmt(row["cached_peak_mb"]), _fmt(row["cached_default_malloc_peak_mb"]),
                     "–" if ratio is None else f"{ratio:.2f}×"])
    out.append(markdown_table(header, body, align=["l", "r", "r", "r", "r", "r", "r", "r"]))
    if summary["memory"]:
        body = [[name(m["method"]), f"{m['from_batch']} → {m['to_batch']}", f"{m['ratio']:.2f}×",
                 _met(m["meets_target"])] for m in summary["memory"]]
        out.append(markdown_table(["method", "batch", f"cached peak ratio (target ≤ {MEMORY_TARGET}×)", "met"], body))
    if summary.get("peaks"):
        body = [[name(t["method"]), t["batch_size"], f"{t['ratio']:.2f}×", _met(t["meets_target"])]
                for t in summary["peaks"]]
        out.append(markdown_table(["method", "batch", f"cached peak / {REFERENCE}'s (target ≤ {PEAK_TARGET}×)",
                                   "met"], body))
    if summary["timing"]:
        body = [[name(t["method"]), t["batch_size"], f"{t['ratio']:.2f}×", _met(t["meets_target"])]
                for t in summary["timing"]]
        out.append(markdown_table(["method", "batch", f"cached step / {REFERENCE} (target ≤ {TIME_TARGET}× from "
                                   f"batch {TIME_FROM_BATCH})", "met"], body))
    if summary["ddp"]:
        by_round = any(d["round_ratios"] for d in summary["ddp"])
        body = [[name(d["method"]), d["variant"], d["global_batch"], _fmt(d["one_process_ms"]),
                 _fmt(d["two_process_ms"]) if d["status"] == "ok" else d["status"],
                 "–" if d["ratio"] is None else f"{d['ratio']:.2f}×",
                 *([", ".join(f"{r:.2f}" for r in d["round_ratios"]) or "–"] if by_round else []),
                 _met(d["meets_target"]), _fmt(d["two_process_peak_mb"])] for d in summary["ddp"]]
        out.append(markdown_table(["method", "variant", "global batch", "1 process step (ms)",
                                   "2 processes step (ms)", f"2 / 1 (target ≤ {DDP_TARGET}×)",
                                   *(["2 / 1 per round"] if by_round else []), "met", "peak per process (MB)"],
                                  body))
    if meta:
        out.append(f"{meta.get('model')}, max_seq_length {meta.get('max_seq_length')}, {_steps_text(data)} per "
                   f"configuration (the first a warm-up; step = median of the rest), torch {meta.get('torch')}, "
                   f"{meta.get('torch_threads')} torch thread(s) in 1 process, {meta.get('torch_threads_per_process_ddp')} "
                   f"per process in 2, on {meta.get('cpu_count')} CPU cores. "
                   "Peak = resident memory high-water mark over 2 steps minus the resident memory before them (gradients + "
                   "AdamW state + activations), in a separate run with glibc's mmap threshold fixed at 128 KiB so "
                   "that freed buffers leave the resident set; \"default malloc\" = the same mark over the timed "
                   "steps with glibc's defaults (its dynamic mmap threshold keeps freed per-chunk buffers in the heap, "
                   "so this one also counts the heap's growth); 2 processes: gloo, gather_across_devices, half the "
                   f"global batch each, step time of the slower rank.{_rounds_text(data)}\n")
    return "\n".join(out)


def loss_names(data: dict[str, Any]) -> dict[str, str]:
    """``{method label: the name its rows are shown under}``: today's registry name of the loss the label's records
    trained (:func:`benchmarks.methods.benchmark_loss`; a ``mixcse`` row of these benchmarks is ``mixcse_two_way``),
    or the label where no record says (a reference). The JSON keeps the labels the runs were recorded under.

    Raises:
        ValueError: the records of one label trained different losses (one row cannot name them).
    """
    from benchmarks.methods import benchmark_loss

    names: dict[str, set[str]] = {}
    for run in data.get("runs", {}).values():
        names.setdefault(run["method"], set()).add(benchmark_loss(run))
    out = {}
    for method, losses in names.items():
        if len(losses) != 1:
            raise ValueError(f"the runs recorded as {method!r} trained {sorted(losses)}; give each its own label")
        out[method] = losses.pop()
    return out


def plot(data: dict[str, Any], path: Path) -> Path | None:
    """Three panels, each titled by what it draws: (a) peak memory over the baseline per method and batch, cached
    (solid) and uncached (dashed) where measured, on a log axis when they lie decades apart (the label says which);
    (b) and (c) the paired comparison, each
    loss's cached peak and step over CachedMNRL's at the same batch and run, with CachedMNRL at 1 (these axes do not
    start at 0, which the axis labels say)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = summarize(data)
    rows = summary["rows"]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    if not methods:
        return None
    colors = {method: f"C{index % 10}" for index, method in enumerate(methods)}
    names = loss_names(data)
    label = {method: names.get(method, method) for method in methods}
    batches = sorted({r["batch_size"] for r in rows})
    uncached = any(r["uncached_peak_mb"] is not None for r in rows)
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.6))
    memory, peak_ratio, step_ratio = axes
    labelled: set[str] = set()
    for method in methods:
        for variant, style in (("cached", "-"), ("uncached", "--")):
            points = [(r["batch_size"], r[f"{variant}_peak_mb"]) for r in rows
                      if r["method"] == method and r[f"{variant}_peak_mb"] is not None]
            if points:
                xs, ys = zip(*points, strict=True)
                memory.plot(xs, ys, style, marker="o", color=colors[method],
                            label=None if method in labelled else label[method])
                labelled.add(method)
    drawn = [value for r in rows for value in (r["cached_peak_mb"], r["uncached_peak_mb"]) if value]
    if drawn and max(drawn) > 10 * min(drawn):  # decades apart: a log axis shows both the cached and uncached lines
        memory.set_yscale("log")
        memory.set_ylabel("peak memory over baseline (MB, log scale)")
    else:
        memory.set_ylabel("peak memory over baseline (MB; the axis does not start at 0)")
    memory.set_title("(a) peak memory" + (": solid cached (mini_batch_size), dashed uncached" if uncached
                                          else ", cached (mini_batch_size)"), fontsize=9)
    for ax, key, title in ((peak_ratio, "peaks", "(b) cached peak / CachedMNRL's, same batch"),
                           (step_ratio, "timing", "(c) cached step / CachedMNRL's, same batch")):
        for method in methods:
            points = [(r["batch_size"], r["ratio"]) for r in summary[key] if r["method"] == method]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, "-", marker="o", color=colors[method], label=label[method])
        ax.axhline(1.0, color="black", linewidth=1, linestyle=":", label=f"{REFERENCE} (1.00)")
        ax.set_ylabel("ratio (the axis does not start at 0)")
        ax.set_title(title, fontsize=9)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.minorticks_off()
        ax.set_xlabel("batch size")
    memory.legend(fontsize=7, ncol=2)
    step_ratio.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
