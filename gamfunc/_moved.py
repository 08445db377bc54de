"""The old paths of the modules that moved into the layers' folders, kept for one release.

``import gamfunc.step``, ``from gamfunc.precision import bf16`` and ``gamfunc.step.make_step`` still
work: a finder on ``sys.meta_path`` answers for the old names of ``MOVED`` alone and hands back the
module at its new path (the same module object, so ``gamfunc.step is gamfunc.training.step``), and
the package's ``__getattr__`` does the same for an attribute read. Nothing is imported before an old
name is asked for. ``gamfunc.logging`` now lives in ``reproduce/`` (TensorBoard helpers of the
scripts), which a wheel does not hold: there it raises ``ModuleNotFoundError``.

Warning:
    The old paths are kept for one release only; CHANGELOG.md lists each with its new one.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

__all__ = ["MOVED", "__getattr__"]

MOVED = {
    "gamfunc.accumulate": "gamfunc.wrappers.accumulate",
    "gamfunc.distributed": "gamfunc.wrappers.distributed",
    "gamfunc.m_sharpness": "gamfunc.wrappers.m_sharpness",
    "gamfunc.precision": "gamfunc.wrappers.precision",
    "gamfunc.regional": "gamfunc.wrappers.regional",
    "gamfunc.convenience": "gamfunc.training.convenience",
    "gamfunc.cuda_graphs": "gamfunc.training.cuda_graphs",
    "gamfunc.ensemble": "gamfunc.training.ensemble",
    "gamfunc.guard": "gamfunc.training.guard",
    "gamfunc.state": "gamfunc.training.state",
    "gamfunc.step": "gamfunc.training.step",
    "gamfunc.when": "gamfunc.training.when",
    "gamfunc.compile": "gamfunc.compiling.compile",
    "gamfunc.graph_sharing": "gamfunc.compiling.graph_sharing",
    "gamfunc.logging": "reproduce.run.tensorboard",
}


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old name of ``MOVED`` and loads it as the module at its new path."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def create_module(self, spec):
        return None  # a throwaway module, replaced in sys.modules by exec_module

    def exec_module(self, module):
        # the import system returns what sys.modules holds under the name once this has run
        sys.modules[module.__name__] = importlib.import_module(MOVED[module.__name__])


def __getattr__(name: str):
    """``gamfunc.<old name>``: the moved module, imported on first read."""
    if f"gamfunc.{name}" in MOVED:
        return importlib.import_module(MOVED[f"gamfunc.{name}"])
    raise AttributeError(f"module 'gamfunc' has no attribute {name!r}")


if not any(isinstance(f, _OldPaths) for f in sys.meta_path):
    sys.meta_path.insert(0, _OldPaths())  # before any finder that knows the old files
