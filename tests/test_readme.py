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


def test_the_second_round_retrieval_table_is_its_json():
    """The README's second-round retrieval table is ``retrieval_beir_round2.json``'s: the recipe and the best built-in
    are that file's choices on pooled dev, every cell the mean ± std of the test nDCG@10 over the seeds run (as many
    on both datasets), the last column the mean over the two datasets."""
    from benchmarks.retrieval_beir_rows import side_choice, twin
    from tests.retrieval_tables import check_rows_are_runs, table_rows

    data = json.loads((REPO / "benchmarks" / "results" / "retrieval_beir_round2.json").read_text())
    recipe, best = side_choice(data, builtin=False), side_choice(data, builtin=True)
    assert (recipe, best) == ("adcse_tied+ctl@t0.01", "gist@rel0.05")
    results = _section("Results")
    head = results[results.index("**Retrieval, second round**"):]
    rows = table_rows(head.split("\n\n")[1])
    labels = {"untrained": "untrained", "MNRL + mined negatives": "mnrl@rel0.05", "GISTEmbedLoss": best,
              "the recipe's loss without the control": twin(recipe), "st-hardneg recipe": recipe}
    assert len(rows) == len(labels)
    for label, per_dataset in check_rows_are_runs(rows, labels, data["runs"]).items():
        assert len(set(per_dataset)) == 1, (label, per_dataset)  # as many seeds on both datasets


def test_the_sts_table_is_the_cpu_protocols_json():
    """Every cell of the README's STS table is the committed CPU protocol's: the STS average (mean ± std over the
    seeds) and its difference to ``mnrl`` as ``cpu_protocol.md`` renders them from ``cpu_protocol.json`` (a row of
    several methods lists each one's value in order), so the README cannot drift from the results."""
    from benchmarks import cpu_protocol

    data = json.loads((REPO / "benchmarks" / "results" / "cpu_protocol.json").read_text())
    rendered = cpu_protocol.markdown(data)
    assert rendered == (REPO / "benchmarks" / "results" / "cpu_protocol.md").read_text()
    lines = [line for line in rendered.splitlines() if line.startswith("| ")]  # the header, then the rows
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    committed = {cells[0]: dict(zip(header, cells, strict=True))
                 for line in lines[1:] if (cells := [c.strip() for c in line.strip("|").split("|")])}
    labels = {"untrained": ["untrained"], "mnrl (SimCSE)": ["mnrl"], "mnrl_hardness": ["mnrl_hardness"],
              "mixcse_two_way / hncse_pm / hncse_hnm / adcse": ["mixcse_two_way", "hncse_pm", "hncse_hnm", "adcse"],
              "focal": ["focal"], "mnrl + 512-row queue": ["mnrl_queue:queue_size=512,queue_warmup_steps=8"],
              "focal + 512-row queue": ["focal:queue_size=512,queue_warmup_steps=8"]}
    results = _section("Results")
    table = results[results.index("**STS**"):].split("\n\n")[1]
    rows = {line.split(" | ")[0].strip("| *"): [c.strip(" *|") for c in line.split(" | ")[1:]]
            for line in table.splitlines()[2:]}
    assert len(rows) == len(labels)
    for prefix, methods in labels.items():
        cells = next(cells for name, cells in rows.items() if name.startswith(prefix))
        avg, delta = (cell.replace("−", "-").split(" / ") for cell in cells[:2])
        # a row of several methods gives each one's mean alone; the untrained model's "± 0.00" is left out
        expected_avg = [committed[m]["avg"].split(" ± ")[0] if len(methods) > 1 else
                        committed[m]["avg"].removesuffix(" ± 0.00") for m in methods]
        assert avg == expected_avg, (prefix, avg, expected_avg)
        assert delta == [committed[m]["Δavg vs mnrl"] for m in methods], (prefix, delta)
