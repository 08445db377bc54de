"""Schedules: pure functions of the step count t (a 0-d integer tensor) returning a 0-d tensor.

Values are computed with tensor operations, so a compiled step that reads a schedule never recompiles
as t advances. Any hyperparameter documented as "float or schedule" (``lr`` of the optimisers, ``rho``
of the estimators) accepts one.

Every schedule here carries ``bounds``, the least and the greatest value it takes (at any t: a
count below 0 reads as 0), so that the optimiser or estimator given it checks its range once, when
it is built: ``sgd(lr=constant(-1.0))`` is refused as ``sgd(lr=-1.0)`` is. A schedule takes values
of either sign; which are allowed is its consumer's business. A schedule of your own may state its
``bounds`` too (an attribute, a pair of numbers); one that does not is checked at every step, on the
device ([`gamfunc.checks.GuardedSchedule`][gamfunc.ranges.GuardedSchedule]).

Example:
    >>> import torch
    >>> from gamfunc import schedules
    >>> lr = schedules.cosine(0.1, total_steps=100, warmup_steps=10)
    >>> round(float(lr(torch.tensor(5))), 6)  # warm-up: (t + 1)/10 of the peak
    0.06
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from gamfunc.checks import check_int, check_number

Schedule = Callable[[Tensor], Tensor]
"""A function of the step count t (a 0-d integer tensor) returning a 0-d tensor."""

__all__ = ["Schedule", "constant", "cosine", "inverse_sqrt", "proportional", "value"]


def _f64(t: Tensor) -> Tensor:
    return t.to(torch.float64)


def _with_bounds(schedule: Schedule, *values: float) -> Schedule:
    """``schedule`` carrying ``bounds`` = (least, greatest) of ``values``; none where a value is a
    tensor (a schedule built inside ``vmap``, one value per member: its consumer then checks it at
    every step, on the device)."""
    if any(isinstance(v, Tensor) for v in values):
        return schedule
    schedule.bounds = (float(min(values)), float(max(values)))  # type: ignore[attr-defined]
    return schedule


def constant(v: float) -> Schedule:
    """v at every step.

    Args:
        v: the value.

    Returns:
        A schedule ``t -> v``, a 0-d float64 tensor on ``t``'s device; its ``bounds`` are (v, v).

    Raises:
        ValueError: ``v`` is not a finite number.
    """
    check_number("v", v)

    def schedule(t: Tensor) -> Tensor:
        return torch.full((), v, dtype=torch.float64, device=t.device)

    return _with_bounds(schedule, v)


def cosine(peak: float, total_steps: int, warmup_steps: int = 0, final: float = 0.0) -> Schedule:
    """Linear warm-up from 0 to ``peak`` over ``warmup_steps``, then cosine decay to ``final`` at ``total_steps``.

    v(t) = peak·(t+1)/w for t < w; else final + (peak − final)·(1 + cos(π·min(1, (t−w)/(T−w))))/2.

    Args:
        peak: the value at the end of the warm-up.
        total_steps: T, the step at which the decay reaches ``final`` (and stays there).
        warmup_steps: w, the number of warm-up steps; 0 starts the decay at ``peak``.
        final: the value from step T on.

    Returns:
        A schedule ``t -> v(t)``, a 0-d float64 tensor; a count t below 0 reads as 0. Its
            ``bounds`` are the least and greatest of peak/w (with a warm-up), ``peak`` and
            ``final``.

    Raises:
        ValueError: ``peak`` or ``final`` is not a finite number, ``total_steps`` is not an integer
            > 0, or ``warmup_steps`` is outside [0, ``total_steps``].
    """
    check_number("peak", peak)
    check_number("final", final)
    check_int("total_steps", total_steps)
    check_int("warmup_steps", warmup_steps, at_least=0)
    if not 0 <= warmup_steps <= total_steps:
        raise ValueError(f"warmup_steps must be in [0, total_steps]; got {warmup_steps}")
    # Float constants: a 0-d float64 tensor and a Python float make one op, an int adds a promotion.
    warmup, decay = float(warmup_steps), float(max(total_steps - warmup_steps, 1))

    def schedule(t: Tensor) -> Tensor:
        t = _f64(t)
        progress = torch.clamp((t - warmup) / decay, 0.0, 1.0)
        cos = final + (peak - final) * 0.5 * (1.0 + torch.cos(math.pi * progress))
        if warmup_steps == 0:  # a count below 0 gives progress 0: peak
            return cos
        warm = peak * (torch.clamp_min(t, 0.0) + 1.0) / warmup
        return torch.where(t < warmup, warm, cos)

    return _with_bounds(schedule, peak, final, *((peak / warmup,) if warmup_steps else ()))


def inverse_sqrt(initial: float) -> Schedule:
    """v(t) = v₀/√(t+1): ρ_t = ρ₀/√t and η_t = η₀/√t of paper Theorem 4.3 (t counted from 1).

    Args:
        initial: v₀, the value at t = 0.

    Returns:
        A schedule ``t -> v(t)``, a 0-d float64 tensor; a count t below 0 reads as 0. Its
            ``bounds`` are 0 and v₀, the values it tends to and starts from.

    Raises:
        ValueError: ``initial`` is not a finite number.
    """
    check_number("initial", initial)

    def schedule(t: Tensor) -> Tensor:
        return initial / torch.sqrt(torch.clamp_min(_f64(t), 0.0) + 1)

    return _with_bounds(schedule, 0.0, initial)


def proportional(
    initial: float, lr: Schedule, lr_initial: float, floor: float = 0.0, lr_min: float = 0.0
) -> Schedule:
    """ρ following the learning rate down to a floor: ρ(t) = ρ_min + (ρ₀ − ρ_min) · lr(t) / lr₀.

    With ``lr_min`` = lr_min ≠ 0, ρ(t) = ρ_min + (ρ₀ − ρ_min) · (lr(t) − lr_min) / (lr₀ − lr_min):
    ρ_min where the lr reaches lr_min, GSAM's ρ_t ∝ lr_t schedule (Zhuang et al. 2022,
    https://arxiv.org/abs/2203.08065; ``pytorch_optimizer.ProportionScheduler``'s ``min_lr``).

    The authors' ``ProportionScheduler`` (github.com/xxgege/GAM, commit 694133d, ``gam/util.py``
    l.23-62) with ``max_value`` = ρ₀ (``initial``), ``min_value`` = ρ_min (``floor``), ``max_lr`` =
    lr₀ (``lr_initial``) and ``min_lr`` = 0, the value ``gam/optimizer_helper.py`` l.21-25 passes.
    ``floor=0`` gives ρ₀ · lr(t) / lr₀; ``floor=initial`` a constant ρ₀ (their released setting).

    Warning:
        Their scheduler steps after each optimisation step, from the lr of that step, so the first
        step of an epoch whose lr changed uses the previous epoch's value; here ρ(t) follows the lr
        of step t itself. With their released ``min_value = max_value`` the two are the same.

    Args:
        initial: ρ₀, the value where the lr is ``lr_initial``.
        lr: the learning-rate schedule that ρ follows.
        lr_initial: lr₀, the learning rate at which ρ is ``initial``.
        floor: ρ_min, the value where the lr reaches ``lr_min``.
        lr_min: the learning rate at which ρ is ``floor``.

    Returns:
        A schedule ``t -> ρ(t)``, a 0-d tensor. Where ``lr`` states its ``bounds``, so does it:
            the values of the formula at lr's two bounds.

    Raises:
        ValueError: ``initial``, ``lr_initial``, ``floor`` or ``lr_min`` is not a finite number,
            ``lr`` is not callable, ``lr_initial`` is zero or equals ``lr_min``, or ``floor`` is
            outside [0, ``initial``] (their ``assert max_value >= min_value``, l.41).
    """
    for name, v in (("initial", initial), ("lr_initial", lr_initial)):
        check_number(name, v)
    for name, v in (("floor", floor), ("lr_min", lr_min)):
        check_number(name, v)
    if not callable(lr):
        raise ValueError(f"lr must be a schedule (a function of the step count); got {lr!r}")
    if lr_initial == 0:
        raise ValueError("lr_initial must be non-zero")
    if lr_initial == lr_min:
        raise ValueError(f"lr_min must differ from lr_initial={lr_initial}; got {lr_min}")
    if not 0 <= floor <= initial:
        raise ValueError(f"floor must be in [0, initial={initial}]; got {floor}")

    def schedule(t: Tensor) -> Tensor:
        if lr_min != 0:
            return floor + (initial - floor) * (lr(t) - lr_min) / (lr_initial - lr_min)
        if floor == 0:  # no floor: the same operations as before it existed
            return initial * lr(t) / lr_initial
        return floor + (initial - floor) * lr(t) / lr_initial

    lr_bounds = getattr(lr, "bounds", None)
    if lr_bounds is None:
        return schedule
    at = [floor + (initial - floor) * (x - lr_min) / (lr_initial - lr_min) for x in lr_bounds]
    return _with_bounds(schedule, *at)


def value(h: float | Schedule, step: Tensor | None) -> float | Tensor:
    """A hyperparameter's value at ``step``: the number itself, or the schedule evaluated at step.

    Args:
        h: a number (or a 0-d tensor), or a schedule ``t -> 0-d tensor``.
        step: the step count t, a 0-d integer tensor; None reads a schedule at t = 0.

    Returns:
        ``h`` itself, or ``h(step)``.

    Raises:
        TypeError: the schedule returned something other than a tensor (a Python number would be
            baked into a compiled step as a constant).
    """
    if not callable(h):
        return h
    if step is None:
        step = torch.zeros((), dtype=torch.int64)
    out = h(step)
    if not isinstance(out, Tensor):
        raise TypeError(
            f"a schedule must return a tensor computed from the 0-d step tensor it is given; it "
            f"returned {type(out).__name__}: use torch operations (see gamfunc.schedules.cosine)"
        )
    return out
