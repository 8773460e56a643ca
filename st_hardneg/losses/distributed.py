"""Cross-process helpers for ``gather_across_devices``, thin wrappers over sentence-transformers' collectives.

Every helper is the identity when no ``torch.distributed`` process group is initialised, so a loss can call them
unconditionally (and, unlike ``sentence_transformers.util.all_gather``, without logging a warning on one device).

Gradient semantics of :func:`gather_with_grad` (it is ``sentence_transformers.util.all_gather_with_grad``, i.e.
``torch.distributed.nn.all_gather``): the backward pass sums, over all processes, the gradient that each process's
loss sends to every slice of the gathered tensor and hands each process the sum for its own slice (a reduce-scatter
with ``SUM``). With ``W`` processes each computing the mean loss ``L_r`` of its own anchors, the gradient process
``r`` receives for its local embeddings is ``sum_r' dL_r' / dx_r = W * dL / dx_r`` where ``L = mean_r L_r`` is the
loss of the whole global batch. Distributed data parallel averages parameter gradients over processes, which divides
that factor ``W`` out again: the parameter update equals the single-process update on the global batch.

Example::

    from st_hardneg.losses import distributed as dist_utils

    candidates = dist_utils.gather_with_grad(positives)       # (W * n, d): every process's positives
    own = dist_utils.local_rows(anchors.size(0))              # this process's rows inside ``candidates``
    labels = torch.arange(own.start, own.stop)                 # positive of local anchor i = global row own.start + i
"""

from __future__ import annotations

import torch
from sentence_transformers.util import all_gather, all_gather_with_grad
from torch import Tensor

__all__ = [
    "is_distributed",
    "rank",
    "world_size",
    "gather_with_grad",
    "gather",
    "broadcast_from_rank0",
    "shared_seed",
    "local_rows",
    "check_equal_local_batches",
]


def is_distributed() -> bool:
    """Whether a ``torch.distributed`` process group is initialised (the helpers below are identities if not)."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def rank() -> int:
    """This process's rank (0 without a process group)."""
    return torch.distributed.get_rank() if is_distributed() else 0


def world_size() -> int:
    """The number of processes (1 without a process group)."""
    return torch.distributed.get_world_size() if is_distributed() else 1


def gather_with_grad(tensor: Tensor) -> Tensor:
    """Concatenate ``tensor`` of every process along dim 0, in rank order, keeping the autograd graph.

    Gradients flow back to the process that owns each slice (see the module docstring for the exact scaling).
    Every process must pass a tensor of the same shape (see :func:`check_equal_local_batches`).
    """
    if not is_distributed():
        return tensor
    return all_gather_with_grad(tensor)


def gather(tensor: Tensor) -> Tensor:
    """Concatenate ``tensor`` of every process along dim 0, in rank order, without any gradient (detached)."""
    if not is_distributed():
        return tensor.detach()
    return all_gather(tensor.detach(), with_grad=False).detach()


def broadcast_from_rank0(tensor: Tensor) -> Tensor:
    """Rank 0's value of ``tensor`` on every process (a new tensor; the input is left untouched).

    Use it for anything that must be identical everywhere, e.g. a random permutation of the gathered batch.
    """
    if not is_distributed():
        return tensor
    out = tensor.detach().clone().contiguous()
    torch.distributed.broadcast(out, src=0)
    return out


def shared_seed(device: torch.device | str = "cpu") -> int:
    """A random 63-bit seed drawn from rank 0's global torch RNG and broadcast, so that a ``torch.Generator`` seeded
    with it draws the same numbers on every process. Without a process group: a draw from the global RNG."""
    seed = torch.randint(0, 2**62, (1,), dtype=torch.int64).to(device)
    return int(broadcast_from_rank0(seed).item())


def sum_across(tensor: Tensor) -> Tensor:
    """The sum of ``tensor`` over every process (detached; a new tensor), e.g. counts of usable rows; the tensor
    itself without a process group."""
    if not is_distributed():
        return tensor.detach()
    out = tensor.detach().clone().contiguous()
    torch.distributed.all_reduce(out)
    return out


def local_rows(n_local: int) -> slice:
    """The rows of this process's ``n_local`` local items inside a tensor gathered by :func:`gather_with_grad`."""
    if n_local < 0:
        raise ValueError(f"n_local must be >= 0, got {n_local}")
    start = rank() * n_local
    return slice(start, start + n_local)


def check_equal_local_batches(n_local: int, device: torch.device | str = "cpu") -> None:
    """Raise ``ValueError`` on every process unless all processes hold ``n_local`` items (gathering needs equal
    shapes; a ragged last batch would otherwise fail deep inside the collective or misalign rows). Costs one
    all-reduce; a no-op without a process group."""
    if not is_distributed():
        return
    sizes = torch.tensor([n_local, -n_local], dtype=torch.int64, device=device)
    torch.distributed.all_reduce(sizes, op=torch.distributed.ReduceOp.MAX)
    largest, smallest = int(sizes[0]), -int(sizes[1])
    if largest != smallest:
        raise ValueError(
            f"gather_across_devices needs the same local batch size on every process, got sizes between {smallest} "
            f"and {largest}; drop the last incomplete batch (dataloader_drop_last=True)."
        )
