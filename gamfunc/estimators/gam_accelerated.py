"""Accelerated GAM, paper Algorithm 2 (Appendix D): four gradients and no Hessian-vector product."""

from __future__ import annotations

from gamfunc import tree
from gamfunc.checks import check_nonnegative, check_unit
from gamfunc.estimators.asam import adaptive_ascent
from gamfunc.estimators.base import Estimate, Estimator, Summary
from gamfunc.estimators.gradient import clean_info
from gamfunc.loss import gradient_pass, unit_grad
from gamfunc.schedules import value

__all__ = ["CONVENTIONS", "gam_accelerated"]

# its row of README's table of estimators
SUMMARY = Summary(
    call='gamfunc.gam_accelerated(rho, rho_prime, alpha, beta, gamma, convention="paper")',
    computes='GAM, Algorithm 2: h+ − γ·h−⊥ from four gradients; `"official"`: the authors\' code',
    passes="4",
)

CONVENTIONS = ("paper", "official")


def gam_accelerated(
    rho,
    rho_prime,
    alpha: float,
    beta: float,
    gamma: float,
    convention: str = "paper",
    eps: float = 1e-12,
    adaptive: bool = False,
) -> Estimator:
    r"""Accelerated GAM (paper Algorithm 2): GAM + SAM from four gradients g0..g3.

    Algorithm 2, lines 5–13, with ρ = ``rho``, ρ' = ``rho_prime``, α, β, γ = ``alpha``, ``beta``,
    ``gamma`` and ξ = ``eps``:

    $$
    \begin{aligned}
    g_{0} & = \nabla L(\theta ) \\
    g_{1} & = \nabla L(\theta _{1}), \qquad \theta _{1} = \theta + \rho '\cdot g_{0}/(\| g_{0}\| + \xi ) \qquad \text{SAM point; (g1 − g0)/ρ' ≈ H·ĝ0} \\
    h_{0} & = g_{1} - g_{0} \\
    g_{2} & = \nabla L(\theta _{2}), \qquad \theta _{2} = \theta + \rho \cdot h_{0}/(\| h_{0}\| + \xi ) \qquad \text{≈ θ\_adv of Algorithm 1} \\
    g_{3} & = \nabla L(\theta _{3}), \qquad \theta _{3} = \theta _{2} + \rho '\cdot g_{2}/(\| g_{2}\| + \xi ) \qquad \text{(g3 − g2)/ρ' ≈ H(θ\_adv)·ĝ2} \\
    h_{+} & = \alpha \cdot g_{1} + (1 - \alpha )\cdot g_{3} \\
    h_{-} & = \beta \cdot g_{0} + (1 - \beta )\cdot g_{2} \qquad \text{convention="paper"} \\
    h_{-} & = g_{0} + |1 - \beta |\cdot g_{2} \qquad \text{convention="official"} \\
    \mathrm{direction} & = h_{+} - \gamma \cdot h_{-}^{\perp}, \qquad h_{-}^{\perp} = h_{-} - \langle h_{-}, \hat{h} _{+}\rangle \cdot \hat{h} _{+}, \qquad \hat{h} _{+} = h_{+}/(\| h_{+}\| + \xi )
    \end{aligned}
    $$

    With ``adaptive=True`` each of the three ascents x + r·v/(‖v‖ + ξ) above (to θ1, θ2, θ3) is
    measured per element in the scale of the point x it starts from, as the authors'
    ``GAM(adaptive=True)`` does (github.com/xxgege/GAM, commit 694133d, ``gam/gam.py``:
    ``perturb_weights`` l.57-59 and l.69-71, ``grad_norm_ascent`` l.94-97, with the weighted norm of
    ``_grad_norm`` l.154-155):

    ```text
    x + r·x²·v/(‖|x|·v‖ + ξ)                         # x², |x| elementwise; x = θ, θ, θ2
    ```

    `adaptive_ascent` with η = 0 (ASAM's T = |θ| + η).

    Warning:
        The authors' released code forms h− = g0 + |1 − β|·g2, not the paper's β·g0 + (1 − β)·g2.
        ``convention="official"`` reproduces the code, ``"paper"`` the text. In the code's names:
        ``grad_norm_rho`` = ρ, ``grad_rho`` = ρ', ``grad_beta_1`` = α, ``grad_beta_0`` = β,
        ``grad_gamma`` = γ (and ``grad_beta_2`` = 1 − β, ``grad_beta_3`` = 1 − α).

    Args:
        rho: ρ, radius of the ascent to θ2 ≈ θ_adv (float >= 0 or a schedule).
        rho_prime: ρ', radius of the two SAM-like finite differences (float >= 0 or a schedule).
        alpha: α in [0, 1], weight of g1 against g3 in h+.
        beta: β in [0, 1], weight of g0 against g2 in h−.
        gamma: γ >= 0, how much of h−⊥ is removed. α, β and γ may also be schedules of the step
            count, as ρ and ρ' ([`gamfunc.ensemble`][gamfunc.training.ensemble] gives each member its values as such).
        convention: "paper" or "official" (see Warning).
        eps: ξ.
        adaptive: scale the ascents per element by |x| (the authors' ``adaptive=True``).

    Returns:
        An Estimator; its info adds ``adv_grad_norm`` = ‖g2‖ and ``adv_loss`` = L(θ2).

    References:
        Zhang et al., CVPR 2023, Appendix D, https://arxiv.org/abs/2303.03108.
    """
    rho = check_nonnegative("rho", rho, schedule=True)
    rho_prime = check_nonnegative("rho_prime", rho_prime, schedule=True)
    alpha = check_unit("alpha", alpha, schedule=True)
    beta = check_unit("beta", beta, schedule=True)
    gamma = check_nonnegative("gamma", gamma, schedule=True)
    eps = check_nonnegative("eps", eps)
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {CONVENTIONS}; got {convention!r}")
    if not isinstance(adaptive, bool):
        raise ValueError(f"adaptive must be True or False; got {adaptive!r}")

    def ascend(x, v, v_hat, radius):
        """x + r·v̂, or the authors' adaptive ascent from x."""
        return adaptive_ascent(x, v, radius, 0.0, eps) if adaptive else tree.axpy(radius, v_hat, x)

    def run(params, batch, loss_fn, clean, step):
        rho_t, rho_p = value(rho, step), value(rho_prime, step)
        alpha_t, beta_t, gamma_t = value(alpha, step), value(beta, step), value(gamma, step)
        b0, b2 = (beta_t, 1 - beta_t) if convention == "paper" else (1.0, abs(1 - beta_t))
        g0 = clean if clean is not None else gradient_pass(loss_fn, params, batch)
        g0_hat, g0 = unit_grad(g0, eps)
        g1 = gradient_pass(loss_fn, ascend(params, g0.grad, g0_hat, rho_p), batch)
        h0 = tree.sub(g1.grad, g0.grad)
        theta2 = ascend(params, h0, tree.normalize(h0, eps)[0], rho_t)
        g2_hat, g2 = unit_grad(gradient_pass(loss_fn, theta2, batch), eps)
        g3 = gradient_pass(loss_fn, ascend(theta2, g2.grad, g2_hat, rho_p), batch)
        h_plus = tree.lincomb((alpha_t, g1.grad), (1 - alpha_t, g3.grad))
        h_minus = tree.lincomb((b0, g0.grad), (b2, g2.grad))
        h_plus_hat, _ = tree.normalize(h_plus, eps)
        h_perp = tree.axpy(-tree.vdot(h_minus, h_plus_hat), h_plus_hat, h_minus)
        direction = tree.axpy(-gamma_t, h_perp, h_plus)
        info = {**clean_info(g0), "adv_grad_norm": g2.grad_norm, "adv_loss": g2.loss}
        return Estimate(direction, info, g0)

    hparams = {"rho": rho, "rho_prime": rho_prime, "alpha": alpha, "beta": beta, "gamma": gamma}
    hparams |= {"eps": eps, "adaptive": adaptive}
    return Estimator(f"gam_accelerated[{convention}]", run, hparams | {"convention": convention})
