"""The one contract of optimisers and transforms: ``init`` and ``update`` returning updates, and
:func:`apply_updates`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor

from gamfunc import tree
from gamfunc.schedules import Schedule
from gamfunc.tree import Tree

__all__ = [
    "Mask",
    "ScheduledLR",
    "Transform",
    "apply_updates",
    "check_lr",
    "check_mask",
    "hyper_state",
    "learning_rate",
    "lr_scheduled",
    "masked_keys",
    "with_hyper",
]

Mask = Mapping[str, bool] | Callable[[str, Tensor], bool] | None
"""Which parameters an option applies to: None (all), a dict name -> bool, or ``(name, tensor) -> bool``."""


class Transform(NamedTuple):
    """The one contract of everything that turns a direction into a move: optimisers and transforms.

    ``init(params) -> state``; ``update(direction, state, params) -> (updates, new_state)``, and the
    new parameters are ``apply_updates(params, updates)``, θ ← θ + u (optax's
    ``GradientTransformation``). An optimiser (:func:`gamfunc.sgd`, :func:`gamfunc.adamw`, ...) is a
    transform whose updates are its whole signed step, u = −η·(its update rule); a transform such as
    :func:`gamfunc.clip_by_global_norm` changes the direction it is given. So :func:`gamfunc.chain`
    puts any of them before, between or after an optimiser, and the result is again a Transform.

    ``state`` is a NamedTuple of tensors (:class:`~gamfunc.optim.sgd.SGDState`,
    :class:`~gamfunc.transforms.ClipState`, ``()`` for a stateless transform), a pytree for
    ``torch.compile`` and ``torch.func.vmap``. Neither function mutates its arguments, and ``update``
    branches on no tensor value. An optimiser's state has ``state.step`` (0-d int64, updates done so
    far) and ``state.lr`` (0-d float64); a chain's reads them through to the first element that has
    them.

    ``state.lr`` is the learning rate of the last update, η_{t−1} for ``state.step`` = t: the
    schedule's value at the step that update took, or the constant. In the state ``init`` returns
    (no update yet) it is the η the first update will use. A constant lr is read from
    ``state.lr`` by the update, so a state given a new 0-d tensor as its lr (:func:`with_hyper`)
    moves with it, and the update returns it as the lr it used; this is how
    ``torch.optim.lr_scheduler`` drives the facade, without recompiling a compiled step. A
    scheduled lr is the schedule's alone: its state is a :class:`ScheduledLR` and
    :func:`with_hyper` refuses to set it.

    Example:
        >>> import torch, gamfunc
        >>> opt = gamfunc.sgd(lr=0.1)
        >>> params = {"w": torch.ones(2)}
        >>> updates, state = opt.update({"w": torch.ones(2)}, opt.init(params), params)
        >>> updates["w"], gamfunc.apply_updates(params, updates)["w"]
        (tensor([-0.1000, -0.1000]), tensor([0.9000, 0.9000]))
    """

    init: Callable[[Tree], Any]
    update: Callable[[Tree, Any, Tree], tuple[Tree, Any]]


def apply_updates(params: Tree, updates: Tree) -> Tree:
    """θ + u for every parameter: the new parameters from a :class:`Transform`'s updates.

    Each sum is cast back to the parameter's dtype (an update of another dtype does not promote the
    parameter). ``params`` is not modified.

    Raises:
        ValueError: ``updates`` has other names than ``params``.

    Example:
        >>> import torch, gamfunc
        >>> gamfunc.apply_updates({"w": torch.ones(2)}, {"w": torch.tensor([0.5, -1.0])})
        {'w': tensor([1.5000, 0.0000])}
    """
    if updates.keys() != params.keys():
        missing = sorted(params.keys() - updates.keys())
        extra = sorted(updates.keys() - params.keys())
        raise ValueError(f"updates must have the names of params: missing {missing}, extra {extra}")
    keys = list(params)
    p, u = [params[k] for k in keys], [updates[k] for k in keys]
    if all(a.dtype == b.dtype for a, b in zip(p, u, strict=True)) and not tree.vmapped([*p, *u]):
        return dict(zip(keys, torch._foreach_add(p, u), strict=True))
    return {k: (params[k] + updates[k]).to(params[k].dtype) for k in keys}


class ScheduledLR:
    """Marks an optimiser state whose lr a schedule sets (e.g. ``ScheduledSGDState``): its ``lr``
    reports the schedule's value at the last update, and :func:`with_hyper` will not change it."""

    __slots__ = ()


def lr_scheduled(state) -> bool:
    """Whether a schedule sets ``state``'s lr: the state, or the one it wraps in its field ``opt``
    (a chain's), is a :class:`ScheduledLR`. A state that holds others (a chain's, param groups')
    answers through its own method ``lr_scheduled()``."""
    while not isinstance(state, ScheduledLR):
        if callable(getattr(state, "lr_scheduled", None)):
            return state.lr_scheduled()
        if "opt" not in getattr(state, "_fields", ()):
            return False
        state = state.opt
    return True


def with_hyper(state, **changes: Tensor):
    """``state`` with its ``step`` or ``lr`` replaced, wherever the optimiser keeps them: in its own
    fields, through the state's own ``with_hyper`` method (a chain's, param groups'), or in the state
    it wraps in its field ``opt``.

    The new ``lr`` is the η of the next update, for an optimiser built with a constant lr.

    Raises:
        ValueError: ``lr`` is given for a state whose lr comes from a schedule (the update would
            ignore it); build the optimiser with a new schedule, or with a constant lr to set it
            here between steps.
        TypeError: a name other than ``step`` and ``lr``, or a state without them.

    Example:
        >>> import torch, gamfunc
        >>> opt = gamfunc.sgd(lr=0.1)
        >>> state = opt.init({"w": torch.zeros(2)})
        >>> with_hyper(state, lr=torch.tensor(0.2, dtype=torch.float64)).lr
        tensor(0.2000, dtype=torch.float64)
    """
    unknown = sorted(set(changes) - {"step", "lr"})
    if unknown:
        raise TypeError(f"with_hyper changes step and lr only; got {unknown}")
    if "lr" in changes and lr_scheduled(state):
        raise ValueError(
            "lr cannot be set: this optimiser's lr is a schedule, which sets it at every update "
            "(a new value here would be ignored); build the optimiser with a new schedule, or with "
            "a constant lr to set it between steps"
        )
    if callable(getattr(state, "with_hyper", None)):  # a chain's, param groups'
        return state.with_hyper(**changes)
    fields = getattr(state, "_fields", ())
    # the constructor, not ``_replace``: dynamo on torch < 2.13 cannot return a NamedTuple that
    # ``_replace`` made from a compiled graph
    if all(k in fields for k in changes):
        return type(state)(*(changes.get(f, getattr(state, f)) for f in fields))
    if "opt" in fields:
        inner = with_hyper(state.opt, **changes)
        return type(state)(*(inner if f == "opt" else getattr(state, f) for f in fields))
    raise TypeError(
        f"an optimiser state must be a NamedTuple with fields step and lr (or wrap one in its field "
        f"opt); got {type(state).__name__}"
    )


def check_state_type(state, cls: type, optimizer: str) -> None:
    """A one-line TypeError unless ``state`` is ``optimizer``'s own state (a :class:`cls`): the
    state of another optimiser (an AdamW state given to an SGD step) fails here, not deep inside."""
    if not isinstance(state, cls):
        raise TypeError(
            f"state.opt is a {type(state).__name__}, not the {cls.__name__} of this step's "
            f"optimiser {optimizer}: make the state with step.init(params) of this step"
        )


def check_betas(betas) -> tuple[float, float]:
    """``(β₁, β₂)`` as floats, or a ValueError naming ``betas``: a pair, each in [0, 1)."""
    if not (isinstance(betas, tuple | list) and len(betas) == 2):
        raise ValueError(f"betas must be a pair (beta1, beta2); got {betas!r}")
    for i, b in enumerate(betas):
        if not (isinstance(b, int | float) and 0 <= b < 1):
            raise ValueError(f"betas[{i}] must be in [0, 1); got {b!r}")
    return float(betas[0]), float(betas[1])


def check_nonnegative(**numbers) -> None:
    """A ValueError naming the first of ``numbers`` that is not a finite number >= 0; a schedule
    (callable) passes."""
    for name, v in numbers.items():
        if callable(v):
            continue
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < float("inf"):
            raise ValueError(f"{name} must be a finite number >= 0; got {v!r}")


def check_lr(lr) -> None:
    if callable(lr):
        return
    if isinstance(lr, bool) or not isinstance(lr, int | float) or not 0 <= lr < float("inf"):
        raise ValueError(f"lr must be a finite number >= 0 or a schedule; got {lr!r}")


def _device(params: Tree) -> torch.device:
    return next(iter(params.values())).device if params else torch.device("cpu")


def hyper_state(params: Tree, lr: float | Schedule) -> tuple[Tensor, Tensor]:
    """``(step, lr)``: the step counter and learning rate every optimiser state starts with."""
    dev = _device(params)
    step = torch.zeros((), dtype=torch.int64, device=dev)
    lr0 = (
        scheduled(lr, step)
        if callable(lr)
        else torch.tensor(float(lr), dtype=torch.float64, device=dev)
    )
    return step, lr0.to(device=dev, dtype=torch.float64)


def learning_rate(lr: float | Schedule, state) -> Tensor:
    """η of this update: the schedule at ``state.step`` (the step this update takes), else
    ``state.lr``. The update returns it as its state's ``lr``, the lr of the last update."""
    return scheduled(lr, state.step) if callable(lr) else state.lr


def scheduled(schedule: Schedule, step: Tensor) -> Tensor:
    """``schedule(step)``, which must be a tensor (a Python number would be baked into a compiled
    step, or fail in the tensor math of the update)."""
    out = schedule(step)
    if not isinstance(out, Tensor):
        raise TypeError(
            f"lr schedule must return a tensor computed from the 0-d step tensor it is given; it "
            f"returned {type(out).__name__}: use torch operations (see gamfunc.schedules.cosine)"
        )
    return out


def check_mask(mask: Mask, name: str) -> None:
    """ValueError naming ``name`` unless ``mask`` is None, a callable or a dict of Python bools."""
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


def masked_keys(mask: Mask, params: Tree, name: str) -> list[str]:
    """The names of ``params`` that ``mask`` selects, in the order of ``params``.

    The choice is made from names and shapes, as Python bools, so a compiled update traces it once and
    keeps it as a constant. A dict must name every parameter; a callable must return a bool.
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
