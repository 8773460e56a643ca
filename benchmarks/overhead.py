"""Cost of each loss relative to unsupervised SimCSE (``mnrl``): per training step, and for the loss math alone.

Step benchmark: every method gets its own copy of the same encoder (the embedded all-MiniLM-L6-v2, CLS pooling,
max_seq_length 32, or ``--model PATH``) and its own AdamW, and all of them train in one process on the same
pre-tokenised batches of 64 wiki10k sentences (each sentence twice, as in unsupervised training). Each round runs one
full step per method (zero_grad, forward, loss, backward, gradient clipping, optimizer step, including AdCSE's EMA
and adversary updates, which run in the optimizer-step hook), in a round-robin order that rotates every round, so
that background load and CPU frequency drift hit every method alike. Warm-up rounds are left out; the reported ratio
is the median over rounds of ``t(method) / t(mnrl)`` in the same round, next to the median step time.

Loss-only benchmark: fixed random embeddings (64 x d, d = 384 for MiniLM) with ``requires_grad`` → the loss's
``compute_loss_from_embeddings`` + backward, median over repetitions (also interleaved). It shows how much of a
step the loss math itself costs.

    python -m benchmarks.overhead                       # the real measurement (about 25 min on 2 busy cores)
    python -m benchmarks.overhead --steps 3 --model tiny-bert-dir --out /tmp/o.json   # smoke run
    python -m benchmarks.overhead --profile adcse       # where a method's step time goes (torch.profiler)
    python -m benchmarks.overhead --report              # rewrite overhead.md from overhead.json

Writes ``benchmarks/results/overhead.json``::

    {"mixcse": {"step_ratio_vs_mnrl": 1.01, "step_ms": 812.3, "loss_only_ms": 0.41, ...}, ..., "_meta": {...}}

and a markdown table next to it (``overhead.md``). Targets: <= 1.05x for mixcse, focal and hncse,
<= 1.45x for adcse.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS, WIKI10K
from benchmarks.methods import OURS, registry_loss

DEFAULT_OUT = RESULTS / "overhead.json"
DEFAULT_CORPUS = WIKI10K
#: the project's step-ratio targets (methods without a target are reported only)
TARGETS = {"mixcse": 1.05, "focal": 1.05, "hncse_pm": 1.05, "hncse_hnm": 1.05, "hncse": 1.05, "adcse": 1.45}
#: the methods measured by default (``hncse``, PM and HNM together, on request with --methods)
DEFAULT_METHODS = ["mnrl", "mnrl_hardness", *OURS]


def load_encoder(model_path: str | None, max_seq_length: int):
    from st_hardneg.models import resolve_model

    return resolve_model(model_path, pooling="cls", max_seq_length=max_seq_length, device="cpu")


def make_batches(model, sentences: list[str], batch_size: int, count: int) -> list[dict]:
    """``count`` tokenised batches of distinct consecutive sentences (wrapping around if the corpus is short)."""
    needed = batch_size * count
    if len(sentences) < batch_size:
        raise ValueError(f"need at least {batch_size} sentences for one batch, got {len(sentences)}")
    pool = (sentences * (needed // len(sentences) + 1))[:needed]
    return [model.preprocess(pool[i * batch_size:(i + 1) * batch_size]) for i in range(count)]


class Runner:
    """One method: its own model copy, loss and AdamW (the Trainer's defaults), stepping on given batches."""

    def __init__(self, name: str, base_model, lr: float, seed: int) -> None:
        import torch

        from st_hardneg.training import build_loss

        torch.manual_seed(seed)
        self.name = name
        self.model = copy.deepcopy(base_model)
        self.model.train()
        self.loss = build_loss(registry_loss(name), self.model)
        self.loss.train()
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=lr)
        self.params = params
        self.step_seconds: list[float] = []

    def step(self, batch: dict) -> float:
        import torch

        start = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        features = [dict(batch), dict(batch)]  # the model writes into the dicts: fresh ones per column and call
        loss = self.loss(features, None)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)  # the Trainer's max_grad_norm
        self.optimizer.step()
        elapsed = time.perf_counter() - start
        if not torch.isfinite(loss):
            raise RuntimeError(f"{self.name}: non-finite loss {loss.item()}")
        return elapsed


def step_benchmark(methods: list[str], base_model, batches: list[dict], warmup: int, lr: float, seed: int,
                   show_progress_bar: bool = True) -> dict[str, list[float]]:
    """Per-step seconds of every method, rounds interleaved round-robin (rotating start); warm-up rounds dropped."""
    from tqdm.auto import tqdm

    runners = [Runner(name, base_model, lr, seed) for name in methods]
    times: dict[str, list[float]] = {name: [] for name in methods}
    for round_index, batch in enumerate(tqdm(batches, desc="interleaved steps", disable=not show_progress_bar)):
        shift = round_index % len(runners)
        for runner in runners[shift:] + runners[:shift]:
            seconds = runner.step(batch)
            if round_index >= warmup:
                times[runner.name].append(seconds)
    return times


def loss_only_benchmark(methods: list[str], base_model, dim: int, batch_size: int, reps: int, warmup: int,
                        seed: int) -> dict[str, list[float]]:
    """Per-call seconds of ``compute_loss_from_embeddings`` + backward on fixed random (anchor, positive)
    embeddings, interleaved across methods; warm-up repetitions dropped."""
    import torch

    from st_hardneg.training import build_loss

    generator = torch.Generator().manual_seed(seed)
    anchors = torch.randn(batch_size, dim, generator=generator)
    positives = anchors + 0.1 * torch.randn(batch_size, dim, generator=generator)
    losses = {}
    for name in methods:
        torch.manual_seed(seed)
        losses[name] = build_loss(registry_loss(name), base_model).train()
    times: dict[str, list[float]] = {name: [] for name in methods}
    for rep in range(warmup + reps):
        shift = rep % len(methods)
        for name in methods[shift:] + methods[:shift]:
            a = anchors.clone().requires_grad_(True)
            p = positives.clone().requires_grad_(True)
            start = time.perf_counter()
            loss = losses[name].compute_loss_from_embeddings([a, p], None)
            loss.backward()
            elapsed = time.perf_counter() - start
            if rep >= warmup:
                times[name].append(elapsed)
    return times


def profile_method(method: str, base_model, batches: list[dict], lr: float, seed: int, rows: int = 25) -> str:
    """torch.profiler table (self CPU time) of a few steps of ``method`` after one warm-up step."""
    from torch.profiler import ProfilerActivity, profile

    runner = Runner(method, base_model, lr, seed)
    runner.step(batches[0])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for batch in batches[1:]:
            runner.step(batch)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def _median_ms(values: list[float]) -> float:
    return round(1000.0 * statistics.median(values), 3)


def summarize(step_times: dict[str, list[float]], loss_times: dict[str, list[float]],
              baseline: str = "mnrl") -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    base_steps = step_times[baseline]
    for name, values in step_times.items():
        per_round = [t / b for t, b in zip(values, base_steps, strict=True)]
        q = statistics.quantiles(per_round, n=4) if len(per_round) >= 2 else [per_round[0]] * 3
        row: dict[str, Any] = {
            "step_ratio_vs_mnrl": round(statistics.median(per_round), 4),
            "step_ratio_iqr": [round(q[0], 4), round(q[2], 4)],
            "step_ratio_of_medians": round(statistics.median(values) / statistics.median(base_steps), 4),
            "step_ms": _median_ms(values),
            "loss_only_ms": _median_ms(loss_times[name]),
            "steps_measured": len(values),
        }
        row["loss_only_share_of_step"] = round(row["loss_only_ms"] / row["step_ms"], 5)
        if name in TARGETS:
            row["target"] = TARGETS[name]
            row["meets_target"] = row["step_ratio_vs_mnrl"] <= TARGETS[name]
        rows[name] = row
    return rows


def markdown(results: dict[str, Any]) -> str:
    from st_hardneg.reporting import markdown_table

    meta = results.get("_meta", {})
    header = ["method", "step ratio vs mnrl (median, IQR)", "median step (ms)", "loss only + backward (ms)",
              "loss share of step", "target", "met"]
    body = []
    for name, row in results.items():
        if name.startswith("_"):
            continue
        target = f"≤ {row['target']:.2f}×" if "target" in row else "–"
        met = ("yes" if row["meets_target"] else "**no**") if "meets_target" in row else "–"
        iqr = row["step_ratio_iqr"]
        body.append([name, f"{row['step_ratio_vs_mnrl']:.3f}× ({iqr[0]:.2f}–{iqr[1]:.2f})", f"{row['step_ms']:.0f}",
                     f"{row['loss_only_ms']:.2f}", f"{100 * row['loss_only_share_of_step']:.2f}%", target, met])
    lines = markdown_table(header, body).rstrip("\n").split("\n")
    if meta:
        lines += ["", f"{meta.get('model')}, batch {meta.get('batch_size')}, max_seq_length "
                      f"{meta.get('max_seq_length')}, {meta.get('steps_measured')} interleaved steps per method after "
                      f"{meta.get('warmup_steps')} warm-up, torch {meta.get('torch')} on {meta.get('cpu_count')} CPU "
                      f"cores, torch threads: {meta.get('torch_threads')}. {meta.get('contention', '')}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from st_hardneg.training import LOSSES

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="*", default=DEFAULT_METHODS,
                        help=f"from {', '.join(LOSSES)} (mnrl, the baseline, is always included)")
    parser.add_argument("--model", default=None, help="encoder directory (default: the embedded all-MiniLM-L6-v2)")
    parser.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    parser.add_argument("--steps", type=int, default=25, help="measured steps per method (>= 20 for the real run)")
    parser.add_argument("--warmup", type=int, default=3, help="warm-up rounds, not measured")
    parser.add_argument("--loss-reps", type=int, default=200, help="repetitions of the loss-only benchmark")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-seq-length", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (0 = torch's default). 1 by default: on a loaded 2-core machine "
                             "two threads made each step about 3x slower and far noisier than one")
    parser.add_argument("--contention", default=None,
                        help="note on other load during the run, stored in _meta (default: the load average)")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--profile", default=None, metavar="METHOD",
                        help="print a torch.profiler table of a few steps of METHOD (and of mnrl) instead")
    parser.add_argument("--report", action="store_true", help="only rewrite the markdown table of --out")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.report:
        out = Path(args.out)
        table = markdown(json.loads(out.read_text()))
        out.with_suffix(".md").write_text(table)
        print(table)
        return 0

    import torch

    from st_hardneg.data import read_corpus

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    methods = ["mnrl", *[m for m in args.methods if m != "mnrl"]]
    unknown = [m for m in methods if m not in LOSSES]
    if unknown:
        parser.error(f"unknown method(s) {unknown}; choose from {', '.join(LOSSES)}")
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be >= 1 and --warmup >= 0")
    base = load_encoder(args.model, args.max_seq_length)
    sentences = read_corpus(args.corpus)

    if args.profile:
        if args.profile not in LOSSES:
            parser.error(f"unknown method {args.profile!r}")
        batches = make_batches(base, sentences, args.batch_size, 4)
        for method in dict.fromkeys(["mnrl", args.profile]):
            print(f"=== {method}\n{profile_method(method, base, batches, args.lr, args.seed)}")
        return 0

    load_before = os.getloadavg()
    start = time.perf_counter()
    batches = make_batches(base, sentences, args.batch_size, args.warmup + args.steps)
    step_times = step_benchmark(methods, base, batches, args.warmup, args.lr, args.seed,
                                show_progress_bar=not args.quiet)
    dim = base.get_embedding_dimension()
    loss_times = loss_only_benchmark(methods, base, dim, args.batch_size, args.loss_reps, warmup=10, seed=args.seed)
    load_after = os.getloadavg()
    results: dict[str, Any] = summarize(step_times, loss_times)
    results["_meta"] = {
        "model": args.model or "all-MiniLM-L6-v2 (embedded), CLS pooling",
        "embedding_dim": dim,
        "batch_size": args.batch_size,
        "max_seq_length": args.max_seq_length,
        "corpus": Path(args.corpus).name,
        "steps_measured": args.steps,
        "warmup_steps": args.warmup,
        "loss_only_reps": args.loss_reps,
        "loss_only_input": f"fixed random embeddings {args.batch_size}x{dim} (anchor, positive), requires_grad",
        "step": "zero_grad + forward (anchor, positive) + loss + backward + clip_grad_norm(1.0) + AdamW step "
                "(incl. optimizer-step hooks: AdCSE's EMA and adversary update)",
        "order": "round-robin, start rotated every round; ratio = median over rounds of t(method) / t(mnrl)",
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "load_average_before_after": [round(load_before[0], 2), round(load_after[0], 2)],
        "contention": args.contention or (
            f"load average {load_before[0]:.1f} → {load_after[0]:.1f} on {os.cpu_count()} cores during the run "
            "(other jobs were running: absolute times are inflated; interleaving keeps the ratios comparable)"),
        "smoke": args.steps < 20,
        "seconds": round(time.perf_counter() - start, 1),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=2) + "\n")
    tmp.replace(out)
    table = markdown(results)
    out.with_suffix(".md").write_text(table)
    print(table)
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
