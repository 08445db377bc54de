"""The argument checks of every factory: each raises ValueError naming the argument it rejects.

One signature each, ``check_x(name, value, ...)``. A hyperparameter that may be a schedule
([`gamfunc.schedules`][gamfunc.schedules]) passes as a callable where ``schedule=True``; a 0-d tensor always passes,
as the value [`gamfunc.inject_hyperparams`][gamfunc.inject_hyperparams] gives a factory (checked where it was first given,
since reading it would stop a compiled step).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from torch import Tensor

__all__ = [
    "Mask",
    "check_betas",
    "check_int",
    "check_mask",
    "check_nonnegative",
    "check_number",
    "check_positive",
    "check_unit",
    "masked_keys",
]

Mask = Mapping[str, bool] | Callable[[str, Tensor], bool] | None
"""Which parameters an option applies to: None (all), a dict name -> bool, or ``(name, tensor) -> bool``."""


def _given(v, schedule: bool) -> bool:
    """Whether ``v`` is not a number to check here: a tensor, or a schedule where one is allowed."""
    return isinstance(v, Tensor) or (schedule and callable(v))


def _number(v) -> bool:
    """A finite int or float (not a bool), by comparisons alone: a factory called inside a compiled
    step ([`gamfunc.inject_hyperparams`][gamfunc.inject_hyperparams] calls it at every update) traces no function call."""
    return isinstance(v, int | float) and not isinstance(v, bool) and -math.inf < v < math.inf


def _what(kind: str, schedule: bool) -> str:
    return f"{kind} or a schedule" if schedule else kind


def check_number(name: str, v, *, schedule: bool = False) -> None:
    """A finite number of either sign.

    Args:
        name: the argument's name, for the message.
        v: its value.
        schedule: whether a schedule (a callable) is allowed.

    Raises:
        ValueError: ``v`` is not a finite number (a bool is not one).
    """
    if not _given(v, schedule) and not _number(v):
        raise ValueError(f"{name} must be {_what('a finite number', schedule)}; got {v!r}")


def check_nonnegative(name: str, v, *, schedule: bool = False) -> None:
    """A finite number >= 0.

    Args:
        name: the argument's name, for the message.
        v: its value.
        schedule: whether a schedule (a callable) is allowed.

    Raises:
        ValueError: ``v`` is not a finite number >= 0.
    """
    if not _given(v, schedule) and not (_number(v) and v >= 0):
        raise ValueError(f"{name} must be {_what('a finite number >= 0', schedule)}; got {v!r}")


def check_positive(name: str, v, *, schedule: bool = False) -> None:
    """A finite number > 0.

    Args:
        name: the argument's name, for the message.
        v: its value.
        schedule: whether a schedule (a callable) is allowed.

    Raises:
        ValueError: ``v`` is not a finite number > 0.
    """
    if not _given(v, schedule) and not (_number(v) and v > 0):
        raise ValueError(f"{name} must be {_what('a finite number > 0', schedule)}; got {v!r}")


def check_unit(name: str, v, *, schedule: bool = False, below_one: bool = False) -> None:
    """A number in [0, 1], or in [0, 1) with ``below_one``.

    Args:
        name: the argument's name, for the message.
        v: its value.
        schedule: whether a schedule (a callable) is allowed.
        below_one: whether 1 itself is refused.

    Raises:
        ValueError: ``v`` is not a number in [0, 1] ([0, 1) with ``below_one``).
    """
    inside = _number(v) and (0 <= v < 1 or (v == 1 and not below_one))
    if not _given(v, schedule) and not inside:
        interval = "[0, 1)" if below_one else "[0, 1]"
        raise ValueError(f"{name} must be {_what(f'a number in {interval}', schedule)}; got {v!r}")


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


def masked_keys(mask: Mask, params: Mapping[str, Tensor], name: str) -> list[str]:
    """The names of ``params`` that ``mask`` selects, in the order of ``params``.

    The choice is made from names and shapes, as Python bools, so a compiled update traces it once and
    keeps it as a constant. A dict must name every parameter; a callable must return a bool.

    Args:
        mask: None (every parameter), a dict name -> bool, or ``(name, tensor) -> bool``.
        params: the parameters by name.
        name: the argument's name, for the error.

    Returns:
        The selected names.

    Raises:
        ValueError: a dict without an entry for some parameter, or a callable that returns no
            bool (naming ``name``).
    """
    if mask is None:
        return list(params)
    if isinstance(mask, Mapping):
        missing = [k for k in params if k not in mask]
        if missing:
            raise ValueError(f"{name} has no entry for the parameters {missing}")
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
