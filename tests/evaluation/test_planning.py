"""The eval.json planning: the record checked as input, results keyed by the weights, revision and data content,
--overwrite of one task keeping the others."""

from __future__ import annotations

import json
import re

import pytest

from st_hardneg.evaluation.planning import (
    EvalRecordError,
    eval_settings,
    merge_mteb,
    merged_settings,
    plan_eval,
    read_eval_record,
    senteval_digest,
)

MODULES = "Transformer(BertModel, 48 tokens) -> Pooling(mean)"


def _settings(groups=("beir",), *, weights="w1", revision="weights-w1", digests=("d-a", "d-b"), **kwargs):
    beir = [(f"{name}-test", f"/data/{name}", digest, "test") for name, digest in zip("ab", digests, strict=True)]
    return eval_settings(list(groups), modules=MODULES, weights=weights, revision=revision, senteval_dir="/senteval",
                         sts_digest="s1", max_seq_length=48, beir=beir, mteb=[("a-test-local", "local-d-a")],
                         **kwargs)


def _record(settings, **extra):
    record = {"settings": settings, "files": {"per_query": "per_query.tsv", "runs": {}}, "seconds": 1.5}
    if "beir" in settings:
        record["beir"] = {task: {"ndcg@10": 10.0, "queries": 3} for task in settings["beir"]}
    if "mteb" in settings:
        record["mteb"] = {"scores": {task: 20.0 for task in settings["mteb"]},
                          "main_score": {task: "ndcg_at_10" for task in settings["mteb"]}, "avg": 20.0}
    if "sts" in settings:
        record["sts"] = {"STSBenchmark": 70.0}
    return {**record, **extra}


def test_a_record_with_the_same_settings_is_skipped_and_a_missing_task_computed():
    before = _settings(digests=("d-a", "d-b"))
    before["beir"].pop("b-test")
    plan = plan_eval(_record(before), _settings(), "eval.json")
    assert plan.skipped == ["beir a-test"] and plan.groups == ["beir"] and plan.beir == {"b-test"}
    assert plan_eval({}, _settings(("sts", "beir")), "eval.json").groups == ["sts", "beir"]


@pytest.mark.parametrize(("change", "differs"), [
    ({"digests": ("d-a2", "d-b")}, "data_digest 'd-a', now 'd-a2'"),  # the folder's files changed, same path
    ({"revision": "v2"}, "revision 'weights-w1', now 'v2'"),  # another --revision into the same record
    ({"weights": "w2", "revision": "weights-w1"}, "weights 'w1', now 'w2'"),  # other weights, same revision
])
def test_a_result_computed_on_other_data_weights_or_revision_is_never_reused(change, differs):
    record = _record(_settings())
    with pytest.raises(ValueError, match=rf"eval\.json exists and holds beir a-test with other settings \(.*"
                                         rf"{differs}.*pass --overwrite"):
        plan_eval(record, _settings(**change), "eval.json")


def test_overwrite_of_one_task_keeps_the_others():
    record = _record(_settings(("sts", "beir")))
    wanted = _settings(("beir",))
    wanted["beir"].pop("b-test")
    plan = plan_eval(record, wanted, "eval.json", overwrite=True)
    assert plan.groups == ["beir"] and plan.beir == {"a-test"} and plan.skipped == [] and plan.dropped == []
    assert set(plan.record["beir"]) == {"a-test", "b-test"} and plan.record["sts"] == {"STSBenchmark": 70.0}
    merged = merged_settings(plan.record, wanted)
    assert set(merged["beir"]) == {"a-test", "b-test"} and "sts" in merged


def test_results_of_other_weights_are_refused_or_dropped_with_overwrite():
    record = _record(_settings(("sts", "beir")))
    other = _settings(("sts",), weights="w2", revision="v1")
    with pytest.raises(ValueError, match=r"beir a-test computed with other weights \(w1, now w2\)"):
        plan_eval(record, other, "eval.json")
    plan = plan_eval(record, other, "eval.json", overwrite=True)
    assert plan.groups == ["sts"] and sorted(plan.dropped) == ["beir a-test", "beir b-test"]
    assert plan.record["beir"] == {} and plan.record["settings"]["beir"] == {}


def test_an_older_record_without_settings_is_refused_but_its_other_groups_stay():
    record = _record(_settings(("sts", "beir")))
    del record["settings"]
    with pytest.raises(ValueError, match="beir a-test without its settings"):
        plan_eval(record, _settings(), "eval.json")
    plan = plan_eval(record, _settings(("mteb",)), "eval.json")  # nothing of the older record is asked for
    assert plan.groups == ["mteb"] and "sts" in plan.record


def test_mteb_tasks_are_planned_one_by_one_and_merged():
    record = _record(_settings(("mteb",)))
    wanted = eval_settings(["mteb"], modules=MODULES, weights="w1", revision="weights-w1", senteval_dir="/senteval",
                           max_seq_length=48, mteb=[("a-test-local", "local-d-a"), ("STSBenchmark-local", "local-s")])
    plan = plan_eval(record, wanted, "eval.json")
    assert plan.skipped == ["mteb a-test-local"] and plan.mteb == {"STSBenchmark-local"}
    changed = eval_settings(["mteb"], modules=MODULES, weights="w1", revision="weights-w1", senteval_dir="/senteval",
                            max_seq_length=48, mteb=[("a-test-local", "local-d-a2")])
    with pytest.raises(ValueError, match="mteb a-test-local with other settings .*dataset_revision"):
        plan_eval(record, changed, "eval.json")
    merged = merge_mteb(record["mteb"], {"scores": {"STSBenchmark-local": 80.0},
                                         "main_score": {"STSBenchmark-local": "cosine_spearman"}, "avg": 80.0})
    assert merged["scores"] == {"a-test-local": 20.0, "STSBenchmark-local": 80.0} and merged["avg"] == 50.0


@pytest.mark.parametrize(("edit", "key"), [
    ({"files": ["per_query.tsv"]}, "'files' must be a mapping of file names, got list"),
    ({"files": {"per_query": "../outside.tsv"}}, "'files.per_query' must name a file in the record's own folder"),
    ({"files": {"per_query": "/tmp/outside.tsv"}}, "'files.per_query' must name a file in the record's own folder"),
    ({"files": {"per_query": 3}}, "'files.per_query' must name a file beside it, got 3"),
    ({"files": {"runs": {"a-test": "sub/a.trec"}}}, "'files.runs.a-test' must name a file in the record's own"),
    ({"files": {"runs": ["a.trec"]}}, "'files.runs' must map task names to TREC run files, got list"),
    ({"seconds": "12"}, "'seconds' must be a number of seconds >= 0, got '12'"),
    ({"seconds": float("nan")}, "'seconds' must be a number of seconds >= 0, got nan"),
    ({"seconds": True}, "'seconds' must be a number of seconds >= 0, got True"),
    ({"settings": []}, "'settings' must be a mapping, got list"),
    ({"settings": {"beir": "x"}}, "'settings.beir' must be a mapping, got str"),
    ({"beir": {"a-test": {"ndcg@10": "high"}}}, "'beir.a-test.ndcg@10' must be a finite number, got 'high'"),
    ({"beir": ["a-test"]}, "'beir' must be a mapping of results, got list"),
    ({"mteb": {"scores": {"a": None}}}, "'mteb.scores.a' must be a finite number, got None"),
])
def test_a_record_of_the_wrong_shape_is_one_error_naming_the_file_and_the_key(tmp_path, edit, key):
    path = tmp_path / "eval.json"
    path.write_text(json.dumps({**_record(_settings()), **edit}))
    with pytest.raises(EvalRecordError, match=rf"^{path}: {key}") as caught:
        read_eval_record(path)
    assert "pass --overwrite" in str(caught.value) and len(str(caught.value).splitlines()) == 1


def test_a_record_that_is_not_a_json_object_is_named(tmp_path):
    path = tmp_path / "eval.json"
    for raw, message in ((b"[1, 2]", "holds no eval.json object (a JSON list)"), (b"{not json", "not JSON"),
                         (b'{"model": "caf\xe9"}', "not UTF-8 text")):
        path.write_bytes(raw)
        with pytest.raises(EvalRecordError, match=re.escape(message)):
            read_eval_record(path)
    path.write_text(json.dumps(_record(_settings())))
    assert read_eval_record(path)["seconds"] == 1.5


def test_the_senteval_digest_follows_the_contents(tmp_path):
    (tmp_path / "STS").mkdir()
    file = tmp_path / "STS" / "a.txt"
    file.write_text("one")
    first = senteval_digest(tmp_path, ["STS/a.txt"])
    file.write_text("two")
    assert senteval_digest(tmp_path, ["STS/a.txt"]) != first and len(first or "") == 12
    assert senteval_digest(tmp_path, ["STS/missing.txt"]) is None and senteval_digest(None, ["STS/a.txt"]) is None
