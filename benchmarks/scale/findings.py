"""The readings ``docs/scaling.md`` gives beside its tables, rendered from the committed records only (nothing is
re-run): ``benchmarks/results/scale_findings.md``, one section per reading between ``<!-- name -->`` /
``<!-- /name -->`` markers, which the page includes where it makes the claim.

Sources: ``scale.json`` (the CPU grid: a tiny BERT, 2 cores) and ``scale_minilm.json`` (all-MiniLM-L6-v2),
``scale_gpu.json`` (one H200, every loss in the custom-loop placement), ``scale_profile_gpu.json`` and
``scale_profile_gpu_losses.json`` (where a cached GPU step spends its time), ``scale_profile_cpu.json`` (the same on
the CPU), and the two reports written without a JSON: ``scale_paired.md`` (interleaved steps at one batch) and
``scale_tensors.md`` (the tensors a cached loss holds at its peak), read from their tables. Every ratio is taken
within one run; the targets are those the records carry (``scale.json``'s ``_meta.targets``). Rows are named by
today's loss names (:func:`benchmarks.scale.report.loss_names`: a ``mixcse`` row of these benchmarks is
``mixcse_two_way``).

    python -m benchmarks.scale summary          # rewrites scale_summary.md, scale_gpu.png and scale_findings.md
"""

from __future__ import annotations

import json
import re
import statistics
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.methods import OURS, benchmark_loss
from benchmarks.scale.report import REFERENCE, REFERENCE_TWO_WAY, TIME_FROM_BATCH, config_key, loss_names

RESULTS = Path(__file__).resolve().parents[1] / "results"
OUT_NAME = "scale_findings.md"
#: the phases of a cached step that are GradCache's own machinery, not the encoder's passes (``profile.PHASES``)
GLUE = ("slice", "rng_capture", "rng_restore", "loss", "other")
#: a loss whose positives go through a key encoder without gradient: its cached step and peak are not the others'
NO_POSITIVE_GRADIENT = ("adcse",)
#: the batch the peak-growth target was first set at (against batch 64's); the table also reads the largest batch,
#: where ``scale.json``'s ``_meta.targets`` now puts it
GROWTH_FIRST_SET = 8192
#: the GPU placements of the profile's configurations: ``name`` (custom loop) and ``name (trainer)``
TRAINER = " (trainer)"


# ------------------------------------------------------------------------------------------------ the records
def _read(name: str, results: Path) -> dict[str, Any]:
    return json.loads((results / name).read_text())


def markdown_rows(text: str, first_header: str) -> list[dict[str, str]]:
    """The rows of the first markdown table in ``text`` whose header starts with ``| first_header |``, as
    ``{column: cell}``.

    Raises:
        ValueError: no such table.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |")), None)
    if start is None:
        raise ValueError(f"no table with a {first_header!r} column")
    header = [cell.strip() for cell in lines[start].strip().strip("|").split("|")]
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(header, (cell.strip() for cell in line.strip().strip("|").split("|")), strict=True)))
    return rows


def _search(pattern: str, text: str, name: str) -> tuple[str, ...]:
    """The groups of ``pattern``'s first match in the report ``name``.

    Raises:
        ValueError: no match (named with the report).
    """
    match = re.search(pattern, text)
    if match is None:
        raise ValueError(f"{name}: no {pattern!r} in its text")
    return match.groups()


class Records:
    """The committed records the findings read, loaded once from ``results``."""

    def __init__(self, results: Path = RESULTS) -> None:
        self.scale = _read("scale.json", results)
        self.minilm = _read("scale_minilm.json", results)
        self.gpu = _read("scale_gpu.json", results)
        self.profile_gpu = _read("scale_profile_gpu.json", results)
        self.profile_losses = _read("scale_profile_gpu_losses.json", results)
        self.profile_cpu = _read("scale_profile_cpu.json", results)
        self.paired_text = (results / "scale_paired.md").read_text()
        self.tensors_text = (results / "scale_tensors.md").read_text()

    # -- the CPU grid
    @staticmethod
    def run(data: dict[str, Any], method: str, batch: int, processes: int = 1) -> dict[str, Any] | None:
        """A cached run of ``data`` (``scale.json`` or ``scale_minilm.json``) that finished, else None."""
        run = data["runs"].get(config_key(method, "cached", batch, processes))
        return run if run is not None and run.get("status") == "ok" else None

    def need(self, data: dict[str, Any], method: str, batch: int, processes: int = 1) -> dict[str, Any]:
        """:meth:`run`, where the findings cannot do without it.

        Raises:
            ValueError: the run is missing or did not finish (named with its file and key).
        """
        run = self.run(data, method, batch, processes)
        if run is None:
            name = "scale.json" if data is self.scale else "scale_minilm.json"
            raise ValueError(f"{name}: no finished run {config_key(method, 'cached', batch, processes)}")
        return run

    @staticmethod
    def losses(data: dict[str, Any]) -> list[str]:
        """The labels of st-hardneg's losses the grid ran, in :data:`benchmarks.methods.OURS`'s order."""
        recorded = {r["method"] for r in data["runs"].values()}
        return [m for m in OURS if m in recorded]

    @staticmethod
    def batches(data: dict[str, Any]) -> list[int]:
        return sorted({r["batch_size"] for r in data["runs"].values() if r.get("processes", 1) == 1})

    # -- the reports without a JSON
    def paired(self) -> dict[str, dict[str, str]]:
        """``scale_paired.md``'s rows by today's loss name (its ``mixcse`` is the two-way form, as its text says)."""
        rows = markdown_rows(self.paired_text, "loss")
        return {benchmark_loss({"method": r["loss"]}) if r["loss"] in OURS else r["loss"]: r for r in rows}

    def paired_batch(self) -> int:
        return int(_search(r"Batch (\d+)", self.paired_text, "scale_paired.md")[0])

    def tensors(self) -> dict[str, float]:
        """``scale_tensors.md``: per loss (today's name), the peak in N × d float32 matrices."""
        rows = markdown_rows(self.tensors_text, "loss")
        return {r["loss"].replace(" (two-way)", "_two_way"): float(r["peak (N×d float32 matrices)"]) for r in rows}

    def tensors_shape(self) -> dict[str, int]:
        """``scale_tensors.md``'s N, d and chunk size c, from its title."""
        n, d, c = _search(r"N (\d+), d (\d+), chunks of (\d+)", self.tensors_text, "scale_tensors.md")
        return {"N": int(n), "d": int(d), "c": int(c)}

    # -- the GPU profile
    @staticmethod
    def summary_row(profile: dict[str, Any], batch: int, config: str) -> dict[str, Any]:
        return next(r for r in profile["summary"] if r["batch"] == batch and r["config"] == config)

    @staticmethod
    def split_step(profile: dict[str, Any], batch: int, config: str) -> dict[str, Any]:
        return next(b for b in profile["batches"] if b["batch"] == batch)["split_step"][config]

    @staticmethod
    def largest_batch(profile: dict[str, Any]) -> int:
        return max(r["batch"] for r in profile["summary"])


# ------------------------------------------------------------------------------------------------ formatting
def _x(value: float, digits: int = 2) -> str:
    return f"{value:.{digits}f}×"


def _ratio(value: float, target: float) -> str:
    """A ratio at 2 decimals, or 3 where 2 would round it onto its target (1.198 is not 1.20)."""
    return _x(value, 3 if round(value, 2) == target and value != target else 2)


def _span(values: list[float], fmt: Callable[[float], str], unit: str = "") -> str:
    """``low–high`` and the unit once (``0.15–0.24×``), or one value where both print alike."""
    low, high = fmt(min(values)), fmt(max(values))
    return f"{low}{unit}" if low == high else f"{low}–{high}{unit}"


def _f(digits: int) -> Callable[[float], str]:
    return lambda value: f"{value:,.{digits}f}"


def _s(seconds: float) -> str:
    return f"{seconds:.2f} s"


def _mb(value: float) -> str:
    return f"{value:,.1f} MB"


def _pct(fraction: float) -> str:
    return f"{100 * fraction:.1f} %"


def _rounds(count: int) -> str:
    return f"{count} round{'' if count == 1 else 's'}"


def _code(name: str) -> str:
    return f"`{name}`"


# ------------------------------------------------------------------------------------------------ sections
def cpu_profile(rec: Records) -> str:
    """``scale_profile_cpu.json``: GradCache's own share of a cached step, the peaks, and the cached step against the
    same arithmetic in mini-batches."""
    p = rec.profile_cpu
    batch = rec.largest_batch(p)
    rows = {name: rec.summary_row(p, batch, name) for name in ("uncached", REFERENCE, "mixcse")}
    glue = {name: sum(rows[name]["split_s"].get(k, 0.0) for k in GLUE) for name in (REFERENCE, "mixcse")}
    mini = {name: rows[name]["split_s"]["reembed_forward"] + rows[name]["split_s"]["reembed_backward"]
            + rows[name]["split_s"]["optimizer"] for name in (REFERENCE, "mixcse")}
    profiled = next(b for b in p["batches"] if b["batch"] == batch)["profiled"][REFERENCE]
    bernoulli = next(op["self_cpu_ms"] for op in profiled["top_ops"] if op["name"] == "aten::bernoulli_") / 1000
    forwards = [rows[name]["split_s"]["reembed_forward"] for name in (REFERENCE, "mixcse")]
    return (f"At batch {batch:,}, GradCache's own pieces (slicing, RNG capture and restore, the loss and its gradient, "
            f"the glue) take {_s(glue[REFERENCE])} of CachedMNRL's {_s(rows[REFERENCE]['step_s'])} step "
            f"({_pct(glue[REFERENCE] / rows[REFERENCE]['step_s'])}) and {_s(glue['mixcse'])} of MixCSE's "
            f"{_s(rows['mixcse']['step_s'])} ({_pct(glue['mixcse'] / rows['mixcse']['step_s'])}). The uncached step "
            f"is {_x(rows['uncached']['to_cached_mnrl'])} CachedMNRL's: its encoder forward over the whole batch takes "
            f"{_s(rows['uncached']['split_s']['forward'])}, the cached re-embedding forward in mini-batches "
            f"{_span(forwards, _f(2), ' s')}, and it peaks at {rows['uncached']['peak_mb']:,.0f} MB against "
            f"{rows[REFERENCE]['peak_mb']:,.0f} MB (CachedMNRL) and {rows['mixcse']['peak_mb']:,.0f} MB (MixCSE). "
            f"Against the same arithmetic in mini-batches (the re-embedding forward, its backward and the optimizer) "
            f"the cached step is {_x(rows[REFERENCE]['step_s'] / mini[REFERENCE])} for CachedMNRL and "
            f"{_x(rows['mixcse']['step_s'] / mini['mixcse'])} for MixCSE; dropout's masks (`aten::bernoulli_`) take "
            f"{bernoulli:.1f} s of CachedMNRL's profiled {profiled['seconds']:.0f} s step "
            f"({_pct(bernoulli / profiled['seconds'])}).")


def gpu_profile_setup(rec: Records) -> str:
    """``scale_profile_gpu.json``: the run's batch, mini-batch, the uncached work's step and the run's wall time."""
    p = rec.profile_gpu
    batch = rec.largest_batch(p)
    uncached = rec.summary_row(p, batch, "uncached")
    return (f"{p['environment']['device_name']}, `mini_batch_size` {p['mini_batch_size']:,}, "
            f"{_rounds(p['rounds'])}, {p['wall_seconds']:.0f} s on the machine. The uncached work at batch {batch:,}: "
            f"{_s(uncached['step_s'])} a step ({_pct(uncached['peak_fraction'])} of the GPU's dense bf16 peak).")


def _heaviest_kernels(profiled: dict[str, Any], count: int = 2) -> list[dict[str, Any]]:
    """The profiled step's heaviest device kernels by self time (``aten::`` operators left out)."""
    kernels = [op for op in profiled["top_ops"] if not op["name"].startswith("aten::") and "self_device_ms" in op]
    return sorted(kernels, key=lambda op: -op["self_device_ms"])[:count]


def _kernel_name(name: str) -> str:
    """A kernel's name up to its tile sizes, without its template wrapper and parameter list
    (``void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(...)`` -> ``cutlass_80_simt_sgemm``)."""
    inner = re.search(r"<([A-Za-z0-9_]+)>", name)
    name = inner.group(1) if inner and name.startswith("void ") else name.split("(")[0]
    return re.split(r"_tilesize|_\d+x\d+", name)[0]


def gpu_profile_loop(rec: Records) -> str:
    """CachedMNRL and MixCSE in both placements at the largest batch: where CachedMNRL's extra time goes."""
    p = rec.profile_gpu
    batch = rec.largest_batch(p)
    ref, ours = rec.summary_row(p, batch, REFERENCE), rec.summary_row(p, batch, "mixcse")
    ref_t, ours_t = (rec.summary_row(p, batch, REFERENCE + TRAINER), rec.summary_row(p, batch, "mixcse" + TRAINER))
    glue = sum(ref["split_s"].get(k, 0.0) for k in (*GLUE, "optimizer"))
    profiled_batch, profiled = next((b["batch"], b["profiled"][REFERENCE]) for b in p["batches"]
                                    if REFERENCE in b.get("profiled", {}))
    kernels = ", ".join(f"`{_kernel_name(k['name'])}` ({k['self_device_ms']:,.0f} ms)"
                        for k in _heaviest_kernels(profiled))
    return (f"At batch {batch:,} in the custom loop CachedMNRL takes {_s(ref['step_s'])} a step, "
            f"{_s(ref['step_s'] - ours['step_s'])} more than MixCSE's {_s(ours['step_s'])}: "
            f"{_s(ref['split_s']['reembed_forward'])} in the re-embedding forward and "
            f"{_s(ref['split_s']['reembed_backward'])} in its backward, against "
            f"{_s(ref_t['split_s']['reembed_forward'])} and {_s(ref_t['split_s']['reembed_backward'])} for the same "
            f"passes in the Trainer placement. The heaviest kernels of its profiled step (batch {profiled_batch:,}; names "
            f"cut before their tile sizes): "
            f"{kernels}. Its slicing, RNG snapshots, loss, optimizer and glue together: {_s(glue)} a step. MixCSE in "
            f"the same loop: {_s(ours['step_s'])}, {_x(ours['to_cached_mnrl'])} CachedMNRL's step, "
            f"{_x(ours['to_uncached'])} the uncached work, a {ours['peak_mb']:,.0f} MB peak "
            f"({_x(ours['peak_mb'] / ref['peak_mb'])} CachedMNRL's {ref['peak_mb']:,.0f} MB). In the Trainer placement "
            f"MixCSE takes {_x(ours_t['to_cached_mnrl'])} CachedMNRL's step at {_x(ours_t['peak_mb'] / ref_t['peak_mb'])} "
            "its peak.")


def gpu_profile_floor(rec: Records) -> str:
    """The floor of a cached step (step 1 + the re-embedding and its backward), the loss side, and the host-device
    synchronisations by call site."""
    p, losses = rec.profile_gpu, rec.profile_losses
    batch = rec.largest_batch(p)
    uncached, ours = rec.summary_row(p, batch, "uncached"), rec.summary_row(p, batch, "mixcse")
    split, chunks = ours["split_s"], rec.summary_row(p, batch, "uncached")["split_s"]
    floor = split["forward_nograd"] + split["reembed_forward"] + split["reembed_backward"]
    loss_side = {row["config"]: row["split_s"]["loss"] for profile in (p, losses) for row in profile["summary"]
                 if row["batch"] == batch and row["config"] not in ("uncached", REFERENCE, REFERENCE + TRAINER)
                 and not row["config"].endswith(TRAINER)}
    heaviest = max(loss_side, key=loss_side.__getitem__)
    replay = split["slice"] + split["rng_capture"] + split["rng_restore"]
    theirs = rec.split_step(p, batch, REFERENCE)["sync_sites"]
    sites = rec.split_step(p, batch, "mixcse")["sync_sites"]
    total = rec.split_step(p, batch, "mixcse")["syncs"]
    shared = sum(n for site, n in sites.items() if site in theirs)
    own = {site: n for site, n in sites.items() if site not in theirs}
    files = sorted({site.split(":")[0] for site in own})
    return (f"The floor, at batch {batch:,}: step 1's {_s(split['forward_nograd'])} plus the re-embedding and its "
            f"backward, {_s(split['reembed_forward'] + split['reembed_backward'])} (the uncached chunks' forward and "
            f"backward: {_s(chunks['forward'] + chunks['backward'])}), {_s(floor)}, "
            f"{_x(floor / uncached['step_s'])} the uncached work; MixCSE's step ({_s(ours['step_s'])}) is "
            f"{100 * (ours['step_s'] / floor - 1):.0f} % above it. The loss side takes "
            f"{_span(list(loss_side.values()), _f(2), ' s')} a step (the largest: `{heaviest}`), slicing and the RNG replay "
            f"{_s(replay)}. Host-device synchronisations of a MixCSE step: {total}; {shared} at the call sites "
            f"CachedMNRL's step makes too, the other {total - shared} in st-hardneg's loss side "
            f"({sum(own.values())} of them attributed, to {', '.join(map(_code, files))}).")


def gpu_profile_losses(rec: Records) -> str:
    """``scale_profile_gpu_losses.json``: every loss against the uncached work, its peak against CachedMNRL's in both
    placements, and AdCSE's time outside the timed phases."""
    q, p = rec.profile_losses, rec.profile_gpu
    batch = rec.largest_batch(q)
    rows = [r for r in q["summary"] if r["batch"] == batch and r["config"] not in ("uncached", REFERENCE)]
    ref = rec.summary_row(q, batch, REFERENCE)
    trainer = rec.summary_row(p, batch, REFERENCE + TRAINER)
    worst = max(rows, key=lambda r: r["to_uncached"])
    peaks = [r["peak_mb"] for r in rows]
    adcse = next(r for r in rows if r["config"] == "adcse")
    return (f"{_rounds(q['rounds'])} at batch {batch:,}. Every loss takes at most {_x(worst['to_uncached'])} the "
            f"uncached work (`{worst['config']}`), with at most {_x(max(peaks) / trainer['peak_mb'])} the peak of "
            f"CachedMNRL in the Trainer placement of the first run (`{p['out_name']}`: {max(peaks):,.0f} MB against "
            f"{trainer['peak_mb']:,.0f} MB) and "
            f"{_span([v / ref['peak_mb'] for v in peaks], _f(2), '×')} its custom-loop peak of this run. AdCSE takes "
            f"{_x(adcse['to_uncached'])} the uncached work; {_s(adcse['split_s']['other'])} of its step lies outside "
            "the timed GradCache phases.")


def gpu_calls(rec: Records) -> str:
    """``scale_gpu.json``: the cached rows at the largest batch, before (the earlier calls) and on the current engine
    (the latest call)."""
    rows = [r for r in rec.gpu["rows"] if r["variant"] == "cached" and r["status"] == "ok"]
    batch = max(r["batch_size"] for r in rows)
    latest = max(r.get("call", 1) for r in rows)
    at = [r for r in rows if r["batch_size"] == batch]
    earlier = [r for r in at if r.get("call", 1) < latest and r["method"] in OURS]
    now = [r for r in at if r.get("call", 1) == latest and r["method"] in OURS]
    ref = next(r for r in at if r.get("call", 1) == latest and r["method"] == REFERENCE)
    calls = sorted({r.get("call", 1) for r in earlier})
    return (f"In `scale_gpu.json` at batch {batch:,}: the cached rows of call{'s' if len(calls) > 1 else ''} "
            f"{'–'.join(map(str, (calls[0], calls[-1]) if len(calls) > 1 else calls))} take "
            f"{_span([r['step_ratio'] for r in earlier], _f(2), '×')} CachedMNRL's step; call {latest}: every loss "
            f"{_span([r['step_ratio'] for r in now], _f(2), '×')} CachedMNRL's step at "
            f"{_span([r['peak_ratio'] for r in now], _f(2), '×')} its peak, "
            f"{_span([100 * r['peak_fraction'] for r in now], _f(0), ' %')} of the GPU's dense bf16 peak "
            f"against CachedMNRL's {_pct(ref['peak_fraction'])}.")


def protocol(rec: Records) -> str:
    """How the CPU grid's rows were timed: runs, steps and interleaved rounds per batch, and when they finished."""
    groups: dict[tuple[int, int, str], list[dict[str, Any]]] = {}
    for r in rec.scale["runs"].values():
        if r.get("status") == "ok":
            groups.setdefault((r.get("processes", 1), r["batch_size"], r["variant"]), []).append(r)
    lines = ["| rows | configurations | steps a run | interleaved rounds | finished |", "|---|---:|---:|---:|---|"]
    for (processes, batch, variant), runs in sorted(groups.items()):
        steps = sorted({r.get("steps", rec.scale["_meta"]["steps"]) for r in runs})
        rounds = sorted({len(r.get("step_ms_rounds") or []) or 1 for r in runs})
        days = sorted({r["finished"].split()[0] for r in runs if r.get("finished")})
        lines.append(f"| {variant}, batch {batch:,}{f', {processes} processes' if processes > 1 else ''} | "
                     f"{len(runs)} | {', '.join(map(str, steps))} | {', '.join(map(str, rounds))} | "
                     f"{_span_days(days)} |")
    return "\n".join(lines)


def _span_days(days: list[str]) -> str:
    return "–" if not days else days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}"


def _cell(value: float | None, goal: float) -> str:
    """A target table's cell: the ratio, bold where it misses ``goal``; ``–``: not measured."""
    if value is None:
        return "–"
    return _ratio(value, goal) if value <= goal else f"**{_ratio(value, goal)}**"


def _met_by(values: dict[str, float | None], target: float) -> str:
    """Which of the measured losses meet ``target``: ``all N``, ``none``, or ``K of N (missed: ...)``."""
    measured = {k: v for k, v in values.items() if v is not None}
    missed = [k for k, v in measured.items() if v > target]
    if not missed:
        return f"all {len(measured)}"
    if len(missed) == len(measured):
        return "none"
    return f"{len(measured) - len(missed)} of {len(measured)} (missed: {', '.join(missed)})"


def targets(rec: Records) -> str:
    """The targets of ``scale.json``'s ``_meta.targets``, per loss and batch, on the tiny model and on MiniLM, with
    whether each loss met it (bold: missed). CachedMNRL is the reference of the ratios to CachedMNRL (1.00×); its own
    value is shown where the target is not a ratio to it."""
    goals = rec.scale["_meta"]["targets"]
    step_goal, peak_goal = goals["cached_step_vs_cached_mnrl_from_1024"], goals["cached_peak_vs_cached_mnrl"]
    growth_goal, ddp_goal = goals["cached_peak_largest_vs_64"], goals["two_processes_vs_one"]
    labels = list(dict.fromkeys([*rec.losses(rec.scale), *rec.losses(rec.minilm)]))
    names = {**loss_names(rec.minilm), **loss_names(rec.scale)}
    header = ["target", "model, batch", *(names[m] for m in labels), REFERENCE, "met by"]
    lines = ["| " + " | ".join(header) + " |", "|---|---|" + "---:|" * (len(labels) + 1) + "---|"]
    grids = (("tiny", rec.scale), ("MiniLM", rec.minilm))

    def row(target: str, where: str, values: dict[str, float | None], goal: float, reference: str) -> None:
        cells = [_cell(values.get(m), goal) for m in labels]
        lines.append(f"| {target} | {where} | " + " | ".join(cells) + f" | {reference} | "
                     f"{_met_by({names[m]: v for m, v in values.items()}, goal)} |")

    def ratio(data: dict[str, Any], method: str, batch: int, key: str) -> float | None:
        ours, ref = rec.run(data, method, batch), rec.run(data, REFERENCE, batch)
        return ours[key] / ref[key] if ours and ref else None

    for model, data in grids:
        for batch in rec.batches(data):
            if batch >= TIME_FROM_BATCH and rec.run(data, REFERENCE, batch):
                row(f"cached step ≤ {step_goal}× CachedMNRL's (from batch {TIME_FROM_BATCH})", f"{model}, {batch:,}",
                    {m: ratio(data, m, batch, "step_ms") for m in rec.losses(data)}, step_goal, "1.00×")
    for model, data in grids:
        for batch in rec.batches(data):
            if rec.run(data, REFERENCE, batch):
                row(f"cached peak ≤ {peak_goal}× CachedMNRL's", f"{model}, {batch:,}",
                    {m: ratio(data, m, batch, "peak_mb") for m in rec.losses(data)}, peak_goal, "1.00×")

    def growth(data: dict[str, Any], method: str, low: int, high: int) -> float | None:
        a, b = rec.run(data, method, low), rec.run(data, method, high)
        return b["peak_mb"] / a["peak_mb"] if a and b else None

    for model, data in grids:
        batches = rec.batches(data)
        for high in batches[1:]:
            if high >= GROWTH_FIRST_SET or high == batches[-1]:
                row(f"cached peak ≤ {growth_goal}× batch {batches[0]}'s", f"{model}, {batches[0]} → {high:,}",
                    {m: growth(data, m, batches[0], high) for m in rec.losses(data)}, growth_goal,
                    _cell(growth(data, REFERENCE, batches[0], high), growth_goal))
    ddp_batches = sorted({r["batch_size"] for r in rec.scale["runs"].values() if r.get("processes", 1) == 2})

    def ddp(method: str, batch: int) -> float | None:
        one, two = rec.run(rec.scale, method, batch), rec.run(rec.scale, method, batch, 2)
        return two["step_ms"] / one["step_ms"] if one and two else None

    for batch in ddp_batches:
        row(f"2 processes ≤ {ddp_goal}× 1 process", f"tiny, global {batch:,}",
            {m: ddp(m, batch) for m in rec.losses(rec.scale)}, ddp_goal, _cell(ddp(REFERENCE, batch), ddp_goal))
    return "\n".join(lines)


def two_way(rec: Records) -> str:
    """MixCSE's two-way form against the like-for-like reference (CachedMNRL with both directions), at the largest
    CPU batch and interleaved at ``scale_paired.md``'s batch; and how much of CachedMNRL's largest step is linear in
    the batch."""
    data = rec.scale
    batch = max(b for b in rec.batches(data) if rec.run(data, REFERENCE_TWO_WAY, b))
    one, both, ours = (rec.need(data, m, batch) for m in (REFERENCE, REFERENCE_TWO_WAY, "mixcse"))
    measured = [b for b in rec.batches(data) if rec.run(data, REFERENCE, b)]
    low, high = measured[-2], measured[-1]
    t_low, t_high = (rec.need(data, REFERENCE, b)["step_ms"] / 1000 for b in (low, high))
    # t(N) = a N + b N²: two equations, two unknowns
    k = high / low
    quadratic = (t_high - k * t_low) / (k * k - k)  # b · low²
    linear_high = (t_low - quadratic) * k  # a · high
    paired = rec.paired()
    name = benchmark_loss({"method": "mixcse"})
    return (f"At batch {batch:,}: `{REFERENCE_TWO_WAY}` (both directions, `per_direction`) takes "
            f"{both['step_ms'] / 1000:.1f} s a step, {_x(both['step_ms'] / one['step_ms'])} CachedMNRL's "
            f"{one['step_ms'] / 1000:.1f} s, at a {_mb(both['peak_mb'])} peak; `{name}` takes "
            f"{ours['step_ms'] / 1000:.1f} s, {_x(ours['step_ms'] / both['step_ms'])} that reference's step at "
            f"{_x(ours['peak_mb'] / both['peak_mb'])} its peak. A linear-plus-quadratic fit of CachedMNRL's steps at "
            f"{low:,} and {high:,} puts {linear_high:.0f} s of its {t_high:.0f} s step at {high:,} in the linear term. "
            f"Interleaved at batch {rec.paired_batch():,} (`scale_paired.md`): `{name}` "
            f"{paired[name]['/ cached_mnrl (two-way)']} the two-way reference's step, "
            f"{paired[name]['/ cached_mnrl']} CachedMNRL's.")


def peaks(rec: Records) -> str:
    """The cached peaks in MB at the CPU grid's two largest batches, beside CachedMNRL's; the MiniLM peaks."""
    data, names = rec.scale, loss_names(rec.scale)
    parts = []
    for batch in rec.batches(data)[-2:]:
        ref = rec.need(data, REFERENCE, batch)
        cells = []
        for m in rec.losses(data):
            run = rec.run(data, m, batch)
            if run:
                ratio = _ratio(run["peak_mb"] / ref["peak_mb"], rec.scale["_meta"]["targets"]["cached_peak_vs_cached_mnrl"])
                cells.append(f"{names[m]} {_mb(run['peak_mb'])} ({ratio}, "
                             f"{run['peak_mb'] - ref['peak_mb']:+.1f} MB)")
        parts.append(f"at {batch:,}, against CachedMNRL's {_mb(ref['peak_mb'])}: " + "; ".join(cells))
    mini, mini_names = rec.minilm, loss_names(rec.minilm)
    refs = [rec.run(mini, REFERENCE, b) for b in rec.batches(mini)]
    others = [m for m in rec.losses(mini) if m not in NO_POSITIVE_GRADIENT]
    gaps = [abs(rec.need(mini, m, b)["peak_mb"] - rec.need(mini, REFERENCE, b)["peak_mb"])
            for m in others for b in rec.batches(mini) if rec.run(mini, m, b)]
    apart = [mini_names[m] for m in rec.losses(mini) if m in NO_POSITIVE_GRADIENT]
    apart_mb = [rec.need(mini, m, b)["peak_mb"] for m in rec.losses(mini) if m in NO_POSITIVE_GRADIENT
                for b in rec.batches(mini) if rec.run(mini, m, b)]
    minilm = (f"On MiniLM (batches {', '.join(f'{b:,}' for b in rec.batches(mini))}) every loss but "
              f"{', '.join(apart)} peaks within {max(gaps):.1f} MB of CachedMNRL's "
              f"{_span([r['peak_mb'] for r in refs if r], _f(1))} MB"
              + (f"; {', '.join(apart)}: {_span(apart_mb, _f(1))} MB" if apart else "") + ".")
    return "Cached peaks on the tiny model " + "; ".join(parts) + ". " + minilm


def tensors(rec: Records) -> str:
    """``scale_tensors.md``: the tensors each loss holds at its peak, in N × d matrices."""
    shape, held = rec.tensors_shape(), rec.tensors()
    return (f"At N {shape['N']:,}, d {shape['d']} and c {shape['c']} (`scale_tensors.md`), in N × d float32 matrices: "
            + ", ".join(f"{name} {value:.1f}" for name, value in held.items()) + ".")


def growth(rec: Records) -> str:
    """CachedMNRL's cached peak from batch 64 up, the 1.3× budget against what its loss side holds, ours' growth, and
    what one B × B float32 matrix would weigh at the largest batch."""
    data, goal = rec.scale, rec.scale["_meta"]["targets"]["cached_peak_largest_vs_64"]
    batches = rec.batches(data)
    low, mid, high = batches[0], max(b for b in batches if b <= rec.tensors_shape()["N"]), batches[-1]
    ref = {b: rec.need(data, REFERENCE, b)["peak_mb"] for b in (low, mid, high)}
    shape, held = rec.tensors_shape(), rec.tensors()
    unit_mb = shape["N"] * shape["d"] * 4 / 2**20  # one N × d float32 matrix
    budget = (goal - 1) * ref[low]
    fill = budget / (held[REFERENCE] * shape["d"] * 4 / 2**20)  # rows at which CachedMNRL's matrices fill it
    ours = [rec.need(data, m, mid)["peak_mb"] / rec.need(data, m, low)["peak_mb"]
            for m in rec.losses(data) if rec.run(data, m, mid) and rec.run(data, m, low)]
    mini = rec.minilm
    mb = rec.batches(mini)
    mini_growth = {m: rec.need(mini, m, mb[-1])["peak_mb"] / rec.need(mini, m, mb[0])["peak_mb"]
                   for m in (*rec.losses(mini), REFERENCE)}
    return (f"CachedMNRL's cached peak: {_mb(ref[low])} at batch {low}, {_mb(ref[mid])} at {mid:,} "
            f"({_x(ref[mid] / ref[low])}), {_mb(ref[high])} at {high:,} ({_x(ref[high] / ref[low])}). Its loss side "
            f"holds {held[REFERENCE]:.1f} N × d matrices at N {shape['N']:,} (`scale_tensors.md`), "
            f"{held[REFERENCE] * unit_mb:.1f} MB at d {shape['d']}, against a measured growth of "
            f"{_mb(ref[mid] - ref[low])} from {low} to {mid:,}. The {goal}× budget is {goal - 1:.1f} × "
            f"{ref[low]:.1f} = {_mb(budget)}: CachedMNRL's {held[REFERENCE]:.1f} such matrices fill it at "
            f"N ≈ {round(fill, -2):,.0f}. st-hardneg's losses grow {_span(ours, _f(2), '×')} from {low} to {mid:,}; on MiniLM from "
            f"{mb[0]} to {mb[-1]:,} every loss grows {_span([v for m, v in mini_growth.items() if m != REFERENCE], _f(2), '×')} "
            f"(CachedMNRL {_x(mini_growth[REFERENCE])}). One B × B float32 matrix at {high:,} would be "
            f"{4 * high * high / 1e9:.1f} GB.")


def ddp_rounds(rec: Records) -> str:
    """The 2-process runs' per-round ratios: their spread, CachedMNRL's, and the round with the highest ratio."""
    data = rec.scale
    per_round: dict[str, list[float]] = {}
    for r in data["runs"].values():
        if r.get("processes", 1) == 2 and r.get("status") == "ok":
            one = rec.run(data, r["method"], r["batch_size"])
            if one and len(one.get("step_ms_rounds") or []) > 1 and len(r.get("step_ms_rounds") or []) > 1:
                per_round[r["method"]] = [b / a for a, b in zip(one["step_ms_rounds"], r["step_ms_rounds"],
                                                                strict=False)]
    everything = [v for values in per_round.values() for v in values]
    slowest = Counter(values.index(max(values)) + 1 for values in per_round.values())
    (round_, count), = slowest.most_common(1)
    rounds = statistics.median(len(v) for v in per_round.values())
    which = (f"round {round_} has the highest ratio for every configuration" if count == len(per_round)
             else f"round {round_} has the highest ratio for {count} of {len(per_round)} configurations")
    return (f"Single rounds ({rounds:.0f} a configuration) range from {_x(min(everything))} to "
            f"{_x(max(everything))}, CachedMNRL's too ({_span(per_round[REFERENCE], _f(2), '×')}); {which}.")


def malloc(rec: Records) -> str:
    """The default-malloc resident mark against the peak with the mmap threshold fixed, at the two largest batches."""
    data = rec.scale
    parts = []
    for batch in rec.batches(data)[-2:]:
        ref = rec.need(data, REFERENCE, batch)
        ours = [r for r in (rec.run(data, m, batch) for m in rec.losses(data)) if r]
        parts.append(f"at {batch:,}, CachedMNRL {ref['default_malloc_peak_mb']:,.0f} MB "
                     f"({ref['peak_mb']:,.0f} MB with the threshold fixed), st-hardneg's losses "
                     f"{_span([r['default_malloc_peak_mb'] for r in ours], _f(0))} MB "
                     f"({_span([r['peak_mb'] for r in ours], _f(0))} MB)")
    return "The resident mark with glibc's defaults on the tiny model: " + "; ".join(parts) + "."


#: marker name → the renderer of its section, in the file's order
SECTIONS: dict[str, Callable[[Records], str]] = {
    "cpu-profile": cpu_profile,
    "gpu-profile-setup": gpu_profile_setup,
    "gpu-profile-loop": gpu_profile_loop,
    "gpu-profile-floor": gpu_profile_floor,
    "gpu-profile-losses": gpu_profile_losses,
    "gpu-calls": gpu_calls,
    "protocol": protocol,
    "targets": targets,
    "two-way": two_way,
    "peaks": peaks,
    "tensors": tensors,
    "growth": growth,
    "ddp-rounds": ddp_rounds,
    "malloc": malloc,
}


def markdown(results: Path = RESULTS) -> str:
    rec = Records(results)
    lines = ["# Scaling readings, from the records", "",
             "Generated by `python -m benchmarks.scale summary` from `scale.json`, `scale_minilm.json`, "
             "`scale_gpu.json`, `scale_profile_gpu.json`, `scale_profile_gpu_losses.json`, `scale_profile_cpu.json`, "
             "`scale_paired.md` and `scale_tensors.md` (nothing re-run); `docs/scaling.md` includes each section "
             "where it makes the claim. Ratios are taken within one run; rows carry today's loss names.", ""]
    for name, render in SECTIONS.items():
        lines += [f"<!-- {name} -->", render(rec), f"<!-- /{name} -->", ""]
    return "\n".join(lines)


def write(results: Path = RESULTS) -> Path:
    """Rewrite ``scale_findings.md`` in ``results`` from its records."""
    out = results / OUT_NAME
    out.write_text(markdown(results))
    return out
