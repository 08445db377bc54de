"""GSAM: SAM's descent plus an ascent of the surrogate gap, from the same two gradients."""

from __future__ import annotations

from gamfunc import tree
from gamfunc.checks import check_nonnegative
from gamfunc.estimators.asam import adaptive_ascent
from gamfunc.estimators.base import Estimate, Estimator, Summary
from gamfunc.estimators.gradient import clean_info
from gamfunc.loss import ascent_point, gradient_pass, unit_grad, with_grad_norm
from gamfunc.schedules import value

__all__ = ["gsam"]

# its row of README's table of estimators
SUMMARY = Summary(
    call="gamfunc.gsam(rho, alpha, adaptive=False, eta=0.0)",
    computes="GSAM (Zhuang et al. 2022): SAM's gradient − α·(g's part orthogonal to it); `adaptive=True` scales the ascent by \\|θ\\| + η, as the authors' code",
    passes="2",
)


def gsam(rho, alpha, eps: float = 1e-12, *, adaptive: bool = False, eta: float = 0.0) -> Estimator:
    r"""GSAM (Zhuang et al. 2022, Algorithm 1): direction = ∇f_p − α·∇f_⊥.

    With g = ∇L(θ) and the SAM gradient ∇f_p = ∇L(θ + ρ·g/(‖g‖ + ξ)), g is split into its
    component along ∇f_p and the rest, ∇f_⊥; descending ∇f_p − α·∇f_⊥ minimises the perturbed loss
    f_p while *increasing* L(θ) along ∇f_⊥, which shrinks the surrogate gap h = f_p − L without
    changing the descent on f_p (∇f_⊥ ⟂ ∇f_p):

    $$
    \nabla f_\perp = g - \frac{\langle g, \nabla f_p\rangle}{(\lVert\nabla f_p\rVert + \xi)^2}\,
    \nabla f_p,\qquad
    d = \nabla f_p - \alpha\,\nabla f_\perp .
    $$

    This is the sign and decomposition of the paper's Algorithm 1 and of its authors' code
    (github.com/juntang-zhuang/GSAM, ``gradient_decompose``), which ``pytorch_optimizer.GSAM``
    reproduces (there the norm product ‖∇f_p‖·‖g‖ + ξ and ‖∇f_p‖ + ξ are regularised separately;
    the two agree to O(ξ)). α = 0 gives [`sam`][gamfunc.estimators.sam.sam].

    ``adaptive=True`` is the authors' ``GSAM(adaptive=True)`` (their ``example/train.py`` runs it by
    default): the ascent in ASAM's scale-invariant geometry, θ + ρ·T²g/(‖T g‖ + ξ) with
    T = |θ| + η elementwise on every parameter
    (the ascent of [`asam`][gamfunc.estimators.asam.asam]), the decomposition above
    unchanged. η = 0 (T = |θ|), the default, is the authors' code; ASAM's own η is 0.01. Their
    example pairs it with a larger ρ (2.0), as ASAM's radius is measured in the parameters' scale.
    Defaults and their sources: ξ = 10⁻¹² is the authors' ``perturb_eps``; ``adaptive=False`` is
    their class's default (not their example's); η = 0 their adaptive T.

    The paper schedules ρ with the learning rate, ρ_t = ρ_min + (ρ_max − ρ_min)·(lr_t − lr_min) /
    (lr_max − lr_min): pass
    ``rho=gamfunc.schedules.proportional(ρ_max, lr, lr_max, floor=ρ_min, lr_min=lr_min)``
    ([`proportional`][gamfunc.schedules.proportional]) with the optimiser's ``lr`` schedule.

    Args:
        rho: ρ >= 0, the radius of the ascent, or a schedule of the step count.
        alpha: α >= 0, how much of ∇f_⊥ is removed (the paper uses α in [0, 0.3]), or a schedule.
        eps: ξ >= 0, keeps the normalisations finite at a zero gradient.
        adaptive: whether the ascent is ASAM's scale-invariant one (above).
        eta: η >= 0, added to |θ| in T (``adaptive=True`` only; the authors' code: 0).

    Returns:
        An [`Estimator`][gamfunc.estimators.base.Estimator] named "gsam"; its info adds
            ``perturbed_loss`` = L(θ + ε̂) = f_p(θ) and ``surrogate_gap`` = f_p(θ) − L(θ).

    Raises:
        ValueError: ``rho``, ``alpha``, ``eps`` or ``eta`` is negative or not finite, or
            ``adaptive`` is not a bool (naming it).

    Example:
        >>> import torch, gamfunc
        >>> loss_fn = lambda p, x: (p["w"] * x).pow(2).sum()
        >>> d, info = gamfunc.gsam(0.05, 0.1)({"w": torch.ones(2)}, torch.tensor([1.0, 2.0]), loss_fn)

    References:
        Zhuang, Gong, Yuan, Cui, Adam, Dvornek, Tatikonda, Duncan, Liu, "Surrogate Gap Minimization
        Improves Sharpness-Aware Training", ICLR 2022, https://arxiv.org/abs/2203.08065.
    """
    rho = check_nonnegative("rho", rho, schedule=True)
    alpha = check_nonnegative("alpha", alpha, schedule=True)
    eps = check_nonnegative("eps", eps)
    if not isinstance(adaptive, bool):
        raise ValueError(f"adaptive must be True or False; got {adaptive!r}")
    eta = check_nonnegative("eta", eta)

    def run(params, batch, loss_fn, clean, step):
        if clean is None:
            clean = gradient_pass(loss_fn, params, batch)
        if adaptive:
            clean = with_grad_norm(clean)
            point = adaptive_ascent(params, clean.grad, value(rho, step), eta, eps)
        else:
            point, clean = ascent_point(params, clean, value(rho, step), eps)
        adv = gradient_pass(loss_fn, point, batch)
        p_hat, _ = unit_grad(adv, eps)
        vertical = tree.axpy(-tree.vdot(clean.grad, p_hat), p_hat, clean.grad)
        direction = tree.axpy(-value(alpha, step), vertical, adv.grad)
        info = {
            **clean_info(clean),
            "perturbed_loss": adv.loss,
            "surrogate_gap": adv.loss - clean.loss,
        }
        return Estimate(direction, info, clean)

    hparams = {"rho": rho, "alpha": alpha, "eps": eps}
    hparams |= {"adaptive": True, "eta": eta} if adaptive else {}
    return Estimator("gsam", run, hparams)
