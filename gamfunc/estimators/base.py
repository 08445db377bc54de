"""What every gradient estimator is: a pure map (params, batch, loss_fn) -> (direction, info)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import Tensor

from gamfunc.loss import Pass, check_params
from gamfunc.tree import Tree

__all__ = ["Estimate", "Estimator"]


class Estimate(NamedTuple):
    """An estimator's full result: the direction, its scalar info, and the clean pass at θ."""

    direction: Tree
    info: dict[str, Tensor]
    clean: Pass


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
    """

    name: str
    run_fn: Callable[..., Estimate] = field(repr=False)
    hparams: dict[str, Any] = field(default_factory=dict)

    def run(
        self, params: Tree, batch, loss_fn, *, clean: Pass | None = None, step=None
    ) -> Estimate:
        return self.run_fn(params, batch, loss_fn, clean, step)

    def __call__(self, params: Tree, batch, loss_fn, *, step=None):
        check_params(params)
        # No autograd graph is needed outside the torch.func transforms; without this, buffers
        # updated in place under a transform can leave one attached to the results.
        with torch.no_grad():
            est = self.run(params, batch, loss_fn, step=step)
        return est.direction, est.info
