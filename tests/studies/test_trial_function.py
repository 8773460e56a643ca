"""A spec names its own trial function (``"trial": "module:function"``): the engine runs it with the same storage,
heartbeat, retry and workers as the BEIR trial."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("optuna")

from st_hardneg.training.studies.spec import spec_from_dict  # noqa: E402
from tests.studies.trials import fast_trial  # noqa: E402


def _spec(trial: str | None = "tests.studies.trials:fast_trial", seeds=(0, 1)) -> dict:
    return {"name": "fast", "rows": {"mnrl": {"loss": "mnrl", "extra": {"mining": "own"}}},
            "datasets": {"tiny": {"folder": "tiny"}}, "grid": [{"datasets": ["tiny"], "rows": ["mnrl"],
                                                                "seeds": list(seeds)}],
            **({"trial": trial} if trial else {})}


def test_the_spec_names_its_trial_and_keeps_it():
    from st_hardneg.training.studies.beir import run_point
    from st_hardneg.training.studies.engine import trial_function

    spec = spec_from_dict(_spec())
    assert trial_function(spec) is fast_trial
    assert spec.to_dict()["trial"] == "tests.studies.trials:fast_trial" and spec_from_dict(spec.to_dict()) == spec
    assert trial_function(spec_from_dict(_spec(trial=None))) is run_point


@pytest.mark.parametrize("trial, fragment", [
    ("fast_trial", "trial must name a function as 'module:function', got 'fast_trial'"),
    ("tests.studies.nowhere:fast_trial", "the study's trial 'tests.studies.nowhere:fast_trial' cannot be imported"),
    ("tests.studies.trials:slow_trial", "the module tests.studies.trials has no function 'slow_trial'"),
])
def test_a_trial_that_names_no_function_is_one_line(trial, fragment):
    from st_hardneg.training.studies.engine import trial_function

    with pytest.raises(ValueError) as raised:
        trial_function(spec_from_dict(_spec(trial=trial)))
    assert fragment in str(raised.value) and len(str(raised.value).splitlines()) == 1


def test_two_workers_run_a_named_trial_and_record_each_point_once(tmp_path):
    from optuna.trial import TrialState

    from st_hardneg.training.studies.engine import finished_records, open_storage, open_study, run_study

    spec = spec_from_dict(_spec(seeds=(0, 1)))
    url = f"sqlite:///{tmp_path / 'study.db'}"
    log = tmp_path / "ran.txt"
    state = run_study(spec, url, None, {"log": str(log)}, workers=2, heartbeat=5)
    assert sorted(state.done) == ["tiny/mnrl/0", "tiny/mnrl/1"] and state.left == [] and state.failed == {}
    assert sorted(log.read_text().split()) == ["tiny/mnrl/0", "tiny/mnrl/1"]  # each point ran once
    study = open_study(spec, open_storage(url, 5))
    complete = [t for t in study.get_trials() if t.state == TrialState.COMPLETE]
    assert sorted(t.params["point"] for t in complete) == ["tiny/mnrl/0", "tiny/mnrl/1"]
    records = finished_records(study, spec)
    assert sorted((r["seed"], r["dev"]["ndcg@10"], r["test"]["ndcg@10"]) for r in records) == [(0, 10.0, 20.0),
                                                                                                (1, 11.0, 21.0)]
    assert os.getpid() not in {r["pid"] for r in records}  # run by the worker processes, not this one
    # run again: nothing is left, nothing runs twice
    assert sorted(run_study(spec, url, None, {"log": str(log)}, heartbeat=5).done) == sorted(state.done)
    assert len(log.read_text().split()) == 2


def test_a_benchmark_specs_protocol_model_is_a_description_not_the_model_to_load(tmp_path, monkeypatch):
    """``st-hardneg study --spec`` with a benchmark's own trial: its protocol's ``model`` describes its records
    ("all-MiniLM-L6-v2 as published"), so the trial gets the model only from ``--model``; a BEIR spec's protocol
    ``model`` is the model."""
    import json

    from optuna.trial import TrialState

    from st_hardneg import cli
    from st_hardneg.testing.beir import make_tiny_beir
    from st_hardneg.training.studies.engine import open_storage, open_study

    raw = {**_spec(trial="tests.studies.trials:model_trial", seeds=(0,)),
           "protocol": {"model": "all-MiniLM-L6-v2 as published (a description)"}}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(raw))
    make_tiny_beir(tmp_path / "tiny")
    monkeypatch.setenv("ST_HARDNEG_DATA", str(tmp_path))
    for out, extra, expected in (("a", [], None), ("b", ["--model", "/some/model"], "/some/model")):
        argv = ["study", "-q", "--spec", str(path), "--output-dir", str(tmp_path / out), *extra]
        assert cli.main(argv) == 0
        study = open_study(spec_from_dict(raw), open_storage(f"sqlite:///{tmp_path / out / 'study.db'}"))
        trials = [t for t in study.get_trials() if t.state == TrialState.COMPLETE]
        assert [t.user_attrs["record"]["model"] for t in trials] == [expected]
