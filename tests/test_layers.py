"""Import direction: a lower layer never imports a higher one (docs/architecture-notes.md).

Every module of the package is parsed (``ast``) and each ``import`` of a
quantem_flow module, at module level or inside a function, is checked
against the layer table below.  Imports under ``if TYPE_CHECKING:`` are
annotations only (no run-time dependency) and are not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "quantem_flow"

#: Layers, low to high; a module may import its own layer and those below.
LAYERS = (
    "foundation",
    "representations",
    "runtimes",
    "runtimes.external",
    "io",
    "dataset",
    "operators",
    "graphs",
    "testing",
    "front",
)
RANK = {name: i for i, name in enumerate(LAYERS)}
FOUNDATION = (
    "errors",
    "config",
    "calibration",
    "provenance",
    "results",
    "result_math",
    "html_repr",
    "plugins",
)
FRONT = (
    "__init__",
    "__main__",
    "cli",
    "pipeline",
    "synthetic",
    "synthetic_wave",
    "convert",
    "bench",
    "plotting",
    "explorer",
    "streams",
)


def layer_of(module: str) -> str:
    """The layer of ``quantem_flow.<...>``."""
    parts = module.split(".")
    assert parts[0] == "quantem_flow", module
    if len(parts) == 1:
        return "front"
    top = parts[1]
    if top in FOUNDATION:
        return "foundation"
    if top == "runtimes" and len(parts) > 2 and parts[2] == "external":
        return "runtimes.external"
    if top in ("representations", "runtimes", "io", "dataset", "operators", "graphs", "testing"):
        return top
    if top in FRONT:
        return "front"
    raise AssertionError(
        f"module {module} is in no layer: add it to the table in tests/test_layers.py and "
        "docs/architecture-notes.md"
    )


def _module_name(path: Path, root: Path = PACKAGE.parent) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.attr if isinstance(test, ast.Attribute) else getattr(test, "id", "")
            if name == "TYPE_CHECKING":
                for child in node.body:
                    skip.update(id(n) for n in ast.walk(child))
    return skip


def imports_of(path: Path, root: Path = PACKAGE.parent) -> list[tuple[int, str]]:
    """``(line, imported quantem_flow module or attribute path)`` of a source file."""
    module = _module_name(path, root)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text(), filename=str(path))
    typing_only = _type_checking_nodes(tree)
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out += [
                (node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "quantem_flow"
            ]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "quantem_flow":
                continue
            if (
                node.module is None
            ):  # from .. import x: x is a submodule, or the package's attribute
                for a in node.names:
                    sub = root.joinpath(*target.split("."), a.name)
                    is_module = sub.with_suffix(".py").exists() or (sub / "__init__.py").exists()
                    out.append((node.lineno, f"{target}.{a.name}" if is_module else target))
            else:
                out.append((node.lineno, target))
    return out


def _sources(package: Path = PACKAGE) -> list[Path]:
    return sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)


def violations(package: Path = PACKAGE) -> list[str]:
    """Every import that goes up the layer table, in the package at ``package``."""
    found = []
    for path in _sources(package):
        module = _module_name(path, package.parent)
        own = layer_of(module)
        for line, target in imports_of(path, package.parent):
            other = layer_of(target)
            upward = RANK[other] > RANK[own]
            # runtimes.external is a plug-in of the runtime layer: it may import the
            # runtimes, but the built-in runtimes never import it
            if own == "runtimes" and other == "runtimes.external":
                upward = True
            # test support is imported by tests only
            if other == "testing" and own != "testing":
                upward = True
            if upward:
                rel = path.relative_to(package.parent)
                found.append(f"{rel}:{line}: {own} imports {other} ({target})")
    return found


def test_lower_layers_never_import_higher_ones() -> None:
    bad = violations()
    assert not bad, "imports against the layer table:\n" + "\n".join(bad)


def test_every_module_has_a_layer() -> None:
    layers = {layer_of(_module_name(p)) for p in _sources()}
    assert layers <= set(LAYERS)
    assert {"foundation", "representations", "runtimes", "graphs", "front"} <= layers


def test_the_checker_sees_function_level_and_relative_imports(tmp_path: Path) -> None:
    package = tmp_path / "quantem_flow"
    for folder in ("representations", "graphs", "operators"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    for module in ("__init__", "errors", "dataset", "representations/base"):
        (package / f"{module}.py").write_text("")
    (package / "representations" / "__init__.py").write_text("from .. import errors\n")
    probe = package / "representations" / "probe.py"
    probe.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from ..dataset import Dataset4D\n"
        "def f():\n"
        "    from ..dataset import binned_dtype\n"
        "    from .. import graphs\n"
        "    import quantem_flow.operators\n"
        "    from . import base\n"
    )
    assert sorted(imports_of(probe, tmp_path)) == [
        (5, "quantem_flow.dataset"),
        (6, "quantem_flow.graphs"),
        (7, "quantem_flow.operators"),
        (8, "quantem_flow.representations.base"),
    ]
    bad = violations(package)
    assert len(bad) == 3, bad
    assert all("representations/probe.py" in v for v in bad)
    assert "representations imports dataset" in " ".join(bad)


@pytest.mark.parametrize(
    ("module", "layer"),
    [
        ("quantem_flow.errors", "foundation"),
        ("quantem_flow.representations.detector_ops", "representations"),
        ("quantem_flow.runtimes.registry", "runtimes"),
        ("quantem_flow.runtimes.external.bridge", "runtimes.external"),
        ("quantem_flow.testing.runtime_conformance", "testing"),
        ("quantem_flow.plotting", "front"),
        ("quantem_flow", "front"),
    ],
)
def test_layer_table(module: str, layer: str) -> None:
    assert layer_of(module) == layer
