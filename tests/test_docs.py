"""The documentation site's sources: every loss, module, evaluator and CLI command documented, nothing hand-copied.

The build itself (``sphinx-build -W --keep-going``, warnings as errors) runs in ``.ci/run``; these checks are the
structure it relies on, cheap enough for every test run.
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import re
import sys
from pathlib import Path

import pytest

import st_hardneg

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
LOSSES = ["MixCSELoss", "FocalInfoNCELoss", "HNCSELoss", "AdversarialNegativesLoss"]


def _docs_extension(name: str):
    """Import ``docs/_ext/<name>.py`` (the Sphinx extensions live outside the package) for the test's duration."""
    sys.path.insert(0, str(DOCS))
    try:
        yield importlib.import_module(f"_ext.{name}")
    finally:
        sys.path.remove(str(DOCS))


@pytest.fixture(scope="module")
def apigen():
    yield from _docs_extension("apigen")


def _pages() -> dict[str, str]:
    return {p.relative_to(DOCS).as_posix(): p.read_text() for p in DOCS.rglob("*.md")
            if "_build" not in p.parts and "generated" not in p.parts and p.name != "README.md"}


def test_every_loss_has_a_page_rendering_its_module():
    from st_hardneg.training.registry import LOSS_DOC_PAGES

    assert sorted(LOSS_DOC_PAGES) == sorted(LOSSES)  # the model card's links point at these pages
    for name, page in LOSS_DOC_PAGES.items():
        text = (DOCS / "losses" / f"{page}.md").read_text()
        module = getattr(st_hardneg, name).__module__
        assert f".. automodule:: {module}" in text, (name, page)


def test_every_module_is_in_the_api_reference(apigen, tmp_path):
    pages = apigen.write_api_pages(tmp_path)
    text = "\n".join(p.read_text() for p in pages)
    modules = [m.name for m in pkgutil.walk_packages(st_hardneg.__path__, "st_hardneg.")
               if m.name not in apigen.SKIP]
    assert len(modules) > 40
    for name in modules:
        documented = f".. automodule:: {name}\n" in text or name in apigen.LOSS_PAGES
        assert documented, name
    # the loss modules are documented once (their own page), so Sphinx sees no duplicate object
    for name in apigen.LOSS_PAGES:
        assert f".. automodule:: {name}\n" not in text


def test_api_pages_are_rewritten_and_stale_ones_removed(apigen, tmp_path):
    (tmp_path / "99_gone.md").write_text("# a module that no longer exists\n")
    pages = apigen.write_api_pages(tmp_path)
    assert not (tmp_path / "99_gone.md").exists()
    assert [p.name for p in pages][:2] == ["00_losses.md", "01_functional.md"]
    assert sorted(tmp_path.glob("*.md")) == sorted(pages)


def test_every_evaluator_and_public_name_is_documented_by_its_module(apigen):
    """autodoc documents a module's own members: every evaluator class lives in a module of the API reference."""
    from sentence_transformers.base.evaluation.evaluator import BaseEvaluator

    import st_hardneg.evaluation as evaluation

    evaluators = [obj for name in evaluation.__all__ if inspect.isclass(obj := getattr(evaluation, name))
                  and issubclass(obj, BaseEvaluator)]
    assert evaluators, "st_hardneg.evaluation exports evaluators"
    documented = {m for names in apigen.modules().values() for m in names}
    for cls in evaluators:
        assert cls.__module__ in documented, cls


def test_cli_page_is_generated_from_the_parser():
    text = (DOCS / "cli.md").read_text()
    assert re.search(r"```\{argparse\}\n:module: st_hardneg.cli.app\n:func: build_parser\n:prog: st-hardneg\n```", text)
    from st_hardneg.cli.app import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices
    assert {"train", "eval", "download"} <= set(commands)


def test_every_page_is_in_a_toctree_and_every_include_exists():
    pages = _pages()
    toctrees = "\n".join(re.findall(r"```\{toctree\}\n(.*?)```", "\n".join(pages.values()), flags=re.S))
    for page in pages:
        if page in ("index.md",):
            continue
        stem = Path(page).with_suffix("").as_posix()
        leaf = Path(page).with_suffix("").name
        assert re.search(rf"^({re.escape(stem)}|{re.escape(leaf)})$", toctrees, flags=re.M), page
    for page, text in pages.items():
        for target in re.findall(r"```\{include\} (\S+)", text):
            assert ((DOCS / page).parent / target).resolve().is_file(), (page, target)


def _includes() -> list[tuple[str, Path, str | None, str | None]]:
    """Every ``{include}`` of the docs pages: (page, the file it includes, its ``:start-after:``, its
    ``:end-before:``)."""
    found = []
    for page, text in _pages().items():
        for target, options in re.findall(r"```\{include\} (\S+)\n((?::[^\n]*\n)*)```", text):
            option = {key: value[1:-1] if value[:1] == value[-1:] == '"' else value  # a quoted value: unquoted
                      for key, value in re.findall(r"^:([\w-]+): (.*)$", options, flags=re.M)}
            found.append((page, ((DOCS / page).parent / target).resolve(), option.get("start-after"),
                          option.get("end-before")))
    return found


def test_every_part_an_include_cuts_out_is_in_its_file_and_not_empty():
    """An include with ``:start-after:`` / ``:end-before:`` cuts a part of a rendered file: both markers are in the
    file, in that order, with something between them (a marker the renderer no longer writes fails here, not as a
    silently empty section)."""
    cut = [(page, path, after, before) for page, path, after, before in _includes() if after or before]
    assert cut, "the docs include parts of the results reports"
    for page, path, after, before in cut:
        text = path.read_text(encoding="utf-8")
        assert not after or after in text, (page, path.name, after)
        start = text.index(after) + len(after) if after else 0
        assert not before or before in text[start:], (page, path.name, before)
        end = text.index(before, start) if before else len(text)
        assert text[start:end].strip(), (page, path.name, after, before)


def _rendered_results() -> dict[str, str]:
    """Each results table the pages include, rendered again from its results JSON by its benchmark's own renderer."""
    from benchmarks import cpu_protocol, known_relevance_share, overhead, retrieval_beir_round2, untrained

    results = REPO / "benchmarks" / "results"

    def data(name: str):
        return json.loads((results / f"{name}.json").read_text())

    round2 = data("retrieval_beir_round2")
    return {
        "cpu_protocol.md": cpu_protocol.markdown(data("cpu_protocol")),
        "tuning.md": cpu_protocol.screen_markdown(data("tuning")),
        "queue.md": cpu_protocol.queue_report(results),
        "overhead.md": overhead.markdown(data("overhead")),
        "known_relevance_share.md": known_relevance_share.markdown(data("known_relevance_share")["rows"]),
        "untrained_beir.md": untrained.beir_render(data("untrained_beir")),
        "retrieval_beir_round2.md": retrieval_beir_round2.markdown(round2, retrieval_beir_round2.per_query_runs(
            results / "retrieval_beir_round2_per_query.jsonl", round2["runs"])),
    }


#: the pages whose every number comes from an include of a rendered results file
FROM_THE_RECORDS = ("results.md", "retrieval.md", "losses/which.md")


def test_the_results_pages_include_rendered_files_that_are_their_json():
    """Every results table included by the results, retrieval and which-loss pages is a file its benchmark renders
    from its JSON, and equals what that JSON renders to now."""
    rendered = _rendered_results()
    included = {path.name for page, path, _, _ in _includes() if page in FROM_THE_RECORDS
                and path.parent == REPO / "benchmarks" / "results"}
    assert {"cpu_protocol.md", "overhead.md", "retrieval_beir_round2.md"} <= included
    assert included <= set(rendered), included - set(rendered)
    for name in included:
        assert (REPO / "benchmarks" / "results" / name).read_text() == rendered[name], name


def test_measured_tables_are_included_not_copied():
    pages = _pages()
    text = "\n".join(pages.values())
    for name in ("scale", "scale_minilm", "queue", "cpu_protocol", "tuning", "overhead", "retrieval_beir_round2",
                 "known_relevance_share", "untrained_beir"):
        assert f"../benchmarks/results/{name}.md" in text, name
        table = (REPO / "benchmarks" / "results" / f"{name}.md").read_text()
        first_row = next(line for line in table.splitlines() if line.startswith("| ") and "---" not in line)
        second = table.splitlines()[table.splitlines().index(first_row) + 2]  # a data row
        assert second not in text, f"a row of {name}.md is copied into the docs"


def test_no_page_copies_a_docstring():
    pages = "\n".join(_pages().values())
    for name in LOSSES + ["HardNegativeLoss"]:
        doc = inspect.getdoc(getattr(st_hardneg, name)) or ""
        for paragraph in doc.split("\n\n"):
            sentence = " ".join(paragraph.split())
            if len(sentence) > 120:
                assert sentence[:120] not in " ".join(pages.split()), (name, sentence[:120])


@pytest.fixture(scope="module")
def xref():
    yield from _docs_extension("xref")


class _Obj:
    def __init__(self, objtype):
        self.objtype = objtype


def test_xref_narrows_a_short_name_by_role_and_class(xref):
    """A subclass's ``:attr:`diagnostics``` links the loss's property, not the module of the same name; a name two
    unrelated classes share stays unresolved (a build error under -W)."""
    objects = {"st_hardneg.evaluation.diagnostics": _Obj("module"),
               "st_hardneg.losses.base.HardNegativeLoss.diagnostics": _Obj("property"),
               "st_hardneg.losses.options.LossOptions.seed": _Obj("attribute"),
               "st_hardneg.training.loop.TrainConfig.seed": _Obj("attribute")}
    node = {"reftype": "attr", "py:module": "st_hardneg.losses.mixcse", "py:class": "MixCSELoss"}
    assert xref._by_suffix("diagnostics", node, objects) == "st_hardneg.losses.base.HardNegativeLoss.diagnostics"
    node = {"reftype": "attr", "py:module": "st_hardneg.losses.base", "py:class": "HardNegativeLoss"}
    assert xref._by_suffix("seed", node, objects) is None
    # a TypedDict refuses issubclass: treated as unrelated, no exception
    from st_hardneg.losses.base import HardNegativeLoss
    from st_hardneg.losses.options import LossOptions

    assert xref._related(LossOptions, HardNegativeLoss) is False
    assert xref._related(HardNegativeLoss, HardNegativeLoss) is True


@pytest.fixture(scope="module")
def metrics_ext():
    yield from _docs_extension("metrics")


def test_metric_names_render_as_text_not_mailto_links(metrics_ext):
    from docutils.core import publish_doctree
    from docutils.nodes import reference

    doctree = publish_doctree("Scores nDCG@10, MRR@10 and R@100; write to someone@example.org.")
    before = [node.get("refuri") for node in doctree.findall(reference)]
    assert "mailto:nDCG@10" in before and "mailto:someone@example.org" in before  # what docutils does by itself
    metrics_ext.unlink_metric_names(None, doctree)
    assert [node.get("refuri") for node in doctree.findall(reference)] == ["mailto:someone@example.org"]
    assert "nDCG@10, MRR@10 and R@100" in doctree.astext()
