"""Regional compilation: each differentiation pass under ``torch.compile``, the step around it eager.

``torch.compile(step, fullgraph=True)`` traces and lowers a whole step as one graph: for
finite-difference GAM that is four forward-backward passes of the network (paper Appendix D), for exact
GAM two gradients and two Hessian-vector products, and the compile takes several times a gradient
step's. Yet the passes are the same function at different points θ, θ + r·v, θ_adv, ... .
[`compile_passes`][gamfunc.wrappers.regional.compile_passes] compiles that function once and calls it for every pass, so a step compiles in
about the time of one gradient pass (exact GAM: the point pass, ∇L and H·∇L/‖∇L‖ in one graph), whatever the
estimator; the tree math between passes and the optimiser update run eagerly, as ``torch._foreach``
kernels. `gamfunc.Step.compile` with ``scope="pass"`` builds such a step.

The price: no graph spans the whole step, so inductor cannot fuse the update into the last pass's
kernels, and with CUDA graphs each pass is a graph replay of its own (its inputs copied into the
graph's memory, its outputs copied out of it) with eager kernels in between.

Each pass graph holds every block of the network: the repeated blocks of a ResNet or a ViT are traced
and lowered once per call. ``torch.compiler.nested_compile_region`` (torch >= 2.8), which compiles such
a block once and reuses it, cannot mark them here: its region does not trace inside the
``torch.func`` transforms that form every pass (torch 2.14: ``AssertionError: Expected FakeTensor``
from a region called under ``torch.func.grad``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from gamfunc._compat import in_transform
from gamfunc.compiling.compile import compile_with, fresh
from gamfunc.hvps import Normalized, of_gradient, resolve
from gamfunc.loss import Objective, Pass, bind, gradient_pass, with_grad_norm
from gamfunc.tree import Tree

__all__ = ["CompiledPasses", "compile_passes"]


@dataclass(frozen=True, eq=False)
class CompiledPasses(Objective):
    """``loss_fn`` whose gradient passes and exact Hessian-vector products run compiled.

    Built by [`compile_passes`][gamfunc.wrappers.regional.compile_passes]. Outside a step it is ``loss_fn`` itself; inside one
    (`bind`) it carries the step state that the loss reads (BatchNorm buffers, an fp16 loss scale),
    which enters the compiled passes as an input, so a new state never recompiles them.

    Attributes:
        loss_fn: the loss: plain, buffered (``loss_fn(params, batch, buffers)``) or an Objective.
        compiled: the compiled passes, shared by every state this objective is bound to.
        state: the step state without the optimiser's (``None`` outside a step).
    """

    loss_fn: Callable
    compiled: _Passes = field(repr=False)
    state: dict | None = None

    def __call__(self, params: Tree, batch, *args, **kwargs):
        return self._loss()(params, batch, *args, **kwargs)

    def _loss(self):
        return _for_state(self.loss_fn, self.state)

    def gradient_pass(self, params: Tree, batch) -> Pass:
        """∇L(θ), L(θ) and aux from the compiled pass (plain ``gradient_pass`` inside a transform or
        a compiled region, where a nested compile cannot run)."""
        if _traced():
            return gradient_pass(self._loss(), params, batch)
        return Pass(*self.compiled.grad(self.state, params, batch))

    def hvp(self, backend, params: Tree, batch, v, clean: Pass | None):
        """H·v from a compiled pass of ``backend``.

        A vector v, or v(g) with the pass at θ handed in: one compiled H·v pass. v =
        [`gamfunc.hvps.Normalized`][gamfunc.hvps.Normalized] (∇‖∇L‖, the product of GAM and GNP) with no pass at θ: one
        compiled region that forms g, v(g) and H·v(g) (for ``reverse`` one vjp, g from its forward;
        for ``exact`` the gradient and the jvp in one graph). Any other v(g): g from the compiled
        gradient pass, v(g) eagerly, then the H·v pass.
        """
        if _traced():
            return backend(self._loss(), params, batch, v, clean=clean)
        if isinstance(v, Normalized) and clean is None:
            hv, *out = self.compiled.point(backend, v)(self.state, params, batch)
            return hv, Pass(*out)
        if of_gradient(v):
            v, clean = resolve(v, clean if clean is not None else self.gradient_pass(params, batch))
        hv, *out = self.compiled.hvp(backend)(self.state, params, batch, v)
        return hv, clean if clean is not None else Pass(*out)

    # Step state (the protocol of gamfunc.loss.Objective): the state is kept whole and bound
    # inside the compiled passes; init_state and next_state forward to loss_fn (the defaults).
    def bind(self, state) -> CompiledPasses:
        return replace(
            self, state=type(state)(state.step, (), *state[2:])
        )  # not _replace: torch 2.4


def _for_state(loss_fn: Callable, state: dict | None) -> Callable:
    """The two-argument loss of a step whose state is ``state``; ``loss_fn`` outside a step."""
    return loss_fn if state is None else bind(loss_fn, state)


def _traced() -> bool:
    return torch.compiler.is_compiling() or in_transform()


class _Passes:
    """The compiled functions of one [`CompiledPasses`][gamfunc.wrappers.regional.CompiledPasses]: the gradient pass and, made on first
    use, one H·v pass per backend and one point pass per backend and ξ. Each has a code object of its
    own, hence a cache of its own."""

    def __init__(self, loss_fn: Callable, compile_fn: Callable[[Callable], Callable]):
        self.loss_fn, self.compile_fn = loss_fn, compile_fn
        self.grad = compile_fn(_fresh_pass(loss_fn, None))
        self._hvp: dict[Any, Callable] = {}

    def hvp(self, backend) -> Callable:
        if backend not in self._hvp:
            self._hvp[backend] = self.compile_fn(_fresh_pass(self.loss_fn, backend))
        return self._hvp[backend]

    def point(self, backend, v: Normalized) -> Callable:
        """The compiled ``(state, params, batch) -> (H·v(g), g, L, aux, ‖g‖)`` of ``backend``."""
        key = (backend, v)
        if key not in self._hvp:
            self._hvp[key] = self.compile_fn(_fresh_point(self.loss_fn, backend, v))
        return self._hvp[key]


def _fresh_pass(loss_fn: Callable, backend) -> Callable:
    if backend is None:

        def grad_pass(state, params, batch):
            return tuple(gradient_pass(_for_state(loss_fn, state), params, batch))[:3]

        return fresh(grad_pass)

    def hvp_pass(state, params, batch, v):
        hv, p = backend(_for_state(loss_fn, state), params, batch, v)
        return (hv, *tuple(p)[:3])

    return fresh(hvp_pass)


def _fresh_point(loss_fn: Callable, backend, v: Normalized) -> Callable:
    def point_pass(state, params, batch):
        hv, p = backend(_for_state(loss_fn, state), params, batch, v)
        return (hv, *with_grad_norm(p))

    return fresh(point_pass)


def compile_passes(loss_fn: Callable, *, fullgraph: bool = True, mode=None, **kwargs):
    """``loss_fn`` as an Objective whose passes run under ``torch.compile``: regional compilation.

    Every ∇L an estimator forms goes through one compiled gradient pass (its graph: one forward and
    one backward pass of the model), every exact or reverse H·v through one compiled H·v pass per
    backend, and ∇‖∇L‖ at a point with no gradient there yet (GAM, GNP) through one compiled point pass
    that forms ∇L and H·∇L/‖∇L‖ together; finite differences are gradient passes. So every estimator
    built on gradients compiles one graph, exact GAM and exact GNP one too (the point pass), SAM + GAM
    two, whatever the number of passes per step. Hand it to
    [`gamfunc.make_step`][gamfunc.make_step] in place of ``loss_fn``, or use ``step.compile(scope="pass")``.

    Args:
        loss_fn: any gamfunc loss: plain, buffered, or an Objective ([`gamfunc.accumulate`][gamfunc.wrappers.accumulate],
            [`gamfunc.precision.fp16`][gamfunc.wrappers.precision.fp16]), whose passes are then compiled whole.
        fullgraph, mode, kwargs: ``torch.compile``'s, as `gamfunc.Step.compile` takes them
            (``mode="reduce-overhead"``: each pass a CUDA-graph replay, its results copied out).

    Returns:
        A [`CompiledPasses`][gamfunc.wrappers.regional.CompiledPasses] objective.

    Example:
        >>> import torch, gamfunc
        >>> loss_fn = lambda p, b: ((b[0] @ p["w"] - b[1]) ** 2).mean()
        >>> fast = gamfunc.regional.compile_passes(loss_fn, backend="eager")
        >>> step = gamfunc.make_step(gamfunc.gam(0.05, 0.1, hvp="fd"), gamfunc.sgd(lr=0.1), fast)
        >>> params = {"w": torch.zeros(3)}
        >>> params, state, metrics = step(params, step.init(params), (torch.randn(8, 3), torch.randn(8)))
    """
    return CompiledPasses(loss_fn, _Passes(loss_fn, compile_with(fullgraph, mode, kwargs)))
