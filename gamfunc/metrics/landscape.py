"""Loss landscapes: L along one or two directions through θ (Li et al. 2018), filter-normalised
random directions or the top Hessian eigenvectors."""

from __future__ import annotations

import logging
import math
from typing import NamedTuple

import torch
from torch import Tensor

from gamfunc import tree
from gamfunc.checks import check_int
from gamfunc.loss import check_params, loss_and_aux
from gamfunc.metrics._common import bound_loss, make_generator
from gamfunc.metrics.guard import checked, why_unmeasurable
from gamfunc.metrics.hessian import top_eigenvalues
from gamfunc.metrics.model import takes_model
from gamfunc.tree import Tree

__all__ = [
    "Landscape1D",
    "Landscape2D",
    "hessian_half_width",
    "landscape_1d",
    "landscape_2d",
    "random_direction",
]

log = logging.getLogger("gamfunc.metrics")  # the guard's logger: one line per unmeasurable input

BIASBN = ("ignore", "include")


class Landscape1D(NamedTuple):
    """L(θ + α·d) on a line of α values.

    Attributes:
        alphas: the P values of α.
        losses: the P losses L(θ + α·d).
        direction: d, a tree like the params.
        nonfinite: how many of the P losses are not finite (inf or NaN); each such point is logged
            as a hole in the landscape, never drawn as flat.
    """

    alphas: Tensor  # [P]
    losses: Tensor  # [P]
    direction: Tree  # d
    nonfinite: int = 0


class Landscape2D(NamedTuple):
    """L(θ + α·d1 + β·d2) on a grid; ``losses[i, j]`` is at (alphas[i], betas[j]).

    Attributes:
        alphas: the P values of α.
        betas: the Q values of β.
        losses: the [P, Q] losses.
        directions: (d1, d2), trees like the params.
        nonfinite: how many of the P·Q losses are not finite (inf or NaN).
    """

    alphas: Tensor  # [P]
    betas: Tensor  # [Q]
    losses: Tensor  # [P, Q]
    directions: tuple[Tree, Tree]  # (d1, d2)
    nonfinite: int = 0


def random_direction(
    params: Tree, generator: torch.Generator | None = None, *, biasbn: str = "ignore"
) -> Tree:
    """A filter-normalised random direction (Li et al. 2018, Section 4).

    d is standard normal with the shape of every tensor of θ; then each filter (slice along the first
    dimension, e.g. an output row of a linear weight or an output channel of a conv kernel) of every
    tensor with two or more dimensions is rescaled to the norm of the same filter of θ:
    d_{i,j} ← d_{i,j}/‖d_{i,j}‖·‖θ_{i,j}‖. Tensors of one dimension or fewer (biases and BatchNorm
    weights) are set to 0 with ``biasbn="ignore"`` or to θ itself with ``biasbn="include"``, as the
    authors' code does (its ``--xignore biasbn`` option).

    Args:
        params: θ, a flat dict of tensors.
        generator: draws d; None uses a generator seeded with 0.
        biasbn: "ignore" or "include", for tensors of dimension <= 1.

    Returns:
        d, a dict shaped like ``params``.

    References:
        Li, Xu, Taylor, Studer, Goldstein, "Visualizing the Loss Landscape of Neural Nets",
        NeurIPS 2018, https://arxiv.org/abs/1712.09913.
    """
    check_params(params)
    if biasbn not in BIASBN:
        raise ValueError(f"biasbn must be one of {BIASBN}; got {biasbn!r}")
    gen = make_generator(generator, params)
    out = {}
    for k, w in params.items():
        d = torch.randn(w.shape, generator=gen, device=gen.device, dtype=w.dtype).to(w.device)
        if w.dim() <= 1:
            out[k] = torch.zeros_like(w) if biasbn == "ignore" else w.detach().clone()
            continue
        w_norm = torch.linalg.vector_norm(w.reshape(w.shape[0], -1), dim=1)
        d_norm = torch.linalg.vector_norm(d.reshape(d.shape[0], -1), dim=1)
        factor = w_norm / (d_norm + 1e-10)  # the authors' 1e-10
        out[k] = d * factor.reshape((-1,) + (1,) * (w.dim() - 1))
    return out


@takes_model
@torch.no_grad()
def landscape_1d(
    params: Tree,
    batch,
    loss_fn,
    *,
    direction="random",
    span: tuple[float, float] | None = None,
    points: int = 51,
    biasbn: str = "ignore",
    generator: torch.Generator | None = None,
    hvp="reverse",
    buffers=None,
    mode: str = "eval",
) -> Landscape1D:
    """L(θ + α·d) for ``points`` values of α evenly spaced over ``span`` (Li et al. 2018).

    The span: the default fits the direction's scale, so that the plot shows the landscape's shape.

    * "random" (filter-normalised: each filter as long as θ's) and given dicts: (−1, 1), as Li et
      al. (α = 1 moves each filter by its own norm).
    * "hessian" (unit eigenvectors): (−s, s) with s = √(2/λ_1), λ_1 the largest eigenvalue: the
      distance at which the quadratic model L(θ) + ½·λ_1·α² has risen by 1 (a nat of
      cross-entropy). With (−1, 1) a unit eigenvector rises by λ_1/2 (810 for λ_1 = 1620: one
      colour but for the ends). Where λ_1 is not a finite number > 0, (−1, 1).

    Two models drawn along their own Hessian directions then get different spans (the sharper one
    a narrower one): to compare them on one axis, pass one ``span`` to both.

    A point whose loss is not finite (inf or NaN, an overflow far from θ) stays in ``losses`` as
    it is, is counted in ``nonfinite`` and logged in one line on the ``gamfunc.metrics`` logger:
    a hole in the landscape, never a flat region.

    Args:
        params: θ, a flat dict of tensors.
        batch: the batch ``loss_fn`` takes.
        loss_fn: L, ``loss_fn(params, batch)`` (a scalar or ``(loss, aux)``), or the buffered form
            when ``buffers`` is given (see `gamfunc.metrics._common`).
        direction: "random" ([`random_direction`][gamfunc.metrics.landscape.random_direction]), "hessian" (the unit eigenvector of the
            largest Hessian eigenvalue, by Lanczos), or a dict shaped like ``params``.
        span: (α_min, α_max), finite, α_min < α_max; None (default) fits the direction (above).
        points: P >= 2.
        biasbn: for "random": "ignore" or "include" the tensors of dimension <= 1.
        generator: randomness of "random" and of the Lanczos start; None seeds with 0.
        hvp: the Hessian-vector product for "hessian": "reverse" (default), "exact", "fd"
            (``hvps.fd()``, r = 1e-3) or a backend such as ``hvps.fd(radius=r)`` (see
            [`top_eigenvalues`][gamfunc.metrics.hessian.top_eigenvalues]).
        buffers, mode: BatchNorm handling; Li et al.'s code evaluates in ``"eval"`` mode, the
            default.

    Returns:
        A [`Landscape1D`][gamfunc.metrics.landscape.Landscape1D]. Where ``direction="hessian"`` cannot be measured (non-finite
            parameters or loss, a failed eigendecomposition) the direction and every loss are NaN and
            one line is logged on the ``gamfunc.metrics`` logger (`gamfunc.metrics.guard`).

    Raises:
        ValueError: ``points`` is not an integer >= 2, ``span`` is not a finite increasing pair,
            or ``direction`` or ``params`` is malformed.

    Example:
        >>> import torch
        >>> from gamfunc.metrics import landscape_1d
        >>> loss_fn = lambda p, _: (p["w"] ** 2).sum()
        >>> line = landscape_1d({"w": torch.ones(2, 2)}, None, loss_fn, points=5)
        >>> line.losses.shape
        torch.Size([5])

    References:
        Li et al., "Visualizing the Loss Landscape of Neural Nets", NeurIPS 2018,
        https://arxiv.org/abs/1712.09913.
    """
    check_params(params)
    _check_points(points)
    if span is not None:
        _check_span("span", span, _dtype(params))
    loss = bound_loss(loss_fn, buffers, mode)
    (d,), half, measured = _directions(params, batch, loss, direction, 1, biasbn, generator, hvp)
    alphas = _grid(span if span is not None else (-half, half), points, params)
    losses = torch.stack([_loss_at(loss, batch, tree.axpy(float(a), d, params)) for a in alphas])
    return Landscape1D(alphas, losses, d, _nonfinite("landscape_1d", losses, measured))


@takes_model
@torch.no_grad()
def landscape_2d(
    params: Tree,
    batch,
    loss_fn,
    *,
    directions="random",
    span=None,
    points=21,
    biasbn: str = "ignore",
    generator: torch.Generator | None = None,
    hvp="reverse",
    buffers=None,
    mode: str = "eval",
) -> Landscape2D:
    """L(θ + α·d1 + β·d2) on a grid of (α, β) (Li et al. 2018, the contour plots of Figure 1).

    Args:
        params, batch, loss_fn, biasbn, generator, hvp, buffers, mode: as [`landscape_1d`][gamfunc.metrics.landscape.landscape_1d].
        directions: "random" (two independent [`random_direction`][gamfunc.metrics.landscape.random_direction]), "hessian" (the unit
            eigenvectors of the two largest Hessian eigenvalues), or a pair of dicts.
        span: (min, max) for both axes, or ((α_min, α_max), (β_min, β_max)), each finite and
            increasing; None (default) fits the directions as in
            [`landscape_1d`][gamfunc.metrics.landscape.landscape_1d]: (−1, 1) for random ones,
            (−s, s) on both axes for Hessian ones, s = √(2/λ_1) (so that the contours' aspect
            shows λ_2/λ_1).
        points: P for both axes, or (P, Q).

    Returns:
        A [`Landscape2D`][gamfunc.metrics.landscape.Landscape2D]; ``losses[i, j]`` is the loss at (alphas[i], betas[j]). Hessian
            directions that cannot be measured are NaN, as in [`landscape_1d`][gamfunc.metrics.landscape.landscape_1d]; its
            ``nonfinite`` counts the losses that are not finite, logged in one line as there.

    Raises:
        ValueError: ``points`` is not an integer >= 2, a span is not a finite increasing pair, or
            ``directions`` or ``params`` is malformed.

    Example:
        >>> import torch
        >>> from gamfunc.metrics import landscape_2d
        >>> loss_fn = lambda p, _: (p["w"] ** 2).sum()
        >>> grid = landscape_2d({"w": torch.ones(2, 2)}, None, loss_fn, points=(3, 4))
        >>> grid.losses.shape
        torch.Size([3, 4])

    References:
        Li et al., "Visualizing the Loss Landscape of Neural Nets", NeurIPS 2018,
        https://arxiv.org/abs/1712.09913.
    """
    check_params(params)
    spans = _spans_2d(span, _dtype(params))
    counts = points if isinstance(points, tuple | list) else (points, points)
    for p in counts:
        _check_points(p)
    loss = bound_loss(loss_fn, buffers, mode)
    (d1, d2), half, measured = _directions(
        params, batch, loss, directions, 2, biasbn, generator, hvp
    )
    spans = tuple(s if s is not None else (-half, half) for s in spans)
    alphas, betas = _grid(spans[0], counts[0], params), _grid(spans[1], counts[1], params)
    rows = []
    for a in alphas:
        row_origin = tree.axpy(float(a), d1, params)
        rows.append(
            torch.stack([_loss_at(loss, batch, tree.axpy(float(b), d2, row_origin)) for b in betas])
        )
    losses = torch.stack(rows)
    return Landscape2D(
        alphas, betas, losses, (d1, d2), _nonfinite("landscape_2d", losses, measured)
    )


def _directions(params, batch, loss, spec, count, biasbn, generator, hvp):
    """``(directions, s, measured)``: the directions, the half-width s of their default span
    (see [`landscape_1d`][gamfunc.metrics.landscape.landscape_1d]), and False where Hessian
    directions could not be measured (NaN, one line logged already)."""
    if isinstance(spec, dict):
        spec = (spec,)
    if isinstance(spec, tuple | list):
        if len(spec) != count:
            raise ValueError(f"expected {count} direction(s); got {len(spec)}")
        for d in spec:
            if not isinstance(d, dict) or d.keys() != params.keys():
                raise ValueError("a direction must be a dict with the keys of params")
        return list(spec), 1.0, True
    if spec == "random":
        gen = make_generator(generator, params)
        return [random_direction(params, gen, biasbn=biasbn) for _ in range(count)], 1.0, True
    if spec == "hessian":
        why = why_unmeasurable(params, batch, loss)
        if why is None:
            try:
                with checked():  # checked above; a failure is logged below, once
                    values, vectors = top_eigenvalues(
                        params, batch, loss, k=count, generator=generator, hvp=hvp,
                        return_eigenvectors=True,
                    )  # fmt: skip
                return vectors, hessian_half_width(float(values[0])), True
            except torch.linalg.LinAlgError as e:
                why = f"the eigendecomposition failed ({str(e).splitlines()[0][:120]})"
        # no Hessian direction here: NaN directions make every loss of the landscape NaN
        log.warning("landscape: NaN, %s", why)
        return (
            [{k: torch.full_like(v, float("nan")) for k, v in params.items()}] * count,
            1.0,
            False,
        )
    raise ValueError(f"direction(s) must be 'random', 'hessian' or dicts; got {spec!r}")


def hessian_half_width(lam: float) -> float:
    """s = √(2/λ_1): along a unit eigenvector of λ_1 the quadratic model rises by 1 at ±s; 1 where
    λ_1 is not a finite number > 0.

    Args:
        lam: λ_1, the largest Hessian eigenvalue.

    Returns:
        The half-width of the default span of a landscape along Hessian directions.

    Example:
        >>> round(hessian_half_width(1620.0) ** 2 * 1620.0 / 2, 12)
        1.0
    """
    return math.sqrt(2.0 / lam) if math.isfinite(lam) and lam > 0 else 1.0


def _dtype(params: Tree) -> torch.dtype:
    """The dtype of the landscape's coordinates: that of the first parameter (`_grid`)."""
    return next(iter(params.values())).dtype


def _check_span(name: str, span, dtype: torch.dtype) -> None:
    """A span is a pair (min, max) of finite numbers, min < max, in ``dtype`` too (the parameters'):
    both ends, and max − min, which the points are spaced over, finite there (1e39 is not in
    float32), and min < max still once rounded to it."""
    ok = isinstance(span, tuple | list) and len(span) == 2
    if ok:
        try:
            lo, hi = float(span[0]), float(span[1])
        except (TypeError, ValueError):
            ok = False
        else:
            ok = math.isfinite(lo) and math.isfinite(hi) and lo < hi
    if not ok:
        raise ValueError(
            f"{name} must be a pair (min, max) of finite numbers, min < max; got {span!r}"
        )
    ends = torch.tensor([lo, hi], dtype=torch.float64).to(dtype)
    width = ends[1] - ends[0]
    if not (bool(torch.isfinite(ends).all()) and bool(torch.isfinite(width)) and width > 0):
        top = torch.finfo(dtype).max
        raise ValueError(
            f"{name} must be a pair (min, max) finite in the parameters' "
            f"{str(dtype).removeprefix('torch.')} (at most {top:.4g} in size, max − min "
            f"included), min < max there; got {span!r}"
        )


def _spans_2d(span, dtype: torch.dtype) -> tuple:
    """Both axes' spans (None: the default) from ``span``: None, one pair, or a pair of pairs."""
    if span is None:
        return (None, None)
    if (
        isinstance(span, tuple | list)
        and len(span) == 2
        and all(isinstance(s, tuple | list) for s in span)
    ):
        _check_span("span[0]", span[0], dtype)
        _check_span("span[1]", span[1], dtype)
        return tuple(span)
    _check_span("span", span, dtype)
    return (span, span)


def _nonfinite(name: str, losses: Tensor, measured: bool) -> int:
    """How many losses are not finite, logged in one line (unless the directions were NaN, which
    is logged already)."""
    n = int((~torch.isfinite(losses)).sum())
    if n and measured:
        log.warning(
            "%s: %d of %d losses are not finite (inf or NaN): holes in the landscape, not flat",
            name, n, losses.numel(),
        )  # fmt: skip
    return n


def _grid(span, points: int, params: Tree) -> Tensor:
    x0 = next(iter(params.values()))
    lo, hi = span
    return torch.linspace(float(lo), float(hi), points, dtype=x0.dtype, device=x0.device)


def _loss_at(loss, batch, point: Tree) -> Tensor:
    return loss_and_aux(loss, point, batch)[0]


def _check_points(p) -> None:
    check_int("points", p, at_least=2)
