"""The report half of ``benchmarks/retrieval.py``: summary over seeds, the target check, the markdown table and the
plot of a retrieval results file (no torch import)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

METRICS = ("ndcg@10", "mrr@10", "recall@1")
#: sentence-transformers' own losses: the baselines a retrieval team would use
BUILTIN = ("mnrl", "mnrl_hardness", "gist")
#: ST's losses run only on request (see ``retrieval.OPTIONAL_METHODS``): baselines too
OPTIONAL_BUILTIN = ("cached_mnrl",)
BASELINES = (*BUILTIN, *OPTIONAL_BUILTIN)


# --------------------------------------------------------------------------- report
def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    from st_hardneg.reporting import group_by_method, mean_std

    summary = {}
    for method, group in group_by_method(runs).items():
        group = sorted(group, key=lambda r: -1 if r["seed"] is None else r["seed"])
        row: dict[str, Any] = {"seeds": [r["seed"] for r in group if r["seed"] is not None]}
        for metric in METRICS:
            values = [r["retrieval"][metric] for r in group]
            row[metric] = mean_std(values)
            row[f"{metric}_per_seed"] = values
        sts = [r["sts"]["avg"] for r in group if r.get("sts")]
        row["sts_avg"] = mean_std(sts) if sts else None
        # times of the fastest run: other jobs on the machine only ever slow a run down (the load average a run
        # records at its end misses contention earlier in it)
        timed = [r for r in group if r.get("median_step_seconds")]
        fastest = min(timed, key=lambda r: r["median_step_seconds"]) if timed else {}
        row["step"] = fastest.get("median_step_seconds")
        row["train_seconds"] = fastest.get("train_seconds")
        row["timed_seed"] = fastest.get("seed")
        summary[method] = row
    return summary


def target_check(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Best st-hardneg loss vs best ST built-in on nDCG@10: mean difference and the paired per-seed differences."""
    trained = [r for r in runs if r["seed"] is not None]
    summary = summarize(trained)
    builtin = {m: s for m, s in summary.items() if m in BASELINES}
    ours = {m: s for m, s in summary.items() if m not in builtin}
    if not builtin or not ours:
        return None
    best_builtin = max(builtin, key=lambda m: builtin[m]["ndcg@10"][0])
    best_ours = max(ours, key=lambda m: ours[m]["ndcg@10"][0])
    ref = {r["seed"]: r["retrieval"]["ndcg@10"] for r in trained if r["method"] == best_builtin}
    paired = {r["seed"]: r["retrieval"]["ndcg@10"] - ref[r["seed"]]
              for r in trained if r["method"] == best_ours and r["seed"] in ref}
    delta = ours[best_ours]["ndcg@10"][0] - builtin[best_builtin]["ndcg@10"][0]
    return {"best_builtin": best_builtin, "best_st_hardneg": best_ours, "delta_ndcg@10": delta,
            "paired_delta_per_seed": paired,
            "met": bool(delta >= 1.0 and paired and all(d > 0 for d in paired.values()))}


#: (with, without) false-negative control: the ablation pairs the report checks when both were run. ``focal``'s own
#: control is ``mask_duplicates``, which masks nothing under the NO_DUPLICATES sampler (its runs record 0 masked
#: candidates), so ``focal`` is the no-control reference of the margin
ABLATIONS = (("focal_margin_rel0.05", "focal"), ("focal", "focal_no_fnc"), ("mixcse_explicit", "mixcse_explicit_no_fnc"))


def _masked(runs_by_seed: dict[int, dict[str, Any]], seeds: list[int]) -> float | None:
    """Mean candidates masked per batch over ``seeds`` (``None``: no run recorded it)."""
    counts = [runs_by_seed[s]["false_negatives"]["masked_per_batch"] for s in seeds
              if runs_by_seed[s].get("false_negatives")]
    return sum(counts) / len(counts) if counts else None


def ablation_check(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """For every :data:`ABLATIONS` pair that was run: nDCG@10 with minus without false-negative control (mean over
    the seeds both have, and per seed), the candidates masked per batch, and whether control was never worse (on the
    mean and on every shared seed)."""
    result = {}
    for with_control, without in ABLATIONS:
        ours = {r["seed"]: r for r in runs if r["method"] == with_control and r["seed"] is not None}
        ref = {r["seed"]: r for r in runs if r["method"] == without and r["seed"] is not None}
        seeds = sorted(set(ours) & set(ref))
        if not seeds:
            continue
        paired = {s: ours[s]["retrieval"]["ndcg@10"] - ref[s]["retrieval"]["ndcg@10"] for s in seeds}
        delta = sum(paired.values()) / len(paired)
        result[f"{with_control} vs {without}"] = {
            "delta_ndcg@10": delta, "paired_delta_per_seed": paired,
            "masked_per_batch": _masked(ours, seeds), "reference_masked_per_batch": _masked(ref, seeds),
            "never_worse": bool(delta >= 0 and all(d >= 0 for d in paired.values()))}
    return result


def _check_lines(runs: list[dict[str, Any]]) -> str:
    """The target and ablation verdicts under a table."""
    text = ""
    check = target_check(runs)
    if check:
        paired = ", ".join(f"seed {s}: {d:+.2f}" for s, d in sorted(check["paired_delta_per_seed"].items()))
        text += (f"\nTarget (best st-hardneg ≥ best ST built-in + 1.0 nDCG@10, every seed above): best built-in "
                 f"**{check['best_builtin']}**, best st-hardneg **{check['best_st_hardneg']}**, "
                 f"Δ = {check['delta_ndcg@10']:+.2f} ({paired}) → {'met' if check['met'] else 'not met'}.\n")
    for pair, row in ablation_check(runs).items():
        paired = ", ".join(f"seed {s}: {d:+.2f}" for s, d in sorted(row["paired_delta_per_seed"].items()))
        counts = [f"{name} {row[key]:.2f}" for name, key in (("with", "masked_per_batch"),
                                                              ("without", "reference_masked_per_batch"))
                  if row[key] is not None]
        masked = f"; candidates masked per batch: {', '.join(counts)}" if counts else ""
        text += (f"\nFalse-negative control, {pair}: Δ nDCG@10 = {row['delta_ndcg@10']:+.2f} ({paired}{masked}) → "
                 f"{'never worse' if row['never_worse'] else 'worse on the mean or on a seed'}.\n")
    return text


def readme_table(data: dict[str, Any], methods: dict[str, tuple[str, dict[str, Any]]]) -> str:
    """The compact retrieval table (mean ± std over seeds) with the target and ablation verdicts;
    ``methods`` (label → (loss, options)) names each row's options."""
    from st_hardneg.reporting import markdown_table

    summary = summarize(data["runs"])
    best_builtin = max((m for m in summary if m in BASELINES), key=lambda m: summary[m]["ndcg@10"][0], default=None)
    rows = []
    for method, row in summary.items():
        loss, options = methods.get(method, (method, {}))
        what = "–" if method == "untrained" else f"`{loss}`" + (
            " " + ", ".join(f"`{k}={v!r}`" for k, v in options.items()) if options else "")
        delta = ("–" if method == "untrained" or best_builtin is None else
                 f"{row['ndcg@10'][0] - summary[best_builtin]['ndcg@10'][0]:+.2f}")
        rows.append([method, what, len(row["seeds"]) or "–",
                     *(f"{row[m][0]:.2f} ± {row[m][1]:.2f}" for m in METRICS),
                     f"{row['sts_avg'][0]:.2f}" if row["sts_avg"] else "–", delta])
    return markdown_table(["method", "loss, options", "seeds", "nDCG@10", "MRR@10", "R@1", "STS avg",
                           "Δ nDCG@10 vs best built-in"], rows) + _check_lines(data["runs"])


def markdown(data: dict[str, Any]) -> str:
    from st_hardneg.reporting import markdown_table

    runs = data["runs"]
    summary = summarize(runs)
    trained = [m for m in summary if m != "untrained"]
    best_builtin = max((m for m in trained if m in BASELINES),
                       key=lambda m: summary[m]["ndcg@10"][0], default=None)
    header = ["method", "seeds", "nDCG@10", "MRR@10", "R@1", "STS avg", "Δ nDCG@10 vs best ST built-in",
              "nDCG@10 per seed", "median step (s)", "train (s)"]
    rows = []
    for method, row in summary.items():
        cells = [method, ",".join(map(str, row["seeds"])) or "–"]
        cells += [f"{row[m][0]:.2f} ± {row[m][1]:.2f}" for m in METRICS]
        cells.append(f"{row['sts_avg'][0]:.2f} ± {row['sts_avg'][1]:.2f}" if row["sts_avg"] else "–")
        if best_builtin and method != "untrained":
            cells.append(f"{row['ndcg@10'][0] - summary[best_builtin]['ndcg@10'][0]:+.2f}")
        else:
            cells.append("–")
        cells.append(" / ".join(f"{v:.2f}" for v in row["ndcg@10_per_seed"]))
        cells.append(f"{row['step']:.2f}" if row["step"] else "–")
        cells.append(f"{row['train_seconds']:.0f}" if row["train_seconds"] else "–")
        rows.append(cells)
    text = markdown_table(header, rows) + _check_lines(runs)
    if any(row["step"] for row in summary.values()):
        text += ("\nTimes: the fastest run of each method (its median step and its training time), since other jobs "
                 "on the 2 cores only ever slow a run down.\n")
    if data.get("training_data"):
        info = data["training_data"]
        text += f"\nTraining data: {info['triplets']} triplets from {info['pairs']} pairs (mined once).\n"
    return text


def selected(data: dict[str, Any], selection: dict[str, tuple[str, str, dict[str, Any]]]) -> dict[str, str]:
    """family -> the label of its best configuration by dev nDCG@10 (mean over the seeds run; ties: the first
    listed)."""
    summary = summarize(data["runs"])
    best: dict[str, str] = {}
    for label, (family, _, _) in selection.items():
        if label in summary and (family not in best or
                                 summary[label]["ndcg@10"][0] > summary[best[family]]["ndcg@10"][0]):
            best[family] = label
    return best


def selection_markdown(data: dict[str, Any], selection: dict[str, tuple[str, str, dict[str, Any]]]) -> str:
    """The dev-selection table: every configuration's dev scores, the chosen one of each family in bold."""
    from st_hardneg.reporting import markdown_table

    summary = summarize(data["runs"])
    chosen = set(selected(data, selection).values())
    rows = []
    for label, (family, loss, kwargs) in selection.items():
        if label not in summary:
            continue
        row = summary[label]
        options = ", ".join(f"{k}={v}" for k, v in kwargs.items()) or "defaults"
        name = f"**{label}**" if label in chosen else label
        rows.append([name, family, f"{loss} ({options})", *(f"{row[m][0]:.2f}" for m in METRICS),
                     ",".join(map(str, row["seeds"])), f"{row['train_seconds']:.0f}" if row["train_seconds"] else "–"])
    text = markdown_table(["configuration", "family", "loss (options)", "dev nDCG@10", "dev MRR@10", "dev R@1",
                           "seeds", "train (s)"], rows)
    stats = data.get("dev_task") or {}
    info = data.get("training_data") or {}
    text += ("\nSelected (bold): the best dev nDCG@10 of each family; the test task is never scored here. Dev task: "
             + ", ".join(f"{k} {v}" for k, v in stats.items())
             + (f". Training: {info['triplets']} mined triplets from {info['pairs']} pairs." if info else ".") + "\n")
    return text + failed_note(data)


def failed_note(data: dict[str, Any]) -> str:
    """The runs that failed (no usable row), one per line, or nothing."""
    from st_hardneg.reporting import failed_runs

    lines = failed_runs(data["runs"])
    return ("\nFailed (not selected, not in the table):\n\n" + "".join(f"- {line}\n" for line in lines)) if lines else ""


def plot(data: dict[str, Any], path: Path) -> Path:
    from benchmarks.harness import plot_seed_bars

    summary = summarize(data["runs"])
    per_seed = {m: row["ndcg@10_per_seed"] for m, row in summary.items() if m != "untrained"}
    if not per_seed:
        return path
    reference = ("untrained", summary["untrained"]["ndcg@10"][0]) if "untrained" in summary else None
    untrained_file = path.parent / "retrieval_untrained.json"  # the reference written by ``--untrained``
    if reference is None and untrained_file.is_file():
        import json

        reference = ("untrained", json.loads(untrained_file.read_text())["untrained"]["retrieval"]["ndcg@10"])
    return plot_seed_bars(per_seed, path, ylabel="nDCG@10 x 100 (MRPC paraphrase retrieval)",
                          title="Retrieval fine-tuning: nDCG@10, mean ± std over seeds (dots: seeds)",
                          grey=BASELINES, reference=reference)


def write_report(data: dict[str, Any], out: Path) -> None:
    from st_hardneg.reporting import write_results

    write_results(data, out, markdown, plot)


def untrained_markdown(row: dict[str, Any], data_stats: dict[str, int]) -> str:
    r = row["retrieval"]
    sts = row.get("sts") or {}
    lines = [
        "# Untrained embedded default (all-MiniLM-L6-v2, mean pooling) on MRPC paraphrase retrieval", "",
        "| nDCG@10 | MRR@10 | R@1 | R@10 | MAP@100 | STS avg (7 tasks) |", "|---|---|---|---|---|---|",
        f"| {r['ndcg@10']:.2f} | {r['mrr@10']:.2f} | {r['recall@1']:.2f} | {r['recall@10']:.2f} | {r['map@100']:.2f} "
        f"| {sts['avg']:.2f} |" if sts else
        f"| {r['ndcg@10']:.2f} | {r['mrr@10']:.2f} | {r['recall@1']:.2f} | {r['recall@10']:.2f} | {r['map@100']:.2f} "
        "| – |",
        "",
        f"Task: {r['queries']} queries, {r['corpus']} documents. Wall time {row['wall_seconds']:.0f} s "
        f"(retrieval {row['eval_seconds']['retrieval']:.0f} s, STS {row['eval_seconds']['sts']:.0f} s) with "
        f"{row['torch_threads']} torch thread(s) on a shared 2-core machine; {row['finished']}.",
        "",
        "Data construction (st_hardneg.data.mrpc): " + ", ".join(f"{k} {v}" for k, v in data_stats.items()) + ".",
        "",
        f"Saturation check: MRR@10 = {r['mrr@10']:.2f} "
        + ("> 95: saturated, a harder task is needed." if r["mrr@10"] > 95 else
           "≤ 95: not saturated (R@1 leaves room to improve), so MRPC paraphrase retrieval is the task."),
    ]
    return "\n".join(lines) + "\n"
