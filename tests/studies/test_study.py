"""``st-hardneg study`` on Optuna for real (a tiny random model, a tiny BEIR folder): each grid point runs once; a
worker killed during a trial (SIGKILL) and the command run again give the table of an uninterrupted one-worker
run; two workers give that table too; the report's numbers are the trials' records."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from st_hardneg import cli

optuna = pytest.importorskip("optuna")

REPO = Path(__file__).resolve().parents[2]
#: the table's last column is the step cost in wall-clock seconds: every other cell is a number the runs computed
COST = "step cost"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny BEIR folder and a saved model (a tiny random BERT, mean pooling, 48 tokens)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling

    from st_hardneg.testing import make_tiny_model_dir
    from st_hardneg.testing.beir import make_tiny_beir

    root = tmp_path_factory.mktemp("study")
    beir = make_tiny_beir(root / "tiny", train_queries=40, test_queries=12)
    encoder = make_tiny_model_dir(root / "bert")
    transformer = Transformer(str(encoder), max_seq_length=48)
    model = SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), "mean"),
                                         Normalize()], device="cpu")
    model.save(str(root / "model"))
    return {"beir": beir, "model": root / "model", "root": root}


def command(setup, out: Path, *extra: str) -> list[str]:
    return ["study", "-q", "--data", str(setup["beir"]), "--model", str(setup["model"]), "--method", "mnrl=mnrl",
            "--method", "focal=focal:temperature=0.1", "--seeds", "0", "1", "--batch-size", "4", "--max-steps", "6",
            "--lr", "5e-4", "--mining-arg", "relative_margin=None", "--heartbeat", "1", "--output-dir", str(out),
            *extra]


def table(out: Path) -> list[list[str]]:
    """The study's table, its cells, without the step-cost column (wall-clock time)."""
    lines = [line for line in (out / "study.md").read_text().splitlines() if line.startswith("|")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    keep = [i for i, title in enumerate(cells[0]) if not title.startswith(COST)]
    return [[row[i] for i in keep] for row in cells]


def trials(out: Path) -> list:
    """The study's trials, read without making the storage's tables (the command makes them)."""
    storage = optuna.storages.RDBStorage(f"sqlite:///{out / 'study.db'}", skip_table_creation=True)
    return optuna.load_study(study_name="study", storage=storage).get_trials()


POINTS = {f"tiny/{row}/{seed}" for row in ("mnrl", "focal") for seed in (0, 1)}


@pytest.fixture(scope="module")
def reference(setup):
    """An uninterrupted one-worker run."""
    out = setup["root"] / "one-worker"
    assert cli.main(command(setup, out)) == 0
    return out


def test_each_grid_point_runs_once_and_the_table_is_the_records(reference):
    states = [(t.params["point"], t.state.name) for t in trials(reference)]
    assert sorted(states) == sorted((p, "COMPLETE") for p in POINTS)  # four trials, one each, nothing else
    records = json.loads((reference / "study.json").read_text())["records"]
    by = {(r["row"], r["seed"]): r for r in records}
    assert set(by) == {(row, seed) for row in ("mnrl", "focal") for seed in (0, 1)}
    def git(*argv):
        return subprocess.run(["git", "-C", str(REPO), *argv], capture_output=True, text=True).stdout.strip()

    for trial in trials(reference):  # what a trial records
        attrs = trial.user_attrs
        assert attrs["commit"].removesuffix("+dirty") == git("rev-parse", "HEAD")
        assert attrs["library"].removesuffix("+dirty") == git("rev-parse", "HEAD:st_hardneg")
        assert {"commit", "library", "version", "config", "dev", "test", "per_query", "worker"} <= set(attrs)
        assert attrs["config"]["loss"] in ("mnrl", "focal") and trial.value == attrs["dev"]["ndcg@10"]
        assert (reference / attrs["per_query"]).is_file()
    rows = {row[0].strip("`"): row for row in table(reference)[2:]}
    for label in ("mnrl", "focal"):
        dev = [by[(label, s)]["dev"]["ndcg@10"] for s in (0, 1)]
        test = [by[(label, s)]["test"]["ndcg@10"] for s in (0, 1)]
        assert rows[label][1] == f"{statistics.mean(dev):.2f} ± {statistics.stdev(dev):.2f}"
        assert rows[label][2] == f"{statistics.mean(test):.2f} ± {statistics.stdev(test):.2f}"
        assert rows[label][3] == "0, 1"
    # trained: the two rows and the two seeds differ
    assert len({by[k]["test"]["ndcg@10"] for k in by}) > 1
    assert (reference / "study_differences.png").is_file()


def test_the_same_command_again_runs_nothing_and_writes_the_same_table(setup, reference, capsys):
    before = len(trials(reference))
    assert cli.main(command(setup, reference)) == 0
    assert "to run" not in capsys.readouterr().out
    assert len(trials(reference)) == before


def _wait_for_running(out: Path, process: subprocess.Popen, timeout: float = 120.0):
    """The first trial that is training (its configuration recorded), polled in the storage."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        if (out / "study.db").is_file():
            try:
                running = [t for t in trials(out) if t.state.name == "RUNNING" and "config" in t.user_attrs]
            except Exception:  # the storage is being made
                running = []
            if running:
                return running[0]
        time.sleep(0.05)
    raise AssertionError("no trial started")


def test_a_command_killed_mid_trial_then_run_again_gives_the_one_worker_table(setup, reference):
    out = setup["root"] / "killed"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen([sys.executable, "-m", "st_hardneg.cli", *command(setup, out)],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        trial = _wait_for_running(out, process)
        os.killpg(process.pid, signal.SIGKILL)  # the command (its one worker), during a trial
    finally:
        process.wait()
    killed = trial.params.get("point")
    assert killed in POINTS, trial
    assert {t.number: t.state.name for t in trials(out)}[trial.number] == "RUNNING"  # as the kill left it
    assert cli.main(command(setup, out)) == 0  # the same command again (one worker): it resumes
    assert table(out) == table(reference)
    final = trials(out)
    complete = [t.params["point"] for t in final if t.state.name == "COMPLETE"]
    assert sorted(complete) == sorted(POINTS)  # each point counted once
    assert {t.number: t.state.name for t in final}[trial.number] == "FAIL"  # the killed trial: failed, run again
    retry = [t for t in final if t.system_attrs.get("failed_trial") == trial.number]
    assert len(retry) == 1 and retry[0].params["point"] == killed and retry[0].state.name == "COMPLETE"


def test_two_workers_give_the_one_worker_table_and_one_killed_worker_is_taken_over(setup, reference):
    out = setup["root"] / "two-workers"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen([sys.executable, "-m", "st_hardneg.cli", *command(setup, out, "--workers", "2")],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    trial = _wait_for_running(out, process)
    killed = trial.user_attrs["worker"]["pid"]
    os.kill(killed, signal.SIGKILL)  # one worker only: the other takes its trial over once its heartbeat is stale
    output, _ = process.communicate(timeout=600)
    assert process.returncode == 0, output.decode()
    assert table(out) == table(reference)
    final = trials(out)
    complete = [t for t in final if t.state.name == "COMPLETE"]
    assert sorted(t.params["point"] for t in complete) == sorted(POINTS)  # each point counted once
    assert {t.number: t.state.name for t in final}[trial.number] == "FAIL"
    retry = [t for t in complete if t.system_attrs.get("failed_trial") == trial.number]
    assert len(retry) == 1 and retry[0].params["point"] == trial.params["point"]
    assert retry[0].user_attrs["worker"]["pid"] != killed
    assert cli.main(command(setup, out)) == 0 and table(out) == table(reference)  # again: nothing left to run
