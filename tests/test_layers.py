"""The package's structure: what gamfunc imports, from where, and what it declares it needs."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gamfunc"


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, function-level imports included (absolute names)."""
    tree = ast.parse(path.read_text(), str(path))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def test_every_core_dependency_is_imported_by_gamfunc():
    """A dependency of ``pip install gamfunc`` is one the library uses; the scripts' go to extras."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from 3.11")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names: dict[str, str] = {}  # distribution -> import name, where they differ
    used = {m.split(".")[0] for p in PACKAGE.rglob("*.py") for m in imported_modules(p)}
    for requirement in project["dependencies"]:
        dist = requirement.split(">")[0].split("=")[0].split("<")[0].strip()
        assert names.get(dist, dist) in used, (
            f"{dist} is a core dependency that gamfunc never imports"
        )
