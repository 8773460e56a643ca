"""The untrained embedded model, evaluated once: transfer / STS / alignment (``sts``) and the BEIR test splits through
mteb next to our scorer (``beir``). Nothing is trained here.

``sts`` renders ``results/untrained_eval.md`` from ``results/untrained_eval.json``. The numbers were measured once
(transfer, MTEB-local STS next to ``evaluate_sts``, alignment/uniformity of ``load_default_model()`` with CLS pooling,
no training) and stored in the JSON; this mode only renders them:

    python -m benchmarks.untrained sts             # print the markdown
    python -m benchmarks.untrained sts --write     # rewrite results/untrained_eval.md (also --report)

``beir`` scores the untrained all-MiniLM-L6-v2, as published, on the local BEIR test splits. For each BEIR folder
(default: SciFact and NFCorpus under the shared data) the model as published (its own mean pooling and
normalisation, 256 tokens) is scored twice on the test split:

- ``mteb``: ``mteb.evaluate(model, task, cache=None)`` on the folder as an mteb retrieval task
  (:func:`st_hardneg.evaluation.mteb_tasks.beir_mteb_task`), mteb's own encoding, search and scores;
- ``ours``: :func:`st_hardneg.evaluation.retrieval.evaluate_beir` (graded ``pytrec_eval``), embeddings cached per model.

Both are compared with the published MTEB scores of sentence-transformers/all-MiniLM-L6-v2 (SciFact 64.51, NFCorpus
31.59 nDCG@10). Results: ``benchmarks/results/untrained_beir.json`` and ``.md`` (rendered from the JSON)::

    python -m benchmarks.untrained beir                 # measure (a few minutes per data set on one thread)
    python -m benchmarks.untrained beir --render-only   # the markdown from the JSON (also --report)
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS, SHARED_DATA

DEFAULT_JSON = RESULTS / "untrained_eval.json"
JSON_PATH = RESULTS / "untrained_beir.json"
MD_PATH = RESULTS / "untrained_beir.md"
SHARED = SHARED_DATA / "retrieval"

# --------------------------------------------------------------------------- sts: untrained_eval
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


def sts_markdown(data: dict[str, Any]) -> str:
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


# --------------------------------------------------------------------------- beir: untrained_beir
#: published MTEB nDCG@10 x 100 of sentence-transformers/all-MiniLM-L6-v2
PUBLISHED = {"scifact": 64.51, "nfcorpus": 31.59}
METRICS = ("ndcg@10", "mrr@10", "recall@100")
MTEB_KEYS = {"ndcg@10": "ndcg_at_10", "mrr@10": "mrr_at_10", "recall@100": "recall_at_100"}


def beir_measure(folder: Path, cache_dir: Path, threads: int, save: Any = None) -> dict[str, Any]:
    import mteb
    import torch

    from st_hardneg.data.beir import load_beir
    from st_hardneg.evaluation.mteb_tasks import beir_mteb_task
    from st_hardneg.evaluation.retrieval import evaluate_beir
    from st_hardneg.models import module_stack, resolve_model, weights_digest

    torch.set_num_threads(threads)
    data = load_beir(folder)
    task = data.task("test")
    model = resolve_model(None, saved="as_is", device="cpu")
    row: dict[str, Any] = {"data": data.name, "folder": str(folder), "split": "test", "queries": len(task.queries),
                           "corpus": len(task.corpus), "grades": sorted({g for docs in task.qrels.values()
                                                                          for g in docs.values()}),
                           "model": "sentence-transformers/all-MiniLM-L6-v2 (embedded, as published)",
                           "modules": module_stack(model), "weights": weights_digest(model),
                           "max_seq_length": model.max_seq_length, "published_ndcg@10": PUBLISHED.get(data.name)}
    start = time.perf_counter()
    ours = evaluate_beir(model, [task], max_seq_length=256, cache_dir=cache_dir, show_progress_bar=True)[task.name]
    row["ours"] = {m: ours[m] for m in METRICS}
    row["ours_seconds"] = time.perf_counter() - start
    row["ours_minus_published"] = row["ours"]["ndcg@10"] - row["published_ndcg@10"]
    if save is not None:  # the first path's numbers are kept even if the second is interrupted
        save(row)
    start = time.perf_counter()
    result = mteb.evaluate(model, beir_mteb_task(data, "test", max_seq_length=256), cache=None, co2_tracker=False,
                           encode_kwargs={"batch_size": 64, "show_progress_bar": True})
    if result.exceptions:
        raise RuntimeError(f"mteb failed: {result.exceptions}")
    scores = result.task_results[0].scores["test"][0]
    row["mteb"] = {m: 100.0 * float(scores[key]) for m, key in MTEB_KEYS.items()}
    row["mteb_seconds"] = time.perf_counter() - start
    row["ours_minus_mteb"] = {m: row["ours"][m] - row["mteb"][m] for m in METRICS}
    row["mteb_minus_published"] = row["mteb"]["ndcg@10"] - row["published_ndcg@10"]
    return row


def beir_render(payload: dict[str, Any]) -> str:
    """``untrained_beir.md`` from its JSON (its wording, the command included, is the committed table's)."""
    lines = ["# Untrained all-MiniLM-L6-v2 (as published) on local BEIR test splits", "",
             f"Model: {payload['rows'][0]['modules'] if payload['rows'] else '-'}; 256 tokens; "
             f"{payload['threads']} CPU thread(s). Command: `python -m benchmarks.untrained_beir`.", "",
             "| data | queries | documents | grades | path | nDCG@10 | MRR@10 | R@100 | published nDCG@10 | "
             "difference | seconds |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in payload["rows"]:
        for path in [p for p in ("mteb", "ours") if p in row]:
            published = row.get("published_ndcg@10")
            diff = row.get(f"{path}_minus_published")
            lines.append(
                f"| {row['data']} | {row['queries']} | {row['corpus']} | {','.join(map(str, row['grades']))} | "
                f"{'mteb.evaluate' if path == 'mteb' else 'st-hardneg evaluate_beir'} | "
                + " | ".join(f"{row[path][m]:.2f}" for m in METRICS)
                + f" | {published if published is not None else '-'} | "
                + (f"{diff:+.2f}" if diff is not None else "-") + f" | {row[f'{path}_seconds']:.0f} |")
        if "mteb" not in row:
            lines.append(f"| {row['data']} | | | | mteb.evaluate | not run | | | | | |")
    lines += ["", "Largest |ours - mteb| over the three metrics: "
              + ", ".join(f"{row['data']} {max(abs(v) for v in row['ours_minus_mteb'].values()):.1e}"
                          for row in payload["rows"] if "ours_minus_mteb" in row) + "."]
    return "\n".join(lines) + "\n"

# --------------------------------------------------------------------------- main
def sts_main(argv: list[str]) -> int:
    """``sts``: print (or, with ``--write``, write) ``untrained_eval.md`` from its JSON."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.untrained sts",
                                     description="The untrained model's transfer / STS / alignment report.")
    parser.add_argument("--json", default=str(DEFAULT_JSON))
    parser.add_argument("--write", "--report", action="store_true", help="rewrite the .md beside the JSON")
    args = parser.parse_args(argv)
    path = Path(args.json)
    text = sts_markdown(json.loads(path.read_text()))
    if args.write:
        path.with_suffix(".md").write_text(text)
    else:
        print(text, end="")
    return 0


def beir_main(argv: list[str]) -> int:
    """``beir``: measure the BEIR folders (or, with ``--render-only``, re-render ``untrained_beir.md``)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.untrained beir",
                                     description="The untrained model on the BEIR test splits: mteb vs ours.")
    parser.add_argument("--data", action="append", default=None,
                        help="a BEIR folder (repeatable); default: the shared SciFact and NFCorpus")
    parser.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "st_hardneg" / "beir-embeddings"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--render-only", "--report", action="store_true", help="only the markdown from the JSON")
    parser.add_argument("--append", action="store_true", help="add the rows to the JSON (a data set's row replaced)")
    args = parser.parse_args(argv)
    if args.render_only:
        MD_PATH.write_text(beir_render(json.loads(JSON_PATH.read_text())))
        return 0
    folders = [Path(d) for d in args.data] if args.data else [SHARED / "nfcorpus", SHARED / "scifact"]
    payload: dict[str, Any] = {"threads": args.threads, "machine": platform.machine(), "rows": []}
    if args.append and JSON_PATH.is_file():
        payload = json.loads(JSON_PATH.read_text())

    def save(row: dict[str, Any]) -> None:
        payload["rows"] = [r for r in payload["rows"] if r["data"] != row["data"]] + [row]
        RESULTS.mkdir(parents=True, exist_ok=True)
        JSON_PATH.write_text(json.dumps(payload, indent=2) + "\n")
        MD_PATH.write_text(beir_render(payload))

    for folder in folders:
        save(beir_measure(folder, Path(args.cache_dir), args.threads, save=save))
    print(MD_PATH.read_text())
    return 0


COMMANDS = {"sts": sts_main, "beir": beir_main}


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.untrained {sts,beir} ...``: the subcommand's own options follow its name."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in COMMANDS:
        parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
        parser.add_argument("command", choices=tuple(COMMANDS), help="sts: untrained_eval.md; beir: untrained_beir.*")
        parser.parse_args(argv[:1])  # --help, or an unknown command: argparse prints and exits
        return 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
