"""The notebooks run end to end in their smoke configuration (ST_HARDNEG_SMOKE=1: tiny random model, a few sentences).

Run as a script to execute them for real and save their outputs in place (what is committed):

    python tests/test_notebooks.py                 # every notebook, real configuration
    python tests/test_notebooks.py quickstart      # one of them (quickstart, analysis, retrieval, beir_retrieval)
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def execute(path: Path, timeout: int = 3600):
    """Execute the notebook at ``path`` with its folder as working directory; returns the executed notebook."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    return notebook


def _outputs(notebook) -> str:
    texts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            texts.append(output.get("text", ""))
            texts.extend(v for k, v in output.get("data", {}).items() if k in ("text/plain", "text/markdown"))
    return "\n".join(texts)


def _images(notebook) -> int:
    return sum("image/png" in output.get("data", {}) for cell in notebook.cells for output in cell.get("outputs", []))


@pytest.fixture
def smoke_env(monkeypatch, tmp_path, shared_data):
    monkeypatch.setenv("ST_HARDNEG_SMOKE", "1")
    monkeypatch.setenv("ST_HARDNEG_NOTEBOOK_OUTPUT", str(tmp_path / "output"))
    monkeypatch.setenv("ST_HARDNEG_DATA", str(shared_data))
    return tmp_path


@pytest.mark.integration
def test_quickstart_smoke(smoke_env):
    notebook = execute(NOTEBOOKS / "quickstart.ipynb", timeout=600)
    text = _outputs(notebook)
    assert "smoke mode: True" in text
    assert "| MNRL (SimCSE) |" in text and "| MixCSE |" in text and "| untrained |" in text
    assert _images(notebook) >= 1
    assert (smoke_env / "output" / "quickstart" / "mixcse" / "modules.json").is_file()  # fit's best model
    assert not (NOTEBOOKS / "checkpoints").exists()


@pytest.mark.integration
def test_retrieval_smoke(smoke_env):
    notebook = execute(NOTEBOOKS / "retrieval.ipynb", timeout=600)
    text = _outputs(notebook)
    assert "smoke mode: True" in text
    assert "test queries or relevant documents among the training sentences: 0" in text
    number = r"\d+\.\d\d"
    for row in ("untrained", r"trained \(FocalInfoNCE\)"):
        assert re.search(rf"\| {row} \| {number} \| {number} \| {number} \|", text), row
    assert _images(notebook) >= 1
    per_batch = r"masked false negatives per batch \(of 16 anchors × 31 candidates\): \[\d+, \d+\]"  # 2 steps
    assert re.search(per_batch, text), "no per-batch masked-false-negative counts"
    assert "'masked_false_negatives': " in text  # loss.diagnostics of the last batch
    assert (smoke_env / "output" / "retrieval" / "final" / "modules.json").is_file()  # the trained model, saved


@pytest.mark.integration
def test_analysis_smoke_with_partial_results(smoke_env, monkeypatch):
    """A partial benchmark JSON (one run lacks scores, most method × seed runs missing) and no overhead file."""
    results = smoke_env / "results"
    results.mkdir()
    tasks = ("STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness")

    def run(method, seed, base):
        sts = {t: base + i / 10 for i, t in enumerate(tasks)}
        return {"method": method, "seed": seed, "sts": {**sts, "avg": base + 0.3}, "stsb_dev_best": base + 5,
                "median_step_seconds": 1.0, "train_seconds": 90.0}

    runs = [run("mnrl", 0, 74.0), run("mixcse", 0, 75.0), {"method": "focal", "seed": 0, "sts": {"STS12": 70.0}}]
    runs[1]["dev_curve"] = [[50, 79.0], [100, 79.5]]  # one run with a dev curve, the others from before curves
    (results / "cpu_protocol.json").write_text(json.dumps({"protocol": {}, "runs": runs}))
    screen = {"seed": 1, "stop_after": 50, "references": {"mnrl": 79.0, "focal": 80.0},
              "runs": [{"label": "focal_m0.5", "loss": "focal", "changed": {"m": 0.5}, "why": "margin",
                        "stsb_dev": 80.5}]}
    (results / "tuning.json").write_text(json.dumps(screen))
    monkeypatch.setenv("ST_HARDNEG_RESULTS_DIR", str(results))
    notebook = execute(NOTEBOOKS / "analysis.ipynb", timeout=600)
    text = _outputs(notebook)
    assert "2 of 24 method × seed runs done" in text and "1 run(s) lack some task scores" in text
    assert "| mixcse | 0 |" in text
    assert "No overhead measurement yet" in text
    assert "| focal_m0.5 | focal | m=0.5 | 80.50 | +1.50 | +0.50 | margin |" in text  # the screen's table
    assert "hncse_hnm" in text and _images(notebook) >= 6  # bar chart, deltas, dev curves, screen, curves, AU


@pytest.mark.integration
def test_beir_retrieval_smoke(smoke_env):
    notebook = execute(NOTEBOOKS / "beir_retrieval.ipynb", timeout=600)
    text = _outputs(notebook)
    assert "smoke mode: True" in text and "dev or test queries among the training queries: 0" in text
    number = r"\d+\.\d\d"
    for row in ("untrained", r"trained \(recipe\)"):
        assert re.search(rf"\| {row} \| {number} \| {number} \| {number} \| {number} \|", text), row
    assert "steps: 2;" in text and re.search(r"test queries: 8; mean gain [+-]\d+\.\d\d", text)
    # the retrieval recipe, with the training qrels of every training query as its known positives and its guide
    from st_hardneg.training.recipe import RETRIEVAL_RECIPE

    assert RETRIEVAL_RECIPE["loss_kwargs"] == {"untied": False, "temperature": 0.01, "margin": 0.05,
                                               "margin_strategy": "relative"}
    assert re.search(r"loss: AdversarialNegativesLoss, the recipe's options \{'untied': False, 'temperature': 0\.01, "
                     r"'margin': 0\.05, 'margin_strategy': 'relative'\} with \{'margin': None\}; known positives for "
                     r"[1-9]\d* queries; guided by a frozen copy of the untrained model", text)
    assert "'relative_margin': None" in text  # mined as the recipe says (RETRIEVAL_RECIPE["mining"])
    assert _images(notebook) >= 1
    assert (smoke_env / "output" / "beir_retrieval" / "final" / "modules.json").is_file()


def main(names: list[str]) -> int:
    import nbformat

    for name in names or ["quickstart", "analysis", "retrieval", "beir_retrieval"]:
        path = NOTEBOOKS / f"{name.removesuffix('.ipynb')}.ipynb"
        os.environ.pop("ST_HARDNEG_SMOKE", None)
        start = time.perf_counter()
        notebook = execute(path)
        nbformat.write(notebook, path)
        print(f"{path.name}: executed in {time.perf_counter() - start:.0f} s, outputs saved")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
