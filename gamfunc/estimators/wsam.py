"""WSAM: sharpness as a regulariser of weight γ/(1 − γ) beside the loss."""

from __future__ import annotations

from gamfunc import tree
from gamfunc.checks import check_nonnegative, check_positive, check_unit
from gamfunc.estimators.base import Estimate, Estimator, Summary
from gamfunc.estimators.gradient import clean_info
from gamfunc.loss import ascent_point, gradient_pass
from gamfunc.schedules import value

__all__ = ["wsam"]

# its row of README's table of estimators
SUMMARY = Summary(
    call="gamfunc.wsam(rho, gamma, decouple=False, max_norm=None)",
    computes="WSAM (Yue et al. 2023): (1 − a)·g + a·(SAM's gradient), a = γ/(1 − γ); `decouple=True`: the authors' decoupled form",
    passes="2",
)


def wsam(
    rho, gamma, eps: float = 1e-12, *, decouple: bool = False, max_norm: float | None = None
) -> Estimator:
    r"""WSAM (Yue et al. 2023): the gradient of L + γ/(1 − γ)·(sharpness), coupled or decoupled.

    The weighted-sharpness objective and its first-order gradient, with g = ∇L(θ),
    ε̂ = ρ·g/(‖g‖ + ξ), g_adv = ∇L(θ + ε̂) and a = γ/(1 − γ):

    $$
    L^{\mathrm{WSAM}}(\theta) = L(\theta) + \frac{\gamma}{1-\gamma}
    \Bigl(\max_{\lVert\epsilon\rVert\le\rho} L(\theta+\epsilon) - L(\theta)\Bigr),\qquad
    d = (1 - a)\,g + a\,g_{\mathrm{adv}} = g + a\,(g_{\mathrm{adv}} - g).
    $$

    ``decouple=False`` (coupled) gives the optimiser d. ``decouple=True`` is the authors' "weight
    decoupled" form (``WeightedSAM(decouple=True)`` of github.com/intelligent-machine-learning/atorch,
    ``atorch/optimizers/wsam.py``, whose README says the paper's results used it): the optimiser
    sees g alone, and the sharpness term moves each parameter k after its update, with the lr of
    that parameter in the optimiser's state, as AdamW decouples weight decay:

    $$
    \theta_{t+1} = \theta_t + u(g) - \mathrm{lr}_k\cdot a\,(g_{\mathrm{adv}} - g),
    $$

    u(g) the optimiser's update. The estimator returns g as its direction and a·(g_adv − g) as
    ``Estimate.decoupled``; [`make_step`][gamfunc.training.step.make_step] applies it, and refuses at
    ``step.init`` an optimiser that keeps no lr. The two forms coincide for plain SGD (no momentum,
    no weight decay). ``max_norm`` = c clips g and g_adv separately, each to a global norm of at
    most c, after the ascent (which takes the unclipped g), as the authors' code does with
    ``torch.nn.utils.clip_grad_norm_``: v ← v·min(1, c/(‖v‖ + 10⁻⁶))
    ([`gamfunc.tree.clip_norm`][gamfunc.tree.clip_norm], as [`gamfunc.clip_by_global_norm`][gamfunc.optim.transforms.clip_by_global_norm]).

    γ = 0 gives [`gradient`][gamfunc.estimators.gradient.gradient], γ = ½ with ``decouple=False``
    gives [`sam`][gamfunc.estimators.sam.sam]; γ > ½ extrapolates beyond SAM (a > 1).

    Defaults and their sources: ξ = 10⁻¹² is the authors' ``sam_eps``; ``max_norm=None`` (no
    clipping) is the authors' default; γ = 0.9 is the paper's and the authors' default value (pass
    it). ``decouple=False`` is the paper's objective above and not the authors' default
    (``decouple=True``): the coupled form is a direction like any other estimator's, which every
    optimiser takes, a user's own transform without an lr included, while the decoupled form needs
    the step to apply a second update with the optimiser's lr. Pass ``decouple=True`` for the
    authors' form.

    Note:
        For γ > ½ the direction subtracts (a − 1)·g from a·∇L(θ + ε̂): the rounding errors of the two
        gradients reach it multiplied by up to |1 − a| + a = 2a − 1 (17 at γ = 0.9). In bfloat16 or
        float16 it is correspondingly less accurate than SAM's gradient; the decoupled part
        a·(g_adv − g) likewise.

    Args:
        rho: ρ >= 0, the radius of the ascent, or a schedule of the step count.
        gamma: γ in [0, 1), the weight of the sharpness (the paper's default 0.9), or a schedule.
        eps: ξ >= 0, keeps g/(‖g‖ + ξ) finite at g = 0.
        decouple: False: the coupled direction d; True: the authors' decoupled form (above).
        max_norm: c > 0, clip g and g_adv each to this global norm; None: no clipping.

    Returns:
        An [`Estimator`][gamfunc.estimators.base.Estimator] named "wsam"; its info adds
            ``perturbed_loss`` = L(θ + ε̂). With ``decouple=True`` its ``decoupled`` is True and
            calling it directly returns the direction g alone (the decoupled part is in
            ``estimator.run(...).decoupled``).

    Raises:
        ValueError: ``rho`` or ``eps`` is negative or not finite, ``gamma`` is outside [0, 1),
            ``decouple`` is not a bool, or ``max_norm`` is not None or a finite number > 0 (naming
            it).

    Example:
        >>> import torch, gamfunc
        >>> loss_fn = lambda p, b: ((b[0] @ p["w"] - b[1]) ** 2).mean()
        >>> est = gamfunc.wsam(0.05, 0.9, decouple=True)
        >>> step = gamfunc.make_step(est, gamfunc.sgd(lr=0.1, momentum=0.9), loss_fn)
        >>> params = {"w": torch.zeros(3)}
        >>> params, state, metrics = step(params, step.init(params), (torch.randn(8, 3), torch.randn(8)))

    References:
        Yue, Jiang, Ye, Gao, Liu, Zhang, "Sharpness-Aware Minimization Revisited: Weighted Sharpness
        as a Regularization Term", KDD 2023, https://arxiv.org/abs/2305.15817.
    """
    rho = check_nonnegative("rho", rho, schedule=True)
    gamma = check_unit("gamma", gamma, schedule=True, below_one=True)
    eps = check_nonnegative("eps", eps)
    if not isinstance(decouple, bool):
        raise ValueError(f"decouple must be True or False; got {decouple!r}")
    if max_norm is not None:
        max_norm = check_positive("max_norm", max_norm)

    def run(params, batch, loss_fn, clean, step):
        if clean is None:
            clean = gradient_pass(loss_fn, params, batch)
        point, clean = ascent_point(params, clean, value(rho, step), eps)
        adv = gradient_pass(loss_fn, point, batch)
        g, g_adv = clean.grad, adv.grad
        if max_norm is not None:  # each gradient on its own, after the ascent (the authors' order)
            g, _ = tree.clip_norm(g, max_norm)
            g_adv, _ = tree.clip_norm(g_adv, max_norm)
        a = value(gamma, step)
        a = a / (1 - a)
        info = {**clean_info(clean), "perturbed_loss": adv.loss}
        if decouple:
            return Estimate(g, info, clean, decoupled=tree.scale(tree.sub(g_adv, g), a))
        return Estimate(tree.lincomb((1 - a, g), (a, g_adv)), info, clean)

    hparams = {"rho": rho, "gamma": gamma, "eps": eps}
    hparams |= ({"decouple": True} if decouple else {}) | (
        {"max_norm": max_norm} if max_norm is not None else {}
    )
    return Estimator("wsam", run, hparams, decoupled=decouple)
