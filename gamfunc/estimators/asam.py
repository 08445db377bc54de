"""Adaptive SAM: SAM's ascent measured in the scale of each parameter."""

from __future__ import annotations

from gamfunc import tree
from gamfunc.checks import check_nonnegative
from gamfunc.estimators.base import Estimate, Estimator
from gamfunc.estimators.gradient import clean_info
from gamfunc.loss import gradient_pass
from gamfunc.schedules import value
from gamfunc.tree import Tree

__all__ = ["adaptive_ascent", "asam"]


def asam(rho, eta: float = 0.01, eps: float = 1e-12) -> Estimator:
    """ASAM (Kwon et al. 2021, Eq. 8): direction = ∇L(θ + ε), ε = ρ·T²g/(‖T g‖ + ξ), g = ∇L(θ).

    T = |θ| + η elementwise on every parameter, so the ascent is scale-invariant; with T = 1 it is
    SAM. ρ is ``rho`` (float >= 0 or a schedule; ASAM's ρ is larger than SAM's, 0.5 to 2 in the
    paper), η is ``eta``, ξ is ``eps``. Its info adds ``perturbed_loss`` = L(θ + ε).

    Args:
        rho: ρ >= 0, the radius of the ascent, or a schedule of the step count.
        eta: η >= 0, added to |θ| in T.
        eps: ξ >= 0, added to the norm before dividing.

    Returns:
        An [`Estimator`][gamfunc.estimators.base.Estimator] named "asam".

    Raises:
        ValueError: ``rho``, ``eta`` or ``eps`` is negative (naming it).

    References:
        Kwon, Kim, Park, Choi, "ASAM: Adaptive Sharpness-Aware Minimization for Scale-Invariant
        Learning of Deep Neural Networks", ICML 2021, https://arxiv.org/abs/2102.11600.
    """
    check_nonnegative("rho", rho, schedule=True)
    check_nonnegative("eta", eta, schedule=True)
    check_nonnegative("eps", eps)

    def run(params, batch, loss_fn, clean, step):
        clean = clean if clean is not None else gradient_pass(loss_fn, params, batch)
        theta_adv = adaptive_ascent(params, clean.grad, value(rho, step), eta, eps)
        adv = gradient_pass(loss_fn, theta_adv, batch)
        return Estimate(adv.grad, {**clean_info(clean), "perturbed_loss": adv.loss}, clean)

    return Estimator("asam", run, {"rho": rho, "eta": eta, "eps": eps})


def adaptive_ascent(params: Tree, v: Tree, rho, eta, eps) -> Tree:
    """θ + ε, ε = ρ·T²v/(‖T v‖ + ξ), T = |θ| + η elementwise: an ascent of radius ρ along v measured
    in the scale of each parameter (ASAM, Kwon et al. 2021, Eq. 8; with η = 0 the ``adaptive=True``
    perturbation of the GAM authors' code, see [`gamfunc.gam`][gamfunc.estimators.gam.gam]).

    ``rho`` is ρ (a number or 0-d tensor), ``eta`` η, ``eps`` ξ; T is taken at ``params``.
    """
    tv = tree.map(lambda p, g: (p.abs() + eta) * g, params, v)
    t2v = tree.map(lambda p, x: (p.abs() + eta) * x, params, tv)
    return tree.axpy(rho / (tree.norm(tv) + eps), t2v, params)
