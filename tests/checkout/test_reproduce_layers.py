"""The floors of ``reproduce/``: every module imports only from its own floor or the floors below."""

from __future__ import annotations

from test_layers import import_graph

# Lowest first. The models, the data, the paper's presets and the registry of estimators know
# nothing of a run; the configuration reads the presets, the models' names and the estimators'
# names; what a run trains with (build) is made from a configuration; the training loop (run/) is built on
# them, and the entry point train.py on the loop; the sweeps run train.py or the loop; the
# evidence commands run the loop or a vmapped sweep; the sweep and table commands sit on top.
FLOORS = [
    ("reproduce.presets", "reproduce.models", "reproduce.data", "reproduce.methods"),
    ("reproduce.config",),
    ("reproduce.build",),
    ("reproduce.run",),
    ("reproduce.train",),
    ("reproduce.sweeps",),
    ("reproduce.evidence",),
    ("reproduce.sweep", "reproduce.preset_table", "reproduce.main_job"),
]


def floor(module: str) -> int | None:
    """The floor of a module of ``reproduce`` (the longest listed prefix), None when unlisted."""
    for i, names in enumerate(FLOORS):
        if any(module == n or module.startswith(n + ".") for n in names):
            return i
    return None


def test_every_module_has_a_floor():
    assert [m for m in import_graph("reproduce") if floor(m) is None] == []


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import of ``graph`` (module -> the modules it imports) that runs to a higher floor."""
    return [
        f"{m} (floor {floor(m)}) imports {t} (floor {floor(t)})"
        for m, targets in sorted(graph.items())
        for t in sorted(targets)
        if floor(t) > floor(m)
    ]


def test_imports_only_run_downward():
    """No module imports from a higher floor, function-level imports included."""
    assert upward(import_graph("reproduce")) == []


def test_an_upward_import_is_found():
    """A build that imported a part of the training loop would be named."""
    graph = import_graph("reproduce")
    graph["reproduce.build"] = graph["reproduce.build"] | {"reproduce.run.checkpoint"}
    assert upward(graph) == ["reproduce.build (floor 2) imports reproduce.run.checkpoint (floor 3)"]
