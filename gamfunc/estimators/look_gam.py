"""LookGAM: full GAM every k steps, its stored first-order flatness correction reused between."""

from __future__ import annotations

from typing import NamedTuple

from gamfunc import tree
from gamfunc.checks import check_int
from gamfunc.estimators.base import Estimate, Estimator, Summary
from gamfunc.estimators.gam import gam
from gamfunc.estimators.gradient import clean_info
from gamfunc.loss import gradient_pass, with_grad_norm
from gamfunc.tree import Tree

__all__ = ["LookGAMState", "look_gam"]

# its row of README's table of estimators
SUMMARY = Summary(
    call="gamfunc.look_gam(rho, alpha, k)",
    computes="LookSAM's reuse for GAM: GAM every k steps, its part orthogonal to g reused between",
    passes="GAM's, then 1",
)


class LookGAMState(NamedTuple):
    """LookGAM's state, kept in ``StepState.est``.

    Attributes:
        u: the part of the last GAM correction orthogonal to ∇L there, divided by ‖∇L‖ there
            (zeros before the first full step).
    """

    u: Tree


def look_gam(rho, alpha, k: int, hvp="exact", eps: float = 1e-12, **gam_kwargs) -> Estimator:
    r"""LookGAM: [`gam`][gamfunc.estimators.gam.gam] every k steps, its correction reused between.

    GAM's direction is g + c, g = ∇L(θ) and c = α·ρ·∇‖∇L‖(θ_adv) the first-order flatness
    correction (paper Algorithm 1 with the plain oracle). As LookSAM reuses SAM's
    ([`looksam`][gamfunc.estimators.looksam.looksam]), every k-th step (the first included) takes
    full GAM and stores the part of c orthogonal to g, relative to ‖g‖; the k − 1 steps between
    take one gradient and add it back at the current ‖g‖:

    $$
    u = \frac{c - \langle c, \hat g\rangle\,\hat g}{\lVert g\rVert + \xi},\quad
    \hat g = \frac{g}{\lVert g\rVert + \xi}
    \quad\text{(every $k$-th step, } d = g + c),\qquad
    d = g + \lVert g\rVert\,u \quad\text{(the steps between).}
    $$

    The correction keeps its size relative to the gradient, where LookSAM fixes it with α; the
    component of c along g is dropped on the steps between, as LookSAM drops that of SAM's
    gradient. This estimator is new (no paper defines it). Like
    [`looksam`][gamfunc.estimators.looksam.looksam] it is a cycle
    ([`Estimator.every`][gamfunc.estimators.base.Estimator] = k, the branch chosen on the host by
    [`make_step`][gamfunc.training.step.make_step]) with its state in ``StepState.est``
    ([`LookGAMState`][gamfunc.estimators.look_gam.LookGAMState]): the steps between cost one
    gradient, against GAM's two gradients and two H·v passes.

    Args:
        rho: ρ, GAM's ascent radius (float >= 0 or a schedule).
        alpha: α, GAM's weight of first-order flatness (float >= 0 or a schedule).
        k: the period, an integer >= 1; k = 1 is GAM on every step.
        hvp: GAM's H·v backend: "exact" (the default), "reverse", "fd" (``hvps.fd()``, r = 1e-3)
            or a backend value such as ``hvps.fd(radius=r)`` ([`gamfunc.hvps`][gamfunc.hvps]).
        eps: ξ >= 0, keeps the normalisations finite at a zero gradient.
        **gam_kwargs: the other arguments of [`gam`][gamfunc.estimators.gam.gam]
            (``adaptive``, ``theorem_norms``, ``ascent_steps``); not ``oracle``.

    Returns:
        A stateful [`Estimator`][gamfunc.estimators.base.Estimator] named "look_gam" with
            ``every`` = k and a ``base`` named "look_gam_reuse"; the full steps' info is GAM's.

    Raises:
        ValueError: as [`gam`][gamfunc.estimators.gam.gam], ``k`` is not an integer >= 1, or
            ``oracle`` is given (naming it).
    """
    check_int("k", k)
    if "oracle" in gam_kwargs:
        raise ValueError("oracle: look_gam reuses the correction beside the plain gradient only")
    inner = gam(rho, alpha, hvp=hvp, eps=eps, **gam_kwargs)

    def init(params):
        return LookGAMState(tree.zeros_like(params))

    def full(params, batch, loss_fn, clean, step, state):
        est = inner.run(params, batch, loss_fn, clean=clean, step=step)
        clean = with_grad_norm(est.clean)
        g, inv = clean.grad, (clean.grad_norm + eps).reciprocal()
        c = tree.sub(est.direction, g)
        g_hat = tree.scale(g, inv)
        u = tree.scale(tree.axpy(-tree.vdot(c, g_hat), g_hat, c), inv)
        return Estimate(est.direction, est.info, clean, LookGAMState(u))

    def reuse(params, batch, loss_fn, clean, step, state):
        if clean is None:
            clean = gradient_pass(loss_fn, params, batch)
        clean = with_grad_norm(clean)
        direction = tree.axpy(clean.grad_norm, state.u, clean.grad)
        return Estimate(direction, clean_info(clean), clean, state)

    hparams = inner.hparams | {"k": k}
    if k == 1:
        return Estimator("look_gam", full, hparams, init_fn=init, state_type=LookGAMState)
    base = Estimator("look_gam_reuse", reuse, {}, init_fn=init, state_type=LookGAMState)
    return Estimator(
        "look_gam", full, hparams, init_fn=init, state_type=LookGAMState, every=k, base=base
    )
