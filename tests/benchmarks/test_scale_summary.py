"""benchmarks.scale.summary: the README's and the docs' scaling figures come from the committed records, every GPU row
names its placement, and the figures say what they draw (titles, legends, where an axis starts)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from benchmarks.scale import report, summary

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"


def _json(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _readme_table() -> dict[str, list[str]]:
    text = (REPO / "README.md").read_text()
    block = text.split("**Scaling**", 1)[1].split("## Data", 1)[0]
    rows = [line for line in block.splitlines() if line.startswith("| ") and not line.startswith("| loss")]
    return {cells[0]: cells[1:] for cells in ([c.strip() for c in row.strip("|").split("|")] for row in rows)}


def test_the_readmes_scaling_numbers_are_the_records(tmp_path):
    table = _readme_table()
    gpu = _json("scale_gpu.json")
    latest = max(r["call"] for r in gpu["rows"])
    ref = next(r for r in gpu["rows"] if r["call"] == latest and r["method"] == "cached_mnrl"
               and r["batch_size"] == 32768)
    for r in gpu["rows"]:
        if r["call"] == latest and r["batch_size"] == 32768 and r["method"] not in ("cached_mnrl", "mnrl"):
            name = "mixcse_two_way" if r["method"] == "mixcse" else r["method"]
            expected = f"{r['step_ms'] / ref['step_ms']:.2f}× / {r['peak_mb'] / ref['peak_mb']:.2f}×"
            assert table[name][0] == expected, name
    profile = {row["config"]: row for row in _json("scale_profile_gpu.json")["summary"] if row["batch"] == 32768}
    trainer, reference = profile["mixcse (trainer)"], profile["cached_mnrl (trainer)"]
    assert table["mixcse"][1] == (f"{trainer['step_s'] / reference['step_s']:.2f}× / "
                                  f"{trainer['peak_mb'] / reference['peak_mb']:.2f}×")
    assert table["focal"][1] == "–"  # not measured
    cpu = _json("scale.json")["runs"]
    cpu_ref = cpu["cached_mnrl/cached/b65536"]
    for label, name in (("focal", "focal"), ("mixcse", "mixcse_two_way"), ("adcse", "adcse")):
        run = cpu[f"{label}/cached/b65536"]
        assert table[name][2] == (f"{run['step_ms'] / cpu_ref['step_ms']:.2f}× / "
                                  f"{run['peak_mb'] / cpu_ref['peak_mb']:.2f}×"), name
    readme = (REPO / "README.md").read_text()
    assert summary.table() in readme and summary.placement_sentence() in readme
    steps = [r["step_ms"] / ref["step_ms"] for r in gpu["rows"] if r["call"] == latest and r["batch_size"] == 32768
             and r["method"] not in ("cached_mnrl", "mnrl")]
    losses = [row["to_cached_mnrl"] for row in _json("scale_profile_gpu_losses.json")["summary"]
              if row["batch"] == 32768 and row["config"] not in ("uncached", "cached_mnrl")]
    low, high = min(steps + losses + [profile["mixcse"]["to_cached_mnrl"]]), max(steps + losses)
    assert f"take {low:.2f}–{high:.2f}× its step" in summary.placement_sentence()


def test_the_committed_summary_and_figure_are_rendered_from_the_records(tmp_path):
    assert (RESULTS / "scale_summary.md").read_text() == summary.markdown()
    for name in ("scale_gpu.json", "scale_profile_gpu.json", "scale_profile_gpu_losses.json", "scale.json",
                 "scale_minilm.json", "scale_profile_cpu.json", "scale_paired.md", "scale_tensors.md"):
        shutil.copy(RESULTS / name, tmp_path / name)
    written = summary.write(tmp_path)
    assert [p.name for p in written] == ["scale_summary.md", "scale_gpu.png", "scale_findings.md"]
    assert written[0].read_text() == summary.markdown() and written[1].stat().st_size > 10_000
    assert written[2].read_text() == (RESULTS / "scale_findings.md").read_text()


def test_every_gpu_row_names_its_placement():
    for row in summary.gpu_rows():
        assert row["placement"] in summary.PLACEMENTS
    gpu_table = (RESULTS / "scale_gpu.md").read_text().split("| batch |", 1)[1]
    rows = [line for line in gpu_table.splitlines()[2:] if line.startswith("| ")]
    assert rows and all(line.split("|")[4].strip() == "custom loop" for line in rows)
    for name in ("scale_profile_gpu.md", "scale_profile_gpu_losses.md"):
        table = (RESULTS / name).read_text().split("| batch | configuration |", 1)[1].split("\n\n", 1)[0]
        for line in table.splitlines()[2:]:
            config, placement = (cell.strip() for cell in line.split("|")[2:4])
            assert placement == ("Trainer" if config.endswith("(trainer)") else "custom loop"), line


class _Captured(Exception):
    pass


@pytest.fixture
def drawn(monkeypatch):
    """The figure a plot function would save, kept for inspection instead of being written."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    figures = []

    def keep(self, *args, **kwargs):
        figures.append(self)

    monkeypatch.setattr(Figure, "savefig", keep)
    return figures


def _check_axes(fig):
    for ax in fig.axes:
        drawn_labels = {line.get_label() for line in ax.get_lines()} | {c.get_label() for c in ax.containers}
        legend = ax.get_legend()
        if legend is not None:
            assert {t.get_text() for t in legend.get_texts()} <= drawn_labels  # nothing named that is not drawn
        low = ax.get_ylim()[0]
        if ax.get_yscale() == "linear" and low != 0:
            assert "does not start at 0" in ax.get_ylabel(), ax.get_title()
        if ax.get_yscale() == "log":
            assert "log scale" in ax.get_ylabel()


@pytest.mark.parametrize("name", ["scale.json", "scale_minilm.json"])
def test_the_cpu_figures_say_what_they_draw(drawn, tmp_path, name):
    data = _json(name)
    report.plot(data, tmp_path / "x.png")
    [fig] = drawn
    _check_axes(fig)
    memory, peaks, steps = fig.axes
    methods = {r["method"] for r in report.summarize(data)["rows"]}
    names = report.loss_names(data)
    # every method with a cached row is drawn in (a), its name today's
    cached = {names.get(m, m) for m in methods
              if any(r["cached_peak_mb"] for r in report.summarize(data)["rows"] if r["method"] == m)}
    assert cached <= {line.get_label() for line in memory.get_lines()}
    # the paired ratios: each loss's cached peak over CachedMNRL's at that batch, with CachedMNRL at 1
    ratios = {(p["method"], p["batch_size"]): p["ratio"] for p in report.summarize(data)["peaks"]}
    for line in peaks.get_lines():
        if line.get_label().startswith("cached_mnrl"):
            assert set(line.get_ydata()) == {1.0}
            continue
        method = next(m for m in methods if names.get(m, m) == line.get_label())
        assert list(line.get_ydata()) == pytest.approx([ratios[method, int(b)] for b in line.get_xdata()])
    if any(r["uncached_peak_mb"] for r in report.summarize(data)["rows"]):
        assert memory.get_yscale() == "log" and "dashed uncached" in memory.get_title()
    else:
        assert "uncached" not in memory.get_title()
    assert "mixcse" not in {line.get_label() for ax in fig.axes for line in ax.get_lines()}  # today's name


def test_the_gpu_figure_draws_the_latest_calls_ratios_from_zero(drawn, tmp_path):
    summary.plot_gpu(tmp_path / "x.png")
    [fig] = drawn
    _check_axes(fig)
    rows = {r["loss"]: r for r in summary.gpu_rows() if r["source"].startswith("scale_gpu.json")}
    for ax, key in zip(fig.axes, ("step", "peak"), strict=True):
        assert ax.get_ylim()[0] == 0
        [bars] = ax.containers
        names = [t.get_text() for t in ax.get_xticklabels()]
        assert [bar.get_height() for bar in bars] == pytest.approx([rows[name][key] for name in names])
    assert re.search(r"call \d+", fig._suptitle.get_text())
