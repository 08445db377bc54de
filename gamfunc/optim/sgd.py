"""SGD with momentum, dampening, Nesterov and L2 weight decay, as ``torch.optim.SGD``."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from gamfunc import tree
from gamfunc.optim.base import (
    Mask,
    ScheduledLR,
    Transform,
    check_lr,
    check_mask,
    check_state_type,
    hyper_state,
    learning_rate,
    masked_keys,
)
from gamfunc.schedules import value
from gamfunc.tree import Tree

__all__ = ["SGDState", "ScheduledSGDState", "sgd"]


class SGDState(NamedTuple):
    """The state of :func:`sgd`: a pytree of tensors (``torch.compile``, ``torch.func.vmap``).

    Attributes:
        step: 0-d int64, updates done so far (b ← d at step 0).
        lr: 0-d float64, η of the last update (:class:`~gamfunc.optim.base.Transform` tells how a
            constant lr is set through it).
        momentum_buffer: b, a dict name -> tensor (``torch.optim.SGD``'s name); ``()`` without
            momentum.
    """

    step: Tensor
    lr: Tensor
    momentum_buffer: Tree | tuple = ()


class ScheduledSGDState(SGDState, ScheduledLR):
    """An :class:`SGDState` whose lr a schedule sets; :func:`~gamfunc.optim.base.with_hyper` refuses
    to change it."""

    __slots__ = ()


def sgd(
    lr=1e-3,
    momentum: float = 0.0,
    dampening: float = 0.0,
    nesterov: bool = False,
    weight_decay: float = 0.0,
    weight_decay_mask: Mask = None,
) -> Transform:
    """Stochastic gradient descent, the update of ``torch.optim.SGD`` as a pure function.

    With d the direction from an estimator, λ = ``weight_decay``, μ = ``momentum``, τ = ``dampening``,
    η = ``lr``::

        d ← d + λ·θ                                         (where the mask is true)
        b ← d at the first step, else μ·b + (1 − τ)·d      (if μ ≠ 0)
        d ← d + μ·b if nesterov else b                      (if μ ≠ 0)
        u = −η·d                       (the updates; θ ← θ + u is gamfunc.apply_updates)

    Args:
        lr: η, a float >= 0 or a schedule (:mod:`gamfunc.schedules`).
        momentum: μ >= 0.
        dampening: τ >= 0.
        nesterov: Nesterov momentum (needs μ > 0 and τ = 0, as torch.optim).
        weight_decay: λ >= 0, coupled (L2) weight decay; or a schedule of the step count
            (:mod:`gamfunc.ensemble` gives each member its λ as one).
        weight_decay_mask: which parameters decay: None (all, as torch.optim), a dict name -> bool
            naming every parameter, or a callable ``(name, tensor) -> bool`` that decides from the
            name or shape. :func:`gamfunc.decay_mask` gives the usual choice (no decay on biases
            and normalisation weights). Equal to ``torch.optim.SGD`` with two param groups, the
            masked-out one with ``weight_decay=0``.

    Returns:
        A :class:`~gamfunc.optim.base.Transform`; its updates are u = −η·d, its state an
        :class:`SGDState`.

    Example:
        >>> import torch, gamfunc
        >>> opt = gamfunc.sgd(lr=0.1, momentum=0.9)
        >>> p = {"w": torch.ones(2)}
        >>> u, s = opt.update({"w": torch.ones(2)}, opt.init(p), p)
        >>> gamfunc.apply_updates(p, u)["w"]
        tensor([0.9000, 0.9000])
    """
    check_lr(lr)
    numbers = [("momentum", momentum), ("dampening", dampening)]
    if not callable(weight_decay):  # a schedule of the step is checked where it is evaluated
        numbers.append(("weight_decay", weight_decay))
    for name, v in numbers:
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < float("inf"):
            raise ValueError(f"{name} must be a finite number >= 0; got {v!r}")
    if nesterov and (momentum <= 0 or dampening != 0):
        raise ValueError("nesterov requires momentum > 0 and dampening = 0")
    check_mask(weight_decay_mask, "weight_decay_mask")
    State = ScheduledSGDState if callable(lr) else SGDState

    def decayed(direction, params, weight_decay):
        """d + λ·θ on the parameters the mask selects, d elsewhere."""
        keys = masked_keys(weight_decay_mask, params, "weight_decay_mask")
        if len(keys) == len(params):
            return tree.axpy(weight_decay, params, direction)
        if not keys:
            return direction
        some = tree.axpy(
            weight_decay, {k: params[k] for k in keys}, {k: direction[k] for k in keys}
        )
        return direction | some

    def init(params):
        masked_keys(weight_decay_mask, params, "weight_decay_mask")
        step, lr0 = hyper_state(params, lr)
        return State(step, lr0, tree.zeros_like(params) if momentum != 0 else ())

    def update(direction, state, params):
        check_state_type(state, SGDState, "sgd")
        tree.check_keys(params, direction)
        eta = learning_rate(lr, state)
        decays = callable(weight_decay) or weight_decay != 0
        d = decayed(direction, params, value(weight_decay, state.step)) if decays else direction
        buf = state.momentum_buffer
        if momentum != 0:
            # b ← d on the first step, without a Python branch on the step count: the factors of b and d
            # are (0, 1) at step 0 and (μ, 1 − τ) after, from a 0/1 tensor (exact in float64).
            later = (state.step != 0).to(torch.float64)
            taken = d if dampening == 0 else tree.scale(d, torch.rsub(later, 1.0, alpha=dampening))
            buf = tree.axpy(later * momentum, buf, taken)
            d = tree.axpy(momentum, buf, d) if nesterov else buf
        # −(η·d), so that θ + u is θ − η·d to the last bit, as torch.optim.SGD
        return tree.scale(d, -eta), State(state.step + 1, eta, buf)

    return Transform(init, update)
