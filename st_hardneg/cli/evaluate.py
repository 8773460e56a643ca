"""``st-hardneg eval`` and ``st-hardneg compare`` (see :mod:`st_hardneg.cli.app`): evaluate a model and print
markdown tables (:func:`cmd_eval`), compare retrieval runs query by query (:func:`cmd_compare`). Only the standard
library is imported at module level (``--help`` loads no deep-learning library).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

EVAL_TASK_GROUPS = ("sts", "transfer", "mteb", "align", "beir")


#: the pooling of an encoder without ``modules.json`` in every task: what ``SentenceTransformer(path)`` gives it, the
#: rule of :func:`st_hardneg.models.resolve_model` with ``saved="as_is"``
#: (:data:`st_hardneg.models.BARE_ENCODER_POOLING`; kept here too so that ``--help`` imports no deep-learning library)
BARE_ENCODER_POOLING = "mean"


def load_for_eval(name: str | None, pooling: str | None) -> SentenceTransformer:
    """The model as published: a saved SentenceTransformer (a folder or a cached Hub snapshot with ``modules.json``,
    or the embedded all-MiniLM-L6-v2) with all its own modules; with ``pooling`` given, the encoder with a fresh
    pooling of that mode. An encoder without a saved pooling gets :data:`BARE_ENCODER_POOLING` (mean) at its own
    length in every task, as ``SentenceTransformer(path)`` and ``resolve_model(path, saved="as_is")`` give it (one
    rule, said in the printed module line by :func:`bare_encoder_note`). See :func:`st_hardneg.models.resolve_model`."""
    from st_hardneg.models import resolve_model

    if pooling is not None:
        return resolve_model(name, pooling=pooling, max_seq_length=None, saved="rebuild")
    return resolve_model(name, saved="as_is")


def bare_encoder_note(name: str | None, pooling: str | None) -> str:
    """What the printed module line says of a model without ``modules.json`` (``""`` for a saved model or an explicit
    ``--pooling``): the pooling it gets and why, and a saved ``1_Pooling`` it does not use."""
    from st_hardneg.models import saved_model_dir

    if pooling is not None or name in (None, "", "default") or saved_model_dir(name) is not None:
        return ""
    note = f" [no modules.json: Pooling({BARE_ENCODER_POOLING}), as SentenceTransformer(path) gives it"
    pooling_config = Path(str(name)).expanduser() / "1_Pooling" / "config.json"
    if pooling_config.is_file():
        import json

        try:
            saved = json.loads(pooling_config.read_text(encoding="utf-8")).get("pooling_mode", "?")
        except (ValueError, AttributeError, UnicodeDecodeError):
            saved = "unreadable"
        note += f"; its 1_Pooling/config.json ({saved}) is not used without modules.json: pass --pooling {saved}"
    return note + "]"


def eval_model_name(args: argparse.Namespace) -> str:
    """The name results are filed under: ``--model-name``, else the embedded model's Hub name, the name an
    st-hardneg run saved with the model (its ``model_meta.json``: ``train --model-name``, else the run's folder), a Hub
    name as given, or ``local/<folder name>`` for another path (``local/<run folder>`` for a run's ``final/``)."""
    from st_hardneg.models import DEFAULT_MODEL_NAME, mteb_model_name, read_model_meta

    if args.model_name:
        return mteb_model_name(args.model_name)
    if args.model in (None, "", "default"):
        return f"sentence-transformers/{DEFAULT_MODEL_NAME}"
    path = Path(args.model).expanduser()
    if path.exists():
        saved = read_model_meta(path) if path.is_dir() else None
        if saved and isinstance(saved.get("name"), str) and saved["name"].strip():
            return mteb_model_name(saved["name"].strip())
        folder = path.resolve()
        if folder.name == "final" and (folder.parent / "results.json").is_file():  # a run's model: the run's name
            return f"local/{folder.parent.name}"
        return f"local/{folder.name}"
    return mteb_model_name(args.model)


def read_saved_meta(model: str | None) -> dict[str, Any] | None:
    """The ``model_meta.json`` an st-hardneg run saved beside the model ``--model`` names, if any."""
    from st_hardneg.models import read_model_meta

    if model in (None, "", "default") or not Path(str(model)).expanduser().is_dir():
        return None
    return read_model_meta(str(model))


def _check_names(model_name: str, revision: str | None) -> None:
    """``--model-name`` and ``--revision`` become folder names: each part a plain name (no ``..``, no separator),
    checked before any model loads."""
    from st_hardneg.cli.paths import check_path_component

    if revision is not None:
        check_path_component(revision, "--revision")
    for part in model_name.split("/"):  # org/name: each part a plain name (mteb files it under org__name too)
        check_path_component(part, "--model-name")


def _eval_files(args: argparse.Namespace, model_name: str, revision: str) -> dict[str, Path]:
    """Where ``eval`` writes: ``--output-dir X.json`` → that file, side files ``X.per_query.tsv`` / ``X.<task>.trec``
    beside it; a folder → ``<folder>/st-hardneg/<org>__<name>/<revision>/eval.json`` (+ ``per_query.tsv``,
    ``<task>.trec``), mteb's own files under ``<folder>/results/`` (its ``ResultCache``)."""
    from st_hardneg.cli.paths import ensure_inside

    _check_names(model_name, revision)
    target = Path(args.output_dir).expanduser()
    if str(args.output_dir).endswith(".json"):
        stem = target.name[: -len(".json")]
        files = {"results": target, "folder": target.parent, "per_query": target.parent / f"{stem}.per_query.tsv",
                 "runs": target.parent / f"{stem}.{{task}}.trec", "mteb": target.parent}
    else:
        folder = target / "st-hardneg" / model_name.replace("/", "__") / revision
        files = {"results": folder / "eval.json", "folder": folder, "per_query": folder / "per_query.tsv",
                 "runs": folder / "{task}.trec", "mteb": target}
    root = target.parent if str(args.output_dir).endswith(".json") else target
    for key in ("results", "folder", "per_query", "runs"):
        ensure_inside(files[key], root, getattr(args, "output_option", "--output-dir"))
    return files


def _previous_record(args: argparse.Namespace, files: dict[str, Path], model_name: str,
                     revision: str | None) -> dict[str, Any]:
    """The earlier record at ``files["results"]``, checked as input (:func:`~st_hardneg.evaluation.planning.
    read_eval_record`): ``{}`` when there is none, or with ``--overwrite`` when it is not a readable ``eval.json``
    (then it is replaced). A ``--output X.json`` that exists is refused without ``--overwrite``."""
    from st_hardneg.evaluation.planning import EvalRecordError, read_eval_record

    path = files["results"]
    if not path.exists():
        return {}
    if str(args.output_dir).endswith(".json") and not args.overwrite:  # a file the user named: replaced when asked
        raise ValueError(f"{path} exists (an evaluation of {model_name}{f' {revision}' if revision else ''}); pass "
                         "--overwrite to replace it")
    try:
        return read_eval_record(path)
    except EvalRecordError:
        if args.overwrite:
            return {}
        raise


def cmd_eval(args: argparse.Namespace) -> int:
    from st_hardneg.cli.paths import ensure_writable_dir, ensure_writable_file
    from st_hardneg.evaluation import evaluate_sts
    from st_hardneg.evaluation.planning import merge_mteb, merged_settings, plan_eval
    from st_hardneg.reporting import write_json

    groups = [g.strip() for g in args.tasks.split(",") if g.strip()]
    unknown = [g for g in groups if g not in EVAL_TASK_GROUPS]
    if unknown or not groups:
        raise ValueError(f"--tasks: unknown {unknown}; choose from {', '.join(EVAL_TASK_GROUPS)}")
    if len(set(groups)) != len(groups):
        raise ValueError(f"--tasks names a group twice: {args.tasks!r}")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    option = getattr(args, "output_option", "--output-dir")
    if getattr(args, "cache_dir", None):  # proven before the model loads and encodes, not after
        ensure_writable_dir(args.cache_dir, "--cache-dir")
    if str(args.output_dir).endswith(".json"):
        ensure_writable_file(args.output_dir, option)
    else:
        ensure_writable_dir(args.output_dir, option)
    from st_hardneg.data.model_folders import check_model_source

    model_source = check_model_source(args.model, "--model")  # a file, a damaged folder: one line before the model loads
    if model_source.router and args.pooling is not None:
        raise ValueError(f"--pooling {args.pooling}: {args.model} is a Router model (query / document towers), whose "
                         "pooling is inside each route: drop --pooling to evaluate it as saved")
    model_name = eval_model_name(args)
    _check_names(model_name, args.revision)  # --model-name .. fails here, before the model loads
    folders = args.data or []
    beir_tasks: list[Any] = []
    loaded: list[Any] = []
    if folders and not {"beir", "mteb"} & set(groups):
        raise ValueError("--data is the BEIR folder of --task beir (or of --tasks mteb); SentEval data is --data-dir")
    if "beir" in groups and not folders:
        raise ValueError("--task beir needs --data PATH: a BEIR folder (corpus.jsonl, queries.jsonl, qrels/*.tsv)")
    if args.max_seq_length is not None:
        from st_hardneg.validation import check_count

        check_count(args.max_seq_length, "--max-seq-length", minimum=1)
    if folders:  # before the model loads: a bad folder or split fails first
        from st_hardneg.data.beir import load_beir

        loaded = [load_beir(folder) for folder in folders]
        names = [data.name for data in loaded]
        if len(set(names)) != len(names):
            raise ValueError(f"--data: two folders share a name ({', '.join(names)}); their results would collide")
        beir_tasks = [data.task(args.split) for data in loaded]
    if "sts" in groups:  # a damaged STS file fails before the model loads
        from st_hardneg.cli.checks import check_sts_files

        check_sts_files(args.data_dir)
    if args.revision is not None or str(args.output_dir).endswith(".json"):  # its place is known: checked now
        _previous_record(args, _eval_files(args, model_name, args.revision or "weights"), model_name, args.revision)
    pooling = args.pooling
    model = load_for_eval(args.model, pooling)
    if args.max_seq_length is None:  # the length the model is saved with, as mteb evaluates it
        args.max_seq_length = model.max_seq_length
    from st_hardneg.models import module_stack, weights_digest

    weights = weights_digest(model)
    revision = args.revision or f"weights-{weights}"
    files = _eval_files(args, model_name, revision)
    mteb_tasks: list[Any] = []
    if "mteb" in groups:
        from st_hardneg.evaluation.mteb_tasks import beir_mteb_task

        default = "" if folders else "STSBenchmark-local"
        mteb_tasks = [t.strip() for t in (args.mteb_tasks or default).split(",") if t.strip()]
        mteb_tasks += [beir_mteb_task(data, args.split, max_seq_length=args.max_seq_length) for data in loaded]
    settings = _eval_settings(args, groups, model, weights, revision, loaded, beir_tasks, mteb_tasks)
    previous = _previous_record(args, files, model_name, revision)
    plan = plan_eval(previous, settings, files["results"], overwrite=args.overwrite)
    previous = plan.record
    from st_hardneg.cli.paths import check_path_component

    todo_beir = [task for task in beir_tasks if task.name in plan.beir]
    side = [files["per_query"]] if todo_beir and previous.get("files", {}).get("per_query") is None else []
    side += [Path(str(files["runs"]).replace("{task}", check_path_component(task.name, "a BEIR task name")))
             for task in todo_beir]
    taken = [str(path) for path in side if path.exists()]
    if taken and not args.overwrite:  # the side files of --output X.json are not the user's to lose either
        raise ValueError(f"{', '.join(taken)} exist(s); pass --overwrite to replace them")
    print(f"model: {model_name} ({revision}): {module_stack(model)}"
          + (f" [fresh {args.pooling} pooling, --pooling]" if args.pooling else "")
          + bare_encoder_note(args.model, args.pooling))
    if plan.skipped:
        print(f"already in {files['results']} (skipped; --overwrite recomputes): {', '.join(plan.skipped)}")
    if plan.dropped:
        print(f"removed from {files['results']} (computed with other weights): {', '.join(plan.dropped)}")
    source = args.model or "default (all-MiniLM-L6-v2, embedded)"
    name = args.model_name or source  # the tables name the model as --model-name does, else by its path
    results: dict[str, Any] = {**previous, "model": source, "model_name": model_name, "revision": revision,
                               "modules": module_stack(model), "files": dict(previous.get("files", {})),
                               "settings": merged_settings(previous, settings)}
    start = time.perf_counter()
    if "sts" in plan.groups:
        results["sts"] = evaluate_sts(model, args.data_dir, batch_size=args.batch_size,
                                      show_progress_bar=not args.quiet)
    if "transfer" in plan.groups:
        from st_hardneg.evaluation import evaluate_transfer

        results["transfer"] = evaluate_transfer(model, args.data_dir, fast=args.fast)
    if "mteb" in plan.groups:
        from st_hardneg.evaluation import run_mteb

        todo_mteb = [t for t in mteb_tasks if _mteb_task_name(t) in plan.mteb]
        ran = run_mteb(model, todo_mteb, data_dir=args.data_dir, output_dir=files["mteb"],
                       model_name=model_name, revision=revision, batch_size=args.batch_size,
                       known_meta=read_saved_meta(args.model),
                       use_cache=not args.overwrite and args.revision is None,  # keyed by the weights and the data
                       show_progress_bar=not args.quiet)
        results["mteb"] = merge_mteb(previous.get("mteb"), ran)
        results["files"]["mteb"] = str(files["mteb"])
    if "align" in plan.groups:
        from st_hardneg.evaluation import alignment_uniformity

        results["align"] = alignment_uniformity(model, args.data_dir)
    retrieved: dict[str, Any] = {}
    if todo_beir:
        from st_hardneg.evaluation.retrieval import BEIR_METRICS, retrieve

        retrieved = retrieve(model, todo_beir, max_seq_length=args.max_seq_length, batch_size=args.batch_size,
                             show_progress_bar=not args.quiet, cache_dir=args.cache_dir,
                             query_prompt_name=args.query_prompt_name,
                             document_prompt_name=args.document_prompt_name)
        results["beir"] = dict(previous.get("beir", {}))
        for data, task in zip(loaded, beir_tasks, strict=True):
            if task.name not in retrieved:
                continue
            scores = retrieved[task.name].scores
            results["beir"][task.name] = {"data": str(data.root), "split": args.split,
                                          "max_seq_length": args.max_seq_length,
                                          "prompts": retrieved[task.name].prompts,
                                          **{m: scores[m] for m in BEIR_METRICS},
                                          "queries": scores["queries"], "corpus": scores["corpus"]}
    seconds = time.perf_counter() - start
    results["seconds"] = float(previous.get("seconds", 0.0)) + seconds
    print("\n\n".join(_eval_tables(results, groups, [task.name for task in beir_tasks], name)))
    if not plan.groups and not plan.dropped:
        print(f"\nnothing to compute: every requested result is in {files['results']} (--overwrite recomputes)")
        return 0
    files["folder"].mkdir(parents=True, exist_ok=True)
    if retrieved:
        from st_hardneg.evaluation.planning import record_file
        from st_hardneg.evaluation.runs import read_per_query, write_per_query, write_trec_run

        per_query = {task: result.per_query for task, result in retrieved.items()}
        if previous.get("files", {}).get("per_query"):  # the earlier tasks' rows stay in the file
            earlier_file = record_file(files["results"], "'files.per_query'", previous["files"]["per_query"])
            earlier = read_per_query(files["folder"] / earlier_file)
            per_query = {**{t: q for t, q in earlier.items() if t not in per_query and t in results["beir"]},
                         **per_query}
        written = write_per_query(files["per_query"], per_query)
        results["files"]["per_query"] = written.name
        results["files"]["runs"] = dict(previous.get("files", {}).get("runs", {}))
        for task, result in retrieved.items():
            run = write_trec_run(str(files["runs"]).replace("{task}", task), result.run, tag=model_name.replace(" ", "_"))
            results["files"]["runs"][task] = run.name
    write_json(files["results"], results)
    print(f"\nresults: {files['results']}")
    return 0


def _mteb_task_name(task: Any) -> str:
    return task if isinstance(task, str) else str(task.metadata.name)


def _eval_settings(args: argparse.Namespace, groups: list[str], model: Any, weights: str, revision: str,
                   loaded: list[Any], beir_tasks: list[Any], mteb_tasks: list[Any]) -> dict[str, Any]:
    """The request's settings (:func:`~st_hardneg.evaluation.planning.eval_settings`) from the parsed options: the
    model's modules, weights digest and revision, the content digests of the data (SentEval STS files, BEIR
    folders, local mteb tasks)."""
    from st_hardneg.data.senteval import STS_DEV_TASKS, STS_TASKS, DataNotFoundError, resolve_senteval_dir, sts_files
    from st_hardneg.evaluation.mteb_tasks import LOCAL_MTEB_TASKS, content_revision
    from st_hardneg.evaluation.planning import eval_settings, senteval_digest
    from st_hardneg.models import module_stack

    senteval: Path | None = None
    if {"sts", "transfer", "align", "mteb"} & set(groups):
        try:
            senteval = resolve_senteval_dir(args.data_dir).resolve()
        except DataNotFoundError:  # an mteb run of BEIR folders only; the groups that need it fail when they run
            senteval = None
    sts_digest = None
    if {"sts", "align"} & set(groups):
        sts_digest = senteval_digest(senteval, [f for t in (*STS_TASKS, *STS_DEV_TASKS) for f in sts_files(t)])
    mteb: list[tuple[str, str | None]] = []
    for task in mteb_tasks:
        if not isinstance(task, str):
            mteb.append((str(task.metadata.name), str(task.metadata.revision)))
        elif task in LOCAL_MTEB_TASKS and senteval is not None:
            relative = sts_files(LOCAL_MTEB_TASKS[task])
            present = all((senteval / f).is_file() for f in relative)
            mteb.append((task, content_revision([senteval / f for f in relative]) if present else None))
        else:
            mteb.append((task, None))
    beir = [(task.name, str(data.root.resolve()), data.digest(), args.split)
            for data, task in zip(loaded, beir_tasks, strict=True)]
    return eval_settings(groups, modules=module_stack(model), weights=weights, revision=revision,
                         senteval_dir=senteval, sts_digest=sts_digest, fast=bool(args.fast),
                         max_seq_length=args.max_seq_length, beir=beir, mteb=mteb,
                         query_prompt_name=args.query_prompt_name, document_prompt_name=args.document_prompt_name)


def _eval_tables(results: dict[str, Any], groups: list[str], beir_names: list[str], name: str) -> list[str]:
    """The markdown tables of the requested groups, from ``results`` (this run's and the reused ones alike)."""
    from st_hardneg.reporting import markdown_table

    tables: list[str] = []
    for group in groups:
        if group == "sts":
            from st_hardneg.evaluation import format_sts_table

            tables.append("### STS (Spearman x 100)\n\n" + format_sts_table({name: results["sts"]}))
        elif group == "transfer":
            from st_hardneg.evaluation import format_transfer_table

            tables.append("### Transfer (accuracy)\n\n" + format_transfer_table({name: results["transfer"]}))
        elif group == "mteb":
            from st_hardneg.evaluation import format_mteb_table

            tables.append("### MTEB (main score x 100)\n\n" + format_mteb_table({name: results["mteb"]}))
        elif group == "align":
            from st_hardneg.evaluation import format_alignment_table

            tables.append("### Alignment / uniformity (lower is better)\n\n" +
                          format_alignment_table({name: results["align"]}))
        elif group == "beir":
            for task in beir_names:
                scores = results["beir"][task]
                table = markdown_table(["model", "nDCG@10", "MRR@10", "R@100"],
                                       [[name, *(f"{scores[m]:.2f}" for m in ("ndcg@10", "mrr@10", "recall@100"))]])
                tables.append(f"### {task} (x 100, {scores['queries']} queries, {scores['corpus']} documents)\n\n"
                              + table.rstrip("\n"))
    return tables


class OutputOption(argparse.Action):
    """Stores the value and the spelling used (``--output-dir``, ``--output-folder`` or ``--output``), so that an
    error names the option as the user typed it."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        namespace.output_option = option_string or "--output-dir"


def cmd_compare(args: argparse.Namespace) -> int:
    from st_hardneg.evaluation.compare import compare_runs, parse_run_specs

    runs = parse_run_specs(args.runs)
    if len(runs) < 2:
        raise ValueError(f"compare needs the runs of at least two methods (NAME=PATH[,PATH...] each), got "
                         f"{len(runs)}")
    from st_hardneg.cli.paths import ensure_writable_file

    if args.output is not None and getattr(args, "plot", None) is not None and (
            Path(args.output).expanduser().resolve() == Path(args.plot).expanduser().resolve()):
        raise ValueError(f"--output and --plot name the same file ({args.output}): the figure would replace the "
                         "comparison; give two files")
    for option, value in (("--output", args.output), ("--plot", getattr(args, "plot", None))):
        if value is None:
            continue
        if option == "--plot" and not str(value).lower().endswith(".png"):
            raise ValueError(f"--plot {value}: give a .png file")
        target = ensure_writable_file(value, option)
        if target.exists() and not args.overwrite:
            raise ValueError(f"{option} {target} exists; pass --overwrite to replace it")
    result = compare_runs(runs, metric=args.metric, baseline=args.baseline, permutations=args.permutations,
                          seed=args.seed)
    print(result.to_markdown())
    if args.output is not None:
        text = result.to_json() if str(args.output).endswith(".json") else result.to_markdown()
        Path(args.output).expanduser().write_text(text, encoding="utf-8")
        print(f"comparison: {args.output}")
    if getattr(args, "plot", None) is not None:
        from st_hardneg.plots import plot_comparison

        print(f"figure: {plot_comparison(result, Path(args.plot).expanduser())}")
    return 0
