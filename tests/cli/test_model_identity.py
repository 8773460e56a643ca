"""A trained model says what it is: ``st-hardneg train`` (``--task beir`` and ``--task sts``) saves a card with the
model's name, its base model as given, the training data, the loss and its configuration, the evaluation the run
computed (mteb's metric names) and the exact command; ``model_meta.json`` holds mteb's metadata; ``eval`` files two
runs under two names; ``-q`` leaves stdout to the results."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from st_hardneg import __version__, cli
from st_hardneg.data import STS_YEAR_SUBSETS
from st_hardneg.testing.beir import make_tiny_beir

STSB_ROW = "main-captions\tMSRvid\t2012test\t{i:04d}\t{g}\t{a}\t{b}"
WORDS = ("red", "blue", "green", "old", "new", "big", "cat", "dog")


def _sts_tree(root: Path) -> Path:
    """Every STS file of the 7 tasks and STS-B dev, 8 pairs each with distinct gold scores."""
    pairs = [(f"the {a} {b}", f"a {b} {a}") for a, b in zip(WORDS, reversed(WORDS), strict=True)]
    for year, subsets in STS_YEAR_SUBSETS.items():
        folder = root / "STS" / f"{year}-en-test"
        folder.mkdir(parents=True)
        for name in subsets:
            (folder / f"STS.input.{name}.txt").write_text("".join(f"{a}\t{b}\n" for a, b in pairs))
            (folder / f"STS.gs.{name}.txt").write_text("".join(f"{i * 0.6:.1f}\n" for i in range(len(pairs))))
    stsb = root / "STS" / "STSBenchmark"
    stsb.mkdir(parents=True)
    for split in ("dev", "test"):
        rows = [STSB_ROW.format(i=i, g=0.5 * i, a=a, b=b) for i, (a, b) in enumerate(pairs)]
        (stsb / f"sts-{split}.csv").write_text("\n".join(rows) + "\n")
    (root / "SICK").mkdir()
    sick = ["pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment"]
    sick += [f"{i}\t{a}\t{b}\t{1 + i * 0.5:.1f}\tNEUTRAL" for i, (a, b) in enumerate(pairs)]
    (root / "SICK" / "SICK_test_annotated.txt").write_text("\n".join(sick) + "\n")
    return root


@pytest.fixture(scope="module")
def beir(tmp_path_factory) -> Path:
    return make_tiny_beir(tmp_path_factory.mktemp("identity") / "tiny")


def _beir_argv(beir: Path, model: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--task", "beir", "--data", str(beir), "--model", str(model), "--loss", "mixcse",
            "--loss-arg", "lam=0.3", "--max-steps", "2", "--batch-size", "4", "--mining-arg", "relative_margin=None",
            "--cache-dir", str(out.parent / "cache"), "--output-dir", str(out), "-q", *extra]


def _card(folder: Path) -> tuple[dict, str]:
    text = (folder / "README.md").read_text(encoding="utf-8")
    return yaml.safe_load(text.split("---")[1]), text


def _model_index(header: dict) -> dict[str, dict[str, float]]:
    """The card's model-index metadata: data set → metric → value."""
    found: dict[str, dict[str, float]] = {}
    for result in header["model-index"][0]["results"]:
        found.setdefault(result["dataset"]["type"], {}).update(
            {metric["type"]: metric["value"] for metric in result["metrics"]})
    return found


def _section_loss_config(text: str) -> dict:
    section = text.split("## Training with st-hardneg", 1)[1]
    return json.loads(section.split("```json\n", 1)[1].split("```", 1)[0])


def _parameters(folder: Path) -> int:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    return sum(p.numel() for p in model.parameters())


def test_a_beir_run_saves_a_card_that_says_what_the_model_is(beir, tiny_model_dir, tmp_path):
    out = tmp_path / "mixcse-tiny"
    argv = _beir_argv(beir, tiny_model_dir, out)
    assert cli.main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    header, text = _card(out / "final")
    assert text.split("\n# ", 1)[1].splitlines()[0] == "mixcse-tiny"  # the title: the output folder's name
    assert f"- **Base model:** `{tiny_model_dir}` (a local model)" in text and "[Unknown]" not in text
    assert "Unnamed Dataset" not in text and "\n#### tiny\n" in text  # the BEIR folder's name, its size
    assert f"- **Training data:** tiny, {results['training_data']['triplets']:,} rows" in text
    assert f"dataset_size:{results['training_data']['triplets']}" in header["tags"]
    assert _section_loss_config(text) == results["loss_config"] and results["loss_config"]["lam"] == 0.3
    assert "`MixCSELoss(model, lam=0.3)`" in text
    # dev and test nDCG@10 as the command computed them, under mteb's metric names (and scale)
    index = _model_index(header)
    for role in ("dev", "test"):
        for ours, theirs in (("ndcg@10", "ndcg_at_10"), ("mrr@10", "mrr_at_10"), ("recall@100", "recall_at_100")):
            assert index[f"tiny-{role}"][theirs] == pytest.approx(results[role][ours] / 100, abs=1e-12)
    assert f"```bash\nst-hardneg {shlex.join(argv)}\n```" in text
    assert f"- **st-hardneg version:** {__version__}" in text and __version__ == "0.3.0"
    meta = json.loads((out / "final" / "model_meta.json").read_text())
    assert meta["name"] == "local/mixcse-tiny" and meta["adapted_from"] == str(tiny_model_dir)
    assert meta["training_datasets"] == ["tiny"] and meta["n_parameters"] == _parameters(out / "final")


def test_an_sts_run_saves_its_sts_table_in_the_card_and_loads_in_sentence_transformers(tiny_model_dir, tmp_path):
    from sentence_transformers import SentenceTransformer

    corpus = tmp_path / "wiki-mini.txt"
    corpus.write_text("".join(f"sentence number {i} about topic {i % 7}\n" for i in range(64)))
    out = tmp_path / "sts-run"
    argv = ["train", "--data-dir", str(_sts_tree(tmp_path / "sts")), "--corpus", str(corpus), "--model",
            str(tiny_model_dir), "--output-dir", str(out), "--batch-size", "8", "--max-steps", "2", "--eval-steps", "1",
            "--model-name", "me/mixcse-sts", "-q"]
    assert cli.main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    header, text = _card(out / "final")
    assert text.split("\n# ", 1)[1].splitlines()[0] == "me/mixcse-sts"  # --model-name
    assert "- **Training data:** wiki-mini, 64 rows" in text and "Unnamed Dataset" not in text
    assert results["model_changes"] and all(f"\n  - {change}\n" in text for change in results["model_changes"])
    assert _section_loss_config(text) == results["loss_config"]
    index = _model_index(header)
    tasks = [task for task in results["sts"] if task != "avg"]
    assert len(tasks) == 7
    for task in tasks:
        assert index[task]["cosine_spearman"] == pytest.approx(results["sts"][task] / 100, abs=1e-12)
    assert f"st-hardneg {shlex.join(argv)}" in text
    meta = json.loads((out / "final" / "model_meta.json").read_text())
    assert meta["name"] == "me/mixcse-sts" and meta["training_datasets"] == ["wiki-mini"]
    model = SentenceTransformer(str(out / "final"), device="cpu")  # plain sentence-transformers loads it
    assert model.encode(["a red cat"]).shape == (1, 32)


def test_two_runs_evaluated_get_two_mteb_names_and_their_metadata(beir, tiny_model_dir, tmp_path, capsys):
    runs = {}
    for name in ("run-a", "run-b"):
        assert cli.main(_beir_argv(beir, tiny_model_dir, tmp_path / name / "out",
                                   *(["--model-name", name] if name == "run-b" else []))) == 0
        runs[name] = tmp_path / name / "out" / "final"
    results = tmp_path / "results"
    for final in runs.values():
        assert cli.main(["eval", "--model", str(final), "--tasks", "mteb", "--data", str(beir), "--output-dir",
                         str(results), "-q"]) == 0
    # run-a is named after its output folder ("out"), run-b by --model-name: never local/final for both
    metas = {path.parent.parent.name: json.loads(path.read_text())
             for path in (results / "results").glob("*/*/model_meta.json")}
    assert set(metas) == {"local__out", "local__run-b"}
    for key, final in (("local__out", runs["run-a"]), ("local__run-b", runs["run-b"])):
        meta = metas[key]
        assert meta["name"] == key.replace("__", "/")
        assert meta["n_parameters"] == _parameters(final)
        assert meta["adapted_from"] == str(tiny_model_dir) and meta["training_datasets"] == ["tiny"]


def test_eval_names_a_run_folder_without_metadata_by_the_run(tmp_path):
    from st_hardneg.cli.evaluate import eval_model_name
    from st_hardneg.models import MODEL_META_FILE

    final = tmp_path / "seed-3" / "final"
    final.mkdir(parents=True)
    (final.parent / "results.json").write_text("{}")
    args = cli.build_parser().parse_args(["eval", "--model", str(final)])
    assert eval_model_name(args) == "local/seed-3"
    (final / MODEL_META_FILE).write_text(json.dumps({"name": "local/mixcse-seed-3"}))
    assert eval_model_name(args) == "local/mixcse-seed-3"
    args = cli.build_parser().parse_args(["eval", "--model", str(final), "--model-name", "me/x"])
    assert eval_model_name(args) == "me/x"


def test_quiet_leaves_stdout_to_the_result_tables(beir, tiny_model_dir, tmp_path, capsys):
    from st_hardneg.training.protocol import beir_table

    out = tmp_path / "quiet"
    capsys.readouterr()
    assert cli.main(_beir_argv(beir, tiny_model_dir, out, "--training-arg", "logging_steps=1")) == 0
    printed = capsys.readouterr().out
    results = json.loads((out / "results.json").read_text())
    tables = "".join(f"### tiny {role}\n\n{beir_table({'mixcse': results}, role)}\n\n" for role in ("dev", "test"))
    assert printed.startswith(tables)
    trailer = printed[len(tables):].splitlines()
    assert [line.split(":")[0] for line in trailer] == ["training data", "model", "results"]
    assert "{'loss'" not in printed and "'train_runtime'" not in printed
