"""The benchmark scripts' quick modes: the GPU protocol's --dry-run and the overhead benchmark's smoke run."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.integration
def test_paper_protocol_dry_run(shared_data, tmp_path, capsys):
    from st_hardneg.training import LOSSES

    paper = _load("paper_protocol")
    out = tmp_path / "paper.json"
    code = paper.main(["--dry-run", "--quiet", "--data-dir", str(shared_data), "--work-dir", str(tmp_path / "work"),
                       "--out", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    assert data["protocol"]["dry_run"]["max_steps"] == 2
    assert [r["method"] for r in data["runs"]] == list(LOSSES)  # every method of the registry
    for run in data["runs"]:
        assert run["steps"] == 2 and run["stsb_dev_best"] is not None and run["mlp_head"] is True
        assert set(run["sts"]) == {"STSBenchmark", "avg"}
        assert set(run["transfer"]) >= {"TREC", "avg"}
    printed = capsys.readouterr().out
    assert "| Method | STS-B | Avg. |" in printed and "| Method | TREC | Avg. |" in printed
    assert out.with_suffix(".md").is_file()
    # --report re-prints the tables of an existing JSON without training
    assert paper.main(["--report", "--out", str(out)]) == 0


def test_paper_tables_use_the_papers_layout():
    paper = _load("paper_protocol")
    runs = [{"method": "mnrl", "seed": 0, "sts": {"STS12": 68.4, "STSBenchmark": 76.85, "SICKRelatedness": 72.2,
                                                  "avg": 72.48}, "transfer": None}]
    table = paper.paper_table(runs, "sts", paper.STS_COLUMNS)
    assert table.splitlines()[0] == "| Method | STS12 | STS-B | SICK-R | Avg. |"
    assert "| mnrl | 68.40 | 76.85 | 72.20 | 72.48 |" in table
    assert paper.paper_table(runs, "transfer", paper.TR_COLUMNS) == ""
    assert "no transfer results" in paper.report({"runs": runs})


def test_overhead_smoke(tiny_model_dir, shared_data, tmp_path):
    overhead = _load("overhead")
    out = tmp_path / "overhead.json"
    code = overhead.main(["--steps", "3", "--warmup", "1", "--loss-reps", "3", "--model", str(tiny_model_dir),
                          "--methods", "mixcse", "adcse", "--corpus", str(shared_data / "corpus" / "wiki10k.txt"),
                          "--out", str(out), "--quiet"])
    assert code == 0
    results = json.loads(out.read_text())
    assert set(results) == {"mnrl", "mixcse", "adcse", "_meta"}
    assert results["mnrl"]["step_ratio_vs_mnrl"] == 1.0
    for name in ("mnrl", "mixcse", "adcse"):
        row = results[name]
        assert row["step_ms"] > 0 and row["loss_only_ms"] > 0 and row["steps_measured"] == 3
    assert results["adcse"]["target"] == 1.45 and isinstance(results["adcse"]["meets_target"], bool)
    assert results["_meta"]["smoke"] is True and results["_meta"]["embedding_dim"] == 32
    assert "| adcse |" in out.with_suffix(".md").read_text()


@pytest.mark.parametrize("alpha", [0.5, 0.3, "adaptive"])
@pytest.mark.parametrize("hnm_gradient", [True, False])
def test_hncse_fast_synthetic_cosines_match_the_mixtures(alpha, hnm_gradient):
    """The overhead fix: HNCSE's loss scores its synthetic negatives from the cosine and Gram matrices
    (functional.mixed_negative_cosines) instead of building the (N, m, d) mixtures; values and gradients must equal
    those of the explicit mixtures (functional.hard_negative_mixing) with the same random draws."""
    import torch

    from st_hardneg import HNCSELoss
    from st_hardneg import functional as fn
    from st_hardneg.testing.fixtures import hncse_synthetic_cosines, hncse_synthetic_negatives

    torch.manual_seed(0)
    h = torch.randn(64, 48, dtype=torch.float32)
    hp = (h + 0.3 * torch.randn(64, 48)).requires_grad_(True)
    h.requires_grad_(True)
    loss = HNCSELoss(None, mode="hnm", alpha=alpha, hnm_gradient=hnm_gradient, seed=7)
    fast = hncse_synthetic_cosines(loss, h, hp)
    (fast * torch.linspace(-1, 1, fast.numel()).view_as(fast)).sum().backward()
    def grads():
        return [torch.zeros_like(t) if t.grad is None else t.grad.clone() for t in (h, hp)]

    fast_grads = grads()
    h.grad = hp.grad = None
    reference = HNCSELoss(None, mode="hnm", alpha=alpha, hnm_gradient=hnm_gradient, seed=7)
    explicit = torch.einsum("nd,nsd->ns", fn.normalize(h), hncse_synthetic_negatives(reference, h, hp))
    (explicit * torch.linspace(-1, 1, explicit.numel()).view_as(explicit)).sum().backward()
    torch.testing.assert_close(fast, explicit, rtol=1e-5, atol=1e-5)
    explicit_grads = grads()
    torch.testing.assert_close(fast_grads[0], explicit_grads[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(fast_grads[1], explicit_grads[1], rtol=1e-4, atol=1e-5)
    assert fast_grads[1].abs().sum() > 0 if hnm_gradient else fast_grads[1].abs().sum() == 0
    # a zero vector in the pool: its mixtures keep a finite cosine and gradient, as with F.normalize
    zero = hp.detach().clone()
    zero[3] = 0
    zero.requires_grad_(True)
    out = fn.mixed_negative_cosines(h.detach(), zero, torch.tensor([[3, 3]]), torch.tensor([[3, 5]]), alpha=0.5)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(zero.grad).all() and out[0, 0] == 0


@pytest.mark.integration
def test_cpu_protocol_and_tuning_smoke(tiny_model_dir, shared_data, tmp_path):
    """The CPU protocol's runner on a tiny model (3 steps), then the tuning screen reading its dev curve: a truncated
    run of the same seed stops at the asked step and reproduces the full run's dev score there exactly (both
    evaluate first at that step, as in the real screen)."""
    cpu = _load("cpu_protocol")
    common = ["--model", str(tiny_model_dir), "--data-dir", str(shared_data), "--limit", "192", "--quiet"]
    out = tmp_path / "cpu.json"
    assert cpu.main(["--methods", "mnrl", "mixcse", "--seeds", "0", "--eval-steps", "2", "--out", str(out),
                     "--work-dir", str(tmp_path / "w1"), *common]) == 0
    data = json.loads(out.read_text())
    assert [r["method"] for r in data["runs"]] == ["untrained", "mnrl", "mixcse"]
    for run in data["runs"][1:]:
        assert run["steps"] == 3 and [s for s, _ in run["dev_curve"]] == [2, 3]  # every 2 steps and at the end
        assert run["stsb_dev_best"] == max(v for _, v in run["dev_curve"])
        assert set(run["sts"]) == {*cpu.TASKS, "avg"}
    assert "| mixcse | 0 |" in out.with_suffix(".md").read_text() and out.with_suffix(".png").is_file()
    # resuming skips the finished runs
    assert cpu.main(["--methods", "mnrl", "--seeds", "0", "--out", str(out), *common]) == 0
    assert len(json.loads(out.read_text())["runs"]) == 3

    tuning = _load("tuning")
    tout = tmp_path / "tuning.json"
    assert tuning.main(["--seed", "0", "--stop-after", "2", "--only", "--config", "mnrl=mnrl:", "--config", "mix_lam0.5=mixcse:lam=0.5",
                        "--protocol-json", str(out), "--out", str(tout), "--work-dir", str(tmp_path / "w2"),
                        *common]) == 0
    screen = json.loads(tout.read_text())
    assert [r["label"] for r in screen["runs"]] == ["mnrl", "mix_lam0.5"]
    control = screen["runs"][0]
    assert control["steps"] == 2 and [s for s, _ in control["dev_curve"]] == [2]
    assert control["stsb_dev"] == screen["references"]["mnrl"] == data["runs"][1]["dev_curve"][0][1]
    assert screen["runs"][1]["loss_config"]["lam"] == 0.5
    table = tout.with_suffix(".md").read_text()
    assert "| mix_lam0.5 | mixcse | lam=0.5 |" in table and "+0.00" in table  # the control's Δ vs mnrl
    with pytest.raises(SystemExit):
        tuning.main(["--only", "no_such_config", "--out", str(tmp_path / "x.json"), *common])
    with pytest.raises(SystemExit):  # a different seed would mix two screens in one file
        tuning.main(["--seed", "1", "--only", "--config", "mnrl=mnrl:", "--out", str(tout), *common])
    # the queue screen: its own labels (12: mnrl / focal x 3 sizes x 2 sources) and its own file
    assert len(tuning.QUEUE_SCREEN) == 12 and tuning.SCREENS["queue"][1].name == "tuning_queue.json"
    qout = tmp_path / "tuning_queue.json"
    assert tuning.main(["--screen", "queue", "--seed", "0", "--stop-after", "2", "--only", "mnrl_queue64_ema",
                        "--protocol-json", str(out), "--out", str(qout), "--work-dir", str(tmp_path / "w3"),
                        *common]) == 0
    run = json.loads(qout.read_text())["runs"][0]
    assert run["loss"] == "mnrl_queue" and run["steps"] == 2
    assert (run["loss_config"]["queue_size"], run["loss_config"]["queue_source"]) == (64, "ema")
    assert run["loss_config"]["queue_warmup_steps"] == 8
    with pytest.raises(SystemExit):  # the hyperparameter screen's labels are not the queue screen's
        tuning.main(["--screen", "queue", "--only", "focal_m0.5", "--out", str(qout), *common])


RESULTS = BENCHMARKS / "results"


@pytest.mark.parametrize("name", ["cpu_protocol", "tuning", "untrained_eval", "overhead"])
def test_reports_regenerate_byte_identical_from_the_committed_json(name):
    """The report code (one markdown-table helper for all) renders the committed results exactly as committed."""
    module = _load(name)
    data = json.loads((RESULTS / f"{name}.json").read_text())
    assert module.markdown(data) == (RESULTS / f"{name}.md").read_text()


def _run(method, seed, avg):
    tasks = ("STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness")
    return {"method": method, "seed": seed, "sts": {**dict.fromkeys(tasks, avg), "avg": avg}, "stsb_dev_best": avg}


def test_cpu_protocol_compares_with_both_baselines_when_present():
    cpu = _load("cpu_protocol")
    runs = [_run("mnrl", 0, 70.0), _run("mnrl", 1, 72.0), _run("mixcse", 0, 73.5), _run("mixcse", 1, 74.5)]
    table = cpu.markdown({"runs": runs}).splitlines()
    assert "Δavg vs mnrl_symmetric" not in table[0] and table[0].count("Δavg vs mnrl") == 1
    with_sym = cpu.markdown({"runs": [*runs, _run("mnrl_symmetric", 0, 73.0), _run("mnrl_symmetric", 1, 73.4)]})
    lines = with_sym.splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[10:12] == ["Δavg vs mnrl", "Δavg vs mnrl_symmetric"]
    rows = {cells[0]: cells for cells in ([c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:])}
    # mixcse mean 74.0; mnrl mean 71.0; mnrl_symmetric mean 73.2
    assert rows["mixcse"][10:12] == ["+3.00", "+0.80"]
    assert rows["mnrl"][10:12] == ["–", "-2.20"]
    assert rows["mnrl_symmetric"][10:12] == ["+2.20", "–"]
    assert lines[1] == "|" + "---|" * len(header)
