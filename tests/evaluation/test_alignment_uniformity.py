"""Alignment / uniformity, the Trainer diagnostics callback, and the plot helpers."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from datasets import Dataset
from sentence_transformers import SentenceTransformerTrainer
from sentence_transformers import SentenceTransformerTrainingArguments as Args
from transformers import TrainerCallback

from st_hardneg import MixCSELoss
from st_hardneg.data import read_sts_pairs
from st_hardneg.evaluation import (
    alignment,
    alignment_uniformity,
    format_alignment_table,
    uniformity,
)
from st_hardneg.plots import plot_alignment_uniformity, plot_training_curves
from st_hardneg.training.callbacks import LossDiagnosticsCallback

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class TableEncoder:
    """A SentenceTransformer stand-in returning fixed vectors per sentence."""

    def __init__(self, table: dict[str, list[float]]):
        self.table = table
        self.calls: list[list[str]] = []

    def encode(self, sentences, **kwargs):
        self.calls.append(list(sentences))
        return np.array([self.table[s] for s in sentences], dtype=np.float32)


# ----------------------------------------------------------------------------------------------- alignment / uniformity
def test_alignment_and_uniformity_match_a_hand_computation():
    x = np.array([[3.0, 0.0], [0.0, 2.0], [-1.0, 0.0]])  # unit vectors after normalisation: e1, e2, -e1
    y = np.array([[1.0, 1.0], [0.0, 5.0], [-2.0, 0.0]])
    # squared distances of the normalised pairs: |e1 - (1,1)/√2|² = 2 - √2, 0, 0
    assert alignment(x, y) == pytest.approx((2 - math.sqrt(2)) / 3)
    assert alignment(x, y, alpha=1) == pytest.approx(math.sqrt(2 - math.sqrt(2)) / 3)
    # pairs of {e1, e2, -e1}: d² = 2, 4, 2 -> log(mean(exp(-2 d²)))
    assert uniformity(x) == pytest.approx(math.log((2 * math.exp(-4) + math.exp(-8)) / 3))
    assert uniformity(x, t=1) == pytest.approx(math.log((2 * math.exp(-2) + math.exp(-4)) / 3))
    rng = np.random.default_rng(0)  # blocks (2048 rows) agree with the plain double loop
    z = rng.normal(size=(2100, 3))
    zn = z / np.linalg.norm(z, axis=1, keepdims=True)
    d2 = ((zn[:, None, :] - zn[None, :, :]) ** 2).sum(-1)[np.triu_indices(len(z), 1)]
    assert uniformity(z) == pytest.approx(math.log(np.exp(-2 * d2).mean()), rel=1e-9)
    with pytest.raises(ValueError):
        uniformity(x[:1])
    with pytest.raises(ValueError):
        alignment(x, y[:2])


def write_stsb(root: Path, rows, split: str) -> Path:
    folder = root / "STS" / "STSBenchmark"
    folder.mkdir(parents=True, exist_ok=True)
    lines = [f"g\tf\ty\t{i}\t{score}\t{a}\t{b}" for i, (score, a, b) in enumerate(rows)]
    (folder / f"sts-{split}.csv").write_text("\n".join(lines) + "\n")
    return root


def test_alignment_uniformity_on_stsb_against_a_hand_computation(tmp_path):
    rows = [(5.0, "a", "b"), (4.0, "c", "d"), (3.9, "a", "e"), (0.0, "b", "c")]  # 4.0 counts, 3.9 does not
    table = {"a": [1, 0], "b": [1, 1], "c": [0, 2], "d": [0, -1], "e": [-1, 0]}
    write_stsb(tmp_path, rows, "dev")
    write_stsb(tmp_path, [(4.5, "a", "e"), (1.0, "b", "d")], "test")
    encoder = TableEncoder(table)
    out = alignment_uniformity(encoder, tmp_path)
    unit = {k: np.array(v) / np.linalg.norm(v) for k, v in table.items()}
    expected_align = (np.sum((unit["a"] - unit["b"]) ** 2) + np.sum((unit["c"] - unit["d"]) ** 2)) / 2
    pairs = list(itertools.combinations("abcde", 2))  # distinct sentences only: a, b, c each appear twice
    expected_uniform = math.log(np.mean([math.exp(-2 * np.sum((unit[p] - unit[q]) ** 2)) for p, q in pairs]))
    assert out["alignment"] == pytest.approx(expected_align)
    assert out["uniformity"] == pytest.approx(expected_uniform)
    assert (out["n_pairs"], out["n_sentences"], out["split"]) == (2, 5, "dev")
    assert len(encoder.calls) == 1 and sorted(encoder.calls[0]) == list("abcde")  # each sentence encoded once
    test = alignment_uniformity(TableEncoder(table), tmp_path, split="test")
    assert test["n_pairs"] == 1 and test["alignment"] == pytest.approx(np.sum((unit["a"] - unit["e"]) ** 2))
    table = format_alignment_table({"m": out})
    assert table.splitlines()[2] == f"| m | {out['alignment']:.4f} | {out['uniformity']:.4f} | dev | 2 | 5 |"
    with pytest.raises(ValueError, match="split"):
        alignment_uniformity(encoder, tmp_path, split="train")
    with pytest.raises(ValueError, match=">= 6"):
        alignment_uniformity(encoder, tmp_path, threshold=6)


def test_alignment_uniformity_reads_the_real_stsb_dev(shared_data, tiny_model):
    out = alignment_uniformity(tiny_model, shared_data)
    _, _, gold = read_sts_pairs(shared_data / "senteval", "STSBenchmark-dev")
    assert out["n_pairs"] == sum(g >= 4 for g in gold) > 0
    assert 0 <= out["alignment"] <= 4 and -4 <= out["uniformity"] <= 0


# ----------------------------------------------------------------------------------------------- callback
class Recorder(TrainerCallback):
    def __init__(self):
        self.logs = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs or {}))


def train(model_dir, sentences, tmp_path, with_callback: bool):
    from st_hardneg.models import load_model

    model = load_model(model_dir, pooling="cls", max_seq_length=32, device="cpu")
    loss = MixCSELoss(model, lam=0.2)
    args = Args(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=4, learning_rate=1e-3, dataloader_pin_memory=False,
                logging_steps=2, report_to=[], save_strategy="no", seed=0, data_seed=0)
    dataset = Dataset.from_dict({"anchor": sentences, "positive": sentences})
    recorder = Recorder()
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=dataset, loss=loss,
                                         callbacks=[recorder])
    if with_callback:
        LossDiagnosticsCallback(loss).attach(trainer)
    trainer.train()
    return trainer, recorder, loss


def test_callback_logs_diagnostics_and_leaves_the_loss_unchanged(tiny_model_dir, tiny_sentences, tmp_path):
    plain, _, _ = train(tiny_model_dir, tiny_sentences, tmp_path / "a", with_callback=False)
    logged, recorder, loss = train(tiny_model_dir, tiny_sentences, tmp_path / "b", with_callback=True)
    train_logs = [h for h in logged.state.log_history if "loss" in h]
    assert [h["step"] for h in train_logs] == [2, 4]
    assert [h["loss"] for h in train_logs] == [h["loss"] for h in plain.state.log_history if "loss" in h]
    for entry in train_logs:
        assert {"cos_positive", "cos_negative", "cos_synthetic"} <= set(entry)
        assert all(-1 <= entry[k] <= 1 for k in ("cos_positive", "cos_negative", "cos_synthetic"))
    assert train_logs[-1]["cos_positive"] == pytest.approx(loss.diagnostics["positive"], abs=1e-6)
    summary = logged.state.log_history[-1]  # end-of-training summary: left alone
    assert "train_loss" in summary and "cos_positive" not in summary
    assert not any(k.startswith("cos_") for h in plain.state.log_history for k in h)
    # callbacks after it (progress printer, TensorBoard, W&B ...) receive the entries too
    assert all("cos_negative" in logs for logs in recorder.logs if "loss" in logs)


def test_callback_prefixes_dict_losses_and_rejects_other_losses(tiny_model):
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    a, b = MixCSELoss(tiny_model), MixCSELoss(tiny_model)
    a._last_stats = {"positive": np.float32(0.5)}
    callback = LossDiagnosticsCallback({"wiki": a, "nli": b})
    assert callback.current() == {"wiki_cos_positive": 0.5}
    # the masked false-negative counts are counts, not cosines: no cosine prefix
    b._last_stats = {"negative": np.float32(0.25), "masked_false_negatives_total": np.float32(3.0)}
    assert callback.current() == {"wiki_cos_positive": 0.5, "nli_cos_negative": 0.25,
                                  "nli_masked_false_negatives_total": 3.0}
    assert LossDiagnosticsCallback(b).current() == {"cos_negative": 0.25, "masked_false_negatives_total": 3.0}
    with pytest.raises(TypeError, match="diagnostics"):
        LossDiagnosticsCallback(MultipleNegativesRankingLoss(tiny_model))


# ----------------------------------------------------------------------------------------------- plots
def test_alignment_uniformity_scatter_is_written(tmp_path):
    points = {
        "BERT (CLS)": {"alignment": 0.15, "uniformity": -1.2, "sts_avg": 31.4},
        "SimCSE": {"alignment": 0.24, "uniformity": -2.4, "sts_avg": 76.3},
        "MixCSE": {"alignment": 0.23, "uniformity": -2.6, "sts_avg": 77.9},
        "no score": {"alignment": 0.30, "uniformity": -2.0},
    }
    import matplotlib.pyplot as plt

    open_figures = plt.get_fignums()
    path = plot_alignment_uniformity(points, tmp_path / "figs" / "au.png")
    assert plt.get_fignums() == open_figures  # drawn on an Agg canvas, never through pyplot
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 20_000
    with pytest.raises(ValueError, match="lacks"):
        plot_alignment_uniformity({"x": {"alignment": 1.0}}, tmp_path / "bad.png")
    with pytest.raises(ValueError, match="PNG"):
        plot_alignment_uniformity(points, tmp_path / "au.pdf")


def test_training_curves_are_written(tmp_path):
    def history(offset):
        logs = [{"loss": 2.0 - 0.1 * s + offset, "cos_negative": 0.6 - 0.02 * s, "learning_rate": 1e-3,
                 "epoch": s / 10, "step": s} for s in range(1, 11)]
        evals = [{"eval_sts-dev_spearman": 0.6 + 0.02 * s + offset, "step": s} for s in range(2, 11, 2)]
        return logs + evals + [{"train_loss": 1.5, "train_runtime": 3.0, "step": 10}]

    path = plot_training_curves({"SimCSE": history(0.0), "MixCSE": history(0.05)}, tmp_path / "curves.png",
                                metrics=["eval_sts-dev_spearman", "loss", "cos_negative"], title="runs")
    assert path.read_bytes().startswith(PNG_MAGIC) and path.stat().st_size > 20_000
    single = plot_training_curves(history(0.0), tmp_path / "single.png")  # default: every metric
    assert single.stat().st_size > 20_000
    with pytest.raises(ValueError, match="not in the history"):
        plot_training_curves(history(0.0), tmp_path / "x.png", metrics=["eval_nope"])
    with pytest.raises(ValueError, match="no metric"):
        plot_training_curves([{"loss": 1.0}], tmp_path / "y.png")


def test_seed_bars_show_mean_std_and_every_seed(tmp_path, monkeypatch):
    from st_hardneg import plots

    drawn = {}
    real_save = plots._save

    def keep(fig, path, dpi):
        drawn["fig"] = fig
        return real_save(fig, path, dpi)

    monkeypatch.setattr(plots, "_save", keep)
    from benchmarks import harness  # the benchmarks' plot, drawn on the library's canvas

    per_seed = {"mnrl": [70.0, 72.0, 74.0], "mixcse": [75.5], "focal": [71.0, 73.0]}
    path = harness.plot_seed_bars(per_seed, tmp_path / "bars.png", ylabel="avg", title="t", grey=("mnrl",),
                                reference=("untrained", 60.0))
    assert path.read_bytes().startswith(PNG_MAGIC)
    ax = drawn["fig"].axes[0]
    bars = ax.patches
    assert [b.get_height() for b in bars] == pytest.approx([72.0, 75.5, 72.0])  # means by hand
    # sample std by hand: mnrl sqrt(((−2)² + 0 + 2²) / 2) = 2; one seed: 0; focal sqrt((1 + 1) / 1) = sqrt(2)
    from matplotlib.collections import PathCollection
    from matplotlib.container import ErrorbarContainer

    errorbars = next(c for c in ax.containers if isinstance(c, ErrorbarContainer))
    segments = errorbars.lines[2][0].get_segments()  # one vertical segment (mean - std, mean + std) per bar
    assert [seg[1][1] - seg[0][1] for seg in segments] == pytest.approx([4.0, 0.0, 2 * 2 ** 0.5])
    assert bars[0].get_facecolor() != bars[1].get_facecolor()  # the baseline is grey
    dots = sorted(float(y) for coll in ax.collections if isinstance(coll, PathCollection)
                  for _, y in coll.get_offsets())
    assert dots == sorted(v for scores in per_seed.values() for v in scores)
    assert [t.get_text() for t in ax.texts] == ["72.00", "75.50", "72.00"]
    assert any(line.get_ydata()[0] == 60.0 for line in ax.lines)  # the reference line
    # the axis is fitted to the scores (from 60 - 0.3 x 15.5 here) and its label says it does not start at 0
    assert ax.get_ylim()[0] == pytest.approx(60.0 - 0.3 * 15.5) and harness.NOT_FROM_ZERO in ax.get_ylabel()
    harness.plot_seed_bars({"a": [0.1, 0.5]}, tmp_path / "low.png", ylabel="avg", title="t")
    ax = drawn["fig"].axes[0]
    assert ax.get_ylim()[0] < 0 and ax.get_ylabel() == "avg"  # it holds 0: no note
    with pytest.raises(ValueError, match="no method"):
        harness.plot_seed_bars({}, tmp_path / "x.png", ylabel="y", title="t")
    with pytest.raises(ValueError, match=r"\['b'\] have no scores"):
        harness.plot_seed_bars({"a": [1.0], "b": []}, tmp_path / "x.png", ylabel="y", title="t")
    with pytest.raises(ValueError, match="PNG"):
        harness.plot_seed_bars(per_seed, tmp_path / "x.svg", ylabel="y", title="t")


@pytest.mark.parametrize("row_offset", [0, 3, 5])
def test_contrastive_stats_match_a_loop_over_the_entries(row_offset):
    """Positive, in-batch negative and synthetic means equal a plain loop over the (chunk of) rows."""
    import torch

    from st_hardneg.functional import contrastive_stats

    torch.manual_seed(0)
    n, num_in_batch, extra, synthetic = 4, 9, 2, 3
    cos = torch.rand(n, num_in_batch + extra + synthetic) * 2 - 1
    stats = contrastive_stats(cos, num_in_batch, synthetic, row_offset=row_offset)
    positives, negatives, synthetics = [], [], []
    for r in range(n):
        for c in range(cos.size(1)):
            value = float(cos[r, c])
            if c == r + row_offset:
                positives.append(value)
            elif c < num_in_batch:
                negatives.append(value)
            elif c >= num_in_batch + extra:
                synthetics.append(value)
    assert float(stats["positive"]) == pytest.approx(sum(positives) / len(positives), abs=1e-6)
    assert float(stats["negative"]) == pytest.approx(sum(negatives) / len(negatives), abs=1e-6)
    assert float(stats["synthetic"]) == pytest.approx(sum(synthetics) / len(synthetics), abs=1e-6)
