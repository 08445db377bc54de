"""What a base optimiser is: a pair of pure functions, ``init`` and ``update``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor

from gamfunc.schedules import Schedule
from gamfunc.tree import Tree

__all__ = [
    "Mask",
    "Optimizer",
    "check_lr",
    "check_mask",
    "hyper_state",
    "learning_rate",
    "masked_keys",
    "with_hyper",
]

Mask = Mapping[str, bool] | Callable[[str, Tensor], bool] | None
"""Which parameters an option applies to: None (all), a dict name -> bool, or ``(name, tensor) -> bool``."""


class Optimizer(NamedTuple):
    """``init(params) -> state``; ``update(direction, state, params) -> (new_params, new_state)``.

    ``state`` is a NamedTuple of the optimiser's own type (:class:`~gamfunc.optim.sgd.SGDState`,
    :class:`~gamfunc.optim.adamw.AdamWState`, :class:`~gamfunc.transforms.ChainState`), a pytree of
    tensors for ``torch.compile`` and ``torch.func.vmap``. Every such state has ``state.step`` (0-d
    int64, updates done so far) and ``state.lr`` (0-d float64, the learning rate of the last update,
    or of the next one for a constant lr): fields, or, for a state that wraps another optimiser's in
    its field ``opt`` (a chain's), properties reading through it. For a constant lr, a state with a
    new 0-d tensor as its lr (:func:`with_hyper`) changes the learning rate without recompiling a
    compiled step (this is how ``torch.optim.lr_scheduler`` drives the facade).
    """

    init: Callable[[Tree], Any]
    update: Callable[[Tree, Any, Tree], tuple[Tree, Any]]


def with_hyper(state, **changes: Tensor):
    """``state`` with its ``step`` or ``lr`` replaced, wherever the optimiser keeps them: in its own
    fields, or in those of the state it wraps in its field ``opt`` (a chain's).

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
    """The lr of this update: the schedule at ``state.step``, else ``state.lr``."""
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
