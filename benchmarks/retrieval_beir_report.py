"""The two-dataset retrieval benchmark's report (:mod:`benchmarks.retrieval_beir`): each dataset's table, the mining
screen, the recipe against the built-ins (paired seeds and per-query tests) and the figure, from the results JSON
and its per-query file alone.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from benchmarks.retrieval_beir_rows import (
    BUILTIN,
    CANDIDATES,
    DATASETS,
    MINING_CHOICES,
    SCIFACT_IMPORT_FILE,
    TABLE_ROWS,
    display,
    mining_choice,
    mining_screen,
    recipe_label,
    row_role,
    rows_mining,
    run_label,
)


def table(data: dict[str, Any], name: str) -> str:
    """One dataset's markdown table: test and dev nDCG@10 (mean ± std over seeds), MRR@10, R@100, per-seed test
    nDCG@10, train seconds and median step (the device's), and each row's role (:func:`row_role`)."""
    from st_hardneg.reporting import markdown_table, mean_std_text

    runs = [r for r in data["runs"] if r["dataset"] == name and r.get("stage") in ("untrained", "main")
            and "failed" not in r]
    recipe = recipe_label(data)
    order = list(dict.fromkeys(["untrained", *BUILTIN, recipe, *TABLE_ROWS]))
    order = [label for label in order if label in TABLE_ROWS or label == recipe
             or any(r["method"] == label for r in runs)]
    order += sorted({r["method"] for r in runs} - set(order))
    if data.get("rerun_rows"):  # a re-run file (--mining-all) lists the rows it re-runs, not the whole matrix
        order = [label for label in order if label in ("untrained", *data["rerun_rows"])]
    body = []
    for label in order:
        rows = sorted((r for r in runs if r["method"] == label), key=lambda r: r["seed"] or 0)
        if not rows:
            body.append([display(data, label), "not run", "", "", "", "", "", "", row_role(data, label)])
            continue
        test = [r["test"]["ndcg@10"] for r in rows]
        steps = [r["median_step_seconds"] for r in rows if r.get("median_step_seconds")]
        train = [r["train_seconds"] for r in rows if "train_seconds" in r]
        body.append([display(data, label), mean_std_text(test), mean_std_text([r["dev"]["ndcg@10"] for r in rows]),
                     mean_std_text([r["test"]["mrr@10"] for r in rows]),
                     mean_std_text([r["test"]["recall@100"] for r in rows]),
                     ", ".join(f"{v:.2f}" for v in test), f"{statistics.fmean(train):.0f}" if train else "–",
                     f"{statistics.median(steps):.3f}" if steps else "–", row_role(data, label)])
    return markdown_table(["row", "test nDCG@10", "dev nDCG@10", "test MRR@10", "test R@100",
                           "test nDCG@10 per seed", "train s", "median step s", "role"], body).rstrip("\n")


def mining_table(data: dict[str, Any]) -> str:
    """The mining screen: MNRL's dev nDCG@10 at seed 0 per setting and dataset, the dev-best setting per dataset and
    the one its rows were trained on."""
    from st_hardneg.reporting import markdown_table

    screen, chosen = mining_screen(data), mining_choice(data)
    body = []
    for setting in MINING_CHOICES:
        cells = []
        for name in DATASETS:
            value = screen[name].get(setting)
            if value is None:
                cells.append("not run")
            elif isinstance(value, float):
                mark = " (dev-best)" if chosen[name] == setting else ""
                cells.append(f"{value:.2f}{mark}" + (" · rows" if rows_mining(data, name) == setting else ""))
            else:
                kept = value.split("kept ", 1)[1].split(" (", 1)[0] if "kept " in value else value
                cells.append(f"refused: kept {kept}" if "kept " in value else f"failed: {value}")
        body.append([f"`{setting}`", *cells])
    return markdown_table(["setting (MNRL, seed 0)", *(f"{n} dev nDCG@10" for n in DATASETS)], body).rstrip("\n")


def paired(data: dict[str, Any], name: str, a: str, b: str) -> dict[str, Any] | None:
    """Recipe ``a`` against ``b`` on ``name``'s test set: per-seed differences of nDCG@10 over the common seeds, with
    their 95 % t interval."""
    from scipy.stats import t as t_dist

    by = {}
    for label in (a, b):
        by[label] = {r["seed"]: r["test"]["ndcg@10"] for r in data["runs"] if r["dataset"] == name
                     and r["method"] == label and r.get("stage") == "main" and "test" in r}
    seeds = sorted(set(by[a]) & set(by[b]))
    if not seeds:
        return None
    diffs = [by[a][s] - by[b][s] for s in seeds]
    mean = statistics.fmean(diffs)
    sd = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
    half = float(t_dist.ppf(0.975, len(diffs) - 1)) * sd / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
    return {"seeds": seeds, "mean": mean, "low": mean - half, "high": mean + half,
            "ahead_every_seed": all(d > 0 for d in diffs)}


def per_query_runs(path: Path, runs: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The per-query file's rows (one per run: dataset, method, seed, stage, nDCG@10 by role and query).

    With ``runs`` (the results file's runs), only the rows their records point to (``"per_query": "<file>#<n>"``
    with the same dataset, row, seed and stage), whatever the file's order: a row left by a runner stopped between
    its two writes, or the row of a run replaced since, is not read. Records that point to no row at all (results
    written by hand) leave every row read."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    if runs is None or not any("per_query" in record for record in runs):  # nothing to check the rows against
        return rows

    def pointed(row: dict[str, Any]) -> bool:
        number = row.get("run")
        if not isinstance(number, int) or not 0 <= number < len(runs):
            return False
        record = runs[number]
        return (record.get("per_query") == f"{path.name}#{number}" and record.get("stage", "main") == row.get("stage")
                and all(record.get(key) == row.get(key) for key in ("dataset", "method", "seed")))

    return [row for row in rows if pointed(row)]


def per_query_by_row(per_query: list[dict[str, Any]]) -> dict[tuple[str, str], dict[int, dict[str, float]]]:
    """``{(dataset, row): {seed: {query: test nDCG@10}}}`` of the main stage's runs."""
    by: dict[tuple[str, str], dict[int, dict[str, float]]] = {}
    for row in per_query:
        if row.get("stage") == "main" and "test" in row["ndcg@10"]:
            by.setdefault((row["dataset"], row["method"]), {})[row["seed"]] = row["ndcg@10"]["test"]
    return by


def compare_rows(by: dict[tuple[str, str], dict[int, dict[str, float]]], names: list[str], seeds: list[int],
                 method: str, baseline: str) -> Any:
    """:func:`st_hardneg.evaluation.compare_runs` of ``method`` against ``baseline`` on the per-query test nDCG@10 of
    datasets ``names`` at ``seeds``."""
    from st_hardneg.evaluation import compare_runs

    runs = {label: [{name: {q: {"ndcg@10": v} for q, v in by[(name, label)][s].items()} for name in names}
                    for s in seeds] for label in (baseline, method)}
    return compare_runs(runs, baseline=baseline)


def paired_section(by: dict[tuple[str, str], dict[int, dict[str, float]]], method: str, baseline: str,
                   title: str) -> list[str]:
    """``method`` against ``baseline`` with :func:`st_hardneg.evaluation.compare_runs` on the test queries of every
    dataset where both have per-query scores (per-query nDCG@10 averaged over their common seeds; one comparison with
    Holm over the datasets when both datasets have the same common seeds, else one per dataset over its own)."""

    common = {name: sorted(set(by.get((name, method), {})) & set(by.get((name, baseline), {}))) for name in DATASETS}
    joint = sorted(set.intersection(*(set(v) for v in common.values())))
    same = joint and all(seeds == joint for seeds in common.values())  # else each dataset over all its seeds
    groups = [(list(DATASETS), joint)] if same else [([name], seeds) for name, seeds in common.items()]
    lines: list[str] = []
    for names, seeds in groups:
        if not seeds:
            lines += [f"- {title} on {names[0]}: not run (no seed with per-query scores for both rows)", ""]
            continue
        result = compare_rows(by, names, seeds, method, baseline)
        lines += [f"{title} on {', '.join(names)}, seeds {', '.join(map(str, seeds))}:", "",
                  result.to_markdown().rstrip("\n"), ""]
    return lines


def significance(data: dict[str, Any], per_query: list[dict[str, Any]]) -> str:
    """The recipe against the best built-in and MNRL with mined negatives on each dataset's test queries
    (:func:`paired_section`), or why it cannot be run."""
    by = per_query_by_row(per_query)
    recipe = recipe_label(data)
    lines: list[str] = []
    for other in dict.fromkeys([b for b in (data.get("best_builtin"), "mnrl") if b]):
        lines += paired_section(by, recipe, other, f"{display(data, recipe)} vs {other}")
    return "\n".join(lines)


def known_relevance(data: dict[str, Any], per_query: list[dict[str, Any]]) -> str:
    """Each candidate with known-relevance masking against the same loss without it (:func:`paired_section`)."""
    by = per_query_by_row(per_query)
    lines: list[str] = []
    for key in CANDIDATES:
        with_known, without = run_label(key, "recipe"), run_label(key, "recipe_no_known_relevance")
        if any(k[1] == with_known for k in by) and any(k[1] == without for k in by):
            lines += paired_section(by, with_known, without, f"{with_known} vs {without}")
    return "\n".join(lines) if lines else "Not run: no loss has per-query scores both with and without the masking."


def markdown(data: dict[str, Any], per_query: list[dict[str, Any]] | None = None) -> str:
    title = "# Two-dataset retrieval benchmark: SciFact + NFCorpus (all-MiniLM-L6-v2, x 100)"
    if data.get("rerun_rows"):  # a re-run file (--mining-all): which rows, on which negatives
        every = set(TABLE_ROWS) - {"untrained"} <= set(data["rerun_rows"])
        rows = "every row" if every else f"re-run of {', '.join(f'`{row}`' for row in data['rerun_rows'])}"
        title += f": {rows} on the `{data.get('chosen_mining')}` negatives"
    lines = [title, ""]
    lines += [f"Mining setting: `{data.get('chosen_mining', 'not chosen')}` "
              f"({data.get('mining_choice', 'chosen on pooled dev, MNRL, seed 0')}); recipe: "
              f"`{data.get('chosen_recipe', 'not chosen')}` ({data.get('recipe_choice', 'chosen on pooled dev, seed 0')})"
              f"; best built-in: `{data.get('best_builtin', 'not chosen')}` "
              f"({data.get('builtin_choice', 'pooled dev, seed 0')}).", ""]
    if data.get("reading"):  # the maintainers' reading of the numbers below, kept in the JSON beside them
        lines += ["## Reading", "", *data["reading"], ""]
    for name, spec in DATASETS.items():
        lines += [f"## {name} (published MTEB nDCG@10 of the untrained model: {spec['published']})", "",
                  table(data, name), ""]
        imported = sorted({r["method"] for r in data["runs"] if r["dataset"] == name and "source" in r
                           and r.get("stage") in ("untrained", "main")})
        if imported:
            lines += [f"Rows from an earlier run of this protocol (`{SCIFACT_IMPORT_FILE}`, no per-query scores; "
                      f"seeds 0-2): {', '.join(f'`{m}`' for m in imported)}; their train seconds and steps are that "
                      "run's (2 threads of a shared CPU).", ""]
    chosen = mining_choice(data)
    agree = [f"{name}: dev-best `{chosen[name]}`, rows trained on `{rows_mining(data, name)}`"
             + ("" if chosen[name] == rows_mining(data, name) else ": they differ")
             for name in DATASETS if chosen[name]]
    lines += ["## Mining screen (MNRL, seed 0, dev nDCG@10; `rows`: the setting every row of the dataset trained on)",
              "", mining_table(data), "", *(f"- {line}" for line in agree), ""]
    best = data.get("best_builtin")
    lines += ["## Recipe against the built-ins (test nDCG@10, paired seeds; 95 % t interval of the mean difference)",
              ""]
    from st_hardneg.reporting import markdown_table

    body = []
    for other in dict.fromkeys([b for b in (best, "mnrl") if b]):
        for name in DATASETS:
            result = paired(data, name, recipe_label(data), other)
            if result is None:
                body.append([f"recipe − {other}", name, "not run", "", "", ""])
                continue
            interval = (f"[{result['low']:+.2f}, {result['high']:+.2f}]" if len(result["seeds"]) > 1
                        else "– (one seed)")
            body.append([f"recipe − {other}", name, f"{result['mean']:+.2f}", interval, len(result["seeds"]),
                         "yes" if result["ahead_every_seed"] else "no"])
    lines += [markdown_table(["comparison", "dataset", "mean diff", "95 % CI", "seeds", "ahead every seed"],
                             body).rstrip("\n"), ""]
    lines += ["## Significance (per-query test nDCG@10, `st_hardneg.evaluation.compare_runs`)", "",
              significance(data, per_query or []), ""]
    lines += ["## Known-relevance masking (the same loss with and without `known_positives`, per-query test nDCG@10)",
              "", known_relevance(data, per_query or []), ""]
    failed = [f"{r['dataset']} {r['method']} seed {r['seed']}: {r['failed']}" for r in data["runs"] if "failed" in r]
    if failed:
        lines += ["## Failed runs", "", *(f"- {f}" for f in failed), ""]
    lines += ["## Protocol", "", *(f"- {k}: {v}" for k, v in data["protocol"].items()), ""]
    return "\n".join(lines)


def plot_points(data: dict[str, Any], per_query: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per dataset, the recipe's test nDCG@10 minus the best built-in's: the per-query paired difference with its BCa
    interval (:func:`st_hardneg.evaluation.compare_runs`, per-query scores averaged over the common seeds; with Holm's
    correction over the datasets when the seeds are common to both) where both rows have per-query scores, else the
    seeds' paired t interval."""

    best, recipe = data.get("best_builtin"), recipe_label(data)
    by = per_query_by_row(per_query)
    common = {name: sorted(set(by.get((name, recipe), {})) & set(by.get((name, best), {}))) if best else []
              for name in DATASETS}
    joint = sorted(set.intersection(*(set(seeds) for seeds in common.values())))
    compared = {row.dataset: (row, joint) for row in compare_rows(by, list(DATASETS), joint, recipe, best).rows} \
        if joint else {name: (compare_rows(by, [name], seeds, recipe, best).rows[0], seeds)
                       for name, seeds in common.items() if seeds}
    points: dict[str, dict[str, Any]] = {}
    for name in DATASETS:
        if name in compared:
            row, seeds = compared[name]
            points[name] = {"mean": row.mean_difference, "low": row.ci_low, "high": row.ci_high, "seeds": seeds,
                            "kind": "per-query BCa", "p_holm": row.p_randomization_holm}
        elif best and (result := paired(data, name, recipe, best)) is not None:
            points[name] = {**result, "kind": "seeds' t"}
    return points


def plot(data: dict[str, Any], path: Path, per_query: list[dict[str, Any]] | None = None) -> None:
    """Per dataset, the recipe minus the best built-in (test nDCG@10) with its 95 % interval (:func:`plot_points`),
    and their mean over the datasets (the target's measure), against 0 and the +1.0 target."""
    import math

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = plot_points(data, per_query or [])
    fig, ax = plt.subplots(figsize=(7, 3.6))
    names = list(points)
    for i, name in enumerate(names):
        r = points[name]
        low, high = (r["low"], r["high"]) if not math.isnan(r["low"]) else (r["mean"], r["mean"])
        ax.errorbar([i], [r["mean"]], yerr=[[r["mean"] - low], [high - r["mean"]]], fmt="o", capsize=4)
        holm = f"\nHolm p {r['p_holm']:.3f}" if not math.isnan(r.get("p_holm", math.nan)) else ""
        ax.annotate(f"{r['mean']:+.2f}\n({len(r['seeds'])} seeds, {r['kind']}){holm}", (i, r["mean"]),
                    textcoords="offset points", xytext=(10, -4), fontsize=8)
    labels = list(names)
    if len(names) == len(DATASETS):  # the target is on the mean over the datasets
        mean = statistics.fmean(points[name]["mean"] for name in names)
        ax.plot([len(names)], [mean], marker="D", color="black")
        ax.annotate(f"{mean:+.2f}\n({1.0 - mean:.2f} short of +1.0)" if mean < 1.0 else f"{mean:+.2f}",
                    (len(names), mean), textcoords="offset points", xytext=(10, -4), fontsize=8)
        labels.append("mean")
    ax.axhline(0, color="grey", lw=0.8)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.text(-0.45, 1.0, "target +1.0", va="bottom", fontsize=8, color="grey")
    ax.set_xticks(range(len(labels)), labels)
    ax.set_xlim(-0.5, max(len(labels), 1) - 0.5 + 0.5)
    ax.set_ylabel("test nDCG@10 difference")
    ax.set_title(f"recipe ({recipe_label(data)}) − best built-in ({data.get('best_builtin')})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


def write_report(data: dict[str, Any], out: Path) -> None:
    from st_hardneg.reporting import write_json

    write_json(out, data)
    out.with_suffix(".md").write_text(markdown(data, per_query_runs(out.with_name(out.stem + "_per_query.jsonl"),
                                                                     data["runs"])))
