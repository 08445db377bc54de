"""What the metric modules share: one way to evaluate the loss, H·v at a point, flat vectors, draws.

Every metric of [`gamfunc.metrics`][gamfunc.metrics] evaluates the loss the same way, through `bound_loss`:

* a plain ``loss_fn(params, batch)`` (a scalar, or ``(loss, aux)`` whose aux is ignored) is used as is;
* with ``buffers=`` given, ``loss_fn`` is the buffered form of [`gamfunc.nn.functionalize`][gamfunc.nn.functionalize],
  ``loss_fn(params, batch, buffers, train=bool) -> (loss, new_buffers)``, and ``mode`` picks
  BatchNorm's statistics: ``"eval"`` normalises with the running statistics in ``buffers``,
  ``"train"`` with the statistics of the batch. The new buffers are thrown away; the ones given are
  never modified.

None of these is part of the public API.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor

from gamfunc import hvps
from gamfunc.loss import Objective, grad_fn, gradient_pass
from gamfunc.tree import Tree

MODES = ("train", "eval")


def bound_loss(loss_fn, buffers=None, mode: str = "eval"):
    """A two-argument ``loss(params, batch)`` from either form of the loss contract (see module doc)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}; got {mode!r}")
    if buffers is None:
        return loss_fn
    train = mode == "train"

    def loss(params, batch):
        value, _new_buffers = loss_fn(params, batch, buffers, train=train)
        return value

    return loss


def flat(t: Tree) -> Tensor:
    """All entries of a parameter dict as one vector (in the dict's order)."""
    return torch.cat([v.reshape(-1) for v in t.values()])


def unflat(x: Tensor, like: Tree) -> Tree:
    """The inverse of `flat`: a vector cut into tensors shaped like ``like``."""
    out, i = {}, 0
    for k, v in like.items():
        n = v.numel()
        out[k] = x[i : i + n].reshape(v.shape).to(v.dtype)
        i += n
    return out


def make_generator(generator: torch.Generator | None, params: Tree) -> torch.Generator:
    """``generator``, or a fresh one seeded with 0 on the params' device (so calls repeat exactly)."""
    if generator is not None:
        return generator
    device = next(iter(params.values())).device
    return torch.Generator(device=device).manual_seed(0)


def gaussian(n: int, generator: torch.Generator, like: Tensor) -> Tensor:
    """n standard normal numbers from ``generator``, on the device and in the dtype of ``like``."""
    z = torch.randn(n, generator=generator, device=generator.device, dtype=like.dtype)
    return z.to(like.device)


def rademacher(n: int, generator: torch.Generator, like: Tensor) -> Tensor:
    """n independent ±1 (probability ½ each) from ``generator``, on the device/dtype of ``like``."""
    bits = torch.randint(0, 2, (n,), generator=generator, device=generator.device)
    return (2 * bits - 1).to(device=like.device, dtype=like.dtype)


def hessian_operator(loss, params: Tree, batch, hvp="exact"):
    """``v -> H(θ)·v`` at the fixed point θ = ``params``, for dict-shaped v (vmap-able).

    ``hvp`` is a backend of [`gamfunc.hvps`][gamfunc.hvps] or its name ([`gamfunc.hvps.get`][gamfunc.hvps.get];
    "fd" is ``hvps.fd()``, r = 1e-3). For ``reverse()`` the
    gradient is linearised once (``torch.func.vjp`` of ``torch.func.grad``) and its pullback reused
    for every product: each H·v then costs one backward pass through the gradient's graph instead of
    a forward, a backward and that pass (the graph is kept in memory meanwhile). ``fd(radius=r)`` computes
    ∇L(θ) once and rescales v to unit norm, so that the radius r is a distance in parameter space.

    The products come from torch.func's transforms alone, under ``torch.no_grad()`` as in a step:
    otherwise a pullback called with gradients enabled (the reverse backend's, per batch of a
    [`DataMean`][gamfunc.metrics.model.DataMean]) would build a graph of its own, and return
    products that require grad, which the metrics' floats would warn about.
    """
    backend = hvps.get(hvp)
    if isinstance(backend, hvps.Reverse) and not isinstance(loss, Objective):
        with hvps.math_attention():
            _g, pullback, _aux = torch.func.vjp(  # type: ignore[misc]  # has_aux: 3 values
                grad_fn(loss, batch), params, has_aux=True
            )

        def reverse_matvec(v: Tree) -> Tree:
            return pullback(v, create_graph=False)[0]

        return reverse_matvec

    if not isinstance(backend, hvps.FiniteDifference):

        @torch.no_grad()
        def matvec(v: Tree) -> Tree:
            return backend(loss, params, batch, v)[0]

        return matvec

    with torch.no_grad():
        clean = gradient_pass(loss, params, batch)

    @torch.no_grad()
    def fd_matvec(v: Tree) -> Tree:
        n = torch.sqrt(cast(Tensor, sum(torch.sum(t * t) for t in v.values())))
        hv, _ = backend(loss, params, batch, {k: t / n for k, t in v.items()}, clean=clean)
        return {k: t * n for k, t in hv.items()}

    return fd_matvec


def orthogonalise(w: Tensor, basis: Tensor) -> Tensor:
    """w minus its projection on the rows of ``basis`` (orthonormal), twice ("twice is enough")."""
    for _ in range(2):
        w = w - basis.T @ (basis @ w)
    return w


def tridiagonal(alphas: list[float], betas: list[float]) -> Tensor:
    """The symmetric tridiagonal matrix (float64) with diagonal α and off-diagonal β of Lanczos."""
    t = torch.diag(torch.tensor(alphas, dtype=torch.float64))
    if betas:
        off = torch.tensor(betas, dtype=torch.float64)
        t = t + torch.diag(off, 1) + torch.diag(off, -1)
    return t
