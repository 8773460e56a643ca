"""Test harness for ``gather_across_devices``: run code in 2 CPU processes (gloo) and compare with one process.

The worker functions live here, in an importable module, because ``torch.multiprocessing.spawn`` pickles them by
reference into fresh interpreters. The process group is set up with a ``file://`` init method in a caller-given
directory (no network port).

The exactness criterion (see :mod:`st_hardneg.losses.distributed` for the derivation): split a batch of ``N`` rows into
``W`` equal contiguous shards, one per process; process ``r`` computes the mean loss ``L_r`` of its anchors against
the gathered candidates and back-propagates it. Then

* ``mean_r L_r == L``, the single-process loss on the whole batch;
* the gradient that process ``r`` finds on its shard ``x_r`` equals ``W * dL/dx_r`` (the backward of the gather
  sums every process's gradient for ``x_r``), i.e. ``concat_r(grad_r) / W == dL/dx``;
* parameter gradients averaged over processes (what DDP does) equal the single-process parameter gradients.

Random draws: process ``r`` seeds its global RNG with ``seed + r`` while the single-process reference uses
``seed``. A loss that draws from rank 0's RNG on every process (``st_hardneg.losses.distributed.shared_seed``) therefore
matches; one that draws locally does not, which the tests can detect.

Example::

    result = compare_with_single_process(make_loss, embeddings, None, workdir=tmp_path)
    assert abs(result["distributed_loss_mean"] - result["single_loss"]) < 1e-5
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor

__all__ = [
    "spawn", "spawn_jobs", "gathered_loss_job", "compare", "compare_with_single_process", "loss_and_embedding_grads",
    "model_step", "average_parameter_grads",
]


def _entry(rank: int, world_size: int, init_file: str, jobs: list, out_dir: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        results = [fn(rank, world_size, *args) for fn, args in jobs]
        with open(Path(out_dir) / f"rank{rank}.pkl", "wb") as handle:
            pickle.dump(results, handle)
        # every rank is done with its collectives before any tears the group down (a rank that exits while its peer
        # still talks to it can abort gloo's threads: "terminate called without an active exception", SIGABRT)
        torch.distributed.barrier()
    finally:
        torch.distributed.destroy_process_group()


def spawn_jobs(jobs: list[tuple[Callable, tuple]], workdir: str | Path, world_size: int = 2) -> list[list[Any]]:
    """Run every ``fn(rank, world_size, *args)`` of ``jobs`` in turn, in ``world_size`` fresh processes joined in one
    gloo process group (starting the processes dominates the cost, so batch the jobs of a test module).

    Each ``fn`` must be picklable by reference (a module-level function) and its result picklable (CPU tensors).
    Returns, for each job, its results in rank order. ``workdir`` holds the rendezvous file and the results; use a
    fresh directory for every call (a ``tmp_path``).
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    init_file = workdir / "dist_init"
    if init_file.exists():
        raise ValueError(f"{init_file} exists: use a fresh directory for each spawn")
    torch.multiprocessing.spawn(
        _entry, args=(world_size, str(init_file), list(jobs), str(workdir)), nprocs=world_size, join=True
    )
    per_rank = []
    for rank in range(world_size):
        with open(workdir / f"rank{rank}.pkl", "rb") as handle:
            per_rank.append(pickle.load(handle))
    return [[per_rank[rank][job] for rank in range(world_size)] for job in range(len(jobs))]


def spawn(fn: Callable, args: tuple, workdir: str | Path, world_size: int = 2) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` gloo processes (see :func:`spawn_jobs`); returns the
    results in rank order."""
    return spawn_jobs([(fn, args)], workdir, world_size)[0]


def loss_and_embedding_grads(make_loss: Callable[[], Any], embeddings: list[Tensor], labels: Tensor | None,
                             seed: int) -> tuple[float, list[Tensor]]:
    """The loss of ``make_loss().compute_loss_from_embeddings`` on leaf copies of ``embeddings`` (RNG seeded with
    ``seed`` first) and the gradients of those leaves."""
    torch.manual_seed(seed)
    loss_fn = make_loss()
    leaves = [e.detach().clone().requires_grad_(True) for e in embeddings]
    loss = loss_fn.compute_loss_from_embeddings(leaves, labels)
    loss.backward()
    grads = [torch.zeros_like(leaf) if leaf.grad is None else leaf.grad.detach().clone() for leaf in leaves]
    return float(loss.detach()), grads


def _shard(tensor: Tensor | None, rank: int, world_size: int) -> Tensor | None:
    if tensor is None:
        return None
    if tensor.size(0) % world_size:
        raise ValueError(f"batch of {tensor.size(0)} rows does not split into {world_size} equal shards")
    n = tensor.size(0) // world_size
    return tensor[rank * n:(rank + 1) * n]


def _gathered_loss_worker(rank: int, world_size: int, make_loss: Callable, embeddings: list[Tensor],
                          labels: Tensor | None, seed: int) -> tuple[float, list[Tensor]]:
    local = cast(list[Tensor], [_shard(e, rank, world_size) for e in embeddings])  # no column is None
    return loss_and_embedding_grads(make_loss, local, _shard(labels, rank, world_size), seed + rank)


def gathered_loss_job(make_loss: Callable[[], Any], embeddings: list[Tensor], labels: Tensor | None = None,
                      seed: int = 0) -> tuple[Callable, tuple]:
    """A :func:`spawn_jobs` job: process ``r`` runs ``make_loss().compute_loss_from_embeddings`` on the ``r``-th of
    ``world_size`` equal row shards of every column (RNG seeded ``seed + r``), returning its loss and shard grads."""
    return _gathered_loss_worker, (make_loss, [e.detach() for e in embeddings], labels, seed)


def compare(make_loss: Callable[[], Any], embeddings: list[Tensor], labels: Tensor | None,
            rank_results: list[tuple[float, list[Tensor]]], seed: int = 0) -> dict[str, Any]:
    """Put the ranks' results of :func:`gathered_loss_job` next to the single-process run on the whole batch.

    Returns a dict with ``single_loss``, ``single_grads`` (one per column), ``distributed_losses`` (per rank),
    ``distributed_loss_mean``, ``distributed_grads`` (per column: the ranks' shard gradients concatenated in rank
    order, **not** rescaled) and ``world_size``.
    """
    single_loss, single_grads = loss_and_embedding_grads(make_loss, embeddings, labels, seed)
    losses = [loss for loss, _ in rank_results]
    grads = [torch.cat([grads[c] for _, grads in rank_results]) for c in range(len(embeddings))]
    return {
        "single_loss": single_loss,
        "single_grads": single_grads,
        "distributed_losses": losses,
        "distributed_loss_mean": sum(losses) / len(losses),
        "distributed_grads": grads,
        "world_size": len(rank_results),
    }


def compare_with_single_process(make_loss: Callable[[], Any], embeddings: list[Tensor], labels: Tensor | None,
                                workdir: str | Path, world_size: int = 2, seed: int = 0) -> dict[str, Any]:
    """:func:`gathered_loss_job` in ``world_size`` gloo processes, then :func:`compare` (one spawn per call)."""
    job = gathered_loss_job(make_loss, embeddings, labels, seed)
    return compare(make_loss, embeddings, labels, spawn_jobs([job], workdir, world_size)[0], seed)


def _shard_list(items: list, rank: int, world_size: int) -> list:
    if len(items) % world_size:
        raise ValueError(f"batch of {len(items)} items does not split into {world_size} equal shards")
    n = len(items) // world_size
    return items[rank * n:(rank + 1) * n]


def model_step(rank: int, world_size: int, make_loss: Callable, model_dir: str, columns: list[list[str]],
               seed: int = 0, pooling: str = "cls") -> tuple[float, dict[str, Tensor | None]]:
    """One forward + backward of ``make_loss(model)`` on this process's shard of the text ``columns``.

    The model is the tiny test BERT at ``model_dir`` (``pooling``, CLS by default) in float64 and eval mode (no dropout), so the
    cached and uncached forwards are comparable to 1e-10. Under a process group the parameter gradients are averaged
    over processes as DDP does; called directly (rank 0 of 1) it is the single-process reference. Returns the loss
    and every parameter gradient (``None`` for unused parameters).
    """
    from st_hardneg.models import load_model

    model = load_model(model_dir, pooling=pooling, max_seq_length=32, device="cpu").double().eval()
    loss_fn = make_loss(model)
    features = [dict(model.tokenize(_shard_list(column, rank, world_size))) for column in columns]
    torch.manual_seed(seed + rank)
    loss = loss_fn(features, None)
    loss.backward()
    if world_size > 1:
        average_parameter_grads(model)
    grads = {name: None if p.grad is None else p.grad.detach().clone() for name, p in model.named_parameters()}
    return float(loss.detach()), grads


def average_parameter_grads(module: torch.nn.Module) -> None:
    """Average every parameter gradient over the processes in place (what DistributedDataParallel does)."""
    world_size = torch.distributed.get_world_size()
    for param in module.parameters():
        if param.grad is not None:
            torch.distributed.all_reduce(param.grad, op=torch.distributed.ReduceOp.SUM)
            param.grad /= world_size


def queued_steps(rank: int, world_size: int, batches: list[list[Tensor]], queue_size: int,
                 gather: bool = True) -> dict[str, Any]:
    """A Focal-InfoNCE loss with a cross-batch queue over a sequence of batches, one optimizer step after each: this
    process's shard of every batch (``world_size`` 1: the whole batch). Returns the per-step losses and the final
    queue (vectors, filled), to compare 2 processes with 1."""
    from torch import nn

    from st_hardneg.losses.focal import FocalInfoNCELoss

    model = nn.Linear(2, 2)
    loss = FocalInfoNCELoss(cast(Any, model), queue_size=queue_size, gather_across_devices=gather)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    losses = []
    for batch in batches:
        shard = [cast(Tensor, _shard(column, rank, world_size)) for column in batch]
        losses.append(float(loss.compute_loss_from_embeddings(shard, None)))
        model.weight.grad = torch.zeros_like(model.weight)
        optimizer.step()
    assert loss.queue is not None
    vectors = loss.queue.vectors
    return {"losses": losses, "filled": loss.queue.filled,
            "vectors": None if vectors is None else vectors.clone()}


def ema_queued_model_steps(rank: int, world_size: int, model_dir: str, steps: list[list[list[str]]],
                           queue_size: int, mini_batch_size: int | None = None) -> dict[str, Any]:
    """Focal-InfoNCE with a ``queue_source="ema"`` queue on the tiny test BERT (float64, mean pooling, eval mode),
    trained one SGD step per entry of ``steps`` (text columns) on this process's shard, gradients averaged as DDP
    does; with ``world_size`` 1 (called directly) the single-process reference. Returns the per-step losses, the
    queue's rows and its key encoder's first parameter, to compare 2 processes with 1."""
    from st_hardneg.losses.focal import FocalInfoNCELoss
    from st_hardneg.models import load_model

    model = load_model(model_dir, pooling="mean", max_seq_length=32, device="cpu").double().eval()
    loss_fn = FocalInfoNCELoss(model, queue_size=queue_size, queue_source="ema", queue_momentum=0.5,
                               gather_across_devices=world_size > 1, mini_batch_size=mini_batch_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for columns in steps:
        optimizer.zero_grad()
        features = [dict(model.tokenize(_shard_list(column, rank, world_size))) for column in columns]
        loss = loss_fn(features, None)
        loss.backward()
        if world_size > 1:
            average_parameter_grads(model)
        optimizer.step()
        losses.append(float(loss.detach()))
    queue = cast(Any, loss_fn.queue)
    return {"losses": losses, "filled": queue.filled, "vectors": queue.vectors.clone(),
            "key_param": next(queue.key_encoder.parameters()).detach().clone()}
