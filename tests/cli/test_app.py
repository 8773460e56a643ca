"""``st_hardneg.cli.app``: --version, -v/-q before or after the command, the log level, the exit statuses and the
warnings of a command-line run."""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys

import pytest

from st_hardneg import __version__, cli
from st_hardneg.cli.app import EXIT_STATUS_HELP, configure_logging, exit_status
from st_hardneg.cli.train import RunFailed
from st_hardneg.data.senteval import DataNotFoundError


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"st-hardneg {__version__}\n"


@pytest.mark.parametrize("argv, verbose, quiet", [
    (["train"], 0, False),
    (["-q", "train"], 0, True),
    (["train", "-q"], 0, True),
    (["train", "--quiet"], 0, True),
    (["-v", "eval"], 1, False),
    (["eval", "-vv"], 2, False),
    (["-vv", "download", "senteval"], 2, False),
    (["download", "wiki1m", "-q"], 0, True),
    (["-q", "eval", "-v"], 1, True),  # each flag is kept wherever it is given
])
def test_verbosity_flags_anywhere(argv, verbose, quiet):
    args = cli.build_parser().parse_args(argv)
    assert (args.verbose, args.quiet) == (verbose, quiet)


@pytest.mark.parametrize("verbose, quiet, level", [(0, False, logging.WARNING), (1, False, logging.INFO),
                                                   (2, False, logging.DEBUG), (5, False, logging.DEBUG),
                                                   (0, True, logging.ERROR)])
def test_log_level(verbose, quiet, level):
    try:
        assert configure_logging(verbose, quiet) == level
        assert logging.getLogger("st_hardneg").level == level
        assert logging.getLogger("sentence_transformers").level == level
    finally:
        configure_logging(0, False)


@pytest.mark.parametrize("error, status", [
    (ValueError("--lr must be > 0"), 2), (TypeError("bad type"), 2), (FileNotFoundError("no corpus"), 2),
    (DataNotFoundError("no STS data"), 2), (NotADirectoryError("x"), 2),
    (RunFailed("training failed: boom"), 1), (RuntimeError("CUDA error"), 1), (OSError(28, "No space left"), 1),
    (PermissionError("denied"), 1), (ImportError("no module"), 1), (MemoryError(), 1),
])
def test_exit_status(error, status):
    assert exit_status(error) == status


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"]])
def test_help_documents_the_exit_statuses(argv, capsys):
    with pytest.raises(SystemExit):
        cli.main(argv)
    out = " ".join(capsys.readouterr().out.split())
    assert " ".join(EXIT_STATUS_HELP.split()) in out
    assert "1 a failure at run time" in out and "2 a usage error" in out


def test_usage_errors_of_the_parser_exit_2():
    out = subprocess.run([sys.executable, "-m", "st_hardneg.cli", "train", "--batch-size", "many"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "invalid int value: 'many'" in out.stderr


def test_a_tiny_run_logs_nothing_below_warning(tmp_path, tiny_model_dir):
    """The default level is WARNING: a failing run shows its error line and no INFO line (a fresh process, where
    the logging set-up of the command is the only one)."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"sentence {i}\n" for i in range(40)))
    argv = [sys.executable, "-m", "st_hardneg.cli", "train", "--model", str(tiny_model_dir), "--corpus", str(corpus),
            "--data-dir", str(tmp_path / "nodata"), "--output-dir", str(tmp_path / "o"), "--batch-size", "8"]
    quiet = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 2
    assert quiet.stderr.splitlines()[-1].startswith("st-hardneg train: error:") and " INFO " not in quiet.stderr
    loud = subprocess.run([*argv, "-v"], capture_output=True, text=True, timeout=300)
    assert loud.returncode == 2 and " INFO st_hardneg" in loud.stderr


def test_main_puts_the_logger_levels_back_when_it_returns(tmp_path, capsys):
    """A run in-process (a notebook, a test) leaves the caller's logging as it found it, after success or failure."""
    from st_hardneg.cli import main

    for name in ("st_hardneg", "sentence_transformers"):
        logging.getLogger(name).setLevel(logging.NOTSET)
    assert main(["-q", "compare", f"only={tmp_path / 'run.tsv'}"]) == 2  # one run: a usage error
    assert "error" in capsys.readouterr().err
    assert logging.getLogger("st_hardneg").level == logging.NOTSET
    assert logging.getLogger("sentence_transformers").level == logging.NOTSET


def _all_parsers(parser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _all_parsers(sub)


def test_every_option_of_every_command_has_help():
    parsers = list(_all_parsers(cli.build_parser()))
    assert {p.prog.split()[-1] for p in parsers} == {"st-hardneg", "train", "eval", "compare", "download", "study"}
    missing = [f"{p.prog} {action.option_strings or action.dest}" for p in parsers for action in p._actions
               if not isinstance(action, argparse._SubParsersAction) and not (action.help or "").strip()]
    assert missing == []


def test_quiet_silences_every_progress_bar_here_and_in_the_processes_it_starts_then_puts_all_back(capsys):
    """``-q``: a plain tqdm bar (sentence-transformers' "Computing widget examples" is one) draws nothing, and a
    child process (a study's worker) inherits the switch; on exit the bars and the environment are as before."""
    import os

    from tqdm.autonotebook import tqdm

    from st_hardneg.cli.app import QUIET_ENVIRONMENT, _WarningPrinter

    before = {name: os.environ.get(name) for name in QUIET_ENVIRONMENT}
    child = [sys.executable, "-c", "import sys; from tqdm import tqdm; [None for _ in tqdm(range(3), file=sys.stdout)]"]
    with _WarningPrinter("study", verbose=0, quiet=True):
        for _ in tqdm(range(3), desc="Computing widget examples"):
            pass
        assert subprocess.run(child, capture_output=True, text=True, timeout=60).stdout == ""
    assert "Computing widget examples" not in capsys.readouterr().err
    assert {name: os.environ.get(name) for name in QUIET_ENVIRONMENT} == before
    for _ in tqdm(range(3), desc="Computing widget examples"):
        pass
    assert "Computing widget examples" in capsys.readouterr().err
    if before["TQDM_DISABLE"] is None:
        assert "3/3" in subprocess.run(child, capture_output=True, text=True, timeout=60).stdout
