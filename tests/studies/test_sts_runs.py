"""The STS studies' trials run through the one runner (``python -m benchmarks.studies SPEC --run``) on a tiny model:
the CPU protocol (:func:`benchmarks.cpu_protocol.run_trial`) and its screens (:func:`~benchmarks.cpu_protocol.screen_trial`),
a truncated screen run reproducing the full run's dev score at the same step, every run in a folder of its own
inside the study's work folder, and a finished study not run again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("optuna")

REPO = Path(__file__).resolve().parents[2]
STUDIES = REPO / "benchmarks" / "studies"


def runner(*argv: str) -> int:
    from benchmarks.studies.__main__ import main

    return main(list(argv))


def spec_copy(tmp_path: Path, name: str, rows: dict, grid: list, extra: dict, protocol: dict | None = None) -> Path:
    """The committed spec ``name`` with these rows, grid and dataset ``extra``, its records and tables in
    ``tmp_path / "results"``."""
    raw = json.loads((STUDIES / f"{name}.json").read_text())
    raw.update(rows=rows, grid=grid)
    raw["datasets"]["wiki10k"]["extra"] = extra
    if protocol is not None:
        raw["protocol"] = protocol
    raw["report"]["records"] = str(tmp_path / "results" / f"{name}.json")
    raw["report"]["outputs"] = [dict(o, file=str(tmp_path / "results" / Path(o["file"]).name))
                                for o in raw["report"]["outputs"]]
    path = tmp_path / f"{name}.spec.json"
    path.write_text(json.dumps(raw))
    return path


@pytest.mark.integration
def test_the_cpu_protocol_and_its_screens_run_through_the_runner(tiny_model_dir, shared_data, tmp_path):
    """The CPU protocol's study on a tiny model (3 steps), then a screen reading its dev curves: a truncated run of
    the same seed stops at the asked step and reproduces the full run's dev score there exactly (both evaluate first
    at that step, as in the real screen)."""
    from benchmarks import cpu_protocol as cpu
    from st_hardneg.evaluation import SentEvalSTSEvaluator
    from st_hardneg.models import resolve_model

    raw = json.loads((STUDIES / "cpu_protocol.json").read_text())
    spec = spec_copy(tmp_path, "cpu_protocol", rows={k: raw["rows"][k] for k in ("untrained", "mnrl", "mixcse")},
                     grid=[{"datasets": ["wiki10k"], "rows": ["untrained"], "seeds": [None]},
                           {"datasets": ["wiki10k"], "rows": ["mnrl", "mixcse"], "seeds": [0]}],
                     extra={"eval_steps": 2})
    common = ["--data-dir", str(shared_data), "--set", f"model={tiny_model_dir}", "--set", "limit=192",
              "--set", "quiet=true", "-q"]
    work = tmp_path / "w1"
    mine = work / "mnrl-seed0"  # where a run of this label once went: a folder of the user's, never removed
    mine.mkdir(parents=True)
    (mine / "keep.txt").write_text("mine\n")
    assert runner(str(spec), "--run", "--work-dir", str(work), *common) == 0
    out = tmp_path / "results" / "cpu_protocol.json"
    data = json.loads(out.read_text())
    assert data["protocol"] == cpu.PROTOCOL
    assert data["runs"][0]["method"] == "untrained"  # the reference row first
    assert sorted(r["method"] for r in data["runs"][1:]) == ["mixcse", "mnrl"]
    model = resolve_model(str(tiny_model_dir), pooling="cls", max_seq_length=32)
    untrained = data["runs"][0]
    assert untrained["seed"] is None and set(untrained["sts"]) == {*cpu.TASKS, "avg"}
    assert untrained["stsb_dev_best"] == pytest.approx(
        SentEvalSTSEvaluator(str(shared_data), batch_size=128)(model)["sts-dev_spearman"], abs=1e-9)
    full = {r["method"]: r for r in data["runs"][1:]}
    for run in full.values():
        assert run["steps"] == 3 and [s for s, _ in run["dev_curve"]] == [2, 3]  # every 2 steps and at the end
        assert run["stsb_dev_best"] == max(v for _, v in run["dev_curve"])
        assert set(run["sts"]) == {*cpu.TASKS, "avg"}
        assert run["commit"] and run["library"]  # the provenance of a new record
    assert full["mnrl"]["loss"] == "mnrl" and full["mixcse"]["loss"] == "mixcse_two_way"
    # the row is named by the loss its record trained: the "mixcse" label runs the two-direction form
    md = tmp_path / "results" / "cpu_protocol.md"
    assert "| mixcse_two_way | 0 |" in md.read_text() and md.with_suffix(".png").is_file()
    assert md.read_text() == cpu.markdown(data)
    # each run trained in a folder of its own, removed after it; the user's folder is left as it was
    assert sorted(p.name for p in work.iterdir()) == ["mnrl-seed0", "study.db"]
    assert [p.name for p in mine.iterdir()] == ["keep.txt"]
    # run again: nothing is left (the storage, and a fresh one from the records alone), nothing is rewritten
    before = out.read_bytes()
    assert runner(str(spec), "--run", "--work-dir", str(work), *common) == 0
    assert runner(str(spec), "--run", "--work-dir", str(tmp_path / "w0"), *common) == 0
    assert out.read_bytes() == before and len(json.loads(before)["runs"]) == 3
    assert not (tmp_path / "w0" / "study.db").exists() or sorted(p.name for p in (tmp_path / "w0").iterdir()) == [
        "study.db"]

    # the hyperparameter screen: a control (mnrl again, truncated) and an extra configuration, rows of its spec
    extra_row = {"about": "extra configuration"}
    screen_spec = spec_copy(
        tmp_path, "tuning", rows={"mnrl": {"loss": "mnrl", **extra_row},
                                  "mix_lam0.5": {"loss": "mixcse", "options": {"lam": 0.5}, **extra_row}},
        grid=[{"datasets": ["wiki10k"], "rows": ["mnrl", "mix_lam0.5"], "seeds": [0]}], extra={"stop_after": 2},
        protocol=cpu.screen_protocol(2))
    assert runner(str(screen_spec), "--run", "--work-dir", str(tmp_path / "w2"), *common) == 0
    screen = json.loads((tmp_path / "results" / "tuning.json").read_text())
    assert (screen["seed"], screen["stop_after"], screen["protocol"]) == (0, 2, cpu.screen_protocol(2))
    runs = {r["label"]: r for r in screen["runs"]}
    assert sorted(runs) == ["mix_lam0.5", "mnrl"] and all("seed" not in r for r in screen["runs"])
    control = runs["mnrl"]
    assert control["steps"] == 2 and [s for s, _ in control["dev_curve"]] == [2]
    assert control["stsb_dev"] == screen["references"]["mnrl"] == full["mnrl"]["dev_curve"][0][1]
    assert screen["references"] == {"mnrl": full["mnrl"]["dev_curve"][0][1],
                                    "mixcse": full["mixcse"]["dev_curve"][0][1]}
    assert runs["mix_lam0.5"]["loss_config"]["lam"] == 0.5
    assert (runs["mix_lam0.5"]["changed"], runs["mix_lam0.5"]["why"]) == ({"lam": 0.5}, "extra configuration")
    table = (tmp_path / "results" / "tuning.md").read_text()
    assert "| mix_lam0.5 | mixcse | lam=0.5 |" in table and "+0.00" in table  # the control's Δ vs mnrl
    assert table == cpu.screen_markdown(screen)
    assert sorted(p.name for p in (tmp_path / "w2").iterdir()) == ["study.db"]

    # the queue screen: its own rows and its own file
    raw = json.loads((STUDIES / "tuning_queue.json").read_text())
    queue_spec = spec_copy(tmp_path, "tuning_queue", rows={"mnrl_queue64_ema": raw["rows"]["mnrl_queue64_ema"]},
                           grid=[{"datasets": ["wiki10k"], "rows": ["mnrl_queue64_ema"], "seeds": [0]}],
                           extra={"stop_after": 2}, protocol=cpu.screen_protocol(2))
    assert runner(str(queue_spec), "--run", "--work-dir", str(tmp_path / "w3"), *common) == 0
    run = json.loads((tmp_path / "results" / "tuning_queue.json").read_text())["runs"][0]
    assert run["loss"] == "mnrl_queue" and run["steps"] == 2
    assert (run["loss_config"]["queue_size"], run["loss_config"]["queue_source"]) == (64, "ema")
    assert run["loss_config"]["queue_warmup_steps"] == 8
    assert (tmp_path / "results" / "queue.md").read_text().startswith("# The queue\n\nScreen (seed 0")


def test_a_configuration_without_a_usable_row_is_a_failed_record(monkeypatch, tmp_path):
    """A loss that refuses every batch (no usable row) is a result: a record with ``failed``, the point's fields and
    its provenance; any other error is the trial's own."""
    from benchmarks import cpu_protocol as cpu
    from st_hardneg.training.studies.spec import Point, load_spec

    spec = load_spec(STUDIES / "cpu_protocol.json")
    context = {"data_dir": str(tmp_path), "work_dir": str(tmp_path / "w"), "provenance": {"commit": "c", "library": "l",
                                                                                       "version": "v"}}

    def refuse(*args, **kwargs):
        raise ValueError("focal: no usable row in this batch (every negative masked)")

    monkeypatch.setattr(cpu, "run_one", refuse)
    assert cpu.run_trial(spec, Point("wiki10k", "focal", 1), context) == {
        "method": "focal", "seed": 1, "failed": "focal: no usable row in this batch (every negative masked)",
        "commit": "c", "library": "l"}
    screen = load_spec(STUDIES / "tuning.json")
    assert cpu.screen_trial(screen, Point("wiki10k", "focal_m0.5", 1), context) == {
        "label": "focal_m0.5", "failed": "focal: no usable row in this batch (every negative masked)",
        "commit": "c", "library": "l", "seed": 1, "stop_after": 50}

    def broken(*args, **kwargs):
        raise ValueError("another error")

    monkeypatch.setattr(cpu, "run_one", broken)
    with pytest.raises(ValueError, match="another error"):
        cpu.run_trial(spec, Point("wiki10k", "focal", 1), context)
    # a failed configuration is left out of the screen's table
    assert "focal_m0.5" not in cpu.screen_markdown({"seed": 1, "stop_after": 50, "references": {}, "runs": [
        {"label": "focal_m0.5", "failed": "no usable row in this batch"}]}).split("\n\n", 1)[1]
