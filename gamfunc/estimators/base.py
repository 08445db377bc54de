"""What every gradient estimator is: a pure map (params, batch, loss_fn) -> (direction, info)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import Tensor

from gamfunc.loss import Pass, check_params
from gamfunc.tree import Tree

__all__ = ["Estimate", "Estimator", "Summary", "check_stateless"]


class Summary(NamedTuple):
    """An estimator's row of README's table of estimators, declared beside its factory as
    ``SUMMARY`` (the test of README's table reads it from every factory of `gamfunc.estimators`)."""

    call: str  # the factory's call with its main arguments
    computes: str  # what it descends along: the paper's equation, the paper named
    passes: str  # gradients (forward-backward passes) a step


class Estimate(NamedTuple):
    """An estimator's full result: the direction, its scalar info, the clean pass at θ, for a
    stateful estimator its next state (``()`` for one without state) and, for an estimator with a
    decoupled part, that part (``()`` for one without).

    ``decoupled`` is a tree like the params that the step applies after the optimiser's update,
    scaled by each parameter's learning rate: θ ← apply_updates(θ, u) − lr_k·decoupled_k
    ([`make_step`][gamfunc.training.step.make_step]); WSAM's decoupled form
    ([`wsam`][gamfunc.estimators.wsam.wsam] with ``decouple=True``) returns one.

    Attributes:
        direction: what the base optimiser treats as the gradient, a tree like the params.
        info: scalar tensors, at least ``loss`` and ``grad_norm``.
        clean: the pass at θ (``gamfunc.loss.Pass``); its ``aux`` holds the new buffers.
        state: the next state of a stateful estimator, ``()`` otherwise.
        decoupled: the decoupled part, ``()`` otherwise.
    """

    direction: Tree
    info: dict[str, Tensor]
    clean: Pass
    state: Any = ()
    decoupled: Any = ()


@dataclass(frozen=True, eq=False)
class Estimator:
    """A gradient estimator: call it as ``estimator(params, batch, loss_fn) -> (direction, info)``.

    ``direction`` is shaped like ``params`` and is what a base optimiser treats as the gradient; ``info``
    holds scalar tensors, at least ``"loss"`` (L(θ)) and ``"grad_norm"`` (‖∇L(θ)‖).

    ``run`` is the same computation with two extras used by [`gamfunc.make_step`][gamfunc.make_step] and by estimators
    that nest others (SAM + GAM): ``clean``, the pass at θ if the caller already has it (it is reused,
    not recomputed), and ``step``, the step count at which scheduled hyperparameters are read. It
    returns an [`Estimate`][gamfunc.estimators.base.Estimate] whose ``clean.aux`` is the aux of ``loss_fn`` at θ (new BatchNorm
    statistics), never one from a perturbed point.

    A *stateful* estimator (LookSAM's stored component, Friendly-SAM's running mean) has an
    ``init_fn(params) -> state``, a pytree of tensors; its ``run_fn`` takes the state as a sixth
    argument and returns the next one in ``Estimate.state``, of the same structure. The step keeps
    it in [`StepState.est`][gamfunc.training.state.StepState] and keeps the old one when a step is skipped.
    An estimator with ``every`` = k > 1 is a cycle: ``run_fn`` on every k-th step of
    [`make_step`][gamfunc.training.step.make_step] (the first included), ``base`` on the others, chosen on
    the host so that each step pays only for the branch it runs; ``base`` shares the state.
    An estimator with ``decoupled`` = True returns, besides the direction the optimiser sees, a
    part the step applies after the optimiser's update (``Estimate.decoupled``); called directly,
    ``estimator(params, batch, loss_fn)`` returns the direction alone.

    Attributes:
        name: the estimator's name.
        run_fn: ``run_fn(params, batch, loss_fn, clean, step)`` (stateless) or ``run_fn(params,
            batch, loss_fn, clean, step, state)`` (stateful) returning an Estimate.
        hparams: the hyperparameters, by name.
        init_fn: ``init_fn(params) -> state`` for a stateful estimator; None for one without state.
        every: k >= 1; with k > 1 make_step runs ``base`` on the steps between.
        base: the estimator of the steps between (``every`` > 1), or, for an estimator of
            ``perturbation="local"``, the default base of the steps a ``when=`` policy leaves
            plain (``local(gradient())``).
        decoupled: whether ``run_fn``'s Estimate carries a decoupled part (``Estimate.decoupled``),
            which needs an optimiser that keeps its learning rate.
        state_type: the type of a stateful estimator's state (a NamedTuple such as
            [`LookSAMState`][gamfunc.estimators.looksam.LookSAMState]), where it declares one: a
            step refuses a state of another type in one line (`gamfunc.state.check_est`),
            the state of another estimator with the same layout included.
    """

    name: str
    run_fn: Callable[..., Estimate] = field(repr=False)
    hparams: dict[str, Any] = field(default_factory=dict)
    init_fn: Callable[[Tree], Any] | None = field(default=None, repr=False)
    every: int = 1
    base: Estimator | None = field(default=None, repr=False)
    decoupled: bool = False
    state_type: type | None = field(default=None, repr=False)

    @property
    def stateful(self) -> bool:
        """Whether the estimator carries state from one step to the next."""
        return self.init_fn is not None

    def init(self, params: Tree) -> Any:
        """The state before the first step: ``init_fn(params)``, or ``()`` for no state."""
        return self.init_fn(params) if self.init_fn is not None else ()

    def run(
        self, params: Tree, batch, loss_fn, *, clean: Pass | None = None, step=None, state=()
    ) -> Estimate:
        if self.init_fn is None:
            return self.run_fn(params, batch, loss_fn, clean, step)
        return self.run_fn(params, batch, loss_fn, clean, step, state)

    def __call__(self, params: Tree, batch, loss_fn, *, step=None):
        check_params(params)
        # No autograd graph is needed outside the torch.func transforms; without this, buffers
        # updated in place under a transform can leave one attached to the results.
        with torch.no_grad():
            est = self.run(params, batch, loss_fn, step=step, state=self.init(params))
        return est.direction, est.info


def check_stateless(estimator: Any, argument: str, why: str) -> None:
    """Refuse, in one line, an estimator that is none, or one that carries state between steps
    or cycles over them (``every > 1``), where it is run in a way that needs neither.

    Args:
        estimator: the estimator given.
        argument: the name of the argument that gave it (``"estimator"``, ``"oracle"``).
        why: the end of the message, after ``carries state between steps``: why it cannot
            (``", which m_sharpness: its sub-batches would each need one"``).

    Raises:
        TypeError: ``estimator`` is not an `Estimator`.
        ValueError: it carries state or cycles: ``"{argument}: {name!r} carries state between
            steps{why}"``.
    """
    if not isinstance(estimator, Estimator):
        raise TypeError(f"{argument} must be a gamfunc estimator; got {type(estimator).__name__}")
    if estimator.stateful or estimator.every > 1:
        raise ValueError(f"{argument}: {estimator.name!r} carries state between steps{why}")
