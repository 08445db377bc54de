r"""Momentum-SAM: the gradient at a point ahead along the negative momentum, one gradient a step."""

from __future__ import annotations

from typing import NamedTuple

from gamfunc import tree
from gamfunc.checks import check_nonnegative, check_positive, check_unit
from gamfunc.estimators.base import Estimate, Estimator, Summary
from gamfunc.estimators.gradient import clean_info
from gamfunc.loss import gradient_pass
from gamfunc.schedules import value
from gamfunc.tree import Tree

__all__ = ["MSAMState", "msam"]

# its row of README's table of estimators
SUMMARY = Summary(
    call="gamfunc.msam(rho, momentum=0.9)",
    computes="MSAM (Becker et al. 2024): ∇L(θ − ρ·m/‖m‖), m its own momentum of the gradients it took",
    passes="1",
)


class MSAMState(NamedTuple):
    """MSAM's state, kept in ``StepState.est``.

    Attributes:
        m: the momentum of the gradients MSAM took, m_t = μ·m_{t−1} + g̃_t, a tree like the params
            (zeros before the first step).
    """

    m: Tree


def msam(rho, momentum: float = 0.9, eps: float = 1e-12) -> Estimator:
    r"""MSAM (Becker et al. 2024): the gradient at θ − ρ·m/‖m‖, m a momentum of past gradients.

    Momentum-SAM perturbs the parameters along the negative of the momentum of the gradients it
    took instead of along the current gradient, so the perturbation costs no gradient of its own:
    one gradient a step, as SGD. The paper's algorithm (SGD with momentum μ and learning rate η),
    which stores the perturbed point θ̃ between steps, written on the unperturbed θ:

    $$
    \tilde\theta_t = \theta_t - \rho\,\frac{v_t}{\lVert v_t\rVert},\qquad
    v_{t+1} = \mu\,v_t + \nabla L(\tilde\theta_t),\qquad
    \theta_{t+1} = \theta_t - \eta\,v_{t+1}.
    $$

    Here the momentum is the estimator's own, so that any base optimiser can take the direction:

    $$
    \tilde g_t = \nabla L\Big(\theta_t - \rho\,\frac{m_{t-1}}{\lVert m_{t-1}\rVert + \xi}\Big),
    \qquad m_t = \mu\,m_{t-1} + \tilde g_t,\qquad \text{direction} = \tilde g_t,
    $$

    with m₋₁ = 0 (the first step is the gradient at θ). With ``gamfunc.sgd(lr=η, momentum=μ)``
    as the base optimiser (the same μ, no dampening, no weight decay: the authors' code adds the
    decay to the gradient before its momentum) the trajectory is the paper's. ρ is ``rho``,
    μ ``momentum``, ξ ``eps``; m lives in ``StepState.est``
    ([`MSAMState`][gamfunc.estimators.msam.MSAMState]) and is kept when a step is skipped.

    Warning:
        The one pass is at the perturbed point θ̃, not at θ: ``info["loss"]`` and
        ``info["grad_norm"]`` are L(θ̃) and ‖∇L(θ̃)‖, and a BatchNorm model's running statistics
        come from the pass at θ̃ (as in the paper, whose model sits at θ̃ between steps). Where the
        step already has the pass at θ ([`gamfunc.when.adaptive`][gamfunc.training.when.adaptive]'s probe)
        the info and statistics are that pass's, and the direction is still ∇L(θ̃).

    Args:
        rho: ρ >= 0, the length of the perturbation (float or a schedule); ρ = 0 is the gradient.
        momentum: μ in [0, 1), the decay of the estimator's momentum (the paper's 0.9, that of
            its base SGD).
        eps: ξ > 0, keeps m/(‖m‖ + ξ) finite at m = 0 (the first step's m).

    Returns:
        A stateful [`Estimator`][gamfunc.estimators.base.Estimator] named "msam".

    Raises:
        ValueError: ``rho`` is negative or not finite, ``eps`` not a finite number > 0,
            ``momentum`` not in [0, 1) (naming the argument).

    Example:
        >>> import torch, gamfunc
        >>> loss_fn = lambda p, b: ((b[0] @ p["w"] - b[1]) ** 2).mean()
        >>> step = gamfunc.make_step(gamfunc.msam(0.3), gamfunc.sgd(lr=0.1, momentum=0.9), loss_fn)
        >>> params = {"w": torch.zeros(3)}
        >>> state = step.init(params)
        >>> params, state, metrics = step(params, state, (torch.randn(8, 3), torch.randn(8)))

    References:
        Becker, Altrock, Risse, "Momentum-SAM: Sharpness Aware Minimization without Computational
        Overhead", 2024, https://arxiv.org/abs/2401.12033.
    """
    rho = check_nonnegative("rho", rho, schedule=True)
    check_unit("momentum", momentum, below_one=True)
    eps = check_positive("eps", eps)
    mu = float(momentum)

    def init(params):
        return MSAMState(tree.zeros_like(params))

    def run(params, batch, loss_fn, clean, step, state):
        m = state.m
        point = tree.axpy(-value(rho, step) / (tree.norm(m) + eps), m, params)
        adv = gradient_pass(loss_fn, point, batch)
        new = MSAMState(tree.axpy(mu, m, adv.grad))
        seen = adv if clean is None else clean
        return Estimate(adv.grad, clean_info(seen), seen, new)

    hparams = {"rho": rho, "momentum": mu, "eps": eps}
    return Estimator("msam", run, hparams, init_fn=init, state_type=MSAMState)
