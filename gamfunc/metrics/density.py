"""The Hessian's eigenvalue density by stochastic Lanczos quadrature (SLQ), from H·v products only.

The loss is read as every metric reads it, plain or with BatchNorm ``buffers=`` and ``mode``
(`gamfunc.metrics._common`); the products are those of
[`top_eigenvalues`][gamfunc.metrics.hessian.top_eigenvalues].
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from gamfunc.checks import check_int, check_positive
from gamfunc.loss import check_params
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
from gamfunc.metrics.model import takes_model
from gamfunc.tree import Tree

__all__ = ["lanczos_quadrature", "spectral_density"]


@takes_model
@torch.no_grad()
def lanczos_quadrature(
    params: Tree,
    batch,
    loss_fn,
    iters: int = 100,
    probes: int = 1,
    generator: torch.Generator | None = None,
    *,
    hvp="reverse",
    buffers=None,
    mode: str = "eval",
) -> tuple[Tensor, Tensor]:
    r"""The nodes and weights of stochastic Lanczos quadrature for H = ∇²L(θ).

    For each of ``probes`` Rademacher vectors v (±1 entries, normalised), m = ``iters`` steps of
    Lanczos with full reorthogonalisation build the tridiagonal T_m = Q_mᵀ H Q_m; with
    T_m = Σ_i λ_i u_i u_iᵀ its eigenpairs, the nodes are the Ritz values λ_i and the weights are
    τ_i = (e_1ᵀ u_i)², the Gauss quadrature of the spectral measure of H seen from v: for every
    polynomial p of degree ≤ 2m − 1 (Golub and Welsch 1969; Ghorbani et al. 2019)

    $$
    v^\top p(H)\, v = \sum_{i=1}^{m} \tau_i\, p(\lambda_i),\qquad \sum_i \tau_i = 1 .
    $$

    This is PyHessian's ``hessian.density(iter, n_v)``: the same probes, iteration and weights
    (PyHessian adds 10⁻⁶ to every norm it divides by; here the vectors are normalised exactly).
    When the Krylov space becomes invariant (β_j = 0, e.g. at an eigenvalue of multiplicity > 1)
    the iteration goes on from a Gaussian direction orthogonal to it, with β_j = 0 in T, as
    PyHessian does; the nodes found after it carry weight 0.

    Args:
        params: θ, a flat dict of tensors.
        batch: the batch ``loss_fn`` takes.
        loss_fn: L, as for [`top_eigenvalues`][gamfunc.metrics.hessian.top_eigenvalues]
            (the buffered form with ``buffers``).
        iters: m, Lanczos steps (H·v products) per probe; at most the number of parameters n
            (more are cut to n). m = n gives every eigenvalue of H as a node.
        probes: the number of Rademacher probes (PyHessian's ``n_v``).
        generator: draws the probes (and any restart direction); None uses a generator seeded
            with 0.
        hvp: "reverse" (default), "exact", "fd" (``hvps.fd()``, r = 1e-3) or a backend of
            [`gamfunc.hvps`][gamfunc.hvps], such as ``hvps.fd(radius=r)`` for another radius.
        buffers: BatchNorm buffers for a buffered ``loss_fn``; never modified.
        mode: "eval" (running statistics, as PyHessian) or "train". Used only with ``buffers``.

    Returns:
        ``(nodes, weights)``, two float64 tensors of shape [probes, m] on the params' device, each
            row's nodes ascending and its weights summing to 1.

    Raises:
        ValueError: ``iters`` or ``probes`` is not an integer >= 1, or ``mode`` is unknown.

    Example:
        >>> import torch
        >>> from gamfunc.metrics import lanczos_quadrature
        >>> loss_fn = lambda p, x: torch.tanh(x @ p["w"]).pow(2).sum()
        >>> nodes, weights = lanczos_quadrature({"w": torch.randn(4, 3)}, torch.randn(16, 4), loss_fn, iters=5)
        >>> nodes.shape
        torch.Size([1, 5])

    References:
        Ghorbani, Krishnan, Xiao, "An Investigation into Neural Net Optimization via Hessian
        Eigenvalue Density", ICML 2019, https://arxiv.org/abs/1901.10159.
        Golub, Welsch, "Calculation of Gauss Quadrature Rules", Math. Comp., 1969.
        Yao, Gholami, Keutzer, Mahoney, "PyHessian: Neural Networks Through the Lens of the
        Hessian", 2020, https://arxiv.org/abs/1912.07145.
    """
    check_params(params)
    check_int("iters", iters)
    check_int("probes", probes)
    loss = bound_loss(loss_fn, buffers, mode)
    matvec = hessian_operator(loss, params, batch, hvp)
    gen = make_generator(generator, params)
    x0 = flat(params)
    n = x0.numel()

    def flat_matvec(x: Tensor) -> Tensor:
        return flat(matvec(unflat(x, params))).to(x.dtype)

    nodes, weights = [], []
    for _ in range(probes):
        v = rademacher(n, gen, x0)
        alphas, betas = _lanczos_tridiagonal(
            flat_matvec, v / torch.linalg.vector_norm(v), n, iters, gen, x0
        )
        ritz, s = torch.linalg.eigh(tridiagonal(alphas, betas))
        nodes.append(ritz)
        weights.append(s[0] ** 2)
    return torch.stack(nodes).to(x0.device), torch.stack(weights).to(x0.device)


def _lanczos_tridiagonal(matvec, q: Tensor, n: int, iters: int, gen, like: Tensor):
    """α_1..α_m and β_1..β_{m−1} of m = min(iters, n) Lanczos steps from the unit vector q."""
    m = min(iters, n)
    basis = q.new_empty((m, n))
    basis[0] = q
    alphas: list[float] = []
    betas: list[float] = []
    floor = torch.finfo(q.dtype).eps ** (2 / 3)
    for j in range(m):
        w = matvec(basis[j])
        alphas.append(float(basis[j] @ w))
        w = orthogonalise(w, basis[: j + 1])  # removes α_j q_j and β_{j−1} q_{j−1} too
        if j + 1 == m:
            break
        beta = float(torch.linalg.vector_norm(w))
        scale = max(max(abs(a) for a in alphas), max(betas, default=0.0))
        if beta <= floor * max(scale, 1e-300):
            # The Krylov space is invariant: go on from a fresh direction orthogonal to it.
            w = orthogonalise(gaussian(n, gen, like), basis[: j + 1])
            betas.append(0.0)
            basis[j + 1] = w / torch.linalg.vector_norm(w)
        else:
            betas.append(beta)
            basis[j + 1] = w / beta
    return alphas, betas


@takes_model
@torch.no_grad()
def spectral_density(
    params: Tree,
    batch,
    loss_fn,
    iters: int = 100,
    probes: int = 1,
    grid: int | Tensor = 10000,
    sigma: float | None = None,
    generator: torch.Generator | None = None,
    buffers=None,
    *,
    mode: str = "eval",
    hvp="reverse",
    normalize: bool = True,
) -> tuple[Tensor, Tensor]:
    r"""The eigenvalue density of H = ∇²L(θ), smoothed: stochastic Lanczos quadrature.

    With the nodes λ_i^(l) and weights τ_i^(l) of
    [`lanczos_quadrature`][gamfunc.metrics.density.lanczos_quadrature] for probes l = 1..P, the
    density is the mixture of Gaussians of Ghorbani et al. (2019):

    $$
    \hat\phi_\sigma(t) = \frac{1}{P}\sum_{l=1}^{P}\sum_{i=1}^{m} \tau_i^{(l)}\,
    \frac{1}{\sqrt{2\pi\sigma^2}}\exp\Bigl(-\frac{(t-\lambda_i^{(l)})^2}{2\sigma^2}\Bigr),
    $$

    which integrates to 1 and estimates (1/n)·Σ_j δ(t − λ_j(H)) blurred by a Gaussian of width σ.
    The defaults are those of PyHessian's ``density_plot.py``: ``grid`` = 10000 points spaced
    evenly from the mean over probes of the smallest node minus 0.01 to the mean of the largest
    plus 0.01, σ² = 10⁻⁵·max(1, width of that interval), and with ``normalize`` the values are
    divided by Σ_j φ̂(t_j)·(t_2 − t_1), so that their Riemann sum on the grid is 1 exactly.

    Args:
        params: θ, a flat dict of tensors.
        batch: the batch ``loss_fn`` takes.
        loss_fn: L (the buffered form with ``buffers``).
        iters: m, Lanczos steps per probe (PyHessian's ``iter``).
        probes: P, the number of Rademacher probes (PyHessian's ``n_v``).
        grid: the number of points of the default grid, or the points t_j themselves (a 1-d
            tensor, evenly spaced when ``normalize``).
        sigma: σ > 0, the Gaussian's standard deviation; None for PyHessian's.
        generator: draws the probes; None uses a generator seeded with 0.
        buffers: BatchNorm buffers for a buffered ``loss_fn``; never modified.
        mode: "eval" (running statistics, as PyHessian) or "train". Used only with ``buffers``.
        hvp: the Hessian-vector product: "reverse" (default), "exact", "fd" (``hvps.fd()``,
            r = 1e-3) or a backend such as ``hvps.fd(radius=r)``, as
            [`top_eigenvalues`][gamfunc.metrics.hessian.top_eigenvalues].
        normalize: rescale the values so that their Riemann sum on the grid is 1 (PyHessian does);
            False returns the mixture itself.

    Returns:
        ``(grid, density)``, two float64 tensors of one shape on the params' device.

    Raises:
        ValueError: ``iters``, ``probes`` or an integer ``grid`` is not >= 1 (>= 2 for a grid),
            ``sigma`` is not a finite number > 0, or a tensor ``grid`` is not a 1-d increasing
            sequence of at least 2 points (evenly spaced when ``normalize``).

    Example:
        >>> import torch
        >>> from gamfunc.metrics import spectral_density
        >>> loss_fn = lambda p, x: torch.tanh(x @ p["w"]).pow(2).sum()
        >>> t, phi = spectral_density({"w": torch.randn(4, 3)}, torch.randn(16, 4), loss_fn, iters=8)

    References:
        Ghorbani, Krishnan, Xiao, "An Investigation into Neural Net Optimization via Hessian
        Eigenvalue Density", ICML 2019, https://arxiv.org/abs/1901.10159.
        Lin, Saad, Yang, "Approximating Spectral Densities of Large Matrices", SIAM Review, 2016,
        https://arxiv.org/abs/1308.5467.
        Yao, Gholami, Keutzer, Mahoney, "PyHessian: Neural Networks Through the Lens of the
        Hessian", 2020, https://arxiv.org/abs/1912.07145.
    """
    if sigma is not None:
        check_positive("sigma", sigma)
    if isinstance(grid, Tensor):
        _check_grid(grid, normalize)
    elif isinstance(grid, bool) or not isinstance(grid, int) or grid < 2:
        raise ValueError(f"grid must be an integer >= 2 or a 1-d tensor of points; got {grid!r}")
    nodes, weights = lanczos_quadrature(
        params,
        batch,
        loss_fn,
        iters,
        probes,
        generator,
        hvp=hvp,
        buffers=buffers,
        mode=mode,
    )
    hi = float(nodes.max(dim=1).values.mean()) + 0.01
    lo = float(nodes.min(dim=1).values.mean()) - 0.01
    if isinstance(grid, Tensor):
        t = grid.detach().to(device=nodes.device, dtype=torch.float64)
    else:
        t = torch.linspace(lo, hi, grid, dtype=torch.float64, device=nodes.device)
    var = sigma**2 if sigma is not None else 1e-5 * max(1.0, hi - lo)
    # [points, probes, nodes]: one Gaussian per node, weighted, summed over nodes, averaged over probes
    gauss = torch.exp(-((t[:, None, None] - nodes) ** 2) / (2.0 * var)) / math.sqrt(
        2 * math.pi * var
    )
    density = (gauss * weights).sum(dim=2).mean(dim=1)
    if normalize:
        density = density / (density.sum() * (t[1] - t[0]))
    return t, density


def _check_grid(grid: Tensor, even: bool) -> None:
    if grid.ndim != 1 or grid.numel() < 2 or not bool((grid.diff() > 0).all()):
        raise ValueError("grid must be a 1-d increasing tensor of at least 2 points")
    if even:
        d = grid.diff().to(torch.float64)
        if not torch.allclose(d, d[0].expand_as(d), rtol=1e-6, atol=0.0):
            raise ValueError("grid must be evenly spaced with normalize=True")
