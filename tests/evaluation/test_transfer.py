"""SentEval transfer tasks: loaders on the shared files, the classifier protocol, and the end-to-end wiring."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from sklearn.model_selection import StratifiedKFold
from threadpoolctl import threadpool_limits

from st_hardneg.data import DataNotFoundError
from st_hardneg.evaluation import transfer
from st_hardneg.evaluation.transfer import (
    FAST_GRIDS,
    FULL_GRIDS,
    TRANSFER_TASKS,
    evaluate_transfer,
    format_transfer_table,
    inner_kfold_classify,
    kfold_classify,
    read_transfer_task,
    split_classify,
)


# ----------------------------------------------------------------------------------------------- helpers
@pytest.fixture(autouse=True)
def one_blas_thread():
    """The classifier helpers called directly below: one BLAS thread, as evaluate_transfer uses (much faster)."""
    with threadpool_limits(limits=1):
        yield


class StubEncoder:
    """A SentenceTransformer stand-in: a fixed pseudo-random vector per word, summed; counts what it encodes."""

    def __init__(self, dim: int = 16):
        self.dim = dim
        self.encoded: list[str] = []

    def _word(self, word: str) -> np.ndarray:
        seed = int(hashlib.md5(word.encode()).hexdigest()[:8], 16)
        return np.random.default_rng(seed).normal(size=self.dim)

    def encode(self, sentences, batch_size=32, show_progress_bar=False, convert_to_numpy=True, **kwargs):
        self.encoded.extend(sentences)
        return np.stack([sum((self._word(w) for w in s.split()), np.zeros(self.dim)) for s in sentences]).astype(
            np.float32)


def blobs(n: int, classes: int = 2, dim: int = 8, sep: float = 6.0, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % classes
    centers = rng.normal(size=(classes, dim)) * sep
    return centers[y] + rng.normal(size=(n, dim)), y


class RecordingLR:
    """Stand-in for LogisticRegression that records every fit (C, training size); its accuracy depends on C only."""

    calls: list[tuple[float, int]] = []
    accuracy_by_c: dict[float, float] = {}

    def __init__(self, C, random_state=None, max_iter=None):
        self.C = C
        self.random_state = random_state

    def fit(self, x, y):
        RecordingLR.calls.append((self.C, len(y)))
        self.classes_ = np.unique(y)
        return self

    def score(self, x, y):
        return RecordingLR.accuracy_by_c.get(self.C, 0.5)

    def predict(self, x):
        return np.full(len(x), self.classes_[-1])


@pytest.fixture
def recording_lr(monkeypatch):
    RecordingLR.calls = []
    RecordingLR.accuracy_by_c = {}
    monkeypatch.setattr(transfer, "LogisticRegression", RecordingLR)
    return RecordingLR


def write_fake_senteval(root: Path, n: int = 40) -> Path:
    """A SentEval directory with every transfer task, small, separable by a keyword, in the original formats."""
    fillers = ["the plot", "a story", "this film", "the acting", "our trip", "that meal", "my phone", "the book"]
    rng = np.random.default_rng(0)

    def sentence(word: str, i: int) -> str:
        return f"{fillers[i % len(fillers)]} was {word} , item {i} ."

    for folder, pos, neg in [("MR", "rt-polarity.pos", "rt-polarity.neg"), ("CR", "custrev.pos", "custrev.neg"),
                             ("SUBJ", "subj.objective", "subj.subjective"), ("MPQA", "mpqa.pos", "mpqa.neg")]:
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / pos).write_text("\n".join(sentence("good", i) for i in range(n)) + "\n", encoding="latin-1")
        (root / folder / neg).write_text("\n".join(sentence("bad", i) for i in range(n)) + "\n", encoding="latin-1")
    (root / "SST" / "binary").mkdir(parents=True, exist_ok=True)
    for split, size in (("train", 3 * n), ("dev", n), ("test", n)):
        labels = rng.integers(0, 2, size)
        lines = [f"{sentence('good' if y else 'bad', i + 1000 * len(split))} \t{y}" for i, y in enumerate(labels)]
        (root / "SST" / "binary" / f"sentiment-{split}").write_text("\n".join(lines) + "\n", encoding="utf8")
    (root / "TREC").mkdir(parents=True, exist_ok=True)
    cues = {"ABBR": "abbreviation", "DESC": "describe", "ENTY": "thing", "HUM": "who", "LOC": "where", "NUM": "many"}
    for name, size in (("train_5500.label", 6 * n), ("TREC_10.label", 2 * n)):
        labels = list(cues)
        lines = [f"{labels[i % 6]}:fine {cues[labels[i % 6]]} question {i} ?" for i in range(size)]
        (root / "TREC" / name).write_text("\n".join(lines) + "\n", encoding="latin-1")
    (root / "MRPC").mkdir(parents=True, exist_ok=True)
    for split, size in (("train", 3 * n), ("test", n)):
        lines = ["\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String"]
        for i in range(size):
            a = f"{fillers[i % 8]} number {i} happened today ."
            b = a if i % 2 else f"something else {i} entirely , {fillers[(i + 3) % 8]} ."
            lines.append(f"{i % 2}\t{i}\t{i + 1}\t{a}\t{b}")
        (root / "MRPC" / f"msr_paraphrase_{split}.txt").write_text("\n".join(lines) + "\n", encoding="utf8")
    return root


# ----------------------------------------------------------------------------------------------- loaders
EXPECTED_SIZES = {  # /work/shared/data/README.md
    "MR": {"all": 10662}, "CR": {"all": 3775}, "SUBJ": {"all": 10000}, "MPQA": {"all": 10606},
    "SST2": {"train": 67349, "dev": 872, "test": 1821}, "TREC": {"train": 5452, "test": 500},
    "MRPC": {"train": 4076, "test": 1725},
}


@pytest.mark.parametrize("task", TRANSFER_TASKS)
def test_loaders_read_the_shared_files_with_senteval_counts(shared_data, task):
    splits = read_transfer_task(shared_data / "senteval", task)
    assert {name: len(split) for name, split in splits.items()} == EXPECTED_SIZES[task]
    classes = 6 if task == "TREC" else 2
    for split in splits.values():
        assert split.labels.dtype == np.int64 and set(np.unique(split.labels)) == set(range(classes))
        assert len(split.labels) == len(split.sentences)
        assert all(s == " ".join(s.split()) for s in split.sentences)  # whitespace-normalised like SimCSE's batcher
        if task == "MRPC":
            assert len(split.sentences2) == len(split.sentences)
            keys = [(len(a.split()), len(b.split()), y) for a, b, y in
                    zip(split.sentences, split.sentences2, split.labels, strict=True)]
        else:
            assert split.sentences2 is None
            keys = [(len(s.split()), y) for s, y in zip(split.sentences, split.labels, strict=True)]
        assert keys == sorted(keys)  # SentEval's order, which fixes its folds


def test_loader_labels_follow_senteval(shared_data):
    root = shared_data / "senteval"
    mr = read_transfer_task(root, "MR")["all"]
    assert np.bincount(mr.labels).tolist() == [5331, 5331]
    first_pos = (root / "MR" / "rt-polarity.pos").read_text(encoding="latin-1").splitlines()[0]
    assert mr.labels[mr.sentences.index(" ".join(first_pos.split()))] == 1
    trec = read_transfer_task(root, "TREC")["test"]
    assert np.bincount(trec.labels).tolist() == [9, 138, 94, 65, 81, 113]  # ABBR, DESC, ENTY, HUM, LOC, NUM


def test_unknown_task_and_missing_files(tmp_path):
    with pytest.raises(ValueError, match="unknown transfer task"):
        evaluate_transfer(StubEncoder(), tmp_path, tasks=["MR", "SST5"])
    (tmp_path / "MR").mkdir()
    (tmp_path / "MR" / "rt-polarity.pos").write_text("fine .\n")
    with pytest.raises(DataNotFoundError, match=r"MR/rt-polarity\.neg") as err:
        evaluate_transfer(StubEncoder(), tmp_path, tasks="MR,TREC")
    assert "TREC/train_5500.label" in str(err.value) and "download senteval" in str(err.value)


# ----------------------------------------------------------------------------------------------- classifiers
def test_separable_data_is_classified_almost_perfectly():
    x, y = blobs(300)
    assert inner_kfold_classify(x, y, FAST_GRIDS["inner"], kfold=5)["acc"] > 98
    x_te, y_te = blobs(100, seed=0)
    assert kfold_classify(x, y, x_te, y_te, FAST_GRIDS["kfold"], kfold=5)["acc"] > 98
    x3, y3 = blobs(240, classes=3)
    out = split_classify(x3[:160], y3[:160], x3[160:200], y3[160:200], x3[200:], y3[200:], FAST_GRIDS["split"])
    assert out["acc"] > 97


def test_shuffled_labels_give_chance_accuracy():
    x, y = blobs(400, sep=6.0)
    y = np.random.default_rng(1).permutation(y)
    acc = inner_kfold_classify(x, y, FAST_GRIDS["inner"], kfold=5)["acc"]
    assert 35 < acc < 65


def test_inner_kfold_wiring(recording_lr):
    x, y = blobs(60)
    grid, k = (0.5, 1.0, 2.0), 3
    recording_lr.accuracy_by_c = {0.5: 0.80, 1.0: 0.90, 2.0: 0.90}  # tie: SentEval keeps the first (smaller) C
    out = inner_kfold_classify(x, y, grid, kfold=k, seed=7)
    assert out["C"] == [1.0] * k and out["kfold"] == k and out["grid"] == list(grid)
    assert out["dev_acc"] == pytest.approx(90.0) and out["acc"] == pytest.approx(90.0)
    # per outer fold: every C on every inner fold, then one refit on the whole outer training fold
    calls = recording_lr.calls
    assert len(calls) == k * (len(grid) * k + 1)
    outer = list(StratifiedKFold(n_splits=k, shuffle=True, random_state=7).split(x, y))
    per_fold = len(grid) * k + 1
    for f, (train_idx, _) in enumerate(outer):
        block = calls[f * per_fold : (f + 1) * per_fold]
        assert [c for c, _ in block[:-1]] == [c for c in grid for _ in range(k)]
        inner = StratifiedKFold(n_splits=k, shuffle=True, random_state=7).split(x[train_idx], y[train_idx])
        assert [n for _, n in block[: k]] == [len(tr) for tr, _ in inner]
        assert block[-1] == (1.0, len(train_idx))


def test_kfold_and_split_wiring(recording_lr):
    x, y = blobs(50)
    recording_lr.accuracy_by_c = {0.5: 0.7, 1.0: 0.6, 2.0: 0.75}
    out = kfold_classify(x, y, x[:10], y[:10], (0.5, 1.0, 2.0), kfold=5, seed=3)
    assert out["C"] == 2.0 and out["dev_acc"] == 75.0 and len(recording_lr.calls) == 3 * 5 + 1
    assert recording_lr.calls[-1] == (2.0, 50)
    recording_lr.calls.clear()
    out = split_classify(x, y, x[:10], y[:10], x[10:20], y[10:20], (0.5, 1.0, 2.0))
    assert out["C"] == 2.0 and [c for c, _ in recording_lr.calls] == [0.5, 1.0, 2.0]  # no refit


def test_selection_rounds_to_two_decimals_like_senteval(recording_lr):
    x, y = blobs(40)
    recording_lr.accuracy_by_c = {0.5: 0.800041, 1.0: 0.800049}  # equal after rounding -> the smaller C
    assert kfold_classify(x, y, x, y, (0.5, 1.0), kfold=2)["C"] == 0.5


@pytest.mark.parametrize("fast", [False, True])
def test_grids_and_fold_counts_per_task(tmp_path, recording_lr, fast):
    root = write_fake_senteval(tmp_path, n=20)
    recording_lr.accuracy_by_c = {}
    out = evaluate_transfer(StubEncoder(), root, fast=fast, show_progress_bar=False, return_details=True)
    k = 5 if fast else 10
    grids = FAST_GRIDS if fast else FULL_GRIDS
    assert FULL_GRIDS["inner"] == (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
    assert FULL_GRIDS["kfold"] == (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
    expected_fits = {"inner": k * (6 * k + 1), "split": 6, "kfold": 7 * k + 1} if not fast else \
        {"inner": k * (3 * k + 1), "split": 3, "kfold": 4 * k + 1}
    fits = 0
    for task in TRANSFER_TASKS:
        d = out["details"][task]
        assert d["grid"] == list(grids[d["protocol"]]) and d["seed"] == 1111
        if d["protocol"] != "split":
            assert d["kfold"] == k
        fits += expected_fits[d["protocol"]]
    assert len(recording_lr.calls) == fits
    assert {t: out["details"][t]["protocol"] for t in TRANSFER_TASKS} == transfer.TASK_PROTOCOL


# ----------------------------------------------------------------------------------------------- end to end
def test_evaluate_transfer_end_to_end_on_separable_synthetic_tasks(tmp_path):
    root = write_fake_senteval(tmp_path)
    encoder = StubEncoder()
    out = evaluate_transfer(encoder, root, fast=True, show_progress_bar=False, return_details=True)
    for task in TRANSFER_TASKS:
        assert out[task] > 90, (task, out[task])
    assert out["MRPC_f1"] > 90
    assert out["avg"] == pytest.approx(np.mean([out[t] for t in TRANSFER_TASKS]))
    # each distinct sentence of all tasks encoded exactly once
    assert len(encoder.encoded) == len(set(encoder.encoded))
    expected = set()
    for task in TRANSFER_TASKS:
        for split in read_transfer_task(root, task).values():
            expected |= set(split.sentences) | set(split.sentences2 or ())
    assert set(encoder.encoded) == expected
    assert out["details"]["MRPC"]["n_train"] == 120 and out["details"]["SST2"]["n_dev"] == 40
    again = evaluate_transfer(StubEncoder(), root, fast=True, show_progress_bar=False, return_details=True)
    for task in TRANSFER_TASKS:  # deterministic for a given seed
        assert again[task] == out[task] and again["details"][task]["C"] == out["details"][task]["C"]


def test_format_transfer_table():
    table = format_transfer_table({"m": {"MR": 80.0, "MRPC": 70.0, "MRPC_f1": 75.5, "avg": 75.0}})
    assert table.splitlines()[0] == "| model | MR | MRPC | avg |"
    assert "| m | 80.00 | 70.00 / 75.50 | 75.00 |" in table
    assert format_transfer_table({}) == ""
