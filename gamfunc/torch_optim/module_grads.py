"""``torch.optim``'s closure protocol for the estimators built on gradients alone: the closure is
evaluated on the module itself at each point the estimator asks for, and its gradient read from
``.grad``, as davda54/sam's loop and Lightning's automatic optimisation do.

```text
θ      = the step's parameters (copies), which the module holds between passes
pass p : module ← p; .grad ← None; loss = closure() under enable_grad; g = .grad; module ← θ
step   : direction from the passes' g, then the base optimiser's update from θ
```

A closure that calls ``backward()`` fills ``.grad``; one that only returns the loss is
differentiated here (``torch.autograd.grad`` of the loss it returned), so both kinds give the same
gradient and need not be told apart beforehand.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from gamfunc import tree
from gamfunc.hvps import FiniteDifference
from gamfunc.loss import Objective, Pass
from gamfunc.torch_optim.copies import copy_into

__all__ = ["ModuleGradients", "backward_refusal", "gradients_only", "needs_graph"]

# What torch raises when a closure run by torch.func calls backward() itself: inside a transform
# (compiled or nested passes), or before gamfunc's own backward pass of an eager one.
BACKWARD_INSIDE = (
    "backward() called inside a functorch transform",
    "backward through the graph a second time",
    "element 0 of tensors does not require grad",
)


def gradients_only(*estimators) -> bool:
    """Whether every estimator given (None is skipped), and the base it cycles with, needs only
    gradients: no H·v backend, or the finite difference ([`gamfunc.hvps.fd`][gamfunc.hvps.fd]).

    Args:
        *estimators: the facade's estimator and its ``base``.

    Returns:
        False where one names another H·v backend (``exact()``, ``reverse()``, a function).
    """
    for e in estimators:
        for x in (e, getattr(e, "base", None)):
            hvp = None if x is None else x.hparams.get("hvp")
            if hvp is not None and not isinstance(hvp, FiniteDifference):
                return False
    return True


def needs_graph(hvp) -> str:
    """The one line refusing a closure that calls ``backward()`` to an estimator whose H·v backend
    ``hvp`` differentiates the loss's graph.

    Args:
        hvp: the backend (its repr is named).

    Returns:
        The message, naming the finite-difference backend.
    """
    return (
        f"step(closure): a closure that calls backward() gives gradients only, and hvp={hvp!r} "
        f"differentiates the loss's graph (exact H·v): build the estimator with "
        f"hvp=gamfunc.hvps.fd() (hvp='fd'), return the loss without calling backward(), or pass "
        f"the batch, step((inputs, targets))"
    )


def backward_refusal(error: RuntimeError, precision: str, *estimators) -> Exception | None:
    """The one-line error for a closure that called ``backward()`` where torch.func differentiates
    it (``error``, raised by torch), or None where ``error`` is another.

    Args:
        error: what the step raised.
        precision: the facade's precision.
        *estimators: the estimator and the base it cycles with (None skipped).

    Returns:
        A ValueError naming ``hvp=gamfunc.hvps.fd()`` where an estimator differentiates the loss's
        graph, a RuntimeError naming ``precision='fp32'`` where the precision is another, a
        RuntimeError asking for the loss without ``backward()`` otherwise; None for another error.
    """
    if not any(m in str(error) for m in BACKWARD_INSIDE):
        return None
    graph = [
        h
        for e in estimators
        for x in (e, getattr(e, "base", None))
        if x is not None
        and (h := x.hparams.get("hvp")) is not None
        and not isinstance(h, FiniteDifference)
    ]
    if graph:
        return ValueError(needs_graph(graph[0]))
    if precision != "fp32":
        return RuntimeError(
            f"step(closure): a closure that calls backward() runs in its own precision (autocast "
            f"inside it is yours), which precision={precision!r} cannot scale: build the "
            f"optimiser with precision='fp32', or return the loss without calling backward()"
        )
    return RuntimeError(
        "the closure given to step() must return the loss without calling backward() "
        "(write step(lambda: criterion(model(x), y))): gamfunc differentiates it"
    )


class ModuleGradients(Objective):
    """The loss of ``step(closure)``: ``closure()`` evaluated on the module at each point, its
    gradient from ``.grad``.

    A gradient pass at a point p (a dict of tensors by name) copies p into the module's
    parameters, sets their ``.grad`` to None, calls the closure under ``torch.enable_grad()``, and
    reads each ``.grad``: where the closure called ``backward()``, the gradient it formed (a
    parameter it left without one counts as a zero gradient, as ``torch.func.grad`` gives, where
    ``torch.optim`` would skip the parameter); where it called nothing, ``torch.autograd.grad`` of
    the loss it returned. The module's parameters then hold θ again, and its buffers (BatchNorm's
    running statistics) their values before the pass, whose new values are the pass's ``aux``: the
    step keeps those of the pass at θ, as it does for ``step((inputs, targets))``. The last pass's
    gradient stays in ``.grad``, as after a ``torch.optim`` step.

    `begin` gives it the step's θ and the module's tensors; `end` lets them go.
    """

    def __init__(self):
        self.origin: dict[str, Tensor] | None = None
        self.params: dict[str, Tensor] = {}
        self.buffers: dict[str, Tensor] = {}

    def begin(
        self, origin: dict[str, Tensor], params: dict[str, Tensor], buffers: dict[str, Tensor]
    ) -> None:
        """Start a step.

        Args:
            origin: θ, the step's parameters: copies, not the module's own tensors.
            params: the module's parameters by the names of ``origin``.
            buffers: the module's buffers by name.
        """
        self.origin, self.params, self.buffers = origin, params, buffers

    def end(self) -> None:
        """End a step: forget its tensors."""
        self.origin, self.params, self.buffers = None, {}, {}

    def __call__(self, params, closure):
        return self.gradient_pass(params, closure).loss

    def gradient_pass(self, params, closure) -> Pass:
        keys = list(params)
        held = [self.params[k] for k in keys]
        moved = params is not self.origin
        names = list(self.buffers)
        buffers = list(self.buffers.values())
        with torch.no_grad():
            if moved:
                copy_into(held, [params[k] for k in keys])
            before = tree.copies(buffers) if buffers else []
        try:
            for p in held:
                p.grad = None
            with torch.enable_grad():
                out = closure()
            loss = _loss(out)
            grads: list[Any] = [p.grad for p in held]
            if all(g is None for g in grads) and isinstance(out, Tensor) and out.requires_grad:
                grads = self.differentiate(out, held)
            grads = [
                torch.zeros_like(p) if g is None else g.detach()
                for p, g in zip(held, grads, strict=True)
            ]
            with torch.no_grad():
                aux = dict(zip(names, tree.copies(buffers), strict=True)) if buffers else {}
        finally:
            with torch.no_grad():
                if buffers:
                    copy_into(buffers, before)
                if moved and self.origin is not None:
                    copy_into(held, [self.origin[k] for k in keys])
        return Pass(dict(zip(keys, grads, strict=True)), loss, aux)

    def differentiate(self, loss: Tensor, held: list[Tensor]) -> list[Tensor | None]:
        """∇ of the loss a closure returned without calling ``backward()``, one per ``held``."""
        return list(torch.autograd.grad(loss, held, allow_unused=True, materialize_grads=True))

    def hvp(self, backend, params, batch, v, clean):
        raise ValueError(needs_graph(backend))


def _loss(out) -> Tensor:
    """The closure's loss as a detached 0-d floating-point tensor."""
    if not isinstance(out, Tensor):
        raise TypeError(
            f"the closure must return the loss tensor; it returned {type(out).__name__}"
        )
    if out.ndim != 0 or not out.is_floating_point():
        raise ValueError(
            f"the closure must return a scalar floating-point loss; it returned a {out.dtype} "
            f"tensor of shape {tuple(out.shape)}"
        )
    return out.detach()
