"""Ranges of allowed values: the rule of one argument check (`Range`), and what applies it on the
device with no host read: a tensor guarded (`guarded`, NaN where out of range) and a schedule
guarded at every step (`GuardedSchedule`). The checks of `gamfunc.checks` are built on them.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["FINITE", "NONNEGATIVE", "POSITIVE", "GuardedSchedule", "Range", "guarded"]


class Range:
    """An interval of allowed values, [low, high] with either end open or absent: the rule of one
    check, applied alike to a number, to a schedule's bounds and, on the device, to a tensor.

    Args:
        what: the rule in words, for messages ("a finite number >= 0").
        low: the least value (None: no least), excluded where ``open_low``.
        high: the greatest value (None: no greatest), excluded where ``open_high``.
        open_low: ``low`` itself is outside.
        open_high: ``high`` itself is outside.
    """

    def __init__(self, what: str, low=None, high=None, open_low=False, open_high=False):
        self.what, self.low, self.high = what, low, high
        self.open_low, self.open_high = open_low, open_high

    def holds(self, v: float) -> bool:
        """Whether the number ``v`` is finite and inside (comparisons alone: a factory called
        inside a compiled step traces no function call)."""
        if not -math.inf < v < math.inf:
            return False
        if self.low is not None and (v <= self.low if self.open_low else v < self.low):
            return False
        return self.high is None or (v < self.high if self.open_high else v <= self.high)

    def holds_on_device(self, v: Tensor) -> Tensor:
        """Whether the tensor ``v`` is finite and inside, as a bool tensor on its device (no read)."""
        return torch.isfinite(v) & self.inside_on_device(v)

    def inside_on_device(self, v: Tensor) -> Tensor:
        """Whether the tensor ``v`` is inside, infinities counted by their sign, as a bool tensor
        on its device (no read): the comparisons alone, which a NaN fails; `isfinite` where the
        rule has no end."""
        if self.low is None and self.high is None:
            return torch.isfinite(v)
        ok = None
        if self.low is not None:
            ok = v > self.low if self.open_low else v >= self.low
        if self.high is not None:
            below = v < self.high if self.open_high else v <= self.high
            ok = below if ok is None else ok & below
        assert ok is not None  # an end was given
        return ok


FINITE = Range("a finite number")
"""Any finite number (`check_number`)."""
NONNEGATIVE = Range("a finite number >= 0", low=0)
"""Finite numbers >= 0 (`check_nonnegative`): learning rates, radii, weights, weight decay."""
POSITIVE = Range("a finite number > 0", low=0, open_low=True)
"""Finite numbers > 0 (`check_positive`)."""


def guarded(v: Tensor, rule: Range) -> Tensor:
    """``v`` where it follows ``rule``, else NaN: an out-of-range value turned into one that the
    step's non-finite guard skips, on the device, with no host read. An infinity inside the range
    (+inf for a rule >= 0) stays as it is, non-finite already; two kernels for a rule of one end.

    Args:
        v: a tensor.
        rule: the allowed values.

    Returns:
        A tensor of ``v``'s shape and dtype, equal to ``v`` bit for bit where it is in range.
    """
    return torch.where(rule.inside_on_device(v), v, math.nan)


class GuardedSchedule:
    """A schedule whose values are checked at every step, on the device: ``s(t)`` is the wrapped
    schedule's value at t where it follows the rule, NaN where it does not (`guarded`).

    What a check returns for a schedule that states no ``bounds``: a NaN makes the step's loss or
    update non-finite, so [`gamfunc.make_step`][gamfunc.make_step] skips the step (counted in
    ``metrics["skipped"]``), and reports it in ``metrics["out_of_range"]``.

    Args:
        name: the hyperparameter's name.
        schedule: the schedule given.
        rule: its allowed values (a `Range`).
    """

    def __init__(self, name: str, schedule: Callable, rule: Range):
        self.name, self.schedule, self.rule = name, schedule, rule

    def __call__(self, t: Tensor):
        out = self.schedule(t)
        if not isinstance(out, Tensor) or not out.is_floating_point():
            return out  # gamfunc.schedules.value refuses what is no floating tensor, naming it
        return guarded(out, self.rule)

    def __repr__(self) -> str:
        return f"GuardedSchedule({self.name!r}, {self.schedule!r}, {self.rule.what})"
