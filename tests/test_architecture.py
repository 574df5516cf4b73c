"""The package's layering, checked on the source: dependencies point one way

    core (pap, robust_pca, layers, io, plotting, machine, checks)
      -> models, data -> train, robustness, kpca, segmentation -> report -> studies -> cli

A module imports only from its own layer or lower ones (imports inside functions count), nothing
outside ``cli`` imports ``cli``, nothing outside ``studies``/``cli`` imports ``studies``, no module
imports a private name (``_x``) of another module, and the module import graph has no cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "kpca_attention"

LAYERS: dict[str, int] = {
    "pap": 0, "robust_pca": 0, "layers": 0, "io": 0, "plotting": 0, "machine": 0, "checks": 0,
    "models": 1, "data": 1,
    "train": 2, "robustness": 2, "kpca": 2, "segmentation": 2,
    "report": 3,
    "studies": 4,
    "cli": 5,
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[str, list[str], int]]:
    """``(imported module relative to kpca_attention, imported names, line)`` for every import of
    the package in ``path`` (function-local ones included)."""
    mod = _module_name(path)
    pkg = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - (node.level - 1)] if node.level > 1 else pkg
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            elif node.module and node.module.startswith("kpca_attention"):
                target = node.module.removeprefix("kpca_attention").lstrip(".")
            else:
                continue
            out.append((target, [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("kpca_attention."):
                    out.append((a.name.removeprefix("kpca_attention."), [], node.lineno))
    return out


def _layer(mod: str) -> int | None:
    return LAYERS.get(mod.split(".")[0]) if mod else None


MODULES = {_module_name(p): p for p in SRC.rglob("*.py") if p.name != "__main__.py"}


def test_every_top_level_module_has_a_layer() -> None:
    tops = {m.split(".")[0] for m in MODULES if m}
    assert tops <= set(LAYERS), f"modules without a layer: {sorted(tops - set(LAYERS))}"


def test_dependencies_point_one_way() -> None:
    bad = []
    for mod, path in MODULES.items():
        if not mod:  # the package root re-exports the public API
            continue
        me = _layer(mod)
        for target, _names, line in _imports(path):
            if not target:
                continue
            other = _layer(target)
            if other is not None and me is not None and other > me:
                bad.append(f"{mod}:{line} imports {target} (layer {other} > {me})")
    assert not bad, "\n".join(bad)


def test_no_private_names_across_modules() -> None:
    bad = []
    for mod, path in MODULES.items():
        for target, names, line in _imports(path):
            for n in names:
                if n.startswith("_") and not n.startswith("__") and target != mod:
                    bad.append(f"{mod}:{line} imports {target}.{n}")
    assert not bad, "\n".join(bad)


def _resolve(target: str, names: list[str]) -> list[str]:
    """The package modules an import statement depends on (``from .x import y`` may import module y)."""
    found = []
    for n in names:
        if f"{target}.{n}" in MODULES:
            found.append(f"{target}.{n}")
    if target in MODULES and (len(found) < len(names) or not names):
        found.append(target)
    return found


def test_no_import_cycles() -> None:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for mod, path in MODULES.items():
        for target, names, _ in _imports(path):
            for dep in _resolve(target, names):
                if dep != mod and not mod.startswith(dep + ".") and dep:  # a package's __init__ is its parent
                    graph[mod].add(dep)
    color: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        color[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if color.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in color:
                cyc = visit(d)
                if cyc:
                    return cyc
        stack.pop()
        color[m] = 2
        return None

    for m in sorted(graph):
        if m and m not in color:
            cyc = visit(m)
            assert cyc is None, "import cycle: " + " -> ".join(cyc)


@pytest.mark.parametrize("name", ["demo", "ablations", "ablation_report", "pap_trace"])
def test_old_pipeline_modules_are_gone(name: str) -> None:
    assert not (SRC / f"{name}.py").exists()
