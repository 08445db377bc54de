"""The body of one training step, below `gamfunc.training.step`, which builds a step of it.

`run_step` runs the estimator, the optimiser's update and the non-finite guard's choice at one
``(params, state, batch)`` and counts the step (`step_body`, under ``torch.no_grad``); `branch`
gives it a code object of its own per estimator; `schedules_in_range` flags an out-of-range
scheduled value on the device; `with_schema` gives the metrics of every branch one set of keys.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gamfunc import tree
from gamfunc.compiling.compile import fresh
from gamfunc.estimators import Estimator
from gamfunc.loss import bind, next_state
from gamfunc.optim import apply_updates, call_update, injected, learning_rate, lr_groups
from gamfunc.ranges import FINITE, NONNEGATIVE, GuardedSchedule
from gamfunc.schedules import value
from gamfunc.training.guard import is_finite
from gamfunc.training.state import StepState

__all__ = ["branch", "run_step", "schedules_in_range", "step_body", "with_schema"]


def run_step(estimator, optimizer, loss_fn, on_nonfinite, guard, full, params, state, batch, clean):
    with torch.no_grad():  # gradients come from torch.func transforms only
        return step_body(
            estimator, optimizer, loss_fn, on_nonfinite, guard, full, params, state, batch, clean
        )


def step_body(
    estimator, optimizer, loss_fn, on_nonfinite, guard, full, params, state, batch, clean=None
):
    buffered = isinstance(state.buffers, dict)
    loss = bind(loss_fn, state)
    # One step counter, the step's: the estimator's schedules (ρ) and the optimiser's (lr, bias
    # corrections) read the same t, so a skipped step (the old state kept) moves neither.
    step = state.step
    est = estimator.run(params, batch, loss, clean=clean, step=step, state=state.est)
    # marks how far the GPU has come once the passes are queued: the guard's read or select
    passes_queued = guard.mark(est.info["loss"].device) if on_nonfinite == "skip" else None
    # an estimator without state (the plain steps of every=k) carries the state through
    new_est = est.state if estimator.stateful else state.est
    updates, new_opt = call_update(optimizer, est.direction, state.opt, params, step)
    new_params = apply_updates(params, updates)
    if isinstance(est.decoupled, dict):  # e.g. WSAM's decoupled sharpness step, after the update
        new_params = _decoupled_step(new_params, est.decoupled, new_opt)
    metrics = dict(est.info)
    lr = learning_rate(new_opt)
    if lr is not None:
        metrics["lr"] = lr
    if "rho" in estimator.hparams:
        rho = value(estimator.hparams["rho"], step)
        # a fill, not a copy of a host value: a step captured in a CUDA graph copies nothing in
        metrics["rho"] = (
            rho.to(torch.float64)
            if isinstance(rho, Tensor)
            else torch.full((), rho, dtype=torch.float64, device=step.device)
        )
    if full is not None:  # a fill: a step captured in a CUDA graph copies nothing in
        metrics["full_step"] = torch.full((), int(full), dtype=torch.int64, device=step.device)
    in_range = schedules_in_range(estimator, new_opt, step)
    if in_range is not None:
        metrics["out_of_range"] = (~in_range).to(torch.int64)
    new_buffers = est.clean.aux if buffered else ()
    # Each StepState is built by its constructor: dynamo on torch < 2.13 cannot return a NamedTuple
    # made by ``_replace`` from a compiled graph.
    taken = StepState(
        step + 1,
        new_opt,
        state.skipped,
        new_buffers,
        state.cycle,
        state.loss,
        new_est,
        state.policy,
    )
    if on_nonfinite == "ignore":
        return new_params, taken, metrics
    finite = is_finite(est, new_params, new_opt, new_est).to(step.device)
    if in_range is not None:
        finite = finite & in_range
    if on_nonfinite == "raise":
        if not bool(finite):
            why = (
                "a scheduled hyperparameter out of range or not finite"
                if in_range is not None and not bool(in_range)
                else "non-finite loss, direction or update"
            )
            raise FloatingPointError(f"{why} at step {int(step)}: loss={float(est.info['loss'])}")
        return new_params, taken, metrics
    skipped = (~finite).to(torch.int64)
    new_params, new_opt, new_buffers, new_est = guard.keep(
        finite,
        (new_params, new_opt, new_buffers, new_est),
        (params, state.opt, state.buffers, state.est),
        passes_queued,
    )
    loss_state, extra = next_state(loss_fn, state, finite)
    new_step = step + (1 - skipped)
    counts = state.skipped + skipped
    new_state = StepState(
        new_step, new_opt, counts, new_buffers, state.cycle, loss_state, new_est, state.policy
    )
    metrics["skipped"] = skipped
    metrics.update(extra)
    return new_params, new_state, metrics


def schedules_in_range(estimator: Estimator, opt_state, step: Tensor) -> Tensor | None:
    """Whether every scheduled hyperparameter the step read is in its range and finite, as a 0-d
    bool tensor on ``step``'s device (no host read); None where the step reads no schedule.

    Read: the estimator's schedules that are checked at each step
    ([`GuardedSchedule`][gamfunc.ranges.GuardedSchedule], what its constructor made of a schedule
    without ``bounds``), evaluated at ``step``, and the values the optimiser's schedules took at
    this update (``InjectState.scheduled``): finite, and >= 0 for ``lr`` and ``weight_decay``.
    A schedule with ``bounds`` was checked when it was given, and an out-of-range value of a
    guarded one is NaN, so a step that used one is not finite either; the flag says why.

    Args:
        estimator: the estimator of the step's branch.
        opt_state: the optimiser's state after the update.
        step: the step count t.

    Returns:
        A 0-d bool tensor, or None.
    """
    flags = [
        h.rule.holds_on_device(torch.as_tensor(value(h, step)))
        for h in estimator.hparams.values()
        if isinstance(h, GuardedSchedule)
    ]
    for s in injected(opt_state):
        for k, v in s.scheduled.items():
            rule = NONNEGATIVE if k in ("lr", "weight_decay") else FINITE
            flags.append(rule.holds_on_device(v))
    if not flags:
        return None
    ok = flags[0].to(step.device)
    for f in flags[1:]:
        ok = ok & f.to(step.device)
    return ok


def _decoupled_step(params: dict, part: dict, opt_state) -> dict:
    """θ_k − lr_k·part_k for every parameter k, lr_k its learning rate in ``opt_state`` (the one
    the update just used): one ``axpy`` over each group of parameters that share an lr
    (`gamfunc.optim.lr_groups`), a few foreach kernels rather than two per parameter."""
    out = dict(params)
    for names, s in lr_groups(opt_state, list(params)):
        lr = learning_rate(s)
        assert lr is not None  # lr_groups gives only the states that keep one
        out.update(tree.axpy(-lr, {k: part[k] for k in names}, {k: params[k] for k in names}))
    return out


def with_schema(schema: dict, metrics: dict) -> tuple[dict, dict]:
    """``(schema, metrics)`` with ``metrics`` given every key of ``schema``, in its order: a value a
    branch did not compute is NaN (-1 for an integer metric); keys new to ``schema`` join it.

    With a ``when`` policy the GAM branch reports keys (``f_norm``, ``adv_*``, ``rho``) that the plain
    branch does not. The schema holds the keys of the branches that have run so far (it lives in
    the step function, not in its state), so it is complete once the estimator's branch has run
    and the base estimator reports a subset of the estimator's keys (every estimator of gamfunc
    does); from then on every step returns the same keys, and a logger or a ``torch.stack`` over
    those steps sees one schema. The steps before (the base's) return the base's keys only: the
    steps before ``start`` of ``late(start)`` with ``start > 0``, those of ``every(k)`` resumed in
    the middle of a cycle up to its next flat step, those of ``adaptive`` up to its first flat
    one; and a step made afresh (resumed, compiled, graphed) starts from an empty schema.
    """
    schema = dict(schema)
    for k, v in metrics.items():
        if k not in schema and isinstance(v, Tensor):
            schema[k] = (v.dtype, v.device)
    out = {}
    for k, (dtype, device) in schema.items():
        if k in metrics:
            out[k] = metrics[k]
        else:
            fill = float("nan") if dtype.is_floating_point else -1
            out[k] = torch.full((), fill, dtype=dtype, device=device)
    out |= {k: v for k, v in metrics.items() if k not in out}  # anything not a tensor, as it is
    return schema, out


def branch(estimator, optimizer, loss_fn, on_nonfinite, guard, full):
    """`run_step` for one estimator, as a function with its own code object (a partial would not do:
    torch.compile traces a partial from a wrapper shared by every callable object). ``full``: with
    a ``when`` policy, whether this is the estimator's branch (reported as
    ``metrics["full_step"]``); None without one. ``clean``: the pass at θ, where the adaptive
    policy's probe took it."""

    def one(params, state, batch, clean=None):
        return run_step(
            estimator, optimizer, loss_fn, on_nonfinite, guard, full, params, state, batch, clean
        )

    return fresh(one)
