"""Sphinx configuration of the st-hardneg documentation (build: ``sphinx-build -W --keep-going -b html docs docs/_build/html``).

Why Sphinx + napoleon + myst-parser: it is sentence-transformers' own stack, so the losses' docstrings, written in
its style (Google-style ``Args:`` / ``Returns:`` / ``Raises:`` sections with reStructuredText tables and math), render
as written through autodoc + napoleon; the prose pages are Markdown (MyST) so that they read like the README they were
cut from. Everything builds offline: no intersphinx inventory is fetched (cross-references to torch,
sentence-transformers, transformers … are listed in ``nitpick_ignore_regex`` instead of linked), the CLI page is
generated from the argparse parser by sphinx-argparse, and the measured tables are included from
``benchmarks/results/*.md`` at build time, never copied. ``nitpicky`` is on and the build runs with ``-W``: a broken
cross-reference or a malformed docstring fails CI (``.ci/run``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import st_hardneg  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _ext.apigen import write_api_pages, write_results_page  # noqa: E402

# the API reference is generated from the package's module tree at every build (docs/api/generated/, gitignored), so
# a module added or moved is documented without editing a page; the four paper losses have their own pages
write_api_pages(Path(__file__).resolve().parent / "api" / "generated")
# likewise every committed result table (benchmarks/results/*.md), included, never copied
write_results_page(Path(__file__).resolve().parent / "generated" / "results_tables.md", ROOT / "benchmarks" / "results")

project = "st-hardneg"
author = "the st-hardneg authors"
copyright = "the st-hardneg authors, Apache-2.0"  # noqa: A001
release = st_hardneg.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "myst_parser",
    "sphinxarg.ext",
    "_ext.attrdoc",
    "_ext.xref",
    "_ext.metrics",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "README.md", "Thumbs.db", ".DS_Store"]

# MyST: $…$ math, ::: fences, and heading anchors for [text](page.md#anchor) links
myst_enable_extensions = ["colon_fence", "dollarmath", "deflist"]
myst_heading_anchors = 3

# autodoc: the docstrings are the documentation; members in source order, signatures with their type hints
# sentence-transformers writes a loss's documentation in its __init__ docstring: show the class's and __init__'s
autoclass_content = "both"
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "undoc-members": True, "ignore-module-all": True, "show-inheritance": True}
autodoc_mock_imports: list[str] = []
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_attr_annotations = True
napoleon_use_ivar = True  # a class's "Attributes:" section as fields, not a second description of each attribute

# every cross-reference must resolve (-W turns a miss into an error); third-party names are not linked (offline)
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(torch|transformers|sentence_transformers|datasets|numpy|np|scipy|sklearn|mteb|matplotlib|tqdm"
               r"|accelerate|pytrec_eval|argparse|pathlib|collections|typing|typing_extensions|enum|dataclasses"
               r"|json|logging|os|re|io|abc|inspect|optuna)(\..*)?"),
    (r"py:.*", r"(Tensor|nn\.Module|Module|SentenceTransformer|Dataset|DatasetDict|Path|Callable|Iterable|Iterator"
               r"|Sequence|Mapping|Any|Literal|Unpack|TypedDict|Generator|ndarray|TrainerCallback|TrainerState"
               r"|TrainerControl|TrainingArguments|Figure|Axes|PreTrainedTokenizerBase|Optimizer|TextIO|Namespace"
               r"|ArgumentParser|NDArray|Self|ParamSpec|TypeVar|BaseEvaluator|Trainer|SentenceTransformerTrainingArguments"
               r"|AbsTask\w*|statistics\..*|types\..*|contextlib\..*)"),
    # builtin generics whose signature text autodoc splits at a comma (a dataclass field with a factory default)
    (r"py:class", r"(dict|list|tuple|set)\[.*"),
    # private names (not documented) mentioned in a docstring or an annotation
    (r"py:.*", r"(.*\.)?_[A-Za-z]\w*"),
]

html_theme = "alabaster"
html_title = f"st-hardneg {release}"
html_static_path: list[str] = []
html_theme_options = {"description": "Hard-negative contrastive losses for sentence-transformers"}
