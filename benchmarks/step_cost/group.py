"""One model in one precision: set every row up (eager ones while the workers compile the others),
time them together, then profile them."""

from __future__ import annotations

import torch

from benchmarks.step_cost.methods import BASELINE, EAGER_ROWS, build_methods, method_names
from benchmarks.step_cost.models import prepare
from benchmarks.step_cost.profiling import profile_steps, profile_summary
from benchmarks.step_cost.report import ratios
from benchmarks.step_cost.runners import runner_factory
from benchmarks.step_cost.timing import log, setup, time_rows


def plan(a) -> list[tuple[str, str]]:
    """(method, mode) of every row: the eager ``nn.Module`` rows once (``torch_sgd`` always,
    ``authors_gam`` if selected), then every selected functional method in every mode."""
    names = method_names(a.only)
    rows = (
        [] if a.compile_only else [(m, "eager") for m in EAGER_ROWS if m == BASELINE or m in names]
    )
    return rows + [(m, mode) for mode in a.modes for m in names if m not in EAGER_ROWS]


def compile_jobs(model_name, token, a) -> list[tuple[str, str, str, str]]:
    """The pre-compile jobs (model, precision, mode, method) of one group: its compiled rows."""
    return [(model_name, token, mode, m) for m, mode in plan(a) if mode != "eager"]


def run_group(model_name, token, a, device, meta, save=None, pool=None) -> list[dict]:
    """Set up, then time (interleaved), the rows of :func:`plan` for ``model_name`` in the precision
    ``token`` (``fp32``, ``bf16-cl``, ...). ``save(rows)`` is called with the planned rows, then once
    all are set up, before the timing. ``pool``: the run's :class:`.pool.Precompiler`, already
    compiling this group's :func:`compile_jobs`, or None to compile here; the timing waits until
    all its workers, of every group, have finished."""
    g = prepare(model_name, token, a, device)
    meta["model_source"][model_name] = g.source
    batch_bytes = sum(t.numel() * t.element_size() for t in g.batch)
    methods = build_methods(a, a.only)
    entries = plan(a)
    rows = {}
    for method, mode in entries:
        m = methods.get(method)
        rows[(method, mode)] = {
            "model": model_name,
            "dtype": g.dtype,
            "channels_last": g.channels_last,
            "mode": mode,
            "method": method,
            "batch": g.batch[0].shape[0],
            "grads": m.grads if m else None,
            "floor": list(m.floor) if m and m.floor else None,
            "error": None,
        }
    runners = {}
    if save is not None:  # the plan, so that a run stopped while compiling says what it was doing
        save(list(rows.values()))

    def set_up(method, mode, pre=None):
        row, key = rows[(method, mode)], f"{model_name} {token} {method}/{mode}"
        if row["error"]:  # known not to run (exact H·v under bf16 autocast)
            log(f"{key}: {row['error']}")
            return
        if pre is not None:
            row["compile_cold_s"] = pre.get("compile_s")
            if pre["error"] and "out of memory" not in pre["error"].lower():
                row["error"] = f"pre-compile: {pre['error']}"
                log(f"{key}: skipped, {row['error'][:160]}")
                return
        try:
            make = runner_factory(method, mode, g, methods, a, device)
            runners[(method, mode)] = setup(row, make, a, device, batch_bytes)
            if hasattr(runners[(method, mode)], "impl"):
                row["grad_impl"] = runners[(method, mode)].impl
            log(
                f"{key}: ready"
                + (f", compile {row['compile_s']:.1f} s" if "compile_s" in row else "")
            )
        except Exception as e:  # one failing method must not end the run
            row["error"] = f"{type(e).__name__}: {str(e).strip()[:400]}"
            log(f"{key}: FAILED, {row['error'][:200]}")
            runners.pop((method, mode), None)
            if device.type == "cuda":
                torch.cuda.empty_cache()

    compiled = [p for p in entries if p[1] != "eager" and not rows[p]["error"]]
    for method, mode in entries:  # eager ones first, while the workers compile the others
        if mode == "eager" or rows[(method, mode)]["error"]:
            set_up(method, mode)
    if pool is not None:  # each compiled step as soon as its worker has filled the caches
        for (_, _, mode, method), pre in pool.completed(compile_jobs(model_name, token, a)):
            set_up(method, mode, pre)
        pool.wait()  # no worker may run while steps are timed
    else:
        for method, mode in compiled:
            set_up(method, mode)
    if save is not None:
        save(list(rows.values()))
    if not a.compile_only:
        log(f"{model_name} {token}: timing {len(runners)} steps, {a.repeats} rounds")
        samples = time_rows(runners, rows, a, device)
        ratios(list(rows.values()))
        if a.profile:  # after all timing, so that the profiler never runs beside a timed step
            for key in samples:
                method, mode = key
                try:
                    rows[key]["profile"] = profile_steps(runners[key], a.profile, device)
                except Exception as e:
                    rows[key]["profile"] = {"error": f"{type(e).__name__}: {str(e).strip()[:300]}"}
                log(
                    f"{model_name} {token} {method}/{mode}: {profile_summary(rows[key]['profile'])}"
                )
    return list(rows.values())
