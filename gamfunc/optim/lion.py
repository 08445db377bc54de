"""Lion (EvoLved Sign Momentum), Chen et al. 2023, as a pure update."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from gamfunc import tree
from gamfunc.optim.base import (
    Mask,
    ScheduledLR,
    Transform,
    check_betas,
    check_lr,
    check_mask,
    check_nonnegative,
    check_state_type,
    hyper_state,
    learning_rate,
    masked_keys,
)
from gamfunc.schedules import value
from gamfunc.tree import Tree

__all__ = ["LionState", "ScheduledLionState", "lion"]


class LionState(NamedTuple):
    """The state of :func:`lion`.

    Attributes:
        step: 0-d int64, updates done so far.
        lr: 0-d float64, η of the last update (:class:`~gamfunc.optim.base.Transform` tells how a
            constant lr is set through it).
        exp_avg: m, the momentum, a dict name -> tensor.
    """

    step: Tensor
    lr: Tensor
    exp_avg: Tree


class ScheduledLionState(LionState, ScheduledLR):
    """A :class:`LionState` whose lr a schedule sets; :func:`~gamfunc.optim.base.with_hyper`
    refuses to change it."""

    __slots__ = ()


def lion(
    lr=1e-4,
    betas: tuple[float, float] = (0.9, 0.99),
    weight_decay: float = 0.0,
    weight_decay_mask: Mask = None,
) -> Transform:
    """Lion: the sign of an interpolated momentum, with decoupled weight decay (paper Algorithm 2).

    With d the direction, η = ``lr``, (β₁, β₂) = ``betas``, λ = ``weight_decay``::

        c ← β₁·m + (1 − β₁)·d
        u = −η·(sign(c) + λ·θ)                             (λ·θ where the mask is true)
        θ ← θ + u                                          (gamfunc.apply_updates)
        m ← β₂·m + (1 − β₂)·d

    Lion's step has the same size in every coordinate, so its lr is usually 3-10× smaller than
    AdamW's and its weight decay as much larger (the paper's advice).

    Args:
        lr: η, float >= 0 or a schedule.
        betas: (β₁, β₂), each in [0, 1).
        weight_decay: λ >= 0, or a schedule of the step count.
        weight_decay_mask: which parameters decay, as in :func:`gamfunc.adamw`.

    Example:
        >>> import torch, gamfunc
        >>> opt = gamfunc.lion(lr=0.1)
        >>> params = {"w": torch.zeros(2)}
        >>> u, state = opt.update({"w": torch.tensor([3.0, -0.5])}, opt.init(params), params)
        >>> gamfunc.apply_updates(params, u)["w"].tolist()
        [-0.10000000149011612, 0.10000000149011612]

    References:
        Chen et al., "Symbolic Discovery of Optimization Algorithms", NeurIPS 2023,
        https://arxiv.org/abs/2302.06675.
    """
    check_lr(lr)
    beta1, beta2 = check_betas(betas)
    check_nonnegative(weight_decay=weight_decay)
    check_mask(weight_decay_mask, "weight_decay_mask")
    decays = callable(weight_decay) or weight_decay != 0
    State = ScheduledLionState if callable(lr) else LionState

    def init(params):
        masked_keys(weight_decay_mask, params, "weight_decay_mask")
        return State(*hyper_state(params, lr), tree.zeros_like(params))

    def update(direction, state, params):
        check_state_type(state, LionState, "lion")
        eta = learning_rate(lr, state)
        chosen = set(masked_keys(weight_decay_mask, params, "weight_decay_mask"))
        lam = value(weight_decay, state.step)
        u, m = {}, {}
        for k, x in params.items():
            d, mk = direction[k], state.exp_avg[k]
            c = torch.lerp(mk, d, 1 - beta1)
            u[k] = -eta * torch.sign(c)
            if decays and k in chosen:
                u[k] = u[k] - (eta * lam) * x
            m[k] = torch.lerp(mk, d, 1 - beta2)
        return u, State(state.step + 1, eta, m)

    return Transform(init, update)
