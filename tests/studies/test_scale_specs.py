"""The scale benchmarks written as study specs (``benchmarks/studies/scale*.json``): their committed records imported
as finished trials, nothing left to run, every committed table rendered from them byte for byte and the records file
laid out again exactly as committed; the specs' rows, datasets and points are the configurations the records ran;
and a CPU ``--run`` of the worker study and of the profile study, checked against numbers computed here."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from tests.conftest import SHARED_DATA

pytest.importorskip("optuna")

REPO = Path(__file__).resolve().parents[2]
STUDIES = REPO / "benchmarks" / "studies"
RESULTS = REPO / "benchmarks" / "results"
CORPUS = SHARED_DATA / "corpus" / "wiki10k.txt"
#: spec -> (the records' read/layout module, the tables it renders)
SPECS = {
    "scale": ("benchmarks.scale", ["scale.md"]),
    "scale_minilm": ("benchmarks.scale", ["scale_minilm.md"]),
    "scale_profile_cpu": ("benchmarks.scale.profile", ["scale_profile_cpu.md"]),
    "scale_profile_gpu": ("benchmarks.scale.profile", ["scale_profile_gpu.md"]),
    "scale_profile_gpu_losses": ("benchmarks.scale.profile", ["scale_profile_gpu_losses.md"]),
    "scale_gpu": ("benchmarks.scale_gpu", ["scale_gpu.md"]),
}


def runner(*argv):
    from benchmarks.studies.__main__ import main

    return main([str(a) for a in argv])


@pytest.mark.parametrize("name", list(SPECS))
def test_the_committed_records_are_the_finished_study_and_render_its_tables_byte_for_byte(name):
    from importlib import import_module

    from benchmarks.studies.render import import_study, render
    from st_hardneg.training.studies.engine import progress

    module, tables = SPECS[name]
    spec, study = import_study(STUDIES / f"{name}.json")
    assert spec.choice.metric is None and spec.about
    text = (RESULTS / f"{name}.json").read_text()
    records, meta = import_module(module).read(json.loads(text))
    state = progress(study, [point.key for point in spec.points()])
    assert state.left == [] and state.failed == {} and len(state.done) == len(records) == len(spec.points())
    assert [t.user_attrs["record"] for t in study.get_trials()] == records  # in order, every field as committed
    assert all(t.value == 0.0 for t in study.get_trials())  # a timing study: no dev value to choose by
    rendered = render(STUDIES / f"{name}.json", spec, study)
    assert {path.name for path in rendered} == set(tables)
    for path, table in rendered.items():
        assert table == path.read_text()
    # the layout is read's exact inverse: the records file, indented as committed
    laid = import_module(module).layout(records, meta)
    assert json.dumps(laid, indent=int(spec.report["indent"]), ensure_ascii=False) + "\n" == text


def test_the_check_command_finds_every_table_identical(capsys):
    assert runner(STUDIES / "scale_gpu.json", "--check") == 0
    assert runner(STUDIES / "scale_minilm.json", "--check") == 0
    assert capsys.readouterr().out.splitlines()[-2:] == ["scale_gpu.md: identical", "scale_minilm.md: identical"]


@pytest.mark.parametrize("name", ["scale", "scale_minilm"])
def test_the_worker_specs_rows_are_the_configurations_the_records_ran(name):
    from benchmarks.methods import benchmark_loss
    from benchmarks.scale import REFERENCES, read
    from st_hardneg.training.studies.spec import load_spec

    spec = load_spec(STUDIES / f"{name}.json")
    data = json.loads((RESULTS / f"{name}.json").read_text())
    assert dict(spec.protocol) == data["_meta"]["settings"]
    records, _ = read(data)
    assert {p.key for p in spec.points()} == {f"{r['dataset']}/{r['row']}/{r['seed']}" for r in records}
    for record in records:
        row = spec.rows[record["row"]]
        assert dict(row.extra) == {"method": record["method"], "variant": record["variant"],
                                   "processes": record["processes"]}
        assert row.loss == ("cached_mnrl" if record["method"] in REFERENCES else benchmark_loss(record))
        assert spec.datasets[record["dataset"]].extra["batch_size"] == record["batch_size"]
    two_way = [row for row in spec.rows.values() if row.extra["method"] == "cached_mnrl_two_way"]
    assert [dict(row.options) for row in two_way] == ([{"directions": ["query_to_doc", "doc_to_query"],
                                                        "partition_mode": "per_direction"}] if name == "scale" else [])


@pytest.mark.parametrize("name", ["scale_profile_cpu", "scale_profile_gpu", "scale_profile_gpu_losses"])
def test_the_profile_specs_are_the_batches_and_configurations_the_records_ran(name):
    from st_hardneg.training.studies.spec import load_spec

    spec = load_spec(STUDIES / f"{name}.json")
    data = json.loads((RESULTS / f"{name}.json").read_text())
    assert spec.protocol["device"] == data["device"] and spec.protocol["mini_batch_size"] == data["mini_batch_size"]
    assert spec.protocol["out_name"] == data["out_name"] == f"{name}.json"
    (group,) = spec.rows.values()
    assert list(group.extra["modes"]) == data["modes"]
    for batch in data["batches"]:
        dataset = spec.datasets[f"b{batch['batch']}"].extra
        assert dataset["batch_size"] == batch["batch"] and dataset["trace"] == bool(batch.get("profiled"))
        names = list(batch["rounds"][0])
        expected = ["uncached", *[f"{loss}{'' if mode == 'loop' else f' ({mode})'}" for mode in data["modes"]
                                  for loss in group.extra["losses"]]]
        assert names == expected


def test_the_gpu_specs_calls_are_the_calls_the_records_ran():
    from st_hardneg.training.studies.spec import load_spec

    spec = load_spec(STUDIES / "scale_gpu.json")
    data = json.loads((RESULTS / "scale_gpu.json").read_text())
    assert spec.protocol["model_name"] == data["model"] and spec.protocol["mini_batch_size"] == data["mini_batch_size"]
    for name, dataset in spec.datasets.items():
        rows = [r for r in data["rows"] if r.get("call", 1) == dataset.extra["call"]]
        asked = dataset.extra.get("methods") or spec.rows["every_method"].extra["methods"]
        assert rows and {r["method"] for r in rows} <= set(asked), name
        assert {(r["batch_size"], r["variant"]) for r in rows} <= {tuple(g) for g in dataset.extra["grid"]}, name
        assert {len(r["step_seconds"]) for r in rows} == {dataset.extra["steps"]}, name


def _trained_parameters() -> int:
    """The parameters of the tiny model (as the worker loads it) that get a gradient: all but BERT's pooler."""
    import tempfile

    from st_hardneg.models import load_model
    from st_hardneg.testing import make_tiny_model_dir

    with tempfile.TemporaryDirectory() as tmp:
        model = load_model(make_tiny_model_dir(Path(tmp) / "tiny", seed=0), pooling="cls", max_seq_length=32,
                           device="cpu")
    return sum(p.numel() for n, p in model.named_parameters() if ".pooler." not in n)


def test_a_run_of_the_worker_study_measures_one_configuration_in_subprocesses(tmp_path, shared_data):
    from benchmarks import scale

    protocol = {"model": "tiny", "max_seq_length": 32, "steps": 3, "threads": 1, "seed": 0, "corpus": str(CORPUS),
                "mini_batch_size": 4}
    report = {"records": "s.json", "read": "benchmarks.scale:read", "layout": "benchmarks.scale:layout",
              "point": {"dataset": "dataset", "row": "row", "seed": "seed"}, "prepare": "benchmarks.scale:prepare",
              "outputs": [{"file": "s.md", "renderer": "benchmarks.scale.report:markdown"}]}
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(scale.spec_dict("s", protocol, scale.plan(["cached_mnrl"], [8], [], [], []), report)))
    assert runner(spec, "--run", "--work-dir", tmp_path / "work", "-q") == 0
    data = json.loads((tmp_path / "s.json").read_text())
    assert list(data) == ["runs", "_meta"] and list(data["runs"]) == ["cached_mnrl/cached/b8"]
    run = data["runs"]["cached_mnrl/cached/b8"]
    assert run["status"] == "ok" and run["loss_class"] == "CachedMultipleNegativesRankingLoss"
    assert {"dataset", "row", "seed", "meta"}.isdisjoint(run)  # the point stays in the study, not in the file
    # the median of the steps after the warm-up, from the timed run's own step times
    assert len(run["step_seconds"]) == 3 and run["steps"] == 3
    assert run["step_ms"] == pytest.approx(1000 * statistics.median(run["step_seconds"][1:]), abs=0.06)
    assert run["step_ms_rounds"] == [run["step_ms"]]
    # gradients and AdamW's two moments of every trained parameter, float32
    assert run["state_mb"] == pytest.approx(3 * 4 * _trained_parameters() / 2**20, abs=0.06)
    # the peak is the memory run's (threshold fixed), the default allocator's mark the timed run's
    assert "mmap threshold fixed at 131072 bytes, a separate run of 2 steps" in run["memory_method"]
    assert run["peak_mb_per_rank"] == [run["peak_mb"]] and run["default_malloc_peak_mb_per_rank"] == [
        run["default_malloc_peak_mb"]]
    assert run["world_size"] == 1 and run["per_process_batch_size"] == 8 and run["torch_threads"] == 1
    assert data["_meta"]["settings"] == protocol  # the spec's protocol: the next import checks it
    assert data["_meta"]["mini_batch_size"] == 4 and data["_meta"]["torch_threads"] == 1
    kept = json.loads((tmp_path / "work" / "scale_runs" / "cached_mnrl_cached_b8.json").read_text())
    assert kept == run  # what the next trials estimate from
    table = (tmp_path / "s.md").read_text()
    assert (f"| cached_mnrl | 8 | – | – | {run['step_ms']:.0f} | {run['peak_mb']:.0f} | "
            f"{run['default_malloc_peak_mb']:.0f} | 1.00× |") in table
    assert table == scale.markdown(data)


def test_a_run_of_the_profile_study_times_its_configurations_round_robin_one_process_a_batch(tmp_path):
    from benchmarks.scale import profile
    from benchmarks.scale_gpu import TINY

    spec = {"name": "p", "protocol": {"device": "cpu", "model": "tiny", "mini_batch_size": 4, "uncached_chunk": None,
                                      "autocast": None, "threads": 1, "rounds": 2, "trace_min_us": 20.0,
                                      "warmup": True, "profile_in_last_round": False, "out_name": "p.json"},
            "rows": {"round_robin": {"loss": None, "extra": {"losses": ["cached_mnrl"], "modes": ["loop"]}}},
            "datasets": {"b8": {"extra": {"batch_size": 8, "trace": False}},
                         "b12": {"extra": {"batch_size": 12, "trace": False}}},
            "grid": [{"datasets": ["b8", "b12"], "rows": ["round_robin"], "seeds": [0]}],
            "choice": {"metric": None}, "trial": "benchmarks.scale.profile:trial",
            "report": {"records": "p.json", "read": "benchmarks.scale.profile:read",
                       "layout": "benchmarks.scale.profile:layout", "indent": 1,
                       "point": {"dataset": "dataset", "row": "row", "seed": "seed"},
                       "prepare": "benchmarks.scale.profile:prepare",
                       "outputs": [{"file": "p.md", "renderer": "benchmarks.scale.profile:markdown"}]}}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert runner(tmp_path / "spec.json", "--run", "--work-dir", tmp_path / "work", "-q") == 0
    result = json.loads((tmp_path / "p.json").read_text())
    assert sorted(b["batch"] for b in result["batches"]) == [8, 12]
    assert result["processes"] == 2 and len(result["load"]) == 4 and result["rounds"] == 2  # a process a batch
    assert result["precision"] == "float32" and result["uncached_reference"].endswith("on the whole batch")
    rows = {(r["batch"], r["config"]): r for r in result["summary"]}
    for batch in result["batches"]:
        size, rounds = batch["batch"], batch["rounds"]
        assert [list(r) for r in rounds] == [["uncached", "cached_mnrl"]] * 2 and "split_step" not in batch
        # the ratio is the median of the per-round ratios of the two steps timed side by side
        ratios = [r["cached_mnrl"]["seconds"] / r["uncached"]["seconds"] for r in rounds]
        row = rows[size, "cached_mnrl"]
        assert row["to_uncached"] == round(statistics.median(ratios), 3)
        assert row["to_uncached_range"] == [round(min(ratios), 3), round(max(ratios), 3)]
        assert row["step_s"] == round(statistics.median([r["cached_mnrl"]["seconds"] for r in rounds]), 3)
        # the phases of a CPU step and the rest add up to its time
        for step in (r[name] for r in rounds for name in r):
            assert sum(step["split"].values()) == pytest.approx(step["seconds"], abs=1e-3)
        # the useful FLOPs written out: 3 forwards of 2B sequences and the B x B similarity (3 x 2 B^2 d)
        layers, d, d_ff, length = TINY["num_hidden_layers"], TINY["hidden_size"], TINY["intermediate_size"], \
            batch["seq_len"]
        forward = 2 * size * layers * (length * (8 * d * d + 4 * d * d_ff) + 4 * length * length * d)
        assert batch["flops"]["cached"] == {"useful": 3 * forward + 6 * size * size * d,
                                            "executed": 4 * forward + 6 * size * size * d}
        assert row["gflops"] == pytest.approx(batch["flops"]["cached"]["useful"] / row["step_s"] / 1e9, rel=1e-2)
    assert (tmp_path / "p.md").read_text() == profile.markdown(result)
    assert "2 round(s) in 2 process(es)" in (tmp_path / "p.md").read_text()
