"""benchmarks.queue_report: the queue's evidence table and its two targets, against numbers computed here; the table
is written to results/queue.md only (never into a README)."""

from __future__ import annotations

import json
import statistics

import pytest


def _load():
    from benchmarks import queue_report

    return queue_report


def _cpu(method, seed, avg, queue=None):
    config = {"queue_size": queue[0], "queue_source": queue[1]} if queue else {}
    return {"method": method, "seed": seed, "loss_config": config, "sts": {"avg": avg}}


def _sci(method, seed, ndcg):
    return {"method": method, "seed": seed, "test": {"ndcg@10": ndcg}}


def _write(tmp_path, cpu_runs, sci_runs):
    screen = {"seed": 1, "stop_after": 50, "references": {"mnrl": 84.0, "focal": 84.5},
              "runs": [{"label": "mnrl_queue512_online", "loss": "mnrl_queue", "stsb_dev": 84.6,
                        "changed": {"queue_size": 512, "queue_warmup_steps": 8}},
                       {"label": "focal_queue64_ema", "loss": "focal", "stsb_dev": 84.25,
                        "changed": {"queue_size": 64, "queue_warmup_steps": 8, "queue_source": "ema"}}]}
    (tmp_path / "tuning_queue.json").write_text(json.dumps(screen))
    (tmp_path / "cpu_protocol.json").write_text(json.dumps({"runs": cpu_runs}))
    (tmp_path / "scifact.json").write_text(json.dumps({"runs": sci_runs}))
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- queue-table:start -->\nold\n<!-- queue-table:end -->\noutro\n")
    return readme


def test_report_tables_and_targets(tmp_path):
    bench = _load()
    mnrl, focal_q = (75.0, 75.4, 75.2), (76.9, 76.6, 76.8)
    cpu = [_cpu("mnrl", s, v) for s, v in enumerate(mnrl)] + [_cpu("focal", s, 76.0) for s in range(3)]
    cpu += [_cpu("focal_queue", s, v, (64, "online")) for s, v in enumerate(focal_q)]
    sci = [_sci("focal", 0, 65.8), _sci("focal", 1, 66.0), _sci("focal_queue", 0, 66.3), _sci("focal_queue", 1, 65.9),
           _sci("focal_queue", 2, 70.0), _sci("cached_mnrl_4x", 0, 65.6)]
    readme = _write(tmp_path, cpu, sci)
    before = readme.read_text()
    assert bench.main(["--results", str(tmp_path)]) == 0
    text = (tmp_path / "queue.md").read_text()
    assert text == bench.report(tmp_path)  # the .md is what the JSON files render to
    # the screen: Δ against the loss's own no-queue reference at the same step
    assert "| mnrl_queue512_online | 512 | online | 84.60 | +0.60 |" in text
    assert "| focal_queue64_ema | 64 | ema | 84.25 | -0.25 |" in text
    gap = statistics.mean(focal_q) - statistics.mean(mnrl)
    row = f"| focal_queue | 64 rows, online | {statistics.mean(focal_q):.2f} ± {statistics.stdev(focal_q):.2f} |"
    assert row in text and f"`focal_queue` {gap:+.2f}, met." in text
    # SciFact: only the seeds both focal rows have (0 and 1), so seed 2's 70.0 does not count
    gain = ((66.3 - 65.8) + (65.9 - 66.0)) / 2
    assert f"focal_queue − focal = {gain:+.2f} nDCG@10 over seed(s) 0, 1: met." in text
    assert text.split("\n", 2)[2].startswith("Screen")  # the body under the title starts with the screen
    assert readme.read_text() == before  # a README beside the results is never rewritten


def test_targets_not_met_and_missing_rows(tmp_path):
    bench = _load()
    cpu = [_cpu("mnrl", s, 75.0) for s in range(3)] + [_cpu("mnrl_queue", s, 76.0, (512, "online")) for s in range(3)]
    sci = [_sci("focal", 0, 66.0), _sci("focal_queue", 0, 65.5)]
    _write(tmp_path, cpu, sci)
    text = bench.report(tmp_path)
    assert "`mnrl_queue` +1.00, not met." in text and "over seed(s) 0: not met." in text
    _write(tmp_path, cpu[:3] + cpu[3:5], [_sci("focal", 0, 66.0)])  # 2 seeds only; no focal_queue
    text = bench.report(tmp_path)
    assert "no queued row has 3 seeds yet" in text and "no seed has both focal and focal_queue yet" in text


def test_the_report_no_longer_takes_a_readme(tmp_path):
    bench = _load()
    readme = _write(tmp_path, [_cpu("mnrl", 0, 75.0)], [])
    readme.write_text("no markers here\n")
    with pytest.raises(SystemExit):  # --readme is gone: argparse refuses it by name
        bench.main(["--results", str(tmp_path), "--readme", str(readme)])
    assert readme.read_text() == "no markers here\n"  # left as it was


def test_missing_results_files_give_an_empty_report(tmp_path):
    assert _load().report(tmp_path) == "# The queue\n"
