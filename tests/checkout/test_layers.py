"""The package's structure: what gamfunc imports, from where, and what it declares it needs."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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


# The layers of docs/ARCHITECTURE.md, lowest first: a module imports only from its own layer or
# below. Above the ground and its two small layers, a layer is one folder (`test_folders_are_layers`).
# The door to torch's private APIs (gamfunc._compat) is at the bottom, as everything may need it. The
# compile helpers (compile any function, nothing of steps) sit below the loss wrappers, which compile
# their passes with them, and below the step, whose ``compile`` calls down to them. The old paths of
# the moved modules (gamfunc._moved) import nothing; they name the new ones as strings.
LAYERS = [
    (
        "gamfunc._compat",
        "gamfunc.foreach",
        "gamfunc.tree",
        "gamfunc.nn",
        "gamfunc.schedules",
        "gamfunc.ranges",
        "gamfunc.checks",
    ),
    ("gamfunc.loss", "gamfunc.optim"),
    ("gamfunc.hvps",),
    ("gamfunc.estimators", "gamfunc.metrics"),
    ("gamfunc.compiling",),
    ("gamfunc.wrappers",),
    ("gamfunc.training",),
    ("gamfunc.torch_optim", "gamfunc._moved"),
]

# Inside gamfunc/training/, lowest first: the step's state, its guard and the when= policies; the
# body of one step; the step; what is built on a step.
TRAINING_ORDER = [
    ("state", "guard", "when"),
    ("body",),
    ("step",),
    ("convenience", "ensemble", "cuda_graphs"),
]


def layer(module: str) -> int | None:
    """The layer of a gamfunc module (the longest listed prefix), None for the package itself."""
    for i, names in enumerate(LAYERS):
        if any(module == n or module.startswith(n + ".") for n in names):
            return i
    return None


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_every_module_has_a_layer():
    modules = [module_name(p) for p in PACKAGE.rglob("*.py")]
    assert [m for m in modules if m != "gamfunc" and layer(m) is None] == []


def test_imports_only_run_downward():
    """No module imports from a higher layer, function-level imports included."""
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        if name == "gamfunc":  # the package's public names: the facade of every layer
            continue
        for target in sorted(imported_modules(path)):
            if not target.startswith("gamfunc."):
                continue
            if layer(target) is not None and layer(target) > layer(name):
                upward.append(f"{name} (layer {layer(name)}) imports {target} ({layer(target)})")
    assert upward == []


def test_folders_are_layers():
    """The folders say the layers: every folder of gamfunc/ is one entry of ``LAYERS``, whole, no
    entry reaches inside a folder, and a layer of a folder holds that folder alone or beside other
    folders (the ground's modules lie flat)."""
    folders = {
        f"gamfunc.{p.name}"
        for p in PACKAGE.iterdir()
        if p.is_dir() and (p / "__init__.py").exists()
    }
    entries = {n for names in LAYERS for n in names}
    assert folders <= entries
    assert [n for n in entries if n.count(".") > 1] == []
    flat = {module_name(p) for p in PACKAGE.glob("*.py")} - {"gamfunc"}
    assert flat <= entries
    for names in LAYERS[4:]:  # from the compile helpers up: folders (and the old paths' table)
        assert [n for n in names if n not in folders and n != "gamfunc._moved"] == []


def test_the_training_folder_imports_one_way():
    """Inside gamfunc/training/ a module imports only from its own row of ``TRAINING_ORDER`` or below."""
    rank = {f"gamfunc.training.{m}": i for i, row in enumerate(TRAINING_ORDER) for m in row}
    assert sorted(rank) == sorted(
        module_name(p) for p in (PACKAGE / "training").glob("*.py") if p.name != "__init__.py"
    )
    upward = [
        f"{m} imports {target}"
        for m in sorted(rank)
        for target in sorted(imported_modules(ROOT / (m.replace(".", "/") + ".py")))
        if rank.get(target, -1) > rank[m]
    ]
    assert upward == []


def test_estimators_and_optimisers_know_nothing_of_each_other():
    """Estimators read their schedules from ``gamfunc.schedules``, below both, never from optim."""
    crossing = [
        f"{module_name(path)} imports {target}"
        for a, b in (("estimators", "optim"), ("optim", "estimators"))
        for path in sorted((PACKAGE / a).rglob("*.py"))
        for target in sorted(imported_modules(path))
        if target == f"gamfunc.{b}" or target.startswith(f"gamfunc.{b}.")
    ]
    assert crossing == []


def import_graph(package: str) -> dict[str, set[str]]:
    """module -> the modules of ``package`` it imports, function-level imports included (the
    package's own ``__init__`` left out: it is the facade that re-exports every layer)."""
    modules = {module_name(p): p for p in (ROOT / package).rglob("*.py")}

    def resolve(target: str) -> str | None:  # "gamfunc.tree.norm" -> "gamfunc.tree"
        while target and target not in modules:
            target = target.rpartition(".")[0]
        return target or None

    return {
        name: {
            m
            for t in imported_modules(path)
            if t.startswith(package + ".")
            and (m := resolve(t)) not in (None, name, package)
            # a package's __init__ importing its own submodules is how it exposes them
            and not m.startswith(name + ".")
        }
        for name, path in modules.items()
        if name != package
    }


def cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every import cycle of ``graph``, as ``a -> b -> a``."""
    found = []

    def visit(node, path):
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                found.append(" -> ".join([*path[path.index(nxt) :], nxt]))
            elif len(path) < len(graph):
                visit(nxt, [*path, nxt])

    for start in sorted(graph):
        visit(start, [start])
    return found


@pytest.mark.parametrize("package", ["gamfunc", "reproduce"])
def test_no_import_cycle(package):
    """``import gamfunc`` imports no module in a cycle, within a layer either; nor does any script
    of ``reproduce/`` (``sweep`` and ``sweeps.vmap_grid`` share ``sweeps.plan`` and ``sweeps.table``)."""
    assert cycles(import_graph(package)) == []


# The modules of reproduce/run/, lowest first (docs/ARCHITECTURE.md): each imports only from those
# before it, the training loop's parts included.
RUN_ORDER = [
    "tensorboard",
    "checkpoint",
    "compile_cache",
    "launch",
    "report",
    "profiling",
    "evaluation",
    "loaders",
    "sharding",
    "signals",
    "context",
    "records",
    "checkpoint_body",
    "resume",
    "summary",
    "epoch",
    "loop",
    "fsdp",
]


def test_the_training_run_imports_one_way():
    graph = import_graph("reproduce")
    order = [f"reproduce.run.{m}" for m in RUN_ORDER]
    assert sorted(m for m in graph if m.startswith("reproduce.run.")) == sorted(order)
    upward = [
        f"{m} imports {target}"
        for i, m in enumerate(order)
        for target in sorted(graph[m])
        if target in order[i:]
    ]
    assert upward == []


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"a"}}) == ["a -> b -> a", "b -> a -> b"]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_gamfunc_imports_nothing_of_the_scripts():
    """The library sits below ``reproduce/`` and ``benchmarks/``, which use it."""
    found = [
        f"{module_name(path)} imports {target}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for target in sorted(imported_modules(path))
        if target.split(".")[0] in ("reproduce", "benchmarks")
    ]
    assert found == []


def test_metric_modules_share_helpers_only_through_common():
    """A metric module imports from another only that module's public names; what they share is in
    ``gamfunc/metrics/_common.py``."""
    private = []
    for path in sorted((PACKAGE / "metrics").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith(
                "gamfunc.metrics."
            ):
                continue
            source = ROOT / (node.module.replace(".", "/") + ".py")
            if source.name == "_common.py" or not source.exists():
                continue
            public = next(
                ast.literal_eval(n.value)
                for n in ast.parse(source.read_text()).body
                if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "__all__"
            )
            private += [
                f"{path.name}: {node.module}.{a.name}" for a in node.names if a.name not in public
            ]
    assert private == []


def _module_aliases(tree: ast.Module) -> dict[str, str]:
    """The names a module binds to gamfunc modules: ``from gamfunc import tree`` binds ``tree``."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("gamfunc."):
                    out[a.asname or a.name] = a.name
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gamfunc"):
            for a in node.names:
                target = f"{node.module}.{a.name}"
                if (ROOT / (target.replace(".", "/") + ".py")).exists() or (
                    ROOT / target.replace(".", "/")
                ).is_dir():
                    out[a.asname or a.name] = target
    return out


def absolute(node: ast.ImportFrom, package: str) -> str:
    """The module that ``node`` imports from, a relative import (``from ._compat import x``,
    read in ``package``) made absolute."""
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = ".".join(parts[: len(parts) - node.level + 1])
    return f"{base}.{node.module}" if node.module else base


def private_uses(path: Path, own: str | None = None) -> list[str]:
    """Where ``path`` imports another gamfunc module's underscore name, or reads one through the
    module (``tree._per_tensor``). A module whose own name begins with ``_`` (``gamfunc._compat``,
    the door to torch's internals; ``metrics._common``) is private to the package, its names are not."""
    tree = ast.parse(path.read_text())
    own = own or module_name(path)
    found = []
    package = ".".join(own.split(".")[: -1 if path.name != "__init__.py" else None])
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        source = absolute(node, package)
        if source.startswith("gamfunc"):
            if source == own:
                continue
            found += [
                f"from {source} import {a.name}"
                for a in node.names
                if a.name.startswith("_") and not a.name.startswith("__")
            ]
    aliases = _module_aliases(tree)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            found.append(f"{aliases[node.value.id]}.{node.attr}")
    return [f"{own}: {f}" for f in found]


def test_no_module_reads_another_modules_underscore_names():
    """What two modules share is public in one place: no module of gamfunc imports, or reads
    through a module, a name that another module keeps to itself."""
    found = [u for path in sorted(PACKAGE.rglob("*.py")) for u in private_uses(path)]
    assert found == []


def test_private_uses_are_found(tmp_path):
    probe = PACKAGE / "_probe_private_use.py"
    probe.write_text(
        "from gamfunc import tree\nfrom gamfunc.training.step import _step\n"
        "from .tree import _split\n\nx = tree._pack\n"
    )
    try:
        assert private_uses(probe) == [
            "gamfunc._probe_private_use: from gamfunc.training.step import _step",
            "gamfunc._probe_private_use: from gamfunc.tree import _split",
            "gamfunc._probe_private_use: gamfunc.tree._pack",
        ]
    finally:
        probe.unlink()


MAX_LINES = 500


def test_no_module_is_over_500_lines():
    """One idea per file: a module of gamfunc/ or reproduce/ that grows past 500 lines is split."""
    files = [*PACKAGE.rglob("*.py"), *(PACKAGE.parent / "reproduce").rglob("*.py")]
    long = {
        p.relative_to(PACKAGE.parent).as_posix(): n
        for p in sorted(files)
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}
