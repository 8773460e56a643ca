"""examples/ddp_train.py end to end: torchrun, 2 CPU processes (gloo), SentenceTransformerTrainer, 4 steps."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

#: the losses run under torchrun here: ST's MNRL (wrapped in GradCached) and every st-hardneg loss (its own mini_batch_size)
DDP_LOSSES = ["mnrl", "mixcse", "focal", "hncse", "adcse"]


@pytest.mark.distributed
@pytest.mark.parametrize("loss", DDP_LOSSES)
def test_torchrun_two_processes_gather_and_gradcache(tmp_path, loss):
    out = tmp_path / "summary.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(REPO / "examples" / "ddp_train.py"), "--loss", loss, "--mini-batch-size", "2",
           "--work-dir", str(tmp_path / "work"), "--out", str(out)]
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary["world_size"] == 2 and summary["global_batch_size"] == 16
    assert summary["steps"] == 4 and len(summary["train_losses"]) == 4
    assert all(math.isfinite(x) and x > 0 for x in summary["train_losses"])
    assert summary["loss_config"]["gather_across_devices"] is True
    assert summary["loss_config"]["mini_batch_size"] == 2
    # the st-hardneg losses cache by themselves (their own mini_batch_size), only ST's MNRL needs the wrapper
    assert (summary["loss_class"] == "GradCached") == (loss == "mnrl")
    # DDP kept the replicas in sync, and training moved them away from the initial weights
    assert summary["weights_identical_across_ranks"]
    assert len(set(summary["weight_checksums"])) == 1
