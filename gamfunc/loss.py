"""The loss contract shared by every estimator, HVP backend and metric.

A ``loss_fn(params, batch)`` returns either a scalar tensor, or ``(loss, aux)`` where ``aux`` is any
pytree of tensors (for models with BatchNorm: the new running statistics, see :mod:`gamfunc.nn`).
:func:`gradient_pass` is the one place that differentiates it and checks what it returned.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from gamfunc.tree import Tree

__all__ = ["Objective", "Pass", "check_params", "gradient_pass", "loss_and_aux"]


class Pass(NamedTuple):
    """One evaluation of ∇L at a point: the gradient, the loss there and the ``loss_fn``'s aux."""

    grad: Tree
    loss: Tensor
    aux: Any


def loss_and_aux(loss_fn, params: Tree, batch) -> tuple[Tensor, Any]:
    """Call ``loss_fn`` and split its output into ``(loss, aux)``; aux is ``()`` for a plain loss."""
    out = loss_fn(params, batch)
    loss, aux = out if isinstance(out, tuple) else (out, ())
    if not isinstance(loss, Tensor):
        raise TypeError(f"loss_fn must return a tensor or (tensor, aux); it returned {type(loss)}")
    if loss.ndim != 0:
        raise ValueError(
            f"loss_fn must return a scalar (0-d) loss; it returned shape {tuple(loss.shape)}"
        )
    if not loss.is_floating_point():
        raise TypeError(f"loss_fn must return a floating-point loss; it returned {loss.dtype}")
    return loss, aux


def _with_aux(loss_fn, batch):
    def f(p: Tree):
        loss, aux = loss_and_aux(loss_fn, p, batch)
        return loss, (loss.detach(), aux)

    return f


def grad_fn(loss_fn, batch):
    """``p -> (∇L(p), (L(p), aux))``: ``torch.func.grad`` of ``loss_fn`` with the loss as aux."""
    return torch.func.grad(_with_aux(loss_fn, batch), has_aux=True)


class Objective:
    """A loss whose gradients are formed in a custom way: the hook for gradient accumulation and
    data-parallel reductions.

    Every estimator, HVP backend and metric reaches ∇L only through :func:`gradient_pass` and the
    backends of :mod:`gamfunc.hvp`. When the ``loss_fn`` they are given is an ``Objective``, those
    delegate to its :meth:`gradient_pass` and :meth:`hvp`, so a subclass that, say, averages over
    micro-batches or all-reduces across ranks changes every gradient of every estimator at once.
    Calling it as ``objective(params, batch)`` gives the loss.
    """

    def __call__(self, params: Tree, batch):
        raise NotImplementedError

    def gradient_pass(self, params: Tree, batch) -> Pass:
        raise NotImplementedError

    def hvp(self, backend, params: Tree, batch, v, clean: Pass | None):
        """H·v with ``backend`` (an :mod:`gamfunc.hvp` function); returns ``(Hv, clean)``."""
        raise NotImplementedError


def gradient_pass(loss_fn, params: Tree, batch) -> Pass:
    """∇L(θ), L(θ) and aux from one forward and one backward pass."""
    if isinstance(loss_fn, Objective):
        return loss_fn.gradient_pass(params, batch)
    g, (loss, aux) = grad_fn(loss_fn, batch)(params)
    return Pass(g, loss, aux)


def check_params(params: Any) -> None:
    """Raise a clear error unless ``params`` is a flat dict of floating-point tensors."""
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict[str, Tensor]; got {type(params).__name__}")
    for k, v in params.items():
        if not isinstance(v, Tensor):
            raise TypeError(f"params[{k!r}] must be a tensor; got {type(v).__name__}")
        if not v.is_floating_point():
            raise TypeError(f"params[{k!r}] must be floating point; got {v.dtype}")
