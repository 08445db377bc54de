r"""Zeroth- and first-order flatness, R0_ρ and R1_ρ (paper Definitions 4.1 and 3.1), estimated by
projected gradient ascent inside the ball B(θ, ρ).

Both maxima are over a ball and are found the same way. Let φ be the function maximised (L for
R0, ‖∇L‖ for R1) and ε the offset from θ. From a start ε_0, each step is a normalised ascent step
of length lr·ρ followed by the projection onto the ball:

$$
\varepsilon _{t+1} = \Pi _\rho (\varepsilon _t + \mathrm{lr}\cdot \rho \cdot \nabla \varphi (\theta + \varepsilon _t)/(\| \nabla \varphi (\theta + \varepsilon _t)\| + \xi )), \qquad \Pi _\rho (\varepsilon ) = \varepsilon \cdot \min(1, \rho /\| \varepsilon \| )
$$

and the estimate is the best value of φ over every point evaluated (θ itself included), so it is a
lower bound of the true maximum that only grows with ``steps``. The start (``init``):

* ``"gradient"``: ε_0 = ρ·∇φ(θ)/‖∇φ(θ)‖, the first-order solution (SAM's point for R0, GAM's θ_adv
  for R1); a random direction where ∇φ(θ) = 0 (at a minimum, for R1).
* ``"eigenvector"``: ε_0 = ±ρ·v_1, v_1 the top Hessian eigenvector (Lanczos), the sign that
  increases φ to first order. At a minimum of a quadratic this is the exact maximiser of both
  (Lemma 3.1: R1_ρ = ρ²·λ_max; and R0_ρ = ρ²·λ_max/2).
* ``"auto"`` (default): both of the above, starting from the better one.
* ``"random"``: a random direction from ``generator``.

A probe value that is not finite (a ρ that reaches where the loss overflows) makes the estimate NaN,
never the maximum of the finite rest (which would read as flatter than the truth), with one line on
the ``gamfunc.metrics`` logger saying how many.

BatchNorm: the paper does not measure R0 or R1 on their own; inside SAM and GAM training the
perturbed passes use batch statistics (``mode="train"``). The default here is ``mode="eval"``.
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor

from gamfunc import hvps, tree
from gamfunc._compat import in_transform
from gamfunc.checks import check_int, check_positive
from gamfunc.loss import check_params, gradient_pass, loss_and_aux
from gamfunc.metrics._common import bound_loss, flat, gaussian, make_generator, unflat
from gamfunc.metrics.guard import measurable
from gamfunc.metrics.hessian import top_eigenvalues
from gamfunc.metrics.model import takes_model
from gamfunc.tree import Tree

__all__ = ["first_order_flatness", "zeroth_order_flatness"]

INITS = ("auto", "gradient", "eigenvector", "random")

log = logging.getLogger("gamfunc.metrics")  # the guard's logger


@takes_model
@measurable(pair="return_point")
@torch.no_grad()
def first_order_flatness(
    params: Tree,
    batch,
    loss_fn,
    rho: float,
    *,
    steps: int = 10,
    lr: float = 1.0,
    init: str = "auto",
    hvp="reverse",
    eps: float = 1e-12,
    generator: torch.Generator | None = None,
    return_point: bool = False,
    buffers=None,
    mode: str = "eval",
):
    """R1_ρ(θ) = ρ·max_{θ' ∈ B(θ, ρ)} ‖∇L(θ')‖, paper Definition 3.1 (Eq. 4), ρ is ``rho``.

    Projected gradient ascent on φ(θ') = ‖∇L(θ')‖ (see `gamfunc.metrics.flatness`), whose
    gradient ∇‖∇L‖(θ') = H(θ')·∇L(θ')/(‖∇L(θ')‖ + ξ) (paper Eq. 6, ξ is ``eps``) is one
    Hessian-vector product. Each step costs one product; the start costs one more, plus a Lanczos
    run (at most 100 products) for ``init="auto"`` or ``"eigenvector"``.

    Args:
        params: θ, a flat dict of tensors.
        batch: the batch ``loss_fn`` takes.
        loss_fn: L, ``loss_fn(params, batch)`` (a scalar or ``(loss, aux)``), or the buffered form
            when ``buffers`` is given (see `gamfunc.metrics._common`).
        rho: ρ > 0, the radius.
        steps: ascent steps after the start (0 keeps the start).
        lr: step length as a fraction of ρ.
        init: "auto", "gradient", "eigenvector" or "random" (module doc).
        hvp: "reverse" (default, reverse-over-reverse), "exact" (forward-over-reverse), "fd"
            (``hvps.fd()``, r = 1e-3) or a backend of [`gamfunc.hvps`][gamfunc.hvps], such as
            ``hvps.fd(radius=r)`` for another radius.
        eps: ξ.
        generator: randomness of the start; None uses a generator seeded with 0.
        return_point: also return the maximiser θ' found.
        buffers, mode: BatchNorm handling (module doc; default ``"eval"``).

    Returns:
        The estimate of R1_ρ(θ) (0-d tensor, a lower bound of the true value; NaN with one
            logged line where a probe value is not finite, see `gamfunc.metrics.flatness`); with
            ``return_point`` the pair ``(value, point)``.

    Example:
        >>> import torch
        >>> from gamfunc.metrics import first_order_flatness
        >>> A = torch.diag(torch.tensor([3.0, 1.0]))
        >>> loss_fn = lambda p, _: 0.5 * p["w"] @ A @ p["w"]
        >>> r1 = first_order_flatness({"w": torch.zeros(2)}, None, loss_fn, rho=0.1)
        >>> round(float(r1 / 0.1**2), 4)  # Lemma 3.1: λ_max
        3.0

    References:
        Zhang, Xu, Chen, Cui, "Gradient Norm Aware Minimization Seeks First-Order Flatness and
        Improves Generalization", CVPR 2023, https://arxiv.org/abs/2303.03108 (Def. 3.1, Lemma 3.1).
    """
    check_params(params)
    _check(rho, steps, lr, init)
    loss = bound_loss(loss_fn, buffers, mode)
    backend = hvps.get(hvp)

    def value_and_ascent(point: Tree, need_ascent: bool):
        if not need_ascent:
            return tree.norm(gradient_pass(loss, point, batch).grad), None
        f, clean = hvps.grad_norm_grad(loss, point, batch, backend, eps=eps)
        return tree.norm(clean.grad), f

    best, point, _, holes = _ascent(
        params, batch, loss, rho, value_and_ascent, steps, lr, init, hvp, eps, generator
    )
    _log_holes("first_order_flatness", "gradient norms", holes)
    value = rho * best
    return (value, point) if return_point else value


@takes_model
@measurable()
@torch.no_grad()
def zeroth_order_flatness(
    params: Tree,
    batch,
    loss_fn,
    rho: float,
    *,
    steps: int = 10,
    lr: float = 1.0,
    init: str = "auto",
    hvp="reverse",
    eps: float = 1e-12,
    generator: torch.Generator | None = None,
    return_point: bool = False,
    buffers=None,
    mode: str = "eval",
):
    """R0_ρ(θ) = max_{θ' ∈ B(θ, ρ)} L(θ') − L(θ), paper Definition 4.1 (Eq. 2), ρ is ``rho``.

    Projected gradient ascent on φ = L (see `gamfunc.metrics.flatness`): SAM's inner
    maximisation run for ``steps`` steps instead of one. Each step costs one gradient; ``hvp``
    serves only the Lanczos run of ``init="auto"`` or ``"eigenvector"``.

    Args:
        params, batch, loss_fn, rho, steps, lr, init, hvp, eps, generator, return_point, buffers, mode: as
            [`first_order_flatness`][gamfunc.metrics.flatness.first_order_flatness].

    Returns:
        The estimate of R0_ρ(θ) (0-d tensor, >= 0, a lower bound of the true value; NaN with
            one logged line where a probe loss is not finite); with ``return_point`` the pair
            ``(value, point)``.

    Example:
        >>> import torch
        >>> from gamfunc.metrics import zeroth_order_flatness
        >>> A = torch.diag(torch.tensor([3.0, 1.0]))
        >>> loss_fn = lambda p, _: 0.5 * p["w"] @ A @ p["w"]
        >>> r0 = zeroth_order_flatness({"w": torch.zeros(2)}, None, loss_fn, rho=0.1)
        >>> round(float(r0 / 0.1**2), 4)  # λ_max / 2 at the minimum of a quadratic
        1.5

    References:
        Foret et al., "Sharpness-Aware Minimization for Efficiently Improving Generalization",
        ICLR 2021, https://arxiv.org/abs/2010.01412. Zhang et al., CVPR 2023,
        https://arxiv.org/abs/2303.03108 (Definition 4.1, Proposition 3.2: R1_ρ ≥ R0_ρ).
    """
    check_params(params)
    _check(rho, steps, lr, init)
    loss = bound_loss(loss_fn, buffers, mode)

    def value_and_ascent(point: Tree, need_ascent: bool):
        if not need_ascent:
            return loss_and_aux(loss, point, batch)[0], None
        p = gradient_pass(loss, point, batch)
        return p.loss, p.grad

    best, point, at_theta, holes = _ascent(
        params, batch, loss, rho, value_and_ascent, steps, lr, init, hvp, eps, generator
    )
    _log_holes("zeroth_order_flatness", "losses", holes)
    value = best - at_theta
    return (value, point) if return_point else value


def _ascent(params, batch, loss, rho, evaluate, steps, lr, init, hvp, eps, generator):
    """Projected normalised gradient ascent of φ in B(θ, ρ); returns (max φ found, argmax, φ(θ),
    (how many φ values off θ were not finite, how many were evaluated)). The max is NaN where any
    was not finite.

    ``evaluate(point, need_ascent) -> (φ(point), ∇φ(point) or None)``. The choice of the best point
    goes through ``torch.where``, so nothing here waits on the device.
    """
    gen = make_generator(generator, params)
    phi0, d0 = evaluate(params, True)
    best, best_eps = phi0, tree.zeros_like(params)
    starts = []
    if init in ("gradient", "auto"):
        d_hat, d_norm = tree.normalize(d0, eps)
        starts.append(tree.scale(tree.where(d_norm > 0, d_hat, _random_unit(params, gen)), rho))
    if init in ("eigenvector", "auto"):
        _, (v,) = top_eigenvalues(
            params, batch, loss, k=1, hvp=hvp, generator=gen,
            return_eigenvectors=True,
        )  # fmt: skip
        along = tree.vdot(d0, v)
        starts.append(tree.scale(v, rho * (1 - 2 * (along < 0).to(along.dtype))))
    if init == "random":
        starts.append(tree.scale(_random_unit(params, gen), rho))
    current = None
    holes = torch.zeros((), dtype=torch.int64, device=phi0.device)  # φ values not finite
    for e in starts:
        phi, d = evaluate(tree.add(params, e), steps > 0)
        holes = holes + (~torch.isfinite(phi)).to(holes.dtype)
        if current is None:
            current = (phi, e, d)
        else:
            better = phi > current[0]
            d = None if d is None else tree.where(better, d, current[2])
            current = (torch.maximum(phi, current[0]), tree.where(better, e, current[1]), d)
    phi, e, d = current
    best, best_eps = _keep_best(phi, e, best, best_eps)
    for t in range(steps):
        d_hat, _ = tree.normalize(d, eps)
        e = _project(tree.axpy(lr * rho, d_hat, e), rho)
        phi, d = evaluate(tree.add(params, e), t + 1 < steps)
        holes = holes + (~torch.isfinite(phi)).to(holes.dtype)
        best, best_eps = _keep_best(phi, e, best, best_eps)
    # A maximum over points some of which are not finite is not known: NaN, never the finite rest.
    best = torch.where(holes > 0, torch.full_like(best, float("nan")), best)
    return best, tree.add(params, best_eps), phi0, (holes, len(starts) + steps)


def _log_holes(name: str, what: str, holes) -> None:
    """One line where some probe values were not finite (the value is NaN then); nothing inside a
    transform or a compiled region, where no value can be read."""
    count, total = holes
    if torch.compiler.is_compiling() or in_transform():
        return
    n = int(count)
    if n:
        log.warning(
            "%s: NaN, %d of %d probe %s in the ball are not finite (inf or NaN)",
            name,
            n,
            total,
            what,
        )


def _keep_best(phi: Tensor, e: Tree, best: Tensor, best_eps: Tree):
    better = phi > best
    return torch.where(better, phi, best), tree.where(better, e, best_eps)


def _project(e: Tree, rho: float) -> Tree:
    """Π_ρ(ε) = ε·min(1, ρ/‖ε‖), the nearest point of the closed ball of radius ρ."""
    n = tree.norm(e)
    return tree.scale(e, torch.clamp(rho / torch.clamp(n, min=1e-300), max=1.0))


def _random_unit(params: Tree, generator: torch.Generator) -> Tree:
    x0 = flat(params)
    z = gaussian(x0.numel(), generator, x0)
    return unflat(z / torch.linalg.vector_norm(z), params)


def _check(rho, steps, lr, init) -> None:
    check_positive("rho", rho)
    check_int("steps", steps, at_least=0)
    check_positive("lr", lr)
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}; got {init!r}")
