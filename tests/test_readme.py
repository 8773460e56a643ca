"""The README: short, in the agreed order, every link resolving, and its quickstart block running as written."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"

#: the README's sections, in this order (what it is comes before the first of them)
SECTIONS = ["Set-up on a fresh machine", "Quickstart", "Command line", "For sentence-transformers users", "Results",
            "Data", "Notebooks", "Documentation", "Development", "Citation"]


def _text() -> str:
    return README.read_text(encoding="utf-8")


def _section(title: str) -> str:
    text = _text()
    return text[text.index(f"\n## {title}\n"):].split("\n## ", 2)[1]


def _code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", text, flags=re.S | re.M)


def quickstart_block() -> str:
    """The first python block of the Quickstart section, verbatim."""
    return _code_blocks(_section("Quickstart"), "python")[0]


def fit_line() -> str:
    """The one-line ``model.fit`` call of the Quickstart section, verbatim."""
    return _code_blocks(_section("Quickstart"), "python")[1]


def test_readme_is_at_most_15_kb():
    assert len(_text().encode("utf-8")) <= 15_000


def test_sections_come_in_the_agreed_order():
    headings = re.findall(r"^## (.+)$", _text(), flags=re.M)
    assert headings == SECTIONS
    intro = _text().split("\n## ", 1)[0]  # what it is: the table of the four losses, before any section
    for loss in ("MixCSELoss", "FocalInfoNCELoss", "HNCSELoss", "AdversarialNegativesLoss"):
        assert f"| `{loss}` |" in intro, loss


def test_install_section_is_the_two_setup_commands():
    block = _code_blocks(_section("Set-up on a fresh machine"), "bash")[0]
    commands = [line for line in block.splitlines() if line and not line.startswith("#")]
    assert commands == ['pip install -e ".[demo,dev]" -c constraints/cpu.txt && st-hardneg train --loss mixcse',
                        'pip install -e ".[demo,dev]" -c constraints/cpu.txt && python -m pytest -q']
    assert len(block.splitlines()) <= 5


def test_ci_runs_the_readme_test_and_docs_commands():
    ci = (REPO / ".ci" / "run").read_text()
    test_command = _code_blocks(_section("Set-up on a fresh machine"), "bash")[0].splitlines()[-1].split(" && ")[1]
    assert test_command == "python -m pytest -q" and re.search(rf"^{re.escape(test_command)}\b", ci, flags=re.M)
    docs_build = _code_blocks(_section("Documentation"), "bash")[0].strip().split(" && ")[1]
    assert docs_build == "sphinx-build -W --keep-going -b html docs docs/_build/html"
    assert re.search(rf"^{re.escape(docs_build)}$", ci, flags=re.M), "CI must build the docs as the README says"


def test_quickstart_is_ten_lines_swapping_mnrl_on_in_memory_data():
    block = quickstart_block()
    lines = [line for line in block.splitlines() if line.strip()]
    assert len(lines) <= 10, lines
    assert "SentenceTransformerTrainer(" in block and "from st_hardneg import MixCSELoss" in block
    assert "MultipleNegativesRankingLoss" in block  # says what it replaces
    assert "Dataset.from_dict(" in block and "shared" not in block and "read_corpus" not in block  # no shared data
    assert "max_steps=2" in block and 'save_pretrained("out/final")' in block
    assert len(fit_line().strip().splitlines()) == 1 and fit_line().startswith("model.fit(")


def test_every_relative_link_resolves():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", _text())
    local = [link for link in links if "://" not in link]
    assert local, "the README links to the docs and the repository files"
    missing = [link for link in local if not (REPO / link).exists()]
    assert not missing, missing
    for anchor in re.findall(r"\]\(#([^)]+)\)", _text()):
        assert anchor in {h.lower().replace(" ", "-") for h in SECTIONS}, anchor


def test_notebooks_are_all_linked_with_a_line_each():
    notebooks = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "notebooks").glob("*.ipynb"))
    section = _section("Notebooks")
    for nb in notebooks:
        assert f"(notebooks/{Path(nb).name})" in section, nb
        assert f"notebooks/{Path(nb).name}" in (REPO / "docs" / "notebooks.md").read_text(), nb


@pytest.mark.integration
def test_quickstart_block_trains_two_steps_and_saves(tmp_path):
    """The block runs verbatim (the real all-MiniLM-L6-v2 of the [demo] extra), then the one-line ``model.fit``."""
    script = tmp_path / "quickstart.py"
    check = textwrap.dedent("""
        import json, torch
        from sentence_transformers import SentenceTransformer
        from st_hardneg.models import default_model_path
        state = json.load(open("out/checkpoint-2/trainer_state.json"))
        before = SentenceTransformer(str(default_model_path()), device="cpu")
        saved = SentenceTransformer("out/final", device="cpu")
        changed = any(not torch.equal(a, b) for a, b in zip(before.state_dict().values(), saved.state_dict().values()))
        from torch.utils.data import DataLoader
        from sentence_transformers import InputExample
        FIT
        print(json.dumps({"steps": state["global_step"], "changed": changed, "dim": saved.encode(["a"]).shape[1],
                          "fit_changed": any(not torch.equal(a, b) for a, b in
                                             zip(saved.state_dict().values(), model.state_dict().values()))}))
        """).replace("FIT", fit_line().strip())
    script.write_text(quickstart_block() + check)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result == {"steps": 2, "changed": True, "dim": 384, "fit_changed": True}
    assert (tmp_path / "out" / "final" / "modules.json").is_file()
    assert not (tmp_path / "checkpoints").exists()  # the fit line's checkpoint_path keeps ST's default folder away


def test_the_retrieval_table_is_the_two_dataset_benchmarks_json():
    """Every number of the README's table of the first retrieval run is the committed JSON's (mean ± std over the
    seeds run, as the results page renders it; the last column the mean over the two datasets), so the README cannot
    drift from it."""
    import statistics

    from st_hardneg.reporting import mean_std_text

    data = json.loads((REPO / "benchmarks" / "results" / "retrieval_beir.json").read_text())
    results = _section("Results")
    table = results[results.index("**First run, on negatives fixed before the mining screen**"):].split("\n\n")[1]
    rows = {line.split(" | ")[0].strip("| "): [c.strip(" *|") for c in line.split(" | ")[1:]]
            for line in table.splitlines()[2:]}
    labels = {"untrained": "untrained", "MNRL + mined negatives": "mnrl", "GISTEmbedLoss": "gist",
              "st-hardneg recipe": f"{data['chosen_recipe']}+known"}
    assert data["best_builtin"] == "gist"
    for prefix, label in labels.items():
        cells = next(cells for name, cells in rows.items() if name.strip("*").startswith(prefix))
        means = []
        for name, cell in zip(("scifact", "nfcorpus"), cells, strict=False):
            values = [r["test"]["ndcg@10"] for r in data["runs"] if r["dataset"] == name and r["method"] == label
                      and r.get("stage") in ("main", "untrained") and "test" in r]
            assert cell.startswith(mean_std_text(values)), (prefix, name, cell, mean_std_text(values))
            means.append(statistics.fmean(values))
        assert cells[2] == f"{statistics.fmean(means):.2f}", (prefix, cells[2])


def test_the_screened_rerun_table_is_its_json():
    """The README's retrieval table, the run on the mining screen's negatives, is ``retrieval_beir_screened.json``'s:
    the same rows, mean ± std over the seeds run, the mean over the two datasets, and the seed counts it states."""
    import statistics

    from st_hardneg.reporting import mean_std_text

    data = json.loads((REPO / "benchmarks" / "results" / "retrieval_beir_screened.json").read_text())
    assert data["mining_by_dataset"] == {"scifact": "top5_nomargin", "nfcorpus": "top5_nomargin"}
    results = _section("Results")
    head = results[results.index("**Retrieval**"):]
    table = head.split("\n\n")[1]
    rows = {line.split(" | ")[0].strip("| "): [c.strip(" *|") for c in line.split(" | ")[1:]]
            for line in table.splitlines()[2:]}
    labels = {"untrained": "untrained", "MNRL + mined negatives": "mnrl", "GISTEmbedLoss": "gist",
              "st-hardneg recipe": f"{data['chosen_recipe']}+known"}
    assert len(rows) == len(labels)
    seeds: dict[str, int] = {}
    for prefix, label in labels.items():
        cells = next(cells for name, cells in rows.items() if name.strip("*").startswith(prefix))
        means, counts = [], set()
        for name, cell in zip(("scifact", "nfcorpus"), cells, strict=False):
            values = [r["test"]["ndcg@10"] for r in data["runs"] if r["dataset"] == name and r["method"] == label
                      and r.get("stage") in ("main", "untrained") and "test" in r]
            assert cell.startswith(mean_std_text(values)), (prefix, name, cell, mean_std_text(values))
            means.append(statistics.fmean(values))
            counts.add(len(values))
        assert cells[2] == f"{statistics.fmean(means):.2f}", (prefix, cells[2])
        assert len(counts) == 1, (label, counts)  # as many seeds on both datasets
        seeds[label] = counts.pop()
    intro = " ".join(head.split("\n\n")[0].split())
    assert f"{seeds['gist']} paired seeds for the recipe and GIST, {seeds['mnrl']} for MNRL" in intro, intro
    assert seeds["gist"] == seeds[labels["st-hardneg recipe"]]
