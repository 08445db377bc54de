"""How a run's step runs: eager or compiled (by pass or whole: `compile_scope`), replayed as a
CUDA graph or not (`step_mode`), and the configuration that records it (`with_step_mode`)."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import gamfunc
from reproduce.config import Config

__all__ = ["StepMode", "compile_scope", "step_mode", "with_step_mode"]


def compile_scope(cfg: Config, world: int) -> str:
    """``step`` (the whole step, one graph) or ``pass`` (each gradient or H·v pass, the step around
    them eager: [`gamfunc.regional.compile_passes`][gamfunc.wrappers.regional.compile_passes]).

    ``auto`` takes ``pass`` for ImageNet models, whose whole-step compile takes minutes where a pass
    compiles in about one (benchmarks/RESULTS.md), and under several processes, so that the
    all-reduces of [`gamfunc.distributed`][gamfunc.wrappers.distributed] run between compiled passes, not inside a graph."""
    if cfg.compile_scope != "auto":
        return cfg.compile_scope
    return "pass" if world > 1 or cfg.dataset == "imagenet" else "step"


class StepMode(NamedTuple):
    """How a run's step runs (`step_mode`)."""

    compile: bool  # compiled (by pass or whole, as compile_scope says)
    graph: bool  # replayed as one CUDA graph (gamfunc.cuda_graph)
    notes: tuple[str, ...] = ()  # what the run should say about the choice, one line each


def step_mode(
    device_type: str, cfg: Config, estimator: gamfunc.Estimator | None = None
) -> StepMode:
    """How the step runs: ``--mode``, else (``auto``) what ``--compile`` and ``--cuda_graph`` ask,
    else the path whose first step comes within seconds: on a GPU the eager step replayed as one CUDA
    graph (under ``--when=adaptive``, a graph for its probe and one per branch), on the CPU the eager
    step. Nothing compiles unless asked.

    An eager step replayed as a graph runs close to the compiled step for the estimators made of
    gradients (benchmarks/RESULTS.md, "The first step"), and its first step needs no compile. An
    estimator whose H·v is forward-mode AD ([`gamfunc.hvps.forward_mode`][gamfunc.hvps.forward_mode]:
    exact GAM) runs several times slower eagerly than compiled, graph or not; it is replayed as a graph
    too (faster than eager, and ready as soon), with a note that ``--mode=compile-graph`` compiles it.

    Args:
        device_type: the device's type (``"cuda"``, ``"cpu"``).
        cfg: the run's configuration (``mode``, ``compile``, ``cuda_graph``).
        estimator: the run's estimator, for the notes (None: no notes about it).

    Returns:
        The `StepMode`.
    """
    if cfg.mode != "auto":
        compiled, graphed = cfg.mode.startswith("compile"), cfg.mode.endswith("graph")
    elif cfg.compile or cfg.cuda_graph:
        compiled, graphed = cfg.compile, cfg.cuda_graph
    else:
        compiled, graphed = False, device_type == "cuda"
    notes = []
    hvp = estimator.hparams.get("hvp") if estimator is not None else None
    if device_type == "cuda" and not compiled and gamfunc.hvps.forward_mode(hvp):
        notes.append(
            f"{estimator.name}: exact H·v (forward-mode AD) runs eagerly, several times slower a "
            "step than compiled: --mode=compile-graph compiles it (once per model and device with "
            "--compile_cache)"
        )
    return StepMode(compiled, graphed, tuple(notes))


def with_step_mode(cfg: Config, device_type: str) -> Config:
    """``cfg`` with its ``mode`` chosen for ``device_type`` (`step_mode`) and ``compile`` and
    ``cuda_graph`` saying the same, so that a run records what ran."""
    m = step_mode(device_type, cfg)
    name = ("compile" if m.compile else "eager") + ("-graph" if m.graph else "")
    name = {"eager-graph": "graph"}.get(name, name)
    return dataclasses.replace(cfg, mode=name, compile=m.compile, cuda_graph=m.graph)
