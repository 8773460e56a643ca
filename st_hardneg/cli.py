"""The ``st-hardneg`` command: train a sentence encoder with a hard-negative loss, evaluate it, fetch the data.

    st-hardneg train --loss mixcse                      # embedded all-MiniLM-L6-v2 (CLS), wiki10k, STS-B dev selection
    st-hardneg train --task retrieval --loss focal      # mined MRPC triplets, final model, retrieval + STS table
    st-hardneg eval --model output/st-hardneg/final     # 7-task SentEval STS table
    st-hardneg download senteval --dest data            # users with a network
"""

from __future__ import annotations

import argparse
import ast
import logging
import sys
import time
from pathlib import Path
from typing import Any

from st_hardneg.data import DataNotFoundError

logger = logging.getLogger("st_hardneg")

EVAL_TASK_GROUPS = ("sts", "transfer", "mteb", "align")
TRAIN_TASKS = ("sts", "retrieval")
#: ``train`` defaults of ``--task sts`` (the papers' unsupervised protocol) for the options whose default depends on
#: the task; ``--task retrieval`` takes them from :data:`st_hardneg.retrieval_recipe.TRAINING` (see
#: :func:`task_defaults`)
STS_DEFAULTS: dict[str, Any] = {"pooling": "cls", "max_seq_length": 32, "batch_size": 64, "lr": 3e-5,
                                "warmup_ratio": 0.0, "epochs": 1.0, "eval_steps": 50}
#: ``train`` options of one task only: dest → (option, task); given with the other task they are an error
TASK_ONLY_OPTIONS: dict[str, tuple[str, str]] = {
    "corpus": ("--corpus", "sts"), "eval_steps": ("--eval-steps", "sts"), "train_file": ("--train-file", "retrieval"),
    "cache_dir": ("--cache-dir", "retrieval"), "mining_arg": ("--mining-arg", "retrieval"),
    "no_sts": ("--no-sts", "retrieval"),
}
WRONG_TASK_HINTS = {
    "corpus": "--corpus (one sentence per line) is for --task sts; --task retrieval trains on (anchor, positive"
              "[, negative ...]) rows: use --train-file FILE",
    "train_file": "--train-file is for --task retrieval; --task sts trains on sentences: use --corpus FILE",
    "eval_steps": "--eval-steps (STS-B dev selection) is for --task sts; --task retrieval keeps the final model",
}


def parse_loss_args(items: list[str] | None, option: str = "--loss-arg") -> dict[str, Any]:
    """``["lam=0.3", "partner=random", "focal_m=None"]`` → ``{"lam": 0.3, "partner": "random", "focal_m": None}``
    (``option`` names the command-line option in the error message)."""
    result: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{option} expects KEY=VALUE, got {item!r}")
        raw = raw.strip()
        if raw.lower() in ("true", "false"):
            value: Any = raw.lower() == "true"
        elif raw.lower() in ("none", "null"):
            value = None
        else:
            try:
                value = ast.literal_eval(raw)
            except (ValueError, SyntaxError):
                value = raw
        result[key.strip().replace("-", "_")] = value
    return result


def default_corpus(data_dir: str | None) -> Path:
    """``corpus/wiki10k.txt`` (or ``wiki1m_for_simcse.txt``) beside the SentEval directory, if present."""
    from st_hardneg.data import resolve_senteval_dir

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
    :data:`st_hardneg.retrieval_recipe.TRAINING` (no STS-B dev selection: ``eval_steps`` 0) and the mined-set cache
    :data:`~st_hardneg.retrieval_recipe.DEFAULT_CACHE_DIR`."""
    if task == "sts":
        return dict(STS_DEFAULTS)
    from st_hardneg.retrieval_recipe import DEFAULT_CACHE_DIR, TRAINING

    return {"pooling": TRAINING["pooling"], "max_seq_length": TRAINING["max_seq_length"],
            "batch_size": TRAINING["batch_size"], "lr": TRAINING["learning_rate"],
            "warmup_ratio": TRAINING["warmup_ratio"], "epochs": float(TRAINING["epochs"]), "eval_steps": 0,
            "cache_dir": str(DEFAULT_CACHE_DIR)}


def resolve_train_args(args: argparse.Namespace) -> argparse.Namespace:
    """Check the ``train`` options against ``args.task`` and fill the ones left unset with :func:`task_defaults`, in
    place (options given on the command line win); returns ``args``.

    Raises:
        ValueError: an option of the other task, or ``--mining-arg`` / ``--cache-dir`` with ``--train-file``
            (nothing is silently ignored); bad ``--stop-after``, ``--max-steps`` or ``--batch-size`` values.
    """
    for dest, (option, task) in TASK_ONLY_OPTIONS.items():
        if getattr(args, dest) is not None and getattr(args, dest) is not False and args.task != task:
            raise ValueError(WRONG_TASK_HINTS.get(dest, f"{option} applies to --task {task} only"))
    if args.train_file is not None and (args.mining_arg or args.cache_dir is not None):
        raise ValueError("--mining-arg and --cache-dir configure the mined MRPC triplets; --train-file trains on your "
                         "rows as they are: drop them")
    for key, value in task_defaults(args.task).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.stop_after < 0:
        raise ValueError(f"--stop-after must be >= 0 (0 = train to the end), got {args.stop_after}")
    if args.max_steps == 0 or args.max_steps < -1:
        raise ValueError(f"--max-steps must be a positive number of steps (or -1: use --epochs), got {args.max_steps}")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    return args


def load_for_eval(name: str | None, pooling: str):
    """A saved SentenceTransformer directory as saved (its own pooling), else an encoder with ``pooling``: see
    :func:`st_hardneg.models.resolve_model` (``saved="as_is"``)."""
    from st_hardneg.models import resolve_model

    return resolve_model(name, pooling=pooling, max_seq_length=None, saved="as_is")


# --------------------------------------------------------------------------- commands
def cmd_train(args: argparse.Namespace) -> int:
    resolve_train_args(args)  # the task's defaults; an option of the other task fails here, before torch loads
    if args.task == "retrieval":
        return cmd_train_retrieval(args)
    import torch
    from transformers import set_seed

    from st_hardneg.data import read_corpus
    from st_hardneg.evaluation import format_sts_table
    from st_hardneg.experiment import planned_steps, run_experiment
    from st_hardneg.models import resolve_model, save_inference_model
    from st_hardneg.reporting import write_json
    from st_hardneg.training import TrainConfig

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
    )
    try:
        planned_steps(len(sentences), config)  # before loading the model: a too-small corpus fails fast
    except ValueError as exc:
        raise ValueError(f"{corpus}: {exc}") from None

    set_seed(args.seed)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    model = resolve_model(args.model, pooling=args.pooling, max_seq_length=args.max_seq_length,
                          mlp_head=args.mlp_head)
    run = run_experiment(model, args.loss, loss_kwargs, sentences, config, args.data_dir,
                         eval_batch_size=args.eval_batch_size)
    result, scores = run.train, run.sts
    final = output_dir / "final"
    save_inference_model(model, final)  # without a train-only MLP head: loads with plain SentenceTransformer()
    logger.info("saved the selected model to %s", final)
    payload = {
        "loss": args.loss,
        "loss_config": run.loss.get_config_dict() if hasattr(run.loss, "get_config_dict") else loss_kwargs,
        "model": args.model or "default (all-MiniLM-L6-v2, embedded)",
        "pooling": args.pooling,
        "mlp_head": args.mlp_head,
        "corpus": str(corpus),
        "num_sentences": len(sentences),
        "config": {k: v for k, v in vars(args).items() if k not in ("func",)},
        "sts": scores,
        "stsb_dev_best": result.best_metric,
        "train_seconds": result.train_seconds,
        "steps": result.steps,
        "median_step_seconds": result.median_step_seconds,
    }
    write_json(output_dir / "results.json", payload)
    print(format_sts_table({args.loss: scores}))
    step = f"{result.median_step_seconds:.3f} s" if result.median_step_seconds is not None else "–"
    print(f"\nSTS-B dev (best): {result.best_metric}  steps: {result.steps}  train time: {result.train_seconds:.0f} s  "
          f"median step: {step}")
    print(f"model: {final}\nresults: {output_dir / 'results.json'}")
    return 0


def cmd_train_retrieval(args: argparse.Namespace) -> int:
    """``train --task retrieval`` (``args`` resolved): the recipe of :mod:`st_hardneg.retrieval_recipe`."""
    from transformers import set_seed

    from st_hardneg import retrieval_recipe as recipe
    from st_hardneg.data import STS_TASKS, check_sts_data, resolve_senteval_dir
    from st_hardneg.experiment import planned_steps, run_training
    from st_hardneg.models import resolve_model, save_inference_model
    from st_hardneg.registry import build_loss
    from st_hardneg.reporting import write_json
    from st_hardneg.retrieval_data import build_mrpc_retrieval

    loss_kwargs = parse_loss_args(args.loss_arg)
    mining = parse_loss_args(args.mining_arg, "--mining-arg")
    output_dir = Path(args.output_dir)
    config = recipe.train_config(output_dir / "checkpoints", seed=args.seed, batch_size=args.batch_size,
                                 learning_rate=args.lr, epochs=args.epochs, warmup_ratio=args.warmup_ratio,
                                 max_steps=args.max_steps, stop_after_steps=args.stop_after,
                                 no_duplicates=not args.allow_duplicates, show_progress_bar=not args.quiet)
    data = build_mrpc_retrieval(args.data_dir)  # the test task: missing MRPC files fail before any work
    if not args.no_sts:  # and missing STS files too, not after training
        try:
            check_sts_data(resolve_senteval_dir(args.data_dir), STS_TASKS)
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
    planned = planned_steps(len(dataset), config)
    logger.info("training data: %d rows (%s), %d steps planned", len(dataset), source, planned)

    set_seed(args.seed)
    model = resolve_model(args.model, pooling=args.pooling, max_seq_length=args.max_seq_length,
                          mlp_head=args.mlp_head)
    loss = build_loss(args.loss, model, **loss_kwargs)
    run = run_training(model, loss, dataset, config, keep_checkpoints=False,
                       score=lambda trained: recipe.evaluate_recipe(
                           trained, args.data_dir, task=data.task, sts=not args.no_sts,
                           batch_size=args.eval_batch_size, show_progress_bar=not args.quiet))
    final = output_dir / "final"
    save_inference_model(model, final)  # without a train-only MLP head: loads with plain SentenceTransformer()
    result = run.train
    payload = {
        "task": "retrieval",
        "loss": args.loss,
        "loss_config": run.loss_config,
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
    }
    write_json(output_dir / "results.json", payload)
    print(recipe.recipe_table({args.loss: run.scores}))
    step = f"{result.median_step_seconds:.3f} s" if result.median_step_seconds is not None else "–"
    print(f"\ntraining data: {len(dataset)} rows ({source})  steps: {result.steps}  "
          f"train time: {result.train_seconds:.0f} s  median step: {step}")
    print(f"model: {final}\nresults: {output_dir / 'results.json'}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from st_hardneg.evaluation import evaluate_sts, format_sts_table
    from st_hardneg.reporting import write_json

    groups = [g.strip() for g in args.tasks.split(",") if g.strip()]
    unknown = [g for g in groups if g not in EVAL_TASK_GROUPS]
    if unknown or not groups:
        raise ValueError(f"--tasks: unknown {unknown}; choose from {', '.join(EVAL_TASK_GROUPS)}")
    model = load_for_eval(args.model, args.pooling)
    name = args.model or "default (all-MiniLM-L6-v2, embedded)"
    results: dict[str, Any] = {"model": name}
    tables: list[str] = []
    start = time.perf_counter()
    if "sts" in groups:
        results["sts"] = evaluate_sts(model, args.data_dir, batch_size=args.batch_size,
                                      show_progress_bar=not args.quiet)
        tables.append("### STS (Spearman x 100)\n\n" + format_sts_table({name: results["sts"]}))
    if "transfer" in groups:
        from st_hardneg.evaluation import evaluate_transfer, format_transfer_table

        results["transfer"] = evaluate_transfer(model, args.data_dir, fast=args.fast)
        tables.append("### Transfer (accuracy)\n\n" + format_transfer_table({name: results["transfer"]}))
    if "mteb" in groups:
        from st_hardneg.evaluation import format_mteb_table, run_mteb

        mteb_tasks = [t.strip() for t in args.mteb_tasks.split(",") if t.strip()]
        results["mteb"] = run_mteb(model, mteb_tasks, data_dir=args.data_dir, model_name=None)
        tables.append("### MTEB (main score x 100)\n\n" + format_mteb_table({name: results["mteb"]}))
    if "align" in groups:
        from st_hardneg.evaluation import alignment_uniformity, format_alignment_table

        results["align"] = alignment_uniformity(model, args.data_dir)
        tables.append("### Alignment / uniformity (lower is better)\n\n" +
                      format_alignment_table({name: results["align"]}))
    results["seconds"] = time.perf_counter() - start
    print("\n\n".join(tables))
    if args.output:
        write_json(args.output, results)
        print(f"\nresults: {args.output}")
    return 0


def cmd_download(args: argparse.Namespace) -> int:
    from st_hardneg.data import download_senteval, download_wiki1m

    if args.what == "senteval":
        path = download_senteval(args.dest)
        print(f"SentEval data in {path}; use --data-dir {path}")
    else:
        path = download_wiki1m(args.dest)
        print(f"corpus in {path}; use --corpus {path}")
    return 0


# --------------------------------------------------------------------------- parser
class TrainHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``ArgumentDefaultsHelpFormatter`` without "(default: None)" for the options whose default depends on
    ``--task`` (their help text names both)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None and action.dest in (*STS_DEFAULTS, *TASK_ONLY_OPTIONS):
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    from st_hardneg.registry import LOSSES

    parser = argparse.ArgumentParser(
        prog="st-hardneg",
        description="Hard-negative contrastive training (MixCSE, Focal-InfoNCE, HNCSE, AdCSE) for sentence-transformers.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", default=None,
                        help="SentEval data directory (containing STS/, SICK/ … or senteval/). Default: "
                             "$ST_HARDNEG_DATA, then ../shared/data, ./data, ~/.cache/st_hardneg/data")
    common.add_argument("--quiet", action="store_true", help="no progress bars")

    t = sub.add_parser("train", parents=[common], help="train with a hard-negative loss; --task sts: select on "
                                                       "STS-B dev, print the 7-task STS table; --task retrieval: "
                                                       "mined triplets, print the retrieval table",
                       formatter_class=TrainHelpFormatter)
    t.add_argument("--task", default="sts", choices=TRAIN_TASKS,
                   help="sts: unsupervised sentences (--corpus), STS-B dev selection, 7-task STS table (the papers' "
                        "protocol); retrieval: (anchor, positive, mined hard negative) triplets of the MRPC train "
                        "pairs (or --train-file), the final model scored on MRPC paraphrase retrieval and STS "
                        "(st_hardneg.retrieval_recipe)")
    t.add_argument("--pooling", default=None,
                   help="pooling when building a model from an encoder (default: cls for --task sts, the papers' "
                        "choice; mean for --task retrieval)")
    t.add_argument("--loss", default="mixcse", choices=sorted(LOSSES),
                   help="training objective; mnrl = unsupervised SimCSE (ST's MultipleNegativesRankingLoss)")
    t.add_argument("--loss-arg", action="append", metavar="KEY=VALUE",
                   help="a loss hyperparameter, repeatable, e.g. --loss-arg lam=0.3 --loss-arg partner=random")
    t.add_argument("--model", default=None,
                   help="encoder name or path (e.g. bert-base-uncased); default: the embedded all-MiniLM-L6-v2")
    t.add_argument("--max-seq-length", type=int, default=None,
                   help="training truncation length (default: 32 for --task sts, 128 for --task retrieval)")
    t.add_argument("--mlp-head", action="store_true",
                   help="SimCSE's MLP head (Dense + tanh) on the pooled vector during training only "
                        "(--mlp_only_train); the saved model has no head (cls_before_pooler at test time)")
    t.add_argument("--corpus", default=None,
                   help="--task sts: training sentences, one per line; default: corpus/wiki10k.txt beside the data "
                        "directory")
    t.add_argument("--train-file", default=None,
                   help="--task retrieval: your own training rows instead of the mined MRPC triplets, a .jsonl, "
                        ".json, .csv or .tsv file whose text columns are, in order, anchor, positive[, negative ...]")
    t.add_argument("--mining-arg", action="append", metavar="KEY=VALUE",
                   help="--task retrieval: a mining setting of st_hardneg.retrieval_recipe.MINING, repeatable, e.g. "
                        "--mining-arg relative_margin=None (the mining model is --model with mean pooling, 128 tokens)")
    t.add_argument("--cache-dir", default=None,
                   help="--task retrieval: where the mined triplets are cached, shared with benchmarks/retrieval.py "
                        "(default: ~/.cache/st_hardneg/retrieval)")
    t.add_argument("--no-sts", action="store_true",
                   help="--task retrieval: skip the 7-task STS evaluation after training (retrieval scores only)")
    t.add_argument("--limit", type=int, default=0,
                   help="use only the first N sentences (--task sts), training pairs to mine or --train-file rows "
                        "(--task retrieval); 0 = all")
    t.add_argument("--output-dir", default="output/st-hardneg", help="checkpoints, final model and results.json")
    t.add_argument("--batch-size", type=int, default=None, help="training batch size (default: 64)")
    t.add_argument("--lr", type=float, default=None,
                   help="learning rate (linear decay; default: 3e-5 for --task sts, 2e-5 for --task retrieval)")
    t.add_argument("--warmup-ratio", type=float, default=None,
                   help="share of the steps with linear warm-up (default: 0.0 for --task sts, 0.1 for --task "
                        "retrieval)")
    t.add_argument("--epochs", type=float, default=None, help="training epochs (default: 1)")
    t.add_argument("--max-steps", type=int, default=-1,
                   help="train N steps (overrides --epochs; the LR schedule is shortened to N steps)")
    t.add_argument("--stop-after", type=int, default=0,
                   help="keep the full run's LR schedule but stop after N steps, evaluating there: a screening run "
                        "whose STS-B dev score equals the full run's at that step (0 = off)")
    t.add_argument("--eval-steps", type=int, default=None,
                   help="--task sts: evaluate STS-B dev every N steps and at the end; the best checkpoint is kept "
                        "(default: 50; --task retrieval keeps the final model)")
    t.add_argument("--eval-batch-size", type=int, default=128)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--allow-duplicates", action="store_true",
                   help="plain random batches (default: no sentence twice in a batch, as duplicates are false "
                        "negatives)")
    t.set_defaults(func=cmd_train)

    e = sub.add_parser("eval", parents=[common], help="evaluate a model and print markdown tables",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    e.add_argument("--model", default=None, help="saved model directory or encoder name; default: embedded model")
    e.add_argument("--pooling", default="cls",
                   help="pooling when building a model from an encoder (default: cls, the papers' choice)")
    e.add_argument("--tasks", default="sts", help=f"comma-separated groups from {', '.join(EVAL_TASK_GROUPS)}")
    e.add_argument("--mteb-tasks", default="STSBenchmark-local",
                   help="tasks for the mteb group (local SentEval-backed tasks, or official names with a network)")
    e.add_argument("--fast", action="store_true", help="transfer: the quick protocol (5 folds, smaller grid)")
    e.add_argument("--batch-size", type=int, default=128)
    e.add_argument("--output", default=None, help="write the results as JSON here")
    e.set_defaults(func=cmd_eval)

    d = sub.add_parser("download", help="fetch the SentEval data or the wiki1m corpus (needs a network)")
    d.add_argument("what", choices=("senteval", "wiki1m"))
    d.add_argument("--dest", default=None, help="target directory (default ~/.cache/st_hardneg/data)")
    d.set_defaults(func=cmd_download)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except (DataNotFoundError, OSError, ValueError, ImportError, RuntimeError) as exc:
        # one clear message, no traceback (--verbose shows it); OSError covers a model name that cannot be loaded
        if args.verbose:
            logger.exception("st-hardneg %s failed", args.command)
        message = str(exc).strip() or type(exc).__name__
        if isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError):
            message = message.splitlines()[0]
        print(f"st-hardneg {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
