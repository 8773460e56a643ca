"""A fast trial function for the engine's tests: module-level, so that a spawned worker imports it by its name."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def fast_trial(spec: Any, point: Any, context: Mapping[str, Any]) -> dict[str, Any]:
    """Append the point's key to ``context["log"]`` (one line per run) and return a record whose dev and test
    nDCG@10 are ``10 + seed`` and ``20 + seed``."""
    with Path(context["log"]).open("a") as handle:
        handle.write(f"{point.key}\n")
    return {"dataset": point.dataset, "row": point.row, "seed": point.seed, "pid": os.getpid(),
            "dev": {"ndcg@10": 10.0 + point.seed}, "test": {"ndcg@10": 20.0 + point.seed}}


def failing_trial(spec: Any, point: Any, context: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`fast_trial`, except that row ``bad`` fails as a configuration does (a record with ``failed``)."""
    record = fast_trial(spec, point, context)
    if point.row == "bad":
        return {"row": point.row, "seed": point.seed, "failed": "no usable row in this batch"}
    return record


def table(data: Mapping[str, Any]) -> str:
    """A benchmark's table: one line per record, ``row seed dev`` (``failed`` for a failed one)."""
    lines = [f"{r['row']} {r.get('seed', data.get('seed'))} "
             f"{'failed' if r.get('failed') else r['dev']['ndcg@10']}" for r in data["runs"]]
    return "\n".join(lines) + "\n"


def figure(data: Mapping[str, Any], path: Path) -> None:
    """A benchmark's figure: here a text file naming how many records it drew."""
    path.write_text(f"{len(data['runs'])} records\n")


def model_trial(spec: Any, point: Any, context: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`fast_trial` (its log in the study's output folder), recording the model its context gives."""
    log = Path(context["output_dir"]) / "ran.txt"
    return {**fast_trial(spec, point, {**context, "log": str(log)}), "model": context.get("model")}
