"""The GPU scale benchmark: its CPU dry run, the ratios to sentence-transformers' references, the committed table."""

from __future__ import annotations

import json
from pathlib import Path

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


def test_dry_run_measures_every_method_and_writes_json_and_markdown(tmp_path):
    out = tmp_path / "scale_gpu.json"
    assert scale_gpu.main(["--dry-run", "--methods", "mnrl", "cached_mnrl", "focal", "--steps", "1",
                           "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    cells = [(r["batch_size"], r["variant"], r["method"], r["status"]) for r in result["rows"]]
    # mnrl runs uncached only, cached_mnrl cached only: the other variant of a reference is not scheduled
    assert cells == [(4, "uncached", "mnrl", "ok"), (4, "uncached", "focal", "ok"),
                     (8, "cached", "cached_mnrl", "ok"), (8, "cached", "focal", "ok")]
    assert all(len(r["step_seconds"]) == 1 and len(r["loss_values"]) == 2 for r in result["rows"])
    focal = result["rows"][1]
    assert focal["step_ratio"] == round(focal["step_ms"] / result["rows"][0]["step_ms"], 3)
    assert out.with_suffix(".md").read_text() == scale_gpu.markdown(result)


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
