"""The package's layering, checked on the source: dependencies point one way.

The layers, bottom to top, are the one table ``LAYERS`` below (it follows
``../shared/docs/house-plan.md``). :func:`check` reads a source tree with :mod:`ast` only (nothing is
imported) and returns every violation of these rules:

- ``unassigned``: a module that belongs to no layer;
- ``upward``: a module imports a module of a higher layer (module-level or inside a function; also
  through ``importlib.import_module`` / ``__import__`` with a constant name);
- ``root``: a module imports the package root: ``import kpca_attention``, ``from kpca_attention
  import x``, ``from .. import x`` that resolves to the root, ``from . import x`` in a top-level
  module, ``import_module("kpca_attention")``. The root's ``__init__`` re-exports the public API and
  rebinds names (``kpca_attention.pap`` is the function, not the module), so the package itself
  imports the module that defines a name: ``from ..pap import pap_mu``;
- ``private``: a private name (``_x``) imported from another module, or a private module imported
  from outside its top-level package;
- ``module-cycle`` / ``package-cycle``: a cycle in the graph of modules, or in the graph of top-level
  packages (``train -> robustness -> train`` is a cycle even when no two modules form one).

Each rule has a test below that plants one violation in a temporary copy of the tree and sees it
caught, so a rule that silently stops working fails here too."""

from __future__ import annotations

import ast
import functools
import itertools
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

# The layers, bottom to top (dict order is the order). A module belongs to the entry that names the
# longest dotted prefix of its name relative to ``kpca_attention`` ("robustness" holds
# ``robustness.store``; a dotted entry such as "robustness.run" would move that one module). An
# entry that matches no module is simply not seen, so a package may be listed before it lands.
LAYERS: dict[str, tuple[str, ...]] = {
    "core": (
        "pap", "robust_pca", "io", "checks", "plotting", "machine", "modules",
        "stats", "tables", "format", "formatting",  # low-level tables/format/stats, whichever lands
    ),
    "attention": ("attention", "layers"),  # layers.py until attention/ replaces it
    "models, data": ("models", "data"),
    "robustness primitives": ("robustness", "segmentation"),
    "tasks": ("tasks",),
    "train": ("train",),
    "kpca": ("kpca",),
    "report": ("report",),
    "studies": ("studies",),
    "cli": ("cli",),
}

# The brief's rule: ``from .. import tasks`` is an import of the root even though ``tasks`` is a
# submodule (Python takes the root's attribute first, and the root rebinds names: ``pap`` once was the
# function). True allows that form for a submodule that the root's __init__ does not rebind.
ROOT_FORM_FOR_SUBMODULES = False

PACKAGE = "kpca_attention"
SRC = Path(__file__).resolve().parents[1] / "src" / PACKAGE
MAX_LINES = 600


# ---------------------------------------------------------------------------------------------------
# The checker: a function of a source root, so the tests below can run it on a planted copy.


@dataclass(frozen=True, order=True)
class Violation:
    kind: str
    where: str  # "kpca_attention/robustness/run.py:67"
    text: str

    def __str__(self) -> str:
        return f"[{self.kind}] {self.where}: {self.text}"


@dataclass(frozen=True)
class Import:
    """One dependency of module ``mod`` on ``dep`` (both relative to the package; "" is the root)."""

    mod: str
    dep: str
    line: int
    via_root: bool  # written as an import of the root (``from .. import x``, ``import kpca_attention``)
    names: tuple[str, ...]  # names taken from ``dep`` (empty: the module itself)
    how: str  # the statement, for messages


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def find_modules(root: Path) -> dict[str, Path]:
    return {module_name(root, p): p for p in sorted(root.rglob("*.py"))}


def layer_index(mod: str, layers: dict[str, tuple[str, ...]] = LAYERS) -> int | None:
    """The position of ``mod``'s layer in ``layers`` (longest matching dotted prefix); None: none."""
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for i, names in enumerate(layers.values()):
        for name in names:
            if mod == name or mod.startswith(name + "."):
                n = name.count(".") + 1
                if best is None or n > best[0]:
                    best = (n, i)
    return None if best is None else best[1]


def _is_module(name: str, modules: dict[str, Path]) -> bool:
    return name in modules or any(m.startswith(name + ".") for m in modules)  # namespace packages too


def _const_str(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _dynamic_import(node: ast.Call, package: list[str]) -> str | None:
    """The absolute name a constant ``importlib.import_module(...)`` / ``__import__(...)`` imports."""
    fname = _call_name(node)
    if fname not in ("import_module", "__import__") or not node.args:
        return None
    name = _const_str(node.args[0])
    if name is None:
        return None
    if fname == "__import__":
        level = next((k.value for k in node.keywords if k.arg == "level"), None)
        level = node.args[4] if len(node.args) > 4 else level
        if isinstance(level, ast.Constant) and level.value:
            return None  # a relative __import__: not worth supporting, nobody writes it
        return name
    if not name.startswith("."):
        return name
    pkg_node = node.args[1] if len(node.args) > 1 else next(
        (k.value for k in node.keywords if k.arg == "package"), None)
    if isinstance(pkg_node, ast.Name) and pkg_node.id == "__package__":
        anchor = ".".join([PACKAGE, *package])
    else:
        anchor = _const_str(pkg_node)
        if anchor is None:
            return None
    level = len(name) - len(name.lstrip("."))
    base = anchor.split(".")
    base = base[: len(base) - (level - 1)] if level > 1 else base
    rest = name.lstrip(".")
    return ".".join([*base, *([rest] if rest else [])])


def _call_name(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


@functools.cache
def _import_nodes(text: str) -> tuple[ast.AST, ...]:
    """The import statements and ``import_module`` / ``__import__`` calls of a module's source, in
    ``ast.walk`` order. Cached by the text: a planted copy of the tree differs from the real one in a
    file or two, so each check parses only those (the nodes are read, never changed)."""
    return tuple(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ImportFrom | ast.Import)
                 or (isinstance(n, ast.Call) and _call_name(n) in ("import_module", "__import__")))


def rebound_by_root(root: Path) -> set[str]:
    """Names the root's ``__init__`` binds to something other than its own submodule."""
    init = root / "__init__.py"
    out: set[str] = set()
    if not init.is_file():
        return out
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.ImportFrom) and not (node.level == 1 and node.module is None):
            out.update((a.asname or a.name) for a in node.names)
        elif isinstance(node, ast.Import):
            out.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                out.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
    return out


def find_imports(root: Path, modules: dict[str, Path] | None = None) -> list[Import]:
    """Every dependency inside the package, function-local and ``importlib`` ones included."""
    modules = find_modules(root) if modules is None else modules
    rebound = rebound_by_root(root)
    out: list[Import] = []
    for mod, path in modules.items():
        package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        if not mod:
            package = []
        text = path.read_text()
        try:
            nodes = _import_nodes(text)
        except SyntaxError:
            ast.parse(text, filename=str(path))  # the same error, naming the file
            raise
        for node in nodes:
            line = getattr(node, "lineno", 0)
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    if node.level - 1 > len(package):
                        continue  # beyond the top: Python rejects it anyway
                    base = package[: len(package) - (node.level - 1)]
                    target = ".".join([*base, *(node.module.split(".") if node.module else [])])
                elif node.module == PACKAGE or (node.module or "").startswith(PACKAGE + "."):
                    target = node.module.removeprefix(PACKAGE).lstrip(".")
                else:
                    continue
                how = ast.unparse(node)
                via_root = target == ""
                attrs = []
                for alias in node.names:
                    sub = f"{target}.{alias.name}" if target else alias.name
                    if alias.name != "*" and _is_module(sub, modules):
                        sub_root = via_root and (not ROOT_FORM_FOR_SUBMODULES or alias.name in rebound)
                        out.append(Import(mod, sub, line, sub_root, (), how))
                    else:
                        attrs.append(alias.name)
                if attrs or not node.names:
                    out.append(Import(mod, target, line, via_root, tuple(attrs), how))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                        target = alias.name.removeprefix(PACKAGE).lstrip(".")
                        out.append(Import(mod, target, line, target == "", (), ast.unparse(node)))
            elif isinstance(node, ast.Call):
                name = _dynamic_import(node, package)
                if name is not None and (name == PACKAGE or name.startswith(PACKAGE + ".")):
                    target = name.removeprefix(PACKAGE).lstrip(".")
                    out.append(Import(mod, target, line, target == "", (), ast.unparse(node)))
    return out


def _where(root: Path, modules: dict[str, Path], imp: Import) -> str:
    return f"{root.name}/{modules[imp.mod].relative_to(root).as_posix()}:{imp.line}"


def _top(mod: str) -> str:
    return mod.split(".")[0]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One shortest cycle through each strongly connected component with more than one node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    comps: list[set[str]] = []

    def strong(v: str) -> None:  # Tarjan; the graphs here are small, recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            comps.append(comp)

    for v in sorted(graph):
        if v not in index:
            strong(v)
    cycles = []
    for comp in comps:
        if len(comp) < 2:
            continue
        start = min(comp)
        prev: dict[str, str] = {}
        frontier = [start]
        while frontier and start not in prev:  # breadth-first back to start, inside the component
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & comp):
                    if w not in prev:
                        prev[w] = v
                        nxt.append(w)
            frontier = nxt
        path = [start]
        while len(path) == 1 or path[-1] != start:
            path.append(prev[path[-1]])
        cycles.append(path[::-1])
    return sorted(cycles)


def check(root: Path, layers: dict[str, tuple[str, ...]] = LAYERS) -> list[Violation]:
    """Every violation of the module docstring's rules in the package whose source is ``root``."""
    modules = find_modules(root)
    imports = find_imports(root, modules)
    names = list(layers)
    found: list[Violation] = []

    def add(kind: str, imp: Import, text: str) -> None:
        found.append(Violation(kind, _where(root, modules, imp), text))

    for mod, path in modules.items():
        if mod and layer_index(mod, layers) is None:
            found.append(Violation("unassigned", f"{root.name}/{path.relative_to(root).as_posix()}:1",
                                   f"module {mod} belongs to no layer of LAYERS"))

    for imp in imports:
        if not imp.mod:
            continue  # the root re-exports the public API: it may import anything
        if imp.via_root:
            add("root", imp, f"`{imp.how}` imports the package root; import the module that defines it")
        me, other = layer_index(imp.mod, layers), layer_index(imp.dep, layers)
        if me is not None and other is not None and other > me:
            add("upward", imp, f"{imp.mod} ({names[me]}) imports {imp.dep} ({names[other]}, a higher "
                               f"layer): `{imp.how}`")
        for n in imp.names:
            if n.startswith("_") and not n.startswith("__") and imp.dep != imp.mod:
                add("private", imp, f"{imp.mod} imports the private name {imp.dep or PACKAGE}.{n}")
        last = imp.dep.rsplit(".", 1)[-1]
        if last.startswith("_") and not last.startswith("__") and _top(imp.dep) != _top(imp.mod):
            add("private", imp, f"{imp.mod} imports {imp.dep}, private to package {_top(imp.dep)}")

    # Modules: a module's dependency on its own parent package (``from . import helper`` in
    # ``cli/studies.py``) is how a package's __init__ shares helpers, so it is left out.
    graph: dict[str, set[str]] = {m: set() for m in modules if m}
    for imp in imports:
        dep = imp.dep
        if imp.mod and dep and dep != imp.mod and not imp.mod.startswith(dep + ".") and dep in modules:
            graph[imp.mod].add(dep)
    for cyc in _cycles(graph):
        first = next(i for i in imports if i.mod == cyc[0] and i.dep == cyc[1])
        add("module-cycle", first, "import cycle between modules: " + " -> ".join(cyc))

    # Packages: the top-level names (``train``, ``robustness``, ``pap``); the root is left out.
    pgraph: dict[str, set[str]] = {}
    for imp in imports:
        a, b = _top(imp.mod), _top(imp.dep)
        if imp.mod and imp.dep and a != b:
            pgraph.setdefault(a, set()).add(b)
            pgraph.setdefault(b, set())
    for cyc in _cycles(pgraph):
        evidence = []
        for a, b in itertools.pairwise(cyc):
            imp = min((i for i in imports if i.mod and i.dep and _top(i.mod) == a and _top(i.dep) == b),
                      key=lambda i: (i.mod, i.line))
            evidence.append(f"{a} -> {b} at {_where(root, modules, imp)} (`{imp.how}`)")
        first = min((i for i in imports if i.mod and i.dep and _top(i.mod) == cyc[0]
                     and _top(i.dep) == cyc[1]), key=lambda i: (i.mod, i.line))
        add("package-cycle", first, "import cycle between packages: " + " -> ".join(cyc) + "; "
            + "; ".join(evidence))
    return sorted(set(found), key=_order)


def _order(v: Violation) -> tuple[str, str, int, str]:
    file, line = v.where.rsplit(":", 1)
    return v.kind, file, int(line), v.text


def long_modules(root: Path, limit: int = MAX_LINES) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        n = len(path.read_text().splitlines())
        if n > limit:
            out.append(f"{root.name}/{path.relative_to(root).as_posix()}: {n} lines")
    return out


# ---------------------------------------------------------------------------------------------------
# The real tree.


@pytest.fixture(scope="module")
def real() -> list[Violation]:
    return check(SRC)


def _of(violations: list[Violation], kind: str) -> str:
    return "\n".join(str(v) for v in violations if v.kind == kind)


def test_every_module_has_a_layer(real: list[Violation]) -> None:
    assert not _of(real, "unassigned"), _of(real, "unassigned")


def test_dependencies_point_one_way(real: list[Violation]) -> None:
    assert not _of(real, "upward"), _of(real, "upward")


def test_no_import_of_the_package_root(real: list[Violation]) -> None:
    assert not _of(real, "root"), _of(real, "root")


def test_no_private_names_across_modules(real: list[Violation]) -> None:
    assert not _of(real, "private"), _of(real, "private")


def test_no_import_cycles(real: list[Violation]) -> None:
    assert not _of(real, "module-cycle"), _of(real, "module-cycle")


def test_no_import_cycles_between_packages(real: list[Violation]) -> None:
    assert not _of(real, "package-cycle"), _of(real, "package-cycle")


def test_no_module_over_the_line_limit() -> None:
    too_long = long_modules(SRC.parent)
    assert not too_long, f"modules over {MAX_LINES} lines:\n" + "\n".join(too_long)


@pytest.mark.parametrize("name", ["demo", "ablations", "ablation_report", "pap_trace"])
def test_old_pipeline_modules_are_gone(name: str) -> None:
    assert not (SRC / f"{name}.py").exists()


# ---------------------------------------------------------------------------------------------------
# Planted violations: each rule catches one line added to a copy of the real tree.


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    dst = tmp_path / PACKAGE  # the sources only: the checker reads .py files (the built kernels are 34 MB)
    shutil.copytree(SRC, dst, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd"))
    return dst


def _module_in(root: Path, *candidates: str) -> Path:
    """The file of the first candidate (a dotted module, or a package: its first plain module)."""
    for cand in candidates:
        parts = cand.split(".")
        if (root.joinpath(*parts[:-1]) / f"{parts[-1]}.py").is_file():
            return root.joinpath(*parts[:-1]) / f"{parts[-1]}.py"
        pkg = root.joinpath(*parts)
        if pkg.is_dir():
            files = sorted(p for p in pkg.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
            if files:
                return files[0]
    raise AssertionError(f"none of {candidates} exists under {root}")


def _plant(path: Path, code: str) -> int:
    """Append ``code`` to ``path``; the line number of its line marked ``# <-`` (else its last)."""
    text = path.read_text()
    if not text.endswith("\n"):
        text += "\n"
    start = len(text.splitlines()) + 2
    lines = code.rstrip("\n").splitlines()
    mark = next((i for i, line in enumerate(lines) if line.endswith("# <-")), len(lines) - 1)
    path.write_text(text + "\n" + "\n".join(lines) + "\n")
    return start + mark


def _caught(root: Path, before: list[Violation], path: Path, line: int, kind: str) -> Violation:
    new = [v for v in check(root) if v not in before]
    where = f"{root.name}/{path.relative_to(root).as_posix()}:{line}"
    hits = [v for v in new if v.kind == kind and v.where == where]
    assert hits, f"no {kind} violation at {where}; new violations: {[str(v) for v in new]}"
    return hits[0]


IMPORTLIB = "def planted():\n    import importlib\n\n    return importlib.import_module"
UPWARD_PLANTS = [
    # (module to plant in: the first that exists, code; its line marked "# <-", else its last)
    (("robustness.run", "robustness"), "from .. import studies"),
    (("robustness.store", "robustness"), "from ..train import config as _cfg"),
    (("models.vit", "models"), "from kpca_attention import cli"),
    (("models.vit", "models"), "import kpca_attention.report"),
    (("data.images", "data"), "def planted():\n    from ..train.rundir import RunDir  # <-\n    return 1"),
    (("pap", "checks"), IMPORTLIB + "('kpca_attention.cli')"),
    (("io",), IMPORTLIB + "('.cli', package=__package__)"),
    (("checks",), "def planted():\n    from importlib import import_module\n\n"
                  "    return import_module('.cli', 'kpca_attention')"),
    (("io",), "def planted():\n    return __import__('kpca_attention.studies.engine')"),
]


@pytest.mark.parametrize(("where", "code"), UPWARD_PLANTS)
def test_planted_upward_import_is_caught(tree: Path, where: tuple[str, ...], code: str) -> None:
    path = _module_in(tree, *where)
    before = check(tree)
    line = _plant(path, code)
    _caught(tree, before, path, line, "upward")


ROOT_PLANTS = [
    (("models.vit", "models"), "import kpca_attention"),
    (("models.vit", "models"), "from kpca_attention import replace_attention"),
    (("train.resolve", "train"), "from .. import pap"),  # the root rebinds pap to the function
    (("report.tables", "report"), "def planted():\n    from .. import __version__  # <-\n    return 1"),
    (("checks",), IMPORTLIB + "('kpca_attention')"),
]
# Submodules the root does not rebind: imports of the root only under the strict rule.
ROOT_FORM_PLANTS = [
    (("robustness.run", "robustness"), "from .. import studies"),
    (("io",), "from . import checks"),
    (("train.loop", "train"), "from kpca_attention import data"),
]


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "submodules-allowed"])
@pytest.mark.parametrize(("where", "code"), ROOT_PLANTS + ROOT_FORM_PLANTS)
def test_planted_import_of_the_root_is_caught(
    tree: Path, monkeypatch: pytest.MonkeyPatch, strict: bool, where: tuple[str, ...], code: str
) -> None:
    """Under either setting of ``ROOT_FORM_FOR_SUBMODULES``; relaxed, only ``from .. import x`` of a
    submodule x that the root does not rebind goes through."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT_FORM_FOR_SUBMODULES", not strict)
    path = _module_in(tree, *where)
    before = check(tree)
    line = _plant(path, code)
    if strict or (where, code) in ROOT_PLANTS:
        _caught(tree, before, path, line, "root")
    else:
        at = f"{PACKAGE}/{path.relative_to(tree).as_posix()}:{line}"
        assert not [v for v in check(tree) if v not in before and v.kind == "root" and v.where == at]


def test_the_root_may_import_its_modules(tree: Path) -> None:
    before = check(tree)
    _plant(tree / "__init__.py", "from . import cli, studies")
    assert [v for v in check(tree) if v not in before] == []


def test_planted_private_names_are_caught(tree: Path) -> None:
    path = _module_in(tree, "report.stats", "report")
    before = check(tree)
    line = _plant(path, "from ..checks import _planted_private")
    v = _caught(tree, before, path, line, "private")
    assert "checks._planted_private" in v.text
    (tree / "robustness" / "_planted.py").write_text("X = 1\n")
    user = _module_in(tree, "train.config", "train")
    before = check(tree)
    line = _plant(user, "from ..robustness import _planted")
    v = _caught(tree, before, user, line, "private")
    assert "robustness._planted, private to package robustness" in v.text


def test_a_private_module_inside_its_own_package_is_fine(tree: Path) -> None:
    pkg = tree / "robustness"
    (pkg / "_planted.py").write_text("Y = 1\n")
    before = check(tree)
    store = _module_in(tree, "robustness.store", "robustness")
    _plant(store, "from . import _planted\nfrom ._planted import Y")
    assert [v for v in check(tree) if v not in before] == []


def test_planted_module_cycle_is_caught(tree: Path) -> None:
    a = _module_in(tree, "data.text", "data")
    b = _module_in(tree, "data.images", "data")
    assert a != b
    before = check(tree)
    _plant(a, f"from . import {b.stem}")
    _plant(b, f"from . import {a.stem}")
    new = [v for v in check(tree) if v not in before]
    assert any(v.kind == "module-cycle" and f"data.{a.stem}" in v.text and f"data.{b.stem}" in v.text
               for v in new), [str(v) for v in new]


def _reaches(graph: dict[str, set[str]], a: str, b: str) -> bool:
    seen, todo = {a}, [a]
    while todo:
        for w in graph.get(todo.pop(), ()):
            if w == b:
                return True
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return False


def test_planted_package_cycle_is_caught(tree: Path) -> None:
    """``tasks -> train`` where ``train -> tasks`` (or, before tasks/ lands, the reverse of another
    edge between two packages, closest in layer, not in a cycle yet): named with its import lines."""
    graph: dict[str, set[str]] = {}
    for i in find_imports(tree):
        if i.mod and i.dep and _top(i.mod) != _top(i.dep):
            graph.setdefault(_top(i.mod), set()).add(_top(i.dep))
    fresh = sorted((a, b) for a in graph for b in graph[a] if not _reaches(graph, b, a))
    assert fresh, "no edge between packages that is not in a cycle already"
    high, low = ("train", "tasks") if ("train", "tasks") in fresh else min(
        fresh, key=lambda e: abs((layer_index(e[0]) or 0) - (layer_index(e[1]) or 0)))
    path = _module_in(tree, low)
    before = check(tree)
    line = _plant(path, f"import {PACKAGE}.{high}")
    where = f"{PACKAGE}/{path.relative_to(tree).as_posix()}:{line}"
    new = [v for v in check(tree) if v not in before and v.kind == "package-cycle"]
    assert any(where in v.text and f"{low} -> {high}" in v.text for v in new), (where, [str(v) for v in new])


def test_package_cycle_without_a_module_cycle_or_upward_import(tmp_path: Path) -> None:
    """The rule the module graph misses: ``a.x -> b.y`` and ``b.z -> a.w`` form no cycle between
    modules, all four in one layer, yet the packages ``a`` and ``b`` depend on each other."""
    root = tmp_path / PACKAGE
    for rel, text in {
        "__init__.py": "",
        "a/__init__.py": "", "a/x.py": "from ..b import y\n", "a/w.py": "W = 1\n",
        "b/__init__.py": "", "b/y.py": "Y = 1\n", "b/z.py": "from ..a.w import W\n",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    found = check(root, {"one": ("a", "b")})
    assert [v.kind for v in found] == ["package-cycle"], [str(v) for v in found]
    assert "a -> b -> a" in found[0].text
    assert "a/x.py:1" in found[0].text and "b/z.py:1" in found[0].text
    (root / "b/z.py").write_text("W = 2\n")
    assert check(root, {"one": ("a", "b")}) == []


def test_planted_unassigned_module_is_caught(tree: Path) -> None:
    (tree / "planted_misc.py").write_text("X = 1\n")
    (tree / "planted_pkg").mkdir()
    (tree / "planted_pkg" / "__init__.py").write_text("")
    found = [str(v) for v in check(tree) if v.kind == "unassigned"]
    assert any("module planted_misc " in v for v in found), found
    assert any("module planted_pkg " in v for v in found), found


def test_layer_lookup_takes_the_longest_prefix() -> None:
    layers = {"low": ("robustness",), "mid": ("models",), "high": ("robustness.run", "trainx")}
    assert layer_index("robustness.store", layers) == 0
    assert layer_index("robustness", layers) == 0
    assert layer_index("robustness.run", layers) == 2
    assert layer_index("robustness.runner", layers) == 0
    assert layer_index("train", layers) is None
    assert layer_index("", layers) is None


def test_planted_long_module_is_caught(tree: Path) -> None:
    before = long_modules(tree)
    path = _module_in(tree, "machine", "io")
    path.write_text(path.read_text() + "\n" * (MAX_LINES + 1))
    new = [line for line in long_modules(tree) if line not in before]
    n = len(path.read_text().splitlines())
    assert n > MAX_LINES
    assert new == [f"{PACKAGE}/{path.relative_to(tree).as_posix()}: {n} lines"], new
