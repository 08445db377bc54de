"""Every estimator against a naive torch.autograd implementation of its formula, and closed forms."""

import pytest
import torch
from helpers import (
    Naive,
    as_flat,
    flatten,
    mlp_batch,
    mlp_loss,
    mlp_params,
    quadratic,
    rel_err,
    split,
)

import gamfunc
from gamfunc import tree

RHO, ALPHA = 0.07, 0.3


@pytest.fixture
def setup():
    params, batch = mlp_params(), mlp_batch()
    return params, batch, Naive(mlp_loss, params, batch), flatten(params)


def direction(est, params, batch, loss_fn=mlp_loss):
    d, info = est(params, batch, loss_fn)
    return flatten(d) if "w1" in d else as_flat(d), info


def test_gradient(setup):
    params, batch, naive, theta = setup
    d, info = direction(gamfunc.gradient(), params, batch)
    assert rel_err(d, naive.grad(theta)) < 1e-12
    assert torch.allclose(info["loss"], naive.L(theta))
    assert torch.allclose(info["grad_norm"], naive.grad(theta).norm())


def test_sam(setup):
    params, batch, naive, theta = setup
    d, _ = direction(gamfunc.sam(RHO), params, batch)
    assert rel_err(d, naive.sam(theta, RHO)) < 1e-10


@pytest.mark.parametrize("eta", [0.01, 0.5])
def test_asam(setup, eta):
    params, batch, naive, theta = setup
    d, info = direction(gamfunc.asam(RHO, eta=eta), params, batch)
    assert rel_err(d, naive.asam(theta, RHO, eta)) < 1e-10
    assert rel_err(d, naive.sam(theta, RHO)) > 1e-3  # the scale T changes the ascent
    assert torch.allclose(info["loss"], naive.L(theta))


def test_asam_scale_of_one_is_sam(setup):
    """T = |θ| + η is 1 where θ = 0 and η = 1: ASAM is then SAM."""
    params, batch, _, _ = setup
    zero = tree.scale(params, 0.0)
    d_asam, _ = direction(gamfunc.asam(RHO, eta=1.0), zero, batch)
    d_sam, _ = direction(gamfunc.sam(RHO), zero, batch)
    assert rel_err(d_asam, d_sam) < 1e-14


@pytest.mark.parametrize("hvp", ["exact", "reverse"])
def test_gnp_exact_and_reverse(setup, hvp):
    params, batch, naive, theta = setup
    d, _ = direction(gamfunc.gnp(ALPHA, hvp=hvp), params, batch)
    assert rel_err(d, naive.gnp_exact(theta, ALPHA)) < 1e-10


@pytest.mark.parametrize("r", [1e-2, 1e-3])
def test_gnp_fd_is_zhao_et_al_form(setup, r):
    params, batch, naive, theta = setup
    d, _ = direction(gamfunc.gnp(ALPHA, hvp=gamfunc.hvps.fd(radius=r)), params, batch)
    assert rel_err(d, naive.gnp_zhao(theta, ALPHA, r)) < 1e-10


def test_gnp_default_is_zhao_et_al_form_with_radius_1e_2():
    """gnp(α) is (1 − α/r)·∇L(θ) + (α/r)·∇L(θ + r·g/‖g‖), g = ∇L(θ), r = 1e-2 (Zhao et al.)."""
    w = torch.tensor([[0.3, -0.7], [1.1, 0.4]], dtype=torch.float64)
    x = torch.tensor([[1.0, -2.0], [0.5, 0.25], [-1.5, 1.0]], dtype=torch.float64)

    def loss_fn(p, x):
        return torch.tanh(x @ p["w"]).pow(3).sum()

    grad = torch.func.grad(lambda w: loss_fn({"w": w}, x))
    alpha, r = 0.1, 1e-2
    g = grad(w)
    want = (1 - alpha / r) * g + (alpha / r) * grad(w + r * g / g.norm())
    est = gamfunc.gnp(alpha)
    assert est.hparams["hvp"] == gamfunc.hvps.fd(radius=1e-2)
    got = est({"w": w}, x, loss_fn)[0]["w"]
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # the string "fd" is hvps.fd() here as everywhere: r = 1e-3, another estimator
    assert gamfunc.gnp(alpha, hvp="fd").hparams["hvp"] == gamfunc.hvps.fd(radius=1e-3)


@pytest.mark.parametrize("hvp", ["exact", "reverse"])
def test_gam_algorithm_1(setup, hvp):
    params, batch, naive, theta = setup
    d, info = direction(gamfunc.gam(RHO, ALPHA, hvp=hvp), params, batch)
    assert rel_err(d, naive.gam(theta, RHO, ALPHA)) < 1e-10
    assert torch.allclose(info["f_norm"], naive.grad_norm_grad(theta).norm(), rtol=1e-10)


def test_gam_finite_difference(setup):
    params, batch, naive, theta = setup
    d, _ = direction(gamfunc.gam(RHO, ALPHA, hvp="fd"), params, batch)  # hvps.fd(), r = 1e-3
    assert rel_err(d, naive.gam_fd(theta, RHO, ALPHA, 1e-3)) < 1e-10
    d, _ = direction(gamfunc.gam(RHO, ALPHA, hvp=gamfunc.hvps.fd(radius=1e-2)), params, batch)
    assert rel_err(d, naive.gam_fd(theta, RHO, ALPHA, 1e-2)) < 1e-10


def test_gam_fd_converges_to_exact_as_radius_shrinks(setup):
    params, batch, _naive, _theta = setup
    exact, _ = direction(gamfunc.gam(RHO, ALPHA), params, batch)
    err = [
        rel_err(direction(gamfunc.gam(RHO, ALPHA, hvp=gamfunc.hvps.fd(r)), params, batch)[0], exact)
        for r in (1e-2, 1e-3, 1e-4)
    ]
    assert err[0] > err[1] > err[2]
    assert err[2] < 1e-5


# Each backend value and the name that is its shorthand, per estimator ("fd" is hvps.fd(), r = 1e-3,
# in both), and each estimator's default.
VALUE_FORMS = [
    ("gam", {"hvp": "exact"}, {"hvp": gamfunc.hvps.exact()}),
    ("gam", {"hvp": "reverse"}, {"hvp": gamfunc.hvps.reverse()}),
    ("gam", {"hvp": "fd"}, {"hvp": gamfunc.hvps.fd(radius=1e-3)}),
    ("gam", {}, {"hvp": gamfunc.hvps.exact()}),
    ("gnp", {"hvp": "fd"}, {"hvp": gamfunc.hvps.fd(radius=1e-3)}),
    ("gnp", {}, {"hvp": gamfunc.hvps.fd(radius=1e-2)}),
    ("gnp", {"hvp": "exact"}, {"hvp": gamfunc.hvps.exact()}),
    ("gnp", {"hvp": "reverse"}, {"hvp": gamfunc.hvps.reverse()}),
]


def build(name, **kw):
    return gamfunc.gam(RHO, ALPHA, **kw) if name == "gam" else gamfunc.gnp(ALPHA, **kw)


@pytest.mark.parametrize(("name", "short", "value"), VALUE_FORMS)
def test_a_backend_value_equals_its_name_exactly(name, short, value):
    params, batch = mlp_params(), mlp_batch()
    by_name, by_value = build(name, **short), build(name, **value)
    assert by_name.hparams == by_value.hparams
    d_name, info_name = by_name(params, batch, mlp_loss)
    d_value, info_value = by_value(params, batch, mlp_loss)
    assert all(torch.equal(d_name[k], d_value[k]) for k in params)
    assert info_name.keys() == info_value.keys()
    assert all(torch.equal(info_name[k], info_value[k]) for k in info_name)


@pytest.mark.parametrize("name", ["gam", "gnp"])
def test_an_invalid_backend_names_hvp(name):
    fd = gamfunc.hvps.fd(radius=1e-2)
    assert build(name, hvp=fd).hparams["hvp"] == fd
    with pytest.raises(ValueError, match="hvp"):
        build(name, hvp="dense")
    with pytest.raises(ValueError, match="hvp"):
        build(name, hvp=1e-3)


@pytest.mark.parametrize("hvp", ["exact", "fd"])
def test_sam_plus_gam(setup, hvp):
    params, batch, naive, theta = setup
    est = gamfunc.gam(RHO, ALPHA, hvp=hvp, oracle=gamfunc.sam(0.05))  # "fd": r = 1e-3
    d, info = direction(est, params, batch)
    if hvp == "exact":
        ref = naive.gam(theta, RHO, ALPHA, oracle="sam", oracle_rho=0.05)
    else:
        ref = naive.gam_fd(theta, RHO, ALPHA, 1e-3) - naive.grad(theta) + naive.sam(theta, 0.05)
    assert rel_err(d, ref) < 1e-10
    assert "perturbed_loss" in info and "adv_grad_norm" in info


@pytest.mark.parametrize("convention", ["paper", "official"])
def test_gam_accelerated_algorithm_2(setup, convention):
    params, batch, naive, theta = setup
    hp = {"rho": 0.1, "rho_prime": 0.02, "alpha": 0.6, "beta": 0.3, "gamma": 0.4}
    d, _ = direction(gamfunc.gam_accelerated(**hp, convention=convention), params, batch)
    ref = naive.gam_accelerated(theta, 0.1, 0.02, 0.6, 0.3, 0.4, convention)
    assert rel_err(d, ref) < 1e-10


def authors_gam_direction(params, batch, rho, rho_prime, alpha, beta, gamma, adaptive, eps=1e-12):
    """What ``GAM.step`` of the authors' code leaves in ``p.grad``, one parameter tensor at a time.

    Written from github.com/xxgege/GAM, commit 694133d, ``gam/gam.py``: ``step`` l.197-239,
    ``perturb_weights`` l.47-76, ``grad_norm_ascent`` l.79-98, ``gradient_decompose`` l.109-135,
    ``_grad_norm`` l.138-159. Their names: ``grad_rho`` = ρ', ``grad_norm_rho`` = ρ,
    ``grad_beta_1`` = α, ``grad_beta_3`` = 1 − α, ``grad_beta_2`` = 1 − β, ``grad_gamma`` = γ.
    """

    def grad(p):
        leaves = {k: v.detach().requires_grad_(True) for k, v in p.items()}
        grads = torch.autograd.grad(mlp_loss(leaves, batch), list(leaves.values()))
        return dict(zip(p, grads, strict=True))

    def norm(g, p, weight_adaptive):
        total = 0.0
        for k in g:
            total += torch.sum((g[k] * torch.abs(p[k])) ** 2 if weight_adaptive else g[k] ** 2)
        return torch.sqrt(total)

    def perturbation(g, p, radius):
        scale = radius / (norm(g, p, adaptive) + eps)
        e_w = {}
        for k in g:
            e_w[k] = g[k] * scale
            if adaptive:
                e_w[k] = e_w[k] * torch.pow(p[k], 2)
        return e_w

    theta = params
    g0 = grad(theta)
    e_w_0 = perturbation(g0, theta, rho_prime)
    g1 = grad({k: theta[k] + e_w_0[k] for k in theta})
    diff = {k: g1[k] - g0[k] for k in theta}
    e_w_12 = perturbation(diff, theta, rho)
    theta2 = {k: theta[k] + e_w_12[k] for k in theta}
    g2 = grad(theta2)
    e_w_2 = perturbation(g2, theta2, rho_prime)
    g3 = grad({k: theta2[k] + e_w_2[k] for k in theta})
    pro_m = {k: g0[k] + abs(1 - beta) * g2[k] for k in theta}
    new = {k: alpha * g1[k] + (1 - alpha) * g3[k] for k in theta}
    inner_prod = sum(torch.sum(pro_m[k] * new[k]) for k in theta)
    new_norm, old_norm = norm(new, theta, False), norm(pro_m, theta, False)
    cosine = inner_prod / (new_norm * old_norm + eps)
    out = {}
    for k in theta:
        vertical = pro_m[k] - cosine * old_norm * new[k] / (new_norm + eps)
        out[k] = new[k] - gamma * vertical
    return flatten(out)


@pytest.mark.parametrize("adaptive", [False, True])
def test_gam_accelerated_official_equals_the_authors_step(setup, adaptive):
    params, batch, _naive, _theta = setup
    hp = {"rho": 0.1, "rho_prime": 0.02, "alpha": 0.6, "beta": 0.3, "gamma": 0.4}
    est = gamfunc.gam_accelerated(**hp, convention="official", adaptive=adaptive)
    d, _ = direction(est, params, batch)
    ref = authors_gam_direction(params, batch, **hp, adaptive=adaptive)
    assert rel_err(d, ref) < 1e-10
    if adaptive:  # the per-element scale does move the direction
        plain = authors_gam_direction(params, batch, **hp, adaptive=False)
        assert rel_err(ref, plain) > 1e-3


@pytest.mark.parametrize("hvp", ["exact", "reverse"])
def test_adaptive_gam_ascends_in_the_scale_of_theta(setup, hvp):
    """Algorithm 1 with the authors' adaptive ascent: θ_adv = θ + ρ·θ²·f/(‖|θ|·f‖ + ξ)."""
    params, batch, naive, theta = setup
    f = naive.grad_norm_grad(theta)
    theta_adv = theta + RHO * theta**2 * f / ((theta.abs() * f).norm() + 1e-12)
    ref = naive.grad(theta) + ALPHA * RHO * naive.grad_norm_grad(theta_adv)
    d, info = direction(gamfunc.gam(RHO, ALPHA, hvp=hvp, adaptive=True), params, batch)
    assert rel_err(d, ref) < 1e-10
    assert torch.allclose(info["f_norm"], f.norm(), rtol=1e-10)
    assert rel_err(ref, naive.gam(theta, RHO, ALPHA)) > 1e-3


def test_adaptive_takes_a_bool():
    for make in (
        lambda: gamfunc.gam(RHO, ALPHA, adaptive=1),
        lambda: gamfunc.gam_accelerated(0.1, 0.02, 0.6, 0.3, 0.4, adaptive="yes"),
    ):
        with pytest.raises(ValueError, match="adaptive"):
            make()


def test_conventions_differ_only_in_h_minus(setup):
    params, batch, _naive, _theta = setup
    hp = {"rho": 0.1, "rho_prime": 0.02, "alpha": 0.6, "beta": 0.3}
    paper = direction(gamfunc.gam_accelerated(**hp, gamma=0.4), params, batch)[0]
    official = direction(
        gamfunc.gam_accelerated(**hp, gamma=0.4, convention="official"), params, batch
    )[0]
    assert rel_err(paper, official) > 1e-6
    no_gamma = [
        direction(gamfunc.gam_accelerated(**hp, gamma=0.0, convention=c), params, batch)[0]
        for c in ("paper", "official")
    ]
    assert torch.equal(no_gamma[0], no_gamma[1])


def test_exact_gam_does_not_recompute_the_clean_gradient(setup):
    """Exact GAM with the plain oracle: ∇L(θ) once (the jvp recomputes it as its primal, unavoidably),
    ∇L(θ_adv) once, and two jvps: the oracle reuses the first gradient."""
    params, batch, _, _ = setup
    calls = []

    def counted(p, b):
        calls.append(1)
        return mlp_loss(p, b)

    gamfunc.gam(RHO, ALPHA)(params, batch, counted)
    assert len(calls) == 4
    calls.clear()
    gamfunc.gam(RHO, ALPHA, hvp="reverse")(params, batch, counted)
    assert len(calls) == 2  # one fused double-backward at θ and one at θ_adv
    calls.clear()
    gamfunc.gam(RHO, ALPHA, hvp="fd")(params, batch, counted)
    assert len(calls) == 4  # paper Appendix D: four gradients
    calls.clear()
    gamfunc.gam_accelerated(0.1, 0.02, 0.5, 0.5, 0.1)(params, batch, counted)
    assert len(calls) == 4


# ---- closed forms on L = ½(θ−θ*)ᵀA(θ−θ*) ------------------------------------------------------


@pytest.fixture
def quad():
    loss_fn, A, theta_star = quadratic()
    theta = theta_star + torch.randn(
        6, generator=torch.Generator().manual_seed(3), dtype=torch.float64
    )
    return loss_fn, A, theta_star, theta


def unit(v):
    return v / v.norm()


@pytest.mark.parametrize("hvp", ["exact", "reverse", "fd"])
def test_quadratic_closed_forms(quad, hvp):
    loss_fn, A, theta_star, theta = quad
    e = theta - theta_star
    params = split(theta)
    g = A @ e

    d, _ = direction(gamfunc.gradient(), params, None, loss_fn)
    assert rel_err(d, g) < 1e-12

    d, _ = direction(gamfunc.sam(RHO), params, None, loss_fn)
    assert rel_err(d, A @ (e + RHO * unit(g))) < 1e-12

    d, _ = direction(gamfunc.gnp(ALPHA, hvp=hvp), params, None, loss_fn)  # "fd": r = 1e-3
    assert rel_err(d, g + ALPHA * A @ A @ e / g.norm()) < 1e-9

    d, info = direction(gamfunc.gam(RHO, ALPHA, hvp=hvp), params, None, loss_fn)  # "fd": 1e-3
    f = A @ A @ e / g.norm()
    e_adv = e + RHO * unit(f)
    assert torch.allclose(info["f_norm"], f.norm(), rtol=1e-9)
    assert rel_err(d, g + ALPHA * RHO * A @ A @ e_adv / (A @ e_adv).norm()) < 1e-9


def test_quadratic_accelerated_closed_form(quad):
    loss_fn, A, theta_star, theta = quad
    e = theta - theta_star
    rho, rho_p, a, b, c = 0.1, 0.02, 0.6, 0.3, 0.4
    g0 = A @ e
    g1 = A @ (e + rho_p * unit(g0))
    e2 = e + rho * unit(A @ unit(g0))  # h0 = g1 − g0 = ρ'·A·ĝ0
    g2 = A @ e2
    g3 = A @ (e2 + rho_p * unit(g2))
    hp, hm = a * g1 + (1 - a) * g3, b * g0 + (1 - b) * g2
    ref = hp - c * (hm - (hm @ unit(hp)) * unit(hp))
    d, _ = direction(gamfunc.gam_accelerated(rho, rho_p, a, b, c), split(theta), None, loss_fn)
    assert rel_err(d, ref) < 1e-10


def test_gam_with_zero_alpha_is_its_oracle(setup):
    params, batch, _, _ = setup
    for oracle in (gamfunc.gradient(), gamfunc.sam(0.05)):
        d, _ = gamfunc.gam(RHO, 0.0, oracle=oracle)(params, batch, mlp_loss)
        ref, _ = oracle(params, batch, mlp_loss)
        assert all(torch.equal(d[k], ref[k]) for k in d)


def test_scheduled_rho_is_read_at_the_step(setup):
    params, batch, naive, theta = setup
    sched = gamfunc.schedules.inverse_sqrt(0.2)
    est = gamfunc.sam(sched)
    d, _ = est(params, batch, mlp_loss, step=torch.tensor(3))
    assert rel_err(flatten(d), naive.sam(theta, 0.2 / 2.0)) < 1e-10


def test_info_values_are_scalars(setup):
    params, batch, _, _ = setup
    for est in (gamfunc.gam(RHO, ALPHA), gamfunc.gam_accelerated(0.1, 0.01, 0.5, 0.5, 0.1)):
        _, info = est(params, batch, mlp_loss)
        assert all(v.ndim == 0 for v in info.values())
        assert tree.norm(params) > 0
