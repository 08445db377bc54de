"""Adam with coupled (L2) weight decay: ``torch.optim.Adam`` as a pure update."""

from __future__ import annotations

from gamfunc import tree
from gamfunc.optim.adamw import adamw
from gamfunc.optim.base import Mask, Transform, check_mask, check_nonnegative, masked_keys
from gamfunc.schedules import value

__all__ = ["adam"]


def adam(
    lr=1e-3,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    weight_decay_mask: Mask = None,
) -> Transform:
    """Adam, the update of ``torch.optim.Adam`` (weight decay added to the direction) as a pure function.

    With d the direction, η = ``lr``, (β₁, β₂) = ``betas``, ε = ``eps``, λ = ``weight_decay``, t the
    step counted from 1::

        d ← d + λ·θ                                        (where the mask is true)
        m ← β₁·m + (1 − β₁)·d
        v ← β₂·v + (1 − β₂)·d²
        u = −η/(1 − β₁ᵗ) · m / (√v/√(1 − β₂ᵗ) + ε)          (the updates: θ ← θ + u)

    It is :func:`gamfunc.adamw` without decoupled decay, on the decayed direction; its state is an
    :class:`gamfunc.optim.AdamWState`.

    Args:
        lr: η, float >= 0 or a schedule.
        betas: (β₁, β₂), each in [0, 1).
        eps: ε >= 0.
        weight_decay: λ >= 0 (L2, coupled), or a schedule of the step count.
        weight_decay_mask: which parameters decay, as in :func:`gamfunc.adamw`.

    Example:
        >>> import torch, gamfunc
        >>> opt = gamfunc.adam(lr=1e-3)
        >>> params = {"w": torch.ones(2)}
        >>> updates, state = opt.update({"w": torch.ones(2)}, opt.init(params), params)
        >>> tuple(round(x, 4) for x in gamfunc.apply_updates(params, updates)["w"].tolist())
        (0.999, 0.999)

    References:
        Kingma and Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015,
        https://arxiv.org/abs/1412.6980.
    """
    check_nonnegative(weight_decay=weight_decay)
    check_mask(weight_decay_mask, "weight_decay_mask")
    inner = adamw(lr, betas, eps, weight_decay=0.0)
    decays = callable(weight_decay) or weight_decay != 0

    def init(params):
        masked_keys(weight_decay_mask, params, "weight_decay_mask")
        return inner.init(params)

    def update(direction, state, params):
        if decays:
            lam = value(weight_decay, state.step)
            keys = masked_keys(weight_decay_mask, params, "weight_decay_mask")
            some = tree.axpy(lam, {k: params[k] for k in keys}, {k: direction[k] for k in keys})
            direction = direction | some
        return inner.update(direction, state, params)

    return Transform(init, update)
