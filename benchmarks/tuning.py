"""Screen hyperparameters and combinations on STS-B dev (never on a test set), with a small stated budget.

Why: after the CPU protocol no method beat mnrl by 1.5 points; the screen looks for settings that do before
concluding.

Budget and rule: one seed, one short run per configuration. Each configuration trains on exactly the CPU protocol
(``cpu_protocol.py``: same model, corpus, batches, lr 3e-5 with the *156-step* linear schedule) but stops after
``--stop-after`` steps (default 50, the protocol's first dev evaluation), and is scored by STS-B dev Spearman at
that step. A truncated run is the prefix of the full run (tested in tests/test_training.py), so its score is
identical to the full runs' dev score at step 50, read from their ``dev_curve`` in cpu_protocol.json
(tests/test_benchmarks.py checks that equality on a tiny model; ``--config mnrl=mnrl:`` re-runs it here as a
control). The STS test sets are not computed here.

    python -m benchmarks.tuning --seed 1                     # the screen below
    python -m benchmarks.tuning --seed 1 --config focal_m0.4=focal:m=0.4   # an extra configuration
    python -m benchmarks.tuning --report                     # only rewrite tuning.md
    python -m benchmarks.tuning --screen queue --seed 1      # the queue screen -> tuning_queue.json

Every configuration tried is kept in benchmarks/results/tuning.json, whether it helped or not.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from benchmarks import cpu_protocol  # the protocol's runner, reused as is

RESULTS = cpu_protocol.RESULTS
DEFAULT_OUT = RESULTS / "tuning.json"

#: the stated budget: label → (loss, hyperparameters, what it tests)
SCREEN: dict[str, tuple[str, dict[str, Any], str]] = {
    "focal_m0.5": ("focal", {"m": 0.5}, "Focal-InfoNCE: a larger hardness margin m"),
    "mixcse_lam0.4": ("mixcse", {"lam": 0.4}, "MixCSE: more of the negative in the mixed negative"),
    "mixcse+focal": ("mixcse", {"focal_m": 0.3}, "combination: focal modulation with MixCSE's mixed negatives"),
    "hncse_pm_thr0.3": ("hncse_pm", {"pm_threshold": 0.3}, "HNCSE PM mixes 2-8% of anchors at 0.1; mix more"),
    "hncse_hnm+focal": ("hncse_hnm", {"focal_m": 0.3}, "combination: focal modulation with HNM's synthetic negatives"),
    "hncse_both+focal": ("hncse", {"focal_m": 0.3, "pm_threshold": 0.3},
                         "combination: PM + HNM + focal modulation"),
    "adcse_m0.99": ("adcse", {"momentum": 0.99}, "AdCSE: a faster key encoder (EMA 0.99 instead of 0.995)"),
    "adcse_tied": ("adcse", {"untied": False},
                   "AdCSE below mnrl at seed 0: keys from the online encoder (SimCSE + adversaries) isolates the EMA"),
}

#: the queue screen (``--screen queue``, written to tuning_queue.json): mnrl (through the queued MNRL) and
#: the best loss (Focal-InfoNCE) with a queue of 1x, 2.5x and 8x the batch of 64, fed online (XBM) or by a momentum
#: key encoder (ESimCSE's 0.995); the first 8 steps (5 % of the 156) read no queue row
QUEUE_SCREEN: dict[str, tuple[str, dict[str, Any], str]] = {
    f"{loss}_queue{size}_{source}": (
        "mnrl_queue" if loss == "mnrl" else loss,
        {"queue_size": size, "queue_warmup_steps": 8, **({"queue_source": "ema"} if source == "ema" else {})},
        f"queue of {size} rows ({size / 64:g}x the batch), {source} source")
    for loss in ("mnrl", "focal") for size in (64, 160, 512) for source in ("online", "ema")
}
SCREENS = {"hyperparameters": (SCREEN, DEFAULT_OUT), "queue": (QUEUE_SCREEN, RESULTS / "tuning_queue.json")}

#: the default configuration each screened loss is compared with (its row in cpu_protocol.json)
DEFAULT_METHOD = {"mnrl": "mnrl", "mnrl_queue": "mnrl", "focal": "focal", "mixcse": "mixcse", "hncse_pm": "hncse_pm",
                  "hncse_hnm": "hncse_hnm", "adcse": "adcse"}


def dev_at(run: dict[str, Any], step: int) -> float | None:
    """A run's STS-B dev score at ``step`` (from its ``dev_curve``), or None."""
    for at, score in run.get("dev_curve") or []:
        if at == step:
            return score
    return None


def reference_scores(protocol_json: Path, seed: int, step: int) -> dict[str, float]:
    """Dev score at ``step`` of every full-protocol run at ``seed`` (method label → score)."""
    if not protocol_json.is_file():
        return {}
    runs = json.loads(protocol_json.read_text())["runs"]
    scores = {r["method"]: dev_at(r, step) for r in runs if r.get("seed") == seed}
    return {k: v for k, v in scores.items() if v is not None}


def markdown(data: dict[str, Any]) -> str:
    from st_hardneg.reporting import markdown_table

    refs = data.get("references", {})
    base = refs.get("mnrl")
    header = ["configuration", "loss", "changed", "dev@step", "Δ vs mnrl", "Δ vs own default", "what it tests"]
    intro = (f"Seed {data.get('seed')}, STS-B dev Spearman x 100 after {data.get('stop_after')} of 156 steps "
             "(full-run references at that step: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(refs.items())) + ").")
    body = []
    for run in sorted(data["runs"], key=lambda r: -(r["stsb_dev"] or 0)):
        score = run["stsb_dev"]
        own = refs.get(DEFAULT_METHOD.get(run["loss"], run["loss"]))
        cells = [run["label"], run["loss"], ", ".join(f"{k}={v}" for k, v in run["changed"].items()) or "–",
                 f"{score:.2f}", f"{score - base:+.2f}" if base is not None else "–",
                 f"{score - own:+.2f}" if own is not None else "–", run["why"]]
        body.append(cells)
    return intro + "\n\n" + markdown_table(header, body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--screen", default="hyperparameters", choices=tuple(SCREENS),
                        help="which screen: the hyperparameter screen (tuning.json) or the queue's (tuning_queue.json)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--stop-after", type=int, default=50)
    parser.add_argument("--only", nargs="*", default=None, help="a subset of the screen's labels")
    parser.add_argument("--config", action="append", default=[], metavar="LABEL=LOSS:k=v,...",
                        help="an extra configuration (recorded like the others)")
    parser.add_argument("--data-dir", default=str(cpu_protocol.REPO.parent / "shared" / "data"))
    parser.add_argument("--corpus", default=str(cpu_protocol.REPO.parent / "shared" / "data" / "corpus" / "wiki10k.txt"))
    parser.add_argument("--model", default=None, help="a local model instead of the embedded default (smoke tests)")
    parser.add_argument("--protocol-json", default=str(cpu_protocol.DEFAULT_OUT),
                        help="full-protocol results to read the reference dev scores from")
    parser.add_argument("--out", default=None, help="default: the screen's file (tuning.json / tuning_queue.json)")
    parser.add_argument("--work-dir", default="/tmp/st-hardneg-tuning")
    parser.add_argument("--limit", type=int, default=0, help="smoke runs only: first N sentences")
    parser.add_argument("--report", action="store_true", help="only rewrite the markdown table")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.stop_after < 1:
        parser.error("--stop-after must be >= 1")

    screen, default_out = SCREENS[args.screen]
    out = Path(args.out) if args.out else default_out
    data = json.loads(out.read_text()) if out.is_file() else {"runs": []}
    if not args.report:
        from benchmarks.harness import parse_variant

        if data["runs"] and (data.get("seed"), data.get("stop_after")) != (args.seed, args.stop_after):
            parser.error(f"{out} holds a screen at seed {data.get('seed')}, {data.get('stop_after')} steps; "
                         "use another --out to screen at another seed or step")
        unknown = set(args.only or []) - set(screen)
        if unknown:
            parser.error(f"unknown configuration(s) {sorted(unknown)}; the screen has {', '.join(screen)}")
        jobs = [(label, *screen[label]) for label in (args.only if args.only is not None else screen)]
        for spec in args.config:
            label, loss, kwargs = parse_variant(spec)
            jobs.append((label, loss, kwargs, "extra configuration"))
        data.update(seed=args.seed, stop_after=args.stop_after,
                    protocol=dict(cpu_protocol.PROTOCOL, selection=f"STS-B dev at step {args.stop_after}"))
        run_args = argparse.Namespace(corpus=args.corpus, limit=args.limit, work_dir=args.work_dir,
                                      data_dir=args.data_dir, eval_steps=args.stop_after, max_steps=-1,
                                      stop_after=args.stop_after, dev_only=True, model=args.model, quiet=args.quiet)
        for label, loss, kwargs, why in jobs:
            if any(r["label"] == label for r in data["runs"]):
                print(f"skip {label}: already in {out}")
                continue
            print(f"=== {label} ({loss} {kwargs})", flush=True)
            run = cpu_protocol.run_one(label, loss, kwargs, args.seed, run_args)
            data["runs"].append({"label": label, "loss": loss, "changed": kwargs, "why": why,
                                 "stsb_dev": dev_at(run, args.stop_after), "dev_curve": run["dev_curve"],
                                 "loss_config": run["loss_config"], "train_seconds": run["train_seconds"],
                                 "median_step_seconds": run["median_step_seconds"], "steps": run["steps"]})
            data["references"] = reference_scores(Path(args.protocol_json), args.seed, args.stop_after)
            _write(data, out)
    data["references"] = reference_scores(Path(args.protocol_json), data.get("seed", args.seed),
                                          data.get("stop_after", args.stop_after)) or data.get("references", {})
    _write(data, out)
    if data["runs"]:
        print(markdown(data))
    return 0


def _write(data: dict[str, Any], out: Path) -> None:
    from st_hardneg.reporting import write_json

    write_json(out, data)
    if data["runs"]:
        out.with_suffix(".md").write_text(markdown(data))


if __name__ == "__main__":
    sys.exit(main())
