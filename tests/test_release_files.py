"""Release files: LICENSE, CHANGELOG.md and CITATION.cff exist and agree with pyproject and the package version."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest
import yaml

import st_hardneg

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
CHANGELOG = (REPO / "CHANGELOG.md").read_text()
CITATION = yaml.safe_load((REPO / "CITATION.cff").read_text())


def _changelog_versions() -> list[str]:
    return re.findall(r"^## \[(\d+\.\d+\.\d+)\]", CHANGELOG, flags=re.M)


def test_version_is_written_once_and_read_by_pyproject():
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "st_hardneg.__version__"}
    # setuptools reads the attribute statically: it must be a plain string literal in st_hardneg/__init__.py
    tree = ast.parse((REPO / "st_hardneg" / "__init__.py").read_text())
    literals = [node.value.value for node in tree.body if isinstance(node, ast.Assign)
                and any(getattr(t, "id", None) == "__version__" for t in node.targets)
                and isinstance(node.value, ast.Constant)]
    assert literals == [st_hardneg.__version__]
    hard_coded = [p for p in (REPO / "st_hardneg").rglob("*.py")
                  if re.search(r"""["']\d+\.\d+\.\d+["']""", p.read_text()) and p.name != "__init__.py"
                  and re.search(rf"""["']{re.escape(st_hardneg.__version__)}["']""", p.read_text())]
    assert not hard_coded, f"the version is written again in {hard_coded}"


def test_package_version_changelog_and_citation_agree():
    versions = _changelog_versions()
    assert versions, "CHANGELOG.md has no '## [x.y.z]' entry"
    assert versions[0] == st_hardneg.__version__  # the latest entry comes first
    assert str(CITATION["version"]) == st_hardneg.__version__
    assert versions == sorted(versions, key=lambda v: tuple(map(int, v.split("."))), reverse=True)
    # each released entry links its comparison / tag
    for v in versions:
        assert re.search(rf"^\[{re.escape(v)}\]: https://", CHANGELOG, flags=re.M), v


def test_changelog_follows_keep_a_changelog():
    assert CHANGELOG.startswith("# Changelog\n") and "Keep a Changelog" in CHANGELOG
    sections = set(re.findall(r"^### (\w+)", CHANGELOG, flags=re.M))
    assert sections <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}, sections
    latest = CHANGELOG.split(f"## [{_changelog_versions()[0]}]", 1)[1].split("\n## [", 1)[0]
    for feature in ("mteb", "st-hardneg compare", "known_positives", "SentenceTransformerTrainingArguments", "docs/"):
        assert feature in latest, feature


@pytest.mark.parametrize("old, new", [("false_negative_margin", "margin"), ("symmetric", "directions")])
def test_changelog_renames_are_what_the_losses_say(tiny_model, old, new):
    """Each 0.1 argument the changelog lists as renamed is refused by name, with the new name in the message."""
    from st_hardneg import MixCSELoss

    row = re.search(rf"^\| `{old}=[^|]*\| `{new}=", CHANGELOG, flags=re.M)
    assert row, f"the changelog's rename table lacks {old} -> {new}"
    with pytest.raises(TypeError, match=rf"{old}.*{new}"):
        MixCSELoss(tiny_model, **{old: 0.1 if old.endswith("margin") else True})


def test_license_is_the_apache_2_text_pyproject_declares():
    text = (REPO / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply the Apache License" in text
    assert len(text) > 11_000  # the full text, not a notice
    assert PYPROJECT["project"]["license"] == "Apache-2.0" == CITATION["license"]
    assert PYPROJECT["project"]["license-files"] == ["LICENSE"]


def test_citation_is_cff_and_points_where_pyproject_does():
    assert CITATION["cff-version"] == "1.2.0" and CITATION["type"] == "software"
    assert CITATION["title"] and CITATION["authors"] and CITATION["message"]
    urls = PYPROJECT["project"]["urls"]
    assert set(urls) >= {"Documentation", "Source", "Changelog"}
    assert CITATION["repository-code"] == urls["Source"] and CITATION["url"] == urls["Documentation"]
    assert urls["Changelog"].endswith("/CHANGELOG.md") and urls["Changelog"].startswith(urls["Source"])


def test_python_classifiers_match_requires_python():
    from packaging.specifiers import SpecifierSet

    spec = SpecifierSet(PYPROJECT["project"]["requires-python"])
    versions = [c.rsplit(" :: ", 1)[1] for c in PYPROJECT["project"]["classifiers"]
                if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)]
    assert versions and all(spec.contains(f"{v}.0") for v in versions), versions
    lowest = min(versions, key=lambda v: int(v.split(".")[1]))
    assert not spec.contains(f"3.{int(lowest.split('.')[1]) - 1}.99"), "the lowest supported version has a classifier"


def test_docs_extra_has_floors_only():
    from packaging.requirements import Requirement

    docs = [Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"]["docs"]]
    assert {r.name for r in docs} == {"sphinx", "myst-parser", "sphinx-argparse"}
    for r in docs:
        assert r.specifier and all(s.operator == ">=" for s in r.specifier), str(r)
