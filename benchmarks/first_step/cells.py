"""The cells of the first-step table: one estimator in one mode on one model and precision, and the
runner that steps it.

A mode is how the step runs:

==============  =====================================================================================
``eager``       ``gamfunc.make_step``'s step as it is
``graph``       the eager step replayed as one CUDA graph (``gamfunc.cuda_graph(step)``; CUDA only)
``pass``        each gradient or H·v pass compiled, the step around them eager
                (``step.compile(scope="pass")``)
``pass-graph``  compiled by pass, then replayed as one CUDA graph (CUDA only)
``step``        the whole step compiled as one graph (``step.compile()``)
==============  =====================================================================================

The estimators are step_cost's rows of the same names (:mod:`benchmarks.step_cost.methods`), each
over ``gamfunc.sgd(lr, momentum=0.9)``; the runner is step_cost's :class:`Functional`.
"""

from __future__ import annotations

from typing import NamedTuple

import gamfunc
from benchmarks.step_cost.methods import build_methods, rho_schedule
from benchmarks.step_cost.runners import Functional

ESTIMATORS = ("gradient", "sam", "gam_fd", "gam_exact", "gam_reverse")
MODES = ("eager", "graph", "pass", "pass-graph", "step")
GRAPH_MODES = ("graph", "pass-graph")  # gamfunc.cuda_graph: CUDA only
COMPILED_MODES = ("pass", "pass-graph", "step")
GRAPH_WARMUP = 3  # gamfunc.cuda_graph's eager calls before its capture
# The compiled gradient step each row's ms is divided by: the first of these the run measured.
GRAD_REFERENCE = ("pass-graph", "pass", "step")
# step_cost's Functional modes: eager, by pass, whole step
FUNCTIONAL_MODE = {"eager": "eager", "graph": "eager", "pass": "pass", "pass-graph": "pass"}
FUNCTIONAL_MODE["step"] = "compile"


class Cell(NamedTuple):
    """One row of the table."""

    model: str  # a key of benchmarks.step_cost.models.MODELS
    precision: str  # a --dtype entry: fp32, bf16, bf16-cl
    estimator: str  # one of ESTIMATORS
    mode: str  # one of MODES

    @property
    def key(self) -> str:
        """The cell as one word: ``resnet50:bf16-cl:gam_fd:pass-graph``."""
        return ":".join(self)

    @classmethod
    def parse(cls, key: str) -> Cell:
        """The cell of :attr:`key`'s form.

        Raises:
            ValueError: ``key`` is not four words joined by ``:`` naming a known estimator and mode.
        """
        parts = key.split(":")
        if len(parts) != 4 or parts[2] not in ESTIMATORS or parts[3] not in MODES:
            raise ValueError(f"a cell is MODEL:PRECISION:ESTIMATOR:MODE; got {key!r}")
        return cls(*parts)


def plan(models, precisions, estimators, modes, skip=()) -> list[Cell]:
    """Every cell of the run, model by model: estimators × modes, less those of ``skip``.

    Args:
        models: the models.
        precisions: the ``--dtype`` entries.
        estimators: names of :data:`ESTIMATORS`.
        modes: names of :data:`MODES`.
        skip: ``ESTIMATOR:MODE`` pairs left out (``gam_exact:step``).

    Returns:
        The cells, in table order.
    """
    left_out = set(skip)
    return [
        Cell(m, p, e, mode)
        for m in models
        for p in precisions
        for e in estimators
        for mode in modes
        if f"{e}:{mode}" not in left_out
    ]


def skip_reason(cell: Cell, device_type: str) -> str | None:
    """Why ``cell`` cannot run on a device of ``device_type``, or None."""
    if cell.mode in GRAPH_MODES and device_type != "cuda":
        return "skipped: a CUDA graph needs a CUDA device"
    return None


def ready_step(cell: Cell) -> int:
    """The step (counted from 1) after which ``cell`` runs in its steady form: the first, or for a
    graph mode the one that captures the graph (after :data:`GRAPH_WARMUP` eager calls)."""
    return GRAPH_WARMUP + 1 if cell.mode in GRAPH_MODES else 1


def cost_order(cell: Cell) -> tuple:
    """A key that sorts the cells whose first step costs most first (exact GAM, compiled, the whole
    step), so that in parallel runs the longest compiles start at once."""
    return (
        cell.mode not in COMPILED_MODES,
        cell.estimator != "gam_exact",
        cell.mode != "step",
        cell.key,
    )


def runner(cell: Cell, g, a) -> Functional:
    """The runner of ``cell`` on the prepared model ``g`` (:func:`benchmarks.step_cost.models.prepare`):
    step_cost's :class:`Functional` in the cell's mode, its step wrapped by ``gamfunc.cuda_graph``
    in a graph mode.

    Args:
        cell: the cell.
        g: the model, batch and functional loss.
        a: the flags (``lr``, ``rho``, ``alpha``, ``composite_hvp``, ``on_nonfinite``).

    Returns:
        The runner: one step per call.
    """
    method = build_methods(a)[cell.estimator]
    opt = gamfunc.sgd(lr=rho_schedule(a.lr), momentum=0.9)
    step = gamfunc.make_step(method.estimator, opt, g.loss_fn, on_nonfinite=a.on_nonfinite)
    run = Functional(step, g.params, g.buffers, g.batch, FUNCTIONAL_MODE[cell.mode], step.every)
    if cell.mode in GRAPH_MODES:
        run.fn = gamfunc.cuda_graph(run.fn, warmup=GRAPH_WARMUP)
    return run
