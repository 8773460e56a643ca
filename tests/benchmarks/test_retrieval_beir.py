"""benchmarks.retrieval_beir: the pair-sampling rule, the dev split rule, the shared negatives file, the paired data
order, the graded scores and the resume check, on tiny BEIR folders (no real model)."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest
import torch

from benchmarks import retrieval_beir as rb
from benchmarks import retrieval_beir_report as rb_report
from st_hardneg.training.sampling import KnownRelevanceBatchSampler, sample_training_pairs


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
    for split, rows in splits.items():
        if rows:
            (root / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\r\n" + "\r\n".join(rows) + "\r\n")
    return root


# --------------------------------------------------------------------------- pair sampling
RELEVANT = {f"q{i}": {f"d{i}-{k}" for k in range(i % 6 + 1)} for i in range(40)}


def test_pair_sampling_caps_per_query_and_in_all():
    pairs = sample_training_pairs(RELEVANT, per_query=2, max_pairs=0, seed=0)
    expected = sum(min(2, len(docs)) for docs in RELEVANT.values())
    assert len(pairs) == expected == 7 + 2 * 33  # 7 queries (i % 6 == 0) have a single document
    per_query: dict[str, int] = {}
    for query, doc in pairs:
        assert doc in RELEVANT[query]
        per_query[query] = per_query.get(query, 0) + 1
    assert max(per_query.values()) == 2
    assert len(sample_training_pairs(RELEVANT, per_query=2, max_pairs=25, seed=0)) == 25


def test_pair_sampling_is_seeded_reproducible_and_order_free():
    first = sample_training_pairs(RELEVANT, per_query=1, max_pairs=20, seed=3)
    shuffled = dict(sorted(RELEVANT.items(), reverse=True))
    assert sample_training_pairs(shuffled, per_query=1, max_pairs=20, seed=3) == first
    assert sample_training_pairs(RELEVANT, per_query=1, max_pairs=20, seed=4) != first
    assert first == sorted(first)


def test_pair_sampling_excludes_queries_and_refuses_an_empty_rule():
    exclude = {f"q{i}" for i in range(0, 40, 2)}
    pairs = sample_training_pairs(RELEVANT, per_query=3, max_pairs=0, seed=0, exclude=exclude)
    assert {q for q, _ in pairs} == set(RELEVANT) - exclude
    with pytest.raises(ValueError, match="leaves no training pair"):
        sample_training_pairs(RELEVANT, exclude=set(RELEVANT))
    with pytest.raises(ValueError, match="per_query"):
        sample_training_pairs(RELEVANT, per_query=0)


# --------------------------------------------------------------------------- dev split rule
def test_official_dev_split_and_disjoint_training_queries(tmp_path):
    root = write_beir(tmp_path / "nf", dev=True)
    prep = rb.prepare("nf", root, None, {"per_query": 2, "max_pairs": 0, "seed": 0})
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
    prep = rb.prepare("sf", root, 0.25, {"per_query": 5, "max_pairs": 0, "seed": 0})
    assert prep.dev_split == "train"
    dev = set(prep.split.dev_task.queries.values())
    assert len(dev) == round(0.25 * 38)  # 30 + 8 training queries (no dev file), a quarter held out
    assert not {a for a, _ in prep.split.train_pairs} & (dev | set(prep.split.task.queries.values()))


def test_no_dev_split_and_no_dev_fraction_is_refused(tmp_path):
    root = write_beir(tmp_path / "sf", dev=False)
    with pytest.raises(ValueError, match="no dev split.*--dev-fraction"):
        rb.prepare("sf", root, None, {"per_query": 2, "max_pairs": 0, "seed": 0})


def test_a_sampling_rule_with_no_pair_is_refused_before_any_model(tmp_path):
    root = write_beir(tmp_path / "nf", dev=True)
    with pytest.raises(ValueError, match="per_query"):
        rb.prepare("nf", root, None, {"per_query": 0, "max_pairs": 0, "seed": 0})


# --------------------------------------------------------------------------- shared negatives file
def test_negatives_file_from_another_corpus_or_model_is_refused(tmp_path, tiny_model):
    from st_hardneg.models import weights_digest

    first = rb.prepare("nf", write_beir(tmp_path / "a", dev=True, seed=0), None, rb.sampling())
    other = rb.prepare("nf", write_beir(tmp_path / "b", dev=True, seed=1), None, rb.sampling())
    cache = tmp_path / "cache"
    cache.mkdir()
    label = "top5_rel0.05"
    rows = [{"anchor": a, "positive": p, "negative": "n"} for a, p in first.split.train_pairs]
    (cache / f"negatives-nf-{label}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    key = rb.negatives_key(first, weights_digest(tiny_model), rb.MINING_CHOICES[label])
    (cache / f"negatives-nf-{label}.key.json").write_text(json.dumps(key))
    if len(rows) >= rb.PROTOCOL["batch_size"]:  # the same data and model: the file is reused as it is
        dataset, info = rb.shared_negatives(first, label, tiny_model, cache)
        assert dataset["anchor"] == [r["anchor"] for r in rows] and info["rows"] == len(rows)
    with pytest.raises(ValueError, match="mined from another corpus.*content hash"):
        rb.shared_negatives(other, label, tiny_model, cache)
    key["model"] = "0123456789ab"
    (cache / f"negatives-nf-{label}.key.json").write_text(json.dumps(key))
    with pytest.raises(ValueError, match="mined from another model"):
        rb.shared_negatives(first, label, tiny_model, cache)


def test_negatives_key_follows_the_settings(tmp_path):
    prep = rb.prepare("nf", write_beir(tmp_path / "a", dev=True), None, rb.sampling())
    one = rb.negatives_key(prep, "abc", rb.MINING_CHOICES["top5_rel0.05"])
    two = rb.negatives_key(prep, "abc", rb.MINING_CHOICES["skip10_rel0.05"])
    assert one["corpus"] == two["corpus"] and one["pairs"] == two["pairs"] and one["mining"] != two["mining"]


# --------------------------------------------------------------------------- paired data order
def rows_dataset(n: int = 120, seed: int = 0):
    from datasets import Dataset

    rng = random.Random(seed)
    return Dataset.from_dict({"anchor": [f"q{rng.randint(0, 50)}" for _ in range(n)],
                              "positive": [f"d{rng.randint(0, 200)}" for _ in range(n)],
                              "negative": [f"d{rng.randint(201, 400)}" for _ in range(n)]})


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_without_known_relevance_the_batches_are_sentence_transformers_no_duplicates(seed):
    from sentence_transformers.base.sampler import NoDuplicatesBatchSampler

    dataset = rows_dataset()
    theirs = list(NoDuplicatesBatchSampler(dataset, batch_size=8, drop_last=True, generator=torch.Generator(),
                                           seed=seed))
    ours = list(KnownRelevanceBatchSampler(dataset, batch_size=8, drop_last=True, generator=torch.Generator(),
                                           seed=seed))
    assert ours == theirs[:len(ours)] and len(ours) == len(theirs)


def test_known_relevance_batches_hold_no_relevant_document_of_another_row():
    dataset = rows_dataset()
    rng = random.Random(5)
    known = {f"q{i}": {f"d{rng.randint(0, 400)}" for _ in range(12)} for i in range(51)}
    sampler = KnownRelevanceBatchSampler(dataset, batch_size=8, drop_last=True, generator=torch.Generator(), seed=0,
                                         known_relevant=known)
    batches = list(sampler)
    assert len(batches) == len(dataset) // 8 and all(len(b) == 8 for b in batches)
    for batch in batches:
        texts = [t for i in batch for t in (dataset["anchor"][i], dataset["positive"][i], dataset["negative"][i])]
        assert len(texts) == len(set(texts))
        for i in batch:
            others = {t for j in batch if j != i for t in (dataset["positive"][j], dataset["negative"][j])}
            assert not others & known.get(dataset["anchor"][i], set())
    assert list(sampler) == batches  # the same seed and epoch: the same batches
    sampler.set_epoch(1)
    assert list(sampler) != batches


# --------------------------------------------------------------------------- scores, resume
def test_evaluation_is_graded_per_query_and_shares_the_corpus(tmp_path):
    from st_hardneg.models import load_model
    from st_hardneg.testing.fixtures import make_text_model_dir

    root = write_beir(tmp_path / "nf", dev=True)
    (root / "qrels" / "test.tsv").write_text((root / "qrels" / "test.tsv").read_text() + "Q31\tD1\t2\r\n")
    prep = rb.prepare("nf", root, None, rb.sampling())
    texts = [*prep.data.corpus.values(), *prep.data.queries.values()]
    model = load_model(make_text_model_dir(tmp_path / "model", texts), pooling="mean", max_seq_length=32,
                       device="cpu")
    means, per_query = rb.evaluate(model, prep, ("dev", "test"), batch_size=16)
    for role in ("dev", "test"):
        task = prep.split.dev_task if role == "dev" else prep.split.task
        assert set(per_query[role]) == set(task.queries) and means[role]["queries"] == len(task.queries)
        assert means[role]["ndcg@10"] == pytest.approx(statistics.fmean(per_query[role].values()), abs=1e-3)
        assert all(0.0 <= v <= 100.0 for v in per_query[role].values())
    assert prep.split.task.qrels["Q31"]["D1"] == 2  # the grade reaches the scorer


def test_resuming_under_another_protocol_is_refused(tmp_path):
    out = tmp_path / "r.json"
    out.write_text(json.dumps({"protocol": {**rb.protocol(), "batch_size": 64}, "runs": []}))
    with pytest.raises(ValueError, match="another protocol.*batch_size"):
        rb.load_results(out, rb.protocol())
    out.write_text(json.dumps({"protocol": rb.protocol(), "runs": []}))
    assert rb.load_results(out, rb.protocol())["runs"] == []


def test_report_is_rendered_from_the_json(tmp_path):
    runs = [{"stage": "main", "dataset": name, "method": method, "seed": seed, "dev": {"ndcg@10": 50.0 + seed},
             "test": {"ndcg@10": value + seed, "mrr@10": 1.0, "recall@100": 2.0}, "train_seconds": 10.0,
             "median_step_seconds": 0.5}
            for name in rb.DATASETS for method, value in (("mnrl", 40.0), ("recipe", 41.5)) for seed in range(3)]
    data = {"protocol": rb.protocol(), "runs": runs, "best_builtin": "mnrl"}
    text = rb.markdown(data)
    assert "| recipe | 42.50 ± 1.00 |" in text and "| gist | not run |" in text
    assert "| recipe − mnrl | scifact | +1.50 | [+1.50, +1.50] | 3 | yes |" in text
    assert "recipe vs mnrl on scifact: not run" in text  # no per-query file yet
    out = tmp_path / "r.json"
    rng = random.Random(0)
    queries = {f"q{i}": 100 * rng.random() for i in range(30)}
    per_query = [{"run": k, "dataset": name, "method": method, "seed": seed, "stage": "main",
                  "ndcg@10": {"test": {q: v + (2.0 if method == "recipe" else 0.0) for q, v in queries.items()}}}
                 for k, (name, method, seed) in enumerate((n, m, s) for n in rb.DATASETS for m in ("mnrl", "recipe")
                                                          for s in range(2))]
    out.with_name("r_per_query.jsonl").write_text("".join(json.dumps(r) + "\n" for r in per_query))
    rb.write_report(data, out)
    text = out.with_suffix(".md").read_text()
    assert text == rb.markdown(json.loads(out.read_text()), rb.per_query_runs(out.with_name("r_per_query.jsonl")))
    assert "recipe vs mnrl on scifact, nfcorpus, seeds 0, 1:" in text and "Holm over the 2 comparisons" in text
    assert "| scifact | recipe | mnrl | 30 |" in text and "+2.00" in text and "30 / 0 / 0" in text


def test_recipe_rows_differ_only_in_their_ingredient(tiny_model):
    import argparse

    rows = rb.recipe_methods("focal")
    assert rows["recipe"] == rb.CANDIDATES["focal"] and rows["recipe"].known_positives
    assert rows["recipe_no_known_relevance"] == rb.Method("focal", {})  # the same loss, nothing else changed
    assert rows["recipe_with_margin"].kwargs == rb.REL and rows["recipe_with_margin"].known_positives
    assert rows["recipe_known_relevance_batches"].known_relevance and not rows["recipe_known_relevance_batches"].known_positives
    known = {"a query": {"a document"}}
    args = argparse.Namespace(model=None)
    with_known = rb.build_loss(rows["recipe"], tiny_model, args, known)
    without = rb.build_loss(rows["recipe_no_known_relevance"], tiny_model, args, known)
    assert with_known.known_positives is not None and without.known_positives is None
    assert type(with_known) is type(without)


def test_command_refuses_a_folder_without_dev_split_before_any_model(tmp_path, monkeypatch):
    write_beir(tmp_path / "data" / "retrieval" / "nfcorpus", dev=False)
    monkeypatch.setattr(rb, "load_model", lambda *a, **k: pytest.fail("a model was loaded before the data check"))
    argv = ["--data-dir", str(tmp_path / "data"), "--datasets", "nfcorpus", "--out", str(tmp_path / "r.json"),
            "--cache-dir", str(tmp_path / "cache"), "--mining", "top5_rel0.05", "--recipe", "focal", "--plan", "mnrl:0"]
    with pytest.raises(ValueError, match="no dev split.*--dev-fraction"):
        rb.main(argv)
    monkeypatch.setattr(rb, "prepare", lambda name, root, fraction, sampling: pytest.skip(f"fraction {fraction}"))
    with pytest.raises(pytest.skip.Exception, match="fraction 0.25"):  # --dev-fraction reaches the split rule
        rb.main([*argv, "--dev-fraction", "0.25"])


def test_a_mining_setting_that_drops_most_pairs_is_refused(tmp_path, tiny_model):
    from st_hardneg.models import weights_digest

    prep = rb.prepare("nf", write_beir(tmp_path / "a", dev=True), None, rb.sampling())
    cache = tmp_path / "cache"
    cache.mkdir()
    label = "top5_rel0.05"
    kept = prep.split.train_pairs[: int(len(prep.split.train_pairs) * 0.4)]  # 40 % of the pairs kept a negative
    (cache / f"negatives-nf-{label}.jsonl").write_text(
        "".join(json.dumps({"anchor": a, "positive": p, "negative": "n"}) + "\n" for a, p in kept))
    key = rb.negatives_key(prep, weights_digest(tiny_model), rb.MINING_CHOICES[label])
    (cache / f"negatives-nf-{label}.key.json").write_text(json.dumps(key))
    with pytest.raises(ValueError, match=rf"kept {len(kept)} triplets of {len(prep.split.train_pairs)} pairs"):
        rb.shared_negatives(prep, label, tiny_model, cache)
    assert rb.DATASETS["nfcorpus"]["mining"] == "top50_nomargin" and "mining" not in rb.DATASETS["scifact"]


def test_candidate_rows_are_stored_under_what_they_train_with():
    assert rb.run_label("infonce_margin", "recipe") == "infonce_margin+known"
    assert rb.run_label("infonce_margin", "recipe_no_known_relevance") == "infonce_margin"
    assert rb.run_label("infonce_margin", "recipe_without_margin") == "infonce+known"
    assert rb.run_label("focal", "recipe_with_margin") == "focal_margin+known"
    assert rb.run_label("focal", "recipe_no_loss_term") == "infonce+known"
    rows = rb.all_rows()
    # one label, one configuration: a row shared by two candidates is the same Method under both
    for key in rb.CANDIDATES:
        for row, method in rb.recipe_methods(key).items():
            if rb.run_label(key, row) not in rb.BUILTIN:
                assert rows[rb.run_label(key, row)] == method, (key, row)
    # GIST's candidate without known relevance is the built-in GISTEmbedLoss row itself (the same rows, proven in
    # tests/losses/test_st_parity.py)
    assert rb.run_label("gist", "recipe_no_known_relevance") == "gist" and rows["gist"] == rb.BUILTIN["gist"]
    assert rows["gist+known"].guided and rows["gist+known"].kwargs == {"temperature": 0.01, **rb.REL}
    assert rows["gist_nomargin+known"].guided and rows["gist+known_batches"].guided
    assert rows["infonce+known"] == rb.Method("mnrl_queue", {"mask_duplicates": True}, known_positives=True)
    assert rows["infonce_margin"].kwargs == {"mask_duplicates": True, **rb.REL} and not rows["infonce_margin"].known_positives


def test_recipe_and_best_builtin_are_chosen_on_pooled_dev_of_both_datasets():
    def run(name, method, dev, seed=0):
        return {"stage": "main", "dataset": name, "method": method, "seed": seed, "dev": {"ndcg@10": dev}}

    runs = [run("scifact", "focal+known", 70.0), run("nfcorpus", "focal+known", 10.0),   # pooled 40
            run("scifact", "infonce+known", 60.0), run("nfcorpus", "infonce+known", 30.0),  # pooled 45
            run("scifact", "hncse_hnm+known", 90.0),  # one dataset only: not a choice
            run("scifact", "infonce_margin+known", 99.0, seed=1), run("nfcorpus", "infonce_margin+known", 99.0, seed=1),
            run("scifact", "mnrl", 65.0), run("nfcorpus", "mnrl", 26.0), run("scifact", "mnrl_pairs", 64.0),
            run("nfcorpus", "mnrl_pairs", 28.0)]
    data = {"runs": runs}
    rb.choose_rows(data)
    assert data["chosen_recipe"] == "infonce" and rb.recipe_label(data) == "infonce+known"
    assert data["best_builtin"] == "mnrl_pairs"  # 46.0 against 45.5
    assert "infonce+known 45.00" in data["recipe_choice"] and "hncse" not in data["recipe_choice"]
    fixed = {"runs": runs, "chosen_recipe": "focal", "recipe_choice": "fixed by --recipe"}
    rb.choose_rows(fixed)
    assert fixed["chosen_recipe"] == "focal"
    assert rb.display(data, "infonce+known") == "recipe = infonce+known" and rb.display(data, "mnrl") == "mnrl"


def test_choose_again_replaces_fixed_choices_only_when_every_candidate_and_builtin_ran():
    def run(name, method, dev, seed=0):
        return {"stage": "main", "dataset": name, "method": method, "seed": seed, "dev": {"ndcg@10": dev}}

    labels = [*rb.BUILTIN, *(rb.run_label(key, "recipe") for key in rb.CANDIDATES)]
    runs = [run(name, label, 10.0 + i) for i, label in enumerate(labels) for name in rb.DATASETS]
    runs += [run("scifact", "mnrl_hardness", 99.0, seed=1), run("nfcorpus", "gist+known", 5.0, seed=2)]  # not seed 0: no vote
    data = {"runs": runs, "chosen_recipe": "infonce_margin", "recipe_choice": "fixed by --recipe: the other file's",
            "best_builtin": "gist", "builtin_choice": "fixed by --builtin: the other file's"}
    rb.choose_again(data)
    # the last built-in and the last candidate have the highest pooled dev (10 + their index)
    assert data["best_builtin"] == labels[len(rb.BUILTIN) - 1] == "cached_mnrl_4x"
    assert data["chosen_recipe"] == list(rb.CANDIDATES)[-1] == "gist"
    assert data["recipe_choice"].startswith("chosen on pooled dev, seed 0, among focal+known 15.00")
    assert data["recipe_choice"].endswith("(--choose; before: infonce_margin, fixed by --recipe: the other file's)")
    assert data["builtin_choice"].endswith("(--choose; before: gist, fixed by --builtin: the other file's)")
    assert not rb.fixed_choice(data, "recipe_choice") and not rb.fixed_choice(data, "builtin_choice")
    once = dict(data)
    rb.choose_again(data)  # again: the same choices, the same texts (not a growing chain of "before")
    assert data == once
    partial = {"runs": [r for r in runs if not (r["dataset"] == "nfcorpus" and r["method"] == "hncse_hnm+known")
                        and not (r["method"] == "mnrl_pairs" and r["seed"] == 0)],
               "chosen_recipe": "infonce_margin", "recipe_choice": "fixed by --recipe"}
    with pytest.raises(ValueError, match="missing: mnrl_pairs on scifact, mnrl_pairs on nfcorpus, "
                                         "hncse_hnm\\+known on nfcorpus$"):
        rb.choose_again(partial)
    assert partial["chosen_recipe"] == "infonce_margin" and partial["recipe_choice"] == "fixed by --recipe"


@pytest.mark.parametrize("flags", [["--recipe", "focal"], ["--builtin", "gist"], ["--plan", "mnrl:0"]])
def test_choose_with_a_fixed_choice_or_a_plan_is_a_usage_error(tmp_path, capsys, flags):
    out = tmp_path / "r.json"
    out.write_text('{"runs": []}')
    with pytest.raises(SystemExit) as exit_info:
        rb.main(["--out", str(out), "--choose", *flags])
    assert exit_info.value.code == 2
    assert "--choose runs nothing and makes the choices itself" in capsys.readouterr().err
    assert out.read_text() == '{"runs": []}'


@pytest.mark.parametrize("flag", ["--choose", "--report"])
def test_choose_or_report_without_a_results_file_is_a_usage_error(tmp_path, capsys, flag):
    with pytest.raises(SystemExit) as exit_info:
        rb.main(["--out", str(tmp_path / "none.json"), flag])
    assert exit_info.value.code == 2
    assert f"there is none at {tmp_path / 'none.json'}" in capsys.readouterr().err
    assert not (tmp_path / "none.md").exists()


def test_an_unknown_plan_row_is_refused_before_any_run(tmp_path, monkeypatch):
    write_beir(tmp_path / "data" / "retrieval" / "nfcorpus", dev=True)
    monkeypatch.setattr(rb, "run_one", lambda *a, **k: pytest.fail("a run started"))
    argv = ["--data-dir", str(tmp_path / "data"), "--datasets", "nfcorpus", "--out", str(tmp_path / "r.json"),
            "--cache-dir", str(tmp_path / "cache"), "--mining", "top5_rel0.05", "--plan", "mnrl:0", "recipe:0"]
    with pytest.raises(ValueError, match="unknown row 'recipe' in --plan; rows: mnrl_pairs, mnrl"):
        rb.main(argv)


def test_a_replaced_imported_row_leaves_the_tables(tmp_path):
    import argparse

    args = argparse.Namespace(out=str(tmp_path / "r.json"), import_scifact=None, replace_imported=True,
                              budget_seconds=0)
    (tmp_path / "r.json").write_text(json.dumps({"protocol": rb.protocol(), "runs": [
        {"stage": "main", "dataset": "scifact", "method": "mnrl", "seed": 0, "source": "scifact.json",
         "dev": {"ndcg@10": 1.0}, "test": {"ndcg@10": 2.0, "mrr@10": 0.0, "recall@100": 0.0}}]}))
    runner = rb.Runner(args)
    assert not runner.done("main", "scifact", "mnrl", 0)  # an imported record does not count with the flag
    runner.append({"stage": "main", "dataset": "scifact", "method": "mnrl", "seed": 0, "dev": {"ndcg@10": 3.0},
                   "test": {"ndcg@10": 4.0, "mrr@10": 0.0, "recall@100": 0.0}}, {"test": {"q1": 4.0}})
    saved = json.loads((tmp_path / "r.json").read_text())
    assert [r["stage"] for r in saved["runs"]] == ["replaced", "main"] and runner.done("main", "scifact", "mnrl", 0)
    assert "| mnrl | 4.00 |" in rb.table(saved, "scifact")
    assert saved["runs"][1]["per_query"] == "r_per_query.jsonl#1"


def test_the_first_round_recipe_is_the_benchmark_choice():
    """The library's first-round recipe (``RETRIEVAL_RECIPE`` until the second round chose again) is the choice of the
    benchmark run on the negatives its mining screen chose (the protocol's: every row on the dev-chosen negatives),
    made there on pooled dev, and it mines as that run did."""
    from st_hardneg.training.protocol import check_mining
    from st_hardneg.training.recipe import FIRST_ROUND_RECIPE as RETRIEVAL_RECIPE  # noqa: N811 - as it was named

    committed = json.loads((rb.RESULTS / "retrieval_beir_screened.json").read_text())
    chosen = rb.CANDIDATES[committed["chosen_recipe"]]
    assert committed["recipe_choice"].startswith("chosen on pooled dev")
    assert set(committed["mining_by_dataset"].values()) == {committed["chosen_mining"]}
    # the settings that run named, and the library's defaults for the rest (known_as_positives came later: False)
    chosen_mining = rb.MINING_CHOICES[committed["chosen_mining"]]
    assert {key: RETRIEVAL_RECIPE["mining"][key] for key in chosen_mining} == chosen_mining
    assert check_mining(RETRIEVAL_RECIPE["mining"]) == check_mining(chosen_mining)
    assert (chosen.loss, chosen.kwargs, chosen.known_positives, chosen.guided) == (
        RETRIEVAL_RECIPE["loss"], RETRIEVAL_RECIPE["loss_kwargs"], RETRIEVAL_RECIPE["known_positives"],
        RETRIEVAL_RECIPE["guide"] == "untrained")
    assert {k: RETRIEVAL_RECIPE[k] for k in ("batch_size", "learning_rate", "warmup_ratio", "epochs")} == {
        k: rb.PROTOCOL[k] for k in ("batch_size", "learning_rate", "warmup_ratio", "epochs")}


def test_the_gist_candidate_is_gist_with_the_untrained_guide_and_known_relevance(tiny_model, monkeypatch):
    import argparse
    import copy

    guides = []
    monkeypatch.setattr(rb, "load_model", lambda args, length: guides.append(length) or copy.deepcopy(tiny_model))
    known = {"a query": {"a document"}}
    loss = rb.build_loss(rb.all_rows()["gist+known"], tiny_model, argparse.Namespace(model=None), known)
    assert guides == [rb.PROTOCOL["train_max_seq_length"]] and loss.guide is not None
    assert not any(p.requires_grad for p in loss.guide.parameters()) and not loss.guide.training
    assert (loss.temperature, loss.margin, loss.margin_strategy) == (0.01, 0.05, "relative")
    assert loss.contrast_anchors and loss.contrast_positives and loss.known_positives is not None
    assert all(p.requires_grad for p in tiny_model.parameters())  # the trained model is not the frozen guide


def test_each_loss_keeps_its_scifact_dev_chosen_row():
    """Each of the four losses keeps a row with its dev-chosen configuration, the best dev nDCG@10
    of its family in scifact_selection.json, under the label its imported SciFact rows have."""
    from benchmarks.methods import METHODS

    runs = json.loads((rb.RESULTS / "scifact_selection.json").read_text())["runs"]
    best: dict[str, tuple[float, str]] = {}
    for run in runs:
        family = METHODS[run["method"]].family
        if not METHODS[run["method"]].builtin:
            best[family] = max(best.get(family, (float("-inf"), "")), (run["dev"]["ndcg@10"], run["method"]))
    assert sorted(best) == ["adcse", "focal", "hncse", "mixcse"]
    imported = {label: source for source, label in rb.SCIFACT_IMPORT.items()}
    assert {imported[label] for label in rb.OURS} == {source for _, source in best.values()}
    every = rb.all_rows()
    for label, method in rb.OURS.items():
        source = METHODS[imported[label]]
        assert (method.loss, method.kwargs) == (source.loss, dict(source.options))
        assert not (method.builtin or method.known_positives or method.known_relevance or method.guided)
        assert every[label] == method
        assert label in rb.TABLE_ROWS


def test_the_figure_points_are_the_paired_per_query_differences_with_holm(monkeypatch):
    """plot_points: per dataset the mean over queries of (recipe - best built-in), each query's score averaged over
    the common seeds; with seeds common to both datasets the p-values are Holm-corrected across them."""
    rng = random.Random(3)
    per_query, expected = [], {}
    for name, shift in (("scifact", 2.0), ("nfcorpus", -0.5)):
        scores = {(label, seed): {f"q{i}": rng.uniform(0, 100) + (shift if label == "recipe_row" else 0.0)
                                  for i in range(40)} for label in ("recipe_row", "gist") for seed in (0, 1)}
        for (label, seed), values in scores.items():
            per_query.append({"dataset": name, "method": label, "seed": seed, "stage": "main",
                              "ndcg@10": {"test": values}})
        expected[name] = statistics.fmean(
            statistics.fmean(scores[("recipe_row", s)][q] for s in (0, 1))
            - statistics.fmean(scores[("gist", s)][q] for s in (0, 1)) for q in scores[("gist", 0)])
    data = {"best_builtin": "gist", "chosen_recipe": None, "runs": []}
    monkeypatch.setattr(rb_report, "recipe_label", lambda _data: "recipe_row")  # where the figure looks it up
    points = rb.plot_points(data, per_query)
    by = rb.per_query_by_row(per_query)
    for name in ("scifact", "nfcorpus"):
        assert points[name]["mean"] == pytest.approx(expected[name], abs=1e-9)
        assert points[name]["seeds"] == [0, 1] and points[name]["low"] < points[name]["mean"] < points[name]["high"]
        alone = rb.compare_rows(by, [name], [0, 1], "recipe_row", "gist").rows[0].p_randomization
        assert alone <= points[name]["p_holm"] <= min(1.0, 2 * alone) + 1e-12


def test_a_mining_screen_item_runs_mnrl_on_the_dev_task_under_its_own_setting(tmp_path, monkeypatch):
    write_beir(tmp_path / "data" / "retrieval" / "nfcorpus", dev=True)
    mined, ran = [], []
    monkeypatch.setattr(rb.Runner, "shared", lambda self, name, label: mined.append((name, label)))

    def fake_run_one(label, method, seed, prep, negatives, roles, args):
        ran.append((label, method, seed, roles))
        scores = {role: {"ndcg@10": 30.0, "mrr@10": 1.0, "recall@100": 2.0} for role in roles}
        return {"dataset": prep.name, "method": label, "seed": seed, "train_seconds": 1.0, **scores}, {}

    monkeypatch.setattr(rb, "run_one", fake_run_one)
    argv = ["--data-dir", str(tmp_path / "data"), "--datasets", "nfcorpus", "--out", str(tmp_path / "r.json"),
            "--cache-dir", str(tmp_path / "cache"), "--mining", "top5_rel0.05", "--skip-untrained",
            "--plan", "mnrl@top5_nomargin:0", "mnrl:0"]
    assert rb.main(argv) == 0
    # the screened setting, not NFCorpus's own (top50_nomargin), which the main row mines with
    assert mined == [("nfcorpus", "top5_nomargin"), ("nfcorpus", "top50_nomargin")]
    assert ran == [("mnrl@top5_nomargin", rb.BUILTIN["mnrl"], 0, ("dev",)), ("mnrl", rb.BUILTIN["mnrl"], 0,
                                                                            ("dev", "test"))]
    data = json.loads((tmp_path / "r.json").read_text())
    assert [(r["stage"], r["method"], r["mining"]) for r in data["runs"]] == [
        ("screen", "mnrl@top5_nomargin", "top5_nomargin"), ("main", "mnrl", "top50_nomargin")]
    with pytest.raises(ValueError, match=r"unknown row 'mnrl@top3' in --plan; .* or mnrl@<setting> \(the mining "
                                         r"screen\) with a setting of top5_rel0.05, skip10_rel0.05"):
        rb.main([*argv[:-3], "--plan", "mnrl@top3:0"])


def test_the_mining_screen_table_takes_each_datasets_dev_best_setting():
    refused = ("ValueError: mining nfcorpus with top5_rel0.05 kept 84 triplets of 768 pairs (fewer than 50% or one "
               "batch): ...")
    runs = [
        {"stage": "screen", "dataset": "scifact", "method": "mnrl@top5_nomargin", "seed": 0, "dev": {"ndcg@10": 66.0}},
        {"stage": "main", "dataset": "scifact", "method": "mnrl", "seed": 0, "mining": "top5_rel0.05",
         "dev": {"ndcg@10": 65.0}},
        {"stage": "main", "dataset": "scifact", "method": "mnrl", "seed": 1, "mining": "top5_rel0.05",
         "dev": {"ndcg@10": 99.0}},  # seed 1: not a screen entry
        {"stage": "main", "dataset": "scifact", "method": "gist", "seed": 0, "mining": "top5_rel0.05",
         "dev": {"ndcg@10": 98.0}},  # another loss: not a screen entry
        {"stage": "screen", "dataset": "nfcorpus", "method": "mnrl@top5_rel0.05", "seed": 0, "failed": refused},
        {"stage": "main", "dataset": "nfcorpus", "method": "mnrl", "seed": 0, "mining": "top50_nomargin",
         "dev": {"ndcg@10": 26.4}},
    ]
    data = {"runs": runs}
    assert rb.mining_screen(data) == {"scifact": {"top5_nomargin": 66.0, "top5_rel0.05": 65.0},
                                      "nfcorpus": {"top5_rel0.05": refused, "top50_nomargin": 26.4}}
    assert rb.mining_choice(data) == {"scifact": "top5_nomargin", "nfcorpus": "top50_nomargin"}
    assert rb.rows_mining(data, "scifact") == "top5_rel0.05"
    table = rb.mining_table(data)
    assert "| `top5_rel0.05` | 65.00 · rows | refused: kept 84 triplets of 768 pairs |" in table
    assert "| `top5_nomargin` | 66.00 (dev-best) | not run |" in table
    assert "| `top50_nomargin` | not run | 26.40 (dev-best) · rows |" in table
    assert "| `skip10_rel0.05` | not run | not run |" in table


def test_a_fixed_mining_setting_applies_to_every_dataset_and_is_its_own_protocol(tmp_path, monkeypatch):
    write_beir(tmp_path / "data" / "retrieval" / "nfcorpus", dev=True)
    mined = []
    monkeypatch.setattr(rb.Runner, "shared", lambda self, name, label: mined.append((name, label)))

    def fake_run_one(label, method, seed, prep, negatives, roles, args):
        scores = {role: {"ndcg@10": 30.0, "mrr@10": 1.0, "recall@100": 2.0} for role in roles}
        return {"dataset": prep.name, "method": label, "seed": seed, "train_seconds": 1.0, **scores}, {}

    monkeypatch.setattr(rb, "run_one", fake_run_one)
    out = tmp_path / "screened.json"
    argv = ["--data-dir", str(tmp_path / "data"), "--datasets", "nfcorpus", "--out", str(out),
            "--cache-dir", str(tmp_path / "cache"), "--skip-untrained", "--mining-all", "top5_nomargin",
            "--recipe", "infonce_margin", "--builtin", "gist", "--plan", "mnrl:0"]
    assert rb.main(argv) == 0
    # --mining-all overrides NFCorpus's own setting (top50_nomargin), which --mining keeps
    assert mined == [("nfcorpus", "top5_nomargin")]
    data = json.loads(out.read_text())
    assert [(r["method"], r["mining"]) for r in data["runs"]] == [("mnrl", "top5_nomargin")]
    assert data["mining_by_dataset"] == {"scifact": "top5_nomargin", "nfcorpus": "top5_nomargin"}
    # the built-in stays the fixed one although MNRL is the only built-in run (pooled dev would choose it)
    assert data["best_builtin"] == "gist" and data["builtin_choice"] == "fixed by --builtin"
    assert data["protocol"]["mining"].endswith("every dataset: top5_nomargin (fixed by --mining-all)")
    assert data["protocol"] == rb.protocol("top5_nomargin") != rb.protocol()
    # resuming the file without the flag (or with another setting) is another protocol: refused before any run
    monkeypatch.setattr(rb, "run_one", lambda *a, **k: pytest.fail("a run started"))
    with pytest.raises(ValueError, match="another protocol \\(changed: mining\\)"):
        rb.main([a for a in argv if a not in ("--mining-all", "top5_nomargin")])
    with pytest.raises(ValueError, match="another protocol \\(changed: mining\\)"):
        rb.main([*argv[:argv.index("--mining-all") + 1], "top50_nomargin", *argv[argv.index("--mining-all") + 2:]])


def test_a_rerun_file_tables_only_the_rows_it_reruns():
    def run(method, test, seed=0):
        return {"stage": "main", "dataset": "scifact", "method": method, "seed": seed, "dev": {"ndcg@10": 1.0},
                "test": {"ndcg@10": test, "mrr@10": 0.0, "recall@100": 0.0}}

    runs = [{**run("untrained", 60.0), "stage": "untrained", "seed": None}, run("mnrl", 61.0), run("gist", 62.0)]
    whole = rb.table({"runs": runs, "chosen_recipe": "infonce_margin"}, "scifact")
    assert "| mnrl_hardness | not run |" in whole and "| recipe = infonce_margin+known | not run |" in whole
    rerun = rb.table({"runs": runs, "chosen_recipe": "infonce_margin",
                      "rerun_rows": ["mnrl", "infonce_margin+known"]}, "scifact")
    labels = [line.split(" | ")[0].removeprefix("| ") for line in rerun.splitlines()[2:]]
    assert labels == ["untrained", "mnrl", "recipe = infonce_margin+known"]  # gist ran but is not a re-run row
    assert "| mnrl | 61.00 |" in rerun
    text = rb.markdown({"runs": runs, "chosen_recipe": "infonce_margin", "protocol": {}, "chosen_mining": "top5_nomargin",
                        "rerun_rows": ["mnrl", "infonce_margin+known"]})
    assert text.splitlines()[0].endswith(": re-run of `mnrl`, `infonce_margin+known` on the `top5_nomargin` negatives")
    assert "re-run" not in rb.markdown({"runs": runs, "protocol": {}}).splitlines()[0]
    every = rb.markdown({"runs": runs, "chosen_recipe": "infonce_margin", "protocol": {}, "chosen_mining": "top5_nomargin",
                         "rerun_rows": [label for label in rb.TABLE_ROWS if label != "untrained"]})
    assert every.splitlines()[0].endswith(": every row on the `top5_nomargin` negatives")
    one_seed = rb.markdown({"runs": [*runs, run("infonce_margin+known", 62.5)], "chosen_recipe": "infonce_margin",
                            "best_builtin": "gist", "protocol": {}})
    assert "| recipe − gist | scifact | +0.50 | – (one seed) | 1 | yes |" in one_seed  # no t interval from one seed


@pytest.mark.parametrize(("flags", "message"), [
    (["--mining-all", "top3"], "--mining-all: invalid choice: 'top3'"),
    (["--builtin", "focal"], "--builtin: invalid choice: 'focal'"),
    (["--mining", "top5_rel0.05", "--mining-all", "top5_nomargin"], "not allowed with argument --mining"),
])
def test_bad_mining_and_builtin_flags_are_usage_errors_before_any_run(tmp_path, monkeypatch, capsys, flags, message):
    monkeypatch.setattr(rb, "prepare", lambda *a, **k: pytest.fail("the data was read"))
    monkeypatch.setattr(rb, "run_one", lambda *a, **k: pytest.fail("a run started"))
    with pytest.raises(SystemExit) as exit_info:
        rb.main(["--out", str(tmp_path / "r.json"), *flags, "--plan", "mnrl:0"])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_every_table_row_says_what_it_is_in_the_matrix():
    def run(method, test):
        return {"stage": "main", "dataset": "nfcorpus", "method": method, "seed": 0, "dev": {"ndcg@10": 1.0},
                "test": {"ndcg@10": test, "mrr@10": 0.0, "recall@100": 0.0}}

    data = {"runs": [run("mnrl", 28.0), run("gist", 32.0), run("infonce_margin+known", 31.9),
                     run("infonce+known", 28.5), run("infonce_margin", 31.8), run("focal+known", 18.9),
                     run("infonce_margin+known_batches", 31.7), run("adcse", 30.0), run("focal_queue", 30.0)],
            "chosen_recipe": "infonce_margin", "best_builtin": "gist"}
    lines = rb.table(data, "nfcorpus").splitlines()
    assert lines[0].endswith("| median step s | role |")
    roles = {cells[0]: cells[-1] for cells in (line.strip("| ").split(" | ") for line in lines[2:])}
    assert roles["mnrl"] == "built-in" and roles["gist"] == "built-in, best on dev"
    assert roles["mnrl_hardness"] == "built-in"  # a row not run still says what it is
    assert roles["recipe = infonce_margin+known"] == "the recipe, chosen on dev"  # InfoNCE has no own term to drop
    assert roles["infonce+known"] == "recipe without its margin; recipe candidate (seed 0 chooses)"
    assert roles["infonce_margin"] == "recipe without known relevance"
    assert roles["infonce_margin+known_batches"] == "recipe, known relevance by the batches"
    assert roles["focal+known"] == "recipe candidate (seed 0 chooses)"
    assert roles["adcse"] == "loss row (SciFact-dev options)" and roles["focal_queue"] == "earlier SciFact row"
    assert roles["untrained"] == "published model"
    # with Focal the recipe, its plain row is both its ablation and the Focal loss row, and InfoNCE + known relevance
    # is what is left without Focal's own term
    focal = {**data, "chosen_recipe": "focal"}
    assert rb.row_role(focal, "focal") == "recipe without known relevance; loss row (SciFact-dev options)"
    assert rb.row_role(focal, "infonce+known") == ("recipe without its loss's own term; "
                                                  "recipe candidate (seed 0 chooses)")
    assert rb.row_role(focal, "infonce_margin+known_batches") == "–"  # the margin recipe's ablation, not Focal's
    fixed = {**data, "recipe_choice": "fixed by --recipe: ...", "builtin_choice": "fixed by --builtin: ..."}
    assert rb.row_role(fixed, "infonce_margin+known") == "the recipe, fixed by --recipe"  # a re-run file's rows
    assert rb.row_role(fixed, "gist") == "built-in, fixed by --builtin"
