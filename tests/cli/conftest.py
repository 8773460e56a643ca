"""Fixtures shared by the command-line tests."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from st_hardneg.data.mrpc import MRPC_HEADER

COMBOS = list(itertools.product(("red", "blue", "green", "old", "new", "big"),
                                ("cat", "dog", "car", "house", "tree", "boat", "bird", "lamp"),
                                ("sleeps", "waits", "moves", "shines")))
TRAIN = [(1, 1000 + 2 * i, 1001 + 2 * i, f"the {a} {n} {v} .", f"a {a} {n} {v} today .")
         for i, (a, n, v) in enumerate(COMBOS[:40])]
TEST = [(1, 2000 + 2 * i, 2001 + 2 * i, f"the {a} {n} {v} .", f"one {a} {n} really {v} .")
        for i, (a, n, v) in enumerate(COMBOS[60:72])]
OWN = [{"anchor": f"my {a} {n} {v} .", "positive": f"your {a} {n} {v} ."} for a, n, v in COMBOS[100:148]]  # 48 rows


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    """A small MRPC (the test task of ``--task retrieval``), 48 training rows and a tiny BERT that spells them."""
    from st_hardneg.testing import make_text_model_dir

    root = tmp_path_factory.mktemp("train-cli")
    folder = root / "data" / "senteval" / "MRPC"
    folder.mkdir(parents=True)
    for name, rows in (("train", TRAIN), ("test", TEST)):
        lines = ["\t".join(MRPC_HEADER)] + ["\t".join(map(str, row)) for row in rows]
        (folder / f"msr_paraphrase_{name}.txt").write_text("\n".join(lines) + "\n", encoding="utf8")
    own = root / "own.jsonl"
    own.write_text("".join(json.dumps(row) + "\n" for row in OWN))
    texts = [" ".join(row.values()) for row in OWN] + [f"{row[3]} {row[4]}" for row in (*TRAIN, *TEST)]
    return {"data": root / "data", "own": own, "model": make_text_model_dir(root / "model", texts)}
