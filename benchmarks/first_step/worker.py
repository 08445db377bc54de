"""What runs in a worker process: one cell's first steps, or the steady state of a model's cells.

A first-steps worker starts its clock after the device is up (CUDA's context is made before it and
timed apart, ``cuda_init_s``), builds the model, the batch and the step, and runs
:func:`.cells.ready_step` steps, each synchronised: ``steps_s`` are the seconds from the start of
the set-up to the end of each. Its inductor cache is the ``TORCHINDUCTOR_CACHE_DIR`` the driver
gave it, empty for a cold start. ``cache`` counts inductor's and AOTAutograd's cache hits, misses
and bypasses (a graph the cache refused; `reproduce.run.compile_cache.cache_counts`), so that a
warm start is shown to have used the cache.

A steady-state worker sets up every cell of one model and precision (compiling from the merged
caches of the first-step workers), then times them together in interleaved rounds, as step_cost does
(:func:`benchmarks.step_cost.timing.time_rows`).
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks.first_step.cells import GRAPH_MODES, GRAPH_WARMUP, Cell, ready_step, runner
from benchmarks.step_cost.models import prepare
from benchmarks.step_cost.timing import log, setup, sync, time_rows
from reproduce.run.compile_cache import cache_counts


def compile_phases(at_least: float = 0.5) -> dict[str, float]:
    """The seconds of each phase of torch's compile in this process (its own timers: Dynamo's
    tracing, AOTAutograd, inductor's lowering and code generation, the cache's loads...), those of
    ``at_least`` seconds or more; empty where torch keeps no such timers."""
    from torch._dynamo import utils

    timers = getattr(utils, "compilation_time_metrics", None) or {}
    totals = {name: round(sum(times), 2) for name, times in timers.items()}
    return {name: s for name, s in totals.items() if s >= at_least}


def start_device(device: torch.device) -> float:
    """Make the device ready (CUDA's context, the allocator); the seconds it took."""
    t = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.init()
        torch.zeros(1, device=device)
        sync(device)
    return time.perf_counter() - t


def first_steps(cell: Cell, a: argparse.Namespace, device: torch.device) -> dict:
    """Time ``cell`` from its set-up to the end of each of its first steps.

    Args:
        cell: the cell.
        a: the flags (the model's batch size, lr, ρ, α, the H·v of the composite rows).
        device: where it runs.

    Returns:
        ``{"cuda_init_s", "setup_s", "steps_s", "first_s", "ready_s", "cache", "compile_phases",
        "error"}``: ``setup_s`` the model, batch and step built, ``steps_s`` the end of each step
            counted from the same start, ``first_s`` the first of them, ``ready_s`` the end of
            :func:`.cells.ready_step`'s step, ``compile_phases`` the compile's (`compile_phases`);
            ``error`` None, or what failed.
    """
    out = {"cuda_init_s": start_device(device), "error": None}
    t0 = time.perf_counter()
    try:
        g = prepare(cell.model, cell.precision, a, device)
        run = runner(cell, g, a)
        sync(device)
        out["setup_s"] = time.perf_counter() - t0
        steps = []
        for _ in range(ready_step(cell)):
            run()
            sync(device)
            steps.append(time.perf_counter() - t0)
        out.update(steps_s=steps, first_s=steps[0], ready_s=steps[-1])
    except Exception as e:  # the row says what failed; the run goes on
        out["error"] = f"{type(e).__name__}: {str(e).strip()[:400]}"
    out["cache"] = cache_counts()
    out["compile_phases"] = compile_phases()
    return out


def steady(cells: list[Cell], a: argparse.Namespace, device: torch.device) -> list[dict]:
    """Set up ``cells`` (one model and precision) and time them in interleaved rounds.

    Args:
        cells: the cells.
        a: the flags (``repeats``, ``warmup``, ``block``, ``recompile_steps``).
        device: where they run.

    Returns:
        One row per cell: ``key``, ``batch``, and from step_cost's timing ``ms`` (the median),
            ``ms_samples``, ``img_s``, ``compile_s`` or ``first_call_s``, ``recompiles``,
            ``peak_mem_gib``; ``error`` where it failed.
    """
    start_device(device)
    g = prepare(cells[0].model, cells[0].precision, a, device)
    batch_bytes = sum(t.numel() * t.element_size() for t in g.batch)
    timing = argparse.Namespace(**vars(a))
    timing.compile_only = False
    if any(c.mode in GRAPH_MODES for c in cells):  # captured before the timing
        timing.warmup = max(a.warmup, GRAPH_WARMUP)
    rows, runners = {}, {}
    for cell in cells:
        row = rows[cell] = {"key": cell.key, "batch": g.batch[0].shape[0], "error": None}
        try:
            runners[cell] = setup(
                row, lambda cell=cell: runner(cell, g, a), timing, device, batch_bytes
            )
            log(f"{cell.key}: ready")
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {str(e).strip()[:400]}"
            log(f"{cell.key}: FAILED, {row['error'][:200]}")
            runners.pop(cell, None)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    log(f"{cells[0].model} {cells[0].precision}: timing {len(runners)} steps, {a.repeats} rounds")
    time_rows(runners, rows, timing, device)
    return list(rows.values())
