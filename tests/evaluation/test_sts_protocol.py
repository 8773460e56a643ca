"""SentEval STS evaluation on handmade data against a hand computation, plus the data-directory rules."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from st_hardneg.data import (
    STS_YEAR_SUBSETS,
    DataNotFoundError,
    read_corpus,
    read_sts_pairs,
    resolve_senteval_dir,
)
from st_hardneg.evaluation import SentEvalSTSEvaluator, evaluate_sts, format_sts_table


def ranks(values):
    """Average ranks (1-based) with ties sharing their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    result = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            result[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return result


def spearman_by_hand(x, y):
    rx, ry = ranks(list(x)), ranks(list(y))
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = sum((a - mx) ** 2 for a in rx) ** 0.5
    vy = sum((b - my) ** 2 for b in ry) ** 0.5
    return 100 * cov / (vx * vy)


class FakeModel:
    """Deterministic 'encoder': a fixed random vector per sentence; records what it was asked to encode."""

    def __init__(self):
        self.encoded: list[str] = []
        self.max_seq_length = 32
        self.training = False
        self.lengths_seen: list[int] = []
        self.model_card_data = SimpleNamespace(set_evaluation_metrics=lambda *args: None)

    def vector(self, sentence: str) -> np.ndarray:
        rng = np.random.default_rng(abs(hash(sentence)) % (2**32))
        return rng.normal(size=5).astype(np.float32)

    def encode(self, sentences, batch_size=32, show_progress_bar=False, convert_to_numpy=True):
        self.encoded.extend(sentences)
        self.lengths_seen.append(self.max_seq_length)
        return np.stack([self.vector(s) for s in sentences])


def cos(a, b):
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture
def handmade(tmp_path):
    """A SentEval tree with a few pairs per file; returns (root, {task: [(s1, s2, gold)]})."""
    root = tmp_path / "senteval"
    rng = np.random.default_rng(0)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    expected: dict[str, list] = {}

    def sentence():
        return " ".join(rng.choice(words, size=4))

    for year, subsets in STS_YEAR_SUBSETS.items():
        folder = root / "STS" / f"{year}-en-test"
        folder.mkdir(parents=True)
        expected[year] = []
        for name in subsets:
            inputs, gold = [], []
            for k in range(4):
                a, b = sentence(), sentence()
                # SentEval splits on whitespace: double spaces and tabs inside a sentence disappear
                inputs.append(f"{a.replace(' ', '  ', 1)}\t{b}")
                score = "" if (year == "STS15" and k == 0) else f"{rng.uniform(0, 5):.2f}"
                gold.append(score)
                if score:
                    expected[year].append((a, b, float(score)))
            (folder / f"STS.input.{name}.txt").write_text("\n".join(inputs) + "\n")
            (folder / f"STS.gs.{name}.txt").write_text("\n".join(gold) + "\n")
    stsb = root / "STS" / "STSBenchmark"
    stsb.mkdir(parents=True)
    for split in ("dev", "test"):
        rows, key = [], "STSBenchmark" if split == "test" else "STSBenchmark-dev"
        expected[key] = []
        for i in range(6):
            a, b, g = sentence(), sentence(), round(float(rng.uniform(0, 5)), 3)
            rows.append(f"main-captions\tMSRvid\t2012test\t{i:04d}\t{g}\t{a}\t{b}")
            expected[key].append((a, b, g))
        (stsb / f"sts-{split}.csv").write_text("\n".join(rows) + "\n")
    sick = root / "SICK"
    sick.mkdir(parents=True)
    lines, expected["SICKRelatedness"] = ["pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment"], []
    for i in range(7):
        a, b, g = sentence(), sentence(), round(float(rng.uniform(1, 5)), 1)
        lines.append(f"{i}\t{a}\t{b}\t{g}\tNEUTRAL")
        expected["SICKRelatedness"].append((a, b, g))
    (sick / "SICK_test_annotated.txt").write_text("\n".join(lines) + "\n")
    return root, expected


def test_reader_pools_subsets_and_skips_unscored(handmade):
    root, expected = handmade
    for task, rows in expected.items():
        s1, s2, gold = read_sts_pairs(root, task)
        assert list(zip(s1, s2, gold, strict=True)) == rows, task
    assert len(expected["STS15"]) == 5 * 4 - 5  # one unscored line per subset


def test_evaluate_sts_equals_hand_computation(handmade):
    root, expected = handmade
    model = FakeModel()
    result = evaluate_sts(model, root, show_progress_bar=False)
    tasks = ["STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness"]
    assert list(result) == [*tasks, "avg"]
    for task in tasks:
        sims = [cos(model.vector(a), model.vector(b)) for a, b, _ in expected[task]]
        assert result[task] == pytest.approx(spearman_by_hand(sims, [g for *_, g in expected[task]]), abs=1e-6)
    assert result["avg"] == pytest.approx(sum(result[t] for t in tasks) / 7)
    # each distinct sentence encoded exactly once
    assert len(model.encoded) == len(set(model.encoded))
    every = {s for task in tasks for a, b, _ in expected[task] for s in (a, b)}
    assert set(model.encoded) == every


def test_evaluator_reports_dev_only_and_prefixes(handmade):
    root, expected = handmade
    model = FakeModel()
    evaluator = SentEvalSTSEvaluator(root)
    metrics = evaluator(model)
    sims = [cos(model.vector(a), model.vector(b)) for a, b, _ in expected["STSBenchmark-dev"]]
    want = spearman_by_hand(sims, [g for *_, g in expected["STSBenchmark-dev"]])
    assert metrics == pytest.approx({"sts-dev_spearman_STSBenchmark-dev": want, "sts-dev_spearman": want})
    assert evaluator.primary_metric == "sts-dev_spearman"
    assert set(model.encoded) <= {s for a, b, _ in expected["STSBenchmark-dev"] for s in (a, b)}


def test_full_length_during_evaluation_is_restored(tiny_model, handmade):
    root, _ = handmade
    seen = []
    original = tiny_model.encode

    def spy(*args, **kwargs):
        seen.append(tiny_model.max_seq_length)
        return original(*args, **kwargs)

    tiny_model.encode = spy
    evaluate_sts(tiny_model, root, tasks=["STSBenchmark"], show_progress_bar=False)
    assert seen == [128]  # the tiny BERT's position limit
    assert tiny_model.max_seq_length == 32


def test_unknown_task_and_missing_files(handmade, tmp_path):
    root, _ = handmade
    with pytest.raises(ValueError, match="unknown STS task"):
        evaluate_sts(FakeModel(), root, tasks=["STS17"])
    (root / "SICK" / "SICK_test_annotated.txt").unlink()
    with pytest.raises(DataNotFoundError, match=r"SICK/SICK_test_annotated.txt[\s\S]*st-hardneg download senteval"):
        evaluate_sts(FakeModel(), root)
    with pytest.raises(DataNotFoundError, match="contains no SentEval data"):
        resolve_senteval_dir(tmp_path / "nowhere")


def test_data_dir_resolution(handmade, monkeypatch, tmp_path):
    root, _ = handmade
    assert resolve_senteval_dir(root) == root
    assert resolve_senteval_dir(root.parent) == root  # the parent holding senteval/
    monkeypatch.setenv("ST_HARDNEG_DATA", str(root.parent))
    assert resolve_senteval_dir() == root
    monkeypatch.setenv("ST_HARDNEG_DATA", str(tmp_path / "missing"))
    with pytest.raises(DataNotFoundError, match=r"\$ST_HARDNEG_DATA"):
        resolve_senteval_dir()


def test_read_corpus(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("first sentence\n\n  second  \nfirst sentence\nKey:\n")
    assert read_corpus(path) == ["first sentence", "second", "first sentence", "Key:"]
    assert read_corpus(path, dedupe=True, min_chars=5) == ["first sentence", "second"]
    with pytest.raises(FileNotFoundError, match="download wiki1m"):
        read_corpus(tmp_path / "none.txt")


def test_format_table():
    table = format_sts_table({"m": {"STSBenchmark": 80.123, "avg": 80.123}})
    assert table.splitlines()[2] == "| m | 80.12 | 80.12 |"


@pytest.mark.integration
def test_shared_data_counts(shared_data):
    """The readers find exactly the pair counts SentEval publishes (../shared/data/README.md)."""
    counts = {"STS12": 3108, "STS13": 1500, "STS14": 3750, "STS15": 3000, "STS16": 1186,
              "STSBenchmark": 1379, "STSBenchmark-dev": 1500, "SICKRelatedness": 4927}
    for task, n in counts.items():
        assert len(read_sts_pairs(resolve_senteval_dir(shared_data), task)[2]) == n, task
