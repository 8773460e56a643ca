"""The STS CPU protocol and its two STS-B dev screens written as study specs (``benchmarks/studies/cpu_protocol.json``,
``tuning.json``, ``tuning_queue.json``): their committed records imported as finished trials, nothing left to run,
every committed table (``queue.md`` included) rendered from those trials byte for byte, their rows the configurations
the records ran, the records files' layouts, and what the specs refuse before any model loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("optuna")

REPO = Path(__file__).resolve().parents[2]
STUDIES = REPO / "benchmarks" / "studies"
RESULTS = REPO / "benchmarks" / "results"
#: spec → (its tables, how many records it holds)
SPECS = {"cpu_protocol": (["cpu_protocol.md"], 31), "tuning": (["tuning.md"], 8),
         "tuning_queue": (["tuning_queue.md", "queue.md"], 12)}


def runner(*argv: str) -> int:
    from benchmarks.studies.__main__ import main

    return main(list(argv))


def committed(name: str) -> dict:
    return json.loads((RESULTS / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def imported():
    from benchmarks.studies.render import import_study

    return {name: import_study(STUDIES / f"{name}.json") for name in SPECS}


@pytest.mark.parametrize("name", list(SPECS))
def test_the_spec_with_nothing_left_renders_its_committed_tables_byte_for_byte(imported, name):
    from benchmarks.studies.render import render, study_data
    from st_hardneg.training.studies.engine import progress

    spec, study = imported[name]
    tables, count = SPECS[name]
    state = progress(study, [point.key for point in spec.points()])
    assert state.left == [] and state.failed == {} and len(state.done) == count == len(spec.points())
    rendered = render(STUDIES / f"{name}.json", spec, study)
    assert list(rendered) == [RESULTS / table for table in tables]
    for table in tables:
        assert rendered[RESULTS / table] == (RESULTS / table).read_text()
    # the records file the study's trials make is the committed one, field for field and in its order
    assert study_data(spec, study) == committed(name)


def test_each_record_is_one_finished_trial_whose_value_is_its_dev_score(imported):
    for name, metric in (("cpu_protocol", "stsb_dev_best"), ("tuning", "stsb_dev"), ("tuning_queue", "stsb_dev")):
        spec, study = imported[name]
        data = committed(name)
        trials = study.get_trials()
        assert [t.value for t in trials] == [r[metric] for r in data["runs"]]
        assert all(t.state.name == "COMPLETE" and t.user_attrs["commit"] == "unknown" for t in trials)
        seed = data.get("seed")  # a screen keeps its one seed at the top of its file
        assert [t.params["point"] for t in trials] == [
            f"wiki10k/{r.get('method', r.get('label'))}/{'-' if r.get('seed', seed) is None else r.get('seed', seed)}"
            for r in data["runs"]]


@pytest.mark.parametrize("name", list(SPECS))
def test_the_runner_checks_every_table_and_writes_nothing(name, capsys):
    before = {path: path.read_bytes() for path in RESULTS.glob("*") if path.is_file()}
    assert runner(str(STUDIES / f"{name}.json"), "--check") == 0
    assert capsys.readouterr().out.splitlines() == [f"{table}: identical" for table in SPECS[name][0]]
    assert {path: path.read_bytes() for path in RESULTS.glob("*") if path.is_file()} == before


# --------------------------------------------------------------------------- rows
def test_the_cpu_protocols_rows_are_the_methods_table_and_the_configurations_its_records_ran(imported):
    from benchmarks import methods
    from benchmarks.cpu_protocol import queue_options

    spec, _ = imported["cpu_protocol"]
    table = methods.table(methods.CPU_PROTOCOL, sts=True)
    assert table["mnrl_hardness"] == ("mnrl_hardness", {})  # the registry's in-batch form on STS pairs
    for label, (loss, options) in table.items():
        row = spec.rows[label]
        assert (row.loss, dict(row.options), row.about, row.control) == (loss, options, methods.METHODS[label].about,
                                                                          False)
    assert list(spec.rows) == ["untrained", *methods.CPU_PROTOCOL, "focal_queue", "mnrl_queue"]
    assert spec.rows["untrained"].loss is None
    for run in committed("cpu_protocol")["runs"]:
        row = spec.rows[run["method"]]
        if "loss" not in run:  # the model as given
            assert row.loss is None and run["seed"] is None
            continue
        assert methods.recorded_loss(run) == row.loss, run["method"]
        # the options a row adds to its loss's defaults: none, or the variants' queue
        assert queue_options(run["loss_config"]) == dict(row.options), run["method"]
    assert (spec.choice.metric, spec.choice.baseline) == ("stsb_dev_best", "mnrl")


@pytest.mark.parametrize(("name", "labels"), [("tuning", "SCREEN"), ("tuning_queue", "QUEUE_SCREEN")])
def test_the_screens_rows_are_the_methods_table_and_the_configurations_their_records_ran(imported, name, labels):
    from benchmarks import methods

    spec, _ = imported[name]
    assert list(spec.rows) == list(getattr(methods, labels))
    for label, row in spec.rows.items():
        method = methods.METHODS[label]
        assert (row.loss, dict(row.options), row.about) == (method.loss, dict(method.options), method.about)
    for run in committed(name)["runs"]:
        row = spec.rows[run["label"]]
        assert (methods.recorded_loss(run), run["changed"]) == (row.loss, dict(row.options))
        # a record keeps the line it was written with (the table's last column); a new trial records the row's about
    assert [(p.row, p.seed) for p in spec.points()] == [(label, 1) for label in spec.rows]
    assert spec.datasets["wiki10k"].extra == {"stop_after": 50}


def test_the_queue_screen_has_its_twelve_rows_and_its_own_records_file(imported):
    from benchmarks.studies.render import records_path

    spec, _ = imported["tuning_queue"]
    assert len(spec.rows) == 12  # mnrl / focal x 3 sizes x 2 sources
    assert records_path(STUDIES / "tuning_queue.json", spec).name == "tuning_queue.json"
    assert not set(spec.rows) & set(imported["tuning"][0].rows)


def test_a_variant_is_a_row_in_the_method_syntax():
    """The ``LABEL=LOSS:key=value,...`` syntax of a variant (once ``--variant``) is ``--method``'s: a row's form."""
    from st_hardneg.training.studies.spec import Row, parse_method

    assert parse_method("mix03=mixcse:lam=0.3,partner=random") == ("mix03", Row("mixcse", {"lam": 0.3,
                                                                                          "partner": "random"}))
    assert parse_method("plain=focal") == ("plain", Row("focal"))
    for bad in ("=mixcse", "label=:lam=1"):
        with pytest.raises(ValueError, match="--method expects LABEL=LOSS"):
            parse_method(bad)
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_method("x=mixcse:lam")


# --------------------------------------------------------------------------- the records files
def test_the_screens_files_keep_one_seed_and_step_at_their_top():
    from benchmarks.cpu_protocol import read_screen, screen_file, screen_protocol

    for name in ("tuning", "tuning_queue"):
        data = committed(name)
        records, meta = read_screen(data)
        assert all((r["seed"], r["stop_after"]) == (1, 50) for r in records)
        assert screen_file(records, meta) == data  # the exact inverse
        assert data["protocol"] == screen_protocol(50)
    fresh = screen_file([{"label": "a", "stsb_dev": 1.0, "seed": 0, "stop_after": 2}], {})
    assert fresh == {"runs": [{"label": "a", "stsb_dev": 1.0}], "seed": 0, "stop_after": 2,
                     "protocol": screen_protocol(2)}
    with pytest.raises(ValueError, match="one seed and one step"):  # two screens would mix in one file
        screen_file([{"label": "a", "seed": 0, "stop_after": 2}, {"label": "b", "seed": 1, "stop_after": 2}], {})


def test_the_cpu_protocols_file_keeps_its_protocol_and_the_reference_rows_first():
    from benchmarks.cpu_protocol import PROTOCOL, records_file
    from benchmarks.studies.render import read_records
    from st_hardneg.training.studies.spec import load_spec

    data = committed("cpu_protocol")
    spec = load_spec(STUDIES / "cpu_protocol.json")
    assert records_file(*read_records(spec, data)) == data and data["protocol"] == PROTOCOL == dict(spec.protocol)
    runs = [{"method": "mnrl", "seed": 0}, {"method": "untrained", "seed": None}, {"method": "mnrl", "seed": 1}]
    assert records_file(runs, {}) == {"protocol": PROTOCOL, "runs": [runs[1], runs[0], runs[2]]}


def test_the_screens_references_are_the_full_runs_dev_scores_at_the_screens_step():
    from benchmarks.cpu_protocol import dev_at, reference_scores

    full = {r["method"]: r for r in committed("cpu_protocol")["runs"] if r["seed"] == 1}
    now = reference_scores(RESULTS / "cpu_protocol.json", 1, 50)
    for name in ("tuning", "tuning_queue"):
        references = committed(name)["references"]
        # as they were when the screen ran: the full runs at seed 1 then, each at its dev curve's step 50
        assert references == {label: dev_at(full[label], 50) for label in references}
        assert set(references) < set(now)


def _spec_copy(tmp_path: Path, name: str, **changes) -> Path:
    """The committed spec ``name`` with its records and tables in ``tmp_path / "results"`` and ``changes`` applied."""
    raw = json.loads((STUDIES / f"{name}.json").read_text())
    raw["report"]["records"] = str(tmp_path / "results" / f"{name}.json")
    raw["report"]["outputs"] = [dict(o, file=str(tmp_path / "results" / Path(o["file"]).name))
                                for o in raw["report"]["outputs"]]
    raw.update(changes)
    path = tmp_path / f"{name}.spec.json"
    path.write_text(json.dumps(raw))
    return path


def test_a_screens_table_renders_its_file_as_it_is(tmp_path):
    """The runner renders a screen's stored references; only a run refreshes them from the full runs'."""
    (tmp_path / "results").mkdir()
    out = tmp_path / "results" / "tuning.json"
    out.write_text((RESULTS / "tuning.json").read_text())
    (tmp_path / "results" / "cpu_protocol.json").write_text(json.dumps(
        {"runs": [{"method": "mnrl", "seed": 1, "dev_curve": [[50, 1.0]]}]}))
    assert runner(str(_spec_copy(tmp_path, "tuning")), "-q") == 0
    assert out.read_text() == (RESULTS / "tuning.json").read_text()
    assert (tmp_path / "results" / "tuning.md").read_text() == (RESULTS / "tuning.md").read_text()


def test_a_screen_writes_its_references_from_the_full_runs_beside_it(tmp_path):
    from benchmarks.cpu_protocol import write_screen

    (tmp_path / "cpu_protocol.json").write_text(json.dumps({"runs": [
        {"method": "mnrl", "seed": 0, "dev_curve": [[2, 60.5], [3, 61.0]]},
        {"method": "focal", "seed": 1, "dev_curve": [[2, 70.0]]}, {"method": "mixcse", "seed": 0}]}))
    data = write_screen([{"label": "a", "stsb_dev": 1.0, "seed": 0, "stop_after": 2}], {}, tmp_path / "s.json")
    assert data["references"] == {"mnrl": 60.5} and json.loads((tmp_path / "s.json").read_text()) == data
    (tmp_path / "cpu_protocol.json").unlink()  # no full runs: the references are kept
    kept = write_screen([{"label": "a", "stsb_dev": 1.0, "seed": 0, "stop_after": 2}], {"references": {"x": 2.0}},
                        tmp_path / "s.json")
    assert kept["references"] == {"x": 2.0}


# --------------------------------------------------------------------------- the queue's evidence (queue.md)
def _evidence(tmp_path, cpu_runs, sci_runs):
    screen = {"seed": 1, "stop_after": 50, "references": {"mnrl": 84.0, "focal": 84.5},
              "runs": [{"label": "mnrl_queue512_online", "loss": "mnrl_queue", "stsb_dev": 84.6,
                        "changed": {"queue_size": 512, "queue_warmup_steps": 8}},
                       {"label": "focal_queue64_ema", "loss": "focal", "stsb_dev": 84.25,
                        "changed": {"queue_size": 64, "queue_warmup_steps": 8, "queue_source": "ema"}}]}
    (tmp_path / "results").mkdir(exist_ok=True)
    (tmp_path / "results" / "tuning_queue.json").write_text(json.dumps(screen))
    (tmp_path / "results" / "cpu_protocol.json").write_text(json.dumps({"runs": cpu_runs}))
    (tmp_path / "results" / "archive").mkdir(exist_ok=True)
    (tmp_path / "results" / "archive" / "scifact.json").write_text(json.dumps({"runs": sci_runs}))
    readme = tmp_path / "results" / "README.md"
    readme.write_text("intro\n<!-- queue-table:start -->\nold\n<!-- queue-table:end -->\noutro\n")
    raw = json.loads((STUDIES / "tuning_queue.json").read_text())
    rows = [run["label"] for run in screen["runs"]]
    spec = _spec_copy(tmp_path, "tuning_queue", rows={k: v for k, v in raw["rows"].items() if k in rows},
                      grid=[{"datasets": ["wiki10k"], "rows": rows, "seeds": [1]}])
    raw = json.loads(spec.read_text())
    raw["report"]["outputs"] = [o for o in raw["report"]["outputs"] if o["file"].endswith("queue.md")
                                and not o["file"].endswith("tuning_queue.md")]
    spec.write_text(json.dumps(raw))
    return spec, readme


def test_queue_md_is_rendered_by_the_queue_screens_study_from_the_three_results_files(tmp_path, monkeypatch):
    import statistics

    from benchmarks import cpu_protocol

    mnrl, focal_q = (75.0, 75.4, 75.2), (76.9, 76.6, 76.8)
    cpu = [{"method": "mnrl", "seed": s, "loss_config": {}, "sts": {"avg": v}} for s, v in enumerate(mnrl)]
    cpu += [{"method": "focal", "seed": s, "loss_config": {}, "sts": {"avg": 76.0}} for s in range(3)]
    cpu += [{"method": "focal_queue", "seed": s, "loss_config": {"queue_size": 64, "queue_source": "online"},
             "sts": {"avg": v}} for s, v in enumerate(focal_q)]
    sci = [{"method": m, "seed": s, "test": {"ndcg@10": v}} for m, s, v in (
        ("focal", 0, 65.8), ("focal", 1, 66.0), ("focal_queue", 0, 66.3), ("focal_queue", 1, 65.9),
        ("focal_queue", 2, 70.0), ("cached_mnrl_4x", 0, 65.6))]
    spec, readme = _evidence(tmp_path, cpu, sci)
    before = readme.read_text()
    monkeypatch.setattr(cpu_protocol, "RESULTS", tmp_path / "results")  # the results folder the renderer reads
    assert runner(str(spec), "-q") == 0
    text = (tmp_path / "results" / "queue.md").read_text()
    assert text == cpu_protocol.queue_report(tmp_path / "results")  # the .md is what the JSON files render to
    # the screen: Δ against the loss's own no-queue reference at the same step
    assert "| mnrl_queue512_online | 512 | online | 84.60 | +0.60 |" in text
    assert "| focal_queue64_ema | 64 | ema | 84.25 | -0.25 |" in text
    gap = statistics.mean(focal_q) - statistics.mean(mnrl)
    row = f"| focal_queue | 64 rows, online | {statistics.mean(focal_q):.2f} ± {statistics.stdev(focal_q):.2f} |"
    assert row in text and f"`focal_queue` {gap:+.2f}, met." in text
    # SciFact: only the seeds both focal rows have (0 and 1), so seed 2's 70.0 does not count
    gain = ((66.3 - 65.8) + (65.9 - 66.0)) / 2
    assert f"focal_queue − focal = {gain:+.2f} nDCG@10 over seed(s) 0, 1: met." in text
    assert text.split("\n", 2)[2].startswith("Screen")  # the body under the title starts with the screen
    assert readme.read_text() == before  # a README beside the results is never rewritten


def test_the_queue_report_takes_no_readme(tmp_path, capsys):
    spec, readme = _evidence(tmp_path, [], [])
    readme.write_text("no markers here\n")
    with pytest.raises(SystemExit):  # --readme is gone: argparse refuses it by name
        runner(str(spec), "--readme", str(readme))
    assert "--readme" in capsys.readouterr().err
    assert readme.read_text() == "no markers here\n"  # left as it was


# --------------------------------------------------------------------------- refused before any model loads
def _refused(capsys, spec: Path, *argv: str) -> str:
    with pytest.raises(SystemExit) as stop:
        runner(str(spec), *argv)
    assert stop.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(("name", "change", "message"), [
    ("tuning", {"grid": [{"datasets": ["wiki10k"], "rows": ["no_such_config"], "seeds": [1]}]},
     "the grid names row 'no_such_config', which the study does not define"),
    ("tuning_queue", {"grid": [{"datasets": ["wiki10k"], "rows": ["focal_m0.5"], "seeds": [1]}]},
     "the grid names row 'focal_m0.5'"),  # the hyperparameter screen's labels are not the queue screen's
    ("tuning", {"grid": [{"datasets": ["wiki10k"], "rows": ["focal_m0.5"], "seeds": [1, 2]}]},
     "a screen runs at one seed"),
    ("tuning", {"datasets": {"wiki10k": {"folder": "corpus/wiki10k.txt", "extra": {"stop_after": 20}}}},
     "the spec's protocol is not the one benchmarks.cpu_protocol trains (changed: selection)"),
    ("tuning", {"datasets": {"wiki10k": {"folder": "corpus/none.txt", "extra": {"stop_after": 50}}}},
     "dataset 'wiki10k': no corpus at"),
    ("cpu_protocol", {"datasets": {"wiki10k": {"folder": "corpus/wiki10k.txt", "extra": {"eval_steps": 50}}},
                      "protocol": {"batch_size": 32}}, "changed: "),
])
def test_a_spec_the_trials_cannot_run_is_refused_in_one_line_before_any_trial(tmp_path, capsys, name, change,
                                                                              message):
    spec = _spec_copy(tmp_path, name, **change)  # no records there: every trial is left
    assert message in _refused(capsys, spec, "--run", "--work-dir", str(tmp_path / "work"))
    assert not (tmp_path / "results").exists()
    assert not (tmp_path / "work").exists() or sorted(p.name for p in (tmp_path / "work").iterdir()) == ["study.db"]


def test_a_screen_at_another_seed_is_refused_against_its_records(tmp_path, capsys):
    """Records made at one seed and a spec at another would mix two screens in one file: the import refuses."""
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "tuning.json").write_text((RESULTS / "tuning.json").read_text())
    raw = json.loads((STUDIES / "tuning.json").read_text())
    spec = _spec_copy(tmp_path, "tuning", grid=[dict(raw["grid"][0], seeds=[2])])
    assert "wiki10k/focal_m0.5/1, which is not a point of the study's grid" in _refused(capsys, spec, "--check")
