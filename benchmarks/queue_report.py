"""The queue's evidence in one table, from the results the other benchmarks wrote: the screen on STS-B dev
(``tuning.py --screen queue`` → ``tuning_queue.json``), the selected settings with 3 seeds on the CPU STS protocol
(``cpu_protocol.py --variant`` rows ``mnrl_queue`` / ``focal_queue`` in ``cpu_protocol.json``) and SciFact at equal
memory (``retrieval.py --task scifact --methods focal_queue`` in ``scifact.json``).

    python -m benchmarks.queue_report     # -> benchmarks/results/queue.md

Targets: the best queued loss ≥ mnrl + 1.5 STS avg on the CPU protocol (mean of 3 seeds); on SciFact, Focal with
the queue ≥ Focal without it (mean nDCG@10 over the seeds both have). Nothing is trained here.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
#: CPU protocol: queued row → the same loss without the queue
CPU_PAIRS = {"mnrl_queue": "mnrl", "focal_queue": "focal"}
#: SciFact: queued row, the same loss without it, and the built-in with as many candidates per anchor
SCIFACT_ROWS = ("focal_queue", "focal", "cached_mnrl_4x")
STS_TARGET = 1.5


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _per_seed(runs: list[dict[str, Any]], method: str, score) -> dict[int, float]:
    return {r["seed"]: score(r) for r in runs if r.get("method") == method and not r.get("failed")
            and r.get("seed") is not None}


def screen_table(screen: dict[str, Any]) -> str:
    """Each screened configuration's STS-B dev at the screen's step, and its gain over the same loss without a
    queue at that step (the full runs' dev curve, ``references``)."""
    from st_hardneg.reporting import markdown_table

    references = screen.get("references", {})
    body = []
    for run in sorted((r for r in screen["runs"] if "stsb_dev" in r), key=lambda r: (r["loss"], -r["stsb_dev"])):
        own = references.get("mnrl" if run["loss"] == "mnrl_queue" else run["loss"])
        changed = run.get("changed", {})
        body.append([run["label"], changed.get("queue_size", "–"), changed.get("queue_source", "online"),
                     f"{run['stsb_dev']:.2f}", f"{run['stsb_dev'] - own:+.2f}" if own is not None else "–"])
    return markdown_table(["configuration", "queue rows", "source", f"STS-B dev @ step {screen.get('stop_after', 50)}",
                           "Δ vs no queue"], body, align=["l", "r", "l", "r", "r"])


def cpu_table(cpu: dict[str, Any]) -> tuple[str, str]:
    """The queued rows and their no-queue twins on the CPU protocol (STS avg, mean ± std, per seed), and the target
    sentence."""
    from st_hardneg.reporting import markdown_table, mean_std_text

    def avg(run):
        return run["sts"]["avg"]

    runs = cpu["runs"]
    mnrl = _per_seed(runs, "mnrl", avg)
    body, best = [], None
    for queued, plain in CPU_PAIRS.items():
        for method in (plain, queued):
            seeds = _per_seed(runs, method, avg)
            if not seeds:
                continue
            values = [seeds[s] for s in sorted(seeds)]
            config = next(r.get("loss_config", {}) for r in runs if r.get("method") == method)
            setting = (f"{config.get('queue_size')} rows, {config.get('queue_source', 'online')}"
                       if config.get("queue_size") else "no queue")
            gap = statistics.mean(values) - statistics.mean(mnrl.values()) if mnrl else None
            body.append([method, setting, mean_std_text(values), ", ".join(f"{v:.2f}" for v in values),
                         f"{gap:+.2f}" if gap is not None and method != "mnrl" else "–"])
            if method == queued and len(values) >= 3 and gap is not None and (best is None or gap > best[1]):
                best = (method, gap)
    table = markdown_table(["CPU STS protocol", "queue", "STS avg", "per seed", "Δ vs mnrl"], body,
                           align=["l", "l", "r", "l", "r"])
    if best is None:
        return table, "CPU target: no queued row has 3 seeds yet."
    met = best[1] >= STS_TARGET
    return table, (f"CPU target (best queued loss ≥ mnrl + {STS_TARGET}, mean of 3 seeds): `{best[0]}` "
                   f"{best[1]:+.2f}, {'met' if met else 'not met'}.")


def scifact_table(scifact: dict[str, Any]) -> tuple[str, str]:
    """Focal with and without the queue and CachedMNRL at 4x the batch on SciFact test (nDCG@10), and the target
    sentence (over the seeds both Focal rows have)."""
    from st_hardneg.reporting import markdown_table, mean_std_text

    def ndcg(run):
        return run["test"]["ndcg@10"]

    runs = [r for r in scifact["runs"] if "test" in r]
    rows = {m: _per_seed(runs, m, ndcg) for m in SCIFACT_ROWS}
    body = [[m, mean_std_text([v[s] for s in sorted(v)]), ", ".join(f"{s}: {v[s]:.2f}" for s in sorted(v))]
            for m, v in rows.items() if v]
    table = markdown_table(["SciFact test", "nDCG@10", "per seed"], body, align=["l", "r", "l"])
    common = sorted(set(rows["focal_queue"]) & set(rows["focal"]))
    if not common:
        return table, "SciFact target: no seed has both focal and focal_queue yet."
    gain = statistics.mean(rows["focal_queue"][s] - rows["focal"][s] for s in common)
    return table, (f"SciFact target (queue ≥ no queue at equal memory): focal_queue − focal = {gain:+.2f} nDCG@10 "
                   f"over seed(s) {', '.join(map(str, common))}: {'met' if gain >= 0 else 'not met'}.")


def report(results: Path = RESULTS) -> str:
    """The whole markdown: the screen, the CPU protocol rows and the SciFact rows, each with its target."""
    parts = ["# The queue", ""]
    screen, cpu, scifact = (_load(results / name) for name in ("tuning_queue.json", "cpu_protocol.json",
                                                               "scifact.json"))
    if screen:
        parts += [f"Screen (seed {screen.get('seed')}, one run each, STS-B dev):", "", screen_table(screen)]
    if cpu:
        table, target = cpu_table(cpu)
        parts += ["Selected settings on the CPU STS protocol (7-task SentEval STS avg, Spearman x 100):", "", table,
                  target, ""]
    if scifact:
        table, target = scifact_table(scifact)
        parts += ["SciFact at equal memory (batch 32 + 192 queued rows vs CachedMNRL at batch 128, 256 candidates "
                  "per anchor each):", "", table, target, ""]
    return "\n".join(parts).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default=str(RESULTS))
    args = parser.parse_args(argv)
    text = report(Path(args.results))
    (Path(args.results) / "queue.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
