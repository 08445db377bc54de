"""The Hessian spectrum and trace: the k largest eigenvalues (Lanczos or power iteration) and
Hutchinson's trace estimate, both from Hessian-vector products only.

The loss is read as every metric reads it, plain or with BatchNorm ``buffers=`` and ``mode``
(`gamfunc.metrics._common`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

import torch
from torch import Tensor

from gamfunc import hvps
from gamfunc.checks import check_int, check_positive
from gamfunc.loss import Objective, check_params
from gamfunc.metrics._common import (
    bound_loss,
    flat,
    gaussian,
    hessian_operator,
    make_generator,
    orthogonalise,
    rademacher,
    tridiagonal,
    unflat,
)
from gamfunc.metrics.guard import measurable
from gamfunc.metrics.model import takes_model
from gamfunc.tree import Tree

__all__ = ["hessian_trace", "top_eigenvalues"]

METHODS = ("lanczos", "power")


# ---- top eigenvalues -----------------------------------------------------------------------------


@torch.no_grad()
def _k(k: int = 1, *args, **kwargs) -> tuple[int]:
    return (kwargs.get("k", k),)


@takes_model
@measurable(_k, pair="return_eigenvectors")
def top_eigenvalues(
    params: Tree,
    batch,
    loss_fn,
    k: int = 1,
    iters: int = 100,
    tol: float = 1e-4,
    generator: torch.Generator | None = None,
    *,
    method: str = "lanczos",
    hvp="reverse",
    return_eigenvectors: bool = False,
    buffers=None,
    mode: str = "eval",
    callback: Callable[[int], None] | None = None,
):
    """The k largest eigenvalues λ_1 ≥ … ≥ λ_k of the Hessian H = ∇²L(θ), from H·v products only.

    ``method="lanczos"`` (default) runs the Lanczos iteration with full reorthogonalisation: after j
    products, the Rayleigh–Ritz values of H on the Krylov space span{q, Hq, …, H^{j−1}q} (the
    eigenvalues of the tridiagonal T_j = Q_jᵀ H Q_j) approximate the extreme eigenvalues. It stops
    once each of the k largest Ritz pairs (θ_i, x_i) has residual ‖H x_i − θ_i x_i‖ ≤ tol·|θ_i|
    (with a floor of eps^(2/3)·‖T_j‖, as ARPACK), which puts a true eigenvalue within tol·|θ_i| of
    θ_i (and within about (tol·θ_i)²/gap), or after ``iters`` products. k = 50, as in the paper's
    histogram of the top-50 eigenvalues, costs one Krylov space, not 50 separate runs.

    ``method="power"`` is PyHessian's power iteration with deflation (Yao et al. 2020), used by the
    paper (Section 5.4): for i = 1..k, v ← H v/‖H v‖ with v kept orthogonal to the eigenvectors
    found so far, λ_i = vᵀHv, until |Δλ_i| ≤ tol·(|λ_i| + 1e-6) or ``iters`` products per eigenvalue.

    Args:
        params: θ, a flat dict of tensors.
        batch: the batch ``loss_fn`` takes.
        loss_fn: L, ``loss_fn(params, batch)`` (a scalar or ``(loss, aux)``), or the buffered form
            when ``buffers`` is given (see `gamfunc.metrics._common`).
        k: how many eigenvalues.
        iters: the most Hessian-vector products (Lanczos), or per eigenvalue (power).
        tol: the relative tolerance above.
        generator: draws the start vector(s); None uses a generator seeded with 0, so that a call
            always gives the same result.
        method: "lanczos" or "power".
        hvp: the Hessian-vector product: "reverse" (default: the gradient is linearised once, then
            each product is one backward pass, as PyHessian's retained graph; the fastest measured),
            "exact" (forward-over-reverse, no graph kept between products), "fd" (the finite
            difference ``hvps.fd()``, r = 1e-3; Lanczos may then stop at ``iters`` rather than
            ``tol``), or a backend of [`gamfunc.hvps`][gamfunc.hvps], such as
            ``hvps.fd(radius=r)`` for another radius.
        return_eigenvectors: also return the unit eigenvectors, as a list of k dicts.
        buffers: BatchNorm buffers for a buffered ``loss_fn``; never modified.
        mode: "eval" (running statistics; PyHessian and the paper's Section 5.4 measure in eval
            mode) or "train" (batch statistics). Used only with ``buffers``.
        callback: called after every H·v product with the number of products so far: to show
            progress, or to stop a long run by raising (the exception propagates).

    Returns:
        A tensor of shape [k], descending, on the params' device and in their dtype; with
            ``return_eigenvectors`` the pair ``(values, vectors)``.

    Warning:
        Lanczos from one start vector sees one copy of an eigenvalue of multiplicity > 1 (exactly
        repeated eigenvalues are returned once). Power iteration converges to the eigenvalues of
        largest magnitude, which are the largest ones only when no negative eigenvalue is larger in
        magnitude; it also needs many more products for the same accuracy.

    Example:
        >>> import torch
        >>> from gamfunc.metrics import top_eigenvalues
        >>> loss_fn = lambda p, x: torch.tanh(x @ p["w"]).pow(2).sum()
        >>> params, x = {"w": torch.randn(4, 3)}, torch.randn(16, 4)
        >>> top_eigenvalues(params, x, loss_fn, k=3).shape
        torch.Size([3])

    References:
        Lanczos, "An iteration method for the solution of the eigenvalue problem of linear
        differential and integral operators", J. Res. Nat. Bur. Standards, 1950.
        Yao, Gholami, Keutzer, Mahoney, "PyHessian: Neural Networks Through the Lens of the
        Hessian", 2020, https://arxiv.org/abs/1912.07145.
        Zhang et al., "Gradient Norm Aware Minimization Seeks First-Order Flatness and Improves
        Generalization", CVPR 2023, https://arxiv.org/abs/2303.03108 (Section 5.4).
    """
    check_params(params)
    check_int("k", k)
    check_int("iters", iters)
    check_positive("tol", tol)
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}; got {method!r}")
    n = sum(v.numel() for v in params.values())
    if k > n:
        raise ValueError(f"k must be at most the number of parameters ({n}); got {k}")
    if method == "lanczos" and iters < k:
        raise ValueError(f"iters must be >= k for Lanczos; got iters={iters}, k={k}")
    loss = bound_loss(loss_fn, buffers, mode)
    matvec = hessian_operator(loss, params, batch, hvp)
    gen = make_generator(generator, params)
    x0 = flat(params)

    products = 0

    def flat_matvec(x: Tensor) -> Tensor:
        nonlocal products
        out = flat(matvec(unflat(x, params))).to(x.dtype)
        products += 1
        if callback is not None:
            callback(products)
        return out

    def draw() -> Tensor:
        return gaussian(n, gen, x0)

    run = _lanczos if method == "lanczos" else _power
    values, vectors = run(flat_matvec, draw, n, k, iters, tol)
    values = values.to(device=x0.device, dtype=x0.dtype)
    if not return_eigenvectors:
        return values
    return values, [unflat(vectors[:, i], params) for i in range(k)]


def _lanczos(matvec: Callable[[Tensor], Tensor], draw, n: int, k: int, iters: int, tol: float):
    m = min(iters, n)
    q = draw()
    basis = q.new_empty((m, q.numel()))
    basis[0] = q / torch.linalg.vector_norm(q)
    alphas: list[float] = []
    betas: list[float] = []  # betas[j] couples q_j and q_{j+1}; 0 after a restart
    block = 0  # where the current Krylov block starts (> 0 after a restart)
    floor = torch.finfo(q.dtype).eps ** (2 / 3)
    for j in range(m):
        w = matvec(basis[j])
        alphas.append(float(basis[j] @ w))
        w = orthogonalise(w, basis[: j + 1])
        beta = float(torch.linalg.vector_norm(w))
        ritz, s = torch.linalg.eigh(tridiagonal(alphas, betas))
        top = torch.arange(j, max(j - k, -1), -1)  # the k largest, descending
        scale = float(ritz.abs().max())
        bound = torch.clamp(tol * ritz[top].abs(), min=floor * scale)
        done = j + 1 >= k and bool((beta * s[j, top].abs() <= bound).all())
        # A restarted block must show its own largest eigenvalue before the run may stop: the
        # complement it explores could hold eigenvalues above the k-th found so far.
        block_top, block_residual = ritz[-1], 0.0
        if block:
            block_ritz, block_s = torch.linalg.eigh(tridiagonal(alphas[block:], betas[block:]))
            block_top, block_residual = block_ritz[-1], beta * float(block_s[-1, -1].abs())
        block_done = block_residual <= max(tol * float(block_top.abs()), floor * scale)
        breakdown = beta <= floor * max(scale, 1e-300)
        if j + 1 == m:
            break
        if not breakdown and done and block_done:
            break
        if breakdown and done and block and bool(block_top < ritz[top[-1]]):
            break
        if breakdown:
            # The Krylov space is invariant. Exactly repeated eigenvalues keep further copies in
            # its complement: go on from a fresh direction orthogonal to it.
            w = orthogonalise(draw(), basis[: j + 1])
            betas.append(0.0)
            block = j + 1
            basis[j + 1] = w / torch.linalg.vector_norm(w)
        else:
            betas.append(beta)
            basis[j + 1] = w / beta
    vectors = basis[: j + 1].T @ s[:, top].to(device=basis.device, dtype=basis.dtype)
    return ritz[top], vectors


def _power(matvec: Callable[[Tensor], Tensor], draw, n: int, k: int, iters: int, tol: float):
    found: list[Tensor] = []
    values: list[float] = []
    for _ in range(k):
        basis = torch.stack(found) if found else None
        v = draw()
        lam = None
        for _ in range(iters):
            if basis is not None:
                v = orthogonalise(v, basis)
            v = v / torch.linalg.vector_norm(v)
            hv = matvec(v)
            new = float(v @ hv)
            v = hv
            converged = lam is not None and abs(new - lam) <= tol * (abs(lam) + 1e-6)
            lam = new
            if converged:
                break
        if basis is not None:
            v = orthogonalise(v, basis)
        found.append(v / torch.linalg.vector_norm(v))
        assert lam is not None  # iters >= 1
        values.append(lam)
    order = sorted(range(k), key=lambda i: -values[i])
    ordered = torch.tensor([values[i] for i in order], dtype=torch.float64)
    return ordered, torch.stack([found[i] for i in order], dim=1)


# ---- trace ---------------------------------------------------------------------------------------


@takes_model
@measurable()
@torch.no_grad()
def hessian_trace(
    params: Tree,
    batch,
    loss_fn,
    samples: int = 100,
    generator: torch.Generator | None = None,
    *,
    hvp="reverse",
    chunk_size: int | None = 10,
    return_stderr: bool = False,
    buffers=None,
    mode: str = "eval",
    callback: Callable[[int], None] | None = None,
):
    """Hutchinson's estimate of tr(H), H = ∇²L(θ): the mean of zᵀHz over Rademacher probes z.

    tr(H) = E[zᵀHz] for z with independent ±1 entries, so with S = ``samples`` probes
    t̂ = (1/S)·Σ_s z_sᵀHz_s, and its standard error is std(z_sᵀHz_s)/√S (the sample standard
    deviation). The probes are drawn from ``generator`` one after the other, so the estimate does not
    depend on ``chunk_size``; they are pushed through the Hessian-vector product together under
    ``torch.func.vmap``, ``chunk_size`` at a time (memory grows with it; chunk_size=None takes all S
    at once). With ``hvp="fd"``, a backend function, or a ``loss_fn`` that is a
    `gamfunc.loss.Objective`, the probes are looped over instead.

    Args:
        params, batch, loss_fn: as [`top_eigenvalues`][gamfunc.metrics.hessian.top_eigenvalues] (the buffered form with ``buffers``).
        samples: S, the number of probes.
        generator: draws the probes; None uses a generator seeded with 0.
        hvp: "reverse" (default; one linearisation shared by all probes), "exact", "fd"
            (``hvps.fd()``, r = 1e-3) or a backend such as ``hvps.fd(radius=r)`` (see
            [`top_eigenvalues`][gamfunc.metrics.hessian.top_eigenvalues]).
        chunk_size: probes per vmap call.
        return_stderr: also return the standard error.
        buffers, mode: BatchNorm handling, as [`top_eigenvalues`][gamfunc.metrics.hessian.top_eigenvalues]; the paper (Section 5.4,
            following PyHessian) measures in ``"eval"`` mode, the default.
        callback: called after every chunk of probes with the number of probes done: to show
            progress, or to stop a long run by raising (the exception propagates).

    Returns:
        t̂, a 0-d tensor in the params' dtype; with ``return_stderr`` the pair ``(t̂, stderr)``
            (stderr is nan for S = 1).

    Warning:
        Randomness inside ``loss_fn`` (dropout) is the same for every probe of a vmap chunk
        (``randomness="same"``); measure with dropout off.

    Example:
        >>> import torch
        >>> from gamfunc.metrics import hessian_trace
        >>> loss_fn = lambda p, x: 0.5 * (x @ p["w"]).pow(2).sum()  # H = 2·xᵀx ⊗ I for w (4, 2)
        >>> x = torch.randn(8, 4)
        >>> t, se = hessian_trace({"w": torch.zeros(4, 2)}, x, loss_fn, samples=50, return_stderr=True)

    References:
        Hutchinson, "A stochastic estimator of the trace of the influence matrix for Laplacian
        smoothing splines", 1989. Avron, Toledo, "Randomized algorithms for estimating the trace of
        an implicit symmetric positive semi-definite matrix", J. ACM, 2011.
        Yao et al., "PyHessian", 2020, https://arxiv.org/abs/1912.07145.
    """
    check_params(params)
    check_int("samples", samples)
    if chunk_size is not None:
        check_int("chunk_size", chunk_size)
    loss = bound_loss(loss_fn, buffers, mode)
    matvec = hessian_operator(loss, params, batch, hvp)
    gen = make_generator(generator, params)
    x0 = flat(params)
    n = x0.numel()

    def quadratic_form(z: Tensor) -> Tensor:
        v = unflat(z, params)
        hv = matvec(v)
        return cast(Tensor, sum(torch.sum(hv[key] * v[key]) for key in v))

    # The finite difference and Objective hooks (tree math, collectives) are looped over probes.
    batched = hvps.get(hvp) in hvps.SECOND_ORDER and not isinstance(loss, Objective)
    step = 1 if not batched else samples if chunk_size is None else chunk_size
    forms = []
    for start in range(0, samples, step):
        probes = torch.stack([rademacher(n, gen, x0) for _ in range(min(step, samples - start))])
        if batched:
            forms.append(torch.func.vmap(quadratic_form, randomness="same")(probes))
        else:
            forms.append(quadratic_form(probes[0]).reshape(1))
        if callback is not None:
            callback(start + len(probes))
    values = torch.cat(forms).to(x0.dtype)
    estimate = values.mean()
    if not return_stderr:
        return estimate
    if samples == 1:
        return estimate, torch.full_like(estimate, math.nan)
    return estimate, values.std() / math.sqrt(samples)
