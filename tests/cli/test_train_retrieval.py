"""``st-hardneg train --task retrieval``: per-task defaults, the mined-set cache, the user's own training file, the
scores written to results.json, and one clear error for each bad input."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from st_hardneg import cli
from st_hardneg.cli.checks import resolve_train_args
from st_hardneg.data.mrpc import MRPC_HEADER
from st_hardneg.training.protocol import DEFAULT_CACHE_DIR, TRAINING

ADJECTIVES = ("red", "blue", "green", "old", "new", "big")
NOUNS = ("cat", "dog", "car", "house", "tree", "boat", "bird", "lamp")
VERBS = ("sleeps", "waits", "moves", "shines")
COMBOS = list(itertools.product(ADJECTIVES, NOUNS, VERBS))  # 192 distinct (adjective, noun, verb)
# (label, id1, id2, sentence 1, sentence 2): 40 train paraphrase pairs + 8 non-paraphrases, 12 + 4 test pairs
TRAIN = [(1, str(1000 + 2 * i), str(1001 + 2 * i), f"the {a} {n} {v} .", f"a {a} {n} {v} today .")
         for i, (a, n, v) in enumerate(COMBOS[:40])]
TRAIN += [(0, str(1100 + 2 * i), str(1101 + 2 * i), f"the {a} {n} {v} .", f"the {n} is not {a} .")
          for i, (a, n, v) in enumerate(COMBOS[40:48])]
TEST = [(1, str(2000 + 2 * i), str(2001 + 2 * i), f"the {a} {n} {v} .", f"one {a} {n} really {v} .")
        for i, (a, n, v) in enumerate(COMBOS[60:72])]
TEST += [(0, str(2100 + 2 * i), str(2101 + 2 * i), f"the {a} {n} {v} .", f"no {a} {n} ever {v} .")
         for i, (a, n, v) in enumerate(COMBOS[72:76])]
# the user's own triplets: every text distinct, so no-duplicate batching keeps rows // batch batches
OWN = [{"anchor": f"my {a} {n} {v} .", "positive": f"your {a} {n} {v} .", "negative": f"his {a} {n} never {v} ."}
       for a, n, v in COMBOS[100:140]]
METRICS = ("ndcg@10", "mrr@10", "recall@1", "recall@10", "accuracy@1", "map@100")


@pytest.fixture(scope="module")
def mrpc_dir(tmp_path_factory) -> Path:
    """A small MRPC in the SentEval layout (``<dir>/senteval/MRPC``), without STS data: runs use ``--no-sts``."""
    root = tmp_path_factory.mktemp("mini-mrpc")
    folder = root / "senteval" / "MRPC"
    folder.mkdir(parents=True)
    for name, rows in (("train", TRAIN), ("test", TEST)):
        lines = ["\t".join(MRPC_HEADER)] + ["\t".join(map(str, row)) for row in rows]
        (folder / f"msr_paraphrase_{name}.txt").write_text("\n".join(lines) + "\n", encoding="utf8")
    return root


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A tiny random BERT whose vocabulary spells every test text word by word (distinct texts, distinct vectors)."""
    from st_hardneg.testing import make_text_model_dir

    texts = [f"{row[3]} {row[4]}" for row in (*TRAIN, *TEST)] + [" ".join(row.values()) for row in OWN]
    return make_text_model_dir(tmp_path_factory.mktemp("tiny-text-bert"), texts)


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _argv(out: Path, data_dir: Path, model_dir: Path, *extra: str) -> list[str]:
    return ["train", "--task", "retrieval", "--model", str(model_dir), "--data-dir", str(data_dir), "--output-dir",
            str(out), "--quiet", "--no-sts", *extra]


def _resolved(*argv: str):
    return resolve_train_args(cli.build_parser().parse_args(["train", *argv]))


# --------------------------------------------------------------------------- defaults per task
def test_defaults_resolve_per_task_and_explicit_options_win():
    sts = _resolved()
    assert (sts.task, sts.pooling, sts.max_seq_length, sts.batch_size, sts.lr, sts.warmup_ratio, sts.epochs,
            sts.eval_steps, sts.cache_dir) == ("sts", "cls", 32, 64, 3e-5, 0.0, 1.0, 50, None)
    retrieval = _resolved("--task", "retrieval")
    assert (retrieval.pooling, retrieval.max_seq_length, retrieval.batch_size, retrieval.lr, retrieval.warmup_ratio,
            retrieval.epochs) == (TRAINING["pooling"], TRAINING["max_seq_length"], TRAINING["batch_size"],
                                  TRAINING["learning_rate"], TRAINING["warmup_ratio"], TRAINING["epochs"])
    assert (retrieval.pooling, retrieval.max_seq_length, retrieval.lr, retrieval.warmup_ratio) == ("mean", 128, 2e-5,
                                                                                                  0.1)
    assert retrieval.eval_steps == 0 and retrieval.cache_dir == str(DEFAULT_CACHE_DIR) and not retrieval.no_sts
    # explicit values win, falsy ones included (--warmup-ratio 0 is not replaced by the recipe's 0.1)
    explicit = _resolved("--task", "retrieval", "--lr", "5e-5", "--warmup-ratio", "0", "--pooling", "cls",
                         "--max-seq-length", "64", "--batch-size", "16", "--epochs", "2")
    assert (explicit.lr, explicit.warmup_ratio, explicit.pooling, explicit.max_seq_length, explicit.batch_size,
            explicit.epochs) == (5e-5, 0.0, "cls", 64, 16, 2.0)
    assert _resolved("--lr", "1e-4", "--eval-steps", "7").lr == 1e-4  # sts: the same options keep working


def test_resolving_the_retrieval_task_imports_no_heavy_module():
    code = ("import sys, st_hardneg.cli as c, st_hardneg.cli.checks as t; "
            "t.resolve_train_args(c.build_parser().parse_args(['train', '--task', "
            "'retrieval'])); print(','.join(m for m in ('torch', 'transformers', 'sentence_transformers', 'datasets') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == ""


def test_resolved_options_reach_the_trainer(monkeypatch, mrpc_dir, model_dir, tmp_path):
    """The TrainConfig, the model and the rows the Trainer receives (training itself is stopped before it starts)."""
    from st_hardneg.training import loop as training

    seen = {}

    class _Stop(Exception):
        pass

    def fake_train(model, dataset, loss, config, evaluator=None, callbacks=None):
        seen.update(model=model, dataset=dataset, config=config, evaluator=evaluator, loss=loss)
        raise _Stop

    monkeypatch.setattr(training, "train", fake_train)
    own = _write_jsonl(tmp_path / "own.jsonl", OWN)
    argv = _argv(tmp_path / "out", mrpc_dir, model_dir, "--train-file", str(own), "--batch-size", "8",
                 "--loss", "focal", "--loss-arg", "margin=0.05", "--loss-arg",
                 "margin_strategy=relative")
    with pytest.raises(_Stop):
        cli.main(argv)
    config, model = seen["config"], seen["model"]
    assert (config.learning_rate, config.warmup_ratio, config.batch_size, config.epochs) == (2e-5, 0.1, 8, 1)
    assert config.eval_steps == 0 and not config.save_checkpoints and seen["evaluator"] is None
    assert model.max_seq_length == 128 and model[1].get_config_dict()["pooling_mode"] == "mean"
    assert seen["dataset"].to_dict() == {key: [row[key] for row in OWN] for key in ("anchor", "positive", "negative")}
    assert seen["loss"].margin == 0.05 and seen["loss"].margin_strategy == "relative"
    with pytest.raises(_Stop):
        cli.main([*argv, "--lr", "5e-5", "--max-seq-length", "48"])
    assert seen["config"].learning_rate == 5e-5 and seen["model"].max_seq_length == 48


# --------------------------------------------------------------------------- mined triplets, cache, scores
def test_mined_set_is_cached_once_and_reused(monkeypatch, mrpc_dir, model_dir, tmp_path):
    from st_hardneg.data import mining

    calls = []
    real = mining.mine_training_negatives
    monkeypatch.setattr(mining, "mine_training_negatives", lambda *a, **k: calls.append(1) or real(*a, **k))
    cache = tmp_path / "cache"
    argv = _argv(tmp_path / "out", mrpc_dir, model_dir, "--cache-dir", str(cache), "--batch-size", "8",
                 "--max-steps", "1", "--mining-arg", "relative_margin=None", "--loss", "mnrl")
    assert cli.main(argv) == 0
    files = list(cache.glob("mrpc-mined-*.json"))
    assert len(files) == 1 and len(calls) == 1
    mtime = files[0].stat().st_mtime_ns
    first = json.loads((tmp_path / "out" / "results.json").read_text())
    info = first["training_data"]
    assert info["cache_file"] == str(files[0]) and info["pairs"] == 40 and 8 <= info["triplets"] <= 40
    assert info["mining"]["relative_margin"] is None and first["steps"] == 1
    stored = json.loads(files[0].read_text())
    assert len(stored["columns"]["negative"]) == info["triplets"]

    refused = cli.main(argv)  # a finished run in the output folder is never overwritten silently
    assert refused == 2 and json.loads((tmp_path / "out" / "results.json").read_text()) == first
    argv = [*argv, "--overwrite"]
    assert cli.main(argv) == 0  # the same settings: read from the cache, not mined again
    assert len(calls) == 1 and list(cache.glob("mrpc-mined-*.json")) == files
    assert files[0].stat().st_mtime_ns == mtime
    assert json.loads((tmp_path / "out" / "results.json").read_text())["training_data"]["cache_file"] == str(files[0])

    assert cli.main([*argv, "--limit", "24"]) == 0  # another key (the first 24 pairs): mined into a second file
    assert len(calls) == 2 and len(list(cache.glob("mrpc-mined-*.json"))) == 2
    assert json.loads((tmp_path / "out" / "results.json").read_text())["training_data"]["pairs"] == 24


def test_results_equal_evaluate_retrieval_of_the_saved_model(mrpc_dir, model_dir, tmp_path, capsys):
    from sentence_transformers import SentenceTransformer

    from st_hardneg.evaluation import evaluate_retrieval
    from st_hardneg.models import load_model

    out = tmp_path / "out"
    assert cli.main(_argv(out, mrpc_dir, model_dir, "--cache-dir", str(tmp_path / "cache"), "--batch-size", "8",
                          "--max-steps", "2", "--mining-arg", "relative_margin=None", "--loss", "focal",
                          "--loss-arg", "m=0.2")) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["task"] == "retrieval" and results["steps"] == 2 and results["planned_steps"] == 2
    assert results["sts"] is None and results["pooling"] == "mean" and results["loss_config"]["m"] == 0.2
    final = SentenceTransformer(str(out / "final"), device="cpu")
    assert final.max_seq_length == 128 and final[1].get_config_dict()["pooling_mode"] == "mean"
    untrained = load_model(model_dir, pooling="mean", max_seq_length=128, device="cpu")
    texts = [TEST[0][3], TEST[0][4]]
    assert abs(final.encode(texts) - untrained.encode(texts)).max() > 1e-4  # the saved model is the trained one
    recomputed = evaluate_retrieval(final, mrpc_dir)
    assert recomputed["queries"] == results["retrieval"]["queries"] == 12
    for metric in METRICS:
        assert results["retrieval"][metric] == pytest.approx(recomputed[metric], abs=1e-6), metric
    printed = capsys.readouterr().out
    row = (f"| focal | {recomputed['ndcg@10']:.2f} | {recomputed['mrr@10']:.2f} | {recomputed['recall@1']:.2f} "
           "| – |")
    assert "| model | nDCG@10 | MRR@10 | R@1 | STS avg |" in printed and row in printed
    assert "train time:" in printed and f"model: {out / 'final'}" in printed
    assert not (out / "checkpoints").exists()  # no selection, no checkpoints kept


# --------------------------------------------------------------------------- the user's own training file
@pytest.mark.parametrize(("limit", "steps"), [(None, 5), ("24", 3)])
def test_train_file_rows_are_the_training_data(mrpc_dir, model_dir, tmp_path, limit, steps):
    own = _write_jsonl(tmp_path / "own.jsonl", OWN)  # 40 rows, batch 8, 1 epoch
    extra = ["--limit", limit] if limit else []
    out = tmp_path / "out"
    assert cli.main(_argv(out, mrpc_dir, model_dir, "--train-file", str(own), "--batch-size", "8", "--loss", "mnrl",
                          *extra)) == 0
    results = json.loads((out / "results.json").read_text())
    rows = int(limit) if limit else len(OWN)
    assert results["planned_steps"] == results["steps"] == rows // 8 == steps
    info = results["training_data"]
    assert info == {"source": "file", "file": str(own), "rows": rows, "columns": ["anchor", "positive", "negative"],
                    "limit": int(limit or 0), "test_task_overlap": 0}


def test_training_file_formats_read_alike(tmp_path):
    from st_hardneg.training.protocol import read_training_file

    keys = ("anchor", "positive", "negative")
    _write_jsonl(tmp_path / "t.jsonl", OWN[:6])
    (tmp_path / "t.json").write_text(json.dumps(OWN[:6]))
    for suffix, sep in ((".csv", ","), (".tsv", "\t")):
        lines = [sep.join(keys)] + [sep.join(row[k] for k in keys) for row in OWN[:6]]
        (tmp_path / f"t{suffix}").write_text("\n".join(lines) + "\n")
    expected = {key: [row[key] for row in OWN[:6]] for key in keys}
    for suffix in (".jsonl", ".json", ".csv", ".tsv"):
        dataset, info = read_training_file(tmp_path / f"t{suffix}", min_rows=6)
        assert dataset.to_dict() == expected and info["rows"] == 6, suffix
    two = read_training_file(tmp_path / "t.jsonl", limit=2)[0]
    assert two.to_dict() == {key: values[:2] for key, values in expected.items()}


# --------------------------------------------------------------------------- bad inputs
BAD_FILES = {
    "missing": (None, "does not exist"),
    "own.txt": ("anchor\tpositive\n", "unknown extension '.txt'; use one of .jsonl, .json, .csv, .tsv"),
    "empty.jsonl": ("\n\n", "is empty"),
    "one_column.jsonl": ("".join(json.dumps({"anchor": f"my text {i}"}) + "\n" for i in range(10)),
                         "has 1 column(s) ['anchor']; need at least 2"),
    "empty_row.jsonl": ("".join(json.dumps({"anchor": f"a {i}", "positive": "" if i == 1 else f"p {i}"}) + "\n"
                                for i in range(10)), "row 2, column 'positive' is empty"),
    "null_row.csv": ("anchor,positive\n" + "".join(f"a {i},p {i}\n" for i in range(4)) + ",\n" +
                     "".join(f"a {i},p {i}\n" for i in range(4, 9)), "row 5, column 'anchor' is empty"),
    "small.jsonl": ("".join(json.dumps(row) + "\n" for row in OWN[:3]), "has 3 row(s), fewer than one batch (8)"),
    "numbers.csv": ("anchor,positive\n" + "".join(f"{i},{i + 1}\n" for i in range(10)),
                    "column 'anchor' holds int64 values; every column must be text"),
    "labels.jsonl": ("".join(json.dumps({"anchor": "a", "positive": "b", "label": "x"}) + "\n" for _ in range(10)),
                     "column 'label' is a label column; every column must be text"),
    "broken.jsonl": ('{"anchor": "a", "positive": \n', "cannot be read as jsonl"),
}


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_bad_train_file_is_one_line_exit_2(name, mrpc_dir, model_dir, tmp_path, capsys):
    body, fragment = BAD_FILES[name]
    path = tmp_path / name
    if body is not None:
        path.write_text(body)
    out = tmp_path / "out"
    assert cli.main(_argv(out, mrpc_dir, model_dir, "--train-file", str(path), "--batch-size", "8")) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"st-hardneg train: error: training file {path}") and fragment in err, err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


BAD_OPTIONS = [
    (["--task", "retrieval", "--corpus", "c.txt"], "--task retrieval trains on (anchor, positive[, negative ...]) "
                                                   "rows: use --train-file FILE"),
    (["--train-file", "t.jsonl"], "--train-file is for --task retrieval; --task sts trains on sentences: use --corpus"),
    (["--task", "retrieval", "--eval-steps", "10"], "--eval-steps (STS-B dev selection) is for --task sts"),
    (["--no-sts"], "--no-sts applies to --task retrieval only"),
    (["--cache-dir", "x"], "--cache-dir applies to --task retrieval only"),
    (["--mining-arg", "relative_margin=None"], "--mining-arg applies to --task retrieval only"),
    (["--task", "retrieval", "--train-file", "t.jsonl", "--mining-arg", "relative_margin=0.1"],
     "--train-file trains on your rows as they are"),
    (["--task", "retrieval", "--mining-arg", "relative_margin"], "--mining-arg expects KEY=VALUE, got 'relative_"),
    (["--task", "retrieval", "--mining-arg", "margin=0.1"], "unknown mining setting(s) ['margin']; choose from"),
    (["--task", "retrieval", "--mining-arg", "num_candidates=0"], "--mining-arg num_candidates must be an integer >= 1"),
    (["--task", "retrieval", "--mining-arg", "relative_margin=2"],
     "--mining-arg relative_margin (None: no margin) must be a finite number in [0, 1), got 2"),
    (["--task", "retrieval", "--mining-arg", "known_as_positives=yes"],
     "--mining-arg known_as_positives must be True or False, got 'yes'"),
    (["--task", "beir", "--data", "b", "--loss", "recipe", "--mining-arg", "range_min=3", "--mining-arg", "range_max=3"],
     "--mining-arg: range_max - range_min must leave at least num_candidates=1 candidates, got range_min=3, "
     "range_max=3"),
    (["--task", "retrieval", "--batch-size", "0"], "--batch-size must be >= 1, got 0"),
    (["--task", "retrieval", "--max-steps", "0"], "--max-steps must be a positive number of steps"),
    (["--task", "retrieval", "--warmup-ratio", "1"], "--warmup-ratio must be in [0, 1) (a share of the steps), got 1.0"),
    (["--warmup-ratio", "-0.1"], "--warmup-ratio must be in [0, 1)"),
    (["--task", "retrieval", "--lr", "0"], "--lr must be > 0, got 0.0"),
    (["--lr", "nan"], "--lr must be > 0, got nan"),
    (["--task", "retrieval", "--epochs", "0"], "--epochs must be > 0, got 0.0"),
    (["--loss", "recipe"], "--loss recipe is the BEIR retrieval recipe, which masks a folder's training qrels as known "
                           "positives: use it with --task beir --data FOLDER"),
    (["--task", "retrieval", "--loss", "recipe"], "--loss recipe is the BEIR retrieval recipe"),
    (["--task", "beir", "--data", "b", "--loss", "recipe", "--loss-arg", "known_positives=x"],
     "--loss-arg: the recipe sets known_positives itself"),
    (["--task", "beir", "--data", "b", "--loss", "recipe", "--loss-arg", "margn=0.1"],
     "--loss-arg: loss 'adcse' takes no argument margn (did you mean margin?)"),
    (["--task", "beir", "--data", "b", "--loss", "recipe", "--loss-arg", "num_adversaries=-1"], "num_adversaries"),
    (["--control"], "--control masks a BEIR folder's training qrels as known positives: use it with --task beir"),
    (["--task", "retrieval", "--control"], "--control masks a BEIR folder's training qrels"),
    (["--task", "beir", "--data", "b", "--loss", "recipe", "--control"],
     "--loss recipe has the false-negative control already"),
    (["--task", "beir", "--data", "b", "--loss", "mnrl", "--control"],
     "'mnrl' is sentence-transformers' own loss, which takes neither: use mnrl_queue"),
    (["--task", "beir", "--data", "b", "--loss", "focal", "--control", "--loss-arg", "guide=x"],
     "--loss-arg: the false-negative control sets guide itself"),
    (["--task", "beir", "--data", "b", "--loss", "focal", "--control", "--loss-arg", "margn=0.1"],
     "--loss-arg: loss 'focal' takes no argument margn (did you mean margin?)"),
    (["--task", "beir", "--data", "b", "--loss", "focal", "--control", "--loss-arg", "margin=-1"],
     "margin"),
]


@pytest.mark.parametrize(("extra", "fragment"), BAD_OPTIONS)
def test_bad_options_are_one_line_exit_2(extra, fragment, mrpc_dir, model_dir, tmp_path, capsys):
    out, cache = tmp_path / "out", tmp_path / "cache"
    argv = ["train", "--model", str(model_dir), "--data-dir", str(mrpc_dir), "--output-dir", str(out), "--quiet",
            *extra]
    if "retrieval" in extra and "--train-file" not in extra:
        argv += ["--cache-dir", str(cache), "--no-sts"]  # never the user's cache; the mini MRPC has no STS data
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("st-hardneg train: error: ") and fragment in err, err
    assert len(err.strip().splitlines()) == 1 and not out.exists() and not cache.exists()


def test_missing_sts_data_fails_before_training(mrpc_dir, model_dir, tmp_path, capsys):
    out = tmp_path / "out"
    own = _write_jsonl(tmp_path / "own.jsonl", OWN)
    argv = [a for a in _argv(out, mrpc_dir, model_dir, "--train-file", str(own), "--batch-size", "8") if a != "--no-sts"]
    assert cli.main(argv) == 2  # the mini MRPC directory holds no STS data
    err = capsys.readouterr().err
    assert err.startswith("st-hardneg train: error: ") and err.strip().endswith("Or skip the STS evaluation with --no-sts.")
    assert not out.exists()


def test_mining_fewer_than_one_batch_is_an_error(mrpc_dir, model_dir, tmp_path, capsys):
    out = tmp_path / "out"
    argv = _argv(out, mrpc_dir, model_dir, "--cache-dir", str(tmp_path / "cache"), "--mining-arg",
                 "relative_margin=None")  # 40 pairs, the recipe's batch of 64
    assert cli.main(argv) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the model loading and encoding progress bars
    assert last.startswith("st-hardneg train: error: mining kept") and "fewer than one batch (64)" in last
    assert not out.exists()  # nothing trained, nothing saved


# --------------------------------------------------------------------------- the real MRPC and STS
@pytest.mark.integration
def test_real_mrpc_with_sts_shares_the_benchmark_cache(monkeypatch, shared_data, model_dir, tmp_path, capsys):


    out, cache = tmp_path / "out", tmp_path / "cache"
    argv = ["train", "--task", "retrieval", "--model", str(model_dir), "--data-dir", str(shared_data), "--output-dir",
            str(out), "--quiet", "--cache-dir", str(cache), "--limit", "160", "--batch-size", "16", "--max-steps",
            "2", "--mining-arg", "relative_margin=None", "--loss", "focal"]
    assert cli.main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["steps"] == 2 and results["retrieval"]["queries"] > 1000
    assert set(results["retrieval"]) >= {"ndcg@10", "mrr@10", "recall@1"}
    sts = results["sts"]
    tasks = ["STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness"]
    assert set(sts) == {*tasks, "avg"} and sts["avg"] == pytest.approx(sum(sts[t] for t in tasks) / 7, abs=1e-9)
    assert f"| {results['sts']['avg']:.2f} |" in capsys.readouterr().out
    info = results["training_data"]
    assert info["pairs"] == 160 and 128 <= info["triplets"] <= 160
    files = list(cache.glob("mrpc-mined-*.json"))
    assert [str(f) for f in files] == [info["cache_file"]]


#: what ``--loss recipe --loss-arg margin=None`` announces
RECIPE_CALL = ("loss recipe: AdversarialNegativesLoss(model, untied=False, temperature=0.01, margin=None, "
               "margin_strategy='relative', guide=<the untrained model, frozen>, known_positives=<the training qrels>)")


def test_the_recipe_trains_on_a_beir_folder_with_its_training_qrels(tiny_model_dir, tmp_path, capsys):
    """``--loss recipe``: the library's recipe_loss with the folder's training qrels as known positives, its options
    replaced by --loss-arg (a random model needs margin=None: it scores every document within 5 % of the positive)."""
    from st_hardneg.cli.checks import json_safe
    from st_hardneg.models import load_model
    from st_hardneg.testing.beir import make_tiny_beir
    from st_hardneg.training import recipe
    from st_hardneg.training.protocol import BEIR_TRAINING, beir_split

    RETRIEVAL_RECIPE, recipe_loss = recipe.RETRIEVAL_RECIPE, recipe.recipe_loss  # noqa: N806 - the library's name

    folder, out = make_tiny_beir(tmp_path / "tiny"), tmp_path / "out"
    argv = ["train", "--task", "beir", "--data", str(folder), "--model", str(tiny_model_dir), "--loss", "recipe",
            "--loss-arg", "margin=None", "--max-steps", "1", "--batch-size", "4",
            "--cache-dir", str(tmp_path / "cache"), "--output-dir", str(out)]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert RECIPE_CALL in printed
    results = json.loads((out / "results.json").read_text())
    # the recipe's negatives (no margin in the mining) without any --mining-arg
    assert results["training_data"]["mining"] == RETRIEVAL_RECIPE["mining"]
    assert RETRIEVAL_RECIPE["mining"]["relative_margin"] is None
    _, split = beir_split(folder)
    model = load_model(str(tiny_model_dir), pooling="mean", max_seq_length=BEIR_TRAINING["max_seq_length"])
    expected = recipe_loss(model, split.known_paraphrases, margin=None).get_config_dict()
    assert results["loss"] == "recipe" and results["steps"] == 1
    # margin=None with the recipe's guide is GISTEmbedLoss's margin 0: the guide masks what it scores above the positive
    assert results["loss_config"] == json_safe(expected) and expected["margin"] == 0.0
    assert expected["known_positives"] == sum(map(len, split.known_paraphrases.values()))  # every training qrel
    assert results["loss_call"].endswith("known_positives=<the training qrels>)")
    assert f"| recipe | {results['test']['ndcg@10']:.2f} |" in printed


def test_control_gives_any_loss_the_recipes_false_negative_control_on_a_beir_folder(tiny_model_dir, tmp_path,
                                                                                     capsys):
    """``--loss focal --control``: Focal-InfoNCE with the folder's training qrels as known positives and a frozen copy
    of the model as given guiding the relative margin (``controlled_loss``), announced and recorded as such."""
    from st_hardneg.cli.checks import json_safe
    from st_hardneg.models import load_model
    from st_hardneg.testing.beir import make_tiny_beir
    from st_hardneg.training.protocol import BEIR_TRAINING, beir_split
    from st_hardneg.training.recipe import controlled_loss

    folder, out = make_tiny_beir(tmp_path / "tiny"), tmp_path / "out"
    argv = ["train", "--task", "beir", "--data", str(folder), "--model", str(tiny_model_dir), "--loss", "focal",
            "--control", "--loss-arg", "margin=None", "--max-steps", "1", "--batch-size", "4",
            "--mining-arg", "relative_margin=None",  # a random encoder scores every document within 5 % of the positive
            "--cache-dir", str(tmp_path / "cache"), "--output-dir", str(out)]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert ("loss focal: FocalInfoNCELoss(model, margin=None, margin_strategy='relative', guide=<the untrained model, "
            "frozen>, known_positives=<the training qrels>)") in printed
    results = json.loads((out / "results.json").read_text())
    _, split = beir_split(folder)
    model = load_model(str(tiny_model_dir), pooling="mean", max_seq_length=BEIR_TRAINING["max_seq_length"])
    expected = controlled_loss("focal", model, split.known_paraphrases, margin=None).get_config_dict()
    assert results["control"] is True and results["steps"] == 1
    assert results["loss_config"] == json_safe(expected)
    assert expected["known_positives"] == sum(map(len, split.known_paraphrases.values()))  # every training qrel
    assert expected["margin"] == 0.0  # margin=None with a guide: GISTEmbedLoss's margin 0, judged by the guide
    # without --control the same loss has neither
    plain = tmp_path / "plain"
    argv[argv.index("--output-dir") + 1] = str(plain)
    argv.remove("--control")
    argv[argv.index("--loss-arg"):argv.index("--loss-arg") + 2] = []
    assert cli.main(argv) == 0
    results = json.loads((plain / "results.json").read_text())
    assert results["control"] is False and results["loss_config"].get("known_positives") in (None, 0)
    assert "guide" not in results["loss_call"]


def test_a_mining_arg_changes_one_setting_of_the_recipes_mining(tiny_model_dir, tmp_path, capsys):
    """``--loss recipe --mining-arg KEY=VALUE``: that setting replaces the recipe's, the others stay the recipe's."""
    from st_hardneg.testing.beir import make_tiny_beir
    from st_hardneg.training import recipe

    RETRIEVAL_RECIPE = recipe.RETRIEVAL_RECIPE  # noqa: N806 - the library's name

    folder, out = make_tiny_beir(tmp_path / "tiny"), tmp_path / "out"
    argv = ["train", "--task", "beir", "--data", str(folder), "--model", str(tiny_model_dir), "--loss", "recipe",
            "--loss-arg", "margin=None", "--max-steps", "1", "--batch-size", "4", "--mining-arg", "num_candidates=3",
            "--cache-dir", str(tmp_path / "cache"), "--output-dir", str(out), "-q"]
    assert cli.main(argv) == 0
    mining = json.loads((out / "results.json").read_text())["training_data"]["mining"]
    assert mining == {**RETRIEVAL_RECIPE["mining"], "num_candidates": 3}
    assert RETRIEVAL_RECIPE["mining"]["num_candidates"] == 1


def test_the_controlled_loss_on_the_negatives_outside_the_qrels_as_the_docs_give_it(tmp_path):
    """docs/retrieval.md's ``--control`` command with the round-2 negatives (``known_as_positives``) runs, records its
    mining settings, and gives every training pair a negative that is not judged relevant to its query (which
    negative, and that a sampled pair keeps one, tests/data/test_mining.py and the round-2 benchmark test check)."""
    from st_hardneg.data.beir import load_beir
    from st_hardneg.testing import make_text_model_dir
    from st_hardneg.testing.beir import make_tiny_beir
    from st_hardneg.training.protocol import MINING, beir_split

    folder, out = make_tiny_beir(tmp_path / "tiny"), tmp_path / "out"
    data = load_beir(folder)
    words = [t.replace(":", "").replace(".", "") for t in [*data.queries.values(), *data.corpus.values()]]
    tiny_model_dir = make_text_model_dir(tmp_path / "bert", words)
    given = {"num_candidates": 1, "relative_margin": None, "known_as_positives": True}
    argv = ["train", "--task", "beir", "--data", str(folder), "--model", str(tiny_model_dir), "--loss", "focal",
            "--control", "--loss-arg", "margin=None", "--max-steps", "1", "--batch-size", "4",
            *(a for key, value in given.items() for a in ("--mining-arg", f"{key}={value}")),
            "--cache-dir", str(tmp_path / "cache"), "--output-dir", str(out), "-q"]
    assert cli.main(argv) == 0
    data = json.loads((out / "results.json").read_text())["training_data"]
    _, split = beir_split(folder)
    assert data["mining"] == {**MINING, **given}
    assert data["triplets"] == data["pairs"] == len(split.train_pairs)
    (cache_file,) = (tmp_path / "cache").glob("*.json")
    columns = json.loads(cache_file.read_text())["columns"]
    assert len(columns["negative"]) == len(split.train_pairs)
    for anchor, negative in zip(columns["anchor"], columns["negative"], strict=True):
        assert negative not in split.known_paraphrases[anchor]


def test_an_unknown_mining_arg_on_the_recipes_mining_is_refused(tiny_model_dir, tmp_path, capsys):
    """``--loss recipe --mining-arg`` with a key the mining does not take: one error line naming it, nothing trained."""
    from st_hardneg.testing.beir import make_tiny_beir

    folder, out = make_tiny_beir(tmp_path / "tiny"), tmp_path / "out"
    argv = ["train", "--task", "beir", "--data", str(folder), "--model", str(tiny_model_dir), "--loss", "recipe",
            "--mining-arg", "margin=0.1", "--cache-dir", str(tmp_path / "cache"), "--output-dir", str(out)]
    assert cli.main(argv) != 0
    assert "unknown mining setting(s) ['margin']; choose from" in capsys.readouterr().err
    assert not (out / "results.json").exists()


def test_a_broken_file_logs_nothing_of_its_own_beside_the_error(tmp_path):
    """datasets logs "Failed to load JSON from file ..." before raising: the user would see it above the one-line
    error (the test above sees it or not depending on which test bound datasets' handler to which stream), so the
    reader silences datasets' logger while it reads, and gives the verbosity back."""
    import logging

    import datasets

    from st_hardneg.training.protocol import read_training_file

    path = tmp_path / "broken.jsonl"
    path.write_text(BAD_FILES["broken.jsonl"][0])
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep, before = Keep(), datasets.logging.get_verbosity()
    logging.getLogger("datasets").addHandler(keep)
    datasets.logging.set_verbosity(datasets.logging.INFO)
    try:
        with pytest.raises(ValueError, match="cannot be read as jsonl"):
            read_training_file(path)
        assert records == [] and datasets.logging.get_verbosity() == datasets.logging.INFO
        datasets.logging.set_verbosity(datasets.logging.WARNING)  # the control: datasets does log it
        with pytest.raises(datasets.exceptions.DatasetGenerationError):
            datasets.Dataset.from_json(str(path))
        assert any("Failed to load JSON" in r.getMessage() and r.levelno == logging.ERROR for r in records)
    finally:
        logging.getLogger("datasets").removeHandler(keep)
        datasets.logging.set_verbosity(before)
