"""Hessian-vector products behind one signature, and ∇‖∇L‖ = H·g/‖g‖ built on any of them.

Every backend is a value that is called as:

```text
hvp(loss_fn, params, batch, v, *, clean=None) -> (Hv, clean)
```

where ``v`` is a dict shaped like ``params``, or a callable ``v(g)`` of the gradient g = ∇L(θ) (so that
g and H·v(g) come from one pass where the backend allows it; [`of_gradient`][gamfunc.hvps.of_gradient] tells them apart and
[`resolve`][gamfunc.hvps.resolve] turns either into a vector at a pass; the wrappers use the same two), and ``clean`` is the
`Pass` at θ (gradient, loss, aux). A ``clean`` handed in is reused, never
recomputed, where the backend can; the one returned is always the pass at θ.

Backends (``hvp=`` everywhere in gamfunc takes one of these values, or its name as a shorthand for
its default value; a finite-difference radius is given only as ``fd(radius=r)``):

* ``exact()`` (``"exact"``): forward-over-reverse, H·v = ∂/∂ε ∇L(θ + εv)|₀ by ``torch.func.jvp`` of
  ``torch.func.grad``. Costs about one gradient plus one forward-mode pass.
* ``reverse()`` (``"reverse"``): reverse-over-reverse, H·v = ∇⟨∇L(θ), v⟩ by ``torch.func.vjp`` of
  ``torch.func.grad`` (the Hessian is symmetric). For operations without forward-mode AD.
* ``fd(radius=r)`` (``"fd"``: r = [`DEFAULT_RADIUS`][gamfunc.hvps.DEFAULT_RADIUS], 1e-3): the finite difference of paper
  Appendix D, H·v ≈ (∇L(θ + r·v) − ∇L(θ)) / r. Costs one gradient beyond ∇L(θ).

Each is a frozen dataclass: equal backends compare equal and hash alike (so a compiled pass of
[`gamfunc.regional`][gamfunc.wrappers.regional] is made once per backend), and the repr is the call that builds it,
``fd(radius=0.001)``. Any function of the signature above is a backend too.

Warning:
    On ReLU or max-pool networks the finite difference does not converge to the autodiff product as
    r → 0: autodiff's Hessian ignores the kinks that θ + r·v crosses. There ``"fd"`` and ``"exact"``
    are different estimators, not one estimator at two precisions. On smooth networks (tanh, GELU) the
    error is O(r).

Fused and flash scaled-dot-product-attention kernels have neither double backward nor forward-mode AD,
so ``"exact"`` and ``"reverse"`` run under ``sdpa_kernel(SDPBackend.MATH)``; ``"fd"`` keeps the fast kernels.

References:
    Pearlmutter, "Fast exact multiplication by the Hessian", Neural Computation, 1994.
    Zhang et al., "Gradient Norm Aware Minimization Seeks First-Order Flatness and Improves
    Generalization", CVPR 2023, https://arxiv.org/abs/2303.03108 (Eq. 5 and Appendix D).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from gamfunc import tree
from gamfunc._compat import load_jvp_decompositions
from gamfunc.loss import Objective, Pass, grad_fn, gradient_pass, unit_grad, with_grad_norm
from gamfunc.tree import Tree

if TYPE_CHECKING:
    from typing_extensions import TypeIs

__all__ = [
    "BACKENDS",
    "DEFAULT_RADIUS",
    "SECOND_ORDER",
    "Exact",
    "FiniteDifference",
    "Normalized",
    "Reverse",
    "exact",
    "fd",
    "forward_mode",
    "get",
    "grad_norm_grad",
    "math_attention",
    "of_gradient",
    "read_through",
    "resolve",
    "reverse",
]

Vector = Tree | Callable[[Tree], Tree]


def math_attention():
    """A context that routes scaled-dot-product attention to the math kernel, the one with double
    backward and forward-mode AD.

    Returns:
        The context manager (one that does nothing where torch has no ``sdpa_kernel``).
    """
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # pragma: no cover - torch < 2.3
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.MATH])


_DTYPE_MISMATCH = ("same dtype", "should be the same")


def _jvp_of_grad(loss_fn, params: Tree, batch, v: Tree):
    """``torch.func.jvp`` of ∇L at θ along v, its dtype-mismatch errors explained (eager only: under
    ``torch.compile`` the same failure surfaces while tracing)."""
    jvp = functools.partial(torch.func.jvp, grad_fn(loss_fn, batch), (params,), (v,), has_aux=True)
    if torch.compiler.is_compiling():
        return jvp()
    load_jvp_decompositions()
    try:
        return jvp()
    except RuntimeError as e:
        if not any(s in str(e) for s in _DTYPE_MISMATCH):
            raise
        raise RuntimeError(
            "hvp='exact' (forward-mode AD over the gradient) failed on mixed dtypes: a torch.autocast "
            "inside loss_fn covers its forward pass but not the backward pass that forward-mode AD "
            "differentiates. Wrap the plain loss with gamfunc.precision.bf16 or fp16 instead (they "
            f"run that backward pass under autocast too), or use hvp='reverse' or 'fd'. torch said: {e}"
        ) from e


@dataclasses.dataclass(frozen=True, repr=False)
class Exact:
    """H·v by forward-over-reverse: ``torch.func.jvp(torch.func.grad(L), (θ,), (v,))``. Built by
    [`exact`][gamfunc.hvps.exact]."""

    def __call__(self, loss_fn, params: Tree, batch, v: Vector, *, clean: Pass | None = None):
        if isinstance(loss_fn, Objective):
            return loss_fn.hvp(self, params, batch, v, clean)
        if of_gradient(v):
            v, clean = resolve(
                v, clean if clean is not None else gradient_pass(loss_fn, params, batch)
            )
        with math_attention():
            g, hv, (loss, aux) = _jvp_of_grad(loss_fn, params, batch, v)
        # The jvp's primal is ∇L(θ) again; a clean pass we already hold is kept, so that what is
        # built on it (the oracle of GAM) sees the very same gradient as the plain estimator would.
        return hv, clean if clean is not None else Pass(g, loss, aux)

    def __repr__(self) -> str:
        return "exact()"


@dataclasses.dataclass(frozen=True, repr=False)
class Reverse:
    """H·v by reverse-over-reverse: ``torch.func.vjp(torch.func.grad(L), θ)`` applied to v. Built by
    [`reverse`][gamfunc.hvps.reverse]."""

    def __call__(self, loss_fn, params: Tree, batch, v: Vector, *, clean: Pass | None = None):
        if isinstance(loss_fn, Objective):
            return loss_fn.hvp(self, params, batch, v, clean)
        del clean  # the vjp's forward pass yields ∇L(θ) anyway
        with math_attention():
            g, vjp_fn, (loss, aux) = torch.func.vjp(  # type: ignore[misc]  # has_aux: 3 values
                grad_fn(loss_fn, batch), params, has_aux=True
            )
            v, clean = resolve(v, Pass(g, loss, aux))
            (hv,) = vjp_fn(v)
        return hv, clean

    def __repr__(self) -> str:
        return "reverse()"


@dataclasses.dataclass(frozen=True, repr=False)
class FiniteDifference:
    """H·v ≈ (∇L(θ + r·v) − ∇L(θ)) / r, r = ``radius``. Built by [`fd`][gamfunc.hvps.fd]; built
    directly it checks r as ``fd`` does, so both give one value.

    Attributes:
        radius: r > 0, a finite float.
    """

    radius: float

    def __post_init__(self):
        object.__setattr__(self, "radius", _radius("radius", self.radius))

    def __call__(self, loss_fn, params: Tree, batch, v: Vector, *, clean: Pass | None = None):
        # An Objective needs no special case: the two gradients below go through gradient_pass.
        if clean is None:
            clean = gradient_pass(loss_fn, params, batch)
        v, clean = resolve(v, clean)
        g_r = gradient_pass(loss_fn, tree.axpy(self.radius, v, params), batch).grad
        return tree.scale(tree.sub(g_r, clean.grad), 1.0 / self.radius), clean

    def __repr__(self) -> str:
        return f"fd(radius={self.radius!r})"


def exact() -> Exact:
    """The forward-over-reverse backend: H·v = ∂/∂ε ∇L(θ + εv)|₀, about one gradient plus one
    forward-mode pass. ``hvp="exact"`` is short for it.

    Returns:
        The backend value ``exact()``, equal to every other ``exact()``.
    """
    return Exact()


def reverse() -> Reverse:
    """The reverse-over-reverse backend: H·v = ∇⟨∇L(θ), v⟩, for operations without forward-mode AD.
    ``hvp="reverse"`` is short for it.

    Returns:
        The backend value ``reverse()``, equal to every other ``reverse()``.
    """
    return Reverse()


DEFAULT_RADIUS = 1e-3
"""r of [`fd`][gamfunc.hvps.fd] when none is given, so of ``hvp="fd"`` wherever ``hvp=`` is taken.

The default backend of [`gamfunc.gnp`][gamfunc.estimators.gnp.gnp] is ``fd(radius=1e-2)``, 10·r:
its difference of two gradients is weighted by α/r where GAM's is weighted by α·ρ/r with
ρ ≈ 0.05, so a ten times larger r amplifies the gradients' rounding about as much (α·ρ/r = 5 in
GAM, α/r = 10 in GNP for α = 0.1, ρ = 0.05)."""


def fd(radius: float = DEFAULT_RADIUS) -> FiniteDifference:
    """The finite-difference backend of paper Appendix D: H·v ≈ (∇L(θ + r·v) − ∇L(θ)) / r.

    One gradient beyond ∇L(θ). On smooth networks the error is O(r); on ReLU networks see the
    module's warning. ``hvp="fd"`` is short for ``fd()`` everywhere; this function is the one
    place a radius is given. [`gamfunc.gnp`][gamfunc.estimators.gnp.gnp]'s default backend is
    ``fd(radius=1e-2)`` (see [`DEFAULT_RADIUS`][gamfunc.hvps.DEFAULT_RADIUS]).

    Args:
        radius: r > 0, finite; [`DEFAULT_RADIUS`][gamfunc.hvps.DEFAULT_RADIUS] (1e-3) by default.

    Returns:
        The backend value ``fd(radius=r)``; two are equal when their radii are.

    Raises:
        ValueError: ``radius`` is not a finite number > 0.

    Example:
        >>> from gamfunc import hvps
        >>> hvps.fd(radius=1e-2)
        fd(radius=0.01)
        >>> hvps.fd() == hvps.get("fd")
        True
    """
    return FiniteDifference(radius)


def _radius(name: str, r) -> float:
    if isinstance(r, bool) or not isinstance(r, int | float) or not (0 < r < math.inf):
        raise ValueError(f"{name} must be a finite number > 0; got {r!r}")
    return float(r)


BACKENDS = ("exact", "reverse", "fd")
"""The names ``hvp=`` takes as shorthands for [`exact`][gamfunc.hvps.exact], [`reverse`][gamfunc.hvps.reverse] and [`fd`][gamfunc.hvps.fd]."""


def forward_mode(hvp) -> bool:
    """Whether the H·v backend ``hvp`` differentiates by forward-mode AD: [`exact`][gamfunc.hvps.exact] does
    (forward-over-reverse), [`reverse`][gamfunc.hvps.reverse] and [`fd`][gamfunc.hvps.fd] do not.

    An estimator's backend is its ``hparams["hvp"]`` (GAM and the estimators built on it, GNP); an
    estimator without that entry forms no H·v. Run eagerly, forward-over-reverse AD costs several
    times its compiled form, where the gradients that ``reverse`` and ``fd`` are made of run close to
    theirs; a program choosing between an eager and a compiled step can ask this.

    Args:
        hvp: a backend, the name of one, or None (no H·v).

    Returns:
        True for ``exact()`` and ``"exact"``; False for the other backends, for None, and for a
            function of your own (gamfunc cannot tell how it differentiates).

    Example:
        >>> import gamfunc
        >>> est = gamfunc.gam(rho=0.05, alpha=0.1, hvp="exact")
        >>> gamfunc.hvps.forward_mode(est.hparams["hvp"]), gamfunc.hvps.forward_mode("fd")
        (True, False)
    """
    return isinstance(hvp, Exact) or (isinstance(hvp, str) and hvp == "exact")


SECOND_ORDER = (Exact(), Reverse())
"""The backends that differentiate the backward pass of L (the wrappers of [`gamfunc.precision`][gamfunc.wrappers.precision]
run it under autocast for them)."""


def get(hvp="exact"):
    """The backend ``hvp=`` names: a name of [`BACKENDS`][gamfunc.hvps.BACKENDS] for its default value,
    or a backend (a value such as ``fd(radius=1e-2)``, or any function of the backends' signature)
    as it is.

    The names are shorthands for the defaults: "exact" is ``exact()``, "reverse" is ``reverse()``
    and "fd" is ``fd()``, r = [`DEFAULT_RADIUS`][gamfunc.hvps.DEFAULT_RADIUS] = 1e-3. Another radius
    is ``fd(radius=r)``, the one place a radius is given.

    For ``exact()`` it loads torch's forward-mode decompositions now, outside any compiled region
    (`gamfunc._compat.load_jvp_decompositions`): traced under ``torch.compile``, the first
    ``jvp`` would load them inside the trace, where the warning that gives reaches the user.

    Args:
        hvp: "exact" (default), "reverse", "fd" (``fd()``, r = 1e-3) or a backend.

    Returns:
        The backend.

    Raises:
        ValueError: ``hvp`` is neither a name of [`BACKENDS`][gamfunc.hvps.BACKENDS] nor callable.

    Example:
        >>> from gamfunc import hvps
        >>> hvps.get("fd")
        fd(radius=0.001)
        >>> hvps.get(hvps.fd(radius=1e-2))
        fd(radius=0.01)
    """
    if isinstance(hvp, str):
        if hvp not in BACKENDS:
            raise ValueError(
                f"hvp must be one of {BACKENDS} or a backend of gamfunc.hvps; got {hvp!r}"
            )
        hvp = {"exact": Exact(), "reverse": Reverse(), "fd": FiniteDifference(DEFAULT_RADIUS)}[hvp]
    elif not callable(hvp):
        raise ValueError(f"hvp must be one of {BACKENDS} or a backend of gamfunc.hvps; got {hvp!r}")
    if isinstance(hvp, Exact):
        load_jvp_decompositions()
    return hvp


@dataclasses.dataclass(frozen=True)
class Normalized:
    """The vector v(g) = g/(‖g‖ + ξ) of ∇‖∇L‖ = H·g/‖g‖ (paper Eq. 6), as a function of g = ∇L(θ).

    A value, not a closure: two are equal when their ξ are, so a compiled pass that forms g and
    H·v(g) in one region ([`gamfunc.regional`][gamfunc.wrappers.regional]) is made once per ξ and reused at every point.

    Attributes:
        eps: ξ >= 0, added to ‖g‖ before dividing.
    """

    eps: float

    def __call__(self, g: Tree) -> Tree:
        return tree.normalize(g, self.eps)[0]


def of_gradient(v: Vector) -> TypeIs[Callable[[Tree], Tree]]:
    """Whether ``v`` is a function v(g) of the gradient g = ∇L(θ) rather than a fixed vector (a dict).

    The one test of the vector protocol that every backend and every wrapper ([`gamfunc.accumulate`][gamfunc.wrappers.accumulate],
    [`gamfunc.precision`][gamfunc.wrappers.precision], [`gamfunc.regional`][gamfunc.wrappers.regional]) uses: ``isinstance(v, dict)``, because dynamo
    on torch 2.11 cannot trace ``callable`` of a dict.

    Args:
        v: a vector (a dict shaped like the parameters) or a function of the gradient.

    Returns:
        True for a function of the gradient.
    """
    return not isinstance(v, dict)


def resolve(v: Vector, p: Pass) -> tuple[Tree, Pass]:
    """The vector ``v`` at the pass ``p``: v itself, or v(g) for a function of g = ``p.grad``.

    Args:
        v: a vector or a function of the gradient.
        p: the pass at θ.

    Returns:
        ``(v, p)`` for a fixed v; ``(v(g), p)`` for a function of g. A [`Normalized`][gamfunc.hvps.Normalized] v leaves
            the norm it takes in the returned pass, so that ‖g‖ is computed once.
    """
    if not of_gradient(v):
        return v, p
    if isinstance(v, Normalized):
        return unit_grad(p, v.eps)
    return v(p.grad), p


def read_through(v: Vector, fn: Callable[[Tree], Tree]) -> Vector:
    """v(fn(g)): a function of the gradient that reads g through ``fn``.

    Args:
        v: a vector or a function of the gradient.
        fn: a map of gradients (for example a loss scale taken off).

    Returns:
        ``g -> v(fn(g))`` for a function of the gradient; a fixed v as it is.
    """
    return (lambda g: v(fn(g))) if of_gradient(v) else v


def grad_norm_grad(loss_fn, params: Tree, batch, hvp="exact", *, eps: float = 1e-12, clean=None):
    """f = ∇‖∇L‖(θ) ≈ H(θ)·g/(‖g‖ + ξ), g = ∇L(θ) (paper Eq. 6; ξ is ``eps``).

    With a ``clean`` handed in, v = g/(‖g‖ + ξ) is formed from it and the backend gets a vector;
    without, the backend gets [`Normalized`][gamfunc.hvps.Normalized] and forms g itself, in the same pass as H·v where
    it can (``reverse()``: the vjp whose forward yields g), and ‖g‖ once.

    Args:
        loss_fn: the loss (plain, buffered-and-bound, or an Objective).
        params: θ.
        batch: the batch ``loss_fn`` takes.
        hvp: a backend, or its name ([`get`][gamfunc.hvps.get]): "exact" (default), "reverse",
            "fd" (``fd()``, r = 1e-3).
        eps: ξ.
        clean: the pass at θ, where the caller has it.

    Returns:
        ``(f, clean)`` with ``clean`` the pass at θ (its gradient is g), carrying ‖g‖ as its
            ``grad_norm``.

    Raises:
        ValueError: ``hvp`` is not a backend ([`get`][gamfunc.hvps.get]).
    """
    if isinstance(hvp, str) or not callable(hvp):
        hvp = get(hvp)
    if clean is not None:
        v, clean = unit_grad(clean, eps)
        f, _ = hvp(loss_fn, params, batch, v, clean=clean)
        return f, clean
    f, out = hvp(loss_fn, params, batch, Normalized(eps))
    return f, with_grad_norm(out)
