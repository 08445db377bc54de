"""Timing: set a runner up (first call, warm-up, recompile check, peak memory), then time all runners
together in interleaved rounds. CUDA events on GPU, ``time.perf_counter`` on CPU."""

from __future__ import annotations

import gc
import math
import statistics
import sys
import time

import torch

START = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - START:7.1f} s] {msg}", file=sys.stderr, flush=True)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(run, n: int, device) -> float:
    """Milliseconds per step over ``n`` consecutive steps."""
    sync(device)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / n
    t = time.perf_counter()
    for _ in range(n):
        run()
    return (time.perf_counter() - t) * 1e3 / n


def dynamo_graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def cudagraph_skips() -> int:
    from torch._dynamo.utils import counters

    return counters["inductor"]["cudagraph_skips"]


def _compile_timings() -> dict[str, list[float]]:
    """The compiler's per-phase seconds in this process so far (empty where torch keeps none)."""
    from torch._dynamo import utils

    return getattr(utils, "compilation_time_metrics", {})


def compile_phases(before: dict[str, int], top: int = 20) -> dict[str, dict]:
    """Where a compile spent its time: the ``top`` compiler phases by seconds since ``before``.

    Args:
        before: ``{phase: calls}`` of :func:`_compile_timings` taken before the compile.
        top: how many phases to keep.

    Returns:
        ``{phase: {"s": seconds, "calls": calls}}``, costliest first; phases nest, so a phase's
            seconds include those of the phases inside it.
    """
    new = {k: v[before.get(k, 0) :] for k, v in _compile_timings().items()}
    ranked = sorted(((k, v) for k, v in new.items() if v), key=lambda kv: -sum(kv[1]))[:top]
    return {k: {"s": round(sum(v), 2), "calls": len(v)} for k, v in ranked}


def setup(row, make_runner, a, device, batch_bytes):
    """Build a runner, time its first call(s) (the compile), warm it up, count recompiles as lr and ρ
    change at every step, and measure its peak memory. Fills ``row``; returns the runner."""
    gc.collect()
    if device.type == "cuda":
        sync(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    skips0 = cudagraph_skips()
    runner = make_runner()
    first_calls = 2 if runner.every > 1 and runner.compiled else 1  # both branches compile
    before = {k: len(v) for k, v in _compile_timings().items()}
    t = time.perf_counter()
    for _ in range(first_calls):
        runner()
    sync(device)
    row["compile_s" if runner.compiled else "first_call_s"] = time.perf_counter() - t
    if runner.compiled:
        row["compile_phases"] = compile_phases(before)
    if a.compile_only:
        return runner
    if device.type == "cuda":  # what compiling and autotuning allocated is not the step's
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(a.warmup):
        runner()
    if runner.compiled:  # over a full cycle of `every`, so that both branches run again
        check = max(a.recompile_steps, runner.every + 1 if runner.every > 1 else 0)
        graphs = dynamo_graphs()
        for _ in range(check):  # lr and ρ move along their schedules at every step
            runner()
        row["recompiles"] = dynamo_graphs() - graphs
        row["cudagraph_skips"] = cudagraph_skips() - skips0
    sync(device)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) - base + batch_bytes
        row["peak_mem_gib"] = peak / 2**30
    return runner


def steps_per_sample(runner, block: int) -> int:
    """``block`` steps, rounded up to whole cycles of the runner's every-k schedule."""
    return block if runner.every == 1 else runner.every * math.ceil(block / runner.every)


def interleaved(runners: dict, a, device) -> tuple[dict, dict]:
    """ms/step samples per runner, one per round, runners in a rotating order; and the errors of
    runners that failed while timed (they leave the rounds)."""
    names = list(runners)
    samples, errors = {k: [] for k in names}, {}
    for r in range(a.repeats if names else 0):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            if name in errors:
                continue
            runner = runners[name]
            try:
                samples[name].append(time_steps(runner, steps_per_sample(runner, a.block), device))
            except Exception as e:
                errors[name] = f"timing: {type(e).__name__}: {str(e).strip()[:300]}"
    return {k: v for k, v in samples.items() if k not in errors}, errors


def time_rows(runners: dict, rows: dict, a, device) -> dict:
    """Time ``runners`` (`interleaved`) and write into each row of ``rows`` (same keys) its
    ``ms`` (the median), ``ms_samples`` and ``img_s``, or its timing error; the samples."""
    samples, errors = interleaved(runners, a, device)
    for key, error in errors.items():
        rows[key]["error"] = error
    for key, ms in samples.items():
        row = rows[key]
        row.update(ms=statistics.median(ms), ms_samples=ms)
        row["img_s"] = row["batch"] / row["ms"] * 1e3
    return samples


def release(device):
    """Drop the compiled graphs and cached memory of a finished group."""
    torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
