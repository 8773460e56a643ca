"""The report of the untrained embedded model's evaluation (``results/untrained_eval.md``) from its JSON.

The numbers were measured once (transfer, MTEB-local STS next to ``evaluate_sts``, alignment/uniformity of
``load_default_model()`` with CLS pooling, no training) and stored in ``results/untrained_eval.json``; this script
only renders them:

    python -m benchmarks.untrained_eval            # print the markdown
    python -m benchmarks.untrained_eval --write    # rewrite results/untrained_eval.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_JSON = RESULTS / "untrained_eval.json"
STS_TO_MTEB = {"STS12": "STS12-local", "STS13": "STS13-local", "STS14": "STS14-local", "STS15": "STS15-local",
               "STS16": "STS16-local", "STSBenchmark": "STSBenchmark-local", "SICKRelatedness": "SICK-R-local"}
ROW_NAME = "MiniLM-L6 (CLS, untrained)"


def sts_vs_mteb_table(data: dict[str, Any]) -> str:
    """One row per STS task: ``evaluate_sts`` (7-task call), MTEB-local, their difference, and the per-task calls."""
    from st_hardneg.reporting import markdown_table

    sts, mteb = data["sts"]["evaluate_sts"], data["mteb_local"]
    header = ["task", "evaluate_sts (7-task call)", "MTEB-local", "difference", "evaluate_sts (one call per task)",
              "difference"]
    rows = []
    for task, local in STS_TO_MTEB.items():
        rows.append([task, f"{sts[task]:.4f}", f"{mteb['scores'][local]:.4f}",
                     f"{mteb['minus_evaluate_sts_7_tasks_call'][local]:.1e}",
                     f"{mteb['evaluate_sts_per_task_calls'][task]:.4f}",
                     f"{mteb['minus_evaluate_sts_per_task_calls'][local]:.1e}"])
    rows.append(["avg", f"{sts['avg']:.4f}", f"{mteb['avg']:.4f}", f"{mteb['avg'] - sts['avg']:.1e}", "", ""])
    return markdown_table(header, rows).replace("|  |  |\n", "| | |\n")


def alignment_table(data: dict[str, Any]) -> str:
    from st_hardneg.reporting import markdown_table

    header = ["STS-B split", "alignment", "uniformity", "positive pairs (gold ≥ 4)", "distinct sentences"]
    rows = [[split, f"{r['alignment']:.4f}", f"{r['uniformity']:.4f}", r["n_pairs"], r["n_sentences"]]
            for split, r in data["alignment_uniformity"].items()]
    return markdown_table(header, rows)


def markdown(data: dict[str, Any]) -> str:
    from st_hardneg.evaluation import format_transfer_table

    v, tr, mteb = data["versions"], data["transfer"], data["mteb_local"]
    details = tr["details"]
    chosen = "; ".join(f"{task} {details[task]['C']}" for task in details)
    parts = [
        "# Untrained embedded default model: transfer, MTEB-local STS, alignment/uniformity",
        "",
        "Model: all-MiniLM-L6-v2 weights from `load_default_model()`, **CLS pooling**, no training. Data: "
        "`../shared/data/senteval`. Machine: 2 CPU cores shared with other jobs (wall times indicative). "
        f"Date {data['date']}; torch {v['torch']}, sentence-transformers {v['sentence_transformers']}, mteb "
        f"{v['mteb']}, scikit-learn {v['scikit_learn']}.",
        "",
        "## SentEval transfer (full protocol, `evaluate_transfer(model, data, fast=False)`)",
        "",
        format_transfer_table({ROW_NAME: tr["scores"]}),
        "",
        f"Wall time {tr['wall_seconds'] / 60:.1f} min: encoding {tr['unique_sentences']:,} distinct sentences "
        f"{tr['encode_seconds'] / 60:.1f} min, logistic-regression fits {tr['fit_seconds'] / 60:.1f} min (MRPC cell: "
        "accuracy / F1; avg = mean accuracy).",
        "",
        "Protocol: SentEval's scikit-learn path in SimCSE's \"test\" mode — 10 stratified shuffled folds, seed 1111; "
        "C ∈ {2^-2..2^3} chosen by inner 10-fold CV (MR, CR, SUBJ, MPQA) or on dev (SST2); C ∈ {2^-1..2^5} chosen by "
        "10-fold CV on train (TREC, MRPC); `LogisticRegression(lbfgs, max_iter=1000)` on raw embeddings; MRPC "
        "features [|u−v|, u⊙v].",
        "",
        f"Chosen C: {chosen}",
        "",
        "## STS: MTEB-local (real `mteb`, `run_mteb(model, 'local')`) next to `evaluate_sts`",
        "",
        sts_vs_mteb_table(data).rstrip("\n"),
        "",
        "STS12: its 61 pairs of identical sentences have cosine exactly 1 in mteb (tied, averaged ranks) but 1 ± 1 ulp "
        "in `cosine_spearman` (as in SentEval), whose rounding noise breaks the tie; every other set agrees to < 1e-6 "
        "(exactly for STS-B and SICK-R when the same sentences are encoded in the same call). The 7-task "
        "`evaluate_sts` call batches sentences differently, which moves SICK-R by 2e-5 (float32 noise).",
        "",
        f"Wall time: evaluate_sts {data['sts']['wall_seconds']:.0f} s, run_mteb {mteb['wall_seconds']:.0f} s. mteb "
        f"result files are named `{mteb['model']}` / `{mteb['revision']}` (weights digest).",
        "",
        "## Alignment / uniformity (Wang & Isola; SimCSE's STS-B setting, t = 2, L2-normalised)",
        "",
        alignment_table(data).rstrip("\n"),
    ]
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", default=str(DEFAULT_JSON))
    parser.add_argument("--write", action="store_true", help="rewrite the .md beside the JSON")
    args = parser.parse_args(argv)
    path = Path(args.json)
    text = markdown(json.loads(path.read_text()))
    if args.write:
        path.with_suffix(".md").write_text(text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
