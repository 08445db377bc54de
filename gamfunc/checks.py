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
from gamfunc.ranges import FINITE, NONNEGATIVE, POSITIVE, GuardedSchedule, Range, guarded

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
