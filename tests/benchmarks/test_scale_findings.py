"""benchmarks.scale.findings: the readings the scaling page gives beside its tables are the committed records',
recomputed here from the raw fields (round times, split phases, run steps), and the targets' verdicts follow the
numbers."""

from __future__ import annotations

import json
import re
import shutil
import statistics
from pathlib import Path

import pytest

from benchmarks.scale import findings

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
SOURCES = ("scale.json", "scale_minilm.json", "scale_gpu.json", "scale_profile_gpu.json",
           "scale_profile_gpu_losses.json", "scale_profile_cpu.json", "scale_paired.md", "scale_tensors.md")


def _json(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _section(text: str, name: str) -> str:
    return text.split(f"<!-- {name} -->\n", 1)[1].split(f"\n<!-- /{name} -->", 1)[0]


def _table(section: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in section.splitlines()[2:]]


@pytest.fixture(scope="module")
def rendered() -> str:
    return (RESULTS / "scale_findings.md").read_text()


def test_the_committed_findings_are_what_the_records_render(rendered):
    assert rendered == findings.markdown()
    for name in findings.SECTIONS:  # every section present once, none empty
        assert rendered.count(f"<!-- {name} -->") == 1 and _section(rendered, name).strip()


def _ratio(value: float) -> str:
    return f"{value:.2f}×"


def test_the_gpu_step_ratios_are_the_medians_of_the_rounds(rendered):
    profile = _json("scale_profile_gpu.json")
    batch = max(b["batch"] for b in profile["batches"])
    rounds = next(b for b in profile["batches"] if b["batch"] == batch)["rounds"]
    ours = statistics.median(r["mixcse"]["seconds"] / r["cached_mnrl"]["seconds"] for r in rounds)
    trainer = statistics.median(r["mixcse (trainer)"]["seconds"] / r["cached_mnrl (trainer)"]["seconds"]
                                for r in rounds)
    loop = _section(rendered, "gpu-profile-loop")
    assert f"{_ratio(ours)} CachedMNRL's step" in loop
    assert f"MixCSE takes {_ratio(trainer)} CachedMNRL's step" in loop
    step = statistics.median(r["cached_mnrl"]["seconds"] for r in rounds)
    assert f"CachedMNRL takes {step:.2f} s a step" in loop


def test_the_floor_is_the_split_steps_passes_over_the_uncached_work(rendered):
    profile = _json("scale_profile_gpu.json")
    batch = max(b["batch"] for b in profile["batches"])
    row = next(b for b in profile["batches"] if b["batch"] == batch)
    split = row["split_step"]["mixcse"]["split"]
    floor = split["forward_nograd"] + split["reembed_forward"] + split["reembed_backward"]
    uncached = statistics.median(r["uncached"]["seconds"] for r in row["rounds"])
    section = _section(rendered, "gpu-profile-floor")
    assert f"{floor:.2f} s, {_ratio(floor / uncached)} the uncached work" in section
    ours, theirs = row["split_step"]["mixcse"], row["split_step"]["cached_mnrl"]
    shared = sum(n for site, n in ours["sync_sites"].items() if site in theirs["sync_sites"])
    assert shared == theirs["syncs"]  # CachedMNRL's every synchronisation is one of ours too
    assert f"MixCSE step: {ours['syncs']}; {shared} at the call sites" in section
    assert f"the other {ours['syncs'] - shared} in" in section


def test_the_targets_table_is_the_runs_ratios_and_its_verdicts_follow_them(rendered):
    runs = _json("scale.json")["runs"]
    table = _table(_section(rendered, "targets"))
    header = [c.strip() for c in _section(rendered, "targets").splitlines()[0].strip("|").split("|")]
    column = {name: header.index(name) for name in ("mixcse_two_way", "focal", "adcse", "cached_mnrl", "met by")}
    label = {"mixcse_two_way": "mixcse", "focal": "focal", "adcse": "adcse"}  # the labels the JSON records
    checked = 0
    for row in table:
        target, where = row[0], row[1]
        match = re.fullmatch(r"tiny, ([\d,]+)", where)
        if target.startswith("cached step") and match:
            batch = int(match.group(1).replace(",", ""))
            ref = runs[f"cached_mnrl/cached/b{batch}"]["step_ms"]
            for name, method in label.items():
                value = runs[f"{method}/cached/b{batch}"]["step_ms"] / ref
                cell = row[column[name]]
                assert cell.strip("*") == _ratio(value), (batch, name)
                assert cell.startswith("**") == (value > 1.15), (batch, name)  # bold: missed
            checked += 1
        if target.startswith("2 processes"):
            for name, method in {**label, "cached_mnrl": "cached_mnrl"}.items():
                one, two = runs[f"{method}/cached/b1024"], runs[f"{method}/cached/b1024/p2"]
                assert row[column[name]].strip("*") == _ratio(two["step_ms"] / one["step_ms"]), name
            checked += 1
    assert checked == 4  # batch 1024, 8192, 65536 and the 2-process row
    step_65536 = next(row for row in table if row[0].startswith("cached step") and row[1] == "tiny, 65,536")
    assert step_65536[column["met by"]] == "4 of 5 (missed: mixcse_two_way)"


def test_a_target_met_in_the_records_is_met_in_the_table(tmp_path):
    """The verdicts are computed from the numbers: a record whose step meets the target turns the row to 'all'."""
    for name in SOURCES:
        shutil.copy(RESULTS / name, tmp_path / name)
    data = json.loads((tmp_path / "scale.json").read_text())
    data["runs"]["mixcse/cached/b65536"]["step_ms"] = data["runs"]["cached_mnrl/cached/b65536"]["step_ms"]
    (tmp_path / "scale.json").write_text(json.dumps(data))
    table = _table(_section(findings.markdown(tmp_path), "targets"))
    row = next(r for r in table if r[0].startswith("cached step") and r[1] == "tiny, 65,536")
    assert row[2] == "1.00×" and row[-1] == "all 5"


def test_the_two_way_reference_and_the_fit_are_the_runs(rendered):
    runs = _json("scale.json")["runs"]
    one, both, ours = (runs[f"{m}/cached/b65536"] for m in ("cached_mnrl", "cached_mnrl_two_way", "mixcse"))
    section = _section(rendered, "two-way")
    assert f"{both['step_ms'] / 1000:.1f} s a step, {_ratio(both['step_ms'] / one['step_ms'])} CachedMNRL's" in section
    assert (f"{_ratio(ours['step_ms'] / both['step_ms'])} that reference's step at "
            f"{_ratio(ours['peak_mb'] / both['peak_mb'])} its peak") in section
    # t(N) = a N + b N² through CachedMNRL's 8192 and 65,536 steps, solved with numpy
    import numpy as np

    ns = np.array([8192.0, 65536.0])
    steps = np.array([runs[f"cached_mnrl/cached/b{int(n)}"]["step_ms"] / 1000 for n in ns])
    a, _ = np.linalg.solve(np.stack([ns, ns**2], axis=1), steps)
    assert f"puts {a * 65536:.0f} s of its" in section
    paired = (RESULTS / "scale_paired.md").read_text()
    mixcse_row = next(line for line in paired.splitlines() if line.startswith("| mixcse |"))
    assert mixcse_row.split("|")[4].strip() in section  # the interleaved ratio to the two-way reference


def test_the_rounds_spread_and_the_growth_are_the_runs(rendered):
    runs = _json("scale.json")["runs"]
    ratios = {}
    for key, run in runs.items():
        if key.endswith("/p2") and run["status"] == "ok":
            one = runs[key.removesuffix("/p2")]
            ratios[run["method"]] = [b / a for a, b in zip(one["step_ms_rounds"], run["step_ms_rounds"], strict=True)]
    every = [v for values in ratios.values() for v in values]
    section = _section(rendered, "ddp-rounds")
    assert f"from {_ratio(min(every))} to {_ratio(max(every))}" in section
    assert f"({min(ratios['cached_mnrl']):.2f}–{_ratio(max(ratios['cached_mnrl']))})" in section
    growth = _section(rendered, "growth")
    ref = {b: runs[f"cached_mnrl/cached/b{b}"]["peak_mb"] for b in (64, 8192, 65536)}
    assert f"{ref[8192]:.1f} MB at 8,192 ({_ratio(ref[8192] / ref[64])})" in growth
    assert f"{65536**2 * 4 / 1e9:.1f} GB" in growth


def test_the_cpu_profile_share_is_its_split(rendered):
    row = next(r for r in _json("scale_profile_cpu.json")["summary"] if r["config"] == "cached_mnrl")
    split = row["split_s"]
    glue = split["slice"] + split["rng_capture"] + split["rng_restore"] + split["loss"] + split["other"]
    mini = split["reembed_forward"] + split["reembed_backward"] + split["optimizer"]
    section = _section(rendered, "cpu-profile")
    assert f"take {glue:.2f} s of CachedMNRL's {row['step_s']:.2f} s step" in section
    assert f"the cached step is {_ratio(row['step_s'] / mini)} for CachedMNRL" in section


def test_a_missing_record_is_named_with_its_file_and_key(tmp_path):
    with pytest.raises(ValueError, match="'loss'"):
        findings.markdown_rows("no table here\n", "loss")
    for name in SOURCES:
        shutil.copy(RESULTS / name, tmp_path / name)
    data = json.loads((tmp_path / "scale.json").read_text())
    data["runs"]["cached_mnrl/cached/b65536"]["status"] = "oom"
    (tmp_path / "scale.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"^scale\.json: no finished run cached_mnrl/cached/b65536$"):
        findings.markdown(tmp_path)
    (tmp_path / "scale_tensors.md").write_text("# Live tensors\n")
    with pytest.raises(ValueError, match="scale_tensors.md"):
        findings.Records(tmp_path).tensors_shape()
