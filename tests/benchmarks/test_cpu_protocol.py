"""benchmarks.cpu_protocol's renderers: the committed tables, the rows' names, the figure, the queue's evidence
against numbers computed here. Its studies (the specs, their trials on a tiny model through the one runner) are
tests/studies/test_sts_specs.py and test_sts_runs.py."""

from __future__ import annotations

import importlib
import json
import statistics
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def _load():
    return importlib.import_module("benchmarks.cpu_protocol")


@pytest.mark.parametrize(("name", "render"), [("cpu_protocol", "markdown"), ("tuning", "screen_markdown"),
                                             ("tuning_queue", "screen_markdown")])
def test_reports_regenerate_byte_identical_from_the_committed_json(name, render):
    """The report code (one markdown-table helper for all) renders the committed results exactly as committed."""
    module = _load()
    data = json.loads((RESULTS / f"{name}.json").read_text())
    assert getattr(module, render)(data) == (RESULTS / f"{name}.md").read_text()


def test_committed_queue_report_is_rendered_from_the_committed_results():
    assert _load().queue_report(RESULTS) == (RESULTS / "queue.md").read_text()


def _run(method, seed, avg):
    tasks = ("STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness")
    return {"method": method, "seed": seed, "sts": {**dict.fromkeys(tasks, avg), "avg": avg}, "stsb_dev_best": avg}


def test_cpu_protocol_compares_with_both_baselines_when_present():
    cpu = _load()
    runs = [_run("mnrl", 0, 70.0), _run("mnrl", 1, 72.0), _run("mixcse", 0, 73.5), _run("mixcse", 1, 74.5)]
    table = cpu.markdown({"runs": runs}).splitlines()
    assert "Δavg vs mnrl_symmetric" not in table[0] and table[0].count("Δavg vs mnrl") == 1
    with_sym = cpu.markdown({"runs": [*runs, _run("mnrl_symmetric", 0, 73.0), _run("mnrl_symmetric", 1, 73.4)]})
    lines = with_sym.splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[10:12] == ["Δavg vs mnrl", "Δavg vs mnrl_symmetric"]
    rows = {cells[0]: cells for cells in ([c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:])}
    # mixcse mean 74.0; mnrl mean 71.0; mnrl_symmetric mean 73.2
    assert rows["mixcse"][10:12] == ["+3.00", "+0.80"]
    assert rows["mnrl"][10:12] == ["–", "-2.20"]
    assert rows["mnrl_symmetric"][10:12] == ["+2.20", "–"]
    assert lines[1] == "|" + "---|" * len(header)


# --------------------------------------------------------------------------- row names and the figure
#: the name each committed label is shown under: today's registry name of what it trained, and its options
SHOWN = {"untrained": "untrained", "mnrl": "mnrl", "mixcse": "mixcse_two_way", "focal": "focal",
         "hncse_pm": "hncse_pm", "hncse_hnm": "hncse_hnm", "adcse": "adcse", "mnrl_hardness": "mnrl_hardness",
         "mnrl_symmetric": "mnrl_symmetric", "focal_queue": "focal:queue_size=512,queue_warmup_steps=8",
         "mnrl_queue": "mnrl_queue:queue_size=512,queue_warmup_steps=8"}
#: st-hardneg 0.1's records name a loss's directions ``symmetric``: its value → today's keys of the same form
SYMMETRIC_0_1 = {True: {"directions": ["query_to_doc", "doc_to_query"], "partition_mode": "per_direction"},
                 False: {"directions": ["query_to_doc"]}}


#: 0.2's ``mnrl_queue`` was ``AdversarialNegativesLoss`` at these values, where it is the base InfoNCE that
#: ``mnrl_queue`` builds today (the same losses and gradients: tests/training/test_registry.py); its records also hold
#: AdCSE's own options, which then do nothing and which the base loss does not have
ADCSE_AS_BASE = {"num_adversaries": 0, "untied": False}


def test_every_row_is_shown_under_the_registry_name_that_builds_its_recorded_configuration(tiny_model):
    """Each committed row's shown name, read as a row (``loss:key=value,...``), builds today a loss whose
    configuration equals every key the row's runs recorded (0.1's ``symmetric`` read as today's directions)."""
    from st_hardneg import AdversarialNegativesLoss, HardNegativeLoss
    from st_hardneg.training import build_loss
    from st_hardneg.training.studies.spec import parse_method

    cpu = _load()
    data = json.loads((RESULTS / "cpu_protocol.json").read_text())
    assert cpu.row_labels(data) == SHOWN
    adcse_only = set(AdversarialNegativesLoss(tiny_model, **ADCSE_AS_BASE).get_config_dict()) - set(
        HardNegativeLoss(tiny_model).get_config_dict())
    for run in data["runs"]:
        if "loss" not in run:
            continue
        _, row = parse_method(f"x={SHOWN[run['method']]}")  # the variant's form: a spec row's
        loss, options = str(row.loss), dict(row.options)
        built = json.loads(json.dumps(build_loss(loss, tiny_model, **options).get_config_dict()))
        recorded = dict(run["loss_config"])
        if "symmetric" in recorded and "symmetric" not in built:
            recorded.update(SYMMETRIC_0_1[recorded.pop("symmetric")])
        if loss == "mnrl_queue":  # recorded as AdCSE's reduction; today the base loss, equal to it (1e-6)
            assert {k: recorded.get(k) for k in ADCSE_AS_BASE} == ADCSE_AS_BASE, (run["method"], run["seed"])
            recorded = {k: v for k, v in recorded.items() if k not in adcse_only}
        assert {k: built.get(k, "absent") for k in recorded} == recorded, (run["method"], run["seed"])
    # the screens' loss column: the same names (0.1's two-direction "mixcse", its "hncse" of mode both)
    screen = cpu.screen_markdown(json.loads((RESULTS / "tuning.json").read_text()))
    assert "| mixcse_lam0.4 | mixcse_two_way | lam=0.4 |" in screen and "| hncse_both+focal | hncse_both |" in screen
    # one label, two configurations: no single name
    runs = [{"method": "x", "loss": "mixcse", "loss_config": {"directions": d}}
            for d in (["query_to_doc"], ["query_to_doc", "doc_to_query"])]
    with pytest.raises(ValueError, match="trained"):
        cpu.row_label("x", runs)
    assert cpu.row_label("q", [{"loss": "focal", "loss_config": {"queue_size": 64, "queue_source": "ema",
                                                                  "queue_warmup_steps": 0}}]) \
        == "focal:queue_size=64,queue_source=ema"


def _drawn(monkeypatch):
    from st_hardneg import plots

    drawn = {}
    real_save = plots._save

    def keep(fig, path, dpi):
        drawn["fig"] = fig
        return real_save(fig, path, dpi)

    monkeypatch.setattr(plots, "_save", keep)
    return drawn


def test_the_figure_draws_every_run_and_each_paired_difference_to_mnrl(tmp_path, monkeypatch):
    """cpu_protocol.png from the committed JSON: above, a bar per row and a dot per run on an axis that says it does
    not start at 0; below, a dot per seed of each row minus mnrl at that seed and the mean with its 95 % t interval
    (computed here), on an axis that holds 0; the ticks are the table's names; the same bytes twice."""
    from matplotlib.collections import PathCollection
    from matplotlib.container import ErrorbarContainer

    from benchmarks.harness import NOT_FROM_ZERO

    cpu = _load()
    data = json.loads((RESULTS / "cpu_protocol.json").read_text())
    drawn = _drawn(monkeypatch)
    cpu.plot(data, tmp_path / "a.png")
    top, bottom = drawn["fig"].axes
    rows = list(SHOWN.values())
    assert len(top.patches) == len(rows)
    assert [t.get_text() for t in bottom.get_xticklabels()] == rows
    top_dots = [y for c in top.collections if isinstance(c, PathCollection) for _, y in c.get_offsets()]
    assert sorted(top_dots) == sorted(r["sts"]["avg"] for r in data["runs"])
    assert top.get_ylim()[0] > 0 and NOT_FROM_ZERO in top.get_ylabel()
    low, high = bottom.get_ylim()
    assert low < 0 < high and "holds 0" in bottom.get_ylabel()
    mnrl = {r["seed"]: r["sts"]["avg"] for r in data["runs"] if r["method"] == "mnrl"}
    expected = {}
    for method in SHOWN:
        seeds = {r["seed"]: r["sts"]["avg"] for r in data["runs"] if r["method"] == method}
        diffs = [seeds[s] - mnrl[s] for s in sorted(seeds) if s in mnrl]
        if diffs:
            expected[method] = diffs
    dots = [y for c in bottom.collections if isinstance(c, PathCollection) for _, y in c.get_offsets()]
    assert len(dots) == sum(len(d) for d in expected.values()) == 3 * (len(rows) - 1)  # untrained has no seed
    assert sorted(dots) == pytest.approx(sorted(v for d in expected.values() for v in d))
    t_975_2 = 4.302652729911275  # Student's t, 97.5 %, 2 degrees of freedom
    bars = [c for c in bottom.containers if isinstance(c, ErrorbarContainer)]
    means = [float(c.lines[0].get_ydata()[0]) for c in bars]
    halves = [seg[1][1] - seg[0][1] for c in bars for seg in c.lines[2][0].get_segments()]
    assert means == pytest.approx([statistics.mean(d) for d in expected.values()])
    assert halves == pytest.approx([2 * t_975_2 * statistics.stdev(d) / 3 ** 0.5 for d in expected.values()])
    assert [t.get_text() for t in bottom.get_legend().get_texts()] == [
        "each seed", "0 = mnrl at the same seed", "mean, 95% t interval"]
    assert [t.get_text() for t in top.get_legend().get_texts()] == ["mnrl mean (75.77)"]
    cpu.plot(data, tmp_path / "b.png")
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()
    assert b"Matplotlib" not in (tmp_path / "a.png").read_bytes()  # no version stamp
    cpu.plot({"runs": [r for r in data["runs"] if r["method"] != "mnrl"]}, tmp_path / "c.png")
    assert len(drawn["fig"].axes) == 1  # no baseline yet: the scores alone


def test_paired_differences_and_their_interval():
    from benchmarks import harness

    assert harness.paired_differences({None: 1.0, 2: 5.0, 0: 3.0, 1: 4.0}, {0: 1.0, 2: 2.0, None: 0.0}) == \
        {0: 2.0, 2: 3.0}  # seeds both have, in order; an untrained model's None pairs with nothing
    mean, half = harness.mean_interval([1.0, 2.0, 4.0])
    # mean 7/3; sample std sqrt(((−4/3)² + (−1/3)² + (5/3)²) / 2) = sqrt(7/3); t(0.975, 2) = 4.302652729911275
    assert mean == pytest.approx(7 / 3) and half == pytest.approx(4.302652729911275 * (7 / 3) ** 0.5 / 3 ** 0.5)
    assert harness.mean_interval([2.5]) == (2.5, None)
    with pytest.raises(ValueError, match="no values"):
        harness.mean_interval([])
    with pytest.raises(ValueError, match="baseline 'b'"):
        harness.plot_seed_comparison({"a": {0: 1.0}}, "x.png", baseline="b", ylabel="y", title="t")


# --------------------------------------------------------------------------- the queue's evidence (queue.md)
def _cpu(method, seed, avg, queue=None):
    config = {"queue_size": queue[0], "queue_source": queue[1]} if queue else {}
    return {"method": method, "seed": seed, "loss_config": config, "sts": {"avg": avg}}


def _sci(method, seed, ndcg):
    return {"method": method, "seed": seed, "test": {"ndcg@10": ndcg}}


def _write(tmp_path, cpu_runs, sci_runs):
    screen = {"seed": 1, "stop_after": 50, "references": {"mnrl": 84.0, "focal": 84.5},
              "runs": [{"label": "mnrl_queue512_online", "loss": "mnrl_queue", "stsb_dev": 84.6,
                        "changed": {"queue_size": 512, "queue_warmup_steps": 8}},
                       {"label": "focal_queue64_ema", "loss": "focal", "stsb_dev": 84.25,
                        "changed": {"queue_size": 64, "queue_warmup_steps": 8, "queue_source": "ema"}}]}
    (tmp_path / "tuning_queue.json").write_text(json.dumps(screen))
    (tmp_path / "cpu_protocol.json").write_text(json.dumps({"runs": cpu_runs}))
    (tmp_path / "archive").mkdir(exist_ok=True)
    (tmp_path / "archive" / "scifact.json").write_text(json.dumps({"runs": sci_runs}))
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- queue-table:start -->\nold\n<!-- queue-table:end -->\noutro\n")
    return readme


def test_queue_targets_not_met_and_missing_rows(tmp_path):
    bench = _load()
    cpu = [_cpu("mnrl", s, 75.0) for s in range(3)] + [_cpu("mnrl_queue", s, 76.0, (512, "online")) for s in range(3)]
    sci = [_sci("focal", 0, 66.0), _sci("focal_queue", 0, 65.5)]
    _write(tmp_path, cpu, sci)
    text = bench.queue_report(tmp_path)
    assert "`mnrl_queue` +1.00, not met." in text and "over seed(s) 0: not met." in text
    _write(tmp_path, cpu[:3] + cpu[3:5], [_sci("focal", 0, 66.0)])  # 2 seeds only; no focal_queue
    text = bench.queue_report(tmp_path)
    assert "no queued row has 3 seeds yet" in text and "no seed has both focal and focal_queue yet" in text


def test_missing_results_files_give_an_empty_queue_report(tmp_path):
    assert _load().queue_report(tmp_path) == "# The queue\n"
