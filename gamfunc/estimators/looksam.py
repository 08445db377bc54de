"""LookSAM: full SAM every k steps, the stored part of SAM's gradient orthogonal to ∇L reused between."""

from __future__ import annotations

from typing import NamedTuple

import torch

from gamfunc import tree
from gamfunc.checks import check_int, check_nonnegative
from gamfunc.estimators.base import Estimate, Estimator, Summary
from gamfunc.estimators.gradient import clean_info
from gamfunc.loss import gradient_pass, unit_grad, with_grad_norm
from gamfunc.schedules import value
from gamfunc.tree import Tree

__all__ = ["CONVENTIONS", "LookSAMState", "looksam"]

# its row of README's table of estimators
SUMMARY = Summary(
    call="gamfunc.looksam(rho, k, alpha)",
    computes="LookSAM (Liu et al. 2022): SAM every k steps, its part orthogonal to g reused between",
    passes="2, then 1",
)

CONVENTIONS = ("paper", "pytorch_optimizer")


class LookSAMState(NamedTuple):
    """LookSAM's state, kept in ``StepState.est``.

    Attributes:
        g_v: the component of the last SAM gradient orthogonal to ∇L there (zeros before the
            first full step).
    """

    g_v: Tree


def looksam(rho, k: int, alpha, eps: float = 1e-12, convention: str = "paper") -> Estimator:
    r"""LookSAM (Liu et al. 2022, Algorithm 1): SAM every k steps, its orthogonal part reused between.

    On every k-th step (the first included) the direction is SAM's, g_s = ∇L(θ + ρ·g/(‖g‖ + ξ)),
    g = ∇L(θ), and the part of g_s orthogonal to g is stored; on the k − 1 steps between, one
    gradient g is taken and the stored part is added back, rescaled to g's norm:

    $$
    g_v = g_s - \lVert g_s\rVert\cos(g, g_s)\,\frac{g}{\lVert g\rVert}
    \quad\text{(every $k$-th step, } d = g_s),\qquad
    d = g + \alpha\,\frac{\lVert g\rVert}{\lVert g_v\rVert}\,g_v \quad\text{(the steps between).}
    $$

    The estimator is a cycle ([`Estimator.every`][gamfunc.estimators.base.Estimator] = k):
    [`make_step`][gamfunc.training.step.make_step] picks the full or the reusing branch on the host from its
    count of calls (skipped steps included), so the steps between cost one gradient, as in the
    paper, and a compiled step has two graphs. g_v lives in ``StepState.est``
    ([`LookSAMState`][gamfunc.estimators.looksam.LookSAMState]). Called on its own (outside a
    step), the estimator takes the full SAM step.

    ``convention="paper"`` takes the norms and the cosine over the whole parameter vector, with ξ
    in the denominators (g/(‖g‖ + ξ), ‖g_v‖ + ξ). ``convention="pytorch_optimizer"`` follows
    ``pytorch_optimizer.LookSAM``: the projection and the rescaling per parameter tensor, each
    norm of the projection clamped below at ξ and ‖g_v‖ + 1e-8 in the rescaling (the perturbation
    still uses the global norm). The paper's layer-wise variant for LAMB is not provided.

    Args:
        rho: ρ >= 0, the radius of SAM's ascent, or a schedule of the step count.
        k: the period, an integer >= 1; k = 1 is [`sam`][gamfunc.estimators.sam.sam] on every step.
        alpha: α >= 0, the weight of the reused component (the paper uses 0.7), or a schedule.
        eps: ξ >= 0, keeps the normalisations finite at a zero gradient.
        convention: "paper" or "pytorch_optimizer", where the norms are taken (above).

    Returns:
        A stateful [`Estimator`][gamfunc.estimators.base.Estimator] named "looksam" with
            ``every`` = k and a ``base`` named "looksam_reuse"; the full steps' info adds
            ``perturbed_loss`` = L(θ + ε̂).

    Raises:
        ValueError: ``rho``, ``alpha`` or ``eps`` is negative or not finite (a tensor of it too,
            or a schedule whose ``bounds`` reach below 0; one without bounds is checked at each
            step), ``k`` is not an integer >= 1, or ``convention`` is not one of the two (naming
            it). A step given the state of another estimator (LookGAM's) refuses it.

    Example:
        >>> import torch, gamfunc
        >>> loss_fn = lambda p, b: ((b[0] @ p["w"] - b[1]) ** 2).mean()
        >>> step = gamfunc.make_step(gamfunc.looksam(0.05, 5, 0.7), gamfunc.sgd(lr=0.1), loss_fn)
        >>> params = {"w": torch.zeros(3)}
        >>> state = step.init(params)
        >>> params, state, metrics = step(params, state, (torch.randn(8, 3), torch.randn(8)))

    References:
        Liu, Mai, Chen, Hsieh, You, "Towards Efficient and Scalable Sharpness-Aware Minimization",
        CVPR 2022, https://arxiv.org/abs/2203.02714.
    """
    rho = check_nonnegative("rho", rho, schedule=True)
    check_int("k", k)
    alpha = check_nonnegative("alpha", alpha, schedule=True)
    eps = check_nonnegative("eps", eps)
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {CONVENTIONS}; got {convention!r}")
    per_tensor = convention == "pytorch_optimizer"

    def init(params):
        return LookSAMState(tree.zeros_like(params))

    def full(params, batch, loss_fn, clean, step, state):
        if clean is None:
            clean = gradient_pass(loss_fn, params, batch)
        g_hat, clean = unit_grad(clean, eps)
        adv = gradient_pass(loss_fn, tree.axpy(value(rho, step), g_hat, params), batch)
        if per_tensor:
            g_v = tree.map(_orthogonal_per_tensor(eps), adv.grad, clean.grad)
        else:
            g_v = tree.axpy(-tree.vdot(g_hat, adv.grad), g_hat, adv.grad)
        info = {**clean_info(clean), "perturbed_loss": adv.loss}
        return Estimate(adv.grad, info, clean, LookSAMState(g_v))

    def reuse(params, batch, loss_fn, clean, step, state):
        if clean is None:
            clean = gradient_pass(loss_fn, params, batch)
        clean = with_grad_norm(clean)
        a = value(alpha, step)
        if per_tensor:
            direction = tree.map(_reuse_per_tensor(a), clean.grad, state.g_v)
        else:
            scale = a * clean.grad_norm / (tree.norm(state.g_v) + eps)
            direction = tree.axpy(scale, state.g_v, clean.grad)
        return Estimate(direction, clean_info(clean), clean, state)

    hparams = {"rho": rho, "k": k, "alpha": alpha, "eps": eps, "convention": convention}
    base = Estimator(
        "looksam_reuse", reuse, {"alpha": alpha}, init_fn=init, state_type=LookSAMState
    )
    if k == 1:
        return Estimator("looksam", full, hparams, init_fn=init, state_type=LookSAMState)
    return Estimator(
        "looksam", full, hparams, init_fn=init, state_type=LookSAMState, every=k, base=base
    )


def _orthogonal_per_tensor(eps):
    """g_s − ‖g_s‖·⟨u, u_s⟩·u for one tensor, u = g/max(‖g‖, ξ), u_s = g_s/max(‖g_s‖, ξ)."""

    def fn(g_s, g):
        n_s = torch.linalg.vector_norm(g_s)
        u = g / torch.linalg.vector_norm(g).clamp_min(eps)
        u_s = g_s / n_s.clamp_min(eps)
        return g_s - n_s * (u * u_s).sum() * u

    return fn


def _reuse_per_tensor(a):
    """g + α·‖g‖/(‖g_v‖ + 1e-8)·g_v for one tensor."""

    def fn(g, g_v):
        return g + a * torch.linalg.vector_norm(g) / (torch.linalg.vector_norm(g_v) + 1e-8) * g_v

    return fn
