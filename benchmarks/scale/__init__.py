"""Scaling with the batch size: peak memory and step time, uncached vs GradCache (``mini_batch_size``), 1 vs 2 processes.

For every method and batch size (default 64, 1024 and 8192) one configuration trains a few steps and reports

* ``step_ms``: the median wall time of a full training step after one warm-up step (zero_grad, forward of both
  columns, loss, backward, gradient clipping at 1.0 and an AdamW step, as in ``benchmarks/overhead.py``), with
  ``torch.set_num_threads`` fixed (``--threads``, recorded);
* ``peak_mb``: the peak resident memory during the first 2 steps minus the resident memory just before them (model
  loaded, batches tokenised, loss and optimizer built, garbage collected), i.e. what training the batch adds:
  gradients, AdamW's two moments (``state_mb``, reported separately: it does not depend on the batch) and the
  activations, measured in a separate run with glibc's mmap threshold fixed, as described below;
* ``default_malloc_peak_mb``: the same high-water mark over the timed steps, with the allocator as users run it.

Variants: ``uncached`` builds the loss as registered; ``cached`` passes ``mini_batch_size`` (``--mini-batch-size``,
default 32, GradCache and loss rows in chunks). A loss that rejects the argument is reported as "not supported", not
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
step it measures). Each configuration runs in a fresh subprocess; the script resets the kernel's high-water mark of
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

Before starting a configuration the script extrapolates its memory from the largest smaller batch already measured
(same method and variant; the batch-independent ``state_mb`` plus the rest scaled linearly) and skips it ("skipped",
retried on the next invocation) if that exceeds ``--memory-fraction`` (0.8) of ``MemAvailable``: uncached
all-MiniLM-L6-v2 needs about 1.4 GB of activations per 64 pairs at length 32 (1.66 GB peak measured at batch 64), so
about 22 GB at batch 1024, more than a 23 GB machine has. A loss found "not supported" is not started again at the
next batch size.

Model and grid. The default grid is ``mnrl``, ``cached_mnrl``, ``mixcse``, ``focal``, ``hncse_pm``,
``hncse_hnm`` and ``adcse`` at batches 64, 1024 and 8192, both variants, 3 steps, 1 torch thread, and the 2-process
comparison at global batch 1024, cached, on ``--model tiny`` (a random 2-layer BERT, hidden 32, CLS pooling,
max_seq_length 32): about 46 subprocesses, 10-20 s each up to batch 1024 and 1-2 min at 8192. Its peaks are small (tens to hundreds of MB) and
the B x B similarity matrices weigh more in them than they would next to a real encoder.

all-MiniLM-L6-v2 (``--model default``) is far more expensive on 2 CPU cores. Measured on the shared machine (load
about 4-5): uncached batch 64, 1 thread, 6.6 s a step and a 1.66 GB peak (258 MB of it gradients + AdamW state);
cached (``cached_mnrl``) batch 64, 4.0 s and 0.73 GB; batch 256, 2 threads, 115 s a step and 0.78 GB. The full grid
would take hours, so for the real model run the memory and time targets only: the cached variant at batches 64 and
1024, 2 steps (one warm-up)::

    python -m benchmarks.scale --model default --variants cached --batch-sizes 64 1024 --steps 2 \
        --methods cached_mnrl mixcse focal hncse_hnm adcse --ddp-methods --out benchmarks/results/scale_minilm.json

about 5 x (2 x 60-120 s) at 1024 plus 2 min at 64, i.e. 12-22 min on a quiet machine with 1 thread (measured only
under load; an estimate).

On 2 cores the 2-process comparison is the noisiest number here: in one quiet run and the next (each the median of
2 or 8 steps) the same loss's 2 / 1 ratio moved by up to 0.13, in either direction. ``--rounds R`` times every
configuration of the invocation R times, round by round (memory in round 1 only), and reports the median round, with
the ratio of each round in the 2-process table::

    python -m benchmarks.scale --batch-sizes 1024 --variants cached --steps 9 --rounds 3 \
        --methods cached_mnrl mixcse focal hncse_pm hncse_hnm adcse --ddp-methods cached_mnrl mixcse focal \
        hncse_pm hncse_hnm adcse

    python -m benchmarks.scale                                  # the default grid (tiny model, ~10 min)
    python -m benchmarks.scale --methods mnrl cached_mnrl --batch-sizes 8 16 --steps 2 --out /tmp/s.json  # smoke
    python -m benchmarks.scale --report                         # only rewrite scale.md and scale.png

This package is the driver (plan, subprocess per configuration, resume); :mod:`benchmarks.scale.worker` measures one
configuration (``python -m benchmarks.scale worker CONFIG``, started by the driver) and :mod:`benchmarks.scale.report`
turns the results into the summary, table and plot. Two more measurements of the same question, each its own
subcommand: ``paired`` (:mod:`benchmarks.scale.paired`: every loss's cached step at one large batch, interleaved with
CachedMNRL in one process -> ``scale_paired.md``), ``tensors`` (:mod:`benchmarks.scale.tensors`: which tensors a
cached loss holds at its peak -> ``scale_tensors.md``) and ``profile`` (:mod:`benchmarks.scale.profile`: where a
cached step spends its time against the uncached work, with a ``torch.profiler`` trace -> ``scale_profile_cpu.*``,
or on a GPU ``scale_profile_gpu.*``)::

    python -m benchmarks.scale [run] [options]       # the grid (the default subcommand)
    python -m benchmarks.scale report [--out FILE]   # = --report
    python -m benchmarks.scale paired [--batch-size 8192 --rounds 4]
    python -m benchmarks.scale tensors [--n 8192]
    python -m benchmarks.scale profile [--device cuda] [--dry-run]
    python -m benchmarks.scale summary               # scale_summary.md and scale_gpu.png, from the records only

Writes ``benchmarks/results/scale.json`` after every configuration (``{"runs": {key: result}, "_meta": ...}``); a
finished configuration already in the JSON is skipped, so an interrupted run resumes where it stopped (failed ones
are retried). Run it from the repository root (``PYTHONPATH=$PWD`` if the installed package points elsewhere).
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

from benchmarks.harness import REPO, RESULTS, WIKI10K
from benchmarks.methods import OURS
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
    write_report,
)
from benchmarks.scale.worker import MEMORY_ENV, build_benchmark_loss, run_config  # noqa: F401  (one configuration)

DEFAULT_OUT = RESULTS / "scale.json"
DEFAULT_CORPUS = WIKI10K  # $ST_HARDNEG_SHARED_DATA or ../shared/data (benchmarks.harness)
DEFAULT_METHODS = ["mnrl", REFERENCE, *OURS]
VARIANTS = ("uncached", "cached")
RESULT_PREFIX = "SCALE_RESULT "
#: statuses of a finished configuration (skipped on resume); "error" is retried
FINISHED = ("ok", "not supported")


# ----------------------------------------------------------------------------------------------------- the driver
def plan(methods: list[str], batch_sizes: list[int], ddp_methods: list[str], ddp_batch_sizes: list[int],
         ddp_variants: list[str], variants: list[str] = VARIANTS) -> list[dict[str, Any]]:
    """Every configuration to run: 1 process (``variants``; ``cached_mnrl`` cached only), then 2 processes."""
    grids = ((1, batch_sizes, methods, variants), (2, ddp_batch_sizes, ddp_methods, ddp_variants))
    return [{"method": method, "variant": variant, "batch_size": batch, "processes": processes}
            for processes, batches, names, kinds in grids for batch in batches for method in names for variant in kinds
            if not (method in REFERENCES and variant == "uncached")]


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
    """How many timed rounds a finished run holds (1 for a run from before ``--rounds``)."""
    return len(run.get("step_ms_rounds") or [run.get("step_ms")])


def add_round(run: dict[str, Any], timed: dict[str, Any]) -> dict[str, Any]:
    """``run`` with one more timed round ``timed`` (a :func:`launch` result): ``step_ms_rounds`` gains its step time,
    ``step_ms`` becomes their median, ``default_malloc_peak_mb`` the largest mark of any round. A failed round
    leaves the measurements as they were and is listed in ``round_errors`` (the next invocation tries it again)."""
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


def load(path: Path) -> dict[str, Any]:
    if path.is_file():
        data = json.loads(path.read_text())
        if not isinstance(data.get("runs"), dict):
            raise ValueError(f"{path} is not a scale benchmark result (no 'runs' mapping)")
        return data
    return {"runs": {}}


# ----------------------------------------------------------------------------------------------------- main
def worker_main(argv: list[str]) -> int:
    """``worker CONFIG``: measure one configuration (a JSON object) in this process and print its result line (rank 0
    only under torchrun)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale worker",
                                     description="One configuration, measured in this process (started by the driver).")
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


#: the subcommands besides ``run`` (the default, also taken when the first argument is an option)
COMMANDS = {"report": lambda argv: run_main(["--report", *argv]), "paired": _paired, "tensors": _tensors,
            "profile": _profile, "summary": _summary, "worker": worker_main}


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.scale [run|report|paired|tensors|profile|summary|worker] ...``: the subcommand's own options follow its
    name; without one, the grid (``run``)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in COMMANDS:
        return COMMANDS[argv[0]](argv[1:])
    return run_main(argv[1:] if argv and argv[0] == "run" else argv)


def run_main(argv: list[str]) -> int:
    """``run``: the grid of configurations, each in fresh processes, resumed from ``--out``."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale [run]", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="*", default=DEFAULT_METHODS,
                        help=f"names of st_hardneg.training.registry.LOSSES, {REFERENCE} and {REFERENCE_TWO_WAY} "
                             f"(default: {DEFAULT_METHODS})")
    parser.add_argument("--batch-sizes", nargs="*", type=int, default=[64, 1024, 8192])
    parser.add_argument("--mini-batch-size", type=int, default=32, help="of the cached variant")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=VARIANTS,
                        help="variants of the 1-process grid")
    parser.add_argument("--model", default="tiny",
                        help="'tiny' (a random 2-layer BERT, hidden 32), 'default' (the embedded all-MiniLM-L6-v2) "
                             "or a model directory")
    parser.add_argument("--max-seq-length", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3, help="steps per configuration, the first a warm-up")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of a 1-process configuration; the 2-process ones get threads // 2 each "
                             "(at least 1), so that both use the same cores")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    parser.add_argument("--ddp-methods", nargs="*", default=DEFAULT_METHODS,
                        help="methods of the 2-process comparison (none: skip it)")
    parser.add_argument("--ddp-batch-sizes", nargs="*", type=int, default=[1024])
    parser.add_argument("--ddp-variants", nargs="*", default=["cached"], choices=VARIANTS)
    parser.add_argument("--memory-fraction", type=float, default=0.8,
                        help="skip a configuration whose extrapolated peak exceeds this share of the available memory")
    parser.add_argument("--rounds", type=int, default=1,
                        help="time every configuration in this many interleaved rounds (round 1 also measures the "
                             "memory; later rounds only time): step_ms is the median of the rounds' step times, "
                             "step_ms_rounds lists them. A configuration already in --out counts the rounds it has")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per configuration")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--report", action="store_true", help="only rewrite the markdown table and the plot")
    args = parser.parse_args(argv)

    out = Path(args.out)
    data = load(out)
    if args.report:
        write_report(data, out)
        print(markdown(data))
        return 0

    from st_hardneg.training.registry import LOSSES

    known = [*LOSSES, *REFERENCES]
    unknown = [m for m in [*args.methods, *args.ddp_methods] if m not in known]
    if unknown:
        parser.error(f"unknown method(s) {unknown}; choose from {', '.join(known)}")
    if args.steps < 2:
        parser.error("--steps must be >= 2 (one warm-up step, then the measured ones)")
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.mini_batch_size < 1 or args.threads < 1 or any(b < 2 for b in args.batch_sizes + args.ddp_batch_sizes):
        parser.error("--mini-batch-size and --threads must be >= 1 and every batch size >= 2")
    odd = [b for b in args.ddp_batch_sizes if b % 2]
    if odd:
        parser.error(f"--ddp-batch-sizes must be even (split over 2 processes), got {odd}")
    if not Path(args.corpus).is_file():
        parser.error(f"corpus not found: {args.corpus}")
    model_label = {"tiny": "tiny random BERT (2 layers, hidden 32), CLS pooling",
                   "default": "all-MiniLM-L6-v2 (embedded), CLS pooling"}.get(args.model, args.model)
    common = {"model": args.model, "max_seq_length": args.max_seq_length, "steps": args.steps,
              "threads": args.threads, "seed": args.seed, "corpus": str(Path(args.corpus).resolve()),
              "mini_batch_size": args.mini_batch_size}
    # the steps may differ between configurations (each run records its own): a batch of 65,536 is timed over fewer
    held = data.get("_meta", {}).get("settings")
    if held is not None and {k: v for k, v in held.items() if k != "steps"} != \
            {k: v for k, v in common.items() if k != "steps"}:
        parser.error(f"{out} holds results of other settings ({data['_meta']['settings']}); use another --out")
    import torch

    data["_meta"] = {
        "settings": common, "model": model_label, "max_seq_length": args.max_seq_length, "steps": args.steps,
        "mini_batch_size": args.mini_batch_size, "torch": torch.__version__, "torch_threads": args.threads,
        "torch_threads_per_process_ddp": max(1, args.threads // 2),
        "cpu_count": os.cpu_count(), "platform": platform.platform(), "corpus": Path(args.corpus).name,
        "targets": {"cached_peak_largest_vs_64": MEMORY_TARGET, "cached_peak_vs_cached_mnrl": PEAK_TARGET,
                    "cached_step_vs_cached_mnrl_from_1024": TIME_TARGET, "two_processes_vs_one": DDP_TARGET},
    }
    configs = plan(args.methods, args.batch_sizes, args.ddp_methods, args.ddp_batch_sizes, args.ddp_variants,
                   args.variants)
    start = time.perf_counter()
    total = len(configs) * args.rounds
    for number, (round_, cfg) in enumerate(((r, c) for r in range(1, args.rounds + 1) for c in configs), 1):
        key = config_key(cfg["method"], cfg["variant"], cfg["batch_size"], cfg["processes"])
        held_run = data["runs"].get(key, {})
        label = f"[{number}/{total}]" + (f" round {round_}" if args.rounds > 1 else "")
        if held_run.get("status") in FINISHED and (held_run["status"] != "ok" or rounds_of(held_run) >= round_):
            print(f"{label} skip {key}: already in {out}", flush=True)
            continue
        if round_ > 1 and held_run.get("status") != "ok":
            continue  # its first round did not measure it (skipped or failed): nothing to time again
        print(f"{label} {key} ...", end=" ", flush=True)
        settings = {**common, **cfg, "threads": max(1, args.threads // cfg["processes"])}
        if round_ > 1:
            result = add_round(held_run, launch(settings, args.timeout))
            data["runs"][key] = result
            failed = len(result.get("round_errors", [])) > len(held_run.get("round_errors", []))
            print(result["round_errors"][-1] if failed else result["step_ms_rounds"], flush=True)
            write_report(data, out)
            continue
        needed, free = estimate_peak_mb(data["runs"], cfg), available_mb()
        unsupported = [r for r in data["runs"].values() if r.get("status") == "not supported"
                       and (r["method"], r["variant"], r["processes"]) == (cfg["method"], cfg["variant"],
                                                                             cfg["processes"])]
        if unsupported:  # the loss rejected its arguments, whatever the batch: no need to start a process again
            result = {"status": "not supported", "reason": unsupported[0]["reason"]}
        elif needed is not None and free is not None and needed > args.memory_fraction * free:
            result = {"status": "skipped", "reason": f"needs about {needed / 1024:.1f} GB (extrapolated from the "
                                                     f"smaller batch), {free / 1024:.1f} GB available"}
        else:
            result = measure(settings, args.timeout)
            if result.get("status") == "ok":
                result["step_ms_rounds"] = [result["step_ms"]]
        data["runs"][key] = {**cfg, **result, "steps": args.steps, "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
        print(result["status"], result.get("step_ms", result.get("reason", "")), flush=True)
        write_report(data, out)
    data["_meta"]["seconds_last_invocation"] = round(time.perf_counter() - start, 1)
    write_report(data, out)
    print(markdown(data))
    errors = [k for k, r in data["runs"].items() if r.get("status") == "error"
              or (r.get("status") == "ok" and rounds_of(r) < args.rounds and r.get("round_errors"))]
    if errors:
        print(f"failed configurations (rerun to retry): {errors}", file=sys.stderr)
        return 1
    return 0
