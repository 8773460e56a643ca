"""Cost of each loss relative to unsupervised SimCSE (``mnrl``): per training step, and for the loss math alone.

Step benchmark: every method gets its own copy of the same encoder (the embedded all-MiniLM-L6-v2, CLS pooling,
max_seq_length 32, or ``--set model=PATH``) and its own AdamW, and all of them train in one process on the same
pre-tokenised batches of 64 wiki10k sentences (each sentence twice, as in unsupervised training). Each round runs one
full step per method (zero_grad, forward, loss, backward, gradient clipping, optimizer step, including AdCSE's EMA
and adversary updates, which run in the optimizer-step hook), in a round-robin order that rotates every round, so
that background load and CPU frequency drift hit every method alike. Warm-up rounds are left out; the reported ratio
is the median over rounds of ``t(method) / t(mnrl)`` in the same round, next to the median step time.

Loss-only benchmark: fixed random embeddings (64 x d, d = 384 for MiniLM) with ``requires_grad`` → the loss's
``compute_loss_from_embeddings`` + backward, median over repetitions (also interleaved). It shows how much of a
step the loss math itself costs.

The study is ``benchmarks/studies/overhead.json``: the whole interleaved measurement is its one trial
(:func:`trial`: one group of methods, one round of steps, in one process), run and rendered by the one runner::

    python -m benchmarks.studies benchmarks/studies/overhead.json --check   # overhead.md == its record?
    python -m benchmarks.studies benchmarks/studies/overhead.json --run     # measure (about 25 min on 2 busy cores)
    python -m benchmarks.studies SPEC_COPY --run --set model=tiny-bert-dir --set steps=3 --set warmup=1 \
        --set loss_reps=3                                                     # a smoke run (a copy of the spec)

The committed measurement is the study's finished trial: ``--run`` measures again only once
``results/overhead.json`` is moved away. :func:`profile_tables` shows where a method's step time goes
(torch.profiler).

``benchmarks/results/overhead.json``::

    {"mixcse": {"step_ratio_vs_mnrl": 1.01, "step_ms": 812.3, "loss_only_ms": 0.41, ...}, ..., "_meta": {...}}

and a markdown table next to it (``overhead.md``, :func:`markdown`). Targets: <= 1.05x for mixcse, focal and hncse,
<= 1.45x for adcse.
"""

from __future__ import annotations

import copy
import os
import platform
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import SHARED_DATA
from benchmarks.methods import OURS, registry_loss

DEFAULT_CORPUS = SHARED_DATA / "corpus" / "wiki10k.txt"
#: the project's step-ratio targets (methods without a target are reported only)
TARGETS = {"mixcse": 1.05, "focal": 1.05, "hncse_pm": 1.05, "hncse_hnm": 1.05, "hncse": 1.05, "adcse": 1.45}
#: the methods measured by default (``hncse``, PM and HNM together, on request)
DEFAULT_METHODS = ["mnrl", "mnrl_hardness", *OURS]
#: the baseline every ratio is against; it is always measured, first
BASELINE = "mnrl"
#: the measurement's settings a trial reads from the spec's protocol, each overridable by ``--set KEY=VALUE``
SETTINGS = {"batch_size": 64, "max_seq_length": 32, "steps": 25, "warmup": 3, "loss_reps": 200, "loss_warmup": 10,
            "lr": 3e-5, "threads": 1}
#: the committed measurement's group (the spec's one row) and seed, which its ``_meta`` does not name
GROUP, SEED = "interleaved", 0
#: a record's provenance, kept in its ``_meta`` (the table's rows are the records' other top-level keys)
PROVENANCE = ("commit", "library")


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




# --------------------------------------------------------------------------- the study's trial and its records file
def settings(spec: Any, context: Mapping[str, Any]) -> dict[str, Any]:
    """The measurement's :data:`SETTINGS`: the spec's protocol values of those names, each replaced by a ``--set``
    value of the trial's context.

    Raises:
        ValueError: a count below its minimum or a learning rate that is not a positive number (naming it).
    """
    from st_hardneg import validation

    out = {key: context.get(key, spec.protocol.get(key, default)) for key, default in SETTINGS.items()}
    for key, minimum in (("batch_size", 2), ("max_seq_length", 1), ("steps", 1), ("warmup", 0), ("loss_reps", 1),
                         ("loss_warmup", 0), ("threads", 0)):
        validation.check_count(out[key], key, minimum=minimum)
    validation.check_number(out["lr"], "lr", minimum=0.0)
    return out


def group_methods(row: Any) -> list[str]:
    """The labels a row measures together (its ``extra["methods"]``, labels of :data:`benchmarks.methods.METHODS` or
    registry names; default :data:`DEFAULT_METHODS`), the baseline first.

    Raises:
        ValueError: a label whose loss is not in the registry (naming it).
    """
    from st_hardneg.training import LOSSES

    labels = [str(m) for m in row.extra.get("methods", DEFAULT_METHODS)]
    methods = [BASELINE, *dict.fromkeys(m for m in labels if m != BASELINE)]
    unknown = [m for m in methods if registry_loss(m) not in LOSSES]
    if unknown:
        raise ValueError(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(LOSSES)}")
    return methods


def _corpus(spec: Any, point: Any, context: Mapping[str, Any]) -> Path:
    folder = spec.datasets[point.dataset].folder
    path = DEFAULT_CORPUS if folder is None else Path(folder)
    if folder is not None and not path.is_absolute():
        path = Path(context.get("data_dir", SHARED_DATA)) / path
    if not path.is_file():
        raise ValueError(f"no corpus at {path} (dataset {point.dataset!r} of the spec)")
    return path


def check(spec: Any, points: Sequence[Any], context: Mapping[str, Any]) -> None:
    """The spec's ``report.prepare``: refuse, before any model loads, the settings, a group's methods or a corpus
    that a trial left to run would refuse.

    Raises:
        ValueError: naming the setting, method or corpus.
    """
    settings(spec, context)
    for point in points:
        group_methods(spec.rows[point.row])
        _corpus(spec, point, context)


def trial(spec: Any, point: Any, context: Mapping[str, Any]) -> dict[str, Any]:
    """The study's one trial: the row's group of methods (:func:`group_methods`) measured together in this process,
    the step benchmark (:func:`step_benchmark`, rounds interleaved round-robin) and then the loss-only benchmark
    (:func:`loss_only_benchmark`), on the dataset's corpus at the point's seed, with the spec's :func:`settings`.
    ``context["model"]`` is an encoder directory (default: the embedded all-MiniLM-L6-v2, CLS pooling),
    ``context["progress"]`` shows a progress bar; the torch thread count is set for the measurement and restored
    after it. Nothing is written.

    Returns:
        The records file's content (:func:`summarize`: one entry per method, and ``_meta``: the settings, the
        machine, the load during the run, the group, the seed and the provenance).

    Raises:
        ValueError: a bad setting, an unknown method, no corpus. RuntimeError: a non-finite loss.
    """
    import torch

    from st_hardneg.data import read_corpus

    values = settings(spec, context)
    methods = group_methods(spec.rows[point.row])
    corpus = _corpus(spec, point, context)
    seed = 0 if point.seed is None else int(point.seed)
    previous = torch.get_num_threads()
    if values["threads"] > 0:
        torch.set_num_threads(values["threads"])
    try:
        base = load_encoder(context.get("model"), values["max_seq_length"])
        sentences = read_corpus(corpus)
        load_before = os.getloadavg()
        start = time.perf_counter()
        batches = make_batches(base, sentences, values["batch_size"], values["warmup"] + values["steps"])
        step_times = step_benchmark(methods, base, batches, values["warmup"], values["lr"], seed,
                                    show_progress_bar=bool(context.get("progress", False)))
        dim = base.get_embedding_dimension()
        loss_times = loss_only_benchmark(methods, base, dim, values["batch_size"], values["loss_reps"],
                                         warmup=values["loss_warmup"], seed=seed)
        load_after = os.getloadavg()
        threads = torch.get_num_threads()
    finally:
        torch.set_num_threads(previous)
    results: dict[str, Any] = summarize(step_times, loss_times, baseline=BASELINE)
    provenance = dict(context.get("provenance") or {})
    results["_meta"] = {
        "model": context.get("model") or "all-MiniLM-L6-v2 (embedded), CLS pooling",
        "embedding_dim": dim,
        "batch_size": values["batch_size"],
        "max_seq_length": values["max_seq_length"],
        "corpus": corpus.name,
        "steps_measured": values["steps"],
        "warmup_steps": values["warmup"],
        "loss_only_reps": values["loss_reps"],
        "loss_only_input": f"fixed random embeddings {values['batch_size']}x{dim} (anchor, positive), requires_grad",
        "step": "zero_grad + forward (anchor, positive) + loss + backward + clip_grad_norm(1.0) + AdamW step "
                "(incl. optimizer-step hooks: AdCSE's EMA and adversary update)",
        "order": "round-robin, start rotated every round; ratio = median over rounds of t(method) / t(mnrl)",
        "torch": torch.__version__,
        "torch_threads": threads,
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "load_average_before_after": [round(load_before[0], 2), round(load_after[0], 2)],
        "contention": context.get("contention") or (
            f"load average {load_before[0]:.1f} → {load_after[0]:.1f} on {os.cpu_count()} cores during the run "
            "(other jobs were running: absolute times are inflated; interleaving keeps the ratios comparable)"),
        "smoke": values["steps"] < 20,
        "seconds": round(time.perf_counter() - start, 1),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
        "group": point.row,
        "seed": seed,
        **{key: provenance[key] for key in PROVENANCE if key in provenance},
    }
    return results


def read(data: Mapping[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The spec's ``report.read``: ``overhead.json`` is one measurement, so one record (the file's content, its
    provenance from ``_meta`` also at the top, where the runner reads it), and its grid point: the group and seed its
    ``_meta`` names (the committed measurement, which names neither: :data:`GROUP`, :data:`SEED`)."""
    meta = dict(data.get("_meta") or {})
    record = {**dict(data), **{key: meta[key] for key in PROVENANCE if key in meta}}
    return [record], {"group": meta.get("group", GROUP), "seed": meta.get("seed", SEED)}


def layout(records: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> dict[str, Any]:
    """The spec's ``report.layout``, :func:`read`'s inverse: the one record without its provenance at the top.

    Raises:
        ValueError: more than one record (the file holds one measurement).
    """
    if len(records) > 1:
        raise ValueError(f"overhead.json holds one measurement (one group at one seed), got {len(records)} records")
    return {key: value for key, value in (records[0] if records else {}).items() if key not in PROVENANCE}


def profile_tables(method: str, model_path: str | None = None, corpus: str | Path = DEFAULT_CORPUS, *,
                   batch_size: int = 64, max_seq_length: int = 32, lr: float = 3e-5, seed: int = 0) -> str:
    """Where a method's step time goes: :func:`profile_method` tables of ``mnrl`` and of ``method`` (4 batches).

    Example:
        ``python -c "from benchmarks.overhead import profile_tables; print(profile_tables('adcse'))"``

    Raises:
        ValueError: an unknown method.
    """
    from st_hardneg.data import read_corpus
    from st_hardneg.training import LOSSES

    if registry_loss(method) not in LOSSES:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(LOSSES)}")
    base = load_encoder(model_path, max_seq_length)
    batches = make_batches(base, read_corpus(corpus), batch_size, 4)
    return "".join(f"=== {name}\n{profile_method(name, base, batches, lr, seed)}\n"
                   for name in dict.fromkeys([BASELINE, method]))
