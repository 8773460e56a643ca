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

The study (``benchmarks/studies/scale_gpu.json``): a device call runs its configurations one after the other in one
process on one model, so one call is one trial: its dataset is the call (``call3``: its number, the (batch, variant)
grid it ran, its timed steps, a note), its row every method, its seed 0 (the weights' seed); the records file keeps
the calls' rows in order (:func:`read` / :func:`layout`), each call's ratios within it::

    python -m benchmarks.studies benchmarks/studies/scale_gpu.json --check                 # the committed table
    python -m benchmarks.studies benchmarks/studies/scale_gpu.json --run --set device=cuda # a call left (a new dataset)
"""

from __future__ import annotations

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


# ------------------------------------------------------------------------------------------------ the study
#: the row of the study: every method, in one device call
ROW = "every_method"
#: what a trial's record carries besides the call's rows (its point and its process's fields)
CALL_FIELDS = ("dataset", "row", "seed", "call", "model", "steps", "mini_batch_size", "environment", "wall_seconds",
               "note")
#: the models a study may name: a random BERT-base-shaped encoder, or the tiny one (the CPU smoke run)
SHAPES = {"bert-base": BERT_BASE, "tiny": TINY}


def read(data: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``(records, meta)`` of ``scale_gpu.json``: one record per device call (its rows, in the file's order; the
    point ``call<n>``, the row :data:`ROW`, seed 0); ``meta``: the file's other fields, ``rows`` kept in its place.

    Raises:
        ValueError: a call whose rows are not together in the file (its records would not be one call's).
    """
    calls: dict[int, list[dict[str, Any]]] = {}
    last = None
    for row in data["rows"]:
        call = row.get("call", 1)
        if call in calls and call != last:
            raise ValueError(f"the rows of device call {call} are not together in the file")
        calls.setdefault(call, []).append(row)
        last = call
    records = [{"dataset": f"call{call}", "row": ROW, "seed": 0, "call": call, "rows": rows}
               for call, rows in calls.items()]
    return records, {**data, "rows": None}


def layout(records: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """The results file of ``records`` (:func:`read`'s inverse): the calls' rows in order, with their ratios
    (:func:`ratios`, within each call); a fresh study's fields from its first call, and each call run since merged as
    a later device call (its wall time, its environment under ``environments``, its note)."""
    rows = [row for record in records for row in record["rows"]]
    new = [r for r in records if "environment" in r]
    if meta:
        data = {**meta, "rows": rows}
    elif new:
        first = new[0]
        data = {"model": first["model"], "steps": first["steps"], "mini_batch_size": first["mini_batch_size"],
                "wall_seconds": 0.0, "environment": first["environment"], "rows": rows}
    else:
        return {"rows": rows}
    for index, record in enumerate(new):
        data["wall_seconds"] = round(data["wall_seconds"] + record["wall_seconds"], 1)
        if meta or index:  # a later call: its environment and note beside the first's
            data.setdefault("environments", {})[str(record["call"])] = record["environment"]
        if record.get("note"):
            data["notes"] = [*data.get("notes", []), record["note"]]
    ratios(data["rows"])
    return data


def prepare(spec: Any, points: list[Any], context: dict[str, Any]) -> None:
    """Before any trial: the device (``--set device=cuda`` for the BERT-base protocol), the model, each call's
    number (at least 1, one dataset each), batches and steps in range.

    Raises:
        ValueError: naming the value or dataset.
    """
    import torch

    device = context.get("device", "cpu")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu or cuda, got {device!r}")
    if spec.protocol["model"] not in SHAPES:
        raise ValueError(f"model must be one of {', '.join(SHAPES)}, got {spec.protocol['model']!r}")
    if spec.protocol["model"] == "bert-base" and device != "cuda":
        raise ValueError(f"{spec.name} measures a BERT-base-shaped encoder on a GPU: run it with --set device=cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("no CUDA device (a CPU run: a spec whose protocol's model is tiny)")
    asked = [m for row in spec.rows.values() for m in row.extra.get("methods", [])]
    asked += [m for d in spec.datasets.values() for m in d.extra.get("methods", [])]
    unknown = sorted(set(asked) - set(METHODS))
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; choose from {', '.join(METHODS)}")
    calls: dict[int, str] = {}
    for name, dataset in spec.datasets.items():
        call = dataset.extra.get("call")
        if not isinstance(call, int) or isinstance(call, bool) or call < 1:
            raise ValueError(f"dataset {name!r}: call must be an integer >= 1, got {call!r}")
        if call in calls:
            raise ValueError(f"datasets {calls[call]!r} and {name!r} are both device call {call}: give each its own "
                             "number (ratios compare rows of one call only)")
        calls[call] = name
        if dataset.extra.get("steps", 1) < 1 or any(b < 2 for b, _ in dataset.extra.get("grid", [])):
            raise ValueError(f"dataset {name!r}: steps must be >= 1 and every batch >= 2")


def run_call(methods: list[str], grid: list[tuple[int, str]], steps: int, mini: int, device: str,
             shape: dict[str, int], call: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One device call: every method at every (batch, variant) of ``grid`` on one model, one configuration after the
    other, each from the same initial weights, CUDA caches emptied between them; its rows (with their FLOP rates and
    ratios) and its environment."""
    import sentence_transformers
    import torch

    environment = {"device_name": torch.cuda.get_device_name() if device == "cuda" else platform.processor()
                   or "cpu", "torch": torch.__version__, "cuda": torch.version.cuda,
                   "sentence_transformers": sentence_transformers.__version__}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(Path(tmp), shape, 32, device)
        initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
        for batch, variant in grid:
            batches = tokenised_batches(model, batch, steps, device)
            # the reference of the other variant is not run: mnrl is uncached, cached_mnrl cached
            for method in [m for m in methods if m != ("mnrl" if variant == "cached" else "cached_mnrl")]:
                model.load_state_dict(initial)  # every configuration starts from the same weights
                row = {"method": method, "batch_size": batch, "variant": variant, "call": call,
                       **run_config(model, method, batches, variant, mini, device)}
                add_flops(row, shape, environment["device_name"])
                rows.append(row)
                print(json.dumps(row), flush=True)
                gc.collect()
                if device == "cuda":
                    torch.cuda.empty_cache()
    ratios(rows)
    return rows, environment


def trial(spec: Any, point: Any, context: dict[str, Any]) -> dict[str, Any]:
    """One device call (the dataset: its ``call`` number, ``grid`` of (batch, variant), ``steps``, ``note`` and the
    ``methods`` it was asked for, default the row's), in this process (:func:`run_call`): its record, with the protocol's model and mini-batch and its
    environment. ``context``: ``device`` (``cpu``, or ``cuda``)."""
    dataset = spec.datasets[point.dataset].extra
    protocol = spec.protocol
    device = str(context.get("device", "cpu"))
    steps, call = int(dataset.get("steps", protocol["steps"])), int(dataset["call"])
    grid = [(int(b), str(v)) for b, v in dataset.get("grid", GRID)]
    start = time.perf_counter()
    methods = list(dataset.get("methods") or spec.rows[point.row].extra["methods"])
    rows, environment = run_call(methods, grid, steps,
                                 int(protocol["mini_batch_size"]), device, SHAPES[protocol["model"]], call)
    return {"dataset": point.dataset, "row": point.row, "seed": point.seed, "call": call, "rows": rows,
            "model": protocol["model_name"], "steps": steps, "mini_batch_size": protocol["mini_batch_size"],
            "environment": environment, "wall_seconds": round(time.perf_counter() - start, 1),
            **({"note": dataset["note"]} if dataset.get("note") else {})}
