"""benchmarks.retrieval_beir_round2 (issue 51): the control rows, the mining given every training judgement (pairs
without a negative stay as pairs), the plan's order and choices, resuming, and the committed report."""

from __future__ import annotations

import json

import pytest

from benchmarks import retrieval_beir_round2 as r2
from benchmarks import retrieval_beir_rows as rows
from tests.benchmarks.test_retrieval_beir import write_beir


def test_the_control_rows_are_the_recipes_control_beside_the_same_loss_without_it():
    every = rows.round2_rows()
    for key, (loss, base, _, own) in rows.ROUND2_LOSSES.items():
        with_control, setting = every[f"{key}+ctl"]
        assert setting == rows.OURS_MINING and with_control.loss == loss
        assert with_control.guided and with_control.known_positives
        assert with_control.kwargs == {**base, "temperature": 0.05, **rows.REL, **rows.CONTROL_EXTRA.get(key, {})}
        without, _ = every[key]
        assert not (without.guided or without.known_positives) and without.kwargs == {**base, "temperature": 0.05}
        assert every[f"{key}+ctl@t0.01"][0].kwargs["temperature"] == 0.01
        option = every[rows.round2_label(key, temperature=0.01, option=True)][0].kwargs
        assert option == {**base, **own, "temperature": 0.01, **rows.REL, **rows.CONTROL_EXTRA.get(key, {})}
        assert rows.round2_twin(f"{key}+ctl@t0.01") == f"{key}@t0.01" and rows.round2_key(f"{key}@t0.01") == key
    assert every["adcse_tied+ctl"][0].kwargs["untied"] is False  # AdCSE's tied form: both sides get gradient
    assert every["mnrl@pairs"] == (rows.BUILTIN["mnrl"], "pairs") and rows.round2_key("gist@rel0.05") is None


def test_the_control_reaches_the_loss(tiny_model):
    import argparse

    from benchmarks import retrieval_beir as rb

    method, _ = rows.round2_rows()["hncse_hnm+ctl"]
    loss = rb.build_loss(method, tiny_model, argparse.Namespace(model=None), {"a query": {"a document"}})
    assert loss.guide is not None and loss.known_positives is not None
    assert (loss.margin, loss.margin_strategy, loss.temperature) == (0.05, "relative", 0.05)


def test_mining_is_given_every_judgement_and_keeps_pairs_without_a_negative(tmp_path, tiny_model):
    from datasets import DatasetDict

    from benchmarks import retrieval_beir as rb

    prep = rb.prepare("nf", write_beir(tmp_path / "nf", dev=True, docs=40, train=30), None,
                      {"per_query": 1, "max_pairs": 0, "seed": 0})
    known = prep.split.known_paraphrases
    pairs = prep.split.train_pairs
    for setting in ("top1_nomargin", "rel0.05"):
        data, info = r2.mine(prep, setting, tiny_model, tmp_path / "cache")
        assert info["triplets"] + info["pairs"] == len(pairs)
        triplets = data["triplets"] if isinstance(data, DatasetDict) else data
        for anchor, negative in zip(triplets["anchor"], triplets["negative"], strict=True):
            assert negative not in known[anchor]  # no training judgement of the query is ever its negative
        if info["pairs"]:
            assert isinstance(data, DatasetDict) and len(data["pairs"]) == info["pairs"]
        again, _ = r2.mine(prep, setting, tiny_model, tmp_path / "cache")  # the cached file, the same rows
        assert (again["triplets"] if isinstance(again, DatasetDict) else again).to_dict() == triplets.to_dict()
    top, info = r2.mine(prep, "top1_nomargin", tiny_model, tmp_path / "cache")
    assert info["pairs"] == 0 and len(top) == len(pairs)  # the whole corpus: every query keeps a candidate
    only, info = r2.mine(prep, "pairs", tiny_model, tmp_path / "cache")
    assert only.column_names == ["anchor", "positive"] and info == {"triplets": 0, "pairs": len(pairs),
                                                                     "mining_seconds": 0.0}


def _run(name, label, dev, seed=0, test=None):
    return {"stage": "main", "dataset": name, "method": label, "seed": seed, "dev": {"ndcg@10": dev},
            "test": {"ndcg@10": dev if test is None else test, "mrr@10": 1.0, "recall@100": 2.0},
            "train_seconds": 100.0, "median_step_seconds": 4.0, "steps": 22, "mining": "x"}


def test_the_plan_screens_first_and_chooses_on_pooled_dev_only():
    data = {"runs": []}
    first = list(r2.plan(data))[: 2 * len(r2.FIRST)]
    assert first == [(name, label, 0) for label in r2.FIRST for name in r2.MAIN]
    # a loss's own option is screened at its better temperature; the mining of the built-ins is MNRL's pooled dev
    runs = [_run(n, "focal+ctl", 40.0, test=99.0) for n in r2.MAIN] + [_run(n, "focal+ctl@t0.01", 45.0, test=1.0)
                                                                       for n in r2.MAIN]
    runs += [_run("scifact", "mnrl@pairs", 70.0), _run("nfcorpus", "mnrl@pairs", 22.0),
             _run("scifact", "mnrl@rel0.05", 60.0), _run("nfcorpus", "mnrl@rel0.05", 31.0)]
    data = {"runs": runs}
    items = list(r2.plan(data))
    assert ("scifact", "focal+ctl@t0.01,m0.5", 0) in items and ("scifact", "focal+ctl@m0.5", 0) not in items
    assert rows.round2_mining_choice(data) == "pairs" and ("nfcorpus", "gist@pairs", 0) in items
    assert rows.round2_loss_choice(data, "focal") == "focal+ctl@t0.01"  # dev 45 beats 40, whatever the test says
    assert ("nfcorpus", "focal@t0.01", 0) in items  # the chosen configuration without the control
    assert items[-1][0] == "nfcorpus_long"


def test_runs_resume_record_their_commit_and_render_from_the_json(tmp_path, monkeypatch):
    write_beir(tmp_path / "data" / "retrieval" / "scifact", dev=False)
    write_beir(tmp_path / "data" / "retrieval" / "nfcorpus", dev=True)
    ran = []

    def fake_run_one(label, method, seed, prep, negatives, roles, args):
        ran.append((prep.name, label, seed))
        scores = {role: {"ndcg@10": 30.0 + len(ran), "mrr@10": 1.0, "recall@100": 2.0} for role in roles}
        return {"dataset": prep.name, "method": label, "seed": seed, "train_seconds": 1.0,
                "median_step_seconds": 0.1, "steps": 1, "eval_seconds": 1.0, **scores}, {role: {"q": 1.0} for role in roles}

    monkeypatch.setattr(r2, "run_one", fake_run_one)
    monkeypatch.setattr(r2.Runner, "training_data", lambda self, name, setting: None)
    monkeypatch.setattr(r2, "plan", lambda data: iter([("scifact", "focal+ctl", 0), ("nfcorpus", "focal+ctl", 0)]))
    out = tmp_path / "r.json"
    argv = ["--data-dir", str(tmp_path / "data"), "--out", str(out), "--untrained-from", str(tmp_path / "none")]
    assert r2.main(argv) == 0 and r2.main(argv) == 0
    assert ran == [("scifact", "focal+ctl", 0), ("nfcorpus", "focal+ctl", 0)]  # the second call skipped both
    data = json.loads(out.read_text())
    assert data["commits"] and all(r["commit"] == data["commits"][0] for r in data["runs"])
    assert out.with_suffix(".md").read_text() == r2.markdown(data, r2.per_query_runs(
        out.with_name("r_per_query.jsonl")))
    assert "| focal+ctl | st-hardneg + control | 31.00 | 32.00 | 31.50 | 31.50 | 1 / 1 |" in r2.summary(data)


def test_the_committed_round2_report_is_its_json():
    out = r2.DEFAULT_OUT
    if not out.is_file():
        pytest.skip("no second-round results committed yet")
    data = json.loads(out.read_text())
    per_query = r2.per_query_runs(out.with_name(out.stem + "_per_query.jsonl"))
    assert out.with_suffix(".md").read_text() == r2.markdown(data, per_query)
    assert data["protocol"] == r2.round2_protocol()
    finished = [r for r in data["runs"] if "test" in r and "source" not in r]
    assert all(r.get("commit") and r.get("train_seconds") and r.get("median_step_seconds") for r in finished)
