"""Which tensors a cached loss holds at its peak, next to sentence-transformers' CachedMNRL: the term behind the
cached-peak ratio of the scale benchmark.

No model: the columns are random (N, d) embeddings, split into the per-mini-batch leaves GradCache hands to the loss
(c rows each), and each loss runs its GradCache step (2) with backward (``calculate_loss``; ours chunk the loss side
by c anchor rows, as CachedMNRL does). A dispatch mode records every tensor of at least c·d elements (one mini-batch's
embeddings: the per-mini-batch gradients count) that an operation outputs and keeps a running sum of the distinct
storages still alive (weak references; PyTorch keeps a tensor's Python object while autograd holds the tensor). The
peak of that sum and the tensors alive at it are reported, in units of one N × d float32 matrix; at c = d a
(c, N) chunk block is one unit too. The inputs themselves (2 columns) are held by every loss alike and not counted.

    python -m benchmarks.scale tensors                   # N 8192, d 32, c 32 -> results/scale_tensors.md
    python -m benchmarks.scale tensors --n 65536
"""

from __future__ import annotations

import argparse
import collections
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "benchmarks" / "results" / "scale_tensors.md"


class LiveTensors(TorchDispatchMode):
    """The distinct storages of operation outputs (of at least ``threshold`` elements) alive after each operation,
    and their peak. Each tracked tensor holds a weak reference whose callback releases its storage's bytes when the
    last tracked tensor on that storage dies, so the running total costs O(1) per operation."""

    def __init__(self, threshold: int, inputs: list[torch.Tensor]) -> None:
        super().__init__()
        self.threshold = threshold
        self.inputs = {t.untyped_storage().data_ptr() for t in inputs}  # aliases of the inputs are not counted
        self.refs: dict[int, tuple[weakref.ref, int]] = {}  # id(ref) -> (ref, storage pointer)
        self.storages: dict[int, list] = {}  # pointer -> [tracked tensors alive, bytes, label]
        self.labels: collections.Counter[str] = collections.Counter()  # label -> storages alive
        self.label_bytes: collections.Counter[str] = collections.Counter()
        self.total = 0
        self.peak = 0
        self.at_peak: dict[str, tuple[int, int]] = {}  # label -> (storages, bytes) alive at the peak

    def _release(self, ref: weakref.ref) -> None:
        _, pointer = self.refs.pop(id(ref))
        entry = self.storages[pointer]
        entry[0] -= 1
        if entry[0] == 0:
            del self.storages[pointer]
            self.total -= entry[1]
            self.labels[entry[2]] -= 1
            self.label_bytes[entry[2]] -= entry[1]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, tuple | list) else (out,):
            if isinstance(tensor, torch.Tensor) and tensor.numel() >= self.threshold:
                storage = tensor.untyped_storage()
                pointer = storage.data_ptr()
                if pointer in self.inputs:
                    continue
                ref = weakref.ref(tensor, self._release)
                self.refs[id(ref)] = (ref, pointer)
                if pointer in self.storages:
                    self.storages[pointer][0] += 1
                else:
                    label = f"{func.__name__ if hasattr(func, '__name__') else func} {tuple(tensor.shape)}"
                    self.storages[pointer] = [1, storage.nbytes(), label]
                    self.total += storage.nbytes()
                    self.labels[label] += 1
                    self.label_bytes[label] += storage.nbytes()
        if self.total > self.peak:
            self.peak = self.total
            self.at_peak = {k: (v, self.label_bytes[k]) for k, v in self.labels.items() if v}
        return out


def _cached_mnrl(n: int, d: int, c: int) -> Callable[[list[torch.Tensor]], Any]:
    from sentence_transformers.sentence_transformer.losses import CachedMultipleNegativesRankingLoss

    class _Sized(torch.nn.Sequential):  # what CachedMNRL's constructor inspects
        def get_embedding_dimension(self) -> int:
            return d

    loss = CachedMultipleNegativesRankingLoss(_Sized(torch.nn.Linear(1, 1)), scale=20.0, mini_batch_size=c)

    def run(columns: list[torch.Tensor]) -> Any:
        reps = [[column.detach()[i:i + c].requires_grad_() for i in range(0, n, c)] for column in columns]
        return loss.calculate_loss(reps, None, with_backward=True)

    return run


def _ours(factory: Callable[[], Any], c: int) -> Callable[[list[torch.Tensor]], Any]:
    loss = factory()
    loss.mini_batch_size = c  # chunk like GradCache would (no model is needed for the loss side)

    def run(columns: list[torch.Tensor]) -> Any:  # the GradCache path: per-mini-batch leaves, as CachedMNRL's
        reps = [[column.detach()[i:i + c].requires_grad_() for i in range(0, column.size(0), c)] for column in columns]
        return loss.calculate_loss(reps, None, with_backward=True)

    return run


def losses(n: int, d: int, c: int) -> dict[str, Callable[[list[torch.Tensor]], Any]]:
    from st_hardneg import FocalInfoNCELoss, HNCSELoss, MixCSELoss

    return {"cached_mnrl": _cached_mnrl(n, d, c),
            "focal": _ours(lambda: FocalInfoNCELoss(None), c),
            "mixcse (two-way)": _ours(lambda: MixCSELoss(None, directions=("query_to_doc", "doc_to_query"),
                                                         partition_mode="per_direction"), c),
            "hncse_pm": _ours(lambda: HNCSELoss(None, mode="pm"), c),
            "hncse_hnm": _ours(lambda: HNCSELoss(None, mode="hnm"), c)}


Alive = dict[str, tuple[int, int]]  # label -> (storages, bytes)


def measure(n: int, d: int, c: int) -> dict[str, tuple[float, Alive]]:
    """loss → (peak of the tracked live storages in N × d matrices, the tensors alive at that peak by label)."""
    matrix = n * d * 4
    out = {}
    for name, run in losses(n, d, c).items():
        torch.manual_seed(0)
        columns = [torch.randn(n, d).requires_grad_() for _ in range(2)]  # leaves, outside the mode
        mode = LiveTensors(c * d, columns)
        with mode:
            run(columns)
        out[name] = (mode.peak / matrix, mode.at_peak)
    return out


def alive_text(alive: Alive, matrix: int) -> str:
    """The labels alive at a peak, largest first, with their total in N × d matrices; those under 0.1 together."""
    ranked = sorted(alive.items(), key=lambda item: -item[1][1])
    shown = [f"{count}× {label} = {size / matrix:.1f}" for label, (count, size) in ranked if size >= 0.1 * matrix]
    rest = sum(size for _, (_, size) in ranked if size < 0.1 * matrix)
    return "; ".join(shown + ([f"smaller ones = {rest / matrix:.1f}"] if rest else []))


def markdown(results: dict[str, tuple[float, Alive]], n: int, d: int, c: int) -> str:
    from st_hardneg.reporting import markdown_table

    reference = results["cached_mnrl"][0]
    body = [[name, f"{peak:.1f}", f"{peak - reference:+.1f}", alive_text(alive, n * d * 4)]
            for name, (peak, alive) in results.items()]
    return (f"# Live tensors of a cached loss step (N {n}, d {d}, chunks of {c})\n\n"
            + markdown_table(["loss", "peak (N×d float32 matrices)", "vs cached_mnrl", "alive at the peak"], body,
                             align=["l", "r", "r", "l"])
            + f"\nOne N×d float32 matrix = {n * d * 4 / 2**20:.1f} MB. Outputs of at least c·d elements; the "
              "2 input columns (held by every loss) and their aliases are not counted. "
              "`python -m benchmarks.scale tensors`\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale tensors", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--d", type=int, default=32)
    parser.add_argument("--c", type=int, default=32)
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    for name, low in (("n", 2), ("d", 1), ("c", 1)):
        if getattr(args, name) < low:
            parser.error(f"--{name} must be at least {low}, got {getattr(args, name)}")
    torch.set_num_threads(1)
    text = markdown(measure(args.n, args.d, args.c), args.n, args.d, args.c)
    Path(args.out).write_text(text)
    print(text)
    return 0
