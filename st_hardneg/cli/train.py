"""``st-hardneg train``: the two training tasks behind the command line (see :mod:`st_hardneg.cli.app`).

- ``--task sts`` (:func:`cmd_train`): the papers' unsupervised protocol, STS-B dev selection, the 7-task STS table;
- ``--task retrieval`` (:func:`cmd_train_retrieval`): the recipe of :mod:`st_hardneg.training.retrieval`;
- ``--task beir --data PATH`` (:func:`cmd_train_beir`): any BEIR folder: mined negatives from the whole corpus, dev and
  test nDCG@10 (:data:`st_hardneg.training.retrieval.BEIR_TRAINING`).

Options whose default depends on the task are ``None`` in the parser and filled by :func:`resolve_train_args`, which
also refuses options of the other task. Only the standard library is imported at module level (``--help`` loads no
deep-learning library).
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from st_hardneg.data.senteval import DataNotFoundError
from st_hardneg.training.registry import parse_loss_args

logger = logging.getLogger("st_hardneg")

TRAIN_TASKS = ("sts", "retrieval", "beir")
#: ``train`` defaults of ``--task sts`` (the papers' unsupervised protocol) for the options whose default depends on
#: the task; ``--task retrieval`` takes them from :data:`st_hardneg.training.retrieval.TRAINING` (see
#: :func:`task_defaults`)
STS_DEFAULTS: dict[str, Any] = {"pooling": "cls", "max_seq_length": 32, "batch_size": 64, "lr": 3e-5,
                                "warmup_ratio": 0.0, "epochs": 1.0, "eval_steps": 50}
#: ``train`` options of some tasks only: dest → (option, tasks); given with another task they are an error
TASK_ONLY_OPTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "corpus": ("--corpus", ("sts",)), "eval_steps": ("--eval-steps", ("sts",)),
    "train_file": ("--train-file", ("retrieval",)), "cache_dir": ("--cache-dir", ("retrieval", "beir")),
    "mining_arg": ("--mining-arg", ("retrieval", "beir")), "no_sts": ("--no-sts", ("retrieval",)),
    "data": ("--data", ("beir",)),
}
#: ``SentenceTransformerTrainingArguments`` fields that have their own ``train`` option: ``--training-arg`` refuses
#: them, naming the option
RESERVED_TRAINING_ARGS = {
    "output_dir": "--output-dir", "per_device_train_batch_size": "--batch-size", "learning_rate": "--lr",
    "num_train_epochs": "--epochs", "max_steps": "--max-steps (or --stop-after)", "warmup_steps": "--warmup-ratio",
    "warmup_ratio": "--warmup-ratio", "seed": "--seed", "data_seed": "--seed", "eval_steps": "--eval-steps",
    "batch_sampler": "--allow-duplicates", "disable_tqdm": "-q/--quiet",
}


class RunFailed(RuntimeError):
    """A failure once the work has begun (training, scoring, saving): the command exits with status 1."""


@contextmanager
def run_time(what: str) -> Iterator[None]:
    """Within the block, a failure of a known kind becomes :class:`RunFailed` (exit status 1), its message kept."""
    try:
        yield
    except RunFailed:
        raise
    except (RuntimeError, OSError, ValueError, TypeError, ArithmeticError, ImportError, KeyError, IndexError,
            MemoryError) as exc:
        message = str(exc).strip() or type(exc).__name__
        raise RunFailed(f"{what} failed: {message}") from exc


WRONG_TASK_HINTS = {
    "corpus": "--corpus (one sentence per line) is for --task sts; --task retrieval trains on (anchor, positive"
              "[, negative ...]) rows: use --train-file FILE",
    "train_file": "--train-file is for --task retrieval; --task sts trains on sentences: use --corpus FILE",
    "eval_steps": "--eval-steps (STS-B dev selection) is for --task sts; --task retrieval keeps the final model",
}


def default_corpus(data_dir: str | None) -> Path:
    """``corpus/wiki10k.txt`` (or ``wiki1m_for_simcse.txt``) beside the SentEval directory, if present."""
    from st_hardneg.data.senteval import resolve_senteval_dir

    root = resolve_senteval_dir(data_dir)
    for base in (root.parent, root):
        for rel in ("corpus/wiki1m_for_simcse.txt", "wiki1m_for_simcse.txt", "corpus/wiki10k.txt"):
            if (base / rel).is_file():
                return base / rel
    raise FileNotFoundError(
        f"No --corpus given and no corpus found beside {root}. Pass --corpus FILE (one sentence per line) or "
        "fetch the papers' corpus with `st-hardneg download wiki1m --dest DIR`."
    )


def task_defaults(task: str) -> dict[str, Any]:
    """The defaults of the ``train`` options left unset, per ``--task``: :data:`STS_DEFAULTS`, or for ``retrieval``
    :data:`st_hardneg.training.retrieval.TRAINING` (``beir``: ``BEIR_TRAINING``; no STS-B dev selection:
    ``eval_steps`` 0) and the mined-set cache
    :data:`~st_hardneg.training.retrieval.DEFAULT_CACHE_DIR`."""
    if task == "sts":
        return dict(STS_DEFAULTS)
    from st_hardneg.training.retrieval import BEIR_TRAINING, DEFAULT_CACHE_DIR, TRAINING

    recipe = BEIR_TRAINING if task == "beir" else TRAINING
    return {"pooling": recipe["pooling"], "max_seq_length": recipe["max_seq_length"],
            "batch_size": recipe["batch_size"], "lr": recipe["learning_rate"],
            "warmup_ratio": recipe["warmup_ratio"], "epochs": float(recipe["epochs"]), "eval_steps": 0,
            "cache_dir": str(DEFAULT_CACHE_DIR)}


def resolve_train_args(args: argparse.Namespace) -> argparse.Namespace:
    """Check the ``train`` options against ``args.task`` and fill the ones left unset with :func:`task_defaults`, in
    place (options given on the command line win); returns ``args``.

    Raises:
        ValueError: an option of the other task, or ``--mining-arg`` / ``--cache-dir`` with ``--train-file``
            (nothing is silently ignored); bad ``--stop-after``, ``--max-steps`` or ``--batch-size`` values.
    """
    for dest, (option, tasks) in TASK_ONLY_OPTIONS.items():
        if getattr(args, dest, None) not in (None, False) and args.task not in tasks:
            also = "".join(f", or --task {task}" for task in tasks[1:])
            raise ValueError(WRONG_TASK_HINTS.get(dest, f"{option} applies to --task {tasks[0]} only{also}"))
    if args.task == "beir" and not getattr(args, "data", None):
        raise ValueError("--task beir needs --data PATH: a BEIR folder (corpus.jsonl, queries.jsonl, qrels/*.tsv)")
    if args.train_file is not None and (args.mining_arg or args.cache_dir is not None):
        raise ValueError("--mining-arg and --cache-dir configure the mined MRPC triplets; --train-file trains on your "
                         "rows as they are: drop them")
    if args.max_steps > 0 and args.epochs is not None:  # before the defaults fill --epochs in
        raise ValueError(f"--max-steps {args.max_steps} sets the length of the run and --epochs {args.epochs:g} would "
                         "be ignored: give one of them")
    for key, value in task_defaults(args.task).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    check_output_dir(args.output_dir, getattr(args, "overwrite", False))
    from st_hardneg.cli.paths import ensure_writable_dir

    ensure_writable_dir(args.output_dir, "--output-dir")  # proven with a probe file, before any model loads
    if getattr(args, "save_train_head", False) and not args.mlp_head:
        raise ValueError("--save-train-head keeps the head of --mlp-head; this run has no head: add --mlp-head or drop "
                         "--save-train-head")
    parse_loss_args(args.loss_arg)  # a repeated key fails here (the names are checked by cmd_train)
    parse_loss_args(args.mining_arg, "--mining-arg")
    if args.eval_batch_size < 1:
        raise ValueError(f"--eval-batch-size must be >= 1, got {args.eval_batch_size}")
    if args.max_seq_length is not None and args.max_seq_length < 1:
        raise ValueError(f"--max-seq-length must be >= 1 token, got {args.max_seq_length}")
    if args.limit < 0:
        raise ValueError(f"--limit must be >= 0 (0 = all), got {args.limit}")
    if args.stop_after < 0:
        raise ValueError(f"--stop-after must be >= 0 (0 = train to the end), got {args.stop_after}")
    if args.max_steps == 0 or args.max_steps < -1:
        raise ValueError(f"--max-steps must be a positive number of steps (or -1: use --epochs), got {args.max_steps}")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    if not args.lr > 0:  # NaN fails too
        raise ValueError(f"--lr must be > 0, got {args.lr}")
    if not args.epochs > 0:
        raise ValueError(f"--epochs must be > 0, got {args.epochs}")
    if not 0 <= args.warmup_ratio < 1:
        raise ValueError(f"--warmup-ratio must be in [0, 1) (a share of the steps), got {args.warmup_ratio}")
    return args


def check_output_dir(output_dir: str, overwrite: bool) -> Path:
    """The ``--output-dir`` of ``train``: not empty, not a file, and not a finished run's folder (one holding
    ``results.json``) unless ``overwrite``; nothing is created here.

    Raises:
        ValueError: an empty path, a file, or a finished run without ``--overwrite``.
    """
    if not str(output_dir).strip():
        raise ValueError("--output-dir is empty; give the folder for the checkpoints, final model and results.json")
    path = Path(output_dir).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"--output-dir {path} is a file, not a folder")
    if (path / "results.json").is_file() and not overwrite:
        raise ValueError(f"--output-dir {path} holds a finished run (results.json); choose another folder or pass "
                         "--overwrite to replace it")
    return path


def check_sts_files(data_dir: str | None) -> None:
    """Read every STS test file now (milliseconds), so that a damaged one fails before anything is trained or
    saved, not in the evaluation after training."""
    from st_hardneg.data.senteval import STS_TASKS, check_sts_data, read_sts_pairs, resolve_senteval_dir

    root = resolve_senteval_dir(data_dir)
    check_sts_data(root, STS_TASKS)
    for task in (*STS_TASKS, "STSBenchmark-dev"):
        read_sts_pairs(root, task)


# --------------------------------------------------------------------------- commands
def cmd_train(args: argparse.Namespace) -> int:
    resolve_train_args(args)  # the task's defaults; an option of the other task fails here, before torch loads
    from st_hardneg.training.registry import check_loss_args

    check_loss_args(args.loss, parse_loss_args(args.loss_arg))  # names (and no model=), before any model loads
    args.extra_training_args = resolve_training_args(args)
    if args.task == "retrieval":
        return cmd_train_retrieval(args)
    if args.task == "beir":
        return cmd_train_beir(args)
    import torch
    from transformers import set_seed

    from st_hardneg.data.senteval import pair_dataset, read_corpus
    from st_hardneg.evaluation import SentEvalSTSEvaluator, evaluate_sts, format_sts_table
    from st_hardneg.models import resolve_model
    from st_hardneg.reporting import write_json
    from st_hardneg.training.experiment import run_training
    from st_hardneg.training.loop import TrainConfig
    from st_hardneg.training.registry import build_loss

    loss_kwargs = parse_loss_args(args.loss_arg)
    corpus = Path(args.corpus) if args.corpus else default_corpus(args.data_dir)
    sentences = read_corpus(corpus)
    if args.limit:
        sentences = sentences[: args.limit]
    logger.info("corpus %s: %d sentences", corpus, len(sentences))
    output_dir = Path(args.output_dir)
    config = TrainConfig(
        output_dir=str(output_dir / "checkpoints"),
        batch_size=args.batch_size,
        learning_rate=args.lr,
        epochs=args.epochs,
        max_steps=args.max_steps,
        stop_after_steps=args.stop_after,
        warmup_ratio=args.warmup_ratio,
        seed=args.seed,
        eval_steps=args.eval_steps,
        no_duplicates=not args.allow_duplicates,
        show_progress_bar=not args.quiet,
        extra_args=args.extra_training_args,
    )
    try:
        planned = run_steps(len(sentences), config)  # before loading the model: a too-small corpus fails fast
    except ValueError as exc:
        raise ValueError(f"{corpus}: {exc}") from None
    check_stop_after(args.stop_after, planned)
    check_training_arguments(config, with_evaluator=True)
    check_sts_files(args.data_dir)  # STS-B dev selects, the 7 test sets score: damaged files fail before training
    dev = SentEvalSTSEvaluator(args.data_dir, batch_size=args.eval_batch_size)

    set_seed(args.seed)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    model = resolve_model(args.model, pooling=args.pooling, max_seq_length=args.max_seq_length,
                          mlp_head=args.mlp_head)
    loss = build_loss(args.loss, model, **loss_kwargs)
    announce_loss(args, loss, loss_kwargs)

    def score(trained: Any) -> dict[str, float]:
        return evaluate_sts(trained, args.data_dir, batch_size=args.eval_batch_size,
                            show_progress_bar=not args.quiet)

    with run_time("training"):
        run = run_training(model, loss, pair_dataset(list(sentences)), config, evaluator=dev, score=score,
                           callbacks=run_callbacks(args, loss_kwargs))
        run.sts = run.scores
        result, scores = run.train, run.sts
        final = save_final_model(args, model, output_dir)
    logger.info("saved the selected model to %s", final)
    payload = {
        "loss": args.loss,
        "loss_config": run.loss_config,
        "loss_call": _loss_call(args.loss, loss_kwargs),
        "model": args.model or "default (all-MiniLM-L6-v2, embedded)",
        "pooling": args.pooling,
        "mlp_head": args.mlp_head,
        "corpus": str(corpus),
        "num_sentences": len(sentences),
        "config": {k: v for k, v in vars(args).items() if k not in ("func",)},
        "planned_steps": planned,
        "sts": scores,
        "stsb_dev_best": result.best_metric,
        "train_seconds": result.train_seconds,
        "steps": result.steps,
        "median_step_seconds": result.median_step_seconds,
    }
    write_json(output_dir / "results.json", payload)
    print(format_sts_table({args.loss: cast(dict[str, float], scores)}))  # evaluate_test: the STS scores are set
    step = f"{result.median_step_seconds:.3f} s" if result.median_step_seconds is not None else "–"
    print(f"\nSTS-B dev (best): {result.best_metric}  steps: {result.steps}  train time: {result.train_seconds:.0f} s  "
          f"median step: {step}")
    print(f"model: {final}\nresults: {output_dir / 'results.json'}")
    return 0


def _recipe_config(args: argparse.Namespace) -> Any:
    """The :class:`~st_hardneg.training.loop.TrainConfig` of ``--task retrieval`` / ``beir`` from ``args``."""
    from st_hardneg.training import retrieval as recipe

    return recipe.train_config(Path(args.output_dir) / "checkpoints", seed=args.seed, batch_size=args.batch_size,
                               learning_rate=args.lr, epochs=args.epochs, warmup_ratio=args.warmup_ratio,
                               max_steps=args.max_steps, stop_after_steps=args.stop_after,
                               no_duplicates=not args.allow_duplicates, show_progress_bar=not args.quiet,
                               extra_args=args.extra_training_args)


def _train_and_save(args: argparse.Namespace, dataset: Any, config: Any, score: Any,
                    head: dict[str, Any], info: dict[str, Any]) -> tuple[Any, Path, int]:
    """Train ``args.loss`` on ``dataset``, score the final model with ``score``, save it to ``OUTPUT/final`` and
    write ``OUTPUT/results.json`` (``head`` first, then the shared fields); returns ``(run, final, planned)``."""
    from transformers import set_seed

    from st_hardneg.models import resolve_model
    from st_hardneg.reporting import write_json
    from st_hardneg.training.experiment import run_training
    from st_hardneg.training.registry import build_loss

    output_dir = Path(args.output_dir)
    planned = run_steps(len(dataset), config)
    check_stop_after(args.stop_after, planned)
    logger.info("training data: %d rows (%s), %d steps planned", len(dataset), info.get("source", info.get("file")),
                planned)
    set_seed(args.seed)
    model = resolve_model(args.model, pooling=args.pooling, max_seq_length=args.max_seq_length,
                          mlp_head=args.mlp_head)
    loss_kwargs = parse_loss_args(args.loss_arg)
    loss = build_loss(args.loss, model, **loss_kwargs)
    announce_loss(args, loss, loss_kwargs)
    # the checkpoints are removed after the run unless the user asked for them (save_strategy)
    keep = str(config.extra_args.get("save_strategy", "no")) != "no"
    with run_time("training"):
        run = run_training(model, loss, dataset, config, keep_checkpoints=keep, score=score,
                           callbacks=run_callbacks(args, loss_kwargs))
        final = save_final_model(args, model, output_dir)
    result = run.train
    write_json(output_dir / "results.json", {
        **head,
        "loss": args.loss,
        "loss_config": run.loss_config,
        "loss_call": _loss_call(args.loss, loss_kwargs),
        "model": args.model or "default (all-MiniLM-L6-v2, embedded)",
        "pooling": args.pooling,
        "mlp_head": args.mlp_head,
        "training_data": info,
        "config": {k: v for k, v in vars(args).items() if k not in ("func",)},
        **run.scores,
        "train_seconds": result.train_seconds,
        "planned_steps": planned,
        "steps": result.steps,
        "median_step_seconds": result.median_step_seconds,
    })
    return run, final, planned


def cmd_train_retrieval(args: argparse.Namespace) -> int:
    """``train --task retrieval`` (``args`` resolved): the recipe of :mod:`st_hardneg.training.retrieval`."""
    from st_hardneg.data.mrpc import build_mrpc_retrieval
    from st_hardneg.data.senteval import STS_TASKS, check_sts_data, resolve_senteval_dir
    from st_hardneg.training import retrieval as recipe

    mining = parse_loss_args(args.mining_arg, "--mining-arg")
    config = _recipe_config(args)
    check_training_arguments(config, with_evaluator=False)
    data = build_mrpc_retrieval(args.data_dir)  # the test task: missing MRPC files fail before any work
    if not args.no_sts:  # and missing STS files too, not after training
        try:
            check_sts_data(resolve_senteval_dir(args.data_dir), STS_TASKS)
            check_sts_files(args.data_dir)
        except DataNotFoundError as exc:
            raise DataNotFoundError(f"{exc}\nOr skip the STS evaluation with --no-sts.") from None
    if args.train_file:
        dataset, info = recipe.read_training_file(args.train_file, min_rows=args.batch_size, limit=args.limit,
                                                  data=data)
    else:
        dataset, info = recipe.mined_mrpc_triplets(args.data_dir, args.model, data=data, mining=mining,
                                                   cache_dir=args.cache_dir, limit=args.limit,
                                                   min_rows=args.batch_size)
    source = info["file"] if args.train_file else f"mined from {info['pairs']} MRPC train pairs, {info['cache_file']}"
    run, final, _ = _train_and_save(
        args, dataset, config, lambda trained: recipe.evaluate_recipe(
            trained, args.data_dir, task=data.task, sts=not args.no_sts, batch_size=args.eval_batch_size,
            show_progress_bar=not args.quiet), {"task": "retrieval"}, info)
    result = run.train
    print(recipe.recipe_table({args.loss: run.scores}))
    step = f"{result.median_step_seconds:.3f} s" if result.median_step_seconds is not None else "–"
    print(f"\ntraining data: {len(dataset)} rows ({source})  steps: {result.steps}  "
          f"train time: {result.train_seconds:.0f} s  median step: {step}")
    print(f"model: {final}\nresults: {Path(args.output_dir) / 'results.json'}")
    return 0


def cmd_train_beir(args: argparse.Namespace) -> int:
    """``train --task beir --data PATH`` (``args`` resolved): mine from the whole corpus, train, score dev and test."""
    from st_hardneg.training import retrieval as recipe

    mining = parse_loss_args(args.mining_arg, "--mining-arg")
    config = _recipe_config(args)
    check_training_arguments(config, with_evaluator=False)
    data, split = recipe.beir_split(args.data)  # a malformed folder fails here, before any model loads
    logger.info("%s: %s", data.name, split.stats)
    dataset, info = recipe.mined_beir_triplets(data, split, args.model, mining=mining, cache_dir=args.cache_dir,
                                               limit=args.limit, min_rows=args.batch_size)
    run, final, _ = _train_and_save(
        args, dataset, config, lambda trained: recipe.evaluate_beir_recipe(
            trained, split, batch_size=args.eval_batch_size, show_progress_bar=not args.quiet),
        {"task": "beir", "data": str(data.root), "split": split.stats}, info)
    for role in ("dev", "test"):
        print(f"### {data.name} {role}\n\n{recipe.beir_table({args.loss: run.scores}, role)}\n")
    print(f"training data: {len(dataset)} rows ({info['source']})  steps: {run.train.steps}  "
          f"train time: {run.train.train_seconds:.0f} s")
    print(f"model: {final}\nresults: {Path(args.output_dir) / 'results.json'}")
    return 0


# --------------------------------------------------------------------------- shared by the three tasks
def resolve_training_args(args: argparse.Namespace) -> dict[str, Any]:
    """``--training-arg`` as ``SentenceTransformerTrainingArguments`` values (see
    :func:`st_hardneg.training.loop.parse_training_args`), checked against this machine and run before any model
    loads: ``bf16`` / ``fp16`` (:func:`~st_hardneg.training.loop.check_precision`), ``push_to_hub``
    (:func:`~st_hardneg.training.loop.check_hub_access`), and ``resume_from_checkpoint`` (a checkpoint folder, or a
    folder holding ``checkpoint-N`` folders; ``last`` / ``true``: the latest one of ``--output-dir``) written by a run of
    the same loss and loss arguments (:func:`~st_hardneg.training.loop.find_checkpoint`).

    Raises:
        ValueError: an unknown field (with a suggestion), a field with its own option, a value of the wrong type,
            a precision this machine cannot run, a push that cannot happen, a checkpoint that is missing or of
            another loss.
    """
    from st_hardneg.training.loop import check_hub_access, check_precision, find_checkpoint, parse_training_args

    extra = parse_training_args(args.training_arg, reserved=RESERVED_TRAINING_ARGS)
    extra = check_precision(extra)
    check_hub_access(extra)
    resume = extra.get("resume_from_checkpoint")
    if resume:
        folder = Path(args.output_dir) / "checkpoints" if str(resume).lower() in ("last", "true") else Path(resume)
        run = {"loss": args.loss, "loss_args": _json_safe(parse_loss_args(args.loss_arg))}
        extra["resume_from_checkpoint"] = find_checkpoint(str(folder), run, "--training-arg resume_from_checkpoint")
    return extra


def check_training_arguments(config: Any, with_evaluator: bool) -> None:
    """Build the run's ``SentenceTransformerTrainingArguments`` once now, so that a contradiction among the
    ``--training-arg`` values and the recipe (e.g. ``save_strategy=no`` with the best-checkpoint selection of
    ``--task sts``) is a usage error before any model loads.

    Raises:
        ValueError: what ``TrainingArguments`` refused, prefixed with ``--training-arg``.
    """
    if not config.extra_args:
        return
    from st_hardneg.training.loop import training_arguments

    try:
        training_arguments(config, with_evaluator=with_evaluator)
    except (ValueError, TypeError) as exc:
        message = " ".join(str(exc).split())
        raise ValueError(f"--training-arg: the Trainer's arguments refuse this combination: {message}") from None


def run_steps(num_examples: int, config: Any) -> int:
    """The optimizer steps of the run (:func:`~st_hardneg.training.experiment.planned_steps`, with the
    ``gradient_accumulation_steps`` of ``--training-arg``, counted as the Trainer counts them)."""
    import math

    from st_hardneg.training.experiment import planned_steps

    steps = planned_steps(num_examples, config)
    accumulation = int(config.extra_args.get("gradient_accumulation_steps", 1) or 1)
    if accumulation > 1 and not config.max_steps > 0:
        batches = num_examples // config.batch_size if config.drop_last else math.ceil(num_examples / config.batch_size)
        per_epoch = max(batches // accumulation + int(batches % accumulation > 0), 1)
        steps = math.ceil(config.epochs * per_epoch)
    return steps


def check_stop_after(stop_after: int, planned: int) -> None:
    """``--stop-after N`` must stop before the run's end (``planned`` steps): otherwise it changes nothing.

    Raises:
        ValueError: ``N >= planned``.
    """
    if stop_after and stop_after >= planned:
        raise ValueError(f"--stop-after {stop_after} is not before the end of the run ({planned} steps): it would "
                         "train the whole run; lower it or drop it")


def _json_safe(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _loss_call(name: str, loss_kwargs: dict[str, Any]) -> str:
    from st_hardneg.training.registry import loss_call

    return loss_call(name, loss_kwargs)


def announce_loss(args: argparse.Namespace, loss: Any, loss_kwargs: dict[str, Any]) -> None:
    """Print, before training, the class call that builds the loss and its full ``get_config_dict()`` (not with
    ``-q``)."""
    if args.quiet:
        return
    config = loss.get_config_dict() if hasattr(loss, "get_config_dict") else {}
    print(f"loss {args.loss}: {_loss_call(args.loss, loss_kwargs)}")
    print(f"loss configuration: {json.dumps(_json_safe(config))}", flush=True)


def run_callbacks(args: argparse.Namespace, loss_kwargs: dict[str, Any]) -> list[Any]:
    """The command line's extra Trainer callbacks: the run's loss in every checkpoint (resume checks)."""
    from st_hardneg.training.callbacks import CheckpointRunInfo

    return [CheckpointRunInfo({"loss": args.loss, "loss_args": _json_safe(loss_kwargs)})]


def save_final_model(args: argparse.Namespace, model: Any, output_dir: Path) -> Path:
    """Save the trained model to ``OUTPUT/final``: without a train-only MLP head (it loads with plain
    sentence-transformers), or with it for ``--save-train-head``."""
    from st_hardneg.models import save_inference_model

    final = output_dir / "final"
    if getattr(args, "save_train_head", False):
        model.save(str(final), keep_train_only_modules=True)  # loads with st_hardneg.models.load_checkpoint
    else:
        save_inference_model(model, final)  # without a train-only MLP head: loads with plain SentenceTransformer()
    return final
