"""No dispatch on the task's name outside ``tasks/``: the training loop, the study engine, the report
and the CLI ask the task object, they do not compare ``cfg.task == "vision"``.

:func:`find_dispatch` reads a source tree with :mod:`ast` and returns every comparison of a name or
attribute on the task axis (``task``, ``modality``, and ``kind`` against a task's word) with string
constants: ``==``, ``!=``, ``in``/``not in`` a literal of strings, ``match ...: case "lm":``, and a dict
literal keyed by strings indexed by it (``{"vision": f, "lm": g}[cfg.task]``)."""

from __future__ import annotations

import ast
import itertools
import shutil
from pathlib import Path

import pytest

PACKAGE = "kpca_attention"
SRC = Path(__file__).resolve().parents[1] / "src" / PACKAGE
ALLOWED = ("tasks",)  # packages (relative to the source root) where a task may name itself

# Any string compared with these is a task name.
TASK_AXIS = {"task", "tasks", "task_name", "task_kind", "modality"}
# ``kind`` is also the name of other axes (a null model's "perm"/"gauss", a capture site's "timm"):
# it counts when the string is one of the task vocabulary's words.
KIND_AXIS = {"kind", "suite_kind"}
TASK_WORDS = {
    "vision", "image", "images", "classification", "image_classification",
    "lm", "text", "language", "causal_lm", "language_modelling", "language_modeling",
    "segmentation", "seg", "semantic_segmentation", "token_classification",
}


def _axis(node: ast.AST) -> str | None:
    """The task-axis word a name / attribute chain ends in or passes through (``cfg.task.name``)."""
    while isinstance(node, ast.Attribute | ast.Name):
        word = node.attr if isinstance(node, ast.Attribute) else node.id
        if word in TASK_AXIS or word in KIND_AXIS:
            return word
        if isinstance(node, ast.Name):
            return None
        node = node.value
    return None


def _strings(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def _dispatches(word: str, strings: list[str]) -> bool:
    return bool(strings) and (word in TASK_AXIS or any(s in TASK_WORDS for s in strings))


def _patterns(p: ast.pattern) -> list[str]:
    if isinstance(p, ast.MatchValue):
        return _strings(p.value)
    if isinstance(p, ast.MatchOr):
        return [s for q in p.patterns for s in _patterns(q)]
    if isinstance(p, ast.MatchAs) and p.pattern is not None:
        return _patterns(p.pattern)
    return []


def find_dispatch(root: Path, allowed: tuple[str, ...] = ALLOWED) -> list[str]:
    """``path:line: code`` for every string dispatch on the task axis under ``root`` outside
    ``allowed`` packages."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            hit = False
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                for a, b in itertools.pairwise(sides):
                    for x, y in ((a, b), (b, a)):
                        word = _axis(x)
                        if word and _dispatches(word, _strings(y)):
                            hit = True
            elif isinstance(node, ast.Match):
                word = _axis(node.subject)
                hit = bool(word) and _dispatches(word, [s for c in node.cases for s in _patterns(c.pattern)])
            elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Dict):
                word = _axis(node.slice)
                keys = [s for k in node.value.keys if k is not None for s in _strings(k)]
                hit = bool(word) and _dispatches(word, keys)
            if hit:
                out.append(f"{root.name}/{rel.as_posix()}:{node.lineno}: {ast.unparse(node)[:120]}")
    return out


def test_no_string_dispatch_on_the_task_outside_tasks() -> None:
    found = find_dispatch(SRC)
    assert not found, f"{len(found)} string comparisons of the task outside tasks/:\n" + "\n".join(found)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    dst = tmp_path / PACKAGE
    shutil.copytree(SRC, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def _module_in(root: Path, package: str) -> Path:
    if (root / f"{package}.py").is_file():
        return root / f"{package}.py"
    files = sorted(p for p in (root / package).glob("*.py") if p.name != "__init__.py")
    assert files, f"no module in {package}"
    return files[0]


def _plant(path: Path, code: str) -> int:
    """Append ``code`` (a function whose second line is the offending one); that line's number."""
    text = path.read_text()
    if not text.endswith("\n"):
        text += "\n"
    path.write_text(text + "\n" + code)
    return len(text.splitlines()) + 3


PLANTS = [
    ("train", "def planted(cfg):\n    return cfg.task == 'vision'\n"),
    ("studies", "def planted(x):\n    return x.kind != 'lm'\n"),
    ("kpca", "def planted(modality):\n    return modality == 'text'\n"),
    ("report", "def planted(cfg):\n    return cfg.task in ('vision', 'segmentation')\n"),
    ("cli", "def planted(spec):\n    return 'lm' == spec.task.name\n"),
    ("robustness", "def planted(suite):\n    return {'image': 1, 'lm': 2}[suite.kind]\n"),
    ("data", "def planted(cfg):\n    match cfg.task:\n        case 'vision' | 'segmentation':\n"
             "            return 1\n    return 0\n"),
]


@pytest.mark.parametrize(("package", "code"), PLANTS)
def test_planted_string_dispatch_is_caught(tree: Path, package: str, code: str) -> None:
    path = _module_in(tree, package)
    before = find_dispatch(tree)
    line = _plant(path, code)
    new = [f for f in find_dispatch(tree) if f not in before]
    assert len(new) == 1 and new[0].startswith(f"{PACKAGE}/{path.relative_to(tree).as_posix()}:{line}: "), new


def test_dispatch_inside_tasks_and_other_kinds_are_not_flagged(tree: Path) -> None:
    (tree / "tasks").mkdir(exist_ok=True)
    (tree / "tasks" / "planted.py").write_text("def planted(cfg):\n    return cfg.task == 'vision'\n")
    before = find_dispatch(tree)
    other_kinds = "def planted(kind, site):\n    return kind == 'perm' or site.kind == 'timm'\n"
    _plant(_module_in(tree, "kpca"), other_kinds)
    _plant(_module_in(tree, "train"), "def planted(cfg):\n    return cfg.task == other_task\n")
    assert find_dispatch(tree) == before
    assert not [f for f in before if "/tasks/" in f]
