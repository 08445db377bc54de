"""AdamW (decoupled weight decay), as ``torch.optim.AdamW``."""

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

__all__ = ["AdamWState", "ScheduledAdamWState", "adamw"]


class AdamWState(NamedTuple):
    """The state of :func:`adamw`: a pytree of tensors (``torch.compile``, ``torch.func.vmap``).

    Attributes:
        step: 0-d int64, updates done so far (t − 1 of the next update).
        lr: 0-d float64, η of the last update (:class:`~gamfunc.optim.base.Transform` tells how a
            constant lr is set through it).
        exp_avg: m, the first moment, a dict name -> tensor (``torch.optim.AdamW``'s names).
        exp_avg_sq: v, the second moment, a dict name -> tensor.
    """

    step: Tensor
    lr: Tensor
    exp_avg: Tree
    exp_avg_sq: Tree


class ScheduledAdamWState(AdamWState, ScheduledLR):
    """An :class:`AdamWState` whose lr a schedule sets; :func:`~gamfunc.optim.base.with_hyper`
    refuses to change it."""

    __slots__ = ()


def adamw(
    lr=1e-3,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 1e-2,
    weight_decay_mask: Mask = None,
) -> Transform:
    """Adam with decoupled weight decay, the update of ``torch.optim.AdamW`` as a pure function.

    With d the direction, η = ``lr``, (β₁, β₂) = ``betas``, ε = ``eps``, λ = ``weight_decay``, t the
    step counted from 1::

        m ← β₁·m + (1 − β₁)·d
        v ← β₂·v + (1 − β₂)·d²
        u = −η/(1 − β₁ᵗ) · m / (√v/√(1 − β₂ᵗ) + ε) − η·λ·θ     (λ·θ where the mask is true)

    the updates, so that θ + u (:func:`gamfunc.apply_updates`) is ``torch.optim.AdamW``'s
    θ·(1 − η·λ) − η/(1 − β₁ᵗ) · m / (…) up to the rounding of the sum.

    Args:
        lr: η, float >= 0 or a schedule.
        betas: (β₁, β₂), each in [0, 1).
        eps: ε >= 0.
        weight_decay: λ >= 0, or a schedule of the step count (:mod:`gamfunc.ensemble` gives each
            member its λ as one).
        weight_decay_mask: which parameters decay: None (all, as torch.optim), a dict name -> bool
            naming every parameter, or a callable ``(name, tensor) -> bool`` that decides from the
            name or shape. :func:`gamfunc.decay_mask` gives the usual choice (no decay on biases
            and normalisation weights). Equal to ``torch.optim.AdamW`` with two param groups, the
            masked-out one with ``weight_decay=0``.

    Returns:
        A :class:`~gamfunc.optim.base.Transform`; its state is an :class:`AdamWState`.

    References:
        Loshchilov and Hutter, "Decoupled Weight Decay Regularization", ICLR 2019,
        https://arxiv.org/abs/1711.05101.
    """
    check_lr(lr)
    beta1, beta2 = check_betas(betas)
    check_nonnegative(eps=eps, weight_decay=weight_decay)
    check_mask(weight_decay_mask, "weight_decay_mask")
    decays = callable(weight_decay) or weight_decay != 0
    State = ScheduledAdamWState if callable(lr) else AdamWState

    def init(params):
        masked_keys(weight_decay_mask, params, "weight_decay_mask")
        return State(*hyper_state(params, lr), tree.zeros_like(params), tree.zeros_like(params))

    def decay(u, params, eta_wd):
        """u − η·λ·θ on the parameters the mask selects, u elsewhere (``u`` lists ``params``)."""
        chosen = masked_keys(weight_decay_mask, params, "weight_decay_mask")
        if len(chosen) == len(u):
            p = list(params.values())
            return torch._foreach_sub(u, torch._foreach_mul(p, tree.scalar_like(eta_wd, p)))
        if not chosen:
            return u
        some = [params[k] for k in chosen]
        decayed = torch._foreach_mul(some, tree.scalar_like(eta_wd, some))
        by_name = dict(zip(chosen, decayed, strict=True))
        return [x - by_name[k] if k in by_name else x for k, x in zip(params, u, strict=True)]

    def update(direction, state, params):
        check_state_type(state, AdamWState, "adamw")
        eta = learning_rate(lr, state)
        step = state.step + 1
        t = step.to(torch.float64)
        keys = list(params)
        p = [params[k] for k in keys]
        d = [direction[k] for k in keys]
        wd = value(weight_decay, state.step)
        if tree.vmapped([*p, *d, eta, wd]):  # foreach kernels have no batching rule
            return _per_tensor(direction, state, params, eta, wd, step, t)
        m = torch._foreach_lerp([state.exp_avg[k] for k in keys], d, 1 - beta1)
        v = [state.exp_avg_sq[k] for k in keys]
        v = torch._foreach_addcmul(torch._foreach_mul(v, beta2), d, d, value=1 - beta2)
        denom = torch._foreach_sqrt(v)
        denom = torch._foreach_div(denom, tree.scalar_like(torch.sqrt(1 - beta2**t), denom))
        r = torch._foreach_div(m, torch._foreach_add(denom, eps))
        u = torch._foreach_mul(r, tree.scalar_like(-eta / (1 - beta1**t), r))
        if decays:
            u = decay(u, params, eta * wd)
        new_state = State(
            step, eta, dict(zip(keys, m, strict=True)), dict(zip(keys, v, strict=True))
        )
        return dict(zip(keys, u, strict=True)), new_state

    def _per_tensor(direction, state, params, eta, wd, step, t):
        """The same update tensor by tensor (under ``torch.func.vmap``)."""
        chosen = set(masked_keys(weight_decay_mask, params, "weight_decay_mask"))
        u, m, v = {}, {}, {}
        for k, x in params.items():
            g = direction[k]
            m[k] = torch.lerp(state.exp_avg[k], g, 1 - beta1)
            v[k] = torch.addcmul(state.exp_avg_sq[k] * beta2, g, g, value=1 - beta2)
            denom = torch.sqrt(v[k]) / torch.sqrt(1 - beta2**t) + eps
            u[k] = (m[k] / denom) * (-eta / (1 - beta1**t))
            if decays and k in chosen:
                u[k] = u[k] - x * (eta * wd)
        return u, State(step, eta, m, v)

    return Transform(init, update)
