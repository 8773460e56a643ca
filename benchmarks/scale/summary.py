"""The scaling figures the README and ``docs/scaling.md`` quote, rendered from the committed records only (nothing is
re-run): ``benchmarks/results/scale_summary.md`` and the GPU figure ``scale_gpu.png``.

Each GPU row names its **placement** of bf16 autocast, which decides what a cached step costs:

- ``custom loop``: ``torch.autocast`` around the loss's forward only, ``backward()`` outside it (``benchmarks.scale_gpu``
  and most hand-written loops). GradCache re-embeds inside ``backward()``, where that autocast no longer holds:
  sentence-transformers' ``CachedMultipleNegativesRankingLoss`` re-embeds in float32 there, st-hardneg's losses replay
  the first pass's autocast (``GradCacheMixin.embed_minibatch``) and re-embed in bf16;
- ``Trainer``: the model's forward itself under autocast, as ``accelerate`` wraps it for
  ``SentenceTransformerTrainer(bf16=True)``; both engines then re-embed in bf16.

Sources: ``scale_gpu.json`` (its latest device call: the rows on the current engine), ``scale_profile_gpu.json``
(CachedMNRL and MixCSE in both placements) and ``scale_profile_gpu_losses.json`` (every loss, custom loop), all at
batch 32,768 with ``mini_batch_size`` 1,024 on one H200; ``scale.json`` (2 CPU cores, a tiny BERT, batch 65,536,
``mini_batch_size`` 32). Ratios are to CachedMNRL at the same batch, in the same run and placement. Labels are
today's loss names: ``mixcse`` is ``MixCSELoss(model)`` (one direction), ``mixcse_two_way`` the two-direction form
that ``scale_gpu.json`` and ``scale.json`` ran under the label ``mixcse``.

    python -m benchmarks.scale summary          # rewrite scale_summary.md, scale_gpu.png and scale_findings.md
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.methods import OURS, benchmark_loss
from benchmarks.scale.report import REFERENCE, loss_names, summarize

RESULTS = Path(__file__).resolve().parents[1] / "results"
#: the GPU batch the summary reads (the largest measured)
GPU_BATCH = 32768
#: the CPU batch the summary reads (the largest measured)
CPU_BATCH = 65536
#: placement → what it is, in one line (the table's legend)
PLACEMENTS = {
    "custom loop": "torch.autocast around the loss's forward only, backward() outside it",
    "Trainer": "the model's forward under autocast, as SentenceTransformerTrainer(bf16=True) runs it",
}
# the rows of ``scale_gpu.json`` and ``scale.json`` the summary reads are st-hardneg's losses
# (``benchmarks.methods.OURS``), named by ``benchmarks.methods.benchmark_loss``: both benchmarks ran their labels
# through ``registry_loss``, where ``mixcse`` is the two-direction form
#: the configurations of the profile records are registry names already (``mixcse``: ``MixCSELoss(model)``, one
#: direction; they were run after one name came to mean one loss)
REGISTRY = ("mixcse", "mixcse_two_way", "focal", "hncse_pm", "hncse_hnm", "adcse")
LOSSES = ("focal", "mixcse", "mixcse_two_way", "hncse_pm", "hncse_hnm", "adcse")


def _read(name: str, results: Path) -> dict[str, Any]:
    return json.loads((results / name).read_text())


def gpu_rows(results: Path = RESULTS) -> list[dict[str, Any]]:
    """Every GPU measurement at :data:`GPU_BATCH`, cached: ``{"loss", "placement", "step", "peak", "source"}`` with the
    step and peak as ratios to CachedMNRL in the same run and placement."""
    rows: list[dict[str, Any]] = []
    gpu = _read("scale_gpu.json", results)
    latest = max(r.get("call", 1) for r in gpu["rows"])
    for r in gpu["rows"]:
        if (r["batch_size"] == GPU_BATCH and r["variant"] == "cached" and r.get("call", 1) == latest
                and r["status"] == "ok" and r["method"] in OURS):
            rows.append({"loss": benchmark_loss(r), "placement": "custom loop", "step": r["step_ratio"],
                         "peak": r["peak_ratio"], "source": f"scale_gpu.json, call {latest}"})
    for name in ("scale_profile_gpu.json", "scale_profile_gpu_losses.json"):
        profile = _read(name, results)
        summary = [row for row in profile["summary"] if row["batch"] == GPU_BATCH]
        for row in summary:
            method, _, mode = row["config"].partition(" (")
            placement = "Trainer" if mode.rstrip(")") == "trainer" else "custom loop"
            if method not in REGISTRY:
                continue
            reference = next(r for r in summary if r["config"] == (REFERENCE if placement == "custom loop"
                                                                   else f"{REFERENCE} (trainer)"))
            rows.append({"loss": method, "placement": placement, "step": row["to_cached_mnrl"],
                         "peak": row["peak_mb"] / reference["peak_mb"], "source": name})
    return rows


def cpu_rows(results: Path = RESULTS) -> list[dict[str, Any]]:
    """The CPU cached rows at :data:`CPU_BATCH` (``scale.json``): step and peak as ratios to CachedMNRL."""
    data = _read("scale.json", results)
    summary, names = summarize(data), loss_names(data)
    step = {r["method"]: r["ratio"] for r in summary["timing"] if r["batch_size"] == CPU_BATCH}
    peak = {r["method"]: r["ratio"] for r in summary["peaks"] if r["batch_size"] == CPU_BATCH}
    return [{"loss": names[m], "step": step[m], "peak": peak[m]} for m in step if m in OURS and m in peak]


def _x(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


def _pair(row: dict[str, Any] | None) -> str:
    return "–" if row is None else f"{_x(row['step'])} / {_x(row['peak'])}"


def table(results: Path = RESULTS) -> str:
    """The README's and the docs' scaling table: per loss, step / peak against CachedMNRL on the GPU in each
    placement (in the custom loop the ``scale_gpu.json`` row, else the profile's) and on the CPU; ``–``: not
    measured."""
    gpu = gpu_rows(results)
    cpu = {r["loss"]: r for r in cpu_rows(results)}
    lines = [f"| loss (step / peak) | GPU {GPU_BATCH:,}, custom loop | GPU {GPU_BATCH:,}, Trainer | CPU {CPU_BATCH:,} |",
             "|---|---|---|---|"]
    for loss in LOSSES:
        loop = next((r for r in gpu if r["loss"] == loss and r["placement"] == "custom loop"), None)
        trainer = next((r for r in gpu if r["loss"] == loss and r["placement"] == "Trainer"), None)
        lines.append(f"| {loss} | {_pair(loop)} | {_pair(trainer)} | {_pair(cpu.get(loss))} |")
    return "\n".join(lines)


def ranges(results: Path = RESULTS) -> dict[str, tuple[float, float]]:
    """The GPU step ratios' range per placement, over every record (the README's sentence)."""
    out: dict[str, tuple[float, float]] = {}
    for placement in PLACEMENTS:
        steps = [r["step"] for r in gpu_rows(results) if r["placement"] == placement]
        out[placement] = (min(steps), max(steps))
    return out


def placement_sentence(results: Path = RESULTS) -> str:
    """One sentence: what each placement means for a user, with the records' step ratios."""
    spread = ranges(results)
    (loop_low, loop_high), (trainer_low, trainer_high) = spread["custom loop"], spread["Trainer"]
    trainer = f"{trainer_low:.2f}×" if f"{trainer_low:.2f}" == f"{trainer_high:.2f}" else \
        f"{trainer_low:.2f}–{trainer_high:.2f}×"
    return (f"Under `SentenceTransformerTrainer(bf16=True)` both engines re-embed in bf16 and cost the same "
            f"({trainer}); in a custom loop with `torch.autocast` around the loss's forward only, CachedMNRL "
            f"re-embeds in float32 and st-hardneg's losses take {loop_low:.2f}–{loop_high:.2f}× its step.")


def two_way_sentence(results: Path = RESULTS) -> str:
    """On the CPU, ``mixcse_two_way`` against the like-for-like reference: CachedMNRL with both directions."""
    rows = {r["method"]: r for r in summarize(_read("scale.json", results))["rows"] if r["batch_size"] == CPU_BATCH}
    ours, two_way = rows.get("mixcse"), rows.get("cached_mnrl_two_way")
    if not ours or not two_way or not ours["cached_step_ms"] or not two_way["cached_step_ms"]:
        return ""
    return (f"On the CPU at {CPU_BATCH:,}, `mixcse_two_way` against the two-direction CachedMNRL "
            "(`directions=(\"query_to_doc\", \"doc_to_query\"), partition_mode=\"per_direction\"`, the same two-way "
            f"work): {ours['cached_step_ms'] / two_way['cached_step_ms']:.2f}× its step, "
            f"{ours['cached_peak_mb'] / two_way['cached_peak_mb']:.2f}× its peak.")


def markdown(results: Path = RESULTS) -> str:
    gpu = gpu_rows(results)
    gpu_record, cpu_meta = _read("scale_gpu.json", results), _read("scale.json", results)["_meta"]
    device = gpu_record["environment"]["device_name"].removeprefix("NVIDIA ")
    tokens = gpu_record["model"].rsplit("max_seq_length ", 1)[1]
    lines = ["# Scaling in short: cached (GradCache) step and peak against CachedMNRL", "",
             "Generated by `python -m benchmarks.scale summary` from `scale_gpu.json`, `scale_profile_gpu.json`, "
             "`scale_profile_gpu_losses.json` and `scale.json` (nothing re-run). Each ratio is to "
             "sentence-transformers' `CachedMultipleNegativesRankingLoss` at the same batch, in the same run and "
             f"placement. GPU: one {device}, a BERT-base-shaped encoder at {tokens} tokens under bf16 autocast, "
             f"`mini_batch_size` {gpu_record['mini_batch_size']:,}, batch {GPU_BATCH:,}; CPU: {cpu_meta['cpu_count']} "
             f"cores, a tiny BERT where the loss side weighs most, `mini_batch_size` {cpu_meta['mini_batch_size']}, "
             f"batch {CPU_BATCH:,}. Placements: "
             + "; ".join(f"*{name}*: {what}" for name, what in PLACEMENTS.items()) + ".", "",
             "<!-- table -->", table(results), "<!-- /table -->", "", two_way_sentence(results), "",
             "<!-- placements -->", placement_sentence(results), "<!-- /placements -->", "",
             "Every GPU record at that batch:", "",
             "<!-- gpu -->", "| loss | placement | step / CachedMNRL | peak / CachedMNRL | record |",
             "|---|---|---:|---:|---|"]
    lines += [f"| {r['loss']} | {r['placement']} | {_x(r['step'])} | {_x(r['peak'])} | `{r['source']}` |"
              for r in gpu]
    lines += ["<!-- /gpu -->", ""]
    return "\n".join(lines)


def plot_gpu(path: Path, results: Path = RESULTS) -> Path:
    """``scale_gpu.png``: per loss, the cached step and peak against CachedMNRL at batch 32,768 in the custom loop
    (the latest ``scale_gpu.json`` call), bars from 0, the reference at 1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in gpu_rows(results) if r["source"].startswith("scale_gpu.json")]
    losses = [loss for loss in LOSSES if any(r["loss"] == loss for r in rows)]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8), sharey=True)
    for ax, key, what in ((axes[0], "step", "step time"), (axes[1], "peak", "peak memory")):
        values = [next(r[key] for r in rows if r["loss"] == loss) for loss in losses]
        bars = ax.bar(losses, values, color="C0")
        ax.bar_label(bars, labels=[f"{v:.2f}×" for v in values], fontsize=8)
        ax.axhline(1.0, color="black", linewidth=1, linestyle="--", label="CachedMNRL (1.00×)")
        ax.set_ylim(0, 1.15)
        ax.set_title(f"{what} / CachedMNRL's")
        ax.tick_params(axis="x", labelrotation=30)
    axes[0].set_ylabel("ratio to CachedMNRL (axis from 0)")
    axes[0].legend(fontsize=8, loc="upper left")
    source = rows[0]["source"] if rows else "scale_gpu.json"
    fig.suptitle(f"GPU (H200, BERT-base shape, bf16), batch {GPU_BATCH:,}, mini-batch 1,024, custom loop "
                 f"({source})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write(results: Path = RESULTS) -> list[Path]:
    """Rewrite ``scale_summary.md``, ``scale_gpu.png`` and the readings ``docs/scaling.md`` gives beside its tables,
    ``scale_findings.md`` (:mod:`benchmarks.scale.findings`), in ``results`` from its records."""
    from benchmarks.scale import findings

    out = results / "scale_summary.md"
    out.write_text(markdown(results))
    return [out, plot_gpu(results / "scale_gpu.png", results), findings.write(results)]
