"""End-to-end multi-process training: SentenceTransformerTrainer under torchrun, CPU, gloo, a tiny random BERT.

Each process builds the same tiny model (fixed seed), trains ``--steps`` optimizer steps with ``--loss`` (a name of
``st_hardneg.training.LOSSES``) and ``gather_across_devices=True``, and rank 0 prints one JSON line: the per-step
training losses, the loss configuration and whether the weights are identical on every process after training
(a checksum all-gathered from every rank), which is what distributed data parallel guarantees.

    torchrun --nproc_per_node 2 examples/ddp_train.py --loss mnrl
    torchrun --nproc_per_node 2 examples/ddp_train.py --loss mnrl --mini-batch-size 2   # GradCache + gather

Run it from the repository root (with ``PYTHONPATH=$PWD`` when the installed package points elsewhere). With
``--mini-batch-size`` the loss gets ``mini_batch_size`` (every st-hardneg loss caches by itself, e.g.
``MixCSELoss(model, gather_across_devices=True, mini_batch_size=2)``); a loss that does not take it
(sentence-transformers' MultipleNegativesRankingLoss) is wrapped in ``st_hardneg.losses.gradcache.GradCached``. ``--no-gather`` trains without
``gather_across_devices`` (each process then only sees its own in-batch negatives).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path


def sentences(count: int, seed: int) -> list[str]:
    """``count`` distinct short sentences over the tiny model's vocabulary."""
    from st_hardneg.testing import WORDS

    rng = random.Random(seed)
    out: dict[str, None] = {}
    while len(out) < count:
        out[" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))) + "."] = None
    return list(out)


def build(loss_name: str, model, gather: bool, mini_batch_size: int | None):
    from st_hardneg.losses.gradcache import GradCached
    from st_hardneg.training import build_loss

    kwargs = {"gather_across_devices": True} if gather else {}
    if mini_batch_size is None:
        return build_loss(loss_name, model, **kwargs)
    try:
        return build_loss(loss_name, model, mini_batch_size=mini_batch_size, **kwargs)
    except ValueError as exc:
        if "mini_batch_size" not in str(exc):
            raise
        return GradCached(build_loss(loss_name, model, **kwargs), mini_batch_size=mini_batch_size)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loss", default="mnrl", help="a name of st_hardneg.training.LOSSES")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8, help="per process")
    parser.add_argument("--mini-batch-size", type=int, default=None, help="GradCache mini-batch (default: off)")
    parser.add_argument("--no-gather", action="store_true", help="train without gather_across_devices")
    parser.add_argument("--work-dir", default=None, help="default: a temporary directory")
    parser.add_argument("--out", default=None, help="also write rank 0's JSON summary here")
    args = parser.parse_args(argv)

    import torch
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments

    from st_hardneg.models import load_model
    from st_hardneg.testing import make_tiny_model_dir

    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    torch.set_num_threads(1)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="ddp-train-"))
    # every process builds the same weights (fixed seed) in its own directory: no cross-process file race
    model = load_model(make_tiny_model_dir(work / f"tiny-bert-rank{rank}", seed=0), pooling="cls",
                       max_seq_length=32, device="cpu")
    loss = build(args.loss, model, gather=not args.no_gather, mini_batch_size=args.mini_batch_size)
    text = sentences(args.steps * args.batch_size * world_size, seed=0)
    dataset = Dataset.from_dict({"anchor": text, "positive": text})
    training_args = SentenceTransformerTrainingArguments(
        output_dir=str(work / "out"), max_steps=args.steps, per_device_train_batch_size=args.batch_size,
        learning_rate=1e-4, warmup_steps=0, logging_steps=1, save_strategy="no", report_to="none", use_cpu=True,
        ddp_backend="gloo" if world_size > 1 else None, dataloader_drop_last=True, seed=0, disable_tqdm=True,
    )
    trainer = SentenceTransformerTrainer(model=model, args=training_args, train_dataset=dataset, loss=loss)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start

    checksum = torch.tensor([sum(float(p.detach().double().sum()) for p in model.parameters())], dtype=torch.float64)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        gathered = [torch.zeros_like(checksum) for _ in range(world_size)]
        torch.distributed.all_gather(gathered, checksum)
        checksums = [float(c) for c in gathered]
    else:
        checksums = [float(checksum)]
    if rank == 0:
        config = loss.get_config_dict() if hasattr(loss, "get_config_dict") else {}
        summary = {
            "loss": args.loss, "loss_class": type(loss).__name__,
            "loss_config": json.loads(json.dumps(config, default=str)),
            "world_size": world_size, "per_device_batch_size": args.batch_size,
            "global_batch_size": args.batch_size * world_size, "mini_batch_size": args.mini_batch_size,
            "steps": trainer.state.global_step,
            "train_losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
            "train_seconds": round(seconds, 3), "weight_checksums": checksums,
            "weights_identical_across_ranks": len(set(checksums)) == 1,
        }
        line = json.dumps(summary)
        print(line, flush=True)
        if args.out:
            Path(args.out).write_text(line + "\n")
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()  # every process is done with its collectives before any of them leaves
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without interpreter teardown: there the DDP reducer's process group is destroyed while a gloo worker
    # thread waits for the GIL, which either aborts the process ("terminate called without an active exception",
    # SIGABRT) or deadlocks in ProcessGroupGloo's destructor (both seen on 2 cores). Everything is written by now.
    os._exit(code)
