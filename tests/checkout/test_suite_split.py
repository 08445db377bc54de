"""The split of tests/ into library tests (tests/library/) and checkout tests (tests/checkout/).

A library test module imports only the standard library, gamfunc, what gamfunc's wheel and its
``dev`` and ``plot`` extras install, and tests/' other library modules (the shared helpers in
tests/ itself and tests/library/); it names no file of the repository and reaches no folder above
tests/. .ci/run's wheel job runs these modules against the installed wheel from a copy of tests/
without checkout/, where an import of reproduce/ or a read of README.md would fail. This module
reads the sources: every module of tests/ and tests/library/ must pass, and every module of
tests/checkout/ must need the checkout in a way these rules see.
"""

from __future__ import annotations

import ast
import re
import sys
from importlib import metadata
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
# modules by their path under tests/: the shared helpers (conftest, helpers, ...) are library modules
LIBRARY = sorted(
    p.relative_to(TESTS).as_posix() for g in ("*.py", "library/*.py") for p in TESTS.glob(g)
)
CHECKOUT = sorted(p.relative_to(TESTS).as_posix() for p in TESTS.glob("checkout/*.py"))

# The extras whose packages a library test may import (skipping where one is absent).
EXTRAS = ("dev", "plot")
# A string that names a file or folder of the repository outside tests/.
REPOSITORY_PATH = re.compile(
    r"\b(README\.md|CHANGELOG\.md|pyproject\.toml|mkdocs\.yml|setup\.py)\b"
    r"|(^|/)(docs|examples|reproduce|benchmarks|\.ci)(/|$)|(^|/)gamfunc/"
)


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str:
    return _normal(re.match(r"[A-Za-z0-9._-]+", requirement).group(0))


def allowed_imports() -> set[str]:
    """The top-level names a library test may import: the standard library, gamfunc, tests/'
    library modules, and the packages of gamfunc's dependencies and of :data:`EXTRAS`."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from 3.11")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_requirement_name(r) for r in project["dependencies"]}
    for extra in EXTRAS:
        wanted |= {_requirement_name(r) for r in project["optional-dependencies"][extra]}
    installed = metadata.packages_distributions()  # import name -> distributions
    packages = {name for name, dists in installed.items() if wanted & {_normal(d) for d in dists}}
    own = {Path(m).stem for m in LIBRARY}
    return set(sys.stdlib_module_names) | {"__future__", "gamfunc"} | own | packages


def _ups(node: ast.AST, names: dict[str, int]) -> int | None:
    """How many folders above its own file an expression built on ``__file__`` reaches (0 for the
    file itself, 1 for its folder, tests/); None for an expression not built on it."""
    if isinstance(node, ast.Name):
        return 0 if node.id == "__file__" else names.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _ups(node.value, names)
        return None if base is None else base + (node.attr == "parent")
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute):
        base = _ups(node.value.value, names)
        if node.value.attr == "parents" and base is not None:
            index = node.slice.value if isinstance(node.slice, ast.Constant) else 0
            return base + 1 + int(index)
        return base
    if isinstance(node, ast.Call):
        if isinstance(node.func, ast.Attribute) and node.func.attr == "dirname" and node.args:
            base = _ups(node.args[0], names)
            return None if base is None else base + 1
        if isinstance(node.func, ast.Name) and node.func.id == "Path" and node.args:
            return _ups(node.args[0], names)
        if isinstance(node.func, ast.Attribute):  # .resolve(), .absolute()
            return _ups(node.func.value, names)
    if isinstance(node, ast.BinOp):  # folder / "name"
        return _ups(node.left, names)
    return None


def _docstrings(tree: ast.Module) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            found.add(id(first.value))
    return found


def needs_the_checkout(module: str, allowed: set[str]) -> list[str]:
    """What in ``module``'s source (its path under tests/, ``library/test_tree.py``) needs the
    repository around tests/: one line each."""
    path = TESTS / module
    tree = ast.parse(path.read_text(), str(path))
    depth = len(Path(module).parts)  # how many folders up from its file tests/ is
    found = []

    def imported(name: str, line: int, how: str) -> None:
        top = name.split(".")[0]
        if top not in allowed:
            found.append(f"{module}:{line}: {how} {name}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                imported(alias.name, node.lineno, "imports")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported(node.module, node.lineno, "imports")
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func.attr if isinstance(node.func, ast.Attribute) else ""
            func = node.func.id if isinstance(node.func, ast.Name) else func
            if func in ("importorskip", "import_module", "__import__"):
                imported(str(node.args[0].value), node.lineno, "imports")
    if module == "conftest.py":  # it looks for the checkout (reproduce/ beside tests/) on purpose
        return found
    names: dict[str, int] = {}
    for node in tree.body:  # module-level names built on __file__ (HERE = Path(__file__).parent)
        target = node.targets[0] if isinstance(node, ast.Assign) else None
        if isinstance(target, ast.Name) and (ups := _ups(node.value, names)) is not None:
            names[target.id] = ups
    docstrings = _docstrings(tree)
    for node in ast.walk(tree):
        ups = _ups(node, names) if isinstance(node, ast.expr) else None
        if ups is not None and ups > depth:
            found.append(f"{module}:{node.lineno}: reaches above tests/ (__file__)")
        text = node.value if isinstance(node, ast.Constant) else None
        if isinstance(text, str) and id(node) not in docstrings and REPOSITORY_PATH.search(text):
            found.append(f"{module}:{node.lineno}: names {text!r}")
    return sorted(set(found), key=lambda f: (int(f.split(":")[1]), f))


@pytest.fixture(scope="module")
def allowed():
    return allowed_imports()


def test_every_test_module_is_a_library_or_a_checkout_one():
    """A test module lies in tests/library/ or tests/checkout/; tests/ itself holds the shared
    helpers, and no other folder holds a module."""
    assert [m for m in LIBRARY if Path(m).name.startswith("test_") and "/" not in m] == []
    folders = {p.parent.relative_to(TESTS).as_posix() for p in TESTS.rglob("*.py")}
    assert folders <= {".", "library", "checkout"}, folders
    assert LIBRARY and CHECKOUT


@pytest.mark.parametrize("module", LIBRARY)
def test_a_library_module_needs_only_the_installed_library(module, allowed):
    assert needs_the_checkout(module, allowed) == []


@pytest.mark.parametrize("module", CHECKOUT)
def test_a_checkout_module_needs_the_checkout(module, allowed):
    """A module of tests/checkout/ that needs nothing of the repository is a library module that
    the wheel job leaves out: move it to tests/library/."""
    assert needs_the_checkout(module, allowed) != []


def test_the_rules_see_what_needs_the_checkout(tmp_path, allowed, monkeypatch):
    source = '''
import reproduce.config
from benchmarks import _common
from pathlib import Path
import pytest
HERE = Path(__file__).resolve().parent
ROOT = Path(__file__).resolve().parents[1]
README = HERE.parent / "README.md"
pytest.importorskip("einops")
def f():
    """docs/ in a docstring is fine"""
    return open("docs/index.md")
'''
    monkeypatch.setattr(sys.modules[__name__], "TESTS", tmp_path)
    (tmp_path / "probe.py").write_text(source)
    found = needs_the_checkout("probe.py", allowed)
    assert [f.split(":", 1)[1] for f in found] == [
        "2: imports reproduce.config",
        "3: imports benchmarks",
        "7: reaches above tests/ (__file__)",
        "8: names 'README.md'",
        "8: reaches above tests/ (__file__)",
        "9: imports einops",
        "12: names 'docs/index.md'",
    ], found
