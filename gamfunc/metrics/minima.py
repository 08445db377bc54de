"""The density of local minima within the perturbation radius, paper Section 5.1."""

from __future__ import annotations

import logging
from typing import NamedTuple

import torch
from torch import Tensor

from gamfunc import tree
from gamfunc.checks import check_int, check_positive
from gamfunc.loss import check_params, loss_and_aux
from gamfunc.metrics._common import bound_loss, flat, gaussian, make_generator, unflat
from gamfunc.metrics.guard import why_unmeasurable
from gamfunc.metrics.model import takes_model
from gamfunc.tree import Tree

__all__ = ["MinimaDensity", "count_extrema", "minima_density"]

log = logging.getLogger("gamfunc.metrics")  # the guard's logger: one line per unmeasurable input


class MinimaDensity(NamedTuple):
    """What [`minima_density`][gamfunc.metrics.minima.minima_density] measured, one row per random direction.

    Attributes:
        minima: [N] int64, the strict local minima of the loss along each direction.
        maxima: [N] int64, the strict local maxima.
        losses: [N, M+1], L(θ + i·(ρ/M)·u_n) for i = 0..M (column 0 is L(θ)).
        radii: [M+1], the distances i·ρ/M from θ.
        nonfinite: [N] int64, how many of each direction's M+1 losses are not finite (inf or
            NaN); a direction with any has NaN counts.
    """

    minima: Tensor  # [N] int64: strict local minima of the loss along each direction
    maxima: Tensor  # [N] int64: strict local maxima
    losses: Tensor  # [N, M+1]: L(θ + i·(ρ/M)·u_n), i = 0..M (column 0 is L(θ))
    radii: Tensor  # [M+1]: the distances i·ρ/M from θ
    nonfinite: Tensor  # [N] int64: losses of each direction that are not finite


@takes_model
@torch.no_grad()
def minima_density(
    params: Tree,
    batch,
    loss_fn,
    rho: float = 0.1,
    *,
    directions: int = 100,
    steps: int = 10,
    generator: torch.Generator | None = None,
    buffers=None,
    mode: str = "eval",
) -> MinimaDensity:
    """Count the local minima and maxima of L along random directions within radius ρ (Section 5.1).

    For N = ``directions`` random directions u_n (standard normal in every entry, the shape of the
    weights, scaled to unit norm), step M = ``steps`` times by ρ/M along each and evaluate
    ℓ_{n,i} = L(θ + i·(ρ/M)·u_n), i = 0..M. A local minimum is an interior point whose loss is
    strictly below both neighbours, a local maximum strictly above; a run of equal values counts once
    (see `count_extrema`). The paper's setting is ρ = 0.1, M = 10 (steps of norm 0.01),
    N = 100, on the training loss at convergence, and reports the distribution over directions.

    Args:
        params: θ, a flat dict of tensors.
        batch: the batch ``loss_fn`` takes (the paper uses the training loss).
        loss_fn: L, ``loss_fn(params, batch)`` (a scalar or ``(loss, aux)``), or the buffered form
            when ``buffers`` is given (see `gamfunc.metrics._common`).
        rho: ρ, the radius.
        directions: N.
        steps: M, the number of steps of norm ρ/M.
        generator: draws the directions; None uses a generator seeded with 0.
        buffers, mode: BatchNorm handling; the paper does not say which statistics it used, the
            default here is ``"eval"`` (running statistics).

    Returns:
        A [`MinimaDensity`][gamfunc.metrics.minima.MinimaDensity] with the counts per direction and the losses behind them. On
            weights that cannot be measured (non-finite parameters, or a non-finite loss at θ) every
            count and loss is NaN (counts then in the parameters' floating dtype), and one line is
            logged on the ``gamfunc.metrics`` logger (`gamfunc.metrics.guard`). A probe loss that
            is not finite (a radius that reaches where the loss overflows) makes the counts of its
            direction NaN, never 0 (the parameters' floating dtype again), is counted in
            ``nonfinite``, and all of them are logged in one line.

    Raises:
        ValueError: ``directions`` or ``steps`` is not an integer >= 1, or ``rho`` not a finite
            number > 0.

    Warning:
        Only interior points count: θ (i = 0) and the point at radius ρ (i = M) have one neighbour
        on the path and are never counted. The paper does not state how it treats them.

    Example:
        >>> import torch
        >>> from gamfunc.metrics import minima_density
        >>> loss_fn = lambda p, _: torch.cos(60 * p["w"].norm())  # minima every 2π/60 ≈ 0.105
        >>> d = minima_density({"w": torch.zeros(3)}, None, loss_fn, rho=0.2, steps=40, directions=5)
        >>> d.minima.tolist()
        [2, 2, 2, 2, 2]

    References:
        Zhang et al., "Gradient Norm Aware Minimization Seeks First-Order Flatness and Improves
        Generalization", CVPR 2023, https://arxiv.org/abs/2303.03108 (Section 5.1, Figure 3).
    """
    check_params(params)
    check_int("directions", directions)
    check_int("steps", steps)
    check_positive("rho", rho)
    loss = bound_loss(loss_fn, buffers, mode)
    gen = make_generator(generator, params)
    x0 = flat(params)
    radii = torch.linspace(0, rho, steps + 1, dtype=torch.float64)
    why = why_unmeasurable(params, batch, loss_fn, buffers, mode)
    if why is not None:  # a count of 0 would read as perfectly flat
        log.warning("minima_density: NaN, %s", why)
        nan = torch.full((directions, steps + 1), float("nan"), dtype=x0.dtype, device=x0.device)
        every = torch.full((directions,), steps + 1, dtype=torch.int64, device=x0.device)
        return MinimaDensity(nan[:, 0], nan[:, 0].clone(), nan, radii.to(x0), every)
    at_theta = loss_and_aux(loss, params, batch)[0]
    rows = []
    for _ in range(directions):
        z = gaussian(x0.numel(), gen, x0)
        u = unflat(z / torch.linalg.vector_norm(z), params)
        path = [at_theta] + [
            loss_and_aux(loss, tree.axpy(float(r), u, params), batch)[0] for r in radii[1:]
        ]
        rows.append(torch.stack(path))
    losses = torch.stack(rows)
    minima, maxima = (c.to(x0.device) for c in count_extrema(losses))
    nonfinite = (~torch.isfinite(losses)).sum(dim=1)
    holed = nonfinite > 0
    if bool(holed.any()):  # a count over a path with holes would read as flat
        log.warning(
            "minima_density: NaN counts on %d of %d directions: %d of %d probe losses are not "
            "finite (inf or NaN; rho=%g may reach where the loss overflows)",
            int(holed.sum()), directions, int(nonfinite.sum()), losses.numel(), rho,
        )  # fmt: skip
        nan = torch.tensor(float("nan"), dtype=x0.dtype, device=x0.device)
        minima = torch.where(holed, nan, minima.to(x0.dtype))
        maxima = torch.where(holed, nan, maxima.to(x0.dtype))
    radii = radii.to(device=x0.device, dtype=x0.dtype)
    return MinimaDensity(minima, maxima, losses, radii, nonfinite)


def count_extrema(losses: Tensor) -> tuple[Tensor, Tensor]:
    """Strict interior local minima and maxima of each row of ``losses`` ([N, P]).

    The signs of the consecutive differences, with zeros (flat runs) dropped, change from − to +
    at a minimum and from + to − at a maximum.
    """
    minima, maxima = [], []
    for row in losses.detach().cpu():
        s = torch.sign(row[1:] - row[:-1])
        s = s[s != 0]
        minima.append(int(((s[:-1] < 0) & (s[1:] > 0)).sum()))
        maxima.append(int(((s[:-1] > 0) & (s[1:] < 0)).sum()))
    return torch.tensor(minima), torch.tensor(maxima)
