"""Reading the SentEval transfer tasks (MR, CR, SUBJ, MPQA, SST2, TREC, MRPC) exactly as SentEval reads and orders
them; the classification protocol on their embeddings is :mod:`st_hardneg.evaluation.transfer`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from st_hardneg.data.senteval import DataFormatError, DataNotFoundError, _how_to_get

#: the seven transfer tasks of the SimCSE / MixCSE tables, in their column order
TRANSFER_TASKS = ("MR", "CR", "SUBJ", "MPQA", "SST2", "TREC", "MRPC")

_BINARY_FILES = {  # task: (folder, file of label 1, file of label 0), as SentEval's binary.py assigns them
    "MR": ("MR", "rt-polarity.pos", "rt-polarity.neg"),
    "CR": ("CR", "custrev.pos", "custrev.neg"),
    "SUBJ": ("SUBJ", "subj.objective", "subj.subjective"),
    "MPQA": ("MPQA", "mpqa.pos", "mpqa.neg"),
}
_TREC_LABELS = {"ABBR": 0, "DESC": 1, "ENTY": 2, "HUM": 3, "LOC": 4, "NUM": 5}


def transfer_files(task: str) -> list[str]:
    """Relative paths (under the SentEval root) of the files one transfer task reads."""
    if task in _BINARY_FILES:
        folder, pos, neg = _BINARY_FILES[task]
        return [f"{folder}/{pos}", f"{folder}/{neg}"]
    if task == "SST2":
        return [f"SST/binary/sentiment-{split}" for split in ("train", "dev", "test")]
    if task == "TREC":
        return ["TREC/train_5500.label", "TREC/TREC_10.label"]
    if task == "MRPC":
        return ["MRPC/msr_paraphrase_train.txt", "MRPC/msr_paraphrase_test.txt"]
    raise ValueError(f"unknown transfer task {task!r}; choose from {', '.join(TRANSFER_TASKS)}")


def check_transfer_data(root: Path, tasks: Sequence[str]) -> None:
    """Raise :class:`~st_hardneg.data.senteval.DataNotFoundError` naming every missing file of ``tasks`` under ``root``."""
    folders = [rel for task in tasks for rel in transfer_files(task) if (Path(root) / rel).is_dir()]
    if folders:
        raise DataNotFoundError(f"{Path(root) / folders[0]} is a folder, not the SentEval transfer file it should be")
    missing = [rel for task in tasks for rel in transfer_files(task) if not (Path(root) / rel).is_file()]
    if missing:
        raise DataNotFoundError(
            f"Missing SentEval transfer files under {root}:\n  " + "\n  ".join(missing) + "\n" + _how_to_get()
        )


@dataclass
class TransferSplit:
    """One split of a transfer task: sentences (and second sentences for MRPC) with integer labels."""

    sentences: list[str]
    labels: np.ndarray
    sentences2: list[str] | None = None

    def __len__(self) -> int:
        return len(self.sentences)


def _tokens(text: str) -> list[str]:
    return text.split()


def _ordered(items: list[tuple], key: Callable[[Any], Any]) -> list[tuple]:
    # SentEval sorts every split by length (then label) "to reduce padding" before classifying; the order decides
    # which items fall into which shuffled fold, so it is kept to reproduce SentEval's folds.
    return sorted(items, key=key)


def _split_from(items: list[tuple[list[str], int]]) -> TransferSplit:
    items = _ordered(items, key=lambda z: (len(z[0]), z[1]))
    return TransferSplit([" ".join(t) for t, _ in items], np.array([y for _, y in items], dtype=np.int64))


def read_transfer_task(root: str | Path, task: str) -> dict[str, TransferSplit]:
    """The splits of one transfer task, read and ordered as SentEval reads and orders them.

    Sentences are whitespace-tokenised and re-joined with single spaces (what SimCSE's batcher feeds the encoder).
    MR/CR/SUBJ/MPQA are read as latin-1 (one sentence per line; label 1 = ``.pos`` / ``subj.objective``), TREC as
    latin-1 (``LABEL:fine question``, 6 coarse classes), SST2 (``sentence<TAB>label``) and MRPC (TSV with a header;
    columns 0, 3 and 4) as UTF-8.

    Returns:
        ``{"all": ...}`` for MR, CR, SUBJ and MPQA (cross-validated); ``{"train", "dev", "test"}`` for SST2;
        ``{"train", "test"}`` for TREC and MRPC.
    """
    root = Path(root)
    check_transfer_data(root, [task])
    label: int | str
    if task in _BINARY_FILES:
        folder, pos, neg = _BINARY_FILES[task]
        items: list[tuple[Any, ...]] = []
        for name, label in ((pos, 1), (neg, 0)):
            lines = (root / folder / name).read_text(encoding="latin-1").splitlines()
            items += [(_tokens(line), label) for line in lines]
        return {"all": _split_from(items)}
    if task == "SST2":
        splits = {}
        for split in ("train", "dev", "test"):
            items = []
            path = root / "SST" / "binary" / f"sentiment-{split}"
            for number, line in enumerate(path.read_text(encoding="utf8").splitlines(), start=1):
                if not line.strip():
                    continue
                fields = line.strip().split("\t")
                if len(fields) != 2 or fields[1].strip() not in ("0", "1"):
                    raise DataFormatError(f"{path}, line {number}: expected 'sentence<TAB>label' with label 0 or 1, "
                                          f"got {line.strip()!r:.80}")
                items.append((_tokens(fields[0]), int(fields[1])))
            splits[split] = _split_from(items)
        return splits
    if task == "TREC":
        splits = {}
        for split, name in (("train", "train_5500.label"), ("test", "TREC_10.label")):
            items = []
            path = root / "TREC" / name
            for number, line in enumerate(path.read_text(encoding="latin-1").splitlines(), start=1):
                if not line.strip():
                    continue
                target, colon, rest = line.strip().partition(":")
                fine, space, question = rest.partition(" ")
                if not colon or not space or not fine or not question.strip():
                    raise DataFormatError(f"{path}, line {number}: expected 'LABEL:fine question' (e.g. "
                                          f"'DESC:def What is ...'), got {line.strip()!r:.80}")
                if target not in _TREC_LABELS:
                    raise DataFormatError(f"{path}, line {number}: unknown label {target!r}; TREC's labels are "
                                          f"{', '.join(_TREC_LABELS)}")
                items.append((_tokens(question), _TREC_LABELS[target]))
            splits[split] = _split_from(items)
        return splits
    if task == "MRPC":
        splits = {}
        for split in ("train", "test"):
            path = root / "MRPC" / f"msr_paraphrase_{split}.txt"
            lines = path.read_text(encoding="utf8").splitlines()[1:]
            items = []
            for number, line in enumerate(lines, start=2):
                if not line.strip():
                    continue
                fields = line.strip().split("\t")
                if len(fields) < 5 or fields[0] not in ("0", "1"):
                    raise DataFormatError(f"{path}, line {number}: expected 5 tab-separated fields (quality 0/1, "
                                          f"#1 ID, #2 ID, #1 string, #2 string), got {len(fields)}")
                items.append((_tokens(fields[3]), _tokens(fields[4]), int(fields[0])))
            items = _ordered(items, key=lambda z: (len(z[0]), len(z[1]), z[2]))
            splits[split] = TransferSplit(
                [" ".join(a) for a, _, _ in items], np.array([y for _, _, y in items], dtype=np.int64),
                [" ".join(b) for _, b, _ in items],
            )
        return splits
    raise ValueError(f"unknown transfer task {task!r}; choose from {', '.join(TRANSFER_TASKS)}")
