"""The untrained embedded model, evaluated once: transfer / STS / alignment (``sts``) and the BEIR test splits through
mteb next to our scorer (``beir``). Nothing is trained here. Two studies, each run and rendered by the one runner:

``benchmarks/studies/untrained_sts.json`` (:func:`sts_trial`, one trial: the model on SentEval) keeps
``results/untrained_eval.json`` and renders ``results/untrained_eval.md`` from it (:func:`sts_markdown`): transfer,
MTEB-local STS next to ``evaluate_sts``, alignment/uniformity of ``load_default_model()`` with CLS pooling, no
training.

``benchmarks/studies/untrained_beir.json`` (:func:`beir_trial`, one trial a BEIR folder: SciFact and NFCorpus under
the shared data) scores the untrained all-MiniLM-L6-v2, as published (its own mean pooling and normalisation, 256
tokens), twice on the test split:

- ``mteb``: ``mteb.evaluate(model, task, cache=None)`` on the folder as an mteb retrieval task
  (:func:`st_hardneg.evaluation.mteb_tasks.beir_mteb_task`), mteb's own encoding, search and scores;
- ``ours``: :func:`st_hardneg.evaluation.retrieval.evaluate_beir` (graded ``pytrec_eval``), embeddings cached per model
  under the study's work folder.

Both are compared with the published MTEB scores of sentence-transformers/all-MiniLM-L6-v2 (SciFact 64.51, NFCorpus
31.59 nDCG@10). Results: ``benchmarks/results/untrained_beir.json`` and ``.md`` (:func:`beir_render`)::

    python -m benchmarks.studies benchmarks/studies/untrained_sts.json --check    # untrained_eval.md == its record?
    python -m benchmarks.studies benchmarks/studies/untrained_beir.json --check   # untrained_beir.md == its records?
    python -m benchmarks.studies benchmarks/studies/untrained_beir.json --run     # measure the folders left (a few
                                                                                 # minutes per data set, one thread)

The committed records are the studies' finished trials: ``--run`` measures again only what is not in them.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import data_folder

#: the studies' one row: the model as given, no training
ROW = "untrained"

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


def beir_measure(folder: Path, cache_dir: Path, threads: int, *, name: str | None = None,
                 model_path: str | None = None, show_progress_bar: bool = False) -> dict[str, Any]:
    """The untrained model (``model_path``: a saved model instead, for a smoke run) on one BEIR folder's test split,
    scored by :func:`~st_hardneg.evaluation.retrieval.evaluate_beir` (embeddings cached in ``cache_dir``) and by
    ``mteb.evaluate``, on ``threads`` torch threads (restored afterwards). Returns the records file's row.

    Raises:
        RuntimeError: mteb reports an exception.
    """
    import mteb
    import torch

    from st_hardneg.data.beir import load_beir
    from st_hardneg.evaluation.mteb_tasks import beir_mteb_task
    from st_hardneg.evaluation.retrieval import evaluate_beir
    from st_hardneg.models import module_stack, resolve_model, weights_digest

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        data = load_beir(folder, name=name)
        task = data.task("test")
        model = resolve_model(model_path, saved="as_is", device="cpu")
        published = PUBLISHED.get(data.name)
        row: dict[str, Any] = {
            "data": data.name, "folder": str(folder), "split": "test", "queries": len(task.queries),
            "corpus": len(task.corpus), "grades": sorted({g for docs in task.qrels.values() for g in docs.values()}),
            "model": model_path or "sentence-transformers/all-MiniLM-L6-v2 (embedded, as published)",
            "modules": module_stack(model), "weights": weights_digest(model), "max_seq_length": model.max_seq_length,
            "published_ndcg@10": published}
        start = time.perf_counter()
        ours = evaluate_beir(model, [task], max_seq_length=256, cache_dir=cache_dir,
                             show_progress_bar=show_progress_bar)[task.name]
        row["ours"] = {m: ours[m] for m in METRICS}
        row["ours_seconds"] = time.perf_counter() - start
        row["ours_minus_published"] = None if published is None else row["ours"]["ndcg@10"] - published
        start = time.perf_counter()
        result = mteb.evaluate(model, beir_mteb_task(data, "test", max_seq_length=256), cache=None, co2_tracker=False,
                               encode_kwargs={"batch_size": 64, "show_progress_bar": show_progress_bar})
    finally:
        torch.set_num_threads(previous)
    if result.exceptions:
        raise RuntimeError(f"mteb failed: {result.exceptions}")
    scores = result.task_results[0].scores["test"][0]
    row["mteb"] = {m: 100.0 * float(scores[key]) for m, key in MTEB_KEYS.items()}
    row["mteb_seconds"] = time.perf_counter() - start
    row["ours_minus_mteb"] = {m: row["ours"][m] - row["mteb"][m] for m in METRICS}
    row["mteb_minus_published"] = None if published is None else row["mteb"]["ndcg@10"] - published
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


# --------------------------------------------------------------------------- the studies' trials and records files
def _provenance(context: Mapping[str, Any]) -> dict[str, Any]:
    provenance = context.get("provenance") or {}
    return {key: provenance[key] for key in ("commit", "library") if key in provenance}


def _threads(spec: Any, context: Mapping[str, Any]) -> int:
    from st_hardneg import validation

    return validation.check_count(context.get("threads", spec.protocol.get("threads", 1)), "threads", minimum=1)


def check(spec: Any, points: Sequence[Any], context: Mapping[str, Any]) -> None:
    """Both specs' ``report.prepare``: refuse, before any model loads, a thread count or a data folder that a trial
    left to run would refuse.

    Raises:
        ValueError: naming the value or the folder.
    """
    _threads(spec, context)
    for point in points:
        data_folder(spec, point, context)


def beir_check(spec: Any, points: Sequence[Any], context: Mapping[str, Any]) -> None:
    """The ``untrained_beir`` spec's ``report.prepare``: :func:`check`, and a BEIR folder without test qrels refused.

    Raises:
        ValueError: naming the value, the folder or its missing split.
    """
    from st_hardneg.data.beir import load_beir
    from st_hardneg.data.senteval import DataNotFoundError

    check(spec, points, context)
    for point in points:
        folder = data_folder(spec, point, context)
        try:
            data = load_beir(folder, name=point.dataset)
        except DataNotFoundError as exc:
            raise ValueError(str(exc)) from None
        if "test" not in data.qrels:
            raise ValueError(f"the BEIR folder {folder} has no qrels/test.tsv, which the study scores")


#: the SentEval transfer protocol as the sts record states it
TRANSFER_PROTOCOL = ("SentEval scikit-learn path, SimCSE 'test' mode: 10 folds; C grid 2^-2..2^3 (MR/CR/SUBJ/MPQA "
                     "inner 10-fold, SST2 dev), 2^-1..2^5 (TREC/MRPC 10-fold on train); seed 1111; "
                     "LogisticRegression(lbfgs, max_iter=1000)")


def sts_trial(spec: Any, point: Any, context: Mapping[str, Any]) -> dict[str, Any]:
    """The ``untrained_sts`` study's one trial: ``load_default_model()`` (CLS pooling; ``context["model"]``: another
    encoder) on the point's SentEval folder: the full transfer protocol (``evaluate_transfer(fast=False)``), the 7
    STS sets by ``evaluate_sts`` (one call, and one call per set) and by ``run_mteb(model, "local")`` with their
    differences, and alignment / uniformity on STS-B dev and test. Returns ``untrained_eval.json``'s content (about
    an hour and a half on 2 busy cores).

    Raises:
        ValueError: no SentEval folder.
    """
    from importlib.metadata import version

    import sklearn
    import torch
    import transformers
    from sentence_transformers import __version__ as st_version

    from st_hardneg.data.transfer import read_transfer_task
    from st_hardneg.evaluation import alignment_uniformity, evaluate_sts, evaluate_transfer, run_mteb
    from st_hardneg.models import resolve_model

    root = data_folder(spec, point, context)
    model = resolve_model(context.get("model"), pooling="cls", device="cpu")
    start = time.perf_counter()
    transfer = evaluate_transfer(model, root, fast=False, return_details=True, show_progress_bar=False)
    wall = time.perf_counter() - start
    details = transfer.pop("details")
    fit = sum(d["fit_seconds"] for d in details.values())
    unique = {s for task in details for split in read_transfer_task(root, task).values()
              for s in (*split.sentences, *(split.sentences2 or ()))}
    start = time.perf_counter()
    sts = evaluate_sts(model, root, show_progress_bar=False)
    sts_seconds = time.perf_counter() - start
    per_task = {task: evaluate_sts(model, root, tasks=[task], show_progress_bar=False)[task]
                for task in STS_TO_MTEB}
    start = time.perf_counter()
    mteb = run_mteb(model, "local", root, show_progress_bar=False)
    mteb_seconds = time.perf_counter() - start
    alignment = {}
    for split in ("dev", "test"):
        started = time.perf_counter()
        alignment[split] = {**alignment_uniformity(model, root, split=split),
                            "wall_seconds": round(time.perf_counter() - started, 1)}
    return {
        "model": context.get("model") or ("all-MiniLM-L6-v2 embedded default (st_hardneg.models."
                                          "load_default_model()), CLS pooling, untrained"),
        "date": time.strftime("%Y-%m-%d"),
        "machine": {"cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "note": f"{os.cpu_count()} CPU cores; wall times are indicative"},
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "sentence_transformers": st_version, "transformers": transformers.__version__,
                     "mteb": version("mteb"), "scikit_learn": sklearn.__version__},
        "transfer": {"protocol": TRANSFER_PROTOCOL, "scores": transfer, "details": details,
                     "wall_seconds": round(wall, 1), "encode_seconds": round(wall - fit, 1),
                     "fit_seconds": round(fit, 1), "unique_sentences": len(unique)},
        "sts": {"evaluate_sts": sts, "wall_seconds": round(sts_seconds, 1)},
        "mteb_local": {**mteb, "wall_seconds": round(mteb_seconds, 1),
                       "minus_evaluate_sts_7_tasks_call": {local: mteb["scores"][local] - sts[task]
                                                           for task, local in STS_TO_MTEB.items()},
                       "evaluate_sts_per_task_calls": per_task,
                       "minus_evaluate_sts_per_task_calls": {local: mteb["scores"][local] - per_task[task]
                                                             for task, local in STS_TO_MTEB.items()}},
        "alignment_uniformity": alignment,
        **_provenance(context),
    }


def sts_read(data: Mapping[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The ``untrained_sts`` spec's ``report.read``: ``untrained_eval.json`` is one measurement, its one record, of
    the one row :data:`ROW` on the spec's one dataset."""
    return [dict(data)], {"row": ROW}


def sts_layout(records: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`sts_read`'s inverse: the one record.

    Raises:
        ValueError: more than one record (the file holds one measurement).
    """
    if len(records) > 1:
        raise ValueError(f"untrained_eval.json holds one measurement, got {len(records)} records")
    return dict(records[0]) if records else {}


def beir_trial(spec: Any, point: Any, context: Mapping[str, Any]) -> dict[str, Any]:
    """The ``untrained_beir`` study's trial: :func:`beir_measure` of the point's BEIR folder on the protocol's
    ``threads`` (``--set threads=N``), embeddings cached under ``context["work_dir"]`` (or ``context["cache_dir"]``),
    ``context["model"]`` another saved model (a smoke run). Returns the folder's row, with the threads and machine
    (lifted to the file's top by :func:`beir_layout`) and the commit and library tree it ran from.

    Raises:
        ValueError: no such folder, a bad thread count. RuntimeError: mteb failed.
    """
    threads = _threads(spec, context)
    folder = data_folder(spec, point, context)
    cache = Path(context.get("cache_dir") or Path(context["work_dir"]) / "beir-embeddings")
    row = beir_measure(folder, cache, threads, name=point.dataset, model_path=context.get("model"))
    return {**row, "threads": threads, "machine": platform.machine(), **_provenance(context)}


#: what ``untrained_beir.json`` holds at its top, of every row
BEIR_TOP = ("threads", "machine")


def beir_read(data: Mapping[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The ``untrained_beir`` spec's ``report.read``: one record a BEIR folder (its ``data`` the dataset), of the one
    row :data:`ROW`; the file's threads and machine are the meta."""
    return [dict(r) for r in data["rows"]], {**{k: data[k] for k in BEIR_TOP if k in data}, "row": ROW}


def beir_layout(records: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`beir_read`'s inverse: ``{"threads", "machine", "rows"}``, the threads and machine of new records
    lifted to the top.

    Raises:
        ValueError: rows measured on different thread counts or machines (one file holds one of each).
    """
    top: dict[str, Any] = {}
    for key in BEIR_TOP:
        values = {r[key] for r in records if key in r} | ({meta[key]} if key in meta else set())
        if len(values) > 1:
            raise ValueError(f"untrained_beir.json holds one {key}, but its rows have {sorted(map(str, values))}")
        if values:
            top[key] = values.pop()
    return {**top, "rows": [{k: v for k, v in r.items() if k not in BEIR_TOP} for r in records]}

