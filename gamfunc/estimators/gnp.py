"""Gradient norm penalty: descend L + α‖∇L‖ with no ascent step (GAM's ρ → 0 case)."""

from __future__ import annotations

from gamfunc import hvps, tree
from gamfunc.checks import check_nonnegative
from gamfunc.estimators.base import Estimate, Estimator, Summary
from gamfunc.estimators.gradient import clean_info
from gamfunc.schedules import value

__all__ = ["gnp"]

# its row of README's table of estimators
SUMMARY = Summary(
    call="gamfunc.gnp(alpha, hvp=gamfunc.hvps.fd(radius=1e-2))",
    computes="GNP (Zhao et al. 2022): g + α·H·g/‖g‖",
    passes="2",
)


def gnp(
    alpha,
    hvp=hvps.fd(radius=1e-2),  # noqa: B008 - a frozen value (hvps.FiniteDifference), built once
    eps: float = 1e-12,
) -> Estimator:
    """Gradient norm penalty (Zhao et al. 2022): direction = ∇L(θ) + α·H(θ)·g/(‖g‖ + ξ), g = ∇L(θ).

    This is ∇(L + α‖∇L‖)(θ) (paper Eq. 6), GAM of Algorithm 1 without the ascent to θ_adv. With
    ``hvp=hvps.fd(radius=r)`` (the default, r = 1e-2) it is Zhao et al.'s form

        (1 − α/r)·∇L(θ) + (α/r)·∇L(θ + r·g/‖g‖),

    two gradients per step.

    Args:
        alpha: α, the weight of the gradient-norm penalty (float >= 0 or a schedule).
        hvp: the H·v backend ([`gamfunc.hvps`][gamfunc.hvps]): ``hvps.fd(radius=r)``,
            ``hvps.exact()``, ``hvps.reverse()``, or their shorthands "fd", "exact", "reverse".
            The default is ``hvps.fd(radius=1e-2)``, Zhao et al.'s form with r = 1e-2, ten times
            ``hvps.DEFAULT_RADIUS``: GNP weights the gradient difference by α/r, GAM by α·ρ/r with
            ρ ≈ 0.05, so GNP takes a larger r for the same amplification of the gradients'
            rounding (α/r = 10 for α = 0.1). The string "fd" means ``hvps.fd()`` here as
            everywhere, r = 1e-3 (α/r = 100 for α = 0.1), not the default's 1e-2; another radius
            is ``hvps.fd(radius=r)``.
        eps: ξ.

    Returns:
        An Estimator; its info adds ``f_norm`` = ‖H·g/‖g‖‖.

    Raises:
        ValueError: ``alpha`` or ``eps`` is negative, or ``hvp`` is not a backend
            ([`gamfunc.hvps.get`][gamfunc.hvps.get]).

    Warning:
        GNP's α and GAM's are on different scales: GAM's penalty term is α·ρ·∇‖∇L‖(θ_adv), so GNP with
        α' corresponds to GAM with θ_adv = θ and α·ρ = α'.

    Example:
        >>> import torch, gamfunc
        >>> est = gamfunc.gnp(alpha=0.1)
        >>> est.hparams["hvp"]
        fd(radius=0.01)
        >>> loss_fn = lambda p, x: torch.tanh(p["w"] @ x).pow(2).sum()
        >>> d, info = est({"w": torch.ones(2, 2)}, torch.tensor([1.0, 2.0]), loss_fn)
        >>> sorted(info)
        ['f_norm', 'grad_norm', 'loss']

    References:
        Zhao, Zhang, Hu, "Penalizing Gradient Norm for Efficiently Improving Generalization in Deep
        Learning", ICML 2022, https://arxiv.org/abs/2202.03599.
    """
    alpha = check_nonnegative("alpha", alpha, schedule=True)
    eps = check_nonnegative("eps", eps)
    backend = hvps.get(hvp)

    def run(params, batch, loss_fn, clean, step):
        f, clean = hvps.grad_norm_grad(loss_fn, params, batch, backend, eps=eps, clean=clean)
        direction = tree.axpy(value(alpha, step), f, clean.grad)
        return Estimate(direction, {**clean_info(clean), "f_norm": tree.norm(f)}, clean)

    return Estimator("gnp", run, {"alpha": alpha, "hvp": backend, "eps": eps})
