"""Gradient norm Aware Minimization, paper Algorithm 1."""

from __future__ import annotations

from gamfunc import hvps, tree
from gamfunc.checks import check_int, check_nonnegative
from gamfunc.estimators.asam import adaptive_ascent
from gamfunc.estimators.base import Estimate, Estimator, Summary, check_stateless
from gamfunc.estimators.gradient import gradient
from gamfunc.loss import with_grad_norm
from gamfunc.schedules import value

__all__ = ["gam"]

# its row of README's table of estimators
SUMMARY = Summary(
    call='gamfunc.gam(rho, alpha, hvp="exact", oracle=None)',
    computes="GAM, Algorithm 1: ∇L_oracle + α·ρ·H(θ_adv)·g_adv/‖g_adv‖, θ_adv = θ + ρ·f/‖f‖, f = H·g/‖g‖; `oracle=gamfunc.sam(rho2)` is SAM + GAM; also `ascent_steps=n`, `adaptive=True`",
    passes="2 + 2 H·v (fd: 4)",
)


def gam(
    rho,
    alpha,
    hvp="exact",
    oracle: Estimator | None = None,
    eps: float = 1e-12,
    theorem_norms: bool = False,
    adaptive: bool = False,
    ascent_steps: int = 1,
) -> Estimator:
    r"""GAM (Zhang et al. 2023, Algorithm 1): descend L_oracle + α·R1_ρ, R1_ρ(θ) = ρ·max_{‖θ'−θ‖≤ρ} ‖∇L(θ')‖.

    Algorithm 1, lines 4–8, with ρ = ``rho``, α = ``alpha``, ξ = ``eps``:

    $$
    \begin{aligned}
    h_{\mathrm{loss}} & = \nabla L_{\mathrm{oracle}}(\theta ) \\
    f & = H(\theta )\cdot \nabla L(\theta )/(\| \nabla L(\theta )\| + \xi ) \qquad \text{= ∇‖∇L‖(θ), Eq. 6} \\
    \theta _{\mathrm{adv}} & = \theta + \rho \cdot f/(\| f\| + \xi ) \\
    h_{\mathrm{norm}} & = \rho \cdot H(\theta _{\mathrm{adv}})\cdot \nabla L(\theta _{\mathrm{adv}})/(\| \nabla L(\theta _{\mathrm{adv}})\| + \xi ) \qquad \text{≈ ∇R1\_ρ(θ), Eq. 5} \\
    \mathrm{direction} & = h_{\mathrm{loss}} + \alpha \cdot h_{\mathrm{norm}}
    \end{aligned}
    $$

    The Hessian is never formed: each H·v is a Hessian-vector product from the ``hvp`` backend
    ([`gamfunc.hvps`][gamfunc.hvps]). ∇L(θ) is computed once and shared with the oracle when the oracle starts
    from it (``gradient()`` and ``sam``): exact GAM with the plain oracle costs two gradients and two
    forward-mode passes; ``hvp=hvps.fd()`` costs four gradients (paper Appendix D).

    Which backend: ``"exact"`` is the default because it is Algorithm 1 itself, with no radius to
    tune and no rounding amplified by α·ρ/r. fd is the cheaper one wherever the step is not
    compiled: choose it for an eager GPU step, for a step replayed as a CUDA graph without
    compiling, and for closures that call ``backward()``; exact when the step is compiled or the
    values must be Algorithm 1's. What each costs on each device: the performance guide
    (``docs/guides/benchmarks.md``, *Which H·v backend costs what*).

    With ``adaptive=True`` the ascent is measured per element in the scale of θ, as the authors'
    ``GAM(adaptive=True)`` perturbs (github.com/xxgege/GAM, commit 694133d, ``gam/gam.py``
    l.57-59, l.94-97: e_w = ρ·v/(‖|θ|·v‖ + ξ)·θ², the weighted norm of ``_grad_norm`` l.154-155):

    $$
    \theta _{\mathrm{adv}} = \theta + \rho \cdot \theta ^{2}\cdot f/(\| |\theta |\cdot f\| + \xi ) \qquad \text{θ², |θ| elementwise}
    $$

    `adaptive_ascent` with η = 0 (ASAM's T = |θ| + η). The
    authors' code is Algorithm 2 ([`gamfunc.gam_accelerated`][gamfunc.estimators.gam_accelerated.gam_accelerated]); here only the ascent to θ_adv
    is scaled, not the Hessian-vector products (nor ``hvp="fd"``'s difference radius).

    With ``ascent_steps`` = n > 1 the ascent to θ_adv takes n normalised steps of ‖∇L‖, each of
    length ρ/n, the convention of [`sam`][gamfunc.estimators.sam.sam]'s ``ascent_steps``:

    $$
    \theta _0 = \theta ,\qquad
    f_i = H(\theta _i)\cdot \frac{\nabla L(\theta _i)}{\| \nabla L(\theta _i)\| + \xi },\qquad
    \theta _{i+1} = \theta _i + \frac{\rho }{n}\cdot \frac{f_i}{\| f_i\| + \xi },\qquad
    \theta _{\mathrm{adv}} = \theta _n ,
    $$

    so ‖θ_adv − θ‖ ≤ ρ (the triangle inequality) and every iterate stays in the ball of R1_ρ; n
    changes how well its maximiser is found, not the ball. Each step after the first costs one
    gradient and one H·v (with ``hvp="fd"``, two gradients). n = 1 is the one step above,
    operation for operation. With ``adaptive=True`` each step is the adaptive one of length ρ/n,
    its T = |θ| taken at θ (not at θ_i), so the steps add up inside the same ellipsoid
    ‖ε/|θ|‖ ≤ ρ. The multi-step ascent is not defined for
    [`gam_accelerated`][gamfunc.estimators.gam_accelerated.gam_accelerated], whose ascent
    direction is itself a finite difference of two SAM gradients mixed with two more (Algorithm
    2), nor for [`gnp`][gamfunc.estimators.gnp.gnp], which penalises ‖∇L(θ)‖ where it stands and
    has no ascent. ``oracle=sam(ρ, ascent_steps=m)`` is the oracle's own ascent, independent of n.

    Args:
        rho: ρ, radius of the ascent to θ_adv (float >= 0 or a schedule).
        alpha: α, weight of the first-order flatness (float >= 0 or a schedule). α = 0 gives the
            oracle's direction.
        hvp: the H·v backend ([`gamfunc.hvps`][gamfunc.hvps]): ``hvps.exact()`` (forward-over-reverse),
            ``hvps.reverse()`` (reverse-over-reverse), ``hvps.fd(radius=r)``, or the names "exact"
            (the default), "reverse", "fd" for ``exact()``, ``reverse()``, ``fd()``. ``"fd"`` has
            r = ``hvps.DEFAULT_RADIUS`` = 1e-3, where α·ρ/r = 5 amplifies the gradients' rounding
            for α = 0.1, ρ = 0.05; another radius is ``hvp=hvps.fd(radius=r)``.
        oracle: the estimator of ∇L_oracle; ``gradient()`` by default, ``sam(rho)`` gives SAM + GAM.
        eps: ξ.
        theorem_norms: also report Theorem 4.3's two quantities in info (two tree norms more per
            step): ``overall_grad_sq`` = ‖∇L_overall(θ)‖², the squared norm of the direction, and
            ``penalty_grad_sq`` = ‖α·ρ_t·∇‖∇L(θ_adv)‖‖².
        adaptive: scale the ascent to θ_adv per element by |θ| (the authors' ``adaptive=True``).
        ascent_steps: n >= 1, the normalised steps of the ascent to θ_adv (above).

    Returns:
        An Estimator; its info adds ``f_norm`` = ‖f‖, ``adv_grad_norm`` = ‖∇L(θ_adv)‖ and ``adv_loss``
            (and with ``theorem_norms`` the two squared norms above).

    Raises:
        ValueError: ``rho``, ``alpha`` or ``eps`` is negative or not finite (a tensor of it too,
            or a schedule whose ``bounds`` reach below 0; one without bounds is checked at each
            step), ``adaptive`` is not a bool,
            ``ascent_steps`` is not an integer >= 1, or
            ``hvp`` is not a backend ([`gamfunc.hvps.get`][gamfunc.hvps.get]), or
            ``oracle`` is stateful ([`looksam`][gamfunc.estimators.looksam.looksam],
            [`friendly_sam`][gamfunc.estimators.friendly_sam.friendly_sam]).
        TypeError: ``oracle`` is not an estimator.

    Example:
        >>> import torch, gamfunc
        >>> loss_fn = lambda p, x: torch.tanh(p["w"] @ x).pow(2).sum()
        >>> est = gamfunc.gam(rho=0.05, alpha=0.1)
        >>> d, info = est({"w": torch.ones(2, 2)}, torch.tensor([1.0, 2.0]), loss_fn)
        >>> sorted(info)
        ['adv_grad_norm', 'adv_loss', 'f_norm', 'grad_norm', 'loss']

    References:
        Zhang, Xu, Chen, Cui, "Gradient Norm Aware Minimization Seeks First-Order Flatness and
        Improves Generalization", CVPR 2023, https://arxiv.org/abs/2303.03108.
    """
    rho = check_nonnegative("rho", rho, schedule=True)
    alpha = check_nonnegative("alpha", alpha, schedule=True)
    eps = check_nonnegative("eps", eps)
    if not isinstance(adaptive, bool):
        raise ValueError(f"adaptive must be True or False; got {adaptive!r}")
    check_int("ascent_steps", ascent_steps)
    n = ascent_steps
    backend = hvps.get(hvp)
    oracle = gradient() if oracle is None else oracle
    check_stateless(
        oracle,
        "oracle",
        " or cycles over them, which GAM's oracle cannot; use a stateless estimator (gradient, "
        "sam, gsam, wsam, asam)",
    )

    def run(params, batch, loss_fn, clean, step):
        rho_t = value(rho, step)
        f, clean = hvps.grad_norm_grad(loss_fn, params, batch, backend, eps=eps, clean=clean)
        if n == 1 and adaptive:
            f_norm, theta_adv = tree.norm(f), adaptive_ascent(params, f, rho_t, 0.0, eps)
        elif n == 1:
            f_hat, f_norm = tree.normalize(f, eps)
            theta_adv = tree.axpy(rho_t, f_hat, params)
        else:
            f_norm, theta_adv = tree.norm(f), params
            for i in range(n):
                if i > 0:
                    f, _ = hvps.grad_norm_grad(loss_fn, theta_adv, batch, backend, eps=eps)
                theta_adv = _ascend(theta_adv, f, rho_t / n, params if adaptive else None, eps)
        f_adv, adv = hvps.grad_norm_grad(loss_fn, theta_adv, batch, backend, eps=eps)
        base = oracle.run(params, batch, loss_fn, clean=clean, step=step)
        weight = value(alpha, step) * rho_t
        direction = tree.axpy(weight, f_adv, base.direction)
        info = base.info | {
            "f_norm": f_norm,
            "adv_grad_norm": with_grad_norm(adv).grad_norm,
            "adv_loss": adv.loss,
        }
        if theorem_norms:  # ‖∇L_overall(θ_t)‖² and ‖α·ρ_t·∇‖∇L(θ_adv)‖‖² of Theorem 4.3
            info |= {
                "overall_grad_sq": tree.norm(direction) ** 2,
                "penalty_grad_sq": (weight * tree.norm(f_adv)) ** 2,
            }
        return Estimate(direction, info, clean, decoupled=base.decoupled)

    hparams = {
        "rho": rho,
        "alpha": alpha,
        "hvp": backend,
        "oracle": oracle.name,
        "eps": eps,
        "adaptive": adaptive,
    } | ({"ascent_steps": n} if n > 1 else {})
    name = "gam" if oracle.name == "gradient" else f"{oracle.name}+gam"
    return Estimator(name, run, hparams, decoupled=oracle.decoupled)


def _ascend(point, f, radius, scale_at, eps):
    """point + radius·f/(‖f‖ + ξ), or with ``scale_at`` = θ the adaptive step
    radius·T²f/(‖T f‖ + ξ), T = |θ|, added to point."""
    if scale_at is None:
        f_hat, _ = tree.normalize(f, eps)
        return tree.axpy(radius, f_hat, point)
    tf = tree.map(lambda p, g: p.abs() * g, scale_at, f)
    t2f = tree.map(lambda p, x: p.abs() * x, scale_at, tf)
    return tree.axpy(radius / (tree.norm(tf) + eps), t2f, point)
