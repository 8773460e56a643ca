"""``st-hardneg train``: the two training tasks behind the command line (see :mod:`st_hardneg.cli.app`).

- ``--task sts`` (:func:`cmd_train`): the papers' unsupervised protocol, STS-B dev selection, the 7-task STS table;
- ``--task retrieval`` (:func:`cmd_train_retrieval`): the recipe of :mod:`st_hardneg.training.protocol`;
- ``--task beir --data PATH`` (:func:`cmd_train_beir`): any BEIR folder: mined negatives from the whole corpus, dev and
  test nDCG@10 (:data:`st_hardneg.training.protocol.BEIR_TRAINING`).

Options whose default depends on the task are ``None`` in the parser and filled by
:func:`st_hardneg.cli.checks.resolve_train_args`, which also refuses options of the other task; the other checks that
run before any model loads are in :mod:`st_hardneg.cli.checks` too. Only the standard library is imported at module
level (``--help`` loads no deep-learning library).
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from st_hardneg.cli.checks import (
    RECIPE,
    TRAIN_OUTPUTS,
    check_output_dir,
    check_stop_after,
    check_sts_files,
    check_training_arguments,
    json_safe,
    mining_settings,
    resolve_train_args,
    resolve_training_args,
)
from st_hardneg.data.senteval import DataNotFoundError
from st_hardneg.training.registry import parse_loss_args

logger = logging.getLogger("st_hardneg")


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




# --------------------------------------------------------------------------- commands
def cmd_train(args: argparse.Namespace) -> int:
    """``st-hardneg train``: the task's checks, then the run, holding ``--output-dir`` for its whole life (a second
    run into the same folder is refused, :func:`st_hardneg.cli.paths.output_lock`)."""
    resolve_train_args(args)  # the task's defaults; an option of the other task fails here, before torch loads
    from st_hardneg.cli.paths import output_lock

    with output_lock(args.output_dir, "--output-dir"):
        return _train(args)


def _train(args: argparse.Namespace) -> int:
    from st_hardneg.training.registry import check_loss_args, check_loss_values

    if args.loss == RECIPE:
        from st_hardneg.training.recipe import check_recipe_overrides

        check_recipe_overrides(parse_loss_args(args.loss_arg), "--loss-arg")
    elif getattr(args, "control", None):
        from st_hardneg.training.recipe import check_control

        check_control(args.loss, parse_loss_args(args.loss_arg), "--loss-arg")  # a loss that takes it; names
        check_loss_values(args.loss, parse_loss_args(args.loss_arg))
    else:
        check_loss_args(args.loss, parse_loss_args(args.loss_arg))  # names (and no model=), before any model loads
        check_loss_values(args.loss, parse_loss_args(args.loss_arg))  # and the values, by the loss's own checks
    args.extra_training_args = resolve_training_args(args)
    # with the folder held: what an earlier run left there (a crashed run's checkpoints), before any model loads
    check_output_dir(args.output_dir, args.overwrite, leftovers=True,
                     resume=args.extra_training_args.get("resume_from_checkpoint"))
    if args.task == "retrieval":
        return cmd_train_retrieval(args)
    if args.task == "beir":
        return cmd_train_beir(args)
    import torch
    from transformers import set_seed

    from st_hardneg.data.senteval import pair_dataset, read_corpus
    from st_hardneg.evaluation import SentEvalSTSEvaluator, evaluate_sts, format_sts_table
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
    check_output_dir(args.output_dir, args.overwrite, planned)  # a user's checkpoint-N the run would save into
    check_training_arguments(config, with_evaluator=True)
    check_sts_files(args.data_dir)  # STS-B dev selects, the 7 test sets score: damaged files fail before training
    dev = SentEvalSTSEvaluator(args.data_dir, batch_size=args.eval_batch_size)

    set_seed(args.seed)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    built = training_model_of(args, sts=True)
    model = built.model
    data = {"name": corpus.stem, "size": len(sentences), "description": f"sentences of {corpus.name}, one per line"}
    dataset = pair_dataset(list(sentences))
    name_model(args, model, dataset, data)
    loss = build_loss(args.loss, model, **loss_kwargs)
    announce_loss(args, loss, loss_kwargs)

    def score(trained: Any) -> dict[str, float]:
        return evaluate_sts(trained, args.data_dir, batch_size=args.eval_batch_size,
                            show_progress_bar=not args.quiet)

    with run_time("training"):
        run = run_training(model, loss, dataset, config, evaluator=dev, score=score,
                           callbacks=run_callbacks(args, loss_kwargs))
        run.sts = run.scores
        result, scores = run.train, run.sts
        evaluation = card_evaluation(built.model, sts=scores)
        final = save_final_model(args, built.for_saving(), output_dir,
                                 identity=run_identity(args, run, loss_kwargs, data, evaluation, built.changes))
    logger.info("saved the selected model to %s", final)
    write_json(output_dir / "results.json", {
        **run_fields(args, run, loss_kwargs, built.changes),
        "corpus": str(corpus),
        "num_sentences": len(sentences),
        "sts": scores,
        "stsb_dev_best": result.best_metric,
        **step_fields(result, planned),
        "training_curve": write_curve(args, result, output_dir),
    }, output_dir)
    print(format_sts_table({args.loss: cast(dict[str, float], scores)}))  # evaluate_test: the STS scores are set
    step = f"{result.median_step_seconds:.3f} s" if result.median_step_seconds is not None else "–"
    print(f"\nSTS-B dev (best): {result.best_metric}  steps: {result.steps}  train time: {result.train_seconds:.0f} s  "
          f"median step: {step}")
    print(f"model: {final}\nresults: {output_dir / 'results.json'}")
    return 0


def _recipe_config(args: argparse.Namespace) -> Any:
    """The :class:`~st_hardneg.training.loop.TrainConfig` of ``--task retrieval`` / ``beir`` from ``args``."""
    from st_hardneg.training import protocol as recipe

    return recipe.train_config(Path(args.output_dir) / "checkpoints", seed=args.seed, batch_size=args.batch_size,
                               learning_rate=args.lr, epochs=args.epochs, warmup_ratio=args.warmup_ratio,
                               max_steps=args.max_steps, stop_after_steps=args.stop_after,
                               no_duplicates=not args.allow_duplicates, show_progress_bar=not args.quiet,
                               extra_args=args.extra_training_args)


def _train_and_save(args: argparse.Namespace, dataset: Any, config: Any, score: Any,
                    head: dict[str, Any], info: dict[str, Any],
                    known: dict[str, set[str]] | None = None,
                    data: dict[str, Any] | None = None) -> tuple[Any, Path, int]:
    """Train ``args.loss`` on ``dataset``, score the final model with ``score``, save it to ``OUTPUT/final`` and
    write ``OUTPUT/results.json`` (``head`` first, then the shared fields); returns ``(run, final, planned)``.
    ``known``: the training qrels (query → relevant texts), the known positives of ``--loss recipe`` and of
    ``--control``; ``data``: the training data's ``name`` and ``description`` in the model card."""
    from transformers import set_seed

    from st_hardneg.reporting import write_json
    from st_hardneg.training.experiment import run_training
    from st_hardneg.training.registry import build_loss

    output_dir = Path(args.output_dir)
    planned = run_steps(len(dataset), config)
    check_stop_after(args.stop_after, planned)
    check_output_dir(args.output_dir, args.overwrite, planned)  # a user's checkpoint-N the run would save into
    logger.info("training data: %d rows (%s), %d steps planned", len(dataset), info.get("source", info.get("file")),
                planned)
    set_seed(args.seed)
    built = training_model_of(args, sts=False)
    model = built.model
    data = {"name": "training data", **(data or {}), "size": len(dataset)}
    name_model(args, model, dataset, data)
    loss_kwargs = parse_loss_args(args.loss_arg)
    if args.loss == RECIPE:
        from st_hardneg.training.recipe import recipe_loss

        loss = recipe_loss(model, known, **loss_kwargs)
    elif getattr(args, "control", None):
        from st_hardneg.training.recipe import controlled_loss

        loss = controlled_loss(args.loss, model, known, **loss_kwargs)
    else:
        loss = build_loss(args.loss, model, **loss_kwargs)
    announce_loss(args, loss, loss_kwargs)
    # the checkpoints this run wrote are removed after it unless the user asked for them (save_strategy)
    keep = str(config.extra_args.get("save_strategy", "no")) != "no"
    with run_time("training"):
        run = run_training(model, loss, dataset, config, keep_checkpoints=keep,
                           score=lambda trained: score(built.for_saving()), callbacks=run_callbacks(args, loss_kwargs))
        evaluation = card_evaluation(built.model, **{key: run.scores.get(key) for key in ("sts", "retrieval", "dev",
                                                                                           "test")},
                                     beir_name=(data or {}).get("beir"))
        final = save_final_model(args, built.for_saving(), output_dir,
                                 identity=run_identity(args, run, loss_kwargs, data, evaluation, built.changes))
    result = run.train
    write_json(output_dir / "results.json", {
        **head,
        **run_fields(args, run, loss_kwargs, built.changes),
        "training_data": info,
        **run.scores,
        **step_fields(result, planned),
        "training_curve": write_curve(args, result, output_dir),
    }, output_dir)
    return run, final, planned


def cmd_train_retrieval(args: argparse.Namespace) -> int:
    """``train --task retrieval`` (``args`` resolved): the recipe of :mod:`st_hardneg.training.protocol`."""
    from st_hardneg.data.mrpc import build_mrpc_retrieval
    from st_hardneg.data.senteval import STS_TASKS, check_sts_data, resolve_senteval_dir
    from st_hardneg.training import protocol as recipe

    mining = mining_settings(args)
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
    card_data = ({"name": Path(args.train_file).stem, "description": f"the rows of {Path(args.train_file).name}"}
                 if args.train_file else {"name": "MRPC", "description": "(anchor, positive, mined hard negative) "
                                                                         "triplets of the MRPC train pairs"})
    run, final, _ = _train_and_save(
        args, dataset, config, lambda trained: recipe.evaluate_recipe(
            trained, args.data_dir, task=data.task, sts=not args.no_sts, batch_size=args.eval_batch_size,
            show_progress_bar=not args.quiet), {"task": "retrieval"}, info, data=card_data)
    result = run.train
    print(recipe.recipe_table({args.loss: run.scores}))
    step = f"{result.median_step_seconds:.3f} s" if result.median_step_seconds is not None else "–"
    print(f"\ntraining data: {len(dataset)} rows ({source})  steps: {result.steps}  "
          f"train time: {result.train_seconds:.0f} s  median step: {step}")
    print(f"model: {final}\nresults: {Path(args.output_dir) / 'results.json'}")
    return 0


def cmd_train_beir(args: argparse.Namespace) -> int:
    """``train --task beir --data PATH`` (``args`` resolved): mine from the whole corpus, train, score dev and test."""
    from st_hardneg.training import protocol as recipe

    mining = mining_settings(args)  # --loss recipe: the recipe's negatives, --mining-arg on top
    config = _recipe_config(args)
    check_training_arguments(config, with_evaluator=False)
    data, split = recipe.beir_split(args.data)  # a malformed folder fails here, before any model loads
    # the test task's per-query file and TREC run are written beside results.json: a user's file there is refused
    check_output_dir(args.output_dir, args.overwrite, outputs=(*TRAIN_OUTPUTS, *beir_outputs(split)), leftovers=True,
                     resume=args.extra_training_args.get("resume_from_checkpoint"))
    logger.info("%s: %s", data.name, split.stats)
    dataset, info = recipe.mined_beir_triplets(data, split, args.model, mining=mining, cache_dir=args.cache_dir,
                                               limit=args.limit, min_rows=args.batch_size)
    run, final, _ = _train_and_save(
        args, dataset, config, lambda trained: recipe.evaluate_beir_recipe(
            trained, split, batch_size=args.eval_batch_size, show_progress_bar=not args.quiet,
            max_seq_length=trained.max_seq_length,  # scored as saved (its saved length is set back first)
            files_dir=args.output_dir, tag=f"st-hardneg-{args.loss}"),
        {"task": "beir", "data": str(data.root), "split": split.stats}, info, known=split.known_paraphrases,
        data={"name": data.name, "beir": data.name,
              "description": f"(query, positive, mined hard negative) rows of the BEIR folder {data.name}'s training "
                             f"qrels, negatives mined from its corpus of {len(data.corpus):,} documents"})
    for role in ("dev", "test"):
        print(f"### {data.name} {role}\n\n{recipe.beir_table({args.loss: run.scores}, role)}\n")
    print(f"training data: {len(dataset)} rows ({info['source']})  steps: {run.train.steps}  "
          f"train time: {run.train.train_seconds:.0f} s")
    print(f"model: {final}\nresults: {Path(args.output_dir) / 'results.json'}")
    return 0


# --------------------------------------------------------------------------- shared by the three tasks
def beir_outputs(split: Any) -> tuple[str, ...]:
    """The files ``train --task beir`` writes beside ``results.json``: the test task's per-query file and TREC run
    (:func:`st_hardneg.training.protocol.evaluate_beir_recipe`)."""
    from st_hardneg.cli.paths import check_path_component

    return ("per_query.tsv", f"{check_path_component(split.task.name, 'the BEIR task name')}.trec")


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




def run_fields(args: argparse.Namespace, run: Any, loss_kwargs: dict[str, Any],
               model_changes: list[str]) -> dict[str, Any]:
    """What every ``results.json`` of ``train`` says of the run: the loss (its name, configuration and the Python
    call that builds it), whether ``--control`` was on, the model, its pooling / head and what the run changed in it
    (``model_changes``), and every command-line setting."""
    control = bool(getattr(args, "control", None))
    return {
        "loss": args.loss,
        "loss_config": run.loss_config,
        "loss_call": _loss_call(args.loss, loss_kwargs, control),
        "control": control,
        "model": args.model or "default (all-MiniLM-L6-v2, embedded)",
        "pooling": args.pooling,
        "mlp_head": args.mlp_head,
        "model_changes": model_changes,
        "config": {k: v for k, v in vars(args).items() if k not in ("func",)},
    }


def step_fields(result: Any, planned: int) -> dict[str, Any]:
    """The training's cost in ``results.json``: its seconds, the planned and the run steps, the median step."""
    return {"train_seconds": result.train_seconds, "planned_steps": planned, "steps": result.steps,
            "median_step_seconds": result.median_step_seconds}


def _loss_call(name: str, loss_kwargs: dict[str, Any], control: bool = False) -> str:
    """The class call that builds loss ``name`` with ``loss_kwargs`` (``recipe``: the recipe's loss, its options
    replaced by ``loss_kwargs``, the training qrels as its known positives; ``control``: ``name`` with the recipe's
    false-negative control)."""
    from st_hardneg.training.registry import loss_call

    if control and name != RECIPE:
        from st_hardneg.training.recipe import control_kwargs

        call = loss_call(name, control_kwargs(name, loss_kwargs))
        return f"{call[:-1]}, guide=<the untrained model, frozen>, known_positives=<the training qrels>)"
    if name == RECIPE:
        from st_hardneg.training.recipe import RETRIEVAL_RECIPE

        call = loss_call(RETRIEVAL_RECIPE["loss"], {**RETRIEVAL_RECIPE["loss_kwargs"], **loss_kwargs})
        guide = ", guide=<the untrained model, frozen>" if RETRIEVAL_RECIPE["guide"] == "untrained" else ""
        return f"{call[:-1]}{guide}, known_positives=<the training qrels>)"
    return loss_call(name, loss_kwargs)


def announce_loss(args: argparse.Namespace, loss: Any, loss_kwargs: dict[str, Any]) -> None:
    """Print, before training, the class call that builds the loss and its full ``get_config_dict()`` (not with
    ``-q``)."""
    if args.quiet:
        return
    config = loss.get_config_dict() if hasattr(loss, "get_config_dict") else {}
    print(f"loss {args.loss}: {_loss_call(args.loss, loss_kwargs, bool(getattr(args, 'control', None)))}")
    print(f"loss configuration: {json.dumps(json_safe(config))}", flush=True)


def run_callbacks(args: argparse.Namespace, loss_kwargs: dict[str, Any]) -> list[Any]:
    """The command line's extra Trainer callbacks: the run's loss in every checkpoint (resume checks)."""
    from st_hardneg.training.callbacks import CheckpointRunInfo

    return [CheckpointRunInfo({"loss": args.loss, "loss_args": json_safe(loss_kwargs)})]


def write_curve(args: argparse.Namespace, result: Any, output_dir: Path) -> str | None:
    """``OUTPUT/training_curve.png``: the loss (and the dev metric, when the run was evaluated) per logged step,
    written through the output-folder guard; its file name, or ``None`` (said in a warning) when the run logged its
    loss at fewer than :data:`~st_hardneg.plots.MIN_CURVE_POINTS` steps."""
    import warnings

    from st_hardneg.plots import MIN_CURVE_POINTS, plot_run_curve

    path = plot_run_curve(result.log_history, output_dir / "training_curve.png", title=f"st-hardneg train --loss "
                          f"{args.loss}", inside=output_dir)
    if path is None:
        points = sum(1 for entry in result.log_history if "loss" in entry and "step" in entry)
        warnings.warn(f"no training curve: the run logged its loss at {points} step(s), and a curve needs "
                      f"{MIN_CURVE_POINTS}; log more often with --training-arg logging_steps=N", UserWarning,
                      stacklevel=2)
        return None
    if not args.quiet:
        print(f"training curve: {path}")
    return path.name


def training_model_of(args: argparse.Namespace, *, sts: bool) -> Any:
    """The model ``--model`` names, as published (:func:`st_hardneg.models.training_model`): the task's pooling and
    length fill only what the model does not say itself, ``--pooling`` / ``--max-seq-length`` given on purpose change
    it, and ``--task sts`` on the embedded encoder is the papers' preset. Each change is printed in one line (not
    with ``-q``) and logged."""
    from st_hardneg.models import STS_PRESET, training_model

    given = set(getattr(args, "model_options_given", ()))
    built = training_model(args.model, pooling=args.pooling if "pooling" in given else None,
                           max_seq_length=args.max_seq_length if "max_seq_length" in given else None,
                           mlp_head=args.mlp_head, preset=STS_PRESET if sts else None, bare_pooling=args.pooling,
                           train_length=args.max_seq_length)
    for change in built.changes:
        logger.info("model: %s", change)
        if not args.quiet:
            print(f"model: {change}", flush=True)
    if not built.changes:
        logger.info("model: trained as given")
    return built


def save_final_model(args: argparse.Namespace, model: Any, output_dir: Path,
                     identity: dict[str, Any] | None = None) -> Path:
    """Save the trained model to ``OUTPUT/final``: without a train-only MLP head (it loads with plain
    sentence-transformers), or with it for ``--save-train-head``. With ``identity`` (:func:`run_identity`), its model
    card gets the run's st-hardneg section (:func:`~st_hardneg.training.callbacks.add_run_to_card`) and
    ``model_meta.json`` mteb's metadata (:func:`~st_hardneg.models.write_model_meta`)."""
    from st_hardneg.models import save_inference_model, write_model_meta
    from st_hardneg.reporting import check_output_tree
    from st_hardneg.training.callbacks import add_run_to_card

    final = output_dir / "final"
    check_output_tree(final, output_dir)  # inside the folder, no link in it: the files are written there, not through
    if getattr(args, "save_train_head", False):
        model.save(str(final), keep_train_only_modules=True)  # loads with st_hardneg.models.load_checkpoint
    else:
        save_inference_model(model, final)  # without a train-only MLP head: loads with plain SentenceTransformer()
    if identity is not None:
        if (final / "README.md").is_file():
            add_run_to_card(final, identity)
        write_model_meta(final, model, name=identity["model_name"], adapted_from=identity["base_model"],
                         training_datasets=[identity["training_data"]["name"]],
                         st_hardneg={"version": identity["version"], "loss": identity["loss"],
                                     "command": identity["command"]})
    return final


# --------------------------------------------------------------------------- what the saved model says it is
def run_name(args: argparse.Namespace) -> str:
    """The trained model's name: ``--model-name``, else the ``--output-dir`` folder's name."""
    return args.model_name or Path(args.output_dir).expanduser().resolve().name


def base_model_name(args: argparse.Namespace) -> str:
    """The model the run started from, as given (``--model``), or the embedded model's Hub name."""
    from st_hardneg.models import DEFAULT_MODEL_NAME

    return str(args.model) if args.model not in (None, "", "default") else f"sentence-transformers/{DEFAULT_MODEL_NAME}"


def command_line(args: argparse.Namespace) -> str:
    """The ``st-hardneg train …`` command of this run, as typed (``args.command_line``, set by
    :func:`~st_hardneg.cli.app.main`), shell-quoted."""
    import shlex

    words = getattr(args, "command_line", None) or ["train"]
    return "st-hardneg " + shlex.join(words)


def name_model(args: argparse.Namespace, model: Any, dataset: Any, data: dict[str, Any]) -> None:
    """Before training: the model card's name, base model and training data
    (:func:`~st_hardneg.training.callbacks.name_card`)."""
    from st_hardneg.training.callbacks import name_card

    name_card(model, model_name=run_name(args), base_model=base_model_name(args), dataset=dataset,
              dataset_name=data["name"])


def card_evaluation(model: Any, *, sts: dict[str, float] | None = None, retrieval: dict[str, Any] | None = None,
                    dev: dict[str, Any] | None = None, test: dict[str, Any] | None = None,
                    beir_name: str | None = None) -> dict[str, dict[str, float]]:
    """The run's computed evaluation in mteb's metric names and scale (``cosine_spearman`` per STS set,
    ``ndcg_at_10`` / ``mrr_at_10`` / ``recall_at_100`` per retrieval task, x 0.01 of the printed tables),
    registered in ``model``'s card (:func:`~st_hardneg.training.callbacks.add_card_evaluation`); returns it,
    ``{data set: {metric: value}}``."""
    from st_hardneg.training.callbacks import add_card_evaluation, mteb_metric_name

    evaluation: dict[str, dict[str, float]] = {}
    for task, value in (sts or {}).items():
        if task != "avg" and value is not None:
            evaluation[task] = {"cosine_spearman": value / 100}
            add_card_evaluation(model, task, evaluation[task], description="Semantic Similarity",
                                primary_metric="cosine_spearman",
                                config={"evaluated_by": "st_hardneg.evaluation.evaluate_sts"})
    named = {"MRPC-retrieval": retrieval} if retrieval else {}
    for role, scores in (("dev", dev), ("test", test)):
        if scores:
            named[f"{beir_name or 'beir'}-{role}"] = scores
    for name, scores in named.items():
        metrics = {mteb_metric_name(m): scores[m] / 100 for m in ("ndcg@10", "mrr@10", "recall@10", "recall@100")
                   if m in scores}
        evaluation[name] = metrics
        add_card_evaluation(model, name, metrics, description="Information Retrieval", primary_metric="ndcg_at_10",
                            config={"evaluated_by": "st_hardneg.evaluation.retrieval.retrieve",
                                    "queries": scores.get("queries"), "corpus": scores.get("corpus")})
    return evaluation


def run_identity(args: argparse.Namespace, run: Any, loss_kwargs: dict[str, Any], data: dict[str, Any] | None,
                 evaluation: dict[str, dict[str, float]], changes: list[str] | None = None) -> dict[str, Any]:
    """What the saved model says it is (its card's st-hardneg section, its ``model_meta.json``): the name, the base
    model as given and what the run changed in it (``changes``), the training data, the loss (name, call,
    configuration), the evaluation, the command and the st-hardneg version."""
    from st_hardneg.training.registry import package_version

    return {"model_name": run_name(args), "base_model": base_model_name(args), "model_changes": list(changes or []),
            "training_data": data or {"name": "training data", "size": 0},
            "loss": args.loss, "loss_call": _loss_call(args.loss, loss_kwargs, bool(getattr(args, "control", None))),
            "loss_config": run.loss_config, "evaluation": evaluation, "command": command_line(args),
            "version": package_version()}
