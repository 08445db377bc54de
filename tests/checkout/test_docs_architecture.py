"""docs/ARCHITECTURE.md states what tests/checkout/test_layers.py enforces: its layer table is ``LAYERS``, its
list of reproduce/run/ is ``RUN_ORDER``, and the one wrapper module the step imports is the one it
names."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from test_layers import LAYERS, PACKAGE, RUN_ORDER, imported_modules

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "ARCHITECTURE.md").read_text()


def blocks_after(heading: str) -> list[str]:
    """The fenced blocks of the section that starts at ``heading``."""
    section = DOC.split(heading, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```\n(.*?)^```", section, flags=re.S | re.M)


def layer_table() -> dict[int, set[str]]:
    """Layer number -> the modules its rows name (``name.py`` or ``name/``), as ``gamfunc.name``."""
    table = next(b for b in blocks_after("## Layers") if re.match(r"\s*\d+  ", b))
    out: dict[int, set[str]] = {}
    number = None
    for row in table.splitlines():
        head = re.match(r"\s*(\d+)  ", row)
        if head:
            number = int(head.group(1))
            out[number] = set()
        out[number] |= {f"gamfunc.{m}" for m in re.findall(r"\b([a-z_]+)(?:\.py\b|/)", row)}
    return out


def test_the_layer_table_is_that_of_the_test():
    table = layer_table()
    assert sorted(table) == list(range(len(LAYERS))), "one row per layer of LAYERS, numbered from 0"
    for number, names in enumerate(LAYERS):
        assert table[number] == set(names), f"layer {number} of docs/ARCHITECTURE.md"


def test_the_run_list_is_that_of_the_test():
    block = next(b for b in blocks_after("## Layers") if "loop.py" in b)
    listed = re.findall(r"^ (\w+)\.py ", block, flags=re.M)
    assert listed[::-1] == RUN_ORDER


def test_the_step_imports_regional_alone_of_the_wrappers():
    imported = {
        (path.name, m)
        for path in sorted((PACKAGE / "training").glob("*.py"))
        for m in imported_modules(path)
        if m.startswith("gamfunc.wrappers.")
    }
    assert imported == {
        ("step.py", "gamfunc.wrappers.regional"),
        ("step.py", "gamfunc.wrappers.regional.compile_passes"),
    }


def test_the_package_init_only_imports_and_lists():
    """gamfunc/__init__.py re-exports: imports, ``__all__`` and ``__version__``, nothing else."""
    body = ast.parse((PACKAGE / "__init__.py").read_text()).body
    other = [
        ast.dump(node)[:80]
        for node in body
        if not isinstance(node, ast.Import | ast.ImportFrom)
        and not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))
        and not (
            isinstance(node, ast.Assign)
            and [getattr(t, "id", None) for t in node.targets] in (["__all__"], ["__version__"])
        )
        and not (isinstance(node, ast.AugAssign) and getattr(node.target, "id", None) == "__all__")
    ]
    assert other == []


def test_the_reproduce_floors_are_those_of_the_test():
    from test_reproduce_layers import FLOORS

    block = next(b for b in blocks_after("## Layers") if "methods.py" in b and "train.py" in b)
    rows = {}
    for row in block.splitlines():
        head = re.match(r"\s*(\d+)  (.*?)(?:\s{2,}|$)", row)
        if head:
            names = re.findall(r"\b([a-z_]+)(?:\.py\b|/)", head.group(2))
            rows[int(head.group(1))] = {f"reproduce.{n}" for n in names}
    assert rows == {i: set(names) for i, names in enumerate(FLOORS)}
