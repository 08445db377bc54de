"""Lion (EvoLved Sign Momentum), Chen et al. 2023, as a pure update."""

from __future__ import annotations

import functools

from gamfunc.checks import check_betas, check_mask, check_nonnegative
from gamfunc.optim import transforms
from gamfunc.optim.base import Mask, Transform
from gamfunc.optim.decay import decayed, given
from gamfunc.optim.inject import inject_hyperparams

__all__ = ["lion"]


def lion(
    lr=1e-4,
    betas: tuple[float, float] = (0.9, 0.99),
    weight_decay=0.0,
    weight_decay_mask: Mask = None,
) -> Transform:
    r"""Lion: the sign of an interpolated momentum, with decoupled weight decay (paper Algorithm 2).

    With d the direction, η = ``lr``, (β₁, β₂) = ``betas``, λ = ``weight_decay``:

    $$
    \begin{aligned}
    c & \leftarrow \beta _{1}\cdot m + (1 - \beta _{1})\cdot d \\
    u & = -\eta \cdot (\mathrm{sign}(c) + \lambda \cdot \theta ) \qquad \text{(λ·θ where the mask is true)} \\
    \theta & \leftarrow \theta + u \qquad \text{(gamfunc.apply\_updates)} \\
    m & \leftarrow \beta _{2}\cdot m + (1 - \beta _{2})\cdot d
    \end{aligned}
    $$

    that is ``chain(scale_by_lion(β₁, β₂), add_decayed_weights(λ, mask),
    scale_by_learning_rate(η))`` with η and λ injected ([`gamfunc.inject_hyperparams`][gamfunc.inject_hyperparams]). Lion's
    step has the same size in every coordinate, so its lr is usually 3-10× smaller than AdamW's and
    its weight decay as much larger (the paper's advice).

    Args:
        lr: η, float >= 0 or a schedule.
        betas: (β₁, β₂), each in [0, 1).
        weight_decay: λ >= 0, or a schedule of the step count.
        weight_decay_mask: which parameters decay, as in [`gamfunc.adamw`][gamfunc.optim.adamw.adamw].

    Returns:
        A [`Transform`][gamfunc.optim.base.Transform]; its state is an
            [`InjectState`][gamfunc.optim.inject.InjectState].

    Raises:
        ValueError: an invalid argument, naming it: a tensor of more than one element or with a
            value out of range, a schedule whose ``bounds`` leave it (a schedule without bounds is
            checked at each step, [`gamfunc.checks`][gamfunc.checks]); at ``init``, a value not
            finite in the dtype of the state (``lr=1e40`` for float32 params); at ``update``, a
            direction of other names or shapes than the params.

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
    lr = check_nonnegative("lr", lr, schedule=True)
    beta1, beta2 = check_betas("betas", betas)
    weight_decay = check_nonnegative("weight_decay", weight_decay, schedule=True)
    check_mask("weight_decay_mask", weight_decay_mask)
    factory = functools.partial(_lion, betas=(beta1, beta2), mask=weight_decay_mask)
    return inject_hyperparams(factory)(lr=lr, **given(weight_decay))


def _lion(lr, weight_decay=None, *, betas, mask) -> Transform:
    decay = decayed(weight_decay, mask)
    return transforms.chain(
        transforms.scale_by_lion(*betas), *decay, transforms.scale_by_learning_rate(lr)
    )
