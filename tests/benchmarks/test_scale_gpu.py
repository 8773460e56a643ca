"""The GPU scale benchmark: its CPU smoke run through the study runner (a device call a trial), the ratios to
sentence-transformers' references, a later call merged with its own ratios, the committed table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import scale_gpu

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def test_ratios_compare_with_the_reference_of_the_same_batch_variant_and_call():
    rows = [
        {"method": "cached_mnrl", "batch_size": 8, "variant": "cached", "call": 1, "status": "ok", "step_ms": 10.0,
         "peak_mb": 4.0},
        {"method": "focal", "batch_size": 8, "variant": "cached", "call": 1, "status": "ok", "step_ms": 12.5,
         "peak_mb": 5.0},
        {"method": "cached_mnrl", "batch_size": 8, "variant": "cached", "call": 2, "status": "ok", "step_ms": 20.0,
         "peak_mb": 8.0},
        {"method": "mixcse", "batch_size": 8, "variant": "cached", "call": 2, "status": "ok", "step_ms": 30.0,
         "peak_mb": 4.0},
        {"method": "mnrl", "batch_size": 4, "variant": "uncached", "status": "ok", "step_ms": 2.0, "peak_mb": 1.0},
        {"method": "adcse", "batch_size": 4, "variant": "uncached", "status": "ok", "step_ms": 1.0, "peak_mb": 0.5},
    ]
    scale_gpu.ratios(rows)
    assert [r["step_ratio"] for r in rows] == [1.0, 1.25, 1.0, 1.5, 1.0, 0.5]
    assert [r["peak_ratio"] for r in rows] == [1.0, 1.25, 1.0, 0.5, 1.0, 0.5]


def test_a_row_is_named_by_the_loss_its_record_trained():
    def row(method, **recorded):
        return {"method": method, "batch_size": 8, "variant": "cached", "call": 1, "status": "ok", "step_ms": 10.0,
                "step_seconds": [0.01], "peak_mb": 4.0, "step_ratio": 1.0, "peak_ratio": 1.0, **recorded}

    result = {"model": "tiny", "mini_batch_size": 4, "wall_seconds": 1.0, "rows": [
        row("mixcse"),  # this benchmark's label: built through registry_loss, the two-direction form
        row("mixcse", loss="mixcse", loss_config={"directions": ["query_to_doc", "doc_to_query"]}),
        row("mixcse", loss="mixcse", loss_config={"directions": ["query_to_doc"]}),
        row("focal")],
        "environment": {"device_name": "cpu", "torch": "x", "cuda": None, "sentence_transformers": "y"}}
    names = [line.split(" | ")[2] for line in scale_gpu.markdown(result).splitlines() if line.startswith("| 8 |")]
    assert names == ["mixcse_two_way", "mixcse_two_way", "mixcse", "focal"]


def gpu_spec(folder, calls, methods=("mnrl", "cached_mnrl", "focal"), name="scale_gpu"):
    """A scale_gpu study's spec in ``folder`` (records and table there) on the tiny encoder on the CPU: ``calls`` is
    ``{dataset: extra}`` (its call number, steps, grid, note)."""
    spec = {"name": name,
            "protocol": {"model": "tiny", "model_name": "tiny (dry run)", "max_seq_length": 32, "mini_batch_size": 4,
                         "steps": 1, "autocast": "bf16"},
            "rows": {"every_method": {"loss": None, "extra": {"methods": list(methods)}}},
            "datasets": {name: {"extra": extra} for name, extra in calls.items()},
            "grid": [{"datasets": list(calls), "rows": ["every_method"], "seeds": [0]}],
            "choice": {"metric": None}, "trial": "benchmarks.scale_gpu:trial",
            "report": {"records": f"{name}.json", "read": "benchmarks.scale_gpu:read",
                       "layout": "benchmarks.scale_gpu:layout", "indent": 1,
                       "point": {"dataset": "dataset", "row": "row", "seed": "seed"},
                       "prepare": "benchmarks.scale_gpu:prepare",
                       "outputs": [{"file": f"{name}.md", "renderer": "benchmarks.scale_gpu:markdown"}]}}
    path = folder / f"{name}_spec_{len(calls)}.json"
    path.write_text(json.dumps(spec))
    return path


#: the CPU smoke run's grid: batch 4 uncached, batch 8 cached, 1 timed step
SMOKE = {"call": 1, "steps": 1, "grid": [[4, "uncached"], [8, "cached"]]}


def runner(*argv):
    from benchmarks.studies.__main__ import main

    return main([str(a) for a in argv])


def test_dry_run_measures_every_method_and_writes_json_and_markdown(tmp_path):
    out = tmp_path / "scale_gpu.json"
    assert runner(gpu_spec(tmp_path, {"call1": SMOKE}), "--run", "--work-dir", tmp_path / "work", "-q") == 0
    result = json.loads(out.read_text())
    cells = [(r["batch_size"], r["variant"], r["method"], r["status"]) for r in result["rows"]]
    # mnrl runs uncached only, cached_mnrl cached only: the other variant of a reference is not scheduled
    assert cells == [(4, "uncached", "mnrl", "ok"), (4, "uncached", "focal", "ok"),
                     (8, "cached", "cached_mnrl", "ok"), (8, "cached", "focal", "ok")]
    assert all(len(r["step_seconds"]) == 1 and len(r["loss_values"]) == 2 for r in result["rows"])
    focal = result["rows"][1]
    assert focal["step_ratio"] == round(focal["step_ms"] / result["rows"][0]["step_ms"], 3)
    assert out.with_suffix(".md").read_text() == scale_gpu.markdown(result)
    assert list(result) == ["model", "steps", "mini_batch_size", "wall_seconds", "environment", "rows"]
    assert result["model"] == "tiny (dry run)" and result["mini_batch_size"] == 4 and result["steps"] == 1


def test_committed_gpu_table_is_rendered_from_its_json(tmp_path):
    saved = json.loads((RESULTS / "scale_gpu.json").read_text())
    scale_gpu.ratios(saved["rows"])
    assert (RESULTS / "scale_gpu.md").read_text() == scale_gpu.markdown(saved)
    assert saved["environment"]["device_name"] == "NVIDIA H200"
    # every loss was measured next to its reference at every batch up to 8192
    measured = {(r["batch_size"], r["method"]) for r in saved["rows"] if r["status"] == "ok"}
    for batch in (64, 1024, 8192):
        for method in ("mixcse", "focal", "hncse_pm", "hncse_hnm", "adcse"):
            assert (batch, method) in measured


def test_rows_carry_the_useful_flop_rate_and_a_later_call_merges_with_its_own_number(tmp_path, capsys):
    out = tmp_path / "scale_gpu.json"
    methods = ("cached_mnrl", "focal")
    assert runner(gpu_spec(tmp_path, {"call1": SMOKE}, methods), "--run", "--work-dir", tmp_path / "w1", "-q") == 0
    first = json.loads(out.read_text())
    for row in first["rows"]:
        useful, _ = scale_gpu.step_flops(scale_gpu.TINY, row["batch_size"], row["seq_len"],
                                         cached=row["variant"] == "cached")
        assert row["seq_len"] > 1 and row["tflops"] == round(useful / (row["step_ms"] / 1000) / 1e12, 1)
        assert row["peak_fraction"] is None  # a CPU has no bf16 tensor-core peak in the table
    # BERT-base at 32 tokens: 3 forwards of 2B sequences plus the B x B similarity, written out
    forward = 12 * (32 * (8 * 768**2 + 4 * 768 * 3072) + 4 * 32**2 * 768)
    assert scale_gpu.step_flops(scale_gpu.BERT_BASE, 1024, 32, cached=False)[0] == 3 * 2 * 1024 * forward + 6 * 1024**2 * 768
    twice = gpu_spec(tmp_path, {"call1": SMOKE, "again": SMOKE}, methods)
    with pytest.raises(SystemExit):  # the same call number twice: its ratios would mix two machines' rows
        runner(twice, "--run", "--work-dir", tmp_path / "w2")
    assert "both device call 1" in capsys.readouterr().err
    later = gpu_spec(tmp_path, {"call1": SMOKE, "call2": {**SMOKE, "call": 2, "note": "call 2: a later machine"}},
                     methods)
    assert runner(later, "--run", "--work-dir", tmp_path / "w3", "-q") == 0  # call 1 imported, call 2 run
    merged = json.loads(out.read_text())
    assert [r["call"] for r in merged["rows"]] == [1] * len(first["rows"]) + [2] * len(first["rows"])
    assert merged["rows"][:len(first["rows"])] == first["rows"]
    assert merged["notes"] == ["call 2: a later machine"] and set(merged["environments"]) == {"2"}
    assert merged["wall_seconds"] > first["wall_seconds"]
    assert out.with_suffix(".md").read_text() == scale_gpu.markdown(merged)
    later_rows = [r for r in merged["rows"] if r["call"] == 2 and r["variant"] == "cached"]
    assert [r["step_ratio"] for r in later_rows][0] == 1.0  # its own reference, not the first call's


def test_committed_call_3_measures_the_current_engine_at_32768():
    """Call 3 (H200): every loss's cached step at 32,768 against CachedMNRL in the same loop (autocast around the
    loss's forward, where CachedMNRL re-embeds in float32): a quarter of its step or less, at most its peak."""
    saved = json.loads((RESULTS / "scale_gpu.json").read_text())
    scale_gpu.ratios(saved["rows"])
    rows = {r["method"]: r for r in saved["rows"] if r.get("call") == 3 and r["batch_size"] == 32768}
    assert set(rows) == {"cached_mnrl", "mixcse", "focal", "hncse_pm", "hncse_hnm", "adcse"}
    assert saved["environments"]["3"]["device_name"] == "NVIDIA H200"
    for method, row in rows.items():
        assert row["status"] == "ok" and row["seq_len"] == 32, method
        if method != "cached_mnrl":
            assert row["step_ratio"] <= 0.25 and row["peak_ratio"] <= 1.0, method
            assert row["peak_fraction"] > 0.15, method  # the useful rate, against CachedMNRL's 4 %


@pytest.mark.parametrize("calls, argv, message", [
    ({"call0": {**SMOKE, "call": 0}}, [], "call must be an integer >= 1, got 0"),
    ({"one": SMOKE, "two": SMOKE}, [], "datasets 'one' and 'two' are both device call 1"),
    ({"call1": SMOKE}, ["--set", "device=tpu"], "device must be cpu or cuda, got 'tpu'"),
])
def test_bad_calls_and_devices_are_refused_before_anything_runs(tmp_path, capsys, calls, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        runner(gpu_spec(tmp_path, calls), "--run", "--work-dir", tmp_path / "work", *argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "scale_gpu.json").exists()


def test_the_gpu_protocol_needs_a_gpu(tmp_path, capsys):
    """The committed study's BERT-base protocol is refused on the CPU (one line naming --set device=cuda), and on a
    machine without CUDA also with it."""
    import shutil

    import torch

    spec = RESULTS.parent / "studies" / "scale_gpu.json"
    raw = json.loads(spec.read_text())
    raw["datasets"]["call4"] = {"extra": {"call": 4, "steps": 2, "grid": [[32768, "cached"]]}}
    raw["grid"][0]["datasets"].append("call4")
    raw["report"]["records"] = "scale_gpu.json"
    shutil.copy(RESULTS / "scale_gpu.json", tmp_path / "scale_gpu.json")
    (tmp_path / "spec.json").write_text(json.dumps(raw))
    for argv, message in (([], "run it with --set device=cuda"), (["--set", "device=cuda"], "no CUDA device")):
        if argv and torch.cuda.is_available():
            continue
        with pytest.raises(SystemExit) as exit_info:
            runner(tmp_path / "spec.json", "--run", "--work-dir", tmp_path / "work", *argv)
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert (tmp_path / "scale_gpu.json").read_text() == (RESULTS / "scale_gpu.json").read_text()
