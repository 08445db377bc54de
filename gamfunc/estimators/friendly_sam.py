"""Friendly-SAM: SAM whose ascent leaves out the running estimate of the full-batch gradient."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from gamfunc import tree
from gamfunc.checks import check_nonnegative, check_unit
from gamfunc.estimators.base import Estimate, Estimator, Summary
from gamfunc.estimators.gradient import clean_info
from gamfunc.loss import gradient_pass
from gamfunc.schedules import value
from gamfunc.tree import Tree

__all__ = ["CONVENTIONS", "FriendlySAMState", "friendly_sam"]

# its row of README's table of estimators
SUMMARY = Summary(
    call='gamfunc.friendly_sam(rho, sigma=1.0, lmbda=0.9, convention="paper")',
    computes="F-SAM (Li et al. 2024): the ascent along g − σ·m, m the gradients' running mean; `convention=\"authors\"`: the authors' code",
    passes="2",
)

CONVENTIONS = ("paper", "authors")


class FriendlySAMState(NamedTuple):
    """Friendly-SAM's state, kept in ``StepState.est``.

    Attributes:
        m: the running mean of the gradients at θ, a tree like the params.
        started: a 0-d bool, whether a step has set ``m`` (the "authors" convention starts m at
            the first gradient).
    """

    m: Tree
    started: Tensor


def friendly_sam(
    rho, sigma=1.0, lmbda=0.9, eps: float = 1e-12, convention: str = "paper"
) -> Estimator:
    r"""Friendly-SAM (Li et al. 2024, Algorithm 1): SAM's ascent along g − σ·m, m the gradients' running mean.

    The running mean m of the minibatch gradients g = ∇L(θ) estimates the full-batch gradient; the
    ascent leaves σ times it out, so that it follows the minibatch's gradient noise:

    $$
    m_t = \lambda\,m_{t-1} + (1-\lambda)\,g_t,\qquad
    d_t = g_t - \sigma\,m_t,\qquad
    \text{direction} = \nabla L\Big(\theta_t + \rho\,\frac{d_t}{\lVert d_t\rVert + \xi}\Big),
    $$

    with m_0 = 0 (``convention="paper"``). ``convention="authors"`` follows the authors' code
    (github.com/nblt/F-SAM, ``FriendlySAM.first_step`` in ``utils.py``): the first step sets m = g
    and ascends along g, later steps ascend along g − σ·m_{t−1}, the mean *before* this step's
    gradient joins it, then m_t = λ·m_{t−1} + (1 − λ)·g_t:

    $$
    m_1 = g_1,\ d_1 = g_1;\qquad
    d_t = g_t - \sigma\,m_{t-1},\quad m_t = \lambda\,m_{t-1} + (1-\lambda)\,g_t\quad (t > 1).
    $$

    ``pytorch_optimizer.FriendlySAM`` (4.1) takes the same order. m lives in ``StepState.est``
    ([`FriendlySAMState`][gamfunc.estimators.friendly_sam.FriendlySAMState]); a skipped step leaves
    it unchanged. σ = 0 is [`sam`][gamfunc.estimators.sam.sam]. Two gradients a step, as SAM.

    The two conventions differ from the second step on whenever σ > 0: "paper" removes σ times a
    mean that already holds g_t, "authors" the mean of the steps before. Defaults and their
    sources: σ = 1 and λ = 0.9 are the authors' class defaults (their ``run.sh`` runs λ = 0.6 on
    CIFAR-100), ξ = 10⁻¹² their constant; ``convention="paper"`` is the paper's order.

    Warning:
        The "paper" order (m_0 = 0, m_t formed before d_t) is the update as secondary summaries of
        the paper's Algorithm 1 restate it (e.g. junaidaliop.github.io/zij/math/fsam); it has not
        been checked against the paper's own text. The "authors" order is checked against the
        authors' code over 20 steps (``tests/library/test_estimators_family.py``).

    Args:
        rho: ρ >= 0, the radius of the ascent, or a schedule of the step count.
        sigma: σ >= 0, how much of the running mean is removed (the paper uses 1), or a schedule.
        lmbda: λ in [0, 1), the running mean's decay (the paper uses 0.6 to 0.95).
        eps: ξ >= 0, keeps d/(‖d‖ + ξ) finite at d = 0.
        convention: "paper" or "authors" (above; the default "paper").

    Returns:
        A stateful [`Estimator`][gamfunc.estimators.base.Estimator] named "friendly_sam"; its info
            adds ``perturbed_loss`` = L(θ + ε).

    Raises:
        ValueError: ``rho``, ``sigma`` or ``eps`` is negative or not finite, ``lmbda`` is not in
            [0, 1), or ``convention`` is not one of the two (naming it).

    Example:
        >>> import torch, gamfunc
        >>> loss_fn = lambda p, b: ((b[0] @ p["w"] - b[1]) ** 2).mean()
        >>> step = gamfunc.make_step(gamfunc.friendly_sam(0.05), gamfunc.sgd(lr=0.1), loss_fn)
        >>> params = {"w": torch.zeros(3)}
        >>> state = step.init(params)
        >>> params, state, metrics = step(params, state, (torch.randn(8, 3), torch.randn(8)))

    References:
        Li, Zhou, He, Cheng, Huang, "Friendly Sharpness-Aware Minimization", CVPR 2024,
        https://arxiv.org/abs/2403.12350.
    """
    rho = check_nonnegative("rho", rho, schedule=True)
    sigma = check_nonnegative("sigma", sigma, schedule=True)
    lmbda = check_unit("lmbda", lmbda, below_one=True)
    eps = check_nonnegative("eps", eps)
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {CONVENTIONS}; got {convention!r}")
    authors = convention == "authors"

    def init(params):
        device = next(iter(params.values())).device
        return FriendlySAMState(
            tree.zeros_like(params), torch.zeros((), dtype=torch.bool, device=device)
        )

    def run(params, batch, loss_fn, clean, step, state):
        if clean is None:
            clean = gradient_pass(loss_fn, params, batch)
        g, s = clean.grad, value(sigma, step)
        mean = tree.axpy(1.0 - lmbda, tree.sub(g, state.m), state.m)  # λ·m + (1 − λ)·g
        if authors:
            d = tree.where(state.started, tree.axpy(-s, state.m, g), g)
            mean = tree.where(state.started, mean, g)
        else:
            d = tree.axpy(-s, mean, g)
        d_hat, _ = tree.normalize(d, eps)
        adv = gradient_pass(loss_fn, tree.axpy(value(rho, step), d_hat, params), batch)
        info = {**clean_info(clean), "perturbed_loss": adv.loss}
        new = FriendlySAMState(mean, torch.ones_like(state.started))
        return Estimate(adv.grad, info, clean, new)

    hparams = {"rho": rho, "sigma": sigma, "lmbda": lmbda, "eps": eps, "convention": convention}
    return Estimator("friendly_sam", run, hparams, init_fn=init, state_type=FriendlySAMState)
