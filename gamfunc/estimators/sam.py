"""Sharpness-Aware Minimization: the gradient at the worst point of the ρ-ball, to first order."""

from __future__ import annotations

from gamfunc import tree
from gamfunc.checks import check_int, check_nonnegative
from gamfunc.estimators.base import Estimate, Estimator, Summary
from gamfunc.estimators.gradient import clean_info
from gamfunc.loss import ascent_point, gradient_pass, unit_grad
from gamfunc.schedules import value

__all__ = ["sam"]

# its row of README's table of estimators
SUMMARY = Summary(
    call="gamfunc.sam(rho, ascent_steps=1)",
    computes="SAM (Foret et al. 2021): ∇L(θ + ρ·g/‖g‖), reached in n steps of ρ/n",
    passes="n + 1",
)


def sam(rho, eps: float = 1e-12, ascent_steps: int = 1) -> Estimator:
    r"""SAM (Foret et al. 2021): direction = ∇L(θ + ε̂), ε̂ = ρ·g/(‖g‖ + ξ), g = ∇L(θ).

    The gradient of the zeroth-order flatness objective max_{‖ε‖≤ρ} L(θ + ε) under its first-order
    solution ε̂ = ρ·g/‖g‖ (paper Definition 4.1 and Eq. 3).

    With ``ascent_steps`` = n > 1 the inner maximisation takes n normalised gradient steps of
    length ρ/n from θ, and the direction is the gradient at the last point:

    $$
    \epsilon_0 = 0,\qquad
    \epsilon_{k+1} = \epsilon_k + \frac{\rho}{n}\,
    \frac{\nabla L(\theta+\epsilon_k)}{\lVert\nabla L(\theta+\epsilon_k)\rVert + \xi},\qquad
    d = \nabla L(\theta + \epsilon_n).
    $$

    By the triangle inequality ‖ε_n‖ ≤ ρ, so every iterate stays in the ρ-ball and no projection
    is needed: n changes how well the maximum over the same ball is found, not the ball. n = 1
    is the one-step SAM above, operation for operation. The cost is n + 1 gradients. This is the
    ascent of ``optax.contrib.sam(opt, chain(normalize(), sgd(ρ/n)), sync_period=n + 1,
    opaque_mode=True)`` with every adversarial gradient taken on the same batch (n adversarial
    updates, then the descent from the gradient at the last point; optax's example adversary steps
    by ρ each time, which for n > 1 reaches radius nρ); Kim et al. (2023) study such ascents.

    As the oracle of [`gam`][gamfunc.estimators.gam.gam] (``gam(..., oracle=sam(ρ,
    ascent_steps=n))``) the multi-step ascent applies to the oracle's loss. GAM's own ascent on
    ‖∇L‖ takes the same recursion with f_k = H(θ_k)·∇L(θ_k)/‖∇L(θ_k)‖ in place of ∇L
    (``gam(..., ascent_steps=n)``, the same steps of ρ/n); for
    [`gam_accelerated`][gamfunc.estimators.gam_accelerated.gam_accelerated] it is not defined,
    since its ascent is itself a finite difference of two SAM-like gradients.

    Args:
        rho: ρ, the radius of the ascent (float >= 0 or a schedule). ρ = 0 gives ∇L(θ).
        eps: ξ, keeps g/(‖g‖ + ξ) finite at g = 0.
        ascent_steps: n >= 1, the number of normalised ascent steps.

    Returns:
        An [`Estimator`][gamfunc.estimators.base.Estimator] named "sam"; its info adds
            ``perturbed_loss`` = L(θ + ε̂) (L(θ + ε_n) with n steps).

    Raises:
        ValueError: ``rho`` or ``eps`` is negative or not finite (a tensor of it too, or a
            schedule whose ``bounds`` reach below 0), or ``ascent_steps`` is not an integer >= 1
            (naming it). A schedule without bounds is checked at each step
            ([`gamfunc.checks.GuardedSchedule`][gamfunc.ranges.GuardedSchedule]).

    Example:
        >>> import torch, gamfunc
        >>> loss_fn = lambda p, x: (p["w"] * x).pow(2).sum()
        >>> d, info = gamfunc.sam(0.05)({"w": torch.ones(2)}, torch.tensor([1.0, 2.0]), loss_fn)

    References:
        Foret, Kleiner, Mobahi, Neyshabur, "Sharpness-Aware Minimization for Efficiently Improving
        Generalization", ICLR 2021, https://arxiv.org/abs/2010.01412.
        Kim, Park, Choi, Lee, Lee, "Exploring the Effect of Multi-step Ascent in Sharpness-Aware
        Minimization", 2023, https://arxiv.org/abs/2302.10181.
    """
    rho = check_nonnegative("rho", rho, schedule=True)
    eps = check_nonnegative("eps", eps)
    check_int("ascent_steps", ascent_steps)
    n = ascent_steps

    def run(params, batch, loss_fn, clean, step):
        if clean is None:
            clean = gradient_pass(loss_fn, params, batch)
        r = value(rho, step)
        if n == 1:
            point, clean = ascent_point(params, clean, r, eps)
            adv = gradient_pass(loss_fn, point, batch)
        else:
            g_hat, clean = unit_grad(clean, eps)
            r = r / n
            point = tree.axpy(r, g_hat, params)
            for _ in range(n - 1):
                g_hat, _ = unit_grad(gradient_pass(loss_fn, point, batch), eps)
                point = tree.axpy(r, g_hat, point)
            adv = gradient_pass(loss_fn, point, batch)
        info = {**clean_info(clean), "perturbed_loss": adv.loss}
        return Estimate(adv.grad, info, clean)

    hparams = {"rho": rho, "eps": eps} | ({"ascent_steps": n} if n > 1 else {})
    return Estimator("sam", run, hparams)
