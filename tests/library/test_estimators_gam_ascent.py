"""GAM's multi-step ascent (``gam(..., ascent_steps=n)``) against the naive loop written here with
torch.autograd: 20 steps of training in float64, compared step by step; n = 1 is GAM bit for bit."""

import pytest
import torch
from helpers import flatten, mlp_batch, mlp_loss, mlp_params, rel_err, unflatten

import gamfunc

STEPS = 20
TOL = 1e-6
EPS = 1e-12


def unit(v):
    return v / (v.norm() + EPS)


def grad(point, batch, like):
    point = point.detach().requires_grad_(True)
    return torch.autograd.grad(mlp_loss(unflatten(point, like), batch), point)[0]


def hvp(point, v, batch, like, radius):
    """H(point)·v: forward of ∇L with create_graph and its vjp, or the finite difference
    (∇L(point + r·v) − ∇L(point))/r."""
    if radius is not None:
        return (grad(point + radius * v, batch, like) - grad(point, batch, like)) / radius
    point = point.detach().requires_grad_(True)
    (g,) = torch.autograd.grad(mlp_loss(unflatten(point, like), batch), point, create_graph=True)
    return torch.autograd.grad(g @ v, point)[0]


def naive_multistep_gam(theta, batch, like, rho, alpha, n, radius=None, adaptive=False):
    """(direction, θ_adv): θ_{i+1} = θ_i + (ρ/n)·f_i/(‖f_i‖ + ξ), f_i = H(θ_i)·ĝ(θ_i), or the
    adaptive step (ρ/n)·T²f_i/(‖T f_i‖ + ξ) with T = |θ|; direction = ∇L(θ) + α·ρ·f(θ_n)."""

    def f(point):
        return hvp(point, unit(grad(point, batch, like)), batch, like, radius)

    point, t = theta, theta.abs()
    for _ in range(n):
        fi = f(point)
        if adaptive:
            point = point + rho / n * t * t * fi / ((t * fi).norm() + EPS)
        else:
            point = point + rho / n * unit(fi)
    return grad(theta, batch, like) + alpha * rho * f(point), point


CASES = [
    ("exact", 3, False),
    ("fd", 2, False),
    ("exact", 2, True),
    pytest.param("exact", 5, False, marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("hvp_name", "n", "adaptive"), CASES, ids=lambda v: str(v))
def test_multistep_gam_equals_the_naive_loop_over_training(hvp_name, n, adaptive):
    rho, alpha, lr, radius = 0.2, 0.5, 0.3, 1e-4
    params = mlp_params()
    hvp = gamfunc.hvps.fd(radius=radius) if hvp_name == "fd" else hvp_name
    est = gamfunc.gam(rho, alpha, hvp=hvp, adaptive=adaptive, ascent_steps=n)
    step = gamfunc.make_step(est, gamfunc.sgd(lr=lr), mlp_loss)
    state = step.init(params)
    theta = flatten(params)
    start = theta
    for t in range(STEPS):
        batch = mlp_batch(seed=100 + t)
        params, state, _ = step(params, state, batch)
        r = radius if hvp_name == "fd" else None
        d, adv = naive_multistep_gam(theta, batch, params, rho, alpha, n, r, adaptive)
        if not adaptive:  # the iterates stay in the ρ-ball
            assert float((adv - theta).norm()) <= rho * (1 + 1e-12)
        theta = theta - lr * d
        assert rel_err(flatten(params), theta) <= TOL, f"step {t + 1}"
    assert rel_err(theta, start) > 1e-2  # the parameters moved


@pytest.mark.parametrize("hvp_name", ["exact", "reverse", "fd"])
@pytest.mark.parametrize("adaptive", [False, True])
def test_one_ascent_step_is_gam_exactly(hvp_name, adaptive):
    params, batch = mlp_params(), mlp_batch()
    one = gamfunc.gam(0.1, 0.3, hvp=hvp_name, adaptive=adaptive, ascent_steps=1)
    plain = gamfunc.gam(0.1, 0.3, hvp=hvp_name, adaptive=adaptive)
    d1, i1 = one(params, batch, mlp_loss)
    d, i = plain(params, batch, mlp_loss)
    assert all(torch.equal(d1[k], d[k]) for k in d)
    assert sorted(i1) == sorted(i) and all(torch.equal(i1[k], i[k]) for k in i)
    assert one.hparams == plain.hparams and "ascent_steps" not in plain.hparams


def test_more_ascent_steps_find_a_larger_gradient_norm_in_the_ball():
    """On the MLP, five steps end where ‖∇L‖ is larger than one step of the same radius reaches."""
    params, batch = mlp_params(), mlp_batch()
    _, one = gamfunc.gam(0.5, 0.1)(params, batch, mlp_loss)
    _, five = gamfunc.gam(0.5, 0.1, ascent_steps=5)(params, batch, mlp_loss)
    assert float(five["adv_grad_norm"]) > float(one["adv_grad_norm"])
    assert gamfunc.gam(0.5, 0.1, ascent_steps=5).hparams["ascent_steps"] == 5


def test_look_gam_and_the_oracle_take_the_steps_of_their_own():
    params, batch = mlp_params(), mlp_batch()
    look = gamfunc.look_gam(0.1, 0.3, k=1, ascent_steps=3)
    d_look, _ = look(params, batch, mlp_loss)
    d_gam, _ = gamfunc.gam(0.1, 0.3, ascent_steps=3)(params, batch, mlp_loss)
    assert rel_err(flatten(d_look), flatten(d_gam)) == 0.0
    both = gamfunc.gam(0.1, 0.3, oracle=gamfunc.sam(0.1, ascent_steps=2), ascent_steps=3)
    assert both.name == "sam+gam" and both.hparams["ascent_steps"] == 3


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, None])
def test_ascent_steps_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match="ascent_steps"):
        gamfunc.gam(0.05, 0.1, ascent_steps=bad)
