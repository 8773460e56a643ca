"""The untrained all-MiniLM-L6-v2, as published, on the local BEIR test splits: mteb.evaluate vs our scorer.

For each BEIR folder (default: SciFact and NFCorpus under the shared data) the model as published (its own mean
pooling and normalisation, 256 tokens) is scored twice on the test split:

- ``mteb``: ``mteb.evaluate(model, task, cache=None)`` on the folder as an mteb retrieval task
  (:func:`st_hardneg.evaluation.mteb_tasks.beir_mteb_task`), mteb's own encoding, search and scores;
- ``ours``: :func:`st_hardneg.evaluation.retrieval.evaluate_beir` (graded ``pytrec_eval``), embeddings cached per model.

Both are compared with the published MTEB scores of sentence-transformers/all-MiniLM-L6-v2 (SciFact 64.51, NFCorpus
31.59 nDCG@10). Results: ``benchmarks/results/untrained_beir.json`` and ``.md`` (rendered from the JSON)::

    python -m benchmarks.untrained_beir                 # measure (a few minutes per data set on one thread)
    python -m benchmarks.untrained_beir --render-only   # the markdown from the JSON
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
JSON_PATH = RESULTS / "untrained_beir.json"
MD_PATH = RESULTS / "untrained_beir.md"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "retrieval"
#: published MTEB nDCG@10 x 100 of sentence-transformers/all-MiniLM-L6-v2
PUBLISHED = {"scifact": 64.51, "nfcorpus": 31.59}
METRICS = ("ndcg@10", "mrr@10", "recall@100")
MTEB_KEYS = {"ndcg@10": "ndcg_at_10", "mrr@10": "mrr_at_10", "recall@100": "recall_at_100"}


def measure(folder: Path, cache_dir: Path, threads: int, save: Any = None) -> dict[str, Any]:
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


def render(payload: dict[str, Any]) -> str:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", action="append", default=None,
                        help="a BEIR folder (repeatable); default: the shared SciFact and NFCorpus")
    parser.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "st_hardneg" / "beir-embeddings"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--render-only", action="store_true")
    parser.add_argument("--append", action="store_true", help="add the rows to the JSON (a data set's row replaced)")
    args = parser.parse_args(argv)
    if args.render_only:
        MD_PATH.write_text(render(json.loads(JSON_PATH.read_text())))
        return 0
    folders = [Path(d) for d in args.data] if args.data else [SHARED / "nfcorpus", SHARED / "scifact"]
    payload: dict[str, Any] = {"threads": args.threads, "machine": platform.machine(), "rows": []}
    if args.append and JSON_PATH.is_file():
        payload = json.loads(JSON_PATH.read_text())

    def save(row: dict[str, Any]) -> None:
        payload["rows"] = [r for r in payload["rows"] if r["data"] != row["data"]] + [row]
        RESULTS.mkdir(parents=True, exist_ok=True)
        JSON_PATH.write_text(json.dumps(payload, indent=2) + "\n")
        MD_PATH.write_text(render(payload))

    for folder in folders:
        save(measure(folder, Path(args.cache_dir), args.threads, save=save))
    print(MD_PATH.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
