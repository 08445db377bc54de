"""WSAM: sharpness as a regulariser of weight γ/(1 − γ) beside the loss."""

from __future__ import annotations

from gamfunc import tree
from gamfunc.checks import check_nonnegative, check_unit
from gamfunc.estimators.base import Estimate, Estimator
from gamfunc.estimators.gradient import clean_info
from gamfunc.loss import ascent_point, gradient_pass
from gamfunc.schedules import value

__all__ = ["wsam"]


def wsam(rho, gamma, eps: float = 1e-12) -> Estimator:
    r"""WSAM (Yue et al. 2023): the gradient of L + γ/(1 − γ)·(sharpness).

    The weighted-sharpness objective and its first-order gradient, with g = ∇L(θ),
    ε̂ = ρ·g/(‖g‖ + ξ) and a = γ/(1 − γ):

    $$
    L^{\mathrm{WSAM}}(\theta) = L(\theta) + \frac{\gamma}{1-\gamma}
    \Bigl(\max_{\lVert\epsilon\rVert\le\rho} L(\theta+\epsilon) - L(\theta)\Bigr),\qquad
    d = (1 - a)\,\nabla L(\theta) + a\,\nabla L(\theta + \hat\epsilon).
    $$

    γ = 0 gives [`gradient`][gamfunc.estimators.gradient.gradient], γ = ½ gives
    [`sam`][gamfunc.estimators.sam.sam]; γ > ½ extrapolates beyond SAM (a > 1).

    Warning:
        This is the paper's coupled update, ``pytorch_optimizer.WSAM(decouple=False)``. The paper
        also gives a "weight decoupled" form (the reference's default, ``decouple=True``): the
        base optimiser sees only ∇L(θ), and a·lr·(∇L(θ + ε̂) − ∇L(θ)) is subtracted from θ after
        its update, as AdamW decouples weight decay. The two coincide for plain SGD (no
        momentum, no weight decay); for any other optimiser the decoupled form needs the step to
        apply a second update, which an estimator cannot express, and it is not provided.

    Note:
        For γ > ½ the direction subtracts (a − 1)·g from a·∇L(θ + ε̂): the rounding errors of the two
        gradients reach it multiplied by up to |1 − a| + a = 2a − 1 (17 at γ = 0.9). In bfloat16 or
        float16 it is correspondingly less accurate than SAM's gradient.

    Args:
        rho: ρ >= 0, the radius of the ascent, or a schedule of the step count.
        gamma: γ in [0, 1), the weight of the sharpness (the paper's default 0.9), or a schedule.
        eps: ξ >= 0, keeps g/(‖g‖ + ξ) finite at g = 0.

    Returns:
        An [`Estimator`][gamfunc.estimators.base.Estimator] named "wsam"; its info adds
            ``perturbed_loss`` = L(θ + ε̂).

    Raises:
        ValueError: ``rho`` or ``eps`` is negative or not finite, or ``gamma`` is outside [0, 1)
            (naming it).

    Example:
        >>> import torch, gamfunc
        >>> loss_fn = lambda p, x: (p["w"] * x).pow(2).sum()
        >>> d, info = gamfunc.wsam(0.05, 0.9)({"w": torch.ones(2)}, torch.tensor([1.0, 2.0]), loss_fn)

    References:
        Yue, Jiang, Ye, Gao, Liu, Zhang, "Sharpness-Aware Minimization Revisited: Weighted Sharpness
        as a Regularization Term", KDD 2023, https://arxiv.org/abs/2305.15817.
    """
    check_nonnegative("rho", rho, schedule=True)
    check_unit("gamma", gamma, schedule=True, below_one=True)
    check_nonnegative("eps", eps)

    def run(params, batch, loss_fn, clean, step):
        if clean is None:
            clean = gradient_pass(loss_fn, params, batch)
        point, clean = ascent_point(params, clean, value(rho, step), eps)
        adv = gradient_pass(loss_fn, point, batch)
        g = value(gamma, step)
        a = g / (1 - g)
        direction = tree.lincomb((1 - a, clean.grad), (a, adv.grad))
        info = {**clean_info(clean), "perturbed_loss": adv.loss}
        return Estimate(direction, info, clean)

    return Estimator("wsam", run, {"rho": rho, "gamma": gamma, "eps": eps})
