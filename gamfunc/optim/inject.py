"""Hyperparameters as state: [`inject_hyperparams`][gamfunc.optim.inject.inject_hyperparams] keeps a factory's numbers (lr, weight decay,
...) as 0-d tensors in its state, where a step reads them and a caller sets them between steps
without recompiling, and evaluates its schedules at the step count (optax's ``inject_hyperparams``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from gamfunc import tree
from gamfunc.checks import check_nonnegative, check_number
from gamfunc.optim.base import Transform, call_update, check_like, check_state_type, need_step
from gamfunc.schedules import value
from gamfunc.tree import Tree

__all__ = [
    "InjectState",
    "check_fits",
    "hyperparam_dtype",
    "inject_hyperparams",
    "injected",
    "learning_rate",
    "map_injected",
    "set_hyperparams",
]


class InjectState(NamedTuple):
    """The state of a transform made by [`inject_hyperparams`][gamfunc.optim.inject.inject_hyperparams].

    Attributes:
        hyperparams: name -> 0-d tensor in `hyperparam_dtype` of the params, the constants the
            next update uses. Replace one
            (``state._replace(hyperparams={**state.hyperparams, "lr": new})``, or
            [`set_hyperparams`][gamfunc.optim.inject.set_hyperparams]) to change it between steps; a compiled step does not recompile.
        scheduled: name -> 0-d tensor of the same dtype, each schedule's value at the last update (at t = 0
            in the state ``init`` returns: the value the first update will use). Set by the
            schedule alone.
        inner: the state of the transform the factory builds.
    """

    hyperparams: dict[str, Tensor]
    scheduled: dict[str, Tensor]
    inner: Any


def _device(params: Tree) -> torch.device:
    return next(iter(params.values())).device if params else torch.device("cpu")


def hyperparam_dtype(params: Tree) -> torch.dtype:
    """The dtype in which an injected transform keeps its hyperparameters: the widest floating-point
    dtype of the params, at least float32 (float32 for float32, bfloat16 and float16 params,
    float64 where one is float64).

    An update computes in the params' dtype, so a wider hyperparameter would be rounded to it there
    anyway. A 0-d float64 tensor on the CPU is also the one input that ``torch.compile`` turns into a
    symbolic float, which sends Dynamo through a second trace of the whole step.

    Args:
        params: a flat dict of tensors.

    Returns:
        float32 or float64.
    """
    dtype = torch.float32
    for v in params.values():
        if v.is_floating_point():
            dtype = torch.promote_types(dtype, v.dtype)
    return dtype


def _scalar(v, device: torch.device, dtype: torch.dtype) -> Tensor:
    if isinstance(v, Tensor):
        return v.to(device=device, dtype=dtype)
    return torch.tensor(float(v), dtype=dtype, device=device)


def check_fits(name: str, v, dtype: torch.dtype) -> None:
    """A ValueError naming ``name`` unless ``v`` is finite in ``dtype``, the dtype an injected
    state keeps it in (`hyperparam_dtype`): ``lr=1e40`` passes the constructor's check, a finite
    float, but is stored as inf in float32. A tensor is read only where that waits for nothing and
    stops no trace (on the CPU, eager); a schedule is judged by its ``bounds``, where it states them.

    Args:
        name: the hyperparameter's name.
        v: a number, a tensor, or a schedule.
        dtype: the floating-point dtype it is kept in.

    Raises:
        ValueError: ``v`` (or a bound of the schedule ``v``) would not be finite in ``dtype``.
    """
    if isinstance(v, Tensor):
        if v.device.type != "cpu" or torch.compiler.is_compiling() or tree.vmapped([v]):
            return
        values = [float(v.reshape(-1)[0])] if v.numel() == 1 else []
    elif callable(v):
        values = list(getattr(v, "bounds", None) or ())
    else:
        values = [v]
    biggest = torch.finfo(dtype).max
    for x in values:
        if isinstance(x, int | float) and math.isfinite(x) and abs(x) > biggest:
            raise ValueError(
                f"{name}={x!r} is not finite in {dtype}, the dtype the optimiser keeps it in "
                f"(of the params: gamfunc.optim.hyperparam_dtype); its largest value is {biggest:.4g}"
            )


def inject_hyperparams(factory: Callable[..., Transform]) -> Callable[..., Transform]:
    """A factory whose numeric arguments live in the transform's state.

    ``inject_hyperparams(factory)(**kwargs)`` is ``factory(**kwargs)``, except that every argument
    given as a number or a 0-d tensor is kept in `InjectState.hyperparams` and every
    schedule (a callable ``t -> 0-d tensor``) is evaluated at the step count t of each update
    (`InjectState.scheduled`); the factory is called at every update with those values as
    0-d tensors, so it must accept tensors for them (every gamfunc factory does). Any other
    argument (a bool, a tuple, a mask) is passed as given.

    Args:
        factory: a function ``(**kwargs) -> Transform``.

    Returns:
        A function of the same keyword arguments returning a [`Transform`][gamfunc.optim.base.Transform],
            whose state is an [`InjectState`][gamfunc.optim.inject.InjectState]. Its update takes ``step=`` (needed where an argument
            is a schedule) and refuses a direction without the names and shapes of the params
            ([`check_like`][gamfunc.optim.base.check_like]); its ``init`` raises ValueError where
            a value is not finite in the dtype of the state (`check_fits`: ``lr=1e40`` for
            float32 params).

    Example:
        >>> import torch, gamfunc
        >>> opt = gamfunc.inject_hyperparams(gamfunc.optim.transforms.scale_by_learning_rate)(lr=0.1)
        >>> p = {"w": torch.ones(2)}
        >>> state = opt.init(p)
        >>> state = state._replace(hyperparams={"lr": torch.tensor(0.5)})
        >>> opt.update({"w": torch.ones(2)}, state, p)[0]
        {'w': tensor([-0.5000, -0.5000])}
    """
    if not callable(factory):
        raise TypeError(f"factory must build a Transform; got {type(factory).__name__}")

    def make(**kwargs) -> Transform:
        factory(**kwargs)  # the factory checks its arguments here, once
        numbers = {k: v for k, v in kwargs.items() if _numeric(v)}
        schedules = {k: v for k, v in kwargs.items() if callable(v) and not _numeric(v)}
        static = {k: v for k, v in kwargs.items() if k not in numbers and k not in schedules}

        def init(params):
            dev, dtype = _device(params), hyperparam_dtype(params)
            for k, v in (*numbers.items(), *schedules.items()):
                check_fits(k, v, dtype)
            hyper = {k: _scalar(v, dev, dtype) for k, v in numbers.items()}
            sched = {
                k: _scalar(value(h, torch.zeros((), dtype=torch.int64, device=dev)), dev, dtype)
                for k, h in schedules.items()
            }
            return InjectState(hyper, sched, factory(**static, **hyper, **sched).init(params))

        def update(direction, state, params, *, step=None):
            check_like(params, direction)
            check_state_type(state, InjectState, "an injected optimiser")
            if state.hyperparams.keys() != numbers.keys():
                names = f" keeping {sorted(state.hyperparams)} for {sorted(numbers)}"
                check_state_type(state, InjectState, "an injected optimiser", names)
            sched = {}
            for k, h in schedules.items():
                sched[k] = value(h, need_step(step, f"the schedule of {k}"))
            inner = factory(**static, **state.hyperparams, **sched)
            updates, inner_state = call_update(inner, direction, state.inner, params, step)
            dev = _device(params)
            kept = {k: v.to(device=dev, dtype=state.scheduled[k].dtype) for k, v in sched.items()}
            return updates, InjectState(state.hyperparams, kept, inner_state)

        return Transform(init, update)

    return make


def _numeric(v) -> bool:
    """A number (not a bool) or a 0-d tensor: a value kept in the state."""
    if isinstance(v, Tensor):
        return v.ndim == 0
    return isinstance(v, int | float) and not isinstance(v, bool)


def injected(state) -> list[InjectState]:
    """Every [`InjectState`][gamfunc.optim.inject.InjectState] in an optimiser's state, outermost first, in the order of the
    state's fields (a chain's elements, param groups in order).

    Args:
        state: an optimiser's state (any pytree of NamedTuples, tuples and dicts).

    Returns:
        A list of [`InjectState`][gamfunc.optim.inject.InjectState].
    """
    found = []

    def walk(node):
        if isinstance(node, InjectState):
            found.append(node)
            walk(node.inner)
        elif isinstance(node, tuple | list):
            for v in node:
                if not isinstance(v, Tensor):  # a state's list of tensors holds none
                    walk(v)

    walk(state)
    return found


def learning_rate(state) -> Tensor | None:
    """The lr of an optimiser's state: the first injected ``lr`` (set or scheduled), or None.

    This is the lr a step logs in ``metrics["lr"]``: after an update, the one that update used.

    Args:
        state: an optimiser's state.

    Returns:
        A 0-d tensor (in `hyperparam_dtype`), or None where no transform injects an ``lr``.
    """
    for s in injected(state):
        if "lr" in s.hyperparams:
            return s.hyperparams["lr"]
        if "lr" in s.scheduled:
            return s.scheduled["lr"]
    return None


def set_hyperparams(state, **values: float | Tensor):
    """``state`` with the hyperparameters ``values`` set in every [`InjectState`][gamfunc.optim.inject.InjectState] that keeps
    them; a number becomes a new 0-d tensor on that state's device and in its dtype, and a tensor
    is taken in that dtype.

    Args:
        state: an optimiser's state.
        **values: name -> a number or a 0-d tensor (e.g. ``lr=0.05``).

    Returns:
        The new state (``state`` itself is not changed).

    Raises:
        ValueError: a name that a schedule sets (the update would overwrite it), or that no
            injected transform in ``state`` keeps; a value that is not a finite number or a 0-d
            floating tensor, or a negative ``lr`` or ``weight_decay`` (the rules of the
            optimisers' constructors, [`gamfunc.checks`][gamfunc.checks]; a tensor's value is read
            only where it lies on the CPU, so that setting one never waits for a device).

    Example:
        >>> import torch, gamfunc
        >>> opt = gamfunc.sgd(lr=0.1)
        >>> state = gamfunc.set_hyperparams(opt.init({"w": torch.zeros(2)}), lr=0.2)
        >>> gamfunc.optim.learning_rate(state)
        tensor(0.2000)
    """
    states = injected(state)
    for name in values:
        if any(name in s.scheduled for s in states):
            raise ValueError(
                f"{name} cannot be set: a schedule sets it at every update (a new value would be "
                f"ignored); build the optimiser with a new schedule, or with a constant {name} to "
                f"set it between steps"
            )
        if not any(name in s.hyperparams for s in states):
            raise ValueError(f"{name} is not a hyperparameter this optimiser's state keeps")
        _check_value(name, values[name])
        for s in states:
            if name in s.hyperparams:
                check_fits(name, values[name], s.hyperparams[name].dtype)
    return map_injected(state, lambda s: _set(s, values))


def _check_value(name: str, v) -> None:
    """A value [`set_hyperparams`][gamfunc.optim.inject.set_hyperparams] may set: what the
    constructors take, as a number or a 0-d floating tensor."""
    if isinstance(v, Tensor):
        if v.ndim != 0 or not v.is_floating_point():
            raise ValueError(
                f"{name} must be a number or a 0-d floating tensor; got a tensor of shape "
                f"{tuple(v.shape)} and dtype {v.dtype}"
            )
        if v.device.type != "cpu":
            return
        v = float(v)
    check = check_nonnegative if name in ("lr", "weight_decay") else check_number
    check(name, v)


def _set(s: InjectState, values: dict) -> InjectState:
    mine = {
        k: v.to(s.hyperparams[k].dtype)
        if isinstance(v, Tensor)
        else _scalar(v, s.hyperparams[k].device, s.hyperparams[k].dtype)
        for k, v in values.items()
        if k in s.hyperparams
    }
    return InjectState({**s.hyperparams, **mine}, s.scheduled, s.inner)


def map_injected(state, fn: Callable[[InjectState], InjectState]):
    """``state`` with ``fn`` applied to every [`InjectState`][gamfunc.optim.inject.InjectState] in it, in the order of
    [`injected`][gamfunc.optim.inject.injected] (outermost first).

    Args:
        state: an optimiser's state.
        fn: ``InjectState -> InjectState``, e.g. one that sets each param group's lr.

    Returns:
        The new state, every NamedTuple built by its constructor (dynamo on torch < 2.13 cannot
            return one made by ``_replace``).
    """
    if isinstance(state, InjectState):
        s = fn(state)
        return InjectState(s.hyperparams, s.scheduled, map_injected(s.inner, fn))
    if isinstance(state, tuple) and hasattr(state, "_fields"):
        return type(state)(*(map_injected(v, fn) for v in state))
    if isinstance(state, tuple | list):
        return type(state)(map_injected(v, fn) for v in state)
    return state
