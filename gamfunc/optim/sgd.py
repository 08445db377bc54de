"""SGD with momentum, dampening, Nesterov and L2 weight decay, as ``torch.optim.SGD``."""

from __future__ import annotations

import functools

from gamfunc.checks import check_mask, check_nonnegative
from gamfunc.optim import transforms
from gamfunc.optim.base import Mask, Transform
from gamfunc.optim.decay import decayed, given
from gamfunc.optim.inject import inject_hyperparams

__all__ = ["sgd"]


def sgd(
    lr=1e-3,
    momentum: float = 0.0,
    dampening: float = 0.0,
    nesterov: bool = False,
    weight_decay=0.0,
    weight_decay_mask: Mask = None,
) -> Transform:
    r"""Stochastic gradient descent, the update of ``torch.optim.SGD`` as a pure function.

    With d the direction from an estimator, λ = ``weight_decay``, μ = ``momentum``, τ = ``dampening``,
    η = ``lr``:

    $$
    \begin{aligned}
    d & \leftarrow d + \lambda \cdot \theta \qquad \text{(where the mask is true)} \\
    b & \leftarrow d \ \text{at the first step, else}\ \mu \cdot b + (1 - \tau )\cdot d \qquad \text{(if μ ≠ 0)} \\
    d & \leftarrow d + \mu \cdot b \ \text{if nesterov else}\ b \qquad \text{(if μ ≠ 0)} \\
    u & = -\eta \cdot d \qquad \text{(the updates; θ ← θ + u is gamfunc.apply\_updates)}
    \end{aligned}
    $$

    that is ``chain(add_decayed_weights(λ, mask), trace(μ, τ, nesterov), scale_by_learning_rate(η))``
    ([`gamfunc.optim.transforms`][gamfunc.optim.transforms]; an element is left out where λ or μ is 0), with η and λ injected
    ([`gamfunc.inject_hyperparams`][gamfunc.inject_hyperparams]): a step logs η in ``metrics["lr"]``, and
    [`gamfunc.set_hyperparams`][gamfunc.set_hyperparams] sets a constant η or λ between steps.

    Args:
        lr: η, a float >= 0 or a schedule ([`gamfunc.schedules`][gamfunc.schedules]).
        momentum: μ >= 0.
        dampening: τ >= 0.
        nesterov: Nesterov momentum (needs μ > 0 and τ = 0, as torch.optim).
        weight_decay: λ >= 0, coupled (L2) weight decay; or a schedule of the step count
            ([`gamfunc.ensemble`][gamfunc.training.ensemble] gives each member its λ as one).
        weight_decay_mask: which parameters decay, as the ``mask`` of
            [`gamfunc.add_decayed_weights`][gamfunc.add_decayed_weights] ([`gamfunc.decay_mask`][gamfunc.decay_mask] gives the usual choice).

    Returns:
        A [`Transform`][gamfunc.optim.base.Transform]; its updates are u = −η·d, its state an
            [`InjectState`][gamfunc.optim.inject.InjectState] around the chain's
            [`ChainState`][gamfunc.optim.transforms.ChainState].

    Raises:
        ValueError: an invalid argument, naming it: a tensor of more than one element or with a
            value out of range, a schedule whose ``bounds`` leave it (a schedule without bounds is
            checked at each step, [`gamfunc.checks`][gamfunc.checks]); at ``init``, a value not
            finite in the dtype of the state (``lr=1e40`` for float32 params); at ``update``, a
            direction of other names or shapes than the params.

    Example:
        >>> import torch, gamfunc
        >>> opt = gamfunc.sgd(lr=0.1, momentum=0.9)
        >>> p = {"w": torch.ones(2)}
        >>> u, s = opt.update({"w": torch.ones(2)}, opt.init(p), p)
        >>> gamfunc.apply_updates(p, u)["w"]
        tensor([0.9000, 0.9000])
    """
    lr = check_nonnegative("lr", lr, schedule=True)
    momentum = check_nonnegative("momentum", momentum)
    dampening = check_nonnegative("dampening", dampening)
    if nesterov and (momentum <= 0 or dampening != 0):
        raise ValueError("nesterov requires momentum > 0 and dampening = 0")
    weight_decay = check_nonnegative("weight_decay", weight_decay, schedule=True)
    check_mask("weight_decay_mask", weight_decay_mask)
    factory = functools.partial(
        _sgd, momentum=momentum, dampening=dampening, nesterov=nesterov, mask=weight_decay_mask
    )
    return inject_hyperparams(factory)(lr=lr, **given(weight_decay))


def _sgd(lr, weight_decay=None, *, momentum, dampening, nesterov, mask) -> Transform:
    parts = decayed(weight_decay, mask)
    if momentum != 0:
        parts.append(transforms.trace(momentum, dampening, nesterov))
    return transforms.chain(*parts, transforms.scale_by_learning_rate(lr))
