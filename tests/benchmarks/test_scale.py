"""benchmarks.scale: the report arithmetic on hand-made results, smoke runs of the real subprocess grid through the
study runner (``python -m benchmarks.studies SPEC --run``; the rounds' bookkeeping around a stand-in for the
subprocess), the paired timing (``paired``) and the live-tensor count (``tensors``); the committed tables."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

from tests.conftest import SHARED_DATA

REPO = Path(__file__).resolve().parents[2]
CORPUS = SHARED_DATA / "corpus" / "wiki10k.txt"


scale = importlib.import_module("benchmarks.scale")
RESULTS = REPO / "benchmarks" / "results"


def _run(method, variant, batch, processes=1, status="ok", step_ms=None, peak_mb=None, state_mb=10.0):
    run = {"method": method, "variant": variant, "batch_size": batch, "processes": processes, "status": status}
    if status == "ok":
        run.update(step_ms=step_ms, peak_mb=peak_mb, state_mb=state_mb)
    return scale.config_key(method, variant, batch, processes), run


def _data(*runs):
    return {"runs": dict(runs)}


def test_summary_ratios_and_targets_by_hand():
    data = _data(
        _run("cached_mnrl", "cached", 64, step_ms=100.0, peak_mb=50.0),
        _run("cached_mnrl", "cached", 1024, step_ms=1000.0, peak_mb=60.0),
        _run("mixcse", "cached", 64, step_ms=120.0, peak_mb=40.0),      # 1.2x the reference: below 1024, not judged
        _run("mixcse", "cached", 1024, step_ms=1300.0, peak_mb=75.0),   # 1.3x: misses 1.15; memory 75/40: misses;
        # peak 75/60 = 1.25x the reference's: misses 1.2
        _run("mixcse", "uncached", 64, step_ms=90.0, peak_mb=80.0),
        _run("mixcse", "uncached", 1024, status="skipped"),
        _run("mnrl", "cached", 64, status="not supported"),
        _run("mnrl", "cached", 256, processes=2, step_ms=700.0, peak_mb=30.0),  # no 1-process run at 256
        _run("mixcse", "cached", 1024, processes=2, step_ms=650.0, peak_mb=33.0),
    )
    summary = scale.summarize(data)
    timing = {(t["method"], t["batch_size"]): t for t in summary["timing"]}
    assert set(timing) == {("mixcse", 64), ("mixcse", 1024)}  # the reference is not compared with itself
    assert timing["mixcse", 64]["ratio"] == pytest.approx(1.2) and timing["mixcse", 64]["meets_target"] is None
    assert timing["mixcse", 1024]["ratio"] == pytest.approx(1.3) and timing["mixcse", 1024]["meets_target"] is False
    peaks = {(t["method"], t["batch_size"]): t for t in summary["peaks"]}
    assert peaks["mixcse", 64]["ratio"] == pytest.approx(0.8) and peaks["mixcse", 64]["meets_target"]
    assert peaks["mixcse", 1024]["ratio"] == pytest.approx(1.25) and not peaks["mixcse", 1024]["meets_target"]
    memory = {m["method"]: m for m in summary["memory"]}
    assert memory["cached_mnrl"]["ratio"] == pytest.approx(1.2) and memory["cached_mnrl"]["meets_target"]
    assert memory["mixcse"]["ratio"] == pytest.approx(1.875) and not memory["mixcse"]["meets_target"]
    assert (memory["mixcse"]["from_batch"], memory["mixcse"]["to_batch"]) == (64, 1024)
    assert "mnrl" not in memory  # no cached run succeeded
    ddp = {(d["method"], d["global_batch"]): d for d in summary["ddp"]}
    assert ddp["mixcse", 1024]["ratio"] == pytest.approx(0.5) and ddp["mixcse", 1024]["one_process_ms"] == 1300.0
    assert ddp["mixcse", 1024]["meets_target"] and ddp["mnrl", 256]["meets_target"] is None
    assert ddp["mnrl", 256]["ratio"] is None and ddp["mnrl", 256]["two_process_ms"] == 700.0
    rows = {(r["method"], r["batch_size"]): r for r in summary["rows"]}
    assert rows["mixcse", 1024]["uncached_status"] == "skipped" and rows["mixcse", 1024]["uncached_peak_mb"] is None
    assert rows["mnrl", 64]["cached_status"] == "not supported"

    text = scale.markdown(data)
    assert "| mixcse_two_way | 64 | 90 | 80 | 120 | 40 | – | 1.20× |" in text
    assert "| mixcse_two_way | 1024 | skipped | – | 1300 | 75 | – | 1.30× |" in text
    assert "| mnrl | 64 | – | – | not supported | – | – | – |" in text
    assert "| mixcse_two_way | 64 → 1024 | 1.88× | **no** |" in text and "| cached_mnrl | 64 → 1024 | 1.20× | yes |" in text
    assert "| mixcse_two_way | 1024 | 1.30× | **no** |" in text and "| mixcse_two_way | 64 | 1.20× | – |" in text  # step time
    assert "| mixcse_two_way | 1024 | 1.25× | **no** |" in text and "| mixcse_two_way | 64 | 0.80× | yes |" in text  # peak
    assert "| mixcse_two_way | cached | 1024 | 1300 | 650 | 0.50× | yes | 33 |" in text


def _recorded(method, batch, directions, step_ms):
    """A cached run that records the loss it built and its configuration (``loss`` / ``loss_config``)."""
    key, run = _run(method, "cached", batch, step_ms=step_ms, peak_mb=30.0)
    return key, run | {"loss": "mixcse", "loss_config": {"directions": list(directions)}}


def test_rows_are_named_by_the_loss_their_record_trained():
    two_way = ("query_to_doc", "doc_to_query")
    data = _data(_run("cached_mnrl", "cached", 1024, step_ms=1000.0, peak_mb=30.0),
                 _recorded("mixcse", 1024, two_way, 1100.0),
                 _recorded("mixcse_one", 1024, ("query_to_doc",), 900.0))
    text = scale.markdown(data)
    # the record's own configuration names the row: both directions are mixcse_two_way, one stays mixcse
    assert "| mixcse_two_way | 1024 | – | – | 1100 | 30 | – | 1.10× |" in text
    assert "| mixcse | 1024 | – | – | 900 | 30 | – | 0.90× |" in text
    assert "| mixcse_one |" not in text and "| mixcse | 1024 | 1.10× |" not in text
    assert scale.loss_names(data) == {"cached_mnrl": "cached_mnrl", "mixcse": "mixcse_two_way",
                                      "mixcse_one": "mixcse"}
    # the JSON's labels are untouched: the summary is keyed by them
    assert {t["method"] for t in scale.summarize(data)["timing"]} == {"mixcse", "mixcse_one"}
    mixed = _data(_recorded("mixcse", 64, two_way, 50.0), _recorded("mixcse", 1024, ("query_to_doc",), 900.0))
    with pytest.raises(ValueError, match="'mixcse' trained"):
        scale.loss_names(mixed)


def test_two_way_reference_is_listed_but_not_judged(tiny_model_dir):
    from st_hardneg.models import load_model

    assert [c["variant"] for c in scale.plan(["cached_mnrl_two_way"], [8], [], [], [])] == ["cached"]
    model = load_model(tiny_model_dir, pooling="cls", max_seq_length=16, device="cpu")
    loss = scale.build_benchmark_loss("cached_mnrl_two_way", model, cached=True, mini_batch_size=4, gather=False)
    assert type(loss).__name__ == "CachedMultipleNegativesRankingLoss" and loss.mini_batch_size == 4
    assert tuple(loss.directions) == ("query_to_doc", "doc_to_query") and loss.partition_mode == "per_direction"
    with pytest.raises(ValueError, match="always cached"):
        scale.build_benchmark_loss("cached_mnrl_two_way", model, cached=False, mini_batch_size=4, gather=False)
    data = _data(_run("cached_mnrl", "cached", 1024, step_ms=100.0, peak_mb=50.0),
                 _run("cached_mnrl_two_way", "cached", 1024, step_ms=190.0, peak_mb=70.0),
                 _run("mixcse", "cached", 1024, step_ms=200.0, peak_mb=55.0))
    summary = scale.summarize(data)
    assert [t["method"] for t in summary["timing"]] == [t["method"] for t in summary["peaks"]] == ["mixcse"]
    rows = {r["method"]: r for r in summary["rows"]}
    assert rows["cached_mnrl_two_way"]["cached_time_vs_reference"] == pytest.approx(1.9)
    assert "| cached_mnrl_two_way | 1024 | – | – | 190 | 70 | – | 1.90× |" in scale.markdown(data)


def test_memory_estimate_extrapolates_the_batch_dependent_part():
    runs = dict([_run("mnrl", "uncached", 64, step_ms=1.0, peak_mb=1410.0, state_mb=250.0),
                 _run("mnrl", "uncached", 16, step_ms=1.0, peak_mb=500.0, state_mb=250.0)])
    # from the largest smaller batch (64): 250 + (1410 - 250) * 1024 / 64
    assert scale.estimate_peak_mb(runs, {"method": "mnrl", "variant": "uncached", "batch_size": 1024,
                                         "processes": 1}) == pytest.approx(250 + 1160 * 16)
    # 2 processes of 128 each: twice 250 + 1160 * 2
    assert scale.estimate_peak_mb(runs, {"method": "mnrl", "variant": "uncached", "batch_size": 256,
                                         "processes": 2}) == pytest.approx(2 * (250 + 1160 * 2))
    # from batch 16 for a batch between 16 and 64: 250 + 250 * 32 / 16
    assert scale.estimate_peak_mb(runs, {"method": "mnrl", "variant": "uncached", "batch_size": 32,
                                         "processes": 1}) == pytest.approx(750.0)
    assert scale.estimate_peak_mb(runs, {"method": "mnrl", "variant": "cached", "batch_size": 1024,
                                         "processes": 1}) is None
    assert scale.estimate_peak_mb(runs, {"method": "mnrl", "variant": "uncached", "batch_size": 8,
                                         "processes": 1}) is None


def test_a_round_adds_its_step_and_the_median_becomes_the_step():
    _, run = _run("focal", "cached", 1024, step_ms=600.0, peak_mb=24.0)
    run.update(default_malloc_peak_mb=30.0, wall_seconds=20.0)
    assert scale.rounds_of(run) == 1  # a run from before --rounds: its one step time
    second = scale.add_round(run, {"status": "ok", "step_ms": 700.0, "peak_mb": 35.0, "wall_seconds": 9.0})
    assert second["step_ms_rounds"] == [600.0, 700.0] and second["step_ms"] == 650.0 and scale.rounds_of(second) == 2
    assert second["default_malloc_peak_mb"] == 35.0 and second["wall_seconds"] == 29.0
    assert second["peak_mb"] == 24.0  # the memory run of round 1 stands
    third = scale.add_round(second, {"status": "ok", "step_ms": 400.0, "peak_mb": 31.0, "wall_seconds": 9.0})
    assert third["step_ms"] == 600.0 and third["default_malloc_peak_mb"] == 35.0  # median of 600, 700, 400
    failed = scale.add_round(third, {"status": "error", "reason": "exit code 1"})
    assert failed["status"] == "ok" and failed["step_ms_rounds"] == third["step_ms_rounds"]
    assert failed["round_errors"] == ["round 4: exit code 1"] and scale.rounds_of(failed) == 3
    assert run == dict(_run("focal", "cached", 1024, step_ms=600.0, peak_mb=24.0)[1], default_malloc_peak_mb=30.0,
                       wall_seconds=20.0)  # not modified in place


def test_report_lists_the_2_process_ratio_of_every_round():
    one, two = _run("focal", "cached", 1024, step_ms=600.0, peak_mb=24.0), \
        _run("focal", "cached", 1024, processes=2, step_ms=330.0, peak_mb=25.0)
    one[1]["step_ms_rounds"], two[1]["step_ms_rounds"] = [600.0, 500.0, 650.0], [300.0, 330.0, 390.0]
    plain = _run("mixcse", "cached", 1024, step_ms=700.0, peak_mb=24.0), \
        _run("mixcse", "cached", 1024, processes=2, step_ms=350.0, peak_mb=24.0)
    data = _data(one, two, *plain)
    ddp = {d["method"]: d for d in scale.summarize(data)["ddp"]}
    assert ddp["focal"]["round_ratios"] == pytest.approx([0.5, 0.66, 0.6]) and ddp["focal"]["ratio"] == 0.55
    assert ddp["mixcse"]["round_ratios"] == []
    data["_meta"] = {"steps": 3, "model": "tiny"}
    text = scale.markdown(data)
    assert "| 2 / 1 per round |" in text
    assert "| focal | cached | 1024 | 600 | 330 | 0.55× | 0.50, 0.66, 0.60 | yes | 25 |" in text
    assert "| mixcse_two_way | cached | 1024 | 700 | 350 | 0.50× | – | yes | 24 |" in text
    assert "timed in 3 interleaved rounds" in text
    assert "interleaved" not in scale.markdown(_data(*plain) | {"_meta": {"steps": 3}})


def test_steps_text_names_the_variant_only_where_a_batch_s_variants_differ():
    runs = [_run("focal", v, b) for v in ("cached", "uncached") for b in (64, 1024)] + \
        [_run("focal", "cached", 65536)]
    data = _data(*runs)
    for key, run in data["runs"].items():
        run["steps"] = 9 if key == "focal/cached/b1024" else 2 if run["batch_size"] == 65536 else 3
    assert sys.modules["benchmarks.scale.report"]._steps_text(data) == "3 steps (cached batch 1024: 9; batch 65536: 2)"


def study(tmp_path, configs, name="scale", **protocol):
    """A scale study's spec in ``tmp_path`` (records and tables there too) for ``configs`` (:func:`scale.plan`), on the
    tiny model, 2 steps, mini-batch 4, 1 thread."""
    protocol = {"model": "tiny", "max_seq_length": 32, "steps": 2, "threads": 1, "seed": 0, "corpus": str(CORPUS),
                "mini_batch_size": 4, **protocol}
    report = {"records": f"{name}.json", "read": "benchmarks.scale:read", "layout": "benchmarks.scale:layout",
              "point": {"dataset": "dataset", "row": "row", "seed": "seed"}, "prepare": "benchmarks.scale:prepare",
              "outputs": [{"file": f"{name}.md", "renderer": "benchmarks.scale.report:markdown"},
                          {"file": f"{name}.png", "renderer": "benchmarks.scale.report:plot", "figure": True}]}
    path = tmp_path / f"{name}_spec.json"
    path.write_text(json.dumps(scale.spec_dict(name, protocol, configs, report)))
    return path


def runner(*argv):
    from benchmarks.studies.__main__ import main

    return main([str(a) for a in argv])


def test_plan_and_bad_inputs(tmp_path, capsys):
    configs = scale.plan(["mnrl", "cached_mnrl"], [8, 16], ["cached_mnrl"], [16], ["cached", "uncached"])
    keys = [scale.config_key(c["method"], c["variant"], c["batch_size"], c["processes"]) for c in configs]
    assert keys == ["mnrl/uncached/b8", "mnrl/cached/b8", "cached_mnrl/cached/b8", "mnrl/uncached/b16",
                    "mnrl/cached/b16", "cached_mnrl/cached/b16", "cached_mnrl/cached/b16/p2"]
    cached_only = scale.plan(["mixcse", "cached_mnrl"], [64, 1024], [], [], [], variants=["cached"])
    assert [(c["method"], c["variant"], c["batch_size"]) for c in cached_only] == [
        ("mixcse", "cached", 64), ("cached_mnrl", "cached", 64), ("mixcse", "cached", 1024),
        ("cached_mnrl", "cached", 1024)]
    # the study's grid is the plan: a dataset per batch, a row per method, variant and processes
    spec = json.loads(study(tmp_path, configs).read_text())
    from st_hardneg.training.studies.spec import spec_from_dict

    points = [p.key for p in spec_from_dict(spec).points()]
    assert points == ["b8/mnrl/uncached/0", "b8/mnrl/cached/0", "b8/cached_mnrl/cached/0", "b16/mnrl/uncached/0",
                      "b16/mnrl/cached/0", "b16/cached_mnrl/cached/0", "b16/cached_mnrl/cached/p2/0"]
    assert spec["rows"]["cached_mnrl/cached/p2"]["extra"] == {"method": "cached_mnrl", "variant": "cached",
                                                              "processes": 2}
    with pytest.raises(ValueError, match="always cached"):
        scale.build_benchmark_loss("cached_mnrl", None, cached=False, mini_batch_size=4, gather=False)
    with pytest.raises(ValueError, match="unknown method"):
        study(tmp_path, scale.plan(["nope"], [8], [], [], []))
    with pytest.raises(ValueError, match="divisible by its processes"):
        study(tmp_path, scale.plan([], [], ["cached_mnrl"], [15], ["cached"]))
    with pytest.raises(ValueError, match="steps must be >= 2"):
        study(tmp_path, configs, steps=1)
    spec = study(tmp_path, scale.plan(["cached_mnrl"], [8], [], [], []))
    nowhere = study(tmp_path, scale.plan(["cached_mnrl"], [8], [], [], []), name="nowhere",
                    corpus=str(tmp_path / "wiki10k.txt"))  # not there, nor in the data folder given
    for path, argv, message in ((spec, ["--set", "rounds=0"], "rounds"), (spec, ["--set", "steps=1"], "steps"),
                                (nowhere, ["--data-dir", str(tmp_path / "none")], "corpus not found")):
        with pytest.raises(SystemExit) as stop:
            runner(path, "--run", "--work-dir", tmp_path / "work" / path.stem, *argv)
        assert stop.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "scale.json").exists()  # refused before any trial
    (tmp_path / "scale.json").write_text(json.dumps({"runs": []}))
    with pytest.raises(SystemExit) as stop:
        runner(spec, "--check")
    assert stop.value.code == 2 and "not a scale benchmark result" in capsys.readouterr().err


def _param_counts():
    """(all parameters, parameters that get a gradient) of the tiny model as the benchmark loads it."""
    import tempfile

    from st_hardneg.models import load_model
    from st_hardneg.testing import make_tiny_model_dir

    with tempfile.TemporaryDirectory() as tmp:
        model = load_model(make_tiny_model_dir(Path(tmp) / "tiny", seed=0), pooling="cls", max_seq_length=32,
                           device="cpu")
    total = sum(p.numel() for p in model.parameters())
    # BERT's pooler (dense + tanh on [CLS]) is not used by a Pooling module in CLS mode: it gets no gradient
    pooled = sum(p.numel() for n, p in model.named_parameters() if ".pooler." in n)
    return total, total - pooled


def test_smoke_grid_tiny_model(tmp_path, capsys, shared_data):
    spec = study(tmp_path, scale.plan(["mnrl", "cached_mnrl"], [8, 16], [], [], []))
    out = tmp_path / "scale.json"
    assert runner(spec, "--run", "--work-dir", tmp_path / "work", "-q") == 0
    data = json.loads(out.read_text())
    runs = data["runs"]
    assert set(runs) == {"mnrl/uncached/b8", "mnrl/cached/b8", "cached_mnrl/cached/b8", "mnrl/uncached/b16",
                         "mnrl/cached/b16", "cached_mnrl/cached/b16"}
    # ST's MNRL takes no mini_batch_size: reported, not crashed (and not started again at the other batch: the first
    # of the two the engine ran has a wall time, the other none)
    for key in ("mnrl/cached/b8", "mnrl/cached/b16"):
        assert runs[key]["status"] == "not supported" and "mini_batch_size" in runs[key]["reason"]
    assert ["wall_seconds" in runs[key] for key in ("mnrl/cached/b8", "mnrl/cached/b16")].count(True) == 1
    _, trained = _param_counts()
    for key in ("mnrl/uncached/b8", "cached_mnrl/cached/b8", "mnrl/uncached/b16", "cached_mnrl/cached/b16"):
        run = runs[key]
        assert run["status"] == "ok", run
        assert run["loss_class"] == ("MultipleNegativesRankingLoss" if key.startswith("mnrl")
                                     else "CachedMultipleNegativesRankingLoss")
        assert len(run["step_seconds"]) == 2 and len(run["loss_values"]) == 2
        assert run["step_ms"] == pytest.approx(1000 * run["step_seconds"][1], abs=0.06)  # the step after warm-up
        assert all(v > 0 for v in run["loss_values"])
        assert run["peak_mb"] >= 0 and run["baseline_rss_mb"] > 0 and run["torch_threads"] == 1
        # the memory step runs with glibc's mmap threshold fixed (Linux); the default allocator's mark is kept too
        assert "mmap threshold fixed" in run["memory_method"] and run["default_malloc_peak_mb"] >= 0
        # gradients + AdamW's two moments, float32, of every parameter that trains
        assert run["state_mb"] == pytest.approx(3 * 4 * trained / 2**20, abs=0.06)
        assert run["world_size"] == 1 and run["per_process_batch_size"] == run["batch_size"]
    assert data["_meta"]["settings"]["model"] == "tiny" and data["_meta"]["mini_batch_size"] == 4
    for suffix in (".md", ".png"):
        assert out.with_suffix(suffix).is_file()
    table = out.with_suffix(".md").read_text()
    assert "| mnrl | 8 |" in table and "not supported" in table and "| cached_mnrl | 8 → 16 |" in table
    assert "cached step / cached_mnrl" in table

    # resume: nothing is rerun; the runner without --run rewrites the table from the JSON alone
    capsys.readouterr()
    assert runner(spec, "--run", "--work-dir", tmp_path / "work", "-q") == 0
    assert "to run" not in capsys.readouterr().out and json.loads(out.read_text()) == data
    out.with_suffix(".md").unlink()
    assert runner(spec, "-q") == 0
    assert out.with_suffix(".md").read_text() == table
    assert "2 steps per configuration" in table

    # a larger batch may be timed over another number of steps in the same file (each run records its own); any
    # other setting may not
    more = study(tmp_path, scale.plan(["mnrl", "cached_mnrl"], [8, 16], [], [], [])
                 + scale.plan(["cached_mnrl"], [24], [], [], [], variants=["cached"]))
    assert runner(more, "--run", "--work-dir", tmp_path / "more", "--set", "steps=3", "-q") == 0
    runs = json.loads(out.read_text())["runs"]
    assert runs["cached_mnrl/cached/b24"]["steps"] == 3 and len(runs["cached_mnrl/cached/b24"]["step_seconds"]) == 3
    assert {k: v for k, v in runs.items() if k != "cached_mnrl/cached/b24"} == data["runs"]  # imported, not rerun
    assert "2 steps (batch 24: 3) per configuration" in out.with_suffix(".md").read_text()
    other = study(tmp_path, scale.plan(["cached_mnrl"], [8], [], [], []), mini_batch_size=8)
    with pytest.raises(SystemExit):
        runner(other, "--run", "--work-dir", tmp_path / "other")
    assert "made under another protocol than the spec's (changed: mini_batch_size)" in capsys.readouterr().err


def _worker_result(cfg, number, memory):
    """What the ``worker`` subprocess prints for ``cfg`` (the keys of ``run_config``'s record), with numbers that tell
    the calls apart: step ``10 * number`` ms, peak 500 MB in a memory run and 700 MB (the default allocator) else."""
    peak = 500.0 if memory else 700.0
    return {"status": "ok", "loss_class": "CachedMultipleNegativesRankingLoss", "step_ms": 10.0 * number,
            "step_seconds": [0.02 * number] * cfg["steps"], "peak_mb": peak, "peak_mb_per_rank": [peak],
            "baseline_rss_mb": 300.0, "state_mb": 1.0,
            "memory_method": "VmHWM after clear_refs reset" + (", glibc mmap threshold fixed" if memory else ""),
            "loss_values": [2.0] * cfg["steps"], "torch_threads": cfg["threads"], "world_size": 1,
            "per_process_batch_size": cfg["batch_size"], "wall_seconds": 1.0}


def test_rounds_time_again_and_measure_memory_once(tmp_path, monkeypatch, shared_data):
    """The rounds' bookkeeping around :func:`launch` (the real subprocess is the smoke grid's): a stand-in records
    each launch and answers as the worker does; the runner's one worker runs the trial in this process."""
    launches = []

    def recording_launch(cfg, timeout, extra_env=None):
        launches.append("memory" if extra_env else "timed")
        assert extra_env in (None, scale.MEMORY_ENV)
        return _worker_result(cfg, len(launches), memory=extra_env is not None)

    monkeypatch.setattr(scale, "launch", recording_launch)
    spec = study(tmp_path, scale.plan(["cached_mnrl"], [8], [], [], [], variants=["cached"]))
    out = tmp_path / "scale.json"
    argv = [spec, "--run", "--work-dir", tmp_path / "work", "--set", "rounds=2", "-q"]
    assert runner(*argv) == 0
    assert launches == ["timed", "memory", "timed"]
    run = json.loads(out.read_text())["runs"]["cached_mnrl/cached/b8"]
    assert len(run["step_ms_rounds"]) == 2 and run["step_ms"] == pytest.approx(sum(run["step_ms_rounds"]) / 2, abs=0.01)
    # round 1 is the timed launch (10 ms; the memory launch's step is not a round), round 2 the third launch (30 ms);
    # the peak is the memory run's, the default allocator's mark the timed runs' largest
    assert run["step_ms_rounds"] == [10.0, 30.0] and run["peak_mb"] == 500.0 and run["default_malloc_peak_mb"] == 700.0
    assert runner(*argv) == 0 and len(launches) == 3  # the trial is finished: nothing runs


@pytest.mark.distributed
def test_smoke_two_processes_tiny_model(tmp_path, shared_data):
    out = tmp_path / "scale.json"
    spec = study(tmp_path, scale.plan(["cached_mnrl"], [16], ["cached_mnrl"], [16], ["cached"]), threads=2)
    assert runner(spec, "--run", "--work-dir", tmp_path / "work", "-q") == 0
    runs = json.loads(out.read_text())["runs"]
    one, two = runs["cached_mnrl/cached/b16"], runs["cached_mnrl/cached/b16/p2"]
    assert one["status"] == two["status"] == "ok"
    assert one["torch_threads"] == 2 and two["torch_threads"] == 1  # the same 2 cores in both
    assert two["world_size"] == 2 and two["per_process_batch_size"] == 8 and len(two["peak_mb_per_rank"]) == 2
    assert two["peak_mb"] == max(two["peak_mb_per_rank"])
    assert "| cached_mnrl | cached | 16 |" in out.with_suffix(".md").read_text()


def test_paired_timing_smoke(tmp_path, shared_data):
    """Every loss and both CachedMNRL references timed round-robin in one process; ratios against the references."""
    paired = importlib.import_module("benchmarks.scale.paired")
    out = tmp_path / "paired.md"
    assert paired.main(["--batch-size", "64", "--rounds", "2", "--corpus", str(CORPUS), "--out", str(out)]) == 0
    table = out.read_text()
    for name in ("cached_mnrl", "cached_mnrl (two-way)", *paired.LOSSES):
        assert f"| {name} |" in table
    assert "| cached_mnrl | " in table and "| 1.00× |" in table  # the reference against itself
    with pytest.raises(SystemExit):
        paired.main(["--rounds", "1", "--out", str(out)])


def test_live_tensors_of_a_cached_step_against_cached_mnrl():
    """benchmarks.scale tensors at N 512, d 8, chunks of 8: Focal holds what CachedMNRL holds (within half an
    N × d matrix), MixCSE's two-way form one more chunk block per direction; composing the normalisation from
    autograd's ops instead (row_norms' scaled copy kept per column) would add 2 matrices to every loss."""
    module = importlib.import_module("benchmarks.scale.tensors")
    results = module.measure(512, 8, 8)
    reference = results["cached_mnrl"][0]
    assert reference >= 5  # the tracker sees CachedMNRL's own concatenations and normalised copies
    assert results["focal"][0] <= reference + 0.5
    assert results["mixcse (two-way)"][0] <= reference + 2.5
    text = module.markdown(results, 512, 8, 8)
    assert f"| focal | {results['focal'][0]:.1f} | {results['focal'][0] - reference:+.1f} |" in text


def test_live_tensors_at_the_scale_benchmark_width_stay_near_cached_mnrl():
    """At d = c = 32 (the tiny model's width and mini-batch) and N 1024: Focal holds less than CachedMNRL (its logits
    keep only the similarity for the backward) and so does HNCSE PM (only the mixed rows are mixed; mixing every row and
    selecting was 1.2 above), MixCSE's two-way form within half a matrix, and HNM within 6 (its per-row draws are kept
    in 8 bits, drawn so; as int64 it was 9.3 above, in 16 bits 5.5, in 8 bits 4.9)."""
    module = importlib.import_module("benchmarks.scale.tensors")
    results = module.measure(1024, 32, 32)
    reference = results["cached_mnrl"][0]
    assert reference >= 10
    assert results["focal"][0] < reference
    assert results["mixcse (two-way)"][0] <= reference + 0.5
    assert results["hncse_pm"][0] < reference
    assert results["hncse_hnm"][0] <= reference + 6.0
    text = module.markdown(results, 1024, 32, 32)
    assert "| cached_mnrl | " in text and " = " in text  # each label with its total in N × d matrices


@pytest.mark.parametrize("argv", [["--n", "1"], ["--d", "0"], ["--c", "0"], ["--n", "-5"]])
def test_live_tensors_script_refuses_bad_sizes(argv, capsys):
    module = importlib.import_module("benchmarks.scale.tensors")
    with pytest.raises(SystemExit):
        module.main([*argv, "--out", "/dev/null"])
    assert f"{argv[0]} must be at least" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["scale", "scale_minilm"])
def test_committed_tables_are_rendered_from_their_json(name):
    data = json.loads((RESULTS / f"{name}.json").read_text())
    assert scale.markdown(data) == (RESULTS / f"{name}.md").read_text()


def test_subcommands_dispatch(monkeypatch, capsys):
    """``python -m benchmarks.scale paired|tensors|profile|summary|worker``: the worker measures one configuration
    given as JSON; without a subcommand, one line naming the study that runs the grid."""
    calls = []
    monkeypatch.setattr(scale, "run_config", lambda cfg: calls.append(cfg) or {"status": "ok"})
    capsys.readouterr()
    assert scale.main(["worker", json.dumps({"method": "mnrl"})]) == 0
    assert calls == [{"method": "mnrl"}]
    assert capsys.readouterr().out == scale.RESULT_PREFIX + json.dumps({"status": "ok"}) + "\n"
    with pytest.raises(SystemExit):
        scale.main(["tensors", "--n", "1", "--out", "/dev/null"])
    with pytest.raises(SystemExit):
        scale.main(["paired", "--rounds", "1", "--out", "/dev/null"])
    for argv in ([], ["run"], ["--report"]):
        with pytest.raises(SystemExit) as stop:
            scale.main(argv)
        assert stop.value.code == 2 and "benchmarks/studies/scale.json" in capsys.readouterr().err
