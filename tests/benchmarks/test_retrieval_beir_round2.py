"""benchmarks.retrieval_beir_round2: the protocol's split of a BEIR folder and its graded scores, the control rows,
the mining given every training judgement (pairs without a negative stay as pairs), the plan's order and choices,
resuming, and the committed report."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest

from benchmarks import retrieval_beir_round2 as r2
from benchmarks import retrieval_beir_rows as rows

#: the round's committed records (the spec's ``report.records``)
RECORDS = r2.SPEC.parent.parent / "results" / "retrieval_beir_round2.json"


def write_beir(root: Path, *, dev: bool, seed: int = 0, docs: int = 60, train: int = 30) -> Path:
    """A BEIR folder of distinct texts: ``train`` training queries with 1-4 relevant documents each, 8 test queries
    and (``dev``) 8 dev queries."""
    rng = random.Random(seed)
    (root / "qrels").mkdir(parents=True, exist_ok=True)
    doc_ids = [f"D{i}" for i in range(docs)]
    with (root / "corpus.jsonl").open("w") as handle:
        for d in doc_ids:
            handle.write(json.dumps({"_id": d, "title": "", "text": f"document {d} about topic{rng.randint(0, 999)}"}) + "\n")
    splits: dict[str, list[str]] = {"train": [], "test": [], "dev": []}
    with (root / "queries.jsonl").open("w") as handle:
        for i in range(train + 16):
            q = f"Q{i}"
            handle.write(json.dumps({"_id": q, "text": f"query {q}"}) + "\n")
            split = "train" if i < train else ("test" if i < train + 8 else ("dev" if dev else "train"))
            splits[split] += [f"{q}\t{d}\t1" for d in rng.sample(doc_ids, rng.randint(1, 4))]
    for split, judged in splits.items():
        if judged:
            (root / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\r\n" + "\r\n".join(judged)
                                                         + "\r\n")
    return root




# --------------------------------------------------------------------------- dev split rule
def test_official_dev_split_and_disjoint_training_queries(tmp_path):
    root = write_beir(tmp_path / "nf", dev=True)
    prep = r2.prepare("nf", root, None, {"per_query": 2, "max_pairs": 0, "seed": 0})
    assert prep.dev_split == "dev"
    held_out = set(prep.split.task.queries.values()) | set(prep.split.dev_task.queries.values())
    trained = {a for a, _ in prep.split.train_pairs}
    assert trained and not trained & held_out
    assert prep.stats["dev_queries"] == 8 and prep.stats["test_queries"] == 8
    # every drawn pair is a training judgement, and known relevance holds every training judgement of its query
    data = prep.data
    train = data.relevant("train")
    for query_text, doc_text in prep.split.train_pairs:
        query = next(q for q, t in data.queries.items() if t == query_text)
        assert doc_text in {data.corpus[d] for d in train[query]}
        assert prep.split.known_paraphrases[query_text] == {data.corpus[d] for d in train[query]}


def test_carved_dev_split_is_disjoint(tmp_path):
    root = write_beir(tmp_path / "sf", dev=False)
    prep = r2.prepare("sf", root, 0.25, {"per_query": 5, "max_pairs": 0, "seed": 0})
    assert prep.dev_split == "train"
    dev = set(prep.split.dev_task.queries.values())
    assert len(dev) == round(0.25 * 38)  # 30 + 8 training queries (no dev file), a quarter held out
    assert not {a for a, _ in prep.split.train_pairs} & (dev | set(prep.split.task.queries.values()))


def test_no_dev_split_and_no_dev_fraction_is_refused(tmp_path):
    root = write_beir(tmp_path / "sf", dev=False)
    with pytest.raises(ValueError, match="no dev split.*--dev-fraction"):
        r2.prepare("sf", root, None, {"per_query": 2, "max_pairs": 0, "seed": 0})


def test_a_sampling_rule_with_no_pair_is_refused_before_any_model(tmp_path):
    root = write_beir(tmp_path / "nf", dev=True)
    with pytest.raises(ValueError, match="per_query"):
        r2.prepare("nf", root, None, {"per_query": 0, "max_pairs": 0, "seed": 0})


def test_evaluation_is_graded_per_query_and_shares_the_corpus(tmp_path):
    from st_hardneg.models import load_model
    from st_hardneg.testing.fixtures import make_text_model_dir

    root = write_beir(tmp_path / "nf", dev=True)
    (root / "qrels" / "test.tsv").write_text((root / "qrels" / "test.tsv").read_text() + "Q31\tD1\t2\r\n")
    prep = r2.prepare("nf", root, None, rows.sampling())
    texts = [*prep.data.corpus.values(), *prep.data.queries.values()]
    model = load_model(make_text_model_dir(tmp_path / "model", texts), pooling="mean", max_seq_length=32,
                       device="cpu")
    means, per_query = r2.evaluate(model, prep, ("dev", "test"), batch_size=16)
    for role in ("dev", "test"):
        task = prep.split.dev_task if role == "dev" else prep.split.task
        assert set(per_query[role]) == set(task.queries) and means[role]["queries"] == len(task.queries)
        assert means[role]["ndcg@10"] == pytest.approx(statistics.fmean(per_query[role].values()), abs=1e-3)
        assert all(0.0 <= v <= 100.0 for v in per_query[role].values())
    assert prep.split.task.qrels["Q31"]["D1"] == 2  # the grade reaches the scorer




def test_negatives_key_follows_the_data_model_and_settings(tmp_path):
    prep = r2.prepare("nf", write_beir(tmp_path / "a", dev=True), None, rows.sampling())
    other = r2.prepare("nf", write_beir(tmp_path / "b", dev=True, seed=1), None, rows.sampling())
    one = r2.negatives_key(prep, "abc", rows.MINING_SETTINGS["rel0.05"])
    two = r2.negatives_key(prep, "abc", rows.MINING_SETTINGS["skip10_rel0.05"])
    assert one["corpus"] == two["corpus"] and one["pairs"] == two["pairs"] and one["mining"] != two["mining"]
    assert r2.negatives_key(prep, "abd", rows.MINING_SETTINGS["rel0.05"])["model"] != one["model"]
    moved = r2.negatives_key(other, "abc", rows.MINING_SETTINGS["rel0.05"])
    assert moved["corpus"] != one["corpus"] and moved["pairs"] != one["pairs"]


def test_a_controlled_rows_guide_is_the_untrained_model_frozen(tiny_model, monkeypatch):
    import copy

    guides = []
    monkeypatch.setattr(r2, "load_model", lambda args, length: guides.append(length) or copy.deepcopy(tiny_model))
    known = {"a query": {"a document"}}
    row = rows.all_rows()["focal+ctl@t0.01"]
    loss = r2.build_loss(row, tiny_model, r2.Options(), known)
    assert guides == [rows.PROTOCOL["train_max_seq_length"]] and loss.guide is not None
    assert not any(p.requires_grad for p in loss.guide.parameters()) and not loss.guide.training
    assert (loss.temperature, loss.margin, loss.margin_strategy) == (0.01, 0.05, "relative")
    assert loss.known_positives is not None
    assert all(p.requires_grad for p in tiny_model.parameters())  # the trained model is not the frozen guide


def test_the_control_rows_are_the_recipes_control_beside_the_same_loss_without_it():
    from st_hardneg.training.recipe import control_kwargs

    every = rows.all_rows()
    for key, (loss, base, _, own) in rows.LOSSES.items():
        with_control = every[f"{key}+ctl"]
        assert with_control.extra["mining"] == rows.OURS_MINING and with_control.loss == loss
        assert with_control.control  # the frozen untrained model as guide, the training qrels as known positives
        assert with_control.options == {**base, "temperature": 0.05, **control_kwargs(loss)}
        without = every[key]
        assert not without.control and without.options == {**base, "temperature": 0.05}
        assert every[f"{key}+ctl@t0.01"].options["temperature"] == 0.01
        option = every[rows.row_label(key, temperature=0.01, option=True)].options
        assert option == {**base, **own, "temperature": 0.01, **control_kwargs(loss)}
        assert rows.twin(f"{key}+ctl@t0.01") == f"{key}@t0.01" and rows.loss_key(f"{key}@t0.01") == key
    assert every["adcse_tied+ctl"].options["untied"] is False  # AdCSE's tied form: both sides get gradient
    pairs = every["mnrl@pairs"]
    assert (pairs.loss, pairs.options, pairs.control) == (rows.BUILTINS["mnrl"].loss, {}, False)
    assert pairs.extra == {"mining": "pairs", "builtin": True} and rows.loss_key("gist@rel0.05") is None


def test_the_control_reaches_the_loss(tiny_model):
    row = rows.all_rows()["hncse_hnm+ctl"]
    loss = r2.build_loss(row, tiny_model, r2.Options(), {"a query": {"a document"}})
    assert loss.guide is not None and loss.known_positives is not None
    assert (loss.margin, loss.margin_strategy, loss.temperature) == (0.05, "relative", 0.05)


def test_mining_is_given_every_judgement_and_keeps_pairs_without_a_negative(tmp_path, tiny_model):
    from datasets import DatasetDict


    prep = r2.prepare("nf", write_beir(tmp_path / "nf", dev=True, docs=40, train=30), None,
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
    assert rows.mining_choice(data) == "pairs" and ("nfcorpus", "gist@pairs", 0) in items
    assert rows.loss_choice(data, "focal") == "focal+ctl@t0.01"  # dev 45 beats 40, whatever the test says
    assert ("nfcorpus", "focal@t0.01", 0) in items  # the chosen configuration without the control
    assert items[-1][0] == "nfcorpus_long"


def _spec_here(tmp_path, stem, **changes):
    """The round's spec in ``tmp_path`` (its trial, hooks and renderers as they are) with ``changes``, its records,
    per-query file, report and figure ``tmp_path/<stem>.*``."""
    spec = json.loads(r2.SPEC.read_text())
    spec.update(changes)
    outputs = [{**o, "file": f"{stem}{Path(o['file']).suffix}"} for o in spec["report"]["outputs"]]
    spec["report"] = {**spec["report"], "records": f"{stem}.json", "per_query": f"{stem}_per_query.jsonl",
                      "outputs": outputs}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def _tiny_spec(tmp_path, labels=("focal+ctl",), seeds=(0,)):
    """The round's spec cut to ``labels`` on both datasets at ``seeds`` (its trial, rows and datasets as they are),
    its files ``tmp_path/r.*``."""
    spec = json.loads(r2.SPEC.read_text())
    return _spec_here(tmp_path, "r", name="tiny", rows={label: spec["rows"][label] for label in labels},
                      datasets={name: spec["datasets"][name] for name in r2.MAIN},
                      grid=[{"datasets": list(r2.MAIN), "rows": list(labels), "seeds": list(seeds)}],
                      choice={**spec["choice"], "baseline": labels[0]})


def runner(*argv):
    """The one runner, ``python -m benchmarks.studies ARGV``."""
    from benchmarks.studies.__main__ import main

    return main(list(argv))


def _check_consistent(out):
    """Every item ran once; each per-query line is the run its record names."""
    data = json.loads(out.read_text())
    runs = [r for r in data["runs"] if "test" in r]
    items = [(r["dataset"], r["method"], r["seed"]) for r in runs]
    assert len(items) == len(set(items))
    lines = r2.per_query_runs(out.with_name(out.stem + "_per_query.jsonl"))
    assert len(lines) == len(runs)
    for line in lines:
        record = data["runs"][line["run"]]
        assert record["per_query"].endswith(f"#{line['run']}")
        assert (line["dataset"], line["method"], line["seed"]) == (record["dataset"], record["method"],
                                                                     record["seed"])
        assert line["ndcg@10"]["dev"] == {f"{record['dataset']}-{record['method']}-{record['seed']}":
                                          record["dev"]["ndcg@10"]}
    return data, items


def test_runs_resume_record_their_commit_and_render_from_the_json(tmp_path, monkeypatch):
    pytest.importorskip("optuna")
    from st_hardneg.training.studies.engine import provenance

    write_beir(tmp_path / "data" / "retrieval" / "scifact", dev=False)
    write_beir(tmp_path / "data" / "retrieval" / "nfcorpus", dev=True)
    ran = []

    def fake_run_one(label, method, seed, prep, negatives, roles, args):
        ran.append((prep.name, label, seed))
        score = 31.0 + r2.MAIN.index(prep.name)
        scores = {role: {"ndcg@10": score, "mrr@10": 1.0, "recall@100": 2.0} for role in roles}
        return ({"dataset": prep.name, "method": label, "seed": seed, "train_seconds": 1.0,
                 "median_step_seconds": 0.1, "steps": 1, "eval_seconds": 1.0, **scores},
                {role: {f"{prep.name}-{label}-{seed}": score} for role in roles})

    mined = []

    def fake_training_data(spec, name, setting, context):
        mined.append((name, setting, context["cache_dir"], len(ran)))
        return None, {"triplets": 0, "pairs": 1, "mining_seconds": 0.0}

    monkeypatch.setattr(r2, "run_one", fake_run_one)
    monkeypatch.setattr(r2, "training_data", fake_training_data)
    out = tmp_path / "r.json"
    argv = [str(_tiny_spec(tmp_path)), "--run", "--data-dir", str(tmp_path / "data"), "--work-dir",
            str(tmp_path / "work"), "--set", f"cache_dir={tmp_path / 'cache'}", "-q"]
    assert runner(*argv) == 0 and runner(*argv) == 0
    # the engine's order, each once: the second call skipped both
    assert sorted(ran) == sorted([("scifact", "focal+ctl", 0), ("nfcorpus", "focal+ctl", 0)])
    # the spec's prepare hook mined each dataset's negatives before any trial ran (then each trial read them)
    cache = str(tmp_path / "cache")
    assert mined[:2] == [("scifact", "top1_nomargin", cache, 0), ("nfcorpus", "top1_nomargin", cache, 0)]
    assert len(mined) == 4
    data, items = _check_consistent(out)
    assert sorted(items) == sorted(ran)
    assert data["commits"] and all(r["commit"] == data["commits"][0] for r in data["runs"])
    here = provenance()
    assert data["commits"] == [here["commit"]] and {r["library"] for r in data["runs"]} == {here["library"]}
    assert data["library_trees"][here["commit"]] == here["library"]
    assert set(data["datasets"]) == set(r2.MAIN) and set(data["negatives"]) == {f"{n}/top1_nomargin" for n in r2.MAIN}
    assert out.with_suffix(".md").read_text() == r2.markdown(data, r2.per_query_runs(
        out.with_name("r_per_query.jsonl")))
    assert "| focal+ctl | st-hardneg + control | 31.00 | 32.00 | 31.50 | 31.50 | 1 / 1 |" in r2.summary(data)
    # the docs' "which loss" page includes the summary table from between these markers
    text = out.with_suffix(".md").read_text()
    assert text.split(r2.SUMMARY_START)[1].split(r2.SUMMARY_END)[0].strip() == r2.summary(data)
    assert text.split(r2.SHAPES_START)[1].split(r2.SHAPES_END)[0].strip() == r2.shape_table(data)
    assert r2.LONG_START not in text  # no run of the longer protocol: no table to include
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"  # the figure, drawn by the runner
    assert runner(*argv, "--check") == 0  # nothing left: the same report


@pytest.mark.parametrize(("setting", "data", "message"), [
    ("max_steps=four", True, "--set max_steps expects an integer of at least -1, got 'four'"),
    ("eval_batch_size=0", True, "--set eval_batch_size expects an integer of at least 1, got 0"),
    ("max_steps=1", False, "dataset 'scifact' of tiny: no BEIR folder at "),
])
def test_bad_options_and_a_missing_folder_are_refused_in_one_line_before_any_model(tmp_path, monkeypatch, capsys,
                                                                                    setting, data, message):
    pytest.importorskip("optuna")
    if data:
        write_beir(tmp_path / "data" / "retrieval" / "scifact", dev=False)
        write_beir(tmp_path / "data" / "retrieval" / "nfcorpus", dev=True)

    def no_model(*args, **kwargs):
        raise AssertionError("no model loads for bad input")

    monkeypatch.setattr(r2, "load_model", no_model)
    with pytest.raises(SystemExit) as stop:
        runner(str(_tiny_spec(tmp_path)), "--run", "--data-dir", str(tmp_path / "data"), "--work-dir",
               str(tmp_path / "work"), "--set", setting, "-q")
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and not (tmp_path / "r.json").exists()


def test_a_tiny_round_runs_its_own_trial_through_the_runner(tmp_path):
    """The spec's trial for real on a tiny model (``--set model=... max_steps=1``): the published model's record is
    the protocol's evaluation of that model; a trained row's record (MNRL on the pairs: a tiny random model's mined
    negatives repeat too often to fill a batch without duplicates) is its row's configuration, one step, and the
    per-query scores it points to average to its dev and test nDCG@10."""
    pytest.importorskip("optuna")
    from st_hardneg.models import resolve_model
    from st_hardneg.testing.fixtures import make_text_model_dir

    roots = {"scifact": write_beir(tmp_path / "data" / "retrieval" / "scifact", dev=False, docs=200, train=80),
             "nfcorpus": write_beir(tmp_path / "data" / "retrieval" / "nfcorpus", dev=True, seed=1, docs=200,
                                    train=80)}  # enough distinct texts for a batch of 32 without duplicates
    texts = [line["text"] for root in roots.values() for name in ("corpus.jsonl", "queries.jsonl")
             for line in map(json.loads, (root / name).read_text().splitlines())]
    model = make_text_model_dir(tmp_path / "model", texts)
    spec = json.loads(r2.SPEC.read_text())
    labels = ("untrained", "mnrl@pairs")
    path = _spec_here(tmp_path, "r", name="tiny-real", rows={label: spec["rows"][label] for label in labels},
                      datasets={name: spec["datasets"][name] for name in r2.MAIN},
                      grid=[{"datasets": list(r2.MAIN), "rows": ["untrained"], "seeds": [None]},
                            {"datasets": list(r2.MAIN), "rows": ["mnrl@pairs"], "seeds": [0]}],
                      choice={**spec["choice"], "baseline": "mnrl@pairs"})
    assert runner(str(path), "--run", "--data-dir", str(tmp_path / "data"), "--work-dir", str(tmp_path / "work"),
                  "--set", f"model={model}", "--set", "max_steps=1", "--set", f"cache_dir={tmp_path / 'cache'}",
                  "--set", "eval_batch_size=16", "-q") == 0
    data = json.loads((tmp_path / "r.json").read_text())
    by = {(r["dataset"], r["method"]): r for r in data["runs"]}
    assert sorted(by) == sorted((name, label) for name in r2.MAIN for label in labels)
    lines = {(line["dataset"], line["method"]): line for line in r2.per_query_runs(tmp_path / "r_per_query.jsonl",
                                                                                    data["runs"])}
    for name, root in roots.items():
        prep = r2.prepare(name, root, rows.DEV_FRACTION if name == "scifact" else None, rows.sampling())
        untrained = by[(name, "untrained")]
        means, _ = r2.evaluate(resolve_model(str(model), pooling="mean",
                                             max_seq_length=rows.PROTOCOL["eval_max_seq_length"]),
                               prep, ("dev", "test"), 16)
        assert untrained["dev"] == means["dev"] and untrained["test"] == means["test"]
        trained = by[(name, "mnrl@pairs")]
        assert (trained["loss"], trained["options"], trained["known_positives"], trained["builtin"]) == (
            "mnrl", {}, False, True)
        assert (trained["steps"], trained["batch_size"], trained["mining"]) == (1, 32, "pairs")
        assert data["negatives"][f"{name}/pairs"] == {"triplets": 0, "pairs": len(prep.split.train_pairs),
                                                      "mining_seconds": 0.0}
        assert len(prep.split.train_pairs) == data["datasets"][name]["sampled_pairs"]
        scores = lines[(name, "mnrl@pairs")]["ndcg@10"]
        for role in ("dev", "test"):
            assert trained[role]["ndcg@10"] == pytest.approx(statistics.fmean(scores[role].values()), abs=1e-3)
    assert (tmp_path / "r.md").read_text() == r2.markdown(data, r2.per_query_runs(tmp_path / "r_per_query.jsonl",
                                                                                   data["runs"]))


def test_the_committed_round2_report_is_its_json():
    from st_hardneg.training.studies.spec import load_spec

    out = RECORDS
    if not out.is_file():
        pytest.skip("no second-round results committed yet")
    data = json.loads(out.read_text())
    per_query = r2.per_query_runs(out.with_name(out.stem + "_per_query.jsonl"))
    assert out.with_suffix(".md").read_text() == r2.markdown(data, per_query)
    assert data["protocol"] == rows.PROTOCOL == dict(load_spec(r2.SPEC).protocol)
    finished = [r for r in data["runs"] if "test" in r and "source" not in r]
    assert all(r.get("commit") and r.get("train_seconds") and r.get("median_step_seconds") for r in finished)


def test_a_tie_is_settled_on_three_seeds_and_the_recipe_gets_five_paired_seeds(tmp_path):
    import numpy as np

    # the dev spread: per row, the standard deviation over seeds of the two dev tasks' mean; the median over rows
    first = {"runs": [{"stage": "main", "dataset": name, "method": m, "seed": s, "dev": {"ndcg@10": v + d}}
                      for m, values in (("a", (40.0, 41.0, 43.0)), ("b", (50.0, 50.5, 50.0)), ("c", (1.0, 9.0)))
                      for s, v in enumerate(values) for name, d in (("scifact", 1.0), ("nfcorpus", -1.0))]}
    (tmp_path / "first.json").write_text(json.dumps(first))
    spreads = [np.std([40.0, 41.0, 43.0], ddof=1), np.std([50.0, 50.5, 50.0], ddof=1)]  # "c": 2 seeds, left out
    assert rows.dev_sd(tmp_path / "first.json") == pytest.approx(np.median(spreads))
    sd = rows.dev_sd()
    configs = rows.loss_configs("focal")
    # seed 0: focal+ctl@t0.01 leads focal+ctl by less than two dev standard deviations, the option by more
    runs = [_run(n, configs[0], 45.0) for n in r2.MAIN] + [_run(n, configs[2], 45.0 + sd) for n in r2.MAIN]
    runs += [_run(n, configs[3], 45.0 - 3 * sd) for n in r2.MAIN]
    runs += [_run(n, f"mnrl@{s}", 40.0 - i) for n in r2.MAIN for i, s in enumerate(rows.MINING_SETTINGS)]
    data = {"runs": runs}
    assert rows.tied(data, configs) == [configs[2], configs[0]]
    # at most the best three of a tie go to three seeds
    many = {"runs": [_run(n, f"mnrl@{s}", 40.0 - 0.01 * i) for n in r2.MAIN for i, s in enumerate(rows.MINING_SETTINGS)]}
    assert rows.tied(many, [f"mnrl@{s}" for s in rows.MINING_SETTINGS]) == [
        f"mnrl@{s}" for s in list(rows.MINING_SETTINGS)[:rows.TIE_CAP]] and rows.TIE_CAP == 3
    assert rows.loss_choice(data, "focal") == configs[2]  # seed 0 until the tie is settled
    items = list(r2.plan(data))
    assert [i for i in items if i[1] in configs and i[2]][:8] == [(n, label, seed) for seed in (1, 2) for label in
                                                                  (configs[2], configs[0]) for n in r2.MAIN]
    assert ("scifact", configs[3], 1) not in items  # not tied
    # MNRL's mining settings are 1 apart at seed 0 (more than two dev standard deviations): no tie, no seeds 1-2
    assert not [i for i in items if i[1].startswith("mnrl@") and i[0] in r2.MAIN and i[2] and i[1] != "mnrl@rel0.05"]
    # seeds 1-2: the runner-up at seed 0 is better over the three seeds, so it is chosen
    data["runs"] += [_run(n, configs[0], 46.0, seed=s) for n in r2.MAIN for s in (1, 2)]
    data["runs"] += [_run(n, configs[2], 44.0, seed=s) for n in r2.MAIN for s in (1, 2)]
    assert rows.settled(data, configs[0]) == pytest.approx((45.0 + 46.0 + 46.0) / 3)
    assert rows.loss_choice(data, "focal") == configs[0]
    items = list(r2.plan(data))
    assert ("scifact", "focal", 0) in items  # the chosen configuration without the control
    # the recipe (st-hardneg's best, here the only loss run), the best built-in and MNRL on the mining: seeds 0-4
    recipe, best = rows.side_choice(data, False), rows.side_choice(data, True)
    assert (recipe, best) == (configs[0], "mnrl@rel0.05")
    for label in (recipe, best):
        assert {i[2] for i in items if i[1] == label and i[0] in r2.MAIN} >= set(r2.PAIRED_SEEDS)
    long = [i for i in items if i[0] == "nfcorpus_long"]
    # each side's best two (st-hardneg's side holds each loss's chosen configuration: here one row), the chosen first
    assert long[:3] == [("nfcorpus_long", label, 0) for label in (recipe, best, "mnrl@skip10_rel0.05")]
    assert items[-1][0] == "nfcorpus_long"


def test_the_figure_shows_each_chosen_configuration_with_and_without_the_control(tmp_path):
    runs = [_run(n, "focal+ctl", 40.0, test=t) for n, t in zip(r2.MAIN, (60.0, 30.0), strict=True)]
    runs += [_run(n, "focal+ctl@t0.01", 45.0, test=t, seed=s) for n, t in zip(r2.MAIN, (62.0, 31.0), strict=True)
             for s in (0, 1)]
    runs += [_run("scifact", "focal@t0.01", 44.0, test=61.0)]  # its twin, on SciFact only so far
    runs += [_run(n, "mnrl@pairs", 42.0, test=t) for n, t in zip(r2.MAIN, (63.0, 29.0), strict=True)]
    runs += [{"stage": "untrained", "dataset": n, "method": "untrained", "seed": None, "dev": {"ndcg@10": 1.0},
              "test": {"ndcg@10": t}} for n, t in zip(r2.MAIN, (64.5, 31.6), strict=True)]
    data = {"runs": runs}
    assert not r2.plot({"runs": []}, tmp_path / "none.png") and not (tmp_path / "none.png").exists()
    points = r2.control_points(data)
    assert points["scifact"] == [{"loss": "focal", "label": "focal+ctl@t0.01", "with": 62.0, "with_seeds": 2,
                                  "without": 61.0, "without_seeds": 1}]
    assert points["nfcorpus"][0]["without"] is None and points["nfcorpus"][0]["with"] == 31.0
    # the best built-in is MNRL on the chosen mining: one line with both titles
    assert r2.reference_lines(data, "nfcorpus") == {
        "untrained": 31.6, "best built-in, MNRL, chosen mining (mnrl@pairs)": 29.0}
    assert r2.plot(data, tmp_path / "f.png") and (tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG"
    # the figure's paired differences: against MNRL on the chosen mining (here also the best built-in: no row of
    # its own) at each seed both ran, and with the control against without it
    assert r2.figure_differences(data) == {
        "scifact": {"baseline": {"focal+ctl@t0.01": {0: 62.0 - 63.0}}, "control": {"focal+ctl@t0.01": {0: 1.0}}},
        "nfcorpus": {"baseline": {"focal+ctl@t0.01": {0: 31.0 - 29.0}}, "control": {"focal+ctl@t0.01": {}}}}


def _figure_axes(monkeypatch, data, path):
    from matplotlib.figure import Figure

    drawn = {}
    savefig = Figure.savefig

    def keep(fig, *args, **kwargs):
        drawn["fig"] = fig
        return savefig(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    assert r2.plot(data, path)
    return drawn["fig"].axes


def test_the_committed_figure_draws_each_seeds_paired_difference_on_axes_that_hold_0(tmp_path, monkeypatch):
    """retrieval_beir_round2.png from the committed JSON: per dataset, a dot per seed of each chosen configuration
    with the control and of the best built-in minus MNRL on the chosen mining at that seed, and a dot per seed both
    ran of each configuration minus its twin without the control (computed here from the runs); every axis holds 0;
    the ticks name the rows; the legends name what is drawn; the same bytes twice."""
    from matplotlib.collections import PathCollection

    data = json.loads((Path(r2.__file__).parent / "results" / "retrieval_beir_round2.json").read_text())

    def scores(name, label):
        return {r["seed"]: r["test"]["ndcg@10"] for r in data["runs"] if r["dataset"] == name
                and r["method"] == label and "test" in r and "failed" not in r}

    chosen = [r2.loss_choice(data, key) for key in r2.LOSSES]
    assert chosen == ["focal+ctl@t0.01", "mixcse+ctl", "hncse_hnm+ctl@t0.01", "hncse_pm+ctl", "adcse_tied+ctl@t0.01"]
    axes = _figure_axes(monkeypatch, data, tmp_path / "a.png")
    assert len(axes) == 2 * len(r2.MAIN)
    for (left, right), name in zip(zip(axes[::2], axes[1::2], strict=True), r2.MAIN, strict=True):
        base = scores(name, "mnrl@rel0.05")
        expected = {"baseline": {label: [v - base[s] for s, v in sorted(scores(name, label).items())]
                                 for label in [*chosen, "gist@rel0.05"]},
                    "control": {label: [v - scores(name, r2.twin(label))[s]
                                        for s, v in sorted(scores(name, label).items())
                                        if s in scores(name, r2.twin(label))] for label in chosen}}
        for ax, key in ((left, "baseline"), (right, "control")):
            dots = [x for c in ax.collections if isinstance(c, PathCollection) for x, _ in c.get_offsets()]
            assert sorted(dots) == pytest.approx(sorted(v for d in expected[key].values() for v in d)), (name, key)
            assert [t.get_text().split("\n")[0] for t in ax.get_yticklabels()] == list(expected[key])
            low, high = ax.get_xlim()
            assert low < 0 < high and "holds 0" in ax.get_xlabel()
            legend = [t.get_text() for t in ax.get_legend().get_texts()]
            assert legend[0] == "each seed" and legend[1].startswith("0 = ")
        assert sum(len(d) for d in expected["baseline"].values()) == 3 * 4 + 5 + 5  # rows x their seeds
        assert [t.get_text() for t in right.get_legend().get_texts()][2] == "mean (one seed: no interval)"
        assert "mnrl@rel0.05" in left.get_title() and name in left.get_title()
    r2.plot(data, tmp_path / "b.png")
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()


def test_the_target_line_judges_the_mean_each_dataset_and_holm():
    import random

    rng = random.Random(0)
    base = {name: {f"q{i}": rng.uniform(20, 80) for i in range(60)} for name in r2.MAIN}

    def by(gain, seeds=r2.PAIRED_SEEDS):
        out = {}
        for name in r2.MAIN:
            out[(name, "best")] = {s: dict(base[name]) for s in seeds}
            out[(name, "recipe")] = {s: {q: v + gain[name] + rng.uniform(-0.5, 0.5) for q, v in base[name].items()}
                                     for s in seeds}
        return out

    met = r2.target_line(by({"scifact": 2.0, "nfcorpus": 1.5}), "recipe", "best")
    assert ": **met**" in met and "5 paired seed(s)" in met
    short = r2.target_line(by({"scifact": 0.6, "nfcorpus": 0.6}), "recipe", "best")
    mean = float(short.split("mean ")[1].split(";")[0])
    assert abs(mean - 0.6) < 0.1 and f"not met: {1.0 - mean:.2f} short on the mean" in short
    behind = r2.target_line(by({"scifact": 3.0, "nfcorpus": -0.5}), "recipe", "best")  # mean +1.25, behind on one
    assert "not met: not ahead, or not significant, on each dataset" in behind
    provisional = r2.target_line(by({"scifact": 2.0, "nfcorpus": 1.5}, seeds=(0,)), "recipe", "best")
    assert "1 paired seed(s)" in provisional and "provisional: 5 seeds planned" in provisional
    assert "not judged yet" in r2.target_line({}, "recipe", "best")
    # the detectable difference is read from the per-query differences, each query averaged over the seeds first
    paired = by({"scifact": 2.0, "nfcorpus": 1.5}, seeds=(0, 1))
    differences = r2.query_differences(paired, "scifact", [0, 1], "recipe", "best")
    expected = [(paired[("scifact", "recipe")][0][q] + paired[("scifact", "recipe")][1][q]) / 2 - base["scifact"][q]
                for q in sorted(base["scifact"])]
    assert differences == pytest.approx(expected)
    assert f"detectable {r2.detectable_difference(differences, 2):.2f})" in r2.target_line(paired, "recipe", "best")


def test_the_detectable_difference_is_the_normal_power_formula_at_holms_strictest_level():
    import numpy as np
    from scipy.stats import norm

    differences = [float(v) for v in np.random.default_rng(0).normal(0.3, 8.0, 300)]
    expected = (norm.ppf(1 - 0.025 / 2) + norm.ppf(0.8)) * np.std(differences, ddof=1) / np.sqrt(300)
    assert r2.detectable_difference(differences, 2) == pytest.approx(expected)
    assert r2.detectable_difference(differences, 1) < r2.detectable_difference(differences, 2)
    # a difference of that size, every query shifted by it plus the same spread, is found in about 80 % of draws
    rng = np.random.default_rng(1)
    found = 0
    for _ in range(400):
        sample = rng.normal(expected, 8.0, 300)
        t = sample.mean() / (sample.std(ddof=1) / np.sqrt(300))
        found += abs(t) > norm.ppf(1 - 0.025 / 2)
    assert 0.74 < found / 400 < 0.86


def test_each_data_shape_takes_each_sides_best_row_on_that_datasets_own_dev(tmp_path):
    runs = [_run("scifact", "focal+ctl", 50.0, test=60.0), _run("nfcorpus", "focal+ctl", 30.0, test=33.0),
            _run("scifact", "focal@t0.01", 55.0, test=58.0), _run("nfcorpus", "focal@t0.01", 20.0, test=25.0),
            _run("scifact", "focal@t0.01", 54.0, test=59.0, seed=1),
            _run("scifact", "mnrl@pairs", 52.0, test=57.0), _run("nfcorpus", "mnrl@pairs", 29.0, test=31.0),
            _run("scifact", "gist@pairs", 51.0, test=99.0), _run("nfcorpus", "gist@pairs", 29.5, test=32.0)]
    data = {"runs": runs}
    assert [r2.best_on(data, n, builtin=False) for n in r2.MAIN] == ["focal@t0.01", "focal+ctl"]  # dev, not test
    assert [r2.best_on(data, n, builtin=True) for n in r2.MAIN] == ["mnrl@pairs", "gist@pairs"]
    table = r2.shape_table(data)
    assert "| `focal@t0.01`: 58.50 ± 0.71 (2 seeds) | `mnrl@pairs`: 57.00 (1 seed) | +1.50 |" in table
    assert "| `focal+ctl`: 33.00 (1 seed) | `gist@pairs`: 32.00 (1 seed) | +1.00 |" in table
    assert r2.shape_table({"runs": []}).count("not run") == 4


def test_the_benchmarks_control_is_the_librarys():
    """``+ctl`` rows train with what ``controlled_loss`` (``st-hardneg train --task beir --control``) gives a user."""
    from st_hardneg.training import recipe

    for key, (loss, _, _, _) in rows.LOSSES.items():
        row = rows.loss_row(key)
        assert row.control
        assert {key: row.options[key] for key in recipe.control_kwargs(loss)} == recipe.control_kwargs(loss)
        assert recipe.control_kwargs(loss)["margin"] == rows.REL["margin"]


#: the library's mining settings that give st-hardneg's rows' negatives (``top1_nomargin``): the hardest corpus text
#: outside the query's training qrels
TOP1_OUTSIDE_QRELS = rows.LIBRARY_MINING[rows.OURS_MINING]


def test_the_library_mines_the_negatives_of_st_hardnegs_rows(tmp_path):
    """``mined_triplets(..., mining=TOP1_OUTSIDE_QRELS)`` (``st-hardneg train --task beir --mining-arg ...``) gives every
    pair the negative the benchmark's ``top1_nomargin`` gives it, also where the hardest candidates are all judged."""
    from st_hardneg.models import load_model
    from st_hardneg.testing import make_text_model_dir
    from st_hardneg.training.protocol import mined_triplets

    prep = r2.prepare("nf", write_beir(tmp_path / "nf", dev=True, docs=40, train=30), None,
                      {"per_query": 2, "max_pairs": 0, "seed": 0})
    texts = [*prep.data.queries.values(), *prep.data.corpus.values()]
    model = load_model(make_text_model_dir(tmp_path / "bert", texts), pooling="mean", max_seq_length=32, device="cpu")
    benchmark, info = r2.mine(prep, "top1_nomargin", model, tmp_path / "bench-cache")
    assert info["pairs"] == 0
    library, _ = mined_triplets(prep.split, lambda: model, model_key="m", data_key="d", mining=TOP1_OUTSIDE_QRELS,
                                cache_dir=tmp_path / "cache", prefix="nf")
    assert library.to_dict() == benchmark.to_dict() and len(library) == len(prep.split.train_pairs)
    # the case the old top-5 rule dropped: a query whose top candidates are all judged relevant keeps its pair
    known = prep.split.known_paraphrases
    corpus = prep.split.train_corpus
    emb = dict(zip(corpus, model.encode(corpus, normalize_embeddings=True), strict=True))
    anchor, positive = prep.split.train_pairs[0]
    query = model.encode(anchor, normalize_embeddings=True)
    ranked = sorted(corpus, key=lambda d: -float(emb[d] @ query))
    outside = next(d for d in ranked if d not in known[anchor])
    assert library["negative"][0] == outside
    # the 7 hardest are judged relevant too: the old rule's 5 candidates (past the query's <= 2 sampled positives)
    judged = {**known, anchor: known[anchor] | set(ranked[:7])}
    prep.split.known_paraphrases.update(judged)
    old, _ = mined_triplets(prep.split, lambda: model, model_key="m", data_key="d2",
                            mining={"num_candidates": 5, "relative_margin": None}, cache_dir=tmp_path / "cache",
                            prefix="nf")
    new, _ = mined_triplets(prep.split, lambda: model, model_key="m", data_key="d2", mining=TOP1_OUTSIDE_QRELS,
                            cache_dir=tmp_path / "cache", prefix="nf")
    assert (anchor, positive) not in set(zip(old["anchor"], old["positive"], strict=True))
    assert new["negative"][0] == next(d for d in ranked if d not in judged[anchor])
    bench_again, info = r2.mine(prep, "top1_nomargin", model, tmp_path / "bench-cache-2")
    assert new.to_dict() == bench_again.to_dict() and info["pairs"] == 0


def test_the_report_reads_only_the_per_query_rows_its_records_point_to(tmp_path):
    """A runner stopped between appending its per-query row and writing its record leaves a row no record names;
    the next run gets the same number. The report reads the row the record points to, whatever the file's order."""
    path = tmp_path / "r_per_query.jsonl"

    def line(number, method, score, stage="main"):
        return {"run": number, "dataset": "scifact", "method": method, "seed": 0, "stage": stage,
                "ndcg@10": {"test": {"q1": score}}}

    runs = [{"dataset": "scifact", "method": "focal", "seed": 0, "stage": "replaced", "per_query": f"{path.name}#0"},
            {"dataset": "scifact", "method": "mnrl", "seed": 0, "stage": "main", "per_query": f"{path.name}#1"},
            {"dataset": "scifact", "method": "focal", "seed": 0, "stage": "main", "per_query": f"{path.name}#2"}]
    rows = [line(0, "focal", 10.0), line(2, "focal", 30.0), line(1, "hncse", 99.0), line(1, "mnrl", 20.0)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))  # the stray hncse row, then the run numbered like it
    assert len(r2.per_query_runs(path)) == 4
    kept = r2.per_query_runs(path, runs)
    assert [(r["run"], r["method"]) for r in kept] == [(2, "focal"), (1, "mnrl")]
    assert r2.per_query_by_row(kept) == {("scifact", "focal"): {0: {"q1": 30.0}}, ("scifact", "mnrl"): {0: {"q1": 20.0}}}
    assert ("scifact", "hncse") in r2.per_query_by_row(r2.per_query_runs(path))  # what reading every row would take
    assert r2.per_query_runs(tmp_path / "none.jsonl", runs) == []
    unpointed = [{k: v for k, v in record.items() if k != "per_query"} for record in runs]
    assert r2.per_query_runs(path, unpointed) == rows  # results written by hand: nothing to check the rows against


def test_each_of_st_hardnegs_rows_is_a_library_recipe_that_builds_the_rows_loss(tiny_model, monkeypatch):
    """``library_recipe(label)`` as ``RETRIEVAL_RECIPE``: ``recipe_loss`` builds the loss the benchmark trains that
    row with (class and options; the guide a frozen copy of the untrained model), on the row's negatives."""
    import copy

    from st_hardneg.training import recipe
    from st_hardneg.training.protocol import MINING, check_mining

    monkeypatch.setattr(r2, "load_model", lambda args, length: copy.deepcopy(tiny_model))
    known = {"a query": {"a document"}}
    ours = [label for label in rows.all_rows() if rows.loss_key(label)]
    assert len(ours) == 5 * 2 * 2 * 2  # each loss with and without the control, at 2 temperatures, with its option
    for label in ours:
        spec = rows.library_recipe(label)
        row = rows.all_rows()[label]
        assert check_mining(spec["mining"]) == {**MINING, **rows.LIBRARY_MINING[row.extra["mining"]]}
        assert set(spec) == set(recipe.RETRIEVAL_RECIPE)
        monkeypatch.setattr(recipe, "RETRIEVAL_RECIPE", spec)
        library = recipe.recipe_loss(copy.deepcopy(tiny_model), known)
        benchmark = r2.build_loss(row, copy.deepcopy(tiny_model), r2.Options(), known)
        assert type(library) is type(benchmark), label
        assert library.get_config_dict() == benchmark.get_config_dict(), label
        assert (library.guide is None) == (benchmark.guide is None) == (not row.control), label
        assert (library.known_positives is None) == (not row.control), label
    with pytest.raises(ValueError, match="'mnrl@pairs' is not one of st-hardneg's round-2 rows"):
        rows.library_recipe("mnrl@pairs")


def test_the_library_recipe_is_the_second_rounds_choice():
    """``RETRIEVAL_RECIPE`` is the recipe the committed second round chose on pooled dev (st-hardneg's side, ties
    settled on 3 seeds), in the library's terms (:func:`rows.library_recipe`: loss, options, control, negatives,
    training values)."""
    from st_hardneg.training.recipe import RETRIEVAL_RECIPE

    committed = json.loads(RECORDS.read_text())
    chosen = rows.side_choice(committed, builtin=False)
    assert chosen == "adcse_tied+ctl@t0.01"
    assert RETRIEVAL_RECIPE == rows.library_recipe(chosen)
    # the tie it came out of was settled: every tied configuration ran at each tie seed on both datasets
    done = {(r["dataset"], r["method"], r["seed"]) for r in committed["runs"] if r["stage"] == "main"}
    assert all((d, chosen, s) in done for d in ("scifact", "nfcorpus") for s in rows.TIE_SEEDS)


def test_the_longer_protocol_is_read_against_the_other_side_and_against_its_own_shorter_run():
    import random

    from st_hardneg.evaluation.compare import holm

    rng = random.Random(0)
    base = {f"q{i}": rng.uniform(10, 60) for i in range(80)}
    gain = {("nfcorpus_long", "adcse_tied+ctl@t0.01"): 2.0, ("nfcorpus_long", "mixcse+ctl"): 0.1,
            ("nfcorpus_long", "gist@rel0.05"): 0.0, ("nfcorpus_long", "mnrl@rel0.05"): -1.0,
            ("nfcorpus", "adcse_tied+ctl@t0.01"): 1.0, ("nfcorpus", "mixcse+ctl"): 0.1,
            ("nfcorpus", "gist@rel0.05"): 0.0}
    noise = {(key, s, q): rng.uniform(-3, 3) for key in gain for s in (0, 1, 2) for q in base}
    seeds = {key: (0, 1, 2) if key != ("nfcorpus_long", "mnrl@rel0.05") else (0, 1) for key in gain}
    by = {key: {s: {q: v + gain[key] + noise[(key, s, q)] for q, v in base.items()} for s in seeds[key]}
          for key in gain}
    data = {"runs": [_run(name, label, 30.0, seed=s) for (name, label), ss in seeds.items() for s in ss]}
    text = "\n".join(r2.long_comparisons(data, by))
    # the seeds every long row has (MNRL ran two): each side's pairs over seeds 0-1, Holm over the 2 x 2 comparisons
    assert "### st-hardneg against sentence-transformers, longer protocol (seeds 0, 1)" in text
    assert "Holm over the 4 comparisons" in text

    def mean(key, ss):
        return sum(sum(by[key][s][q] for s in ss) / len(ss) for q in base) / len(base)

    long = [("adcse_tied+ctl@t0.01", "gist@rel0.05"), ("mixcse+ctl", "gist@rel0.05"),
            ("adcse_tied+ctl@t0.01", "mnrl@rel0.05"),
            ("mixcse+ctl", "mnrl@rel0.05")]
    for a, b in long:
        difference = mean(("nfcorpus_long", a), (0, 1)) - mean(("nfcorpus_long", b), (0, 1))
        assert f"| nfcorpus_long/{a} | nfcorpus_long/{b} | 80 |" in text and f"| {difference:+.2f} |" in text
    # the Holm column is Holm over the four raw p-values of the table
    table = [line.split(" | ") for line in text.split("### Each row")[0].splitlines() if "| nfcorpus |" in line]
    raw, adjusted = [float(r[8]) for r in table], [float(r[10]) for r in table]
    assert adjusted == pytest.approx(holm(raw), abs=2e-4)
    assert adjusted[0] < 0.05 and raw[1] > 0.05  # +2 over 80 queries is found; +0.1 is not
    # against its own shorter run: the rows with the same seeds on the 768-pair protocol (MNRL has none)
    shorter = text.split("### Each row, longer protocol against the 768-pair protocol (seeds 0, 1)")[1]
    assert "Holm over the 3 comparisons" in shorter and "mnrl" not in shorter
    recipe = "adcse_tied+ctl@t0.01"
    difference = mean(("nfcorpus_long", recipe), (0, 1)) - mean(("nfcorpus", recipe), (0, 1))
    assert f"| nfcorpus_long/{recipe} | nfcorpus/{recipe} | 80 |" in shorter and f"| {difference:+.2f} |" in shorter
    # no long row, or rows of one side only without shorter runs: nothing to read
    # the report's table of the longer protocol's rows sits between the markers the "which loss" page includes from
    report = r2.markdown({**data, "protocol": {}})
    assert report.split(r2.LONG_START)[1].split(r2.LONG_END)[0].strip() == r2.dataset_table(data, "nfcorpus_long")
    assert r2.long_comparisons({"runs": []}, by) == []
    only = {k: v for k, v in by.items() if k[1] == "mnrl@rel0.05"}
    assert r2.long_comparisons(data, only) == []


def test_the_longer_protocols_best_row_on_dev_is_one_command(tiny_model, monkeypatch):
    """The longer protocol's committed runs: its four rows at seeds 0-2, MixCSE with the control the best on dev; the
    command that trains that row (``--loss mixcse_two_way --loss-arg partner=explicit --control``, i.e.
    ``controlled_loss``) builds the loss the benchmark trained it with."""
    import copy

    from st_hardneg.training import recipe

    data = json.loads(RECORDS.read_text())
    long = {label: r2._runs(data, r2.LONG, label)
            for label in dict.fromkeys(r["method"] for r in data["runs"] if r["dataset"] == r2.LONG)}
    assert sorted(long) == sorted(["mixcse+ctl", "adcse_tied+ctl@t0.01", "gist@rel0.05", "mnrl@skip10_rel0.05"])
    assert all(sorted(r["seed"] for r in runs) == [0, 1, 2] for runs in long.values())
    best = max(long, key=lambda label: statistics.fmean(r["dev"]["ndcg@10"] for r in long[label]))
    assert best == "mixcse+ctl"
    known = {"a query": {"a document"}}
    command = recipe.controlled_loss("mixcse_two_way", copy.deepcopy(tiny_model), known, partner="explicit")
    monkeypatch.setattr(recipe, "RETRIEVAL_RECIPE", rows.library_recipe(best))
    row = recipe.recipe_loss(copy.deepcopy(tiny_model), known)
    assert type(command) is type(row) and command.get_config_dict() == row.get_config_dict()


def test_the_specs_grid_is_the_points_the_plan_reaches_from_the_rounds_records():
    from st_hardneg.training.studies.spec import load_spec

    data = json.loads(RECORDS.read_text())
    spec = load_spec(r2.SPEC)
    trained = [(p.dataset, p.row, p.seed) for p in spec.points() if spec.rows[p.row].loss is not None]
    assert len(trained) == len(set(trained)) == 154
    assert set(r2.plan(data)) == set(trained)
    assert spec.trial == "benchmarks.retrieval_beir_round2:run_trial"
    for label, row in spec.rows.items():  # each trained row is the round's own row: loss, options, control, mining
        if row.loss is not None:
            assert rows.all_rows()[label].config() == row.config(), label
            assert rows.all_rows()[label].extra["mining"] == row.extra["mining"], label


def test_the_committed_round_run_with_nothing_left_rewrites_its_files_byte_for_byte(tmp_path, monkeypatch):
    pytest.importorskip("optuna")
    from benchmarks.studies.render import import_study
    from st_hardneg.training.studies.engine import finished_records

    names = [RECORDS.name, f"{RECORDS.stem}_per_query.jsonl", RECORDS.with_suffix(".md").name]
    for name in names:
        (tmp_path / name).write_bytes((RECORDS.parent / name).read_bytes())
    spec_path = _spec_here(tmp_path, RECORDS.stem)

    def no_run(*args, **kwargs):
        raise AssertionError("a finished round runs no trial")

    monkeypatch.setattr(r2, "run_one", no_run)
    monkeypatch.setattr(r2, "training_data", no_run)
    assert runner(str(spec_path), "--run", "--work-dir", str(tmp_path / "work"), "--data-dir",
                  str(tmp_path / "no-data"), "-q") == 0
    for name in names:  # nothing left to run: the files as committed, the report rendered from the records
        assert (tmp_path / name).read_bytes() == (RECORDS.parent / name).read_bytes(), name
    # the 156 records imported as finished trials and written back from the study (the spec's write hook)
    spec, study = import_study(spec_path)
    data = r2.write_results(finished_records(study, spec, failed=True), study.user_attrs["records_meta"],
                            tmp_path / names[0])
    assert data == json.loads(RECORDS.read_text())
    for name in names:
        assert (tmp_path / name).read_bytes() == (RECORDS.parent / name).read_bytes(), name
