"""benchmarks.untrained: the committed reports of the untrained model (``sts``: untrained_eval, ``beir``:
untrained_beir) are what their JSON renders to; the records files; the sts trial's record. The study specs, the
runner's commands and a BEIR smoke run: ``tests/studies/test_measure_untrained.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import untrained

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def test_sts_report_regenerates_byte_identical_from_the_committed_json():
    """The report code (one markdown-table helper for all) renders the committed results exactly as committed."""
    data = json.loads((RESULTS / "untrained_eval.json").read_text())
    assert untrained.sts_markdown(data) == (RESULTS / "untrained_eval.md").read_text()


def test_beir_report_regenerates_byte_identical_from_the_committed_json():
    data = json.loads((RESULTS / "untrained_beir.json").read_text())
    assert untrained.beir_render(data) == (RESULTS / "untrained_beir.md").read_text()
    assert {row["data"] for row in data["rows"]} == {"scifact", "nfcorpus"}


def test_the_records_files_read_and_lay_out_as_committed():
    data = json.loads((RESULTS / "untrained_eval.json").read_text())
    records, meta = untrained.sts_read(data)
    assert records == [data] and meta == {"row": "untrained"} and untrained.sts_layout(records, meta) == data
    with pytest.raises(ValueError, match="one measurement"):
        untrained.sts_layout([data, data], meta)
    beir = json.loads((RESULTS / "untrained_beir.json").read_text())
    records, meta = untrained.beir_read(beir)
    assert records == beir["rows"] and meta == {"threads": 1, "machine": "x86_64", "row": "untrained"}
    assert untrained.beir_layout(records, meta) == beir and list(untrained.beir_layout(records, meta)) == list(beir)
    new = {**beir["rows"][0], "data": "other", "threads": 1, "machine": "x86_64"}  # lifted to the top
    assert untrained.beir_layout([new], {}) == {"threads": 1, "machine": "x86_64", "rows": [beir["rows"][0] | {
        "data": "other"}]}
    with pytest.raises(ValueError, match="holds one threads"):
        untrained.beir_layout([*records, {**new, "threads": 2}], meta)


def test_the_sts_trial_makes_the_committed_records_differences_from_its_measurements(monkeypatch, tmp_path):
    """The trial with the evaluators replaced by the committed measurements: the record's derived numbers (mteb minus
    evaluate_sts, per call; the transfer's fit and encode split) are the committed record's."""
    import st_hardneg.data.transfer
    import st_hardneg.evaluation
    import st_hardneg.models

    committed = json.loads((RESULTS / "untrained_eval.json").read_text())
    transfer, sts, mteb = committed["transfer"], committed["sts"], committed["mteb_local"]

    class Split:
        def __init__(self, sentences, sentences2=None):
            self.sentences, self.sentences2 = sentences, sentences2

    monkeypatch.setattr(st_hardneg.models, "resolve_model", lambda *args, **kwargs: "a model")
    monkeypatch.setattr(st_hardneg.evaluation, "evaluate_transfer", lambda *args, **kwargs: {
        **transfer["scores"], "details": transfer["details"]})
    monkeypatch.setattr(st_hardneg.data.transfer, "read_transfer_task", lambda root, task: {
        "train": Split([f"{task} a", "shared"], [f"{task} b"] if task == "MRPC" else None)})
    monkeypatch.setattr(st_hardneg.evaluation, "evaluate_sts", lambda model, root, tasks=None, **kwargs: (
        sts["evaluate_sts"] if tasks is None else {tasks[0]: mteb["evaluate_sts_per_task_calls"][tasks[0]]}))
    monkeypatch.setattr(st_hardneg.evaluation, "run_mteb", lambda *args, **kwargs: {
        k: mteb[k] for k in ("model", "revision", "scores", "main_score", "avg")})
    alignment = committed["alignment_uniformity"]
    monkeypatch.setattr(st_hardneg.evaluation, "alignment_uniformity", lambda model, root, split: {
        k: v for k, v in alignment[split].items() if k != "wall_seconds"})

    class Spec:
        datasets = {"senteval": type("D", (), {"folder": str(tmp_path)})()}

    point = type("P", (), {"dataset": "senteval", "row": "untrained", "seed": None})()
    record = untrained.sts_trial(Spec(), point, {"provenance": {"commit": "c", "library": "l", "version": "v"}})
    for key in ("minus_evaluate_sts_7_tasks_call", "minus_evaluate_sts_per_task_calls"):
        assert record["mteb_local"][key] == mteb[key], key
    assert record["mteb_local"]["evaluate_sts_per_task_calls"] == mteb["evaluate_sts_per_task_calls"]
    assert record["transfer"]["scores"] == transfer["scores"] and record["transfer"]["details"] == transfer["details"]
    fit = sum(d["fit_seconds"] for d in transfer["details"].values())
    assert record["transfer"]["fit_seconds"] == round(fit, 1) == transfer["fit_seconds"]
    assert record["transfer"]["unique_sentences"] == 7 + 1 + 1  # a sentence a task, "shared" once, MRPC's second column
    assert record["transfer"]["protocol"] == transfer["protocol"]
    assert {k: v for k, v in record["alignment_uniformity"]["dev"].items() if k != "wall_seconds"} == {
        k: v for k, v in alignment["dev"].items() if k != "wall_seconds"}
    assert (record["commit"], record["library"], record["model"]) == ("c", "l", committed["model"])
    assert untrained.sts_vs_mteb_table(record) == untrained.sts_vs_mteb_table(committed)
    assert set(record) == set(committed) | {"commit", "library"}
    assert untrained.sts_markdown(record).startswith("# Untrained embedded default model")
