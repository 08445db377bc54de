"""AdamW (decoupled weight decay), as ``torch.optim.AdamW``."""

from __future__ import annotations

from gamfunc.optim.adam import adam_transform
from gamfunc.optim.base import Mask, Transform

__all__ = ["adamw"]


def adamw(
    lr=1e-3,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay=1e-2,
    weight_decay_mask: Mask = None,
) -> Transform:
    r"""Adam with decoupled weight decay, the update of ``torch.optim.AdamW`` as a pure function.

    With d the direction, η = ``lr``, (β₁, β₂) = ``betas``, ε = ``eps``, λ = ``weight_decay``, t the
    step counted from 1:

    $$
    \begin{aligned}
    m & \leftarrow \beta _{1}\cdot m + (1 - \beta _{1})\cdot d \\
    v & \leftarrow \beta _{2}\cdot v + (1 - \beta _{2})\cdot d^{2} \\
    u & = -\eta \cdot (m / (\sqrt{v}/\sqrt{1 - \beta _{2}^{t}} + \varepsilon ) / (1 - \beta _{1}^{t}) + \lambda \cdot \theta ) \qquad \text{(λ·θ where the mask is true)}
    \end{aligned}
    $$

    the updates, so that θ + u ([`gamfunc.apply_updates`][gamfunc.apply_updates]) is ``torch.optim.AdamW``'s
    θ·(1 − η·λ) − η/(1 − β₁ᵗ) · m / (…) up to the rounding of the sum. It is
    ``chain(scale_by_adam(β₁, β₂, ε), add_decayed_weights(λ, mask), scale_by_learning_rate(η))``
    with η and λ injected ([`gamfunc.inject_hyperparams`][gamfunc.inject_hyperparams]).

    Args:
        lr: η, float >= 0 or a schedule.
        betas: (β₁, β₂), each in [0, 1).
        eps: ε >= 0.
        weight_decay: λ >= 0, or a schedule of the step count ([`gamfunc.ensemble`][gamfunc.training.ensemble] gives each
            member its λ as one).
        weight_decay_mask: which parameters decay, as the ``mask`` of
            [`gamfunc.add_decayed_weights`][gamfunc.add_decayed_weights]. Equal to ``torch.optim.AdamW`` with two param
            groups, the masked-out one with ``weight_decay=0``.

    Returns:
        A [`Transform`][gamfunc.optim.base.Transform]; its state is an
            [`InjectState`][gamfunc.optim.inject.InjectState], its update needs ``step=`` (bias correction).

    Raises:
        ValueError: an invalid argument, naming it: a tensor of more than one element or with a
            value out of range, a schedule whose ``bounds`` leave it (a schedule without bounds is
            checked at each step, [`gamfunc.checks`][gamfunc.checks]); at ``init``, a value not
            finite in the dtype of the state (``lr=1e40`` for float32 params); at ``update``, a
            direction of other names or shapes than the params.

    References:
        Loshchilov and Hutter, "Decoupled Weight Decay Regularization", ICLR 2019,
        https://arxiv.org/abs/1711.05101.
    """
    return adam_transform(lr, betas, eps, weight_decay, weight_decay_mask, decoupled=True)
