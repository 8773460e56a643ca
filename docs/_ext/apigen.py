"""Write the API reference pages from the package's module tree (one page per subpackage, one section per module).

Nothing here copies a docstring: every page is a list of ``automodule`` directives, rendered by autodoc at build
time. The four paper losses and their shared options are documented on their own pages (``docs/losses/``) and
linked from the losses page.
"""

from __future__ import annotations

import pkgutil
from pathlib import Path

import st_hardneg

#: modules whose members are documented on a page of their own (docs/losses/<page>.md), not in the API pages
LOSS_PAGES = {
    "st_hardneg.losses.mixcse": "mixcse",
    "st_hardneg.losses.focal": "focal",
    "st_hardneg.losses.hncse": "hncse",
    "st_hardneg.losses.adcse": "adcse",
    "st_hardneg.losses.options": "options",
}
#: modules that hold no API (the ``python -m`` entry point)
SKIP = {"st_hardneg.cli.__main__", "st_hardneg.training.retrieval"}  # a deprecated alias of .protocol
#: the order of the pages (lowest layer of the user's view first); others follow alphabetically
ORDER = ["losses", "functional", "training", "evaluation", "data", "cli", "models", "validation", "reporting",
         "plots", "testing"]


def modules() -> dict[str, list[str]]:
    """``{page: [module, ...]}``: each subpackage with its submodules, and each top-level module on a page of its own."""
    pages: dict[str, list[str]] = {}
    for info in pkgutil.walk_packages(st_hardneg.__path__, "st_hardneg."):
        if info.name in SKIP or any(part.startswith("_") for part in info.name.split(".")[1:]):
            continue
        top = info.name.split(".")[1]
        pages.setdefault(top, []).append(info.name)
    for names in pages.values():
        names.sort(key=lambda n: (n.count("."), n))  # the package first, then its modules
    return pages


def page_text(page: str, names: list[str]) -> str:
    lines = [f"# `st_hardneg.{page}`", ""]
    for name in names:
        if name in LOSS_PAGES:
            lines += [f"## `{name}`", "", f"Documented on its own page: [{name}](../../losses/{LOSS_PAGES[name]}.md).",
                      ""]
            continue
        is_package = name == f"st_hardneg.{page}" and len(names) > 1
        if name != f"st_hardneg.{page}":
            lines += [f"## `{name}`", ""]
        lines += ["```{eval-rst}", f".. automodule:: {name}"]
        if is_package:
            # a package re-exports its modules' names: its docstring only, the members under their modules
            lines += ["   :no-members:"]
        lines += ["```", ""]
    return "\n".join(lines)


def write_api_pages(out: Path) -> list[Path]:
    """(Re)write ``out/<page>.md`` for every page of :func:`modules`; stale pages are removed."""
    out.mkdir(parents=True, exist_ok=True)
    pages = modules()
    order = [p for p in ORDER if p in pages] + sorted(p for p in pages if p not in ORDER)
    written = []
    for i, page in enumerate(order):
        path = out / f"{i:02d}_{page}.md"
        text = page_text(page, pages[page])
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
        written.append(path)
    for stale in set(out.glob("*.md")) - set(written):
        stale.unlink()
    return written


def write_results_page(path: Path, results: Path) -> Path:
    """(Re)write ``path``: every ``results/*.md`` table file, included (never copied) under a heading of its name, so a
    new results file appears in the documentation without editing a page."""
    lines = ["# Every result table", "",
             "Each committed `benchmarks/results/*.md` file, included as it is (each is rendered from the `.json` beside",
             "it; tests check that they match). The pages of the guides quote and explain them.", ""]
    rel = Path("..") / ".." / results.name
    for table in sorted(results.glob("*.md")):
        lines += [f"## `{table.name}`", "", f"```{{include}} {rel.parent.as_posix()}/benchmarks/{rel.name}/{table.name}",
                  ":heading-offset: 2", "```", ""]
    text = "\n".join(lines)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
    return path
