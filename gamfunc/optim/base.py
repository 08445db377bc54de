"""What a base optimiser is: a pair of pure functions, ``init`` and ``update``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor

from gamfunc.optim.schedules import Schedule
from gamfunc.tree import Tree

__all__ = [
    "Mask",
    "Optimizer",
    "check_lr",
    "check_mask",
    "hyper_state",
    "learning_rate",
    "masked_keys",
]

Mask = Mapping[str, bool] | Callable[[str, Tensor], bool] | None
"""Which parameters an option applies to: None (all), a dict name -> bool, or ``(name, tensor) -> bool``."""


class Optimizer(NamedTuple):
    """``init(params) -> state``; ``update(direction, state, params) -> (new_params, new_state)``.

    ``state`` is a dict holding ``step`` (0-d int64, updates done so far), ``lr`` (0-d float64, the
    learning rate of the last update, or of the next one for a constant lr) and the optimiser's own
    buffers. For a constant lr, writing a new 0-d tensor into ``state["lr"]`` changes the learning rate
    without recompiling a compiled step (this is how ``torch.optim.lr_scheduler`` drives the facade).
    """

    init: Callable[[Tree], dict[str, Any]]
    update: Callable[[Tree, dict[str, Any], Tree], tuple[Tree, dict[str, Any]]]


def check_lr(lr) -> None:
    if callable(lr):
        return
    if isinstance(lr, bool) or not isinstance(lr, int | float) or not 0 <= lr < float("inf"):
        raise ValueError(f"lr must be a finite number >= 0 or a schedule; got {lr!r}")


def _device(params: Tree) -> torch.device:
    return next(iter(params.values())).device if params else torch.device("cpu")


def hyper_state(params: Tree, lr: float | Schedule) -> dict[str, Tensor]:
    """The ``step`` counter and ``lr`` entries every optimiser state starts with."""
    dev = _device(params)
    step = torch.zeros((), dtype=torch.int64, device=dev)
    lr0 = (
        scheduled(lr, step)
        if callable(lr)
        else torch.tensor(float(lr), dtype=torch.float64, device=dev)
    )
    return {"step": step, "lr": lr0.to(device=dev, dtype=torch.float64)}


def learning_rate(lr: float | Schedule, state: dict[str, Any]) -> Tensor:
    """The lr of this update: the schedule at ``state["step"]``, else ``state["lr"]``."""
    return scheduled(lr, state["step"]) if callable(lr) else state["lr"]


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
