"""Adam with coupled (L2) weight decay: ``torch.optim.Adam`` as a pure update."""

from __future__ import annotations

import functools

from gamfunc.checks import check_betas, check_mask, check_nonnegative
from gamfunc.optim import transforms
from gamfunc.optim.base import Mask, Transform
from gamfunc.optim.decay import decayed, given
from gamfunc.optim.inject import inject_hyperparams

__all__ = ["adam"]


def adam(
    lr=1e-3,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay=0.0,
    weight_decay_mask: Mask = None,
) -> Transform:
    r"""Adam, the update of ``torch.optim.Adam`` (weight decay added to the direction) as a pure function.

    With d the direction, η = ``lr``, (β₁, β₂) = ``betas``, ε = ``eps``, λ = ``weight_decay``, t the
    step counted from 1:

    $$
    \begin{aligned}
    d & \leftarrow d + \lambda \cdot \theta \qquad \text{(where the mask is true)} \\
    m & \leftarrow \beta _{1}\cdot m + (1 - \beta _{1})\cdot d \\
    v & \leftarrow \beta _{2}\cdot v + (1 - \beta _{2})\cdot d^{2} \\
    u & = -\eta /(1 - \beta _{1}^{t}) \cdot m / (\sqrt{v}/\sqrt{1 - \beta _{2}^{t}} + \varepsilon ) \qquad \text{(the updates: θ ← θ + u)}
    \end{aligned}
    $$

    that is ``chain(add_decayed_weights(λ, mask), scale_by_adam(β₁, β₂, ε),
    scale_by_learning_rate(η))`` with η and λ injected ([`gamfunc.inject_hyperparams`][gamfunc.inject_hyperparams]).

    Args:
        lr: η, float >= 0 or a schedule.
        betas: (β₁, β₂), each in [0, 1).
        eps: ε >= 0.
        weight_decay: λ >= 0 (L2, coupled), or a schedule of the step count.
        weight_decay_mask: which parameters decay, as in [`gamfunc.adamw`][gamfunc.optim.adamw.adamw].

    Returns:
        A [`Transform`][gamfunc.optim.base.Transform]; its state is an
            [`InjectState`][gamfunc.optim.inject.InjectState], its update needs ``step=`` (bias correction).

    Raises:
        ValueError: an invalid argument, naming it: a tensor of more than one element or with a
            value out of range, a schedule whose ``bounds`` leave it (a schedule without bounds is
            checked at each step, [`gamfunc.checks`][gamfunc.checks]); at ``init``, a value not
            finite in the dtype of the state (``lr=1e40`` for float32 params); at ``update``, a
            direction of other names or shapes than the params.

    Example:
        >>> import torch, gamfunc
        >>> opt = gamfunc.adam(lr=1e-3)
        >>> params = {"w": torch.ones(2)}
        >>> step = torch.tensor(0)
        >>> updates, state = opt.update({"w": torch.ones(2)}, opt.init(params), params, step=step)
        >>> tuple(round(x, 4) for x in gamfunc.apply_updates(params, updates)["w"].tolist())
        (0.999, 0.999)

    References:
        Kingma and Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015,
        https://arxiv.org/abs/1412.6980.
    """
    return adam_transform(lr, betas, eps, weight_decay, weight_decay_mask, decoupled=False)


def adam_transform(
    lr, betas, eps, weight_decay, weight_decay_mask, *, decoupled: bool
) -> Transform:
    """Adam's chain with η and λ injected: L2 decay added to the gradient before the moments
    (``decoupled=False``, Adam) or to the Adam direction after them (``decoupled=True``, AdamW).

    Args:
        lr: η, float >= 0 or a schedule.
        betas: (β₁, β₂), each in [0, 1).
        eps: ε >= 0.
        weight_decay: λ >= 0, or a schedule of the step count.
        weight_decay_mask: which parameters decay.
        decoupled: AdamW's decay (after the moments) instead of Adam's (before them).

    Returns:
        The [`Transform`][gamfunc.optim.base.Transform] of [`adam`][gamfunc.optim.adam.adam] or
            [`adamw`][gamfunc.optim.adamw.adamw].

    Raises:
        ValueError: an invalid argument, naming it: a tensor of more than one element or with a
            value out of range, a schedule whose ``bounds`` leave it (a schedule without bounds is
            checked at each step, [`gamfunc.checks`][gamfunc.checks]); at ``init``, a value not
            finite in the dtype of the state (``lr=1e40`` for float32 params); at ``update``, a
            direction of other names or shapes than the params.
    """
    lr = check_nonnegative("lr", lr, schedule=True)
    beta1, beta2 = check_betas("betas", betas)
    eps = check_nonnegative("eps", eps)
    weight_decay = check_nonnegative("weight_decay", weight_decay, schedule=True)
    check_mask("weight_decay_mask", weight_decay_mask)
    factory = functools.partial(
        _adam, betas=(beta1, beta2), eps=eps, mask=weight_decay_mask, decoupled=decoupled
    )
    return inject_hyperparams(factory)(lr=lr, **given(weight_decay))


def _adam(lr, weight_decay=None, *, betas, eps, mask, decoupled) -> Transform:
    decay = decayed(weight_decay, mask)
    b1, b2 = betas
    moments = transforms.scale_by_adam(b1, b2, eps)
    parts = (moments, *decay) if decoupled else (*decay, moments)
    return transforms.chain(*parts, transforms.scale_by_learning_rate(lr))
