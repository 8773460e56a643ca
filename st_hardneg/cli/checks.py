"""The checks of ``st-hardneg train`` that run before any model loads (see :mod:`st_hardneg.cli.train`): the task's
defaults (:func:`task_defaults`), the options against ``--task`` (:func:`resolve_train_args`), the output folder, the
STS files, ``--training-arg`` and ``--stop-after``. A usage error here exits with status 2 before torch loads; only
the standard library is imported at module level.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from st_hardneg.training.registry import parse_loss_args

TRAIN_TASKS = ("sts", "retrieval", "beir")
#: ``--loss`` of the retrieval recipe (:func:`st_hardneg.training.recipe.recipe_loss`), for ``--task beir``
RECIPE = "recipe"
#: ``train`` defaults of ``--task sts`` (the papers' unsupervised protocol) for the options whose default depends on
#: the task; ``--task retrieval`` takes them from :data:`st_hardneg.training.protocol.TRAINING` (see
#: :func:`task_defaults`)
STS_DEFAULTS: dict[str, Any] = {"pooling": "cls", "max_seq_length": 32, "batch_size": 64, "lr": 3e-5,
                                "warmup_ratio": 0.0, "epochs": 1.0, "eval_steps": 50}
#: ``train`` options of some tasks only: dest → (option, tasks); given with another task they are an error
TASK_ONLY_OPTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "corpus": ("--corpus", ("sts",)), "eval_steps": ("--eval-steps", ("sts",)),
    "train_file": ("--train-file", ("retrieval",)), "cache_dir": ("--cache-dir", ("retrieval", "beir")),
    "mining_arg": ("--mining-arg", ("retrieval", "beir")), "no_sts": ("--no-sts", ("retrieval",)),
    "data": ("--data", ("beir",)), "control": ("--control", ("beir",)),
}
#: ``SentenceTransformerTrainingArguments`` fields that have their own ``train`` option: ``--training-arg`` refuses
#: them, naming the option
RESERVED_TRAINING_ARGS = {
    "output_dir": "--output-dir", "per_device_train_batch_size": "--batch-size", "learning_rate": "--lr",
    "num_train_epochs": "--epochs", "max_steps": "--max-steps (or --stop-after)", "warmup_steps": "--warmup-ratio",
    "warmup_ratio": "--warmup-ratio", "seed": "--seed", "data_seed": "--seed", "eval_steps": "--eval-steps",
    "batch_sampler": "--allow-duplicates", "disable_tqdm": "-q/--quiet",
}

WRONG_TASK_HINTS = {
    "corpus": "--corpus (one sentence per line) is for --task sts; --task retrieval trains on (anchor, positive"
              "[, negative ...]) rows: use --train-file FILE",
    "train_file": "--train-file is for --task retrieval; --task sts trains on sentences: use --corpus FILE",
    "eval_steps": "--eval-steps (STS-B dev selection) is for --task sts; --task retrieval keeps the final model",
    "control": "--control masks a BEIR folder's training qrels as known positives: use it with --task beir --data "
               "FOLDER",
}


def task_defaults(task: str) -> dict[str, Any]:
    """The defaults of the ``train`` options left unset, per ``--task``: :data:`STS_DEFAULTS`, or for ``retrieval``
    :data:`st_hardneg.training.protocol.TRAINING` (``beir``: ``BEIR_TRAINING``; no STS-B dev selection:
    ``eval_steps`` 0) and the mined-set cache
    :data:`~st_hardneg.training.protocol.DEFAULT_CACHE_DIR`."""
    if task == "sts":
        return dict(STS_DEFAULTS)
    from st_hardneg.training.protocol import BEIR_TRAINING, DEFAULT_CACHE_DIR, TRAINING

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
    if getattr(args, "loss", None) == RECIPE and args.task != "beir":
        raise ValueError("--loss recipe is the BEIR retrieval recipe, which masks a folder's training qrels as known "
                         "positives: use it with --task beir --data FOLDER")
    if getattr(args, "control", None) and getattr(args, "loss", None) == RECIPE:
        raise ValueError("--loss recipe has the false-negative control already (its guide, margin and known "
                         "positives): drop --control")
    if args.task == "beir" and not getattr(args, "data", None):
        raise ValueError("--task beir needs --data PATH: a BEIR folder (corpus.jsonl, queries.jsonl, qrels/*.tsv)")
    if args.train_file is not None and (args.mining_arg or args.cache_dir is not None):
        raise ValueError("--mining-arg and --cache-dir configure the mined MRPC triplets; --train-file trains on your "
                         "rows as they are: drop them")
    if args.max_steps > 0 and args.epochs is not None:  # before the defaults fill --epochs in
        raise ValueError(f"--max-steps {args.max_steps} sets the length of the run and --epochs {args.epochs:g} would "
                         "be ignored: give one of them")
    # --pooling / --max-seq-length given on purpose change a saved model; the task's values only fill what a model
    # does not say itself (st_hardneg.models.training_model)
    args.model_options_given = sorted(key for key in ("pooling", "max_seq_length") if getattr(args, key) is not None)
    for key, value in task_defaults(args.task).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    check_output_dir(args.output_dir, getattr(args, "overwrite", False))
    from st_hardneg.cli.paths import ensure_writable_dir

    ensure_writable_dir(args.output_dir, "--output-dir")  # proven with a probe file, before any model loads
    if getattr(args, "save_train_head", False) and not args.mlp_head:
        raise ValueError("--save-train-head keeps the head of --mlp-head; this run has no head: add --mlp-head or drop "
                         "--save-train-head")
    check_train_model(args)  # a file, a damaged folder, a Router without its routes: before any model loads
    parse_loss_args(args.loss_arg)  # a repeated key fails here (the names are checked by cmd_train)
    mining_settings(args)  # a bad setting fails here, before any data is read or model loaded
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


#: the columns each ``train`` task feeds the loss, in order: what a Router model's ``router_mapping`` maps
TASK_COLUMNS = {"sts": ("anchor", "positive"), "retrieval": ("anchor", "positive", "negative"),
                "beir": ("anchor", "positive", "negative")}


def check_train_model(args: argparse.Namespace) -> Any:
    """``--model`` as ``train`` takes it (:func:`st_hardneg.models.check_model_source`, the check ``eval`` uses too),
    and a ``Router`` model (query / document towers) against the options it needs: ``--training-arg
    router_mapping=...`` (which column takes which route; the Trainer refuses a Router without it, after the model
    loaded), no ``--pooling`` (its pooling is inside each route), and rows of your own (``--train-file``): the mined
    tasks mine with one encoder. Returns the :class:`~st_hardneg.models.ModelSource`.

    Raises:
        ValueError: a bad model folder, or a Router model without what it needs, in one line naming ``Router``
            and the option.
    """
    from st_hardneg.data.model_folders import check_model_source

    source = check_model_source(getattr(args, "model", None), "--model")
    if not source.router:
        return source
    mapped = any(str(item).split("=", 1)[0].strip() == "router_mapping" for item in args.training_arg or [])
    if getattr(args, "pooling", None) is not None and "pooling" in getattr(args, "model_options_given", ["pooling"]):
        raise ValueError(f"--pooling {args.pooling}: {args.model} is a Router model (query / document towers), whose "
                         "pooling is inside each route: drop --pooling (or change each tower's Pooling and save "
                         "the model)")
    if args.task == "beir" or (args.task == "retrieval" and not getattr(args, "train_file", None)):
        raise ValueError(f"--model {args.model} is a Router model (query / document towers): --task {args.task} "
                         "mines its negatives with one encoder; train it with --task retrieval --train-file FILE "
                         "(your anchor, positive[, negative] rows)")
    if not mapped:
        columns = TASK_COLUMNS.get(args.task, ("anchor", "positive"))
        if args.task == "retrieval":
            columns = columns[:2]
        example = ", ".join(f'"{c}": "{"query" if c == "anchor" else "document"}"' for c in columns)
        raise ValueError(f"--model {args.model} is a Router model (query / document towers) and --training-arg "
                         f"router_mapping is missing: say which column takes which route, e.g. --training-arg "
                         f"'router_mapping={{{example}}}'")
    return source


def mining_settings(args: argparse.Namespace) -> dict[str, Any] | None:
    """The mining settings a ``train`` run asks for, checked (:func:`~st_hardneg.training.protocol.check_mining`):
    ``--mining-arg``'s, on top of ``RETRIEVAL_RECIPE["mining"]`` for ``--loss recipe`` (the recipe's negatives);
    ``None`` when neither applies (the protocol's :data:`~st_hardneg.training.protocol.MINING`).

    Raises:
        ValueError: a malformed or repeated ``--mining-arg``, an unknown setting or a bad value.
    """
    mining = parse_loss_args(args.mining_arg, "--mining-arg")
    if getattr(args, "loss", None) == RECIPE:
        from st_hardneg.training.recipe import RETRIEVAL_RECIPE

        mining = {**RETRIEVAL_RECIPE["mining"], **(mining or {})}
    if mining:
        from st_hardneg.training.protocol import check_mining

        check_mining(mining, "--mining-arg")
    return mining


#: the files and folders every ``train`` run writes in ``--output-dir`` besides ``results.json`` and ``checkpoints/``
#: (``--task beir`` adds its per-query file and TREC run, :func:`st_hardneg.cli.train.cmd_train_beir`)
TRAIN_OUTPUTS = ("final", "training_curve.png")


def check_output_dir(output_dir: str, overwrite: bool, planned_steps: int | None = None, *,
                     outputs: tuple[str, ...] = TRAIN_OUTPUTS, leftovers: bool = False,
                     resume: str | None = None) -> Path:
    """The ``--output-dir`` of ``train``: not empty, not a file, and not a finished run's folder (one holding
    ``results.json``) unless ``overwrite``; a file or folder of ``outputs`` (``final/``, ``training_curve.png`` …)
    that no finished st-hardneg run of the folder wrote, or a ``checkpoints/`` folder that holds what no st-hardneg
    run of it wrote, is refused without ``overwrite`` too (with it, a foreign ``checkpoints/`` entry is left
    untouched, see :func:`st_hardneg.training.checkpoints.check_checkpoint_folder`). Whatever ``overwrite`` says, a
    path the run writes that is a symbolic link out of the folder or a dangling one, or a saved model's or
    checkpoint's folder holding a link, is refused (:func:`st_hardneg.reporting.check_output_path`). Nothing is
    created here.

    Args:
        output_dir: ``--output-dir``.
        overwrite: ``--overwrite``.
        planned_steps: the run's steps, once known: a foreign ``checkpoint-N`` it could save into is refused even
            with ``overwrite``, and so is one of an earlier run's that holds a symbolic link.
        outputs: the names the run writes in the folder besides ``results.json`` and ``checkpoints/``.
        leftovers: refuse, without ``overwrite``, the checkpoints an earlier st-hardneg run left (a crashed run)
            that this run would save over (all, or those after ``resume``).
        resume: the checkpoint folder the run resumes from (``resume_from_checkpoint``), if any.

    Raises:
        ValueError: an empty path, a file, a finished run or a foreign output, ``final/`` or ``checkpoints/`` entry
            without ``--overwrite``; a crashed run's checkpoints without ``--overwrite`` or a resume; a path out of
            the folder.
    """
    from st_hardneg.reporting import check_output_path, check_output_tree
    from st_hardneg.training.checkpoints import check_checkpoint_folder

    if not str(output_dir).strip():
        raise ValueError("--output-dir is empty; give the folder for the checkpoints, final model and results.json")
    path = Path(output_dir).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"--output-dir {path} is a file, not a folder")
    if (path / "results.json").is_file() and not overwrite:
        raise ValueError(f"--output-dir {path} holds a finished run (results.json); choose another folder or pass "
                         "--overwrite to replace it")
    for name in ("results.json", "checkpoints", *outputs):  # a link out of the folder, whatever --overwrite says
        check_output_path(path / name, path)
    for name in ("final", "checkpoints/eval"):  # folders another library writes into: no link in them
        check_output_tree(path / name, path)
    if (path / "final").exists() and not (path / "results.json").is_file() and not overwrite:
        raise ValueError(f"--output-dir {path} holds final/, which no finished st-hardneg run of this folder wrote (no "
                         "results.json): the trained model would be saved into it; choose another folder or pass "
                         "--overwrite")
    taken = [name for name in outputs if name != "final" and os.path.lexists(path / name)]
    if taken and not (path / "results.json").is_file() and not overwrite:
        raise ValueError(f"--output-dir {path} holds {', '.join(taken)}, which no finished st-hardneg run of this "
                         "folder wrote (no results.json): this run would replace it; choose another folder or pass "
                         "--overwrite")
    check_checkpoint_folder(path / "checkpoints", overwrite, planned_steps=planned_steps, leftovers=leftovers,
                            resume=resume)
    return path


def check_sts_files(data_dir: str | None) -> None:
    """Read every STS test file now (milliseconds), so that a damaged one fails before anything is trained or
    saved, not in the evaluation after training."""
    from st_hardneg.data.senteval import STS_TASKS, check_sts_data, read_sts_pairs, resolve_senteval_dir

    root = resolve_senteval_dir(data_dir)
    check_sts_data(root, STS_TASKS)
    for task in (*STS_TASKS, "STSBenchmark-dev"):
        read_sts_pairs(root, task)


def resolve_training_args(args: argparse.Namespace) -> dict[str, Any]:
    """``--training-arg`` as ``SentenceTransformerTrainingArguments`` values (see
    :func:`st_hardneg.cli.training_args.parse_training_args`), checked against this machine and run before any model
    loads: ``bf16`` / ``fp16`` (:func:`~st_hardneg.training.loop.check_precision`), ``push_to_hub``
    (:func:`~st_hardneg.training.loop.check_hub_access`), and ``resume_from_checkpoint`` (a checkpoint folder, or a
    folder holding ``checkpoint-N`` folders; ``last`` / ``true``: the latest one of ``--output-dir``) written by a run of
    the same loss and loss arguments (:func:`~st_hardneg.training.loop.find_checkpoint`).

    Raises:
        ValueError: an unknown field (with a suggestion), a field with its own option, a value of the wrong type,
            a precision this machine cannot run, a push that cannot happen, a checkpoint that is missing or of
            another loss.
    """
    from st_hardneg.cli.training_args import check_training_values, parse_training_args
    from st_hardneg.training.loop import check_hub_access, check_precision, find_checkpoint

    extra = parse_training_args(args.training_arg, reserved=RESERVED_TRAINING_ARGS)
    check_training_values(extra)
    extra = check_precision(extra)
    check_hub_access(extra)
    resume = extra.get("resume_from_checkpoint")
    if resume:
        folder = Path(args.output_dir) / "checkpoints" if str(resume).lower() in ("last", "true") else Path(resume)
        run = {"loss": args.loss, "loss_args": json_safe(parse_loss_args(args.loss_arg))}
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


def check_stop_after(stop_after: int, planned: int) -> None:
    """``--stop-after N`` must stop before the run's end (``planned`` steps): otherwise it changes nothing.

    Raises:
        ValueError: ``N >= planned``.
    """
    if stop_after and stop_after >= planned:
        raise ValueError(f"--stop-after {stop_after} is not before the end of the run ({planned} steps): it would "
                         "train the whole run; lower it or drop it")


def json_safe(value: Any) -> Any:
    """``value`` as JSON would read it back (what is not JSON becomes its ``str``): how a run's loss arguments are
    stored in a checkpoint and compared on resume."""
    return json.loads(json.dumps(value, default=str))
