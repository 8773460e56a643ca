"""The library installs beside any supported torch: floors, not pins; CPU build only through a constraints file."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _requirements(extra: str | None = None) -> dict[str, Requirement]:
    items = PYPROJECT["dependencies"] if extra is None else PYPROJECT["optional-dependencies"][extra]
    reqs = [Requirement(item) for item in items]
    return {r.name.lower(): r for r in reqs}


def test_torch_is_a_floor_that_accepts_current_and_future_releases():
    torch = _requirements()["torch"]
    for version in ("2.6.0", "2.13.0", "2.13.0+cpu", "2.14.1", "2.15.0", "3.0.0"):
        assert torch.specifier.contains(Version(version), prereleases=False), (version, str(torch.specifier))
    assert not torch.specifier.contains("2.5.1"), "transformers 5 disables PyTorch below 2.6"
    assert all(spec.operator == ">=" for spec in torch.specifier), str(torch.specifier)


@pytest.mark.parametrize("extra", [None, "mteb", "demo", "dev"])
def test_no_dependency_pins_or_caps_torch(extra):
    for name, req in _requirements(extra).items():
        if name == "torch":
            assert not any(s.operator in ("==", "===", "<", "<=", "~=", "!=") for s in req.specifier), str(req)
        assert "+cpu" not in str(req) and "+cu" not in str(req), str(req)


def test_lower_bounds_are_at_least_what_sentence_transformers_6_2_needs():
    reqs = _requirements()
    st = reqs["sentence-transformers"]
    assert "train" in st.extras  # accelerate + datasets, at sentence-transformers' own floors
    assert st.specifier.contains("6.2.0") and not st.specifier.contains("6.1.9")
    # sentence-transformers 6.2 requires transformers>=5.0.0,<6.0.0, accelerate>=1.3.0 ([train]), datasets>=2.16.0
    assert not reqs["transformers"].specifier.contains("4.57.0") and reqs["transformers"].specifier.contains("5.0.0")
    assert not reqs["accelerate"].specifier.contains("1.2.1") and reqs["accelerate"].specifier.contains("1.3.0")
    assert not reqs["datasets"].specifier.contains("2.15.0") and reqs["datasets"].specifier.contains("2.16.0")


def test_requires_python_is_truthful():
    spec = SpecifierSet(PYPROJECT["requires-python"])
    assert not spec.contains("3.10.14"), "mteb 2 (the [mteb] extra, in [dev]) and transformers 5.x need 3.11"
    assert spec.contains("3.11.7") and spec.contains("3.13.0")


def test_mteb_is_an_extra_included_in_dev():
    assert "mteb" not in _requirements()
    assert "mteb" in _requirements("mteb")
    dev = _requirements("dev")
    assert "mteb" in dev["st-hardneg"].extras


def test_cpu_constraints_file_pins_the_cpu_build():
    lines = [ln.strip() for ln in (REPO / "constraints" / "cpu.txt").read_text().splitlines()]
    reqs = [Requirement(ln) for ln in lines if ln and not ln.startswith("#")]
    assert [str(r) for r in reqs] == ["torch==2.13.0+cpu"]
    assert _requirements()["torch"].specifier.contains("2.13.0+cpu")


def test_install_commands_use_the_constraints_file():
    ci = (REPO / ".ci" / "run").read_text()
    assert '-c constraints/cpu.txt' in ci and "python -m pytest -q" in ci
    readme = (REPO / "README.md").read_text()
    setup = readme[readme.index("## Set-up"):].split("\n## ", 1)[0]
    installs = [ln for ln in setup.splitlines() if ln.startswith("pip install")]
    assert len(installs) == 2, installs
    assert all("-c constraints/cpu.txt" in ln for ln in installs), installs


def test_resolver_keeps_the_installed_torch():
    """pip's own resolver: installing the project changes nothing but the project (torch stays as installed)."""
    report = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-", "-e", str(REPO)],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert report.returncode == 0, report.stderr[-2000:]
    planned = {item["metadata"]["name"].lower() for item in json.loads(report.stdout)["install"]}
    assert planned == {"st-hardneg"}, planned
