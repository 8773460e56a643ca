"""The ``st-hardneg`` command: train a sentence encoder with a hard-negative loss, evaluate it, fetch the data.

    st-hardneg train --loss mixcse                      # embedded all-MiniLM-L6-v2 (CLS), wiki10k, STS-B dev selection
    st-hardneg train --task retrieval --loss focal      # mined MRPC triplets, final model, retrieval + STS table
    st-hardneg train --task beir --data PATH --loss focal   # any BEIR folder: mined from the corpus, dev/test nDCG@10
    st-hardneg eval --task beir --data PATH --split test    # BEIR nDCG@10, MTEB-comparable (256 tokens)
    st-hardneg eval --model output/st-hardneg/final     # 7-task SentEval STS table
    st-hardneg study --data PATH --method mnrl=mnrl --method focal=focal --control   # which loss for your data
    st-hardneg download senteval --dest data            # users with a network

Exit status: 0 done; 1 a failure at run time (training, evaluation or saving failed, an environment problem such as
a missing package or a GPU that cannot run the precision asked for); 2 a usage error (an unknown or contradictory
option, a bad value, missing or malformed input data), reported in one line before any model is loaded.
``-v``/``-q`` work before or after the command; warnings of the libraries are printed as one line each on stderr.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, cast

from st_hardneg.cli.checks import RECIPE, STS_DEFAULTS, TASK_ONLY_OPTIONS, TRAIN_TASKS
from st_hardneg.cli.evaluate import EVAL_TASK_GROUPS, OutputOption, cmd_compare, cmd_eval
from st_hardneg.cli.paths import holding_output_folder
from st_hardneg.cli.study import add_parser as add_study_parser
from st_hardneg.cli.train import RunFailed, cmd_train
from st_hardneg.data.senteval import DataNotFoundError

logger = logging.getLogger("st_hardneg")


def cmd_download(args: argparse.Namespace) -> int:
    from pathlib import Path

    from st_hardneg.data.senteval import download_senteval, download_wiki1m

    if args.dest is not None:  # before any request: a file in the way is named, not a URL or "File exists" error
        dest = Path(args.dest).expanduser()
        blocker = next((p for p in (dest, *dest.parents) if p.exists()), None)
        if blocker is not None and not blocker.is_dir():
            what = "--dest" if blocker == dest else f"--dest {dest}: its parent"
            raise ValueError(f"{what} {blocker} is a file, not a folder: give the folder to download into")
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
    from st_hardneg.training.registry import LOSSES, package_version

    parser = argparse.ArgumentParser(
        prog="st-hardneg",
        description="Hard-negative contrastive training (MixCSE, Focal-InfoNCE, HNCSE, AdCSE) for sentence-transformers.",
        epilog=EXIT_STATUS_HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"st-hardneg {package_version()}")
    _add_verbosity(parser, None)
    sub = parser.add_subparsers(dest="command", required=True)

    common = argparse.ArgumentParser(add_help=False)
    _add_verbosity(common, argparse.SUPPRESS)  # -v / -q after the command too, without resetting those before it
    common.add_argument("--data-dir", default=None,
                        help="SentEval data directory (containing STS/, SICK/ … or senteval/). Default: "
                             "$ST_HARDNEG_DATA, then ../shared/data, ./data, ~/.cache/st_hardneg/data")

    t = sub.add_parser("train", parents=[common], help="train with a hard-negative loss; --task sts: select on "
                                                       "STS-B dev, print the 7-task STS table; --task retrieval: "
                                                       "mined triplets, print the retrieval table",
                       formatter_class=TrainHelpFormatter, epilog=EXIT_STATUS_HELP)
    t.add_argument("--config", default=None, metavar="FILE.{json,yaml}",
                   help="read every option and training argument from a JSON or YAML file (HfArgumentParser's "
                        "conventions): keys are the option names with underscores (loss, batch_size, loss_arg: {lam: "
                        "0.3}, ...) and SentenceTransformerTrainingArguments fields (gradient_accumulation_steps: 2; "
                        "per_device_train_batch_size, learning_rate ... set their option). Options on the command "
                        "line override the file (--loss-arg / --mining-arg / --training-arg key by key)")
    t.add_argument("--task", default="sts", choices=TRAIN_TASKS,
                   help="sts: unsupervised sentences (--corpus), STS-B dev selection, 7-task STS table (the papers' "
                        "protocol); retrieval: (anchor, positive, mined hard negative) triplets of the MRPC train "
                        "pairs (or --train-file), the final model scored on MRPC paraphrase retrieval and STS "
                        "(st_hardneg.training.protocol); beir: the BEIR folder --data, negatives mined from its "
                        "corpus, dev and test nDCG@10 (BEIR_TRAINING)")
    t.add_argument("--data", default=None,
                   help="--task beir: a BEIR folder (corpus.jsonl, queries.jsonl, qrels/{train,test}.tsv)")
    t.add_argument("--pooling", default=None,
                   help="pooling when building a model from an encoder (default: cls for --task sts, the papers' "
                        "choice; mean for --task retrieval)")
    t.add_argument("--loss", default="mixcse", choices=[*sorted(LOSSES), RECIPE],
                   help="training objective; mnrl = unsupervised SimCSE (ST's MultipleNegativesRankingLoss); recipe "
                        "(--task beir): the retrieval recipe (st_hardneg.training.recipe.RETRIEVAL_RECIPE: AdCSE with tied "
                        "keys at temperature 0.01, the untrained model guiding a relative false-negative margin, the "
                        "hardest negative outside the known relevant documents) with the folder's training qrels as "
                        "known positives, its options replaced by --loss-arg")
    t.add_argument("--control", action="store_true",
                   help="--task beir: give --loss the retrieval recipe's false-negative control (st_hardneg.training."
                        "recipe.FALSE_NEGATIVE_CONTROL): the model as given, frozen, guides a relative 0.05 margin, "
                        "and the folder's training qrels are known positives; --loss-arg replaces margin / "
                        "margin_strategy (--loss recipe has it already)")
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
                   help="--task retrieval / beir: a mining setting of st_hardneg.training.protocol.MINING (--loss "
                        "recipe: of RETRIEVAL_RECIPE['mining']), repeatable, e.g. --mining-arg relative_margin=None "
                        "(the mining model is --model with mean pooling)")
    t.add_argument("--cache-dir", default=None,
                   help="--task retrieval: where the mined triplets are cached "
                        "(default: ~/.cache/st_hardneg/retrieval)")
    t.add_argument("--no-sts", action="store_true",
                   help="--task retrieval: skip the 7-task STS evaluation after training (retrieval scores only)")
    t.add_argument("--limit", type=int, default=0,
                   help="use only the first N sentences (--task sts), training pairs to mine or --train-file rows "
                        "(--task retrieval); 0 = all")
    t.add_argument("--output-dir", default="output/st-hardneg", help="checkpoints, final model and results.json")
    t.add_argument("--model-name", default=None,
                   help="the trained model's name: the title of its model card and the name `st-hardneg eval` and "
                        "mteb file its results under (local/NAME without an org/); default: the --output-dir "
                        "folder's name")
    t.add_argument("--overwrite", action="store_true",
                   help="replace a finished run in --output-dir (one with results.json); refused without it")
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
    t.add_argument("--eval-batch-size", type=int, default=128,
                   help="encoding batch size of the evaluations (STS-B dev selection, the test tables)")
    t.add_argument("--seed", type=int, default=0,
                   help="seeds the model's initialisation, dropout, the batch order and the mining (set_seed, "
                        "TrainingArguments.seed and data_seed)")
    t.add_argument("--allow-duplicates", action="store_true",
                   help="plain random batches (default: no sentence twice in a batch, as duplicates are false "
                        "negatives)")
    t.add_argument("--training-arg", action="append", metavar="KEY=VALUE",
                   help="any field of sentence-transformers' SentenceTransformerTrainingArguments, repeatable, over "
                        "the recipe's value, e.g. --training-arg gradient_accumulation_steps=2 --training-arg bf16=true "
                        "(on a CPU too) --training-arg report_to=tensorboard --training-arg save_strategy=steps "
                        "--training-arg resume_from_checkpoint=PATH (or =last: the latest checkpoint of "
                        "--output-dir) --training-arg push_to_hub=true --training-arg hub_model_id=USER/NAME; the "
                        "fields with their own option (--lr, --batch-size, --epochs, --max-steps, --warmup-ratio, "
                        "--seed, --eval-steps, --output-dir, --allow-duplicates, -q) are set with it. HF's "
                        "spellings work too: --gradient_accumulation_steps 2 is --training-arg "
                        "gradient_accumulation_steps=2, --per_device_train_batch_size 8 is --batch-size 8")
    t.add_argument("--save-train-head", action="store_true",
                   help="with --mlp-head: save the final model with its train-only head (it then loads with "
                        "st_hardneg.models.load_checkpoint); by default the head is removed and the model loads with "
                        "plain sentence-transformers")
    t.set_defaults(func=cmd_train)

    e = sub.add_parser("eval", parents=[common], help="evaluate a model and print markdown tables",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    e.add_argument("--model", default=None,
                   help="a saved SentenceTransformer (folder, or Hub name in the local cache) evaluated as published "
                        "with all its modules, or an encoder name; default: the embedded all-MiniLM-L6-v2 as "
                        "published (mean pooling + normalize)")
    e.add_argument("--pooling", default=None,
                   help="replace the model's pooling by a fresh one of this mode (cls, mean, ...); default: the "
                        "saved model's own (an encoder without one: cls, mean with --tasks beir)")
    e.add_argument("--tasks", "--task", default="sts",
                   help=f"comma-separated groups from {', '.join(EVAL_TASK_GROUPS)}")
    e.add_argument("--data", action="append", default=None, metavar="FOLDER",
                   help="a BEIR folder (repeatable): evaluated by --tasks beir, added as a local mteb retrieval task "
                        "by --tasks mteb")
    e.add_argument("--split", default="test", help="beir: the qrels split to evaluate")
    e.add_argument("--max-seq-length", type=int, default=None,
                   help="beir: the encoding length (default: the length the model is saved with, as mteb evaluates "
                        "it; 256 for all-MiniLM-L6-v2)")
    e.add_argument("--query-prompt-name", default=None,
                   help="beir: the model prompt for queries (default: mteb's choice, e.g. 'query' when defined)")
    e.add_argument("--document-prompt-name", default=None,
                   help="beir: the model prompt for documents (default: mteb's choice, e.g. 'document')")
    e.add_argument("--cache-dir", default=None, help="beir: cache the embeddings here, per model (default: none)")
    e.add_argument("--mteb-tasks", default=None,
                   help="tasks for the mteb group (local SentEval-backed tasks, or official names with a network); "
                        "default: STSBenchmark-local, none when --data adds BEIR folders")
    e.add_argument("--model-name", default=None,
                   help="the name results are filed under (org/name); default: the Hub name, the name an "
                        "st-hardneg run saved with its model (train --model-name, else its --output-dir folder), "
                        "else local/<folder name> for a path, sentence-transformers/all-MiniLM-L6-v2 for the "
                        "embedded model")
    e.add_argument("--revision", default=None, help="the revision results are filed under; default: "
                                                    "weights-<digest of the weights>")
    e.add_argument("--fast", action="store_true", help="transfer: the quick protocol (5 folds, smaller grid)")
    e.add_argument("--batch-size", type=int, default=128, help="encoding batch size")
    e.add_argument("--output-dir", "--output-folder", "--output", dest="output_dir", default="results",
                   action=OutputOption,
                   help="where results go: a folder (mteb's files under results/ as `mteb run` writes them, ours "
                        "under st-hardneg/<model>/<revision>/: eval.json, per_query.tsv, a TREC run per retrieval "
                        "task), or a path ending in .json: that results file, the per-query and run files beside "
                        "it. --output-folder (mteb's name) and --output are the same option")
    e.add_argument("--overwrite", action="store_true", help="recompute every requested result and replace the files (without it, results already in the folder with the same settings are reused, and a different one is refused)")
    e.set_defaults(func=holding_output_folder(cmd_eval))  # a second eval into the same folder is refused

    c = sub.add_parser("compare", parents=[verbosity_only()],
                       help="paired significance of two or more retrieval runs over the same queries",
                       description="Compare methods query by query: per data set the mean difference to the first "
                                   "(baseline) method, a 95 % bootstrap interval, a paired randomization test, a "
                                   "paired t-test and win/tie/loss counts; Holm-corrected p-values across data sets. "
                                   "Seeds of one method are averaged per query first.")
    c.add_argument("runs", nargs="+", metavar="NAME=RUN[,RUN...]",
                   help="a method and its runs (one per seed): per_query.tsv files, the eval.json / results.json that "
                        "names them, or run folders (st-hardneg train --task beir --output-dir); "
                        "a bare path is a method named after the file; the first method is the baseline")
    c.add_argument("--metric", default="ndcg@10", help="the per-query metric compared (default: ndcg@10; also "
                                                       "mrr@10, recall@10, recall@100, map@100)")
    c.add_argument("--baseline", default=None, help="the method compared against (default: the first)")
    c.add_argument("--permutations", type=int, default=10_000,
                   help="randomization-test sign flips and bootstrap resamples (default and minimum: 10,000; exact "
                        "enumeration when 2^queries is fewer)")
    c.add_argument("--seed", type=int, default=0, help="seeds the draws (default: 0)")
    c.add_argument("--output", default=None, help="write the comparison here (.json: JSON, else markdown)")
    c.add_argument("--plot", default=None, metavar="FILE.png",
                   help="draw the per-query differences of every data set and method, with the mean and its interval")
    c.add_argument("--overwrite", action="store_true", help="replace an existing --output or --plot")
    c.set_defaults(func=cmd_compare)

    add_study_parser(sub, [verbosity_only()], EXIT_STATUS_HELP)

    d = sub.add_parser("download", help="fetch the SentEval data or the wiki1m corpus (needs a network)",
                       parents=[verbosity_only()])
    d.add_argument("what", choices=("senteval", "wiki1m"),
                   help="senteval: the SentEval evaluation data; wiki1m: SimCSE's one million Wikipedia sentences")
    d.add_argument("--dest", default=None, help="target directory (default ~/.cache/st_hardneg/data)")
    d.set_defaults(func=cmd_download)
    return parser


def _command(argv: list[str]) -> str | None:
    """The subcommand ``argv`` names (its first word that is not an option), or ``None``."""
    for token in argv:
        if not token.startswith("-"):
            return token
    return None


#: the exit statuses, in every ``--help``
EXIT_STATUS_HELP = ("exit status: 0 done; 1 a failure at run time (training, evaluation or saving failed, or the "
                    "machine cannot run what was asked); 2 a usage error (a bad option, value or input file), "
                    "reported before any model is loaded")


def _add_verbosity(parser: argparse.ArgumentParser, default: Any) -> None:
    """``-v`` (repeatable) and ``-q`` on ``parser``; ``default`` ``SUPPRESS`` on the subcommands, so that a flag given
    before the command is not reset by the subcommand's parser."""
    parser.add_argument("-v", "--verbose", action="count", default=0 if default is None else default,
                        help="more log output: -v info, -vv debug and tracebacks (default: warnings only)")
    parser.add_argument("-q", "--quiet", action="store_true", default=False if default is None else default,
                        help="errors only: no progress bars, no warnings")


def verbosity_only() -> argparse.ArgumentParser:
    """A parent parser with only ``-v`` / ``-q`` (for subcommands without the data options)."""
    parent = argparse.ArgumentParser(add_help=False)
    _add_verbosity(parent, argparse.SUPPRESS)
    return parent


#: the loggers whose level a command-line run sets
LOGGERS = ("st_hardneg", "sentence_transformers")


def configure_logging(verbose: int, quiet: bool) -> int:
    """The log level of a command-line run: ``ERROR`` with ``-q``, else ``WARNING``, ``INFO`` (``-v``) or ``DEBUG``
    (``-vv``); returns it."""
    level = logging.ERROR if quiet else (logging.WARNING, logging.INFO, logging.DEBUG)[min(verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in LOGGERS:
        logging.getLogger(name).setLevel(level)
    return level


def exit_status(exc: BaseException) -> int:
    """1 for a failure at run time (:class:`~st_hardneg.cli.train.RunFailed`, ``RuntimeError``, ``OSError`` other
    than a missing file, ``ImportError``, ``MemoryError``), 2 for a usage error (``ValueError``, ``TypeError``, a
    missing file or data)."""
    if isinstance(exc, RunFailed):
        return 1
    if isinstance(exc, (FileNotFoundError, NotADirectoryError, IsADirectoryError)):
        return 2
    if isinstance(exc, (RuntimeError, OSError, ImportError, MemoryError)):
        return 1
    return 2


#: with ``-q``, what the run's own child processes (a study's workers) inherit: no tqdm bar, no Hub or transformers
#: bar, no Python warning
QUIET_ENVIRONMENT = {"TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "PYTHONWARNINGS": "ignore"}


class _WarningPrinter:
    """Within the block, every warning is one line on stderr, ``st-hardneg COMMAND: warning: ...`` (once per
    place; deprecation notices of the libraries only with ``-v``; none with ``-q``, which also turns off the
    progress bars: transformers' and the Hub's, and every ``tqdm`` bar, sentence-transformers' own included, in
    this process and, through :data:`QUIET_ENVIRONMENT`, in the processes it starts). Everything is put back on
    exit."""

    def __init__(self, command: str, verbose: int, quiet: bool) -> None:
        import warnings

        self.command, self.verbose, self.quiet = command, verbose, quiet
        self._catch = warnings.catch_warnings()

    def __enter__(self) -> None:
        import warnings

        self._catch.__enter__()
        self._bars: bool | None = None
        self._environment: dict[str, str | None] = {}
        self._tqdm_init: Any = None
        if self.quiet:
            warnings.simplefilter("ignore")
            import os

            import tqdm.std
            from transformers.utils import logging as hf_logging  # -q: no progress bar of the libraries either

            self._bars = hf_logging.is_progress_bar_enabled()
            hf_logging.disable_progress_bar()
            self._environment = {name: os.environ.get(name) for name in QUIET_ENVIRONMENT}
            os.environ.update(QUIET_ENVIRONMENT)
            self._tqdm_init = original = tqdm.std.tqdm.__init__

            def silent(bar: Any, *args: Any, **kwargs: Any) -> None:
                kwargs["disable"] = True
                original(bar, *args, **kwargs)

            tqdm.std.tqdm.__init__ = silent  # type: ignore[method-assign]
            return
        warnings.simplefilter("default")
        if not self.verbose:
            for category in (DeprecationWarning, PendingDeprecationWarning, FutureWarning):
                warnings.simplefilter("ignore", category)

        def show(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None,
                 line: str | None = None) -> None:
            text = " ".join(str(message).split())
            where = f" ({category.__name__}, {filename}:{lineno})" if self.verbose else ""
            print(f"st-hardneg {self.command}: warning: {text}{where}", file=sys.stderr)

        warnings.showwarning = show

    def __exit__(self, *exc_info: Any) -> None:
        import os

        self._catch.__exit__(*exc_info)
        if self._tqdm_init is not None:
            import tqdm.std

            tqdm.std.tqdm.__init__ = self._tqdm_init  # type: ignore[method-assign]
        for name, value in self._environment.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if self._bars:
            from transformers.utils import logging as hf_logging

            hf_logging.enable_progress_bar()


def subcommand_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The parser of ``command`` (``train``, ``eval``, ...) inside :func:`build_parser`'s parser."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return cast(argparse.ArgumentParser, action.choices[command])
    raise KeyError(command)


def _train_argv(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse a ``train`` command line: HF's spellings read as st-hardneg's (each said on stderr, not with ``-q``),
    then ``--config`` under the options given (:mod:`st_hardneg.cli.config`).

    Raises:
        ValueError: a bad HF flag or config file (one line naming the flag, or the file and the key).
    """
    from st_hardneg.cli.config import REPEATABLE, apply_config, hf_style_argv, read_train_config

    train = subcommand_parser(parser, "train")
    position = argv.index("train")
    rest, notes = hf_style_argv(argv[position + 1:], train)
    argv = [*argv[:position + 1], *rest]
    args = parser.parse_args(argv)
    if not args.quiet:
        for note in notes:
            print(f"st-hardneg train: note: {note}", file=sys.stderr)
    if args.config is None:
        return args
    config = read_train_config(args.config, train)
    train.set_defaults(**config.defaults)
    args = parser.parse_args(argv)
    apply_config(args, config, {dest: getattr(args, dest) or [] for dest in REPEATABLE})
    return args


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if _command(argv) == "train":
        try:
            args = _train_argv(parser, argv)
        except ValueError as exc:  # a bad config file or HF flag: one line, before any model loads
            print(f"st-hardneg train: error: {exc}", file=sys.stderr)
            return 2
    else:
        args = parser.parse_args(argv)  # a usage error exits with status 2 here (argparse)
    # the levels a run sets are put back when it returns: main() called in-process (a notebook, a test) leaves the
    # caller's logging as it found it
    args.command_line = argv  # the run's command, as typed (train records it in the model card)
    levels = {name: logging.getLogger(name).level for name in LOGGERS}
    configure_logging(args.verbose, args.quiet)
    try:
        with _WarningPrinter(args.command, args.verbose, args.quiet):
            return int(args.func(args))
    except (DataNotFoundError, OSError, ValueError, TypeError, ImportError, RuntimeError, MemoryError) as exc:
        # one clear message, no traceback (-vv shows it); OSError covers a model name that cannot be loaded
        if args.verbose > 1:
            logger.error("st-hardneg %s failed", args.command, exc_info=exc)
        message = str(exc).strip() or type(exc).__name__
        if isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError):
            message = message.splitlines()[0]
        print(f"st-hardneg {args.command}: error: {message}", file=sys.stderr)
        return exit_status(exc)
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)

