"""The argument checks of every factory: each raises ValueError naming the argument it rejects.

One signature each, ``check_x(name, value, ...)``, returning the value to use: the number itself, a
tensor as a 0-d tensor, or a schedule, guarded where it must be (below).

A hyperparameter may be a 0-d tensor (or one of one element). Its shape and dtype are always
checked. Where the check runs once, when an optimiser or estimator is built, its value is read and
refused out of range (outside ``torch.compile`` and ``vmap``, which cannot read it). Where it runs
at every update (``read=False``: the factory that
[`gamfunc.inject_hyperparams`][gamfunc.inject_hyperparams] calls with the hyperparameters of its
state, [`scale_by_learning_rate`][gamfunc.optim.transforms.scale_by_learning_rate] and
[`add_decayed_weights`][gamfunc.optim.transforms.add_decayed_weights]), nothing is read: the check
returns the tensor guarded on the device (`guarded`), itself where its value is in range and NaN
where it is not, so that the step's non-finite guard skips a step that would use it. That is the
per-step check of every gamfunc optimiser's learning rate and weight decay, whoever set them.

Where ``schedule=True`` a schedule ([`gamfunc.schedules`][gamfunc.schedules]) passes too. A
schedule that states its ``bounds`` (every schedule of that module does: the least and the greatest
value it takes) is checked once, here, at both ends. Any other callable is returned guarded
(`GuardedSchedule`): its value at each step, or NaN where that value is out of range, computed on
the device with no host read, so that [`gamfunc.make_step`][gamfunc.make_step] skips such a step and
says so in ``metrics["out_of_range"]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from gamfunc import tree

__all__ = [
    "FINITE",
    "NONNEGATIVE",
    "POSITIVE",
    "GuardedSchedule",
    "Mask",
    "Range",
    "check_betas",
    "check_int",
    "check_mask",
    "check_nonnegative",
    "check_number",
    "check_positive",
    "check_unit",
    "guarded",
    "masked_keys",
]

Mask = Mapping[str, bool] | Callable[[str, Tensor], bool] | None
"""Which parameters an option applies to: None (all), a dict name -> bool, or ``(name, tensor) -> bool``."""


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


def _number(v) -> bool:
    """A finite int or float (not a bool), by comparisons alone: a factory called inside a compiled
    step ([`gamfunc.inject_hyperparams`][gamfunc.inject_hyperparams] calls it at every update) traces no function call."""
    return isinstance(v, int | float) and not isinstance(v, bool) and -math.inf < v < math.inf


def _what(kind: str, schedule: bool) -> str:
    return f"{kind} or a schedule" if schedule else kind


def _readable(v: Tensor) -> bool:
    """Whether ``v``'s value can be read without stopping a trace (``torch.compile``, ``vmap``)."""
    return not torch.compiler.is_compiling() and not tree.vmapped([v])


def _check(name: str, v, rule: Range, schedule: bool, read: bool):
    """The value of ``v`` to use, or a ValueError naming ``name`` (see the module)."""
    what = _what(rule.what, schedule)
    if isinstance(v, Tensor):
        if v.numel() != 1 or not (v.is_floating_point() or _integer(v)):
            raise ValueError(
                f"{name} must be {what}; got a tensor of shape {tuple(v.shape)} and dtype "
                f"{v.dtype} (a hyperparameter tensor holds one real number)"
            )
        v = v.reshape(()) if v.ndim else v
        if not (read and _readable(v)):
            return guarded(v, rule) if v.is_floating_point() else v
        if not rule.holds(float(v)):
            raise ValueError(f"{name} must be {what}; got {v!r}")
        return v
    if schedule and callable(v):
        if isinstance(v, GuardedSchedule) and v.rule is rule:
            return v
        bounds = getattr(v, "bounds", None)
        if bounds is None:
            return GuardedSchedule(name, v, rule)
        for end in bounds:
            if not (_number(end) and rule.holds(end)):
                raise ValueError(
                    f"{name} must be {what}; got a schedule whose values reach {end!r} "
                    f"(its bounds are {tuple(bounds)})"
                )
        return v
    if not (_number(v) and rule.holds(v)):
        raise ValueError(f"{name} must be {what}; got {v!r}")
    return v


def _integer(v: Tensor) -> bool:
    return not v.is_floating_point() and not v.is_complex() and v.dtype != torch.bool


def check_number(name: str, v, *, schedule: bool = False, read: bool = True):
    """A finite number of either sign.

    Args:
        name: the argument's name, for the message.
        v: its value: a number, a tensor of one element, or (``schedule``) a schedule.
        schedule: whether a schedule (a callable) is allowed.
        read: whether a tensor's value may be read (a check when a transform is built); False
            guards it on the device instead (a check at every update).

    Returns:
        The value to use (see the module): ``v``, a 0-d tensor, or a guarded schedule.

    Raises:
        ValueError: ``v`` is not a finite number (a bool is not one), a tensor of more than one
            element or with a value that is not finite, or a schedule whose bounds are not.
    """
    return _check(name, v, FINITE, schedule, read)


def check_nonnegative(name: str, v, *, schedule: bool = False, read: bool = True):
    """A finite number >= 0.

    Args:
        name: the argument's name, for the message.
        v: its value: a number, a tensor of one element, or (``schedule``) a schedule.
        schedule: whether a schedule (a callable) is allowed.
        read: whether a tensor's value may be read (a check when a transform is built); False
            guards it on the device instead (a check at every update).

    Returns:
        The value to use (see the module): ``v``, a 0-d tensor, or a guarded schedule.

    Raises:
        ValueError: ``v`` is not a finite number >= 0, a tensor of one such number, or a
            schedule whose bounds are (a schedule without bounds is guarded at each step).

    Example:
        >>> from gamfunc import schedules
        >>> check_nonnegative("lr", schedules.constant(-1.0), schedule=True)
        Traceback (most recent call last):
        ...
        ValueError: lr must be a finite number >= 0 or a schedule; got a schedule whose values reach -1.0 (its bounds are (-1.0, -1.0))
    """
    return _check(name, v, NONNEGATIVE, schedule, read)


def check_positive(name: str, v, *, schedule: bool = False, read: bool = True):
    """A finite number > 0.

    Args:
        name: the argument's name, for the message.
        v: its value: a number, a tensor of one element, or (``schedule``) a schedule.
        schedule: whether a schedule (a callable) is allowed.
        read: whether a tensor's value may be read (a check when a transform is built); False
            guards it on the device instead (a check at every update).

    Returns:
        The value to use (see the module).

    Raises:
        ValueError: ``v`` is not a finite number > 0 (a tensor or a schedule's bounds alike).
    """
    return _check(name, v, POSITIVE, schedule, read)


_UNIT = Range("a number in [0, 1]", low=0, high=1)
_UNIT_OPEN = Range("a number in [0, 1)", low=0, high=1, open_high=True)


def check_unit(name: str, v, *, schedule: bool = False, below_one: bool = False, read: bool = True):
    """A number in [0, 1], or in [0, 1) with ``below_one``.

    Args:
        name: the argument's name, for the message.
        v: its value: a number, a tensor of one element, or (``schedule``) a schedule.
        schedule: whether a schedule (a callable) is allowed.
        below_one: whether 1 itself is refused.
        read: whether a tensor's value may be read (False: guarded on the device instead).

    Returns:
        The value to use (see the module).

    Raises:
        ValueError: ``v`` is not a number in [0, 1] ([0, 1) with ``below_one``), a tensor or a
            schedule's bounds alike.
    """
    return _check(name, v, _UNIT_OPEN if below_one else _UNIT, schedule, read)


def check_int(name: str, v, *, at_least: int = 1) -> None:
    """An integer >= ``at_least``.

    Args:
        name: the argument's name, for the message.
        v: its value.
        at_least: the smallest value allowed.

    Raises:
        ValueError: ``v`` is not an integer >= ``at_least`` (a bool is not one).
    """
    if isinstance(v, bool) or not isinstance(v, int) or v < at_least:
        raise ValueError(f"{name} must be an integer >= {at_least}; got {v!r}")


def check_betas(name: str, betas) -> tuple[float, float]:
    """A pair (β₁, β₂), each in [0, 1).

    Args:
        name: the argument's name, for the message.
        betas: its value.

    Returns:
        ``(β₁, β₂)`` as floats.

    Raises:
        ValueError: ``betas`` is not a pair of numbers in [0, 1).
    """
    if not (isinstance(betas, tuple | list) and len(betas) == 2):
        raise ValueError(f"{name} must be a pair (beta1, beta2); got {betas!r}")
    for i, b in enumerate(betas):
        if not (_number(b) and 0 <= b < 1):
            raise ValueError(f"{name}[{i}] must be in [0, 1); got {b!r}")
    return float(betas[0]), float(betas[1])


def check_mask(name: str, mask) -> None:
    """A parameter mask: None, a callable ``(name, tensor) -> bool`` or a dict name -> bool.

    Args:
        name: the argument's name, for the message.
        mask: its value.

    Raises:
        ValueError: ``mask`` is none of these, or a dict with a value that is not a bool.
    """
    if mask is None or callable(mask):
        return
    if not isinstance(mask, Mapping):
        raise ValueError(
            f"{name} must be None, a dict name -> bool or a callable (name, tensor) -> bool; "
            f"got {type(mask).__name__}"
        )
    bad = sorted(str(k) for k, v in mask.items() if not isinstance(v, bool))
    if bad:
        raise ValueError(f"{name} must map names to True or False; {bad} are not bools")


def masked_keys(
    mask: Mask, params: Mapping[str, Tensor], name: str, exact: bool = False
) -> list[str]:
    """The names of ``params`` that ``mask`` selects, in the order of ``params``.

    The choice is made from names and shapes, as Python bools, so a compiled update traces it once and
    keeps it as a constant. A dict must name every parameter (with ``exact``, and no other); a
    callable must return a bool.

    Args:
        mask: None (every parameter), a dict name -> bool, or ``(name, tensor) -> bool``.
        params: the parameters by name.
        name: the argument's name, for the error.
        exact: refuse a dict that names a parameter ``params`` has not (a misspelt name would
            leave its choice unmade without a word).

    Returns:
        The selected names.

    Raises:
        ValueError: a dict without an entry for some parameter, or with ``exact`` one naming a
            parameter that is not there, or a callable that returns no bool (naming ``name``).
    """
    if mask is None:
        return list(params)
    if isinstance(mask, Mapping):
        missing = [k for k in params if k not in mask]
        if missing:
            raise ValueError(f"{name} has no entry for the parameters {missing}")
        unknown = [k for k in mask if k not in params] if exact else []
        if unknown:
            raise ValueError(
                f"{name} names {unknown}, which are not among the parameters the step trains "
                f"({len(params)}: {list(params)[:5]}{', ...' if len(params) > 5 else ''}); a mask "
                f"names exactly the step's parameters"
            )
        return [k for k in params if mask[k]]
    keys = []
    for k, v in params.items():
        chosen = mask(k, v)
        if not isinstance(chosen, bool):
            raise ValueError(
                f"{name} must return a Python bool (from the name or the shape, not the values); "
                f"got {type(chosen).__name__} for {k!r}"
            )
        if chosen:
            keys.append(k)
    return keys
