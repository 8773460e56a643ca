"""The worker half of ``benchmarks.scale`` (``python -m benchmarks.scale worker CONFIG``): one configuration (method, variant, batch, processes) measured in a
fresh process: peak memory from ``/proc/self/status`` and step times of a few training steps."""

from __future__ import annotations

import gc
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.scale.report import REFERENCE, REFERENCE_TWO_WAY


def _status_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    """Reset the kernel's resident-set high-water mark of this process to its current RSS (Linux); True if done."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return _status_kb("VmHWM") is not None


#: the environment of a memory run (``benchmarks.scale`` launches each configuration twice: timed, and measured with this)
MEMORY_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}


def _ru_maxrss_kb() -> int:
    value = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return value // 1024 if sys.platform == "darwin" else value  # bytes on macOS, kilobytes on Linux


def build_benchmark_loss(method: str, model, cached: bool, mini_batch_size: int, gather: bool):
    """The loss of ``method`` (a name of ``st_hardneg.training.registry.LOSSES``, ``cached_mnrl`` or
    ``cached_mnrl_two_way``, the same with both directions).

    Raises:
        ValueError: the loss rejects ``mini_batch_size`` or ``gather_across_devices`` (reported as not supported),
            or ``cached_mnrl`` (``cached_mnrl_two_way``) asked for uncached (it is ``mnrl``).
    """
    kwargs: dict[str, Any] = {"gather_across_devices": True} if gather else {}
    if method in (REFERENCE, REFERENCE_TWO_WAY):
        if not cached:
            raise ValueError(f"{method} is always cached" + ("; its uncached counterpart is mnrl"
                                                              if method == REFERENCE else ""))
        from sentence_transformers.sentence_transformer.losses import CachedMultipleNegativesRankingLoss

        two_way = {"directions": ("query_to_doc", "doc_to_query"), "partition_mode": "per_direction"} \
            if method == REFERENCE_TWO_WAY else {}
        return CachedMultipleNegativesRankingLoss(model, scale=20.0, mini_batch_size=mini_batch_size, **two_way,
                                                  **kwargs)
    from benchmarks.methods import registry_loss
    from st_hardneg.training.registry import build_loss

    if cached:
        kwargs["mini_batch_size"] = mini_batch_size
    return build_loss(registry_loss(method), model, **kwargs)


def _load_model(spec: str, max_seq_length: int, work: Path):
    from st_hardneg.models import resolve_model
    from st_hardneg.testing import make_tiny_model_dir

    if spec == "tiny":
        return resolve_model(make_tiny_model_dir(work / "tiny-bert", seed=0), pooling="cls",
                             max_seq_length=max_seq_length, device="cpu")
    return resolve_model(spec, pooling="cls", max_seq_length=max_seq_length, device="cpu")


def run_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """Run one configuration in this process (the ``worker`` subcommand; under torchrun, one rank of it)."""
    import torch

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    torch.set_num_threads(cfg["threads"])
    torch.manual_seed(cfg["seed"])
    from st_hardneg.data import read_corpus

    batch, steps = cfg["batch_size"], cfg["steps"]
    if batch % world:
        raise ValueError(f"global batch {batch} is not divisible by {world} processes")
    local = batch // world
    # the model before the process group: transformers' save_pretrained writes nothing on a non-main rank
    with tempfile.TemporaryDirectory(prefix=f"scale-rank{rank}-") as tmp:
        model = _load_model(cfg["model"], cfg["max_seq_length"], Path(tmp))
    dist = None
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo")
    model.train()
    sentences = read_corpus(cfg["corpus"])
    needed = batch * steps
    pool = (sentences * (needed // len(sentences) + 1))[:needed]  # distinct sentences unless the corpus is short
    # step s, rank r: its slice of the s-th global batch (the same global batches as with 1 process)
    texts = [pool[s * batch + rank * local: s * batch + (rank + 1) * local] for s in range(steps)]
    batches = [model.preprocess(t) for t in texts]
    try:
        loss = build_benchmark_loss(cfg["method"], model, cfg["variant"] == "cached", cfg["mini_batch_size"],
                                    gather=world > 1)
    except (ValueError, TypeError) as exc:
        if dist is not None:
            dist.destroy_process_group()
        return {"status": "not supported", "reason": str(exc)}
    loss.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=3e-5)

    def train_step(features: dict[str, Any]) -> tuple[float, float]:
        if dist is not None:
            dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        value = loss([dict(features), dict(features)], None)  # fresh dicts: the model writes into them
        value.backward()
        if dist is not None:
            grads = [p.grad for p in params if p.grad is not None]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat)
            flat /= world
            offset = 0
            for g in grads:
                g.copy_(flat[offset: offset + g.numel()].view_as(g))
                offset += g.numel()
            del flat
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        return time.perf_counter() - start, float(value.detach())

    gc.collect()
    baseline_kb = _status_kb("VmRSS") or _ru_maxrss_kb()
    memory_method = "VmHWM after clear_refs reset" if _reset_peak() else "ru_maxrss (whole process)"
    if os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        memory_method += f", glibc mmap threshold fixed at {os.environ['MALLOC_MMAP_THRESHOLD_']} bytes"
    seconds, values = [], []
    for features in batches:
        step_seconds_, value_ = train_step(features)
        seconds.append(step_seconds_)
        values.append(value_)
    peak_kb = _status_kb("VmHWM") if memory_method.startswith("VmHWM") else _ru_maxrss_kb()
    state_bytes = sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
    state_bytes += sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
                       if torch.is_tensor(t) and t.dim() > 0)
    per_rank = {"seconds": seconds, "peak_mb": (peak_kb - baseline_kb) / 1024, "baseline_mb": baseline_kb / 1024}
    if dist is not None:
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, per_rank)
        dist.destroy_process_group()
    else:
        gathered = [per_rank]
    step_seconds = [max(r["seconds"][s] for r in gathered) for s in range(steps)]  # the slower rank's
    measured = step_seconds[1:] or step_seconds
    if not all(v == v and abs(v) != float("inf") for v in values):
        raise RuntimeError(f"non-finite loss values {values}")
    return {
        "status": "ok", "loss_class": type(loss).__name__,
        "step_ms": round(1000 * statistics.median(measured), 2),
        "step_seconds": [round(s, 4) for s in step_seconds],
        "peak_mb": round(max(r["peak_mb"] for r in gathered), 1),
        "peak_mb_per_rank": [round(r["peak_mb"], 1) for r in gathered],
        "baseline_rss_mb": round(max(r["baseline_mb"] for r in gathered), 1),
        "state_mb": round(state_bytes / 2**20, 1),
        "memory_method": memory_method, "loss_values": [round(v, 5) for v in values],
        "torch_threads": torch.get_num_threads(), "world_size": world, "per_process_batch_size": local,
    }
