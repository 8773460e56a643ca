"""The package's layering, read from its imports (ARCHITECTURE.md): every module imports only from its own layer or the
layers below it, the loss layer imports none of the data / evaluation / training / CLI / test-helper packages, no
import circle at import time, and at most 12 entries at the top level of ``st_hardneg/``."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "st_hardneg"

#: lowest first; a module belongs to the layer of its longest matching prefix
LAYERS: dict[str, int] = {
    "st_hardneg.validation": 0, "st_hardneg.reporting": 0,
    "st_hardneg.functional": 1, "st_hardneg.models": 1, "st_hardneg.plots": 1, "st_hardneg.data": 1,
    "st_hardneg.losses": 2,
    "st_hardneg.evaluation": 3,
    "st_hardneg.training": 4, "st_hardneg.testing": 4,
    "st_hardneg.cli": 5,
    "st_hardneg": 6,  # the top face (lazy names of the losses, __version__)
}
#: packages a module under the key may never import, whatever their layer
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "st_hardneg.losses": ("st_hardneg.data", "st_hardneg.evaluation", "st_hardneg.training", "st_hardneg.cli",
                          "st_hardneg.testing", "st_hardneg.models", "st_hardneg.plots", "st_hardneg.reporting"),
}
MAX_TOP_LEVEL = 12


@dataclass(frozen=True)
class Import:
    source: str  # importing module
    target: str  # imported module
    path: Path
    line: int
    at_import_time: bool  # module level, not inside a function or under `if TYPE_CHECKING:`

    def where(self) -> str:
        return f"{self.path}:{self.line} ({self.source} imports {self.target})"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def read_imports(root: Path) -> tuple[set[str], list[Import]]:
    """Every module under ``root`` and every import of a module of the package (``from pkg import sub`` resolves to
    the submodule when it exists)."""
    files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    modules = {module_name(p, root) for p in files}
    imports: list[Import] = []
    for path in files:
        tree = ast.parse(path.read_text(), filename=str(path))
        _collect(tree, True, module_name(path, root), path, modules, root.name, imports)
    return modules, imports


def _collect(node: ast.AST, at_import_time: bool, source: str, path: Path, modules: set[str], top: str,
             imports: list[Import]) -> None:
    for child in ast.iter_child_nodes(node):
        now = at_import_time and not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            continue  # annotations only: never executed
        if isinstance(child, ast.Import):
            imports.extend(Import(source, alias.name, path, child.lineno, now) for alias in child.names
                           if alias.name.split(".")[0] == top)
        elif isinstance(child, ast.ImportFrom):
            base = child.module or ""
            if child.level:  # relative: resolve against this module's package
                anchor = source.split(".") if path.name == "__init__.py" else source.split(".")[:-1]
                anchor = anchor[: len(anchor) - (child.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            if base.split(".")[0] == top:
                for alias in child.names:
                    candidate = f"{base}.{alias.name}"
                    imports.append(Import(source, candidate if candidate in modules else base, path, child.lineno,
                                          now))
        _collect(child, now, source, path, modules, top, imports)


def layer_of(module: str, layers: dict[str, int]) -> int:
    matches = [prefix for prefix in layers if module == prefix or module.startswith(prefix + ".")]
    if not matches:
        raise KeyError(f"{module} belongs to no layer: add it to LAYERS")
    return layers[max(matches, key=len)]


def upward_imports(imports: list[Import], layers: dict[str, int]) -> list[str]:
    return [imp.where() + f": layer {layer_of(imp.target, layers)} above layer {layer_of(imp.source, layers)}"
            for imp in imports if layer_of(imp.target, layers) > layer_of(imp.source, layers)]


def forbidden_imports(imports: list[Import], forbidden: dict[str, tuple[str, ...]]) -> list[str]:
    bad = []
    for imp in imports:
        for package, banned in forbidden.items():
            if imp.source == package or imp.source.startswith(package + "."):
                hit = [b for b in banned if imp.target == b or imp.target.startswith(b + ".")]
                if hit:
                    bad.append(imp.where() + f": {package} may not import {hit[0]}")
    return bad


def import_circles(imports: list[Import]) -> list[list[str]]:
    """Circles among the imports executed at import time (a package imports its ``__init__`` first, which counts)."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        if imp.at_import_time and imp.target != imp.source:
            graph.setdefault(imp.source, set()).add(imp.target)
    circles, state, stack = [], {}, []

    def walk(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                circles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                walk(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            walk(node)
    return circles


def test_every_module_has_a_layer():
    modules, _ = read_imports(PACKAGE)
    for module in modules:
        layer_of(module, LAYERS)


def test_no_import_runs_upward():
    _, imports = read_imports(PACKAGE)
    assert imports, "no import read: the reader is broken"
    assert upward_imports(imports, LAYERS) == []


def test_losses_import_nothing_from_the_layers_that_use_them():
    _, imports = read_imports(PACKAGE)
    assert forbidden_imports(imports, FORBIDDEN) == []


def test_no_import_circle():
    _, imports = read_imports(PACKAGE)
    assert import_circles(imports) == []


def test_top_level_has_at_most_12_entries():
    entries = sorted(p.name for p in PACKAGE.iterdir() if p.name not in ("__pycache__", "py.typed"))
    assert len(entries) <= MAX_TOP_LEVEL, entries


def test_the_checks_fail_on_a_bad_package(tmp_path):
    """The checker itself: an upward import, a forbidden one and a circle in a synthetic package are all reported,
    with file and line; imports inside functions count for the layer rule but not for circles."""
    root = tmp_path / "pkg"
    (root / "low").mkdir(parents=True)
    (root / "high").mkdir()
    (root / "__init__.py").write_text("")
    (root / "low" / "__init__.py").write_text("")
    (root / "high" / "__init__.py").write_text("")
    (root / "low" / "a.py").write_text("import os\nfrom pkg.low import b\n\n\ndef f():\n    from pkg.high import c\n")
    (root / "low" / "b.py").write_text("from pkg.low.a import f\n")
    (root / "high" / "c.py").write_text("from ..low import a\nfrom typing import TYPE_CHECKING\n"
                                        "if TYPE_CHECKING:\n    from pkg.high import d\n")
    (root / "high" / "d.py").write_text("from pkg.high import c\n")
    layers = {"pkg": 2, "pkg.low": 0, "pkg.high": 1}
    modules, imports = read_imports(root)
    assert modules == {"pkg", "pkg.low", "pkg.high", "pkg.low.a", "pkg.low.b", "pkg.high.c", "pkg.high.d"}
    up = upward_imports(imports, layers)
    assert len(up) == 1 and "a.py:6 (pkg.low.a imports pkg.high.c)" in up[0]
    forbidden = forbidden_imports(imports, {"pkg.low": ("pkg.high",)})
    assert len(forbidden) == 1 and forbidden[0].endswith("a.py:6 (pkg.low.a imports pkg.high.c): pkg.low may not "
                                                         "import pkg.high")
    circles = import_circles(imports)
    assert circles == [["pkg.low.a", "pkg.low.b", "pkg.low.a"]]  # c -> d only under TYPE_CHECKING: no circle
    assert any(imp.target == "pkg.low.a" and imp.source == "pkg.high.c" for imp in imports)  # relative import read
    with pytest.raises(KeyError, match="no layer"):
        layer_of("other.module", layers)
