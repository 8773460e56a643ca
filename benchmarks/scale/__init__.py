"""Scaling with the batch size: peak memory and step time, uncached vs GradCache (``mini_batch_size``), 1 vs 2 processes.

For every method and batch size (default 64, 1024 and 8192) one configuration trains a few steps and reports

* ``step_ms``: the median wall time of a full training step after one warm-up step (zero_grad, forward of both
  columns, loss, backward, gradient clipping at 1.0 and an AdamW step, as in ``benchmarks/overhead.py``), with
  ``torch.set_num_threads`` fixed (the protocol's ``threads``, recorded);
* ``peak_mb``: the peak resident memory during the first 2 steps minus the resident memory just before them (model
  loaded, batches tokenised, loss and optimizer built, garbage collected), i.e. what training the batch adds:
  gradients, AdamW's two moments (``state_mb``, reported separately: it does not depend on the batch) and the
  activations, measured in a separate run with glibc's mmap threshold fixed, as described below;
* ``default_malloc_peak_mb``: the same high-water mark over the timed steps, with the allocator as users run it.

Variants: ``uncached`` builds the loss as registered; ``cached`` passes ``mini_batch_size`` (the protocol's
``mini_batch_size``, 32, GradCache and loss rows in chunks). A loss that rejects the argument is reported as "not supported", not
run. sentence-transformers' ``CachedMultipleNegativesRankingLoss`` (``cached_mnrl``, scale 20 as our ``mnrl``) is the
reference. Targets (ratios in one run; :mod:`benchmarks.scale.report`): the cached peak at the largest batch within
1.3x of batch 64's; the cached peak within 1.2x of ``cached_mnrl``'s at the same batch; the cached step time within
1.15x of ``cached_mnrl``'s from batch 1024 on; 2 processes at the same global batch within 0.6x of 1 process.

The distributed part runs the same step in 2 processes under ``torch.distributed.run`` (gloo, CPU, each process half
the global batch, the loss with ``gather_across_devices=True``, the gradients averaged with one all-reduce after the
backward pass, which is what DistributedDataParallel computes, without its overlap of communication and backward),
and compares its step time (the slower rank's) with 1 process at the same global batch.

Why resident memory, and why a second run. PyTorch has no allocator statistics on the CPU
(``torch.cuda.max_memory_allocated`` is CUDA only, and profiling every allocation with ``torch.profiler`` slows the
step it measures). Each configuration runs in a fresh subprocess; the worker resets the kernel's high-water mark of
the resident set (``echo 5 > /proc/self/clear_refs``, Linux >= 4.0) and reads ``VmHWM`` from ``/proc/self/status``.
With glibc's defaults that mark measures the allocator as much as the loss: glibc raises its mmap threshold to the
size of every mapped buffer that is freed, so from the first chunk on the per-chunk buffers (32 x B floats) come from
the heap, and the heap keeps what they leave behind. Measured on the tiny model, first step, batch 4096 / 8192 /
16384: ``cached_mnrl`` 66 / 119 / 313 MB, our cached Focal-InfoNCE 118 / 269 / 1088 MB, while the largest set of
tensors alive at once in Focal's step (every op's output tracked with a dispatch mode) was 10 MB at batch 4096. So
each configuration is run a second time, in fresh processes, with ``MALLOC_MMAP_THRESHOLD_=131072`` in the
environment (``benchmarks.scale.worker.MEMORY_ENV``), which fixes the threshold at 128 KiB and stops its dynamic raise: every
buffer from 128 KiB up is then mapped on allocation and unmapped on free, and ``peak_mb`` follows the live buffers,
the number a GPU user reads from ``max_memory_allocated``. (Fixing the threshold in the timed process instead, after
its steps, was tried first: the heap those steps had spread kept the small buffers scattered, and the mark varied
from 27 to 245 MB for the same configuration.) Where there is no glibc the variable is ignored and ``peak_mb`` is the
default allocator's; without ``clear_refs``, ``memory_method`` says ``ru_maxrss`` (the whole process's mark).
On a CPU training machine, ``MALLOC_MMAP_THRESHOLD_=131072`` in the environment gives the same behaviour to a real
run of a large cached batch.

Before starting a configuration the trial extrapolates its memory from the largest smaller batch already measured
(same method and variant; the batch-independent ``state_mb`` plus the rest scaled linearly) and skips it ("skipped",
a failed trial) if that exceeds ``memory_fraction`` (0.8) of ``MemAvailable``: uncached
all-MiniLM-L6-v2 needs about 1.4 GB of activations per 64 pairs at length 32 (1.66 GB peak measured at batch 64), so
about 22 GB at batch 1024, more than a 23 GB machine has. A loss found "not supported" is not started again at the
next batch size.

Model and grid. The default grid is ``mnrl``, ``cached_mnrl``, ``mixcse``, ``focal``, ``hncse_pm``,
``hncse_hnm`` and ``adcse`` at batches 64, 1024 and 8192, both variants, 3 steps, 1 torch thread, and the 2-process
comparison at global batch 1024, cached, on ``model`` ``tiny`` (a random 2-layer BERT, hidden 32, CLS pooling,
max_seq_length 32): about 46 subprocesses, 10-20 s each up to batch 1024 and 1-2 min at 8192. Its peaks are small (tens to hundreds of MB) and
the B x B similarity matrices weigh more in them than they would next to a real encoder.

all-MiniLM-L6-v2 (``model`` ``default``) is far more expensive on 2 CPU cores. Measured on the shared machine (load
about 4-5): uncached batch 64, 1 thread, 6.6 s a step and a 1.66 GB peak (258 MB of it gradients + AdamW state);
cached (``cached_mnrl``) batch 64, 4.0 s and 0.73 GB; batch 256, 2 threads, 115 s a step and 0.78 GB. The full grid
would take hours, so for the real model run the memory and time targets only: the cached variant at batches 64 and
1024, 2 steps (one warm-up)::

    python -m benchmarks.studies benchmarks/studies/scale_minilm.json --run

about 5 x (2 x 60-120 s) at 1024 plus 2 min at 64, i.e. 12-22 min on a quiet machine with 1 thread (measured only
under load; an estimate).

On 2 cores the 2-process comparison is the noisiest number here: in one quiet run and the next (each the median of
2 or 8 steps) the same loss's 2 / 1 ratio moved by up to 0.13, in either direction. A trial's ``rounds`` (``--set
rounds=R``, default 1) times its configuration R times, each in a fresh process (memory in round 1 only), and
reports the median round, with the ratio of each round in the 2-process table. The committed cached batch-1024
records were timed in 5 rounds interleaved across the 12 configurations by the former driver; a trial's rounds follow
one another (the engine runs one configuration per trial), so a drift of the machine between configurations is not
cancelled by them.

The study (``benchmarks/studies/scale.json``, ``scale_minilm.json``): one trial is one configuration, its dataset the
batch size (``b1024``), its row the method and variant (``mixcse/cached``, ``.../p2`` for 2 processes), its seed the
protocol's torch seed; the records stay ``{"runs": {key: record}, "_meta": ...}`` (:func:`read` / :func:`layout`)::

    python -m benchmarks.studies benchmarks/studies/scale.json --check      # the committed tables from the records
    python -m benchmarks.studies benchmarks/studies/scale.json --run        # the configurations left, resumable
    python -m benchmarks.studies SPEC --run --set steps=9 --set rounds=3    # a trial's options

:func:`trial` runs one configuration in fresh subprocesses (:func:`measure`, :func:`launch`:
``python -m benchmarks.scale worker CONFIG``, :mod:`benchmarks.scale.worker`); :mod:`benchmarks.scale.report` turns the
records into the summary, table and plot. Two more measurements of the same question, each its own subcommand:
``paired`` (:mod:`benchmarks.scale.paired`: every loss's cached step at one large batch, interleaved with CachedMNRL in
one process -> ``scale_paired.md``) and ``tensors`` (:mod:`benchmarks.scale.tensors`: which tensors a cached loss holds
at its peak -> ``scale_tensors.md``); where a cached step spends its time is the profile study
(:mod:`benchmarks.scale.profile`, ``benchmarks/studies/scale_profile_*.json``)::

    python -m benchmarks.scale paired [--batch-size 8192 --rounds 4]
    python -m benchmarks.scale tensors [--n 8192]
    python -m benchmarks.scale profile --reprune-traces --out FILE    # prune a profile's committed traces again
    python -m benchmarks.scale summary               # scale_summary.md and scale_gpu.png, from the records only

A trial keeps each configuration's record in its work folder too (``WORK_DIR/scale_runs/``), where the next trials
read what is already measured: a loss found "not supported" is not started again at another batch size, and a
configuration whose memory, extrapolated from a smaller batch measured there, exceeds ``memory_fraction`` (0.8) of
``MemAvailable`` is recorded as "skipped" (a failed trial with its record). Run it from the repository root
(``PYTHONPATH=$PWD`` if the installed package points elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import REPO
from benchmarks.scale.report import (  # noqa: F401  (the report half of this benchmark; summarize, plot: its API here too)
    DDP_TARGET,
    MEMORY_TARGET,
    PEAK_TARGET,
    REFERENCE,
    REFERENCE_TWO_WAY,
    REFERENCES,
    TIME_TARGET,
    config_key,
    loss_names,
    markdown,
    plot,
    summarize,
)
from benchmarks.scale.worker import MEMORY_ENV, build_benchmark_loss, run_config  # noqa: F401  (one configuration)

VARIANTS = ("uncached", "cached")
RESULT_PREFIX = "SCALE_RESULT "
#: the statuses of a configuration that failed to measure: a failed trial, kept with its record
FAILED = ("error", "skipped")
#: the settings every configuration of a study shares (the records' ``_meta.settings``: the spec's protocol)
SETTINGS = ("model", "max_seq_length", "steps", "threads", "seed", "corpus", "mini_batch_size")
#: what a trial's record carries besides its configuration's (stripped from the records file by :func:`layout`)
POINT_FIELDS = ("dataset", "row", "seed", "meta")
MODEL_LABELS = {"tiny": "tiny random BERT (2 layers, hidden 32), CLS pooling",
                "default": "all-MiniLM-L6-v2 (embedded), CLS pooling"}
TARGETS = {"cached_peak_largest_vs_64": MEMORY_TARGET, "cached_peak_vs_cached_mnrl": PEAK_TARGET,
           "cached_step_vs_cached_mnrl_from_1024": TIME_TARGET, "two_processes_vs_one": DDP_TARGET}


# ----------------------------------------------------------------------------------------------------- the grid
def plan(methods: list[str], batch_sizes: list[int], ddp_methods: list[str], ddp_batch_sizes: list[int],
         ddp_variants: list[str], variants: list[str] = VARIANTS) -> list[dict[str, Any]]:
    """Every configuration of a grid: 1 process (``variants``; ``cached_mnrl`` cached only), then 2 processes."""
    grids = ((1, batch_sizes, methods, variants), (2, ddp_batch_sizes, ddp_methods, ddp_variants))
    return [{"method": method, "variant": variant, "batch_size": batch, "processes": processes}
            for processes, batches, names, kinds in grids for batch in batches for method in names for variant in kinds
            if not (method in REFERENCES and variant == "uncached")]


def row_label(cfg: dict[str, Any]) -> str:
    """A configuration's row in the study: ``method/variant``, ``/p2`` for 2 processes."""
    return f"{cfg['method']}/{cfg['variant']}" + (f"/p{cfg['processes']}" if cfg.get("processes", 1) > 1 else "")


def dataset_name(batch: int) -> str:
    """A batch size's dataset in the study: ``b1024``."""
    return f"b{batch}"


def spec_row(cfg: dict[str, Any]) -> dict[str, Any]:
    """The spec's row of a configuration: the loss its label runs (:func:`benchmarks.methods.registry_loss`;
    ``cached_mnrl`` and its two-way form are sentence-transformers' CachedMNRL), the variant and processes."""
    from benchmarks.methods import registry_loss

    method = cfg["method"]
    loss = REFERENCE if method in REFERENCES else registry_loss(method)
    options = {"directions": ["query_to_doc", "doc_to_query"], "partition_mode": "per_direction"} \
        if method == REFERENCE_TWO_WAY else {}
    extra = {"method": method, "variant": cfg["variant"], "processes": cfg.get("processes", 1)}
    return {"loss": loss, **({"options": options} if options else {}), "extra": extra}


def spec_dict(name: str, protocol: dict[str, Any], configs: list[dict[str, Any]], report: dict[str, Any],
              about: str = "") -> dict[str, Any]:
    """A scale study's spec (JSON form) for ``configs`` (:func:`plan`): a dataset per batch size, a row per method,
    variant and processes, one grid block per batch size at the protocol's seed; checked as a spec.

    Raises:
        ValueError: an unknown method, steps below 2, a batch below 2, an odd 2-process batch, or a bad spec.
    """
    from st_hardneg.training.registry import LOSSES
    from st_hardneg.training.studies.spec import spec_from_dict

    known = [*LOSSES, *REFERENCES]
    unknown = sorted({c["method"] for c in configs} - set(known))
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; choose from {', '.join(known)}")
    if protocol.get("steps", 0) < 2:
        raise ValueError(f"steps must be >= 2 (one warm-up step, then the measured ones), got {protocol.get('steps')}")
    bad = sorted({c["batch_size"] for c in configs if c["batch_size"] < 2
                  or c["batch_size"] % c.get("processes", 1)})
    if bad:
        raise ValueError(f"every batch size must be >= 2 and divisible by its processes, got {bad}")
    rows = {row_label(c): spec_row(c) for c in configs}
    blocks: dict[int, list[str]] = {}
    for c in configs:
        blocks.setdefault(c["batch_size"], []).append(row_label(c))
    spec = {"name": name, "about": about, "protocol": protocol, "rows": rows,
            "datasets": {dataset_name(b): {"extra": {"batch_size": b}} for b in blocks},
            "grid": [{"datasets": [dataset_name(b)], "rows": labels, "seeds": [protocol["seed"]]}
                     for b, labels in blocks.items()],
            "choice": {"metric": None}, "trial": "benchmarks.scale:trial", "report": report}
    spec_from_dict(spec)
    return spec


# ----------------------------------------------------------------------------------------------------- the records
def read(data: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``(records, meta)`` of a scale results file (``{"runs": {key: run}, "_meta": ...}``): each run with its grid
    point (``dataset``, ``row``, ``seed``: the settings' seed); ``meta``: the file's ``_meta`` and its settings as the
    ``protocol`` the study checks.

    Raises:
        ValueError: a file without a ``runs`` mapping, or a run filed under another key than its configuration's.
    """
    if not isinstance(data.get("runs"), dict):
        raise ValueError("not a scale benchmark result (no 'runs' mapping)")
    settings = data.get("_meta", {}).get("settings", {})
    records = []
    for key, run in data["runs"].items():
        if key != config_key(run["method"], run["variant"], run["batch_size"], run.get("processes", 1)):
            raise ValueError(f"the run under {key!r} is another configuration's ({run['method']}, {run['variant']}, "
                             f"batch {run['batch_size']}, {run.get('processes', 1)} process(es))")
        records.append({"dataset": dataset_name(run["batch_size"]), "row": row_label(run),
                        "seed": settings.get("seed", 0), **run})
    meta = {"_meta": data["_meta"], "protocol": settings} if "_meta" in data else {}
    return records, meta


def layout(records: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """The results file of ``records`` (:func:`read`'s inverse): the runs keyed by configuration, without their grid
    point, and ``_meta``: a new trial's (the last one run, as a run of the former driver rewrote it), else the
    file's."""
    runs = {config_key(r["method"], r["variant"], r["batch_size"], r.get("processes", 1)):
            {k: v for k, v in r.items() if k not in POINT_FIELDS} for r in records}
    new = [r["meta"] for r in records if "meta" in r]
    data: dict[str, Any] = {"runs": runs}
    if new or "_meta" in meta:
        data["_meta"] = new[-1] if new else meta["_meta"]
    return data


# ----------------------------------------------------------------------------------------------------- a trial
def launch(cfg: dict[str, Any], timeout: float, extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``cfg`` in a fresh subprocess (2 processes: ``torch.distributed.run``); its result or an error record."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "OMP_NUM_THREADS": str(cfg["threads"]), "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", **(extra_env or {})}
    worker = ["-m", "benchmarks.scale", "worker", json.dumps(cfg)]
    if cfg["processes"] > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
               str(cfg["processes"]), *worker]
    else:
        cmd = [sys.executable, *worker]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "error", "reason": f"timed out after {timeout:.0f} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        return {"status": "error", "reason": f"exit code {proc.returncode}", "stderr_tail": _error_lines(proc.stderr)}
    result = json.loads(lines[-1][len(RESULT_PREFIX):])
    result["wall_seconds"] = round(time.perf_counter() - start, 1)
    return result


def measure(cfg: dict[str, Any], timeout: float) -> dict[str, Any]:
    """``cfg`` run twice, each time in fresh processes: timed with the allocator as users run it (its resident
    high-water mark kept as ``default_malloc_peak_mb``), then 2 steps with glibc's mmap threshold fixed
    (``MEMORY_ENV``), whose high-water mark is ``peak_mb`` (see the module docstring)."""
    timed = launch(cfg, timeout)
    if timed.get("status") != "ok":
        return timed
    memory = launch({**cfg, "steps": 2}, timeout, extra_env=MEMORY_ENV)
    if memory.get("status") != "ok":
        return {"status": "error", "reason": f"memory run: {memory.get('reason')}",
                **({"stderr_tail": memory["stderr_tail"]} if "stderr_tail" in memory else {})}
    return {**timed, "default_malloc_peak_mb": timed["peak_mb"],
            "default_malloc_peak_mb_per_rank": timed["peak_mb_per_rank"], "peak_mb": memory["peak_mb"],
            "peak_mb_per_rank": memory["peak_mb_per_rank"],
            "memory_method": f"{memory['memory_method']}, a separate run of 2 steps",
            "wall_seconds": round(timed.get("wall_seconds", 0.0) + memory.get("wall_seconds", 0.0), 1)}


def rounds_of(run: dict[str, Any]) -> int:
    """How many timed rounds a finished run holds (1 for a run from before rounds)."""
    return len(run.get("step_ms_rounds") or [run.get("step_ms")])


def add_round(run: dict[str, Any], timed: dict[str, Any]) -> dict[str, Any]:
    """``run`` with one more timed round ``timed`` (a :func:`launch` result): ``step_ms_rounds`` gains its step time,
    ``step_ms`` becomes their median, ``default_malloc_peak_mb`` the largest mark of any round. A failed round
    leaves the measurements as they were and is listed in ``round_errors``."""
    if timed.get("status") != "ok":
        return {**run, "round_errors": [*run.get("round_errors", []),
                                        f"round {rounds_of(run) + 1}: {timed.get('reason', 'failed')}"]}
    rounds = [*(run.get("step_ms_rounds") or [run["step_ms"]]), timed["step_ms"]]
    return {**run, "step_ms_rounds": rounds, "step_ms": round(statistics.median(rounds), 2),
            "default_malloc_peak_mb": max(run.get("default_malloc_peak_mb", 0.0), timed["peak_mb"]),
            "wall_seconds": round(run.get("wall_seconds", 0.0) + timed.get("wall_seconds", 0.0), 1),
            "finished": time.strftime("%Y-%m-%d %H:%M:%S")}


def available_mb() -> float | None:
    """``MemAvailable`` of ``/proc/meminfo`` in MB (None where there is no such file)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def estimate_peak_mb(runs: dict[str, Any], cfg: dict[str, Any]) -> float | None:
    """The memory ``cfg`` will need (all its processes together), extrapolated linearly in the per-process batch from
    the largest smaller batch of the same method and variant already measured in 1 process: the batch-independent
    part (``state_mb``) plus the rest scaled. None without such a measurement."""
    local = cfg["batch_size"] // cfg["processes"]
    done = [r for r in runs.values() if r.get("status") == "ok" and r.get("processes", 1) == 1
            and r["method"] == cfg["method"] and r["variant"] == cfg["variant"] and r["batch_size"] < local]
    if not done:
        return None
    ref = max(done, key=lambda r: r["batch_size"])
    per_process = ref["state_mb"] + max(ref["peak_mb"] - ref["state_mb"], 0.0) * local / ref["batch_size"]
    return per_process * cfg["processes"]


def _error_lines(stderr: str, keep: int = 3000) -> str:
    """The end of a failed worker's stderr; under torchrun the ranks' own error lines, not the launcher's."""
    ranked = [line for line in stderr.splitlines() if line.startswith("[rank")]
    return "\n".join(ranked)[-keep:] if ranked else stderr[-keep:]


def _measured(folder: Path) -> dict[str, Any]:
    """The runs already measured in this study's work folder, by configuration key."""
    runs = {}
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        run = json.loads(path.read_text())
        runs[config_key(run["method"], run["variant"], run["batch_size"], run.get("processes", 1))] = run
    return runs


def run_meta(settings: dict[str, Any]) -> dict[str, Any]:
    """The records' ``_meta`` of a trial run with ``settings``: the model, torch, threads, machine and targets."""
    import torch

    return {"settings": settings, "model": MODEL_LABELS.get(settings["model"], settings["model"]),
            "max_seq_length": settings["max_seq_length"], "steps": settings["steps"],
            "mini_batch_size": settings["mini_batch_size"], "torch": torch.__version__,
            "torch_threads": settings["threads"], "torch_threads_per_process_ddp": max(1, settings["threads"] // 2),
            "cpu_count": os.cpu_count(), "platform": platform.platform(), "corpus": Path(settings["corpus"]).name,
            "targets": dict(TARGETS)}


def corpus_path(protocol: dict[str, Any], data_dir: str | Path) -> Path:
    """The protocol's corpus: its path, else the file of that name under the shared data's ``corpus/``."""
    path = Path(protocol["corpus"])
    return path if path.is_file() else Path(data_dir) / "corpus" / path.name


def prepare(spec: Any, points: list[Any], context: dict[str, Any]) -> None:
    """Before any trial: the corpus is there, and the steps, rounds, memory fraction and timeout are in range.

    Raises:
        ValueError: naming the value or file.
    """
    from st_hardneg import validation

    validation.check_count(int(context.get("steps", spec.protocol["steps"])), "steps", minimum=2)
    validation.check_count(int(context.get("rounds", 1)), "rounds", minimum=1)
    validation.check_number(float(context.get("memory_fraction", 0.8)), "memory_fraction", minimum=0.0)
    validation.check_number(float(context.get("timeout", 3600)), "timeout", minimum=1.0)
    corpus = corpus_path(spec.protocol, context["data_dir"])
    if not corpus.is_file():
        raise ValueError(f"corpus not found: {corpus}")


def trial(spec: Any, point: Any, context: dict[str, Any]) -> dict[str, Any]:
    """One configuration (the row's method, variant and processes at the dataset's batch size) measured in fresh
    subprocesses (:func:`measure`; ``rounds`` more timed launches with :func:`add_round`): its record, with its
    point and the ``_meta`` of this run. A loss that rejects its arguments is "not supported" (a result); a
    configuration that could not be measured ("error") or whose memory would not fit ("skipped") is a failed trial
    kept with its record. The record is also kept in ``WORK_DIR/scale_runs/`` for the next trials' estimates.

    ``context``: ``steps`` (default: the protocol's), ``rounds`` (1), ``memory_fraction`` (0.8), ``timeout`` (3600 s a
    configuration)."""
    extra = spec.rows[point.row].extra
    cfg = {"method": extra["method"], "variant": extra["variant"],
           "batch_size": int(spec.datasets[point.dataset].extra["batch_size"]), "processes": int(extra["processes"])}
    steps = int(context.get("steps", spec.protocol["steps"]))
    settings = {**{k: spec.protocol[k] for k in SETTINGS}, "steps": steps,
                "corpus": str(corpus_path(spec.protocol, context["data_dir"]).resolve())}
    timeout = float(context.get("timeout", 3600))
    folder = Path(context["work_dir"]) / "scale_runs"
    held = _measured(folder)
    needed, free = estimate_peak_mb(held, cfg), available_mb()
    unsupported = [r for r in held.values() if r.get("status") == "not supported"
                   and (r["method"], r["variant"], r.get("processes", 1)) == (cfg["method"], cfg["variant"],
                                                                             cfg["processes"])]
    fraction = float(context.get("memory_fraction", 0.8))
    if unsupported:  # the loss rejected its arguments, whatever the batch: no need to start a process again
        result = {"status": "not supported", "reason": unsupported[0]["reason"]}
    elif needed is not None and free is not None and needed > fraction * free:
        result = {"status": "skipped", "reason": f"needs about {needed / 1024:.1f} GB (extrapolated from the "
                                                 f"smaller batch), {free / 1024:.1f} GB available"}
    else:
        run_settings = {**settings, **cfg, "threads": max(1, settings["threads"] // cfg["processes"])}
        result = measure(run_settings, timeout)
        if result.get("status") == "ok":
            result["step_ms_rounds"] = [result["step_ms"]]
            for _ in range(int(context.get("rounds", 1)) - 1):
                result = add_round(result, launch(run_settings, timeout))
    run = {**cfg, **result, "steps": steps, "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
    if run["status"] in FAILED:
        run["failed"] = f"{run['status']}: {run.get('reason', '')}"
    folder.mkdir(parents=True, exist_ok=True)
    key = config_key(cfg["method"], cfg["variant"], cfg["batch_size"], cfg["processes"])
    (folder / (key.replace("/", "_") + ".json")).write_text(json.dumps(run))
    # the file's settings are the protocol's (its steps the default: a run timed over others records its own; its
    # corpus as the protocol names it, wherever this machine found it)
    meta = run_meta({k: spec.protocol[k] for k in SETTINGS})
    return {"dataset": point.dataset, "row": point.row, "seed": point.seed, **run, "meta": meta}


# ----------------------------------------------------------------------------------------------------- main
def worker_main(argv: list[str]) -> int:
    """``worker CONFIG``: measure one configuration (a JSON object) in this process and print its result line (rank 0
    only under torchrun)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale worker",
                                     description="One configuration, measured in this process (started by a trial).")
    parser.add_argument("config", help="the configuration as a JSON object")
    args = parser.parse_args(argv)
    result = run_config(json.loads(args.config))
    if int(os.environ.get("RANK", 0)) == 0:
        print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


def _paired(argv: list[str]) -> int:
    from benchmarks.scale import paired

    return paired.main(argv)


def _tensors(argv: list[str]) -> int:
    from benchmarks.scale import tensors

    return tensors.main(argv)


def _profile(argv: list[str]) -> int:
    from benchmarks.scale import profile

    return profile.main(argv)


def _summary(argv: list[str]) -> int:
    from benchmarks.scale import summary

    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale summary", description=summary.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default=str(summary.RESULTS), help="the folder of the records (and the output)")
    args = parser.parse_args(argv)
    for path in summary.write(Path(args.results)):
        print(path)
    return 0


#: the subcommands (the grid and its tables: ``python -m benchmarks.studies benchmarks/studies/scale.json``)
COMMANDS = {"paired": _paired, "tensors": _tensors, "profile": _profile, "summary": _summary, "worker": worker_main}


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.scale paired|tensors|profile|summary|worker ...``: the subcommand's own options follow
    its name.

    Raises:
        SystemExit: (2) no known subcommand, naming the study runner's command for the grid.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in COMMANDS:
        return COMMANDS[argv[0]](argv[1:])
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.error(f"choose a subcommand ({', '.join(COMMANDS)}); the grid and its tables are the study "
                 "`python -m benchmarks.studies benchmarks/studies/scale.json [--run]`")
    return 2
