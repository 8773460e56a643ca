"""The benchmarks' shared pieces: a trial's own folder, summaries over seeds, results files, the per-run record. (The
resumable runs and the variant syntax are the one runner's and a spec's rows: tests/studies/test_sts_*.py.)"""

from __future__ import annotations

import json
import math
import statistics

import pytest

from benchmarks.harness import trial_folder
from st_hardneg.reporting import group_by_method, load_results, mean_std, median_or_none, write_results


def test_a_trial_folder_is_new_each_time_and_removed_with_what_the_trial_wrote(tmp_path):
    work = tmp_path / "work"
    users = work / "mnrl-seed0"  # a folder of that name already there (the user's): never used, never removed
    users.mkdir(parents=True)
    (users / "notes.txt").write_text("mine\n")
    with trial_folder(work, "mnrl-seed0") as first, trial_folder(work, "mnrl-seed0") as second:
        assert first != second and first.parent == second.parent == work and first != users
        assert first.name.startswith("mnrl-seed0-") and list(first.iterdir()) == []
        (first / "checkpoint-1").mkdir()
        (first / "checkpoint-1" / "model.bin").write_bytes(b"x")
    assert sorted(p.name for p in work.iterdir()) == ["mnrl-seed0"] and (users / "notes.txt").read_text() == "mine\n"
    with pytest.raises(RuntimeError, match="stopped"), trial_folder(work, "a/b c") as folder:
        assert folder.parent == work and folder.name.startswith("a_b_c-")  # never a path out of the work folder
        raise RuntimeError("stopped")
    assert sorted(p.name for p in work.iterdir()) == ["mnrl-seed0"]  # removed on an error too
    with trial_folder(tmp_path / "new" / "deeper", "x") as folder:  # the work folder is made when missing
        assert folder.is_dir()


def test_summaries_over_seeds():
    assert mean_std([70.0, 72.0, 74.0]) == (72.0, 2.0)  # sample std: sqrt((4 + 0 + 4) / 2)
    assert mean_std([5.0]) == (5.0, 0.0)
    mean, std = mean_std([1.0, 2.0])
    assert mean == 1.5 and math.isclose(std, math.sqrt(0.5))
    with pytest.raises(statistics.StatisticsError):
        mean_std([])
    assert median_or_none([None, 3.0, 0, 1.0, 2.0]) == 2.0  # None and 0 (not measured) are left out
    assert median_or_none([None, 0]) is None
    runs = [{"method": "b", "x": 1}, {"method": "a", "x": 2}, {"method": "b", "x": 3}]
    assert group_by_method(runs) == {"b": [runs[0], runs[2]], "a": [runs[1]]}


def test_results_files(tmp_path):
    out = tmp_path / "sub" / "r.json"
    assert load_results(out, {"p": 1}) == {"protocol": {"p": 1}, "runs": []}
    drawn = []
    write_results({"protocol": {}, "runs": []}, out, lambda d: "table\n", lambda d, p: drawn.append(p))
    assert json.loads(out.read_text()) == {"protocol": {}, "runs": []}
    assert not out.with_suffix(".md").exists() and drawn == []  # no report before the first run
    data = {"protocol": {}, "runs": [{"method": "a"}]}
    write_results(data, out, lambda d: f"{len(d['runs'])} run\n", lambda d, p: drawn.append(p))
    assert load_results(out, {"ignored": True}) == data
    assert out.with_suffix(".md").read_text() == "1 run\n" and drawn == [out.with_suffix(".png")]
    assert not list(tmp_path.rglob("*.tmp"))


def test_experiment_record_is_the_one_per_run_row(monkeypatch):
    """Every benchmark writes its per-run row through ExperimentResult.record: the shared fields, by hand."""
    import time

    import torch

    from st_hardneg.training.experiment import ExperimentResult
    from st_hardneg.training.loop import TrainResult

    class Loss:
        def get_config_dict(self):
            return {"lam": 0.2, "guide": object}  # a non-JSON value becomes its string

    train = TrainResult(train_seconds=12.3456, steps=7, median_step_seconds=1.5, step_seconds=[1.5] * 7,
                        best_metric=80.0, best_checkpoint=None, log_history=[])
    monkeypatch.setattr(time, "strftime", lambda fmt: "2026-11-25 03:00:00")
    row = ExperimentResult(model=None, loss=Loss(), train=train, sts=None).record(
        "mixcse_x", 2, loss="mixcse", sts={"avg": 75.0}, stop_after=None)
    assert row == {"method": "mixcse_x", "loss": "mixcse", "loss_config": {"lam": 0.2, "guide": str(object)},
                   "seed": 2, "sts": {"avg": 75.0}, "stop_after": None, "train_seconds": 12.3,
                   "median_step_seconds": 1.5, "steps": 7, "torch_threads": torch.get_num_threads(),
                   "finished": "2026-11-25 03:00:00"}
    assert list(row)[:4] == ["method", "loss", "loss_config", "seed"]
    assert "loss" not in ExperimentResult(model=None, loss=Loss(), train=train, sts=None).record("untrained", 0)
