"""Sharpness-Aware Minimization: the gradient at the worst point of the ρ-ball, to first order."""

from __future__ import annotations

from gamfunc import tree
from gamfunc.checks import check_nonnegative
from gamfunc.estimators.base import Estimate, Estimator
from gamfunc.estimators.gradient import clean_info
from gamfunc.loss import gradient_pass, unit_grad
from gamfunc.schedules import value

__all__ = ["sam"]


def sam(rho, eps: float = 1e-12) -> Estimator:
    """SAM (Foret et al. 2021): direction = ∇L(θ + ρ·g/(‖g‖ + ξ)), g = ∇L(θ).

    The gradient of the zeroth-order flatness objective max_{‖ε‖≤ρ} L(θ + ε) under its first-order
    solution ε̂ = ρ·g/‖g‖ (paper Definition 4.1 and Eq. 3).

    Args:
        rho: ρ, the radius of the ascent step (float >= 0 or a schedule). ρ = 0 gives ∇L(θ).
        eps: ξ, keeps g/(‖g‖ + ξ) finite at g = 0.

    Returns:
        An :class:`~gamfunc.estimators.base.Estimator`; its info adds ``perturbed_loss`` = L(θ + ε̂).

    Example:
        >>> import torch, gamfunc
        >>> loss_fn = lambda p, x: (p["w"] * x).pow(2).sum()
        >>> d, info = gamfunc.sam(0.05)({"w": torch.ones(2)}, torch.tensor([1.0, 2.0]), loss_fn)

    References:
        Foret et al., "Sharpness-Aware Minimization for Efficiently Improving Generalization",
        ICLR 2021, https://arxiv.org/abs/2010.01412.
    """
    check_nonnegative("rho", rho, schedule=True)
    check_nonnegative("eps", eps, schedule=True)

    def run(params, batch, loss_fn, clean, step):
        if clean is None:
            clean = gradient_pass(loss_fn, params, batch)
        g_hat, clean = unit_grad(clean, eps)
        adv = gradient_pass(loss_fn, tree.axpy(value(rho, step), g_hat, params), batch)
        info = clean_info(clean) | {"perturbed_loss": adv.loss}
        return Estimate(adv.grad, info, clean)

    return Estimator("sam", run, {"rho": rho, "eps": eps})
