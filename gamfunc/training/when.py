r"""When a step is flat: the policies of [`make_step`][gamfunc.training.step.make_step]'s ``when=``.

A step made with ``when=policy`` runs its estimator (the flat one: SAM, GAM, ...) on the steps the
policy chooses and its ``base`` estimator (the gradient by default) on the others:

- [`every(k)`][gamfunc.training.when.every]: every k-th step, the first included (``every=k`` of
  [`make_step`][gamfunc.training.step.make_step] is its shorthand);
- [`late(start)`][gamfunc.training.when.late]: from step ``start`` on (an int, or a fraction of the run's
  ``total_steps``), the base before: flatness in the last phase of training only;
- [`adaptive(total_steps)`][gamfunc.training.when.adaptive]: AE-SAM's trigger (Jiang et al. 2023), flat
  where the squared norm of the step's gradient is high against its running mean and deviation.

``every`` and ``late`` choose on the host from the step's count of calls (``state.cycle``, a CPU
tensor: skipped steps included), so the choice costs no device synchronisation and a step captured
in a CUDA graph keeps one graph per branch. ``adaptive`` chooses from the gradient at θ, a device
value: the step takes that gradient first (a third compiled function, the *probe*), reads one
boolean on the host, and runs the chosen branch with that gradient as its pass at θ (one device
synchronisation a step, as AE-SAM's own ``if``; under
[`gamfunc.cuda_graph`][gamfunc.training.cuda_graphs.cuda_graph], a graph for the probe and one per
branch, with that read between them). A step whose estimator takes a pass at θ (the gradient,
SAM, GAM, ...) therefore costs its own passes and no more; a flat step whose estimator takes none
([`gamfunc.msam`][gamfunc.estimators.msam.msam], [`gamfunc.rwp`][gamfunc.estimators.rwp.rwp] with
``mix=0``: one pass at a perturbed point only) costs one pass more, the probe's. Its running
statistics live in ``state.policy`` ([`AdaptiveState`][gamfunc.training.when.AdaptiveState]), are kept
when a step is skipped or its ‖∇L(θ)‖² is not finite, and are saved with the rest of the state
(`gamfunc.state.as_dict`). Under ``torch.compile`` (``step.compile()``) each of the step's
functions is one graph, whichever way the policy switches.

``adaptive`` takes no estimator of ``perturbation="local"``
([`gamfunc.distributed.local`][gamfunc.wrappers.distributed.local]): each rank's probe would measure its
own gradient, keep statistics of its own and choose its own branch, and the ranks' collectives
would part. Under ``perturbation="global"`` the probe's gradient is the mean over the ranks, and
every rank chooses alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import NamedTuple

import torch
from torch import Tensor

from gamfunc.checks import check_int, check_number, check_unit
from gamfunc.compiling.compile import fresh
from gamfunc.loss import bind, gradient_pass, with_grad_norm

__all__ = [
    "Adaptive",
    "AdaptiveState",
    "Every",
    "Late",
    "Policy",
    "adaptive",
    "every",
    "late",
    "probe",
]


@dataclass(frozen=True)
class Policy:
    """A policy of ``when=``: which steps run the flat estimator. Build one with
    [`every`][gamfunc.training.when.every], [`late`][gamfunc.training.when.late] or
    [`adaptive`][gamfunc.training.when.adaptive].

    A policy that chooses on the host implements ``flat(count) -> bool`` of the step's count of
    calls; one that chooses on the device (``on_device``) keeps a state (``init``) and implements
    ``choose(state, grad_norm, step) -> (new_state, flat)``.
    """

    @property
    def on_device(self) -> bool:
        """Whether the choice reads a device value (the gradient at θ)."""
        return False

    def init(self, device: torch.device):
        """The policy's state before the first step, kept in ``StepState.policy``; ``()`` for
        none."""
        return ()

    def flat(self, count: int) -> bool:
        """Whether the call ``count`` (counted from 0, skipped steps included) is flat."""
        raise NotImplementedError

    def describe(self) -> str:
        """The policy as its call, for messages: ``every(3)``."""
        raise NotImplementedError


@dataclass(frozen=True)
class Every(Policy):
    """``every(k)``: the flat estimator on calls 0, k, 2k, ...; see [`every`][gamfunc.training.when.every].

    Args:
        k: the period.
    """

    k: int

    def flat(self, count: int) -> bool:
        return count % self.k == 0

    def describe(self) -> str:
        return f"every={self.k}"


@dataclass(frozen=True)
class Late(Policy):
    """``late(start)``: the flat estimator from call ``start`` on; see [`late`][gamfunc.training.when.late].

    Args:
        start: the first flat call.
    """

    start: int

    def flat(self, count: int) -> bool:
        return count >= self.start

    def describe(self) -> str:
        return f"when=late({self.start})"


class AdaptiveState(NamedTuple):
    """AE-SAM's running statistics of ‖g‖², kept in ``StepState.policy`` (0-d float64 tensors on
    the parameters' device).

    Attributes:
        mean: μ, the running mean of ‖g_t‖².
        var: σ², the running variance of ‖g_t‖².
    """

    mean: Tensor
    var: Tensor


@dataclass(frozen=True)
class Adaptive(Policy):
    """AE-SAM's trigger; see [`adaptive`][gamfunc.training.when.adaptive].

    Args:
        total_steps: T.
        delta: δ.
        lambda1: λ₁.
        lambda2: λ₂.
        var0: σ²₋₁, the variance before the first step.
    """

    total_steps: int
    delta: float
    lambda1: float
    lambda2: float
    var0: float

    @property
    def on_device(self) -> bool:
        return True

    def init(self, device: torch.device) -> AdaptiveState:
        mean = torch.zeros((), dtype=torch.float64, device=device)
        return AdaptiveState(mean, torch.full((), self.var0, dtype=torch.float64, device=device))

    def threshold_scale(self, step: Tensor) -> Tensor:
        """c_t = (t/T)·λ₁ + (1 − t/T)·λ₂, t/T held at 1 past T."""
        frac = (step.to(torch.float64) / self.total_steps).clamp(0.0, 1.0)
        return frac * self.lambda1 + (1.0 - frac) * self.lambda2

    def choose(self, state: AdaptiveState, grad_norm: Tensor, step: Tensor):
        """``(new_state, flat)``: the statistics with ‖g_t‖² (``grad_norm`` squared, in float64)
        taken in, and whether ‖g_t‖² >= μ_t + c_t·σ_t (a 0-d bool tensor).

        Where ‖g_t‖² is not finite the statistics are the old ones (selected on the device, no
        host read): one inf or NaN gradient would otherwise make μ and σ² NaN for the rest of
        the run, and no later step flat."""
        s = grad_norm.to(torch.float64) ** 2
        d = self.delta
        mean = d * state.mean + (1.0 - d) * s
        var = d * state.var + (1.0 - d) * (s - mean) ** 2
        flat = s >= mean + self.threshold_scale(step).to(s.device) * var.sqrt()
        finite = torch.isfinite(s)
        kept = AdaptiveState(
            torch.where(finite, mean, state.mean), torch.where(finite, var, state.var)
        )
        return kept, flat

    def describe(self) -> str:
        return f"when=adaptive({self.total_steps})"


def every(k: int) -> Every:
    """The flat estimator on every k-th step (the first included), the base one on the others.

    Calls 0, k, 2k, ... of the step (its count of calls, ``state.cycle``, skipped steps included)
    are flat: GAM's Appendix C.3 schedule. ``make_step(..., every=k)`` is its shorthand.

    Args:
        k: the period, an integer >= 1 (1: every step).

    Returns:
        An [`Every`][gamfunc.training.when.Every] policy.

    Raises:
        ValueError: ``k`` is not an integer >= 1 (naming it).

    Example:
        >>> import gamfunc
        >>> policy = gamfunc.when.every(3)
        >>> policy.flat(0), policy.flat(1), policy.flat(3)
        (True, False, True)
    """
    check_int("k", k)
    return Every(k)


def late(start: int | float, total_steps: int | None = None) -> Late:
    """The base estimator up to step ``start``, the flat one from there on: flatness late in training.

    Late-phase flatness (SAM run over the last part of the learning-rate schedule only) is one
    switch: flat at call t (counted from 0, skipped steps included) iff t >= ``start``.

    Args:
        start: the first flat step: an integer >= 0, or a float in [0, 1), the fraction of
            ``total_steps`` after which the steps are flat (0.75: the last quarter; the first flat
            step is ⌈0.75·T⌉, the exact ceiling of the fraction as written in decimal, so that
            0.55 of 100 steps is 55 where the float product 0.55·100 rounds above 55). With
            ``total_steps``, the first flat step must be a step of the run (< T).
        total_steps: T, the run's number of steps (the steps are 0 to T − 1); needed with a
            fractional ``start``, optional with an integer one.

    Returns:
        A [`Late`][gamfunc.training.when.Late] policy.

    Raises:
        ValueError: ``start`` is neither an integer >= 0 nor a number in [0, 1), a fraction is
            given without ``total_steps``, ``total_steps`` is not an integer >= 1, or the first
            flat step is T or later, so that no step of the run is flat (naming the argument).

    Example:
        >>> import gamfunc
        >>> policy = gamfunc.when.late(0.75, total_steps=8)
        >>> policy.start, policy.flat(5), policy.flat(6)
        (6, False, True)
    """
    if isinstance(start, float):
        check_unit("start", start)
        if total_steps is None:
            raise ValueError(
                f"total_steps: a fractional start ({start}) is a fraction of the run's steps; "
                f"give total_steps, or start as an integer step"
            )
        check_int("total_steps", total_steps)
        # the decimal as written (repr), not its binary float: ⌈0.55·100⌉ is 55, not 56
        first = math.ceil(Fraction(repr(float(start))) * total_steps)
        _check_reached(first, total_steps, f"{start} of {total_steps} steps is step {first}")
        return Late(first)
    check_int("start", start, at_least=0)
    if total_steps is not None:
        check_int("total_steps", total_steps)
        _check_reached(start, total_steps, f"step {start}")
    return Late(start)


def _check_reached(first: int, total_steps: int, what: str) -> None:
    """Refuse a first flat step that no step of a run of ``total_steps`` steps reaches."""
    if first >= total_steps:
        raise ValueError(
            f"start: the first flat step ({what}) is past the run's last step "
            f"({total_steps - 1}), so no step would be flat; give a start below {total_steps}"
        )


def adaptive(
    total_steps: int, delta: float = 0.9, lambda1: float = -1.0, lambda2: float = 1.0
) -> Adaptive:
    r"""AE-SAM's adaptive policy (Jiang et al. 2023, Algorithm 1): flat where ‖∇L‖² is high.

    At step t the gradient g_t = ∇L(θ_t) is taken first; its squared norm updates exponential
    moving estimates of its mean and variance, and the step is flat where it lies above the mean
    by c_t deviations:

    $$
    \mu_t = \delta\mu_{t-1} + (1-\delta)\lVert g_t\rVert^2,\qquad
    \sigma_t^2 = \delta\sigma_{t-1}^2 + (1-\delta)\,(\lVert g_t\rVert^2 - \mu_t)^2,
    $$

    $$
    \text{flat}_t \iff \lVert g_t\rVert^2 \ge \mu_t + c_t\,\sigma_t,\qquad
    c_t = \tfrac{t}{T}\lambda_1 + \bigl(1 - \tfrac{t}{T}\bigr)\lambda_2,
    $$

    with μ₋₁ = 0 and σ²₋₁ = e⁻¹⁰ (the paper's initial values). c_t moves linearly from λ₂ to λ₁
    over the run, so with λ₁ < λ₂ the threshold falls and more steps are flat as training goes
    on (the paper's reading: the landscape sharpens late). A flat step is the estimator's with
    g_t reused as its pass at θ (SAM: one more gradient); the others are the base's (the
    gradient: g_t itself). δ is ``delta``, λ₁ ``lambda1``, λ₂ ``lambda2``, T ``total_steps``; t
    is the step count (``state.step``), held at T past T. The statistics are in float64, in
    ``state.policy`` ([`AdaptiveState`][gamfunc.training.when.AdaptiveState]), and a skipped step, or
    one whose ‖g_t‖² is not finite (``on_nonfinite="ignore"`` takes it), leaves them as they were.

    Warning:
        The choice reads one boolean on the host at each step (a device synchronisation). Under
        [`gamfunc.cuda_graph`][gamfunc.training.cuda_graphs.cuda_graph] the step is three graphs, the
        probe's and one per branch, with that read between them. A flat step of an estimator
        that takes no pass at θ ([`gamfunc.msam`][gamfunc.estimators.msam.msam],
        [`gamfunc.rwp`][gamfunc.estimators.rwp.rwp] with ``mix=0``) costs one pass more than the
        estimator alone, the probe's. [`make_step`][gamfunc.training.step.make_step] refuses this
        policy beside an estimator of ``perturbation="local"``: the ranks would choose apart.

    Args:
        total_steps: T >= 1, the run's number of steps, over which c_t moves from λ₂ to λ₁.
        delta: δ in [0, 1), the forgetting rate of the running statistics (the paper's 0.9).
        lambda1: λ₁, c_t at the end of the run (the paper's −1).
        lambda2: λ₂, c_t at the start (the paper's 1).

    Returns:
        An [`Adaptive`][gamfunc.training.when.Adaptive] policy.

    Raises:
        ValueError: ``total_steps`` is not an integer >= 1, ``delta`` not in [0, 1), ``lambda1``
            or ``lambda2`` not a finite number (naming the argument).

    Example:
        >>> import torch, gamfunc
        >>> loss_fn = lambda p, b: ((b[0] @ p["w"] - b[1]) ** 2).mean()
        >>> policy = gamfunc.when.adaptive(total_steps=100)
        >>> step = gamfunc.make_step(gamfunc.sam(0.05), gamfunc.sgd(lr=0.1), loss_fn, when=policy)
        >>> params = {"w": torch.zeros(3)}
        >>> state = step.init(params)
        >>> params, state, metrics = step(params, state, (torch.randn(8, 3), torch.randn(8)))
        >>> int(metrics["full_step"]) in (0, 1)
        True

    References:
        Jiang, Yang, Zhang, Kwok, "An Adaptive Policy to Employ Sharpness-Aware Minimization",
        ICLR 2023, https://arxiv.org/abs/2304.14647.
    """
    check_int("total_steps", total_steps)
    check_unit("delta", delta, below_one=True)
    check_number("lambda1", lambda1)
    check_number("lambda2", lambda2)
    return Adaptive(total_steps, float(delta), float(lambda1), float(lambda2), math.exp(-10.0))


def probe(loss_fn, policy: Policy):
    """The first function of a step whose policy chooses on the device: ``probe(params, state,
    batch) -> (clean, policy_state, flat)``, the pass at θ (with its norm), the policy's state with
    ‖∇L(θ)‖ taken in, and the 0-d bool of its choice. A function with its own code object
    (`gamfunc.compile.fresh`), so that it compiles as a graph of its own.

    Args:
        loss_fn: the step's loss (bound to the state's buffers and loss state at each call).
        policy: a policy with ``on_device``.

    Returns:
        The function.
    """

    def probe_fn(params, state, batch):
        with torch.no_grad():
            clean = with_grad_norm(gradient_pass(bind(loss_fn, state), params, batch))
            chosen, flat = policy.choose(state.policy, clean.grad_norm, state.step)
        return clean, chosen, flat

    return fresh(probe_fn)
