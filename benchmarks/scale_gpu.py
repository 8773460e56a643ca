"""Scaling on a GPU: every loss on a BERT-base-shaped encoder in bf16, peak CUDA memory and step time.

The CPU scale benchmark (``benchmarks.scale``) measures resident memory on a tiny model, where the loss side
weighs most. This one measures what a GPU user reads: ``torch.cuda.max_memory_allocated`` and the median wall time
of a full training step (zero_grad, forward of both columns, loss, backward, gradient clipping at 1.0, AdamW step,
``torch.cuda.synchronize`` before reading the clock) under ``torch.autocast("cuda", dtype=torch.bfloat16)``, which
is what ``SentenceTransformerTrainingArguments(bf16=True)`` runs (float32 master weights, bf16 matmuls; the losses
compute their logits in float32 with autocast off).

Model: a randomly initialised BERT with BERT-base's shape (12 layers, hidden 768, 12 heads, intermediate 3072,
vocabulary 30,522, 110 M parameters), CLS pooling, ``max_seq_length`` 32 (the papers' length); texts are synthetic
sentences of distinct words that fill the 32 tokens, so no data is needed. The weights are random: only memory and
time are measured, never accuracy.

Grid (one process, configurations run one after the other, CUDA caches emptied between them): every method at
batch 64 and 1024 uncached, and at 8192 and 32768 cached (GradCache, ``mini_batch_size`` 1024). sentence-transformers'
``MultipleNegativesRankingLoss`` (``mnrl``, uncached) and ``CachedMultipleNegativesRankingLoss`` (``cached_mnrl``)
are the references; the ratios are to the reference of the same variant and batch.

``tflops`` is the useful work of a step (:func:`step_flops`: the encoder's forward and backward on both columns
and the B x B similarity, never GradCache's extra forward) over its median time, and ``peak_fraction`` that rate
over the GPU's dense bf16 peak (:data:`PEAK_BF16`); the FLOP count is written out in
:func:`encoder_forward_flops`.

``peak_mb`` is the peak allocated during the timed steps minus what was allocated just before them (weights, AdamW
state and gradients already exist after the warm-up step), i.e. what the step itself adds; ``base_mb`` is that
starting point.

    python -m benchmarks.scale_gpu --out benchmarks/results/scale_gpu.json     # needs a CUDA device
    python -m benchmarks.scale_gpu --dry-run                                   # tiny grid on the CPU (tested)
    python -m benchmarks.scale_gpu --batch-sizes 8192 32768 --steps 2 --call 3 --out $OUT/more.json   # a later call
    python -m benchmarks.scale_gpu --merge more.json                           # its rows into --out's table
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.methods import OURS, benchmark_loss, registry_loss

METHODS = ("mnrl", "cached_mnrl", *OURS)
GRID = ((64, "uncached"), (1024, "uncached"), (8192, "cached"), (32768, "cached"))
BERT_BASE = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
             "vocab_size": 30522, "max_position_embeddings": 512}
#: the GPUs' dense bf16 tensor-core peak (datasheets, without sparsity), by a substring of the device name
PEAK_BF16 = {"H100 PCIe": 756e12, "H100 NVL": 835e12, "H100": 989.4e12, "H200": 989.4e12, "A100": 312e12}
#: where this benchmark's step puts bf16 autocast (the placement its every row was measured in)
PLACEMENT = ("*custom loop*: `torch.autocast` around the loss's forward only, `backward()` outside it, as most "
             "hand-written loops; GradCache re-embeds inside `backward()`, outside the autocast: "
             "sentence-transformers' CachedMNRL re-embeds in float32 there, st-hardneg's losses replay the first "
             "pass's autocast (the cached rows of calls 1-2 predate that replay)")
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
        "vocab_size": 30522, "max_position_embeddings": 128}


def encoder_forward_flops(hidden: int, intermediate: int, layers: int, seq_len: int) -> int:
    """FLOPs of one BERT encoder forward on one sequence of ``seq_len`` tokens (matmuls only, see the docstring)."""
    per_layer = seq_len * (2 * 4 * hidden * hidden + 2 * 2 * hidden * intermediate) + 2 * 2 * seq_len * seq_len * hidden
    return layers * per_layer


def step_flops(config: dict[str, int], batch: int, seq_len: int, cached: bool) -> tuple[int, int]:
    """(useful, executed) FLOPs of a step on ``batch`` pairs (2 ``batch`` sequences): forward + backward (3
    forwards) and the B x B similarity with its backward; a cached step executes a fourth forward."""
    forward = 2 * batch * encoder_forward_flops(config["hidden_size"], config["intermediate_size"],
                                                config["num_hidden_layers"], seq_len)
    similarity = 3 * 2 * batch * batch * config["hidden_size"]
    useful = 3 * forward + similarity
    return useful, useful + (forward if cached else 0)


def build_model(work: Path, shape: dict[str, int], max_seq_length: int, device: str) -> Any:
    """A random encoder of ``shape`` with the tiny WordPiece tokenizer of ``st_hardneg.testing`` (token ids only
    matter for timing), CLS pooling."""
    import torch
    from transformers import BertConfig, BertModel

    from st_hardneg.models import load_model
    from st_hardneg.testing import make_tiny_model_dir

    folder = make_tiny_model_dir(work / "encoder")  # writes the tokenizer files; the weights are replaced below
    torch.manual_seed(0)
    BertModel(BertConfig(**shape)).save_pretrained(folder)
    return load_model(folder, pooling="cls", max_seq_length=max_seq_length, device=device)


def synthetic_texts(count: int, words_per_text: int = 30) -> list[str]:
    """``count`` distinct sentences of the fixture vocabulary's words (no duplicates, so no false-negative masking)."""
    from st_hardneg.testing import WORDS

    vocab = list(WORDS)
    texts = []
    for i in range(count):
        digits = " ".join(str(i))  # a distinct prefix per text
        body = " ".join(vocab[(i * 7 + j * 13) % len(vocab)] for j in range(words_per_text))
        texts.append(f"{digits} {body}")
    return texts


def build(method: str, model: Any, cached: bool, mini_batch_size: int) -> Any:
    from st_hardneg.training.registry import build_loss

    if method == "cached_mnrl":
        from sentence_transformers.sentence_transformer.losses import CachedMultipleNegativesRankingLoss

        if not cached:
            raise ValueError("cached_mnrl is always cached (its uncached counterpart is mnrl)")
        return CachedMultipleNegativesRankingLoss(model, scale=20.0, mini_batch_size=mini_batch_size)
    if method == "mnrl" and cached:
        raise ValueError("mnrl is the uncached reference (cached: cached_mnrl)")
    return build_loss(registry_loss(method), model, **({"mini_batch_size": mini_batch_size} if cached else {}))


def tokenised_batches(model: Any, batch: int, steps: int, device: str) -> list[dict[str, Any]]:
    """``steps + 1`` batches of distinct synthetic texts, tokenised once per batch size and moved to ``device``."""
    import torch

    texts = synthetic_texts(batch * (steps + 1))
    batches = [model.preprocess(texts[s * batch:(s + 1) * batch]) for s in range(steps + 1)]
    return [{k: v.to(device) if torch.is_tensor(v) else v for k, v in b.items()} for b in batches]


def run_config(model: Any, method: str, batches: list[dict[str, Any]], variant: str, mini_batch_size: int,
               device: str) -> dict[str, Any]:
    import torch

    cuda = device.startswith("cuda")
    try:
        loss = build(method, model, variant == "cached", mini_batch_size)
    except (ValueError, TypeError) as exc:
        return {"status": "not supported", "reason": str(exc)}
    model.train()
    loss.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=3e-5)
    def step(features: dict[str, Any]) -> tuple[float, float]:
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda" if cuda else "cpu", dtype=torch.bfloat16):
            value = loss([dict(features), dict(features)], None)
        value.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start, float(value.detach())

    try:
        warm_seconds, first = step(batches[0])
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        seconds, values = [], [first]
        for features in batches[1:]:
            s, v = step(features)
            seconds.append(s)
            values.append(v)
        peak = (torch.cuda.max_memory_allocated() - base) if cuda else 0
    except torch.OutOfMemoryError as exc:
        return {"status": "out of memory", "reason": str(exc).splitlines()[0]}
    if not all(v == v and abs(v) != float("inf") for v in values):
        return {"status": "error", "reason": f"non-finite loss values {values}"}
    return {"status": "ok", "loss_class": type(loss).__name__, "seq_len": int(batches[0]["input_ids"].shape[1]),
            "step_ms": round(1000 * statistics.median(seconds), 2),
            "step_seconds": [round(s, 4) for s in seconds], "warmup_seconds": round(warm_seconds, 3),
            "peak_mb": round(peak / 2**20, 1), "base_mb": round(base / 2**20, 1) if cuda else 0.0,
            "loss_values": [round(v, 4) for v in values]}


def add_flops(row: dict[str, Any], shape: dict[str, int], device_name: str) -> None:
    """``tflops`` and ``peak_fraction`` of an ``ok`` row (see the module docstring)."""
    if row.get("status") != "ok" or not row.get("step_ms"):
        return
    useful, _ = step_flops(shape, row["batch_size"], row["seq_len"], cached=row["variant"] == "cached")
    rate = useful / (row["step_ms"] / 1000)
    row["tflops"] = round(rate / 1e12, 1)
    peak = next((v for k, v in PEAK_BF16.items() if k in device_name), None)
    row["peak_fraction"] = round(rate / peak, 4) if peak else None


def ratios(rows: list[dict[str, Any]]) -> None:
    """Add ``step_ratio`` / ``peak_ratio`` to the reference of the same batch and variant (mnrl / cached_mnrl) measured
    in the same device call (``call``: rows merged from several calls are compared only within their call)."""
    ref = {(r["batch_size"], r["variant"], r.get("call", 1)): r for r in rows
           if r["status"] == "ok" and r["method"] == ("cached_mnrl" if r["variant"] == "cached" else "mnrl")}
    for r in rows:
        base = ref.get((r["batch_size"], r["variant"], r.get("call", 1)))
        if r["status"] == "ok" and base is not None:
            r["step_ratio"] = round(r["step_ms"] / base["step_ms"], 3)
            r["peak_ratio"] = round(r["peak_mb"] / base["peak_mb"], 3) if base["peak_mb"] else None


def _cell(value: float | None, form: str) -> str:
    return "" if value is None else form.format(value).replace("%", " %")


def markdown(result: dict[str, Any]) -> str:
    env = result["environment"]
    lines = [f"# Scaling on a GPU ({env['device_name']}, {result['model']}, bf16 autocast)", "",
             "Generated by `python -m benchmarks.scale_gpu` from `scale_gpu.json`. Step: median of the "
             "timed steps after one warm-up; peak: CUDA memory the step adds "
             "(`max_memory_allocated` minus the allocation before it). Ratios to sentence-transformers' "
             "`MultipleNegativesRankingLoss` (uncached) / `CachedMultipleNegativesRankingLoss` (cached, "
             f"`mini_batch_size` {result['mini_batch_size']}) at the same batch.", "",
             f"Placement: {PLACEMENT} (every row: this benchmark's own step); under "
             "`SentenceTransformerTrainer(bf16=True)` the model's forward itself is under autocast, and both engines' "
             "re-embedding runs in bf16 (`scale_profile_gpu.md`, placement *Trainer*).", "",
             "| batch | variant | method | placement | call | timed steps | step (ms) | / ST | peak (MB) | / ST | TFLOP/s "
             "| of peak | status |",
             "|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in result["rows"]:
        if r["status"] == "ok":
            step_ratio, peak_ratio = r.get("step_ratio"), r.get("peak_ratio")
            lines.append(f"| {r['batch_size']} | {r['variant']} | {benchmark_loss(r)} | custom loop | {r.get('call', 1)} | "
                         f"{len(r['step_seconds'])} | {r['step_ms']:.1f} | "
                         f"{'' if step_ratio is None else f'{step_ratio:.2f}'} | {r['peak_mb']:.0f} | "
                         f"{'' if peak_ratio is None else f'{peak_ratio:.2f}'} | "
                         f"{_cell(r.get('tflops'), '{:.1f}')} | {_cell(r.get('peak_fraction'), '{:.1%}')} | ok |")
        else:
            lines.append(f"| {r['batch_size']} | {r['variant']} | {benchmark_loss(r)} | custom loop | {r.get('call', 1)} "
                         f"| | | | | | | | {r['status']} |")
    lines += [""] + [f"- {note}" for note in result.get("notes", [])]
    lines += ["", f"torch {env['torch']}, CUDA {env['cuda']}, sentence-transformers {env['sentence_transformers']}; "
              f"total wall time {result['wall_seconds']:.0f} s.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/scale_gpu.json")
    parser.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up step")
    parser.add_argument("--mini-batch-size", type=int, default=1024)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--batch-sizes", nargs="+", type=int, help="only these batches of the grid")
    parser.add_argument("--report", action="store_true", help="only re-render the markdown from --out's JSON")
    parser.add_argument("--dry-run", action="store_true", help="a tiny encoder and tiny batches on the CPU")
    parser.add_argument("--call", type=int, default=1, help="the device call these rows come from (ratios compare "
                        "rows of one call only)")
    parser.add_argument("--merge", help="append this results JSON's rows (a later call, same model) to --out's")
    parser.add_argument("--note", action="append", default=[], help="with --merge: a note for the table")
    args = parser.parse_args(argv)
    if args.call < 1:
        parser.error(f"--call must be >= 1, got {args.call}")
    if args.merge and not Path(args.merge).is_file():
        parser.error(f"--merge: no results file at {args.merge}")
    if args.note and not args.merge:
        parser.error("--note goes with --merge (a note on the merged call)")
    if args.report or args.merge:
        saved = json.loads(Path(args.out).read_text())
        if args.merge:
            more = json.loads(Path(args.merge).read_text())
            if more["model"] != saved["model"] or more["mini_batch_size"] != saved["mini_batch_size"]:
                parser.error(f"--merge: {args.merge} measured {more['model']!r} (mini-batch "
                             f"{more['mini_batch_size']}), --out {saved['model']!r} ({saved['mini_batch_size']})")
            calls = {r.get("call", 1) for r in saved["rows"]}
            if {r.get("call", 1) for r in more["rows"]} & calls:
                parser.error(f"--merge: {args.merge} reuses a call number of --out ({sorted(calls)}); rerun with --call")
            saved["rows"] += more["rows"]
            saved["wall_seconds"] = saved["wall_seconds"] + more["wall_seconds"]
            saved["notes"] = [*saved.get("notes", []), *args.note]
            saved.setdefault("environments", {})[str(more["rows"][0].get("call", 1))] = more["environment"]
        ratios(saved["rows"])
        Path(args.out).write_text(json.dumps(saved, indent=1) + "\n") if args.merge else None
        Path(args.out).with_suffix(".md").write_text(markdown(saved))
        return 0
    import sentence_transformers
    import torch

    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device (use --dry-run for the CPU smoke run)")
    grid = ((4, "uncached"), (8, "cached")) if args.dry_run else GRID
    if args.batch_sizes:
        grid = tuple(g for g in grid if g[0] in args.batch_sizes)
    mini = 4 if args.dry_run else args.mini_batch_size
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "model": "BERT-base shape (random), CLS, max_seq_length 32" if not args.dry_run else "tiny (dry run)",
        "steps": args.steps, "mini_batch_size": mini, "wall_seconds": 0.0,
        "environment": {"device_name": torch.cuda.get_device_name() if device == "cuda" else platform.processor()
                        or "cpu", "torch": torch.__version__, "cuda": torch.version.cuda,
                        "sentence_transformers": sentence_transformers.__version__},
        "rows": rows,
    }
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(Path(tmp), TINY if args.dry_run else BERT_BASE, 32, device)
        initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
        for batch, variant in grid:
            batches = tokenised_batches(model, batch, args.steps, device)
            # the reference of the other variant is not run: mnrl is uncached, cached_mnrl cached
            methods = [m for m in args.methods if m != ("mnrl" if variant == "cached" else "cached_mnrl")]
            for method in methods:
                model.load_state_dict(initial)  # every configuration starts from the same weights
                row = {"method": method, "batch_size": batch, "variant": variant, "call": args.call,
                       **run_config(model, method, batches, variant, mini, device)}
                add_flops(row, TINY if args.dry_run else BERT_BASE, result["environment"]["device_name"])
                rows.append(row)
                print(json.dumps(row), flush=True)
                gc.collect()
                if device == "cuda":
                    torch.cuda.empty_cache()
                ratios(rows)  # written after every row: a run stopped at its time limit keeps what it measured
                result["wall_seconds"] = round(time.perf_counter() - start, 1)
                out.write_text(json.dumps(result, indent=1) + "\n")
                out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
