"""Cached step time at one large batch, every loss next to CachedMNRL, with the steps interleaved.

``benchmarks.scale`` runs each configuration in its own process, one after the other. On a shared machine whose speed drifts
(here by up to 27 % between runs an hour apart), a ratio of two configurations run minutes apart carries that drift.
This script builds every loss on the same tiny model and batch in one process and times their steps round-robin
(A B C ... A B C ...), so that a drift hits all of them alike. Each ratio is the median of the steps after one
warm-up round. It also adds sentence-transformers' ``CachedMultipleNegativesRankingLoss`` with both directions
(``per_direction``), the like-for-like reference for MixCSE's benchmark form, which is two-way.

    python -m benchmarks.scale paired                      # batch 8192, 4 rounds -> results/scale_paired.md
    python -m benchmarks.scale paired --batch-size 512 --rounds 2 --out /tmp/p.md     # smoke
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.harness import RESULTS, WIKI10K
from benchmarks.methods import OURS, registry_loss

DEFAULT_OUT = RESULTS / "scale_paired.md"
DEFAULT_CORPUS = WIKI10K  # $ST_HARDNEG_SHARED_DATA or ../shared/data (benchmarks.harness)
LOSSES = OURS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale paired", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=8192)
    parser.add_argument("--mini-batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=4, help="rounds of steps, the first a warm-up")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args(argv)
    if args.rounds < 2 or args.batch_size < 2 or args.mini_batch_size < 1 or args.threads < 1:
        parser.error("--rounds must be >= 2, --batch-size >= 2, --mini-batch-size and --threads >= 1")
    if not Path(args.corpus).is_file():
        parser.error(f"corpus not found: {args.corpus}")

    import torch
    from sentence_transformers.sentence_transformer.losses import CachedMultipleNegativesRankingLoss
    from tqdm import tqdm

    from benchmarks.scale.worker import _load_model
    from st_hardneg.data import read_corpus
    from st_hardneg.reporting import markdown_table
    from st_hardneg.training.registry import build_loss

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        model = _load_model("tiny", 32, Path(tmp))
    model.train()
    sentences = read_corpus(args.corpus)
    features = model.preprocess((sentences * (args.batch_size // len(sentences) + 1))[: args.batch_size])
    mbs = args.mini_batch_size
    losses = {
        "cached_mnrl": CachedMultipleNegativesRankingLoss(model, scale=20.0, mini_batch_size=mbs),
        "cached_mnrl (two-way)": CachedMultipleNegativesRankingLoss(
            model, scale=20.0, mini_batch_size=mbs, directions=("query_to_doc", "doc_to_query"),
            partition_mode="per_direction"),
        **{name: build_loss(registry_loss(name), model, mini_batch_size=mbs) for name in LOSSES},
    }
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5)
    seconds: dict[str, list[float]] = {name: [] for name in losses}
    for _ in tqdm(range(args.rounds), desc="rounds"):
        for name, loss in losses.items():
            optimizer.zero_grad(set_to_none=True)
            start = time.perf_counter()
            loss([dict(features), dict(features)], None).backward()
            optimizer.step()
            seconds[name].append(time.perf_counter() - start)
    median = {name: statistics.median(values[1:]) for name, values in seconds.items()}
    one_way, two_way = median["cached_mnrl"], median["cached_mnrl (two-way)"]
    rows = [[name, f"{1000 * m:.0f}", f"{m / one_way:.2f}×", f"{m / two_way:.2f}×"] for name, m in median.items()]
    text = (f"Batch {args.batch_size}, `mini_batch_size={mbs}`, tiny random BERT (hidden 32), {args.threads} torch "
            f"thread(s), {args.rounds} rounds of round-robin steps (median of the {args.rounds - 1} after the "
            f"warm-up), torch {torch.__version__}. MixCSE is benchmarked in its two-way form "
            "(`st_hardneg.training.registry.MIXCSE_TWO_WAY`).\n\n"
            + markdown_table(["loss", "step (ms)", "/ cached_mnrl", "/ cached_mnrl (two-way)"], rows,
                             align=["l", "r", "r", "r"]))
    Path(args.out).write_text(text)
    print(text)
    return 0
