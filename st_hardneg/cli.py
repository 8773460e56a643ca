"""The ``st-hardneg`` command: train a sentence encoder with a hard-negative loss, evaluate it, fetch the data.

    st-hardneg train --loss mixcse                      # embedded all-MiniLM-L6-v2 (CLS), wiki10k, STS-B dev selection
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


def parse_loss_args(items: list[str] | None) -> dict[str, Any]:
    """``["lam=0.3", "partner=random", "focal_m=None"]`` → ``{"lam": 0.3, "partner": "random", "focal_m": None}``."""
    result: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--loss-arg expects KEY=VALUE, got {item!r}")
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


def load_for_eval(name: str | None, pooling: str):
    """A saved SentenceTransformer directory as saved (its own pooling), else an encoder with ``pooling``: see
    :func:`st_hardneg.models.resolve_model` (``saved="as_is"``)."""
    from st_hardneg.models import resolve_model

    return resolve_model(name, pooling=pooling, max_seq_length=None, saved="as_is")


# --------------------------------------------------------------------------- commands
def cmd_train(args: argparse.Namespace) -> int:
    import torch
    from transformers import set_seed

    from st_hardneg.data import read_corpus
    from st_hardneg.evaluation import format_sts_table
    from st_hardneg.experiment import planned_steps, run_experiment
    from st_hardneg.models import resolve_model, save_inference_model
    from st_hardneg.reporting import write_json
    from st_hardneg.training import TrainConfig

    if args.stop_after < 0:
        raise ValueError(f"--stop-after must be >= 0 (0 = train to the end), got {args.stop_after}")
    if args.max_steps == 0 or args.max_steps < -1:
        raise ValueError(f"--max-steps must be a positive number of steps (or -1: use --epochs), got {args.max_steps}")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
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
    common.add_argument("--pooling", default="cls",
                        help="pooling when building a model from an encoder (default: cls, the papers' choice)")
    common.add_argument("--quiet", action="store_true", help="no progress bars")

    t = sub.add_parser("train", parents=[common], help="train with a hard-negative loss, select on STS-B dev, "
                                                       "print the 7-task STS table",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    t.add_argument("--loss", default="mixcse", choices=sorted(LOSSES),
                   help="training objective; mnrl = unsupervised SimCSE (ST's MultipleNegativesRankingLoss)")
    t.add_argument("--loss-arg", action="append", metavar="KEY=VALUE",
                   help="a loss hyperparameter, repeatable, e.g. --loss-arg lam=0.3 --loss-arg partner=random")
    t.add_argument("--model", default=None,
                   help="encoder name or path (e.g. bert-base-uncased); default: the embedded all-MiniLM-L6-v2")
    t.add_argument("--max-seq-length", type=int, default=32, help="training truncation length")
    t.add_argument("--mlp-head", action="store_true",
                   help="SimCSE's MLP head (Dense + tanh) on the pooled vector during training only "
                        "(--mlp_only_train); the saved model has no head (cls_before_pooler at test time)")
    t.add_argument("--corpus", default=None,
                   help="training sentences, one per line; default: corpus/wiki10k.txt beside the data directory")
    t.add_argument("--limit", type=int, default=0, help="use only the first N sentences (0 = all)")
    t.add_argument("--output-dir", default="output/st-hardneg", help="checkpoints, final model and results.json")
    t.add_argument("--batch-size", type=int, default=64)
    t.add_argument("--lr", type=float, default=3e-5, help="learning rate (linear decay)")
    t.add_argument("--warmup-ratio", type=float, default=0.0)
    t.add_argument("--epochs", type=float, default=1.0)
    t.add_argument("--max-steps", type=int, default=-1,
                   help="train N steps (overrides --epochs; the LR schedule is shortened to N steps)")
    t.add_argument("--stop-after", type=int, default=0,
                   help="keep the full run's LR schedule but stop after N steps, evaluating there: a screening run "
                        "whose STS-B dev score equals the full run's at that step (0 = off)")
    t.add_argument("--eval-steps", type=int, default=50,
                   help="evaluate STS-B dev every N steps and at the end; the best checkpoint is kept")
    t.add_argument("--eval-batch-size", type=int, default=128)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--allow-duplicates", action="store_true",
                   help="plain random batches (default: no sentence twice in a batch, as duplicates are false "
                        "negatives)")
    t.set_defaults(func=cmd_train)

    e = sub.add_parser("eval", parents=[common], help="evaluate a model and print markdown tables",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    e.add_argument("--model", default=None, help="saved model directory or encoder name; default: embedded model")
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
