"""The primitives that keep running statistics of the direction: momentum
([`trace`][gamfunc.optim.moments.trace], as ``torch.optim.SGD``), Adam's two moments
([`scale_by_adam`][gamfunc.optim.moments.scale_by_adam]) and Lion's
([`scale_by_lion`][gamfunc.optim.moments.scale_by_lion]), each with the NamedTuple of its state.

Each is a [`Transform`][gamfunc.optim.base.Transform] of
[`gamfunc.optim.transforms`][gamfunc.optim.transforms], which re-exports them; the optimisers
chain them with the learning rate and weight decay.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from gamfunc import tree
from gamfunc.checks import check_nonnegative, check_unit
from gamfunc.optim.base import Transform, check_state_type, need_step
from gamfunc.tree import Tree

__all__ = [
    "ScaleByAdamState",
    "ScaleByLionState",
    "TraceState",
    "scale_by_adam",
    "scale_by_lion",
    "trace",
]


class TraceState(NamedTuple):
    """The state of [`trace`][gamfunc.optim.moments.trace].

    Attributes:
        momentum_buffer: b, a dict name -> tensor (``torch.optim.SGD``'s name).
    """

    momentum_buffer: Tree


def trace(momentum: float, dampening: float = 0.0, nesterov: bool = False) -> Transform:
    r"""Momentum, as ``torch.optim.SGD`` forms it: its buffer, dampening and Nesterov's form.

    With d the direction, μ = ``momentum``, τ = ``dampening``, t the step count:

    $$
    \begin{aligned}
    b & \leftarrow d \mathrm{at} t = 0, \mathrm{else} \mu \cdot b + (1 - \tau )\cdot d \\
    u & = d + \mu \cdot b \ \text{if nesterov else}\ b
    \end{aligned}
    $$

    The first step's b ← d is torch's (its buffer starts as a copy of the gradient). With τ = 0
    it is μ·0 + d, so the step count is read only where τ ≠ 0, through a 0/1 factor (no branch on
    a value).

    Args:
        momentum: μ >= 0.
        dampening: τ >= 0.
        nesterov: Nesterov momentum (needs μ > 0 and τ = 0, as torch.optim).

    Returns:
        A [`Transform`][gamfunc.optim.base.Transform] whose state is a [`TraceState`][gamfunc.optim.moments.TraceState]; its update
            takes ``step=`` (needed where τ ≠ 0).

    Raises:
        ValueError: an invalid argument, naming it.
    """
    momentum = check_nonnegative("momentum", momentum)
    dampening = check_nonnegative("dampening", dampening)
    if nesterov and (momentum <= 0 or dampening != 0):
        raise ValueError("nesterov requires momentum > 0 and dampening = 0")

    def init(params):
        return TraceState(tree.zeros_like(params))

    def update(direction, state, params, *, step=None):
        check_state_type(state, TraceState, "trace")
        buf = state.momentum_buffer
        if dampening == 0:
            buf = tree.axpy(momentum, buf, direction)
        else:
            # the factors of b and d are (0, 1) at t = 0 and (μ, 1 − τ) after (exact in float64)
            later = (need_step(step, "trace with dampening") != 0).to(torch.float64)
            taken = tree.scale(direction, torch.rsub(later, 1.0, alpha=dampening))
            buf = tree.axpy(later * momentum, buf, taken)
        out = tree.axpy(momentum, buf, direction) if nesterov else buf
        return out, TraceState(buf)

    return Transform(init, update)


class ScaleByAdamState(NamedTuple):
    """The state of [`scale_by_adam`][gamfunc.optim.moments.scale_by_adam].

    Attributes:
        exp_avg: m, the first moment, a dict name -> tensor (``torch.optim.Adam``'s names).
        exp_avg_sq: v, the second moment, a dict name -> tensor.
    """

    exp_avg: Tree
    exp_avg_sq: Tree


def scale_by_adam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> Transform:
    r"""Adam's scaling of the direction, with its bias corrections.

    With d the direction and t the step count (updates taken so far):

    $$
    \begin{aligned}
    m & \leftarrow \beta _{1}\cdot m + (1 - \beta _{1})\cdot d \\
    v & \leftarrow \beta _{2}\cdot v + (1 - \beta _{2})\cdot d^{2} \\
    u & = m / (\sqrt{v}/\sqrt{1 - \beta _{2}^{t+1}} + \varepsilon ) / (1 - \beta _{1}^{t+1})
    \end{aligned}
    $$

    the operations of ``torch.optim.Adam``, as ``torch._foreach`` kernels (one kernel per operation
    on a GPU), per tensor under ``torch.func.vmap``.

    Args:
        b1: β₁ in [0, 1).
        b2: β₂ in [0, 1).
        eps: ε >= 0.

    Returns:
        A [`Transform`][gamfunc.optim.base.Transform] whose state is a [`ScaleByAdamState`][gamfunc.optim.moments.ScaleByAdamState]; its
            update needs ``step=``.

    Raises:
        ValueError: an invalid argument, naming it.
    """
    b1 = check_unit("b1", b1, below_one=True)
    b2 = check_unit("b2", b2, below_one=True)
    eps = check_nonnegative("eps", eps)

    def init(params):
        return ScaleByAdamState(tree.zeros_like(params), tree.zeros_like(params))

    def update(direction, state, params, *, step=None):
        check_state_type(state, ScaleByAdamState, "scale_by_adam")
        t = need_step(step, "scale_by_adam (bias correction)").to(torch.float64) + 1
        keys = list(direction)
        d = [direction[k] for k in keys]
        m, v = [state.exp_avg[k] for k in keys], [state.exp_avg_sq[k] for k in keys]
        c1, c2 = 1 - b1**t, torch.sqrt(1 - b2**t)
        if tree.vmapped([*d, *m, t]):  # foreach kernels have no batching rule
            m = [torch.lerp(a, g, 1 - b1) for a, g in zip(m, d, strict=True)]
            v = [torch.addcmul(a * b2, g, g, value=1 - b2) for a, g in zip(v, d, strict=True)]
            u = [a / (torch.sqrt(b) / c2 + eps) / c1 for a, b in zip(m, v, strict=True)]
        else:
            m = torch._foreach_lerp(m, d, 1 - b1)
            v = torch._foreach_addcmul(torch._foreach_mul(v, b2), d, d, value=1 - b2)
            denom = torch._foreach_sqrt(v)
            denom = torch._foreach_div(denom, tree.scalar_like(c2, denom))
            u = torch._foreach_div(m, torch._foreach_add(denom, eps))
            u = torch._foreach_div(u, tree.scalar_like(c1, u))
        new = ScaleByAdamState(dict(zip(keys, m, strict=True)), dict(zip(keys, v, strict=True)))
        return dict(zip(keys, u, strict=True)), new

    return Transform(init, update)


class ScaleByLionState(NamedTuple):
    """The state of [`scale_by_lion`][gamfunc.optim.moments.scale_by_lion].

    Attributes:
        exp_avg: m, the momentum, a dict name -> tensor.
    """

    exp_avg: Tree


def scale_by_lion(b1: float = 0.9, b2: float = 0.99) -> Transform:
    r"""Lion's direction: the sign of an interpolated momentum (Chen et al. 2023, Algorithm 2).

    With d the direction:

    $$
    \begin{aligned}
    u & = \mathrm{sign}(\beta _{1}\cdot m + (1 - \beta _{1})\cdot d) \\
    m & \leftarrow \beta _{2}\cdot m + (1 - \beta _{2})\cdot d
    \end{aligned}
    $$

    Args:
        b1: β₁ in [0, 1).
        b2: β₂ in [0, 1).

    Returns:
        A [`Transform`][gamfunc.optim.base.Transform] whose state is a [`ScaleByLionState`][gamfunc.optim.moments.ScaleByLionState].

    Raises:
        ValueError: an invalid argument, naming it.
    """
    b1 = check_unit("b1", b1, below_one=True)
    b2 = check_unit("b2", b2, below_one=True)

    def init(params):
        return ScaleByLionState(tree.zeros_like(params))

    def update(direction, state, params):
        check_state_type(state, ScaleByLionState, "scale_by_lion")
        u, m = {}, {}
        for k, d in direction.items():
            mk = state.exp_avg[k]
            u[k] = torch.sign(torch.lerp(mk, d, 1 - b1))
            m[k] = torch.lerp(mk, d, 1 - b2)
        return u, ScaleByLionState(m)

    return Transform(init, update)
