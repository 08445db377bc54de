"""Adaptive SAM: SAM's ascent measured in the scale of each parameter."""

from __future__ import annotations

from collections.abc import Collection

from gamfunc import tree
from gamfunc.checks import Mask, check_mask, check_nonnegative, masked_keys
from gamfunc.estimators.base import Estimate, Estimator, Summary
from gamfunc.estimators.gradient import clean_info
from gamfunc.loss import gradient_pass
from gamfunc.schedules import value
from gamfunc.tree import Tree

__all__ = ["adaptive_ascent", "asam"]

# its row of README's table of estimators
SUMMARY = Summary(
    call="gamfunc.asam(rho, eta=0.01, mask=None)",
    computes="ASAM (Kwon et al. 2021): ∇L(θ + ρ·T²g/‖T g‖), T = \\|θ\\| + η where `mask` marks (the authors' code: parameters named `weight`)",
    passes="2",
)


def asam(rho, eta: float = 0.01, eps: float = 1e-12, *, mask: Mask = None) -> Estimator:
    r"""ASAM (Kwon et al. 2021, Eq. 8): direction = ∇L(θ + ε), ε = ρ·T²g/(‖T g‖ + ξ), g = ∇L(θ).

    T is diagonal, T = |θ| + η elementwise on the parameters that ``mask`` selects and T = 1 on the
    others, so the ascent is scale-invariant in the selected ones; with T = 1 everywhere it is SAM:

    $$
    \epsilon = \rho\,\frac{T^2 g}{\lVert T g\rVert + \xi},\qquad
    T_k = \begin{cases}\lvert\theta_k\rvert + \eta & \text{mask}(k)\\ 1 & \text{otherwise}\end{cases},
    \qquad d = \nabla L(\theta + \epsilon).
    $$

    ρ is ``rho`` (ASAM's ρ is larger than SAM's, 0.5 to 2 in the paper), η is ``eta``, ξ is
    ``eps``. ``mask=None`` scales every parameter (Eq. 8 as written). The authors' code
    (github.com/SamsungLabs/ASAM, ``asam.py``) scales only the parameters whose name contains
    ``weight`` (biases get T = 1): that mask is

    ```python
    mask = {name: "weight" in name for name, _ in model.named_parameters()}
    ```

    (or the callable ``lambda name, p: "weight" in name``). Defaults and their sources: η = 0.01 is
    the authors' class default (their CIFAR example runs η = 0; their class's ρ is 0.5);
    ``mask=None`` is the paper's Eq. 8, since a rule on names holds only for the names of
    ``nn.Module`` parameters; ξ = 10⁻¹² (the authors' code adds 10⁻¹⁶ to the norm).

    Args:
        rho: ρ >= 0, the radius of the ascent, or a schedule of the step count.
        eta: η >= 0, added to |θ| in T.
        eps: ξ >= 0, added to the norm before dividing.
        mask: which parameters T scales, as ``weight_decay_mask``: None (all), a dict name -> bool
            naming every parameter and no other, or a callable ``(name, tensor) -> bool``; False
            gives T = 1.

    Returns:
        An [`Estimator`][gamfunc.estimators.base.Estimator] named "asam"; its info adds
            ``perturbed_loss`` = L(θ + ε).

    Raises:
        ValueError: ``rho``, ``eta`` or ``eps`` is negative, or ``mask`` is none of its forms
            (naming it); a dict ``mask`` without an entry for a parameter, or with one for a name
            that is no parameter, when the step runs.

    Example:
        >>> import torch, gamfunc
        >>> loss_fn = lambda p, x: (p["weight"] @ x + p["bias"]).pow(2).sum()
        >>> params = {"weight": torch.ones(2, 2), "bias": torch.zeros(2)}
        >>> est = gamfunc.asam(0.5, mask={"weight": True, "bias": False})
        >>> d, info = est(params, torch.tensor([1.0, 2.0]), loss_fn)

    References:
        Kwon, Kim, Park, Choi, "ASAM: Adaptive Sharpness-Aware Minimization for Scale-Invariant
        Learning of Deep Neural Networks", ICML 2021, https://arxiv.org/abs/2102.11600.
    """
    rho = check_nonnegative("rho", rho, schedule=True)
    eta = check_nonnegative("eta", eta, schedule=True)
    eps = check_nonnegative("eps", eps)
    check_mask("mask", mask)

    def run(params, batch, loss_fn, clean, step):
        clean = clean if clean is not None else gradient_pass(loss_fn, params, batch)
        scaled = None if mask is None else masked_keys(mask, params, "mask", exact=True)
        theta_adv = adaptive_ascent(params, clean.grad, value(rho, step), eta, eps, scaled)
        adv = gradient_pass(loss_fn, theta_adv, batch)
        return Estimate(adv.grad, {**clean_info(clean), "perturbed_loss": adv.loss}, clean)

    hparams = {"rho": rho, "eta": eta, "eps": eps} | ({"mask": mask} if mask is not None else {})
    return Estimator("asam", run, hparams)


def adaptive_ascent(
    params: Tree, v: Tree, rho, eta, eps, scaled: Collection[str] | None = None
) -> Tree:
    """θ + ε, ε = ρ·T²v/(‖T v‖ + ξ), T = |θ| + η elementwise: an ascent of radius ρ along v measured
    in the scale of each parameter (ASAM, Kwon et al. 2021, Eq. 8; with η = 0 the ``adaptive=True``
    perturbation of the GAM authors' code, see [`gamfunc.gam`][gamfunc.estimators.gam.gam]).

    ``rho`` is ρ (a number or 0-d tensor), ``eta`` η, ``eps`` ξ; T is taken at ``params``.
    ``scaled`` names the parameters T scales; the others get T = 1 (None: every parameter).
    """
    if scaled is None:
        tv = tree.map(lambda p, g: (p.abs() + eta) * g, params, v)
        t2v = tree.map(lambda p, x: (p.abs() + eta) * x, params, tv)
    else:
        t = {k: params[k].abs() + eta for k in scaled}
        tv = {k: t[k] * g if k in t else g for k, g in v.items()}
        t2v = {k: t[k] * x if k in t else x for k, x in tv.items()}
    return tree.axpy(rho / (tree.norm(tv) + eps), t2v, params)
