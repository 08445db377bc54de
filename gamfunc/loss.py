"""The loss contract shared by every estimator, HVP backend and metric.

A ``loss_fn(params, batch)`` returns either a scalar tensor, or ``(loss, aux)`` where ``aux`` is any
pytree of tensors (for models with BatchNorm: the new running statistics, see [`gamfunc.nn`][gamfunc.nn]).
`gradient_pass` is the one place that differentiates it and checks what it returned.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from gamfunc import tree
from gamfunc._compat import in_transform
from gamfunc.tree import Tree

__all__ = [
    "Objective",
    "Pass",
    "ascent_point",
    "bind",
    "check_params",
    "gradient_pass",
    "init_state",
    "loss_and_aux",
    "next_state",
    "unit_grad",
    "with_grad_norm",
]


class Pass(NamedTuple):
    """One evaluation of ∇L at a point: the gradient, the loss there and the ``loss_fn``'s aux.

    ``grad_norm`` is ‖grad‖ once someone has computed it (`with_grad_norm`), so that the
    estimators built on one pass (GAM's oracle, the info dict, the step's finiteness check) compute it
    once; ``()`` until then (an empty pytree node, so a Pass stays a pytree of tensors under ``vmap``).
    Code that changes ``grad`` builds a new Pass, which drops it.
    """

    grad: Tree
    loss: Tensor
    aux: Any
    grad_norm: Tensor | tuple = ()


def with_grad_norm(p: Pass) -> Pass:
    """``p`` carrying ‖∇L‖ in ``grad_norm``, computed unless it is there already."""
    return (
        p if isinstance(p.grad_norm, Tensor) else Pass(p.grad, p.loss, p.aux, tree.norm(p.grad))
    )  # not _replace: torch 2.4's compile stops there


def unit_grad(p: Pass, eps) -> tuple[Tree, Pass]:
    """(∇L/(‖∇L‖ + ξ), ``p`` with its ``grad_norm``), ξ = ``eps``: [`gamfunc.tree.normalize`][gamfunc.tree.normalize] of the
    pass's gradient, reusing a norm the pass already carries."""
    p = with_grad_norm(p)
    return tree.scale(p.grad, (p.grad_norm + eps).reciprocal()), p


def ascent_point(params: Tree, p: Pass, rho, eps) -> tuple[Tree, Pass]:
    """(θ + ρ·∇L/(‖∇L‖ + ξ), ``p`` with its ``grad_norm``): SAM's ascent from θ along the pass's
    gradient, formed as (ρ/(‖∇L‖ + ξ))·∇L + θ, one product per leaf (davda54/sam's order), where
    `unit_grad` and then a step from θ form two."""
    p = with_grad_norm(p)
    return tree.axpy(rho / (p.grad_norm + eps), p.grad, params), p


def loss_and_aux(loss_fn, params: Tree, batch) -> tuple[Tensor, Any]:
    """Call ``loss_fn`` and split its output into ``(loss, aux)``; aux is ``()`` for a plain loss."""
    out = loss_fn(params, batch)
    if isinstance(out, tuple) and len(out) != 2:
        raise TypeError(
            f"loss_fn must return a loss tensor or a pair (loss, aux); it returned a tuple of "
            f"{len(out)}: put everything but the loss into aux, e.g. (loss, (a, b))"
        )
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
    data-parallel reductions, and the protocol of every loss wrapper.

    Every estimator, HVP backend and metric reaches ∇L only through `gradient_pass` and the
    backends of [`gamfunc.hvps`][gamfunc.hvps]. When the ``loss_fn`` they are given is an ``Objective``, those
    delegate to its `gradient_pass` and `hvp`, so a subclass that, say, averages over
    micro-batches or all-reduces across ranks changes every gradient of every estimator at once.
    Calling it as ``objective(params, batch)`` gives the loss.

    The wrappers of [`gamfunc.accumulate`][gamfunc.wrappers.accumulate], [`gamfunc.precision`][gamfunc.wrappers.precision], [`gamfunc.distributed`][gamfunc.wrappers.distributed]
    and [`gamfunc.regional`][gamfunc.wrappers.regional] are Objectives that wrap another loss, held in their ``loss_fn``
    field (frozen dataclasses). The step reaches its state through three methods, which by default
    forward to that wrapped loss, so a wrapper overrides only those it has something to add to:

    * ``bind(state) -> Objective``: the loss of one step, bound to what it reads from the step state
      ([`gamfunc.StepState`][gamfunc.StepState]: its ``buffers``, its ``loss`` such as an fp16 loss scale); it
      stays an Objective. Default: this wrapper around the wrapped loss bound (`bind`).
    * ``init_state(params)``: the loss's own state, which the step keeps in ``state.loss`` (a pytree
      of tensors, e.g. [`gamfunc.precision.LossScale`][gamfunc.wrappers.precision.LossScale]). Default: the wrapped loss's (``()``
      for a plain one).
    * ``next_state(state, finite) -> (loss_state, metrics)``: ``state.loss`` after a step, given
      whether the step was taken, and metrics to report. Default: the wrapped loss's
      (``((), {})``).
    """

    def __call__(self, params: Tree, batch):
        raise NotImplementedError

    def gradient_pass(self, params: Tree, batch) -> Pass:
        raise NotImplementedError

    def hvp(self, backend, params: Tree, batch, v, clean: Pass | None):
        """H·v with ``backend`` (an [`gamfunc.hvps`][gamfunc.hvps] function); returns ``(Hv, clean)``."""
        raise NotImplementedError

    def bind(self, state) -> Objective:
        inner = getattr(self, "loss_fn", None)
        if inner is None or not dataclasses.is_dataclass(self):
            return self
        return dataclasses.replace(self, loss_fn=bind(inner, state))

    def init_state(self, params: Tree) -> Any:
        return init_state(getattr(self, "loss_fn", None), params)

    def next_state(self, state, finite: Tensor) -> tuple[Any, dict]:
        return next_state(getattr(self, "loss_fn", None), state, finite)


def bind(loss_fn, state):
    """The two-argument loss of one step: an Objective binds what it needs from ``state`` (a
    [`gamfunc.StepState`][gamfunc.StepState]) itself (and so keeps forming its own gradients); any other
    ``loss_fn`` gets the state's BatchNorm buffers, if it has any (a dict), as its third argument."""
    if isinstance(loss_fn, Objective):
        return loss_fn.bind(state)
    buffers = state.buffers
    if not isinstance(buffers, dict):  # () : no buffers
        return loss_fn
    return functools.partial(_with_buffers, loss_fn, buffers)


def _with_buffers(loss_fn, buffers, params, batch):
    return loss_fn(params, batch, buffers)


def init_state(loss_fn, params: Tree) -> Any:
    """The state ``loss_fn`` keeps in ``state.loss`` (`Objective.init_state`); ``()`` for a
    plain loss."""
    return loss_fn.init_state(params) if isinstance(loss_fn, Objective) else ()


def next_state(loss_fn, state, finite: Tensor) -> tuple[Any, dict]:
    """``loss_fn``'s state and metrics after a step (`Objective.next_state`); ``((), {})``
    for a plain loss."""
    return loss_fn.next_state(state, finite) if isinstance(loss_fn, Objective) else ((), {})


def gradient_pass(loss_fn, params: Tree, batch) -> Pass:
    """∇L(θ), L(θ) and aux from one forward and one backward pass.

    Under ``torch.compile``, inside a ``torch.func`` transform, or where the caller's autograd records
    (grad mode on and a parameter that requires grad: the result stays differentiable), this is
    ``torch.func.grad``. Otherwise (a step running eagerly) it is ``torch.autograd.grad`` on detached
    copies of the parameters: the same numbers, but ``torch.func.grad`` always differentiates with
    ``create_graph=True`` (so that it nests), which keeps the backward pass's own graph, and with it
    every activation gradient, alive until it returns: about twice the peak memory of a plain backward
    pass, and more Python work per parameter tensor.
    """
    if isinstance(loss_fn, Objective):
        return loss_fn.gradient_pass(params, batch)
    if _plain_autograd(params):
        return _autograd_pass(loss_fn, params, batch)
    g, (loss, aux) = grad_fn(loss_fn, batch)(params)
    return Pass(g, loss, aux)


def _plain_autograd(params: Tree) -> bool:
    """Whether ∇L may come from ``torch.autograd.grad``: eager, outside torch.func transforms, and
    nothing outside asks for a differentiable gradient."""
    if torch.compiler.is_compiling() or in_transform():
        return False
    return not (torch.is_grad_enabled() and any(v.requires_grad for v in params.values()))


def _autograd_pass(loss_fn, params: Tree, batch) -> Pass:
    keys = list(params)
    with torch.enable_grad():
        leaves = [params[k].detach().requires_grad_() for k in keys]
        loss, aux = loss_and_aux(loss_fn, dict(zip(keys, leaves, strict=True)), batch)
        if loss.requires_grad:
            grads = torch.autograd.grad(loss, leaves, allow_unused=True, materialize_grads=True)
        else:  # a loss that does not depend on the parameters (torch.func.grad gives 0 too)
            grads = tuple(torch.zeros_like(v) for v in leaves)
    return Pass(dict(zip(keys, grads, strict=True)), loss.detach(), _detached(aux))


def _detached(aux):
    """``aux`` with its tensors detached; a dict of tensors (BatchNorm statistics) or ``()`` without
    the cost of a pytree walk."""
    if isinstance(aux, dict) and all(isinstance(v, Tensor) for v in aux.values()):
        return {k: v.detach() if v.requires_grad else v for k, v in aux.items()}
    if isinstance(aux, tuple) and not aux:
        return aux
    return pytree.tree_map(lambda x: x.detach() if isinstance(x, Tensor) else x, aux)


def check_params(params: Any) -> None:
    """Raise a clear error unless ``params`` is a non-empty flat dict of floating-point tensors."""
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict[str, Tensor]; got {type(params).__name__}")
    if not params:
        raise ValueError("params is empty: there is nothing to train")
    for k, v in params.items():
        if not isinstance(v, Tensor):
            raise TypeError(f"params[{k!r}] must be a tensor; got {type(v).__name__}")
        if not v.is_floating_point():
            raise TypeError(f"params[{k!r}] must be floating point; got {v.dtype}")
    first = next(iter(params))
    for k, v in params.items():
        if v.device != params[first].device:
            raise ValueError(
                f"params must all be on one device: params[{first!r}] is on "
                f"{params[first].device}, params[{k!r}] on {v.device}; move them with .to(device)"
            )
