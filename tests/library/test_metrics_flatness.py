"""R1_ρ and R0_ρ: Lemma 3.1 and Proposition 3.2 of the paper, and the ascent against a naive loop."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from gamfunc import metrics

F64 = torch.float64


def quadratic(eigenvalues, seed=0, dtype=F64):
    """L(θ) = ½(θ−θ*)ᵀA(θ−θ*) over params {"a": θ[:2], "b": θ[2:]}, A = Q diag(eigenvalues) Qᵀ."""
    lam = torch.tensor(eigenvalues, dtype=dtype)
    d = lam.numel()
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=dtype))
    a = q @ torch.diag(lam) @ q.T
    theta_star = torch.randn(d, generator=g, dtype=dtype)

    def loss_fn(params, batch):
        e = torch.cat([params["a"], params["b"]]) - theta_star
        return 0.5 * e @ (a @ e)

    at_minimum = {"a": theta_star[:2].clone(), "b": theta_star[2:].clone()}
    return loss_fn, at_minimum, a


SPECTRUM = [4.0, 2.0, 1.0, 0.5, 0.3, 0.1]


# ---- Lemma 3.1 -------------------------------------------------------------------------------------


@pytest.mark.parametrize("hvp", ["exact", "reverse"])
@pytest.mark.parametrize("rho", [0.01, 0.3])
def test_lemma_3_1_first_order_flatness_over_rho_squared_is_lambda_max(rho, hvp):
    loss_fn, theta_star, _ = quadratic(SPECTRUM)
    r1 = metrics.first_order_flatness(theta_star, None, loss_fn, rho, hvp=hvp)
    assert abs(r1.item() / rho**2 - SPECTRUM[0]) < 1e-3 * SPECTRUM[0]


@pytest.mark.parametrize("init", ["gradient", "random"])
def test_lemma_3_1_holds_for_the_ascent_alone(init):
    # From a random start (at θ* the gradient vanishes), the ascent itself finds λ_max.
    loss_fn, theta_star, _ = quadratic(SPECTRUM, seed=1)
    rho = 0.05
    r1 = metrics.first_order_flatness(theta_star, None, loss_fn, rho, init=init, steps=60)
    assert abs(r1.item() / rho**2 - SPECTRUM[0]) < 1e-3 * SPECTRUM[0]
    few = metrics.first_order_flatness(theta_star, None, loss_fn, rho, init=init, steps=1)
    assert few < r1  # the steps do the work


def test_zeroth_order_flatness_at_the_minimum_of_a_quadratic_is_half_rho_squared_lambda_max():
    loss_fn, theta_star, _ = quadratic(SPECTRUM, seed=2)
    rho = 0.2
    for init in ("auto", "random"):
        r0 = metrics.zeroth_order_flatness(theta_star, None, loss_fn, rho, init=init, steps=60)
        assert abs(r0.item() - 0.5 * rho**2 * SPECTRUM[0]) < 1e-3 * 0.5 * rho**2 * SPECTRUM[0]


def test_float32_lemma_3_1():
    loss_fn, theta_star, _ = quadratic(SPECTRUM, dtype=torch.float32)
    r1 = metrics.first_order_flatness(theta_star, None, loss_fn, 0.1)
    assert r1.dtype == torch.float32
    assert abs(r1.item() / 0.1**2 - SPECTRUM[0]) < 1e-3 * SPECTRUM[0]


# ---- Proposition 3.2 on random small networks ------------------------------------------------------


def random_network(seed, hidden, n, activation):
    g = torch.Generator().manual_seed(seed)
    params = {
        "w1": torch.randn(hidden, 3, generator=g, dtype=F64),
        "b1": torch.randn(hidden, generator=g, dtype=F64),
        "w2": torch.randn(2, hidden, generator=g, dtype=F64) / hidden**0.5,
    }
    x = torch.randn(n, 3, generator=g, dtype=F64)
    y = torch.randint(0, 2, (n,), generator=g)
    act = {"tanh": torch.tanh, "softplus": F.softplus, "sin": torch.sin}[activation]

    def loss_fn(p, batch):
        xb, yb = batch
        return F.cross_entropy(act(xb @ p["w1"].T + p["b1"]) @ p["w2"].T, yb)

    return params, (x, y), loss_fn


@settings(max_examples=8, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    hidden=st.integers(2, 6),
    n=st.integers(4, 16),
    activation=st.sampled_from(["tanh", "softplus", "sin"]),
    rho=st.floats(0.01, 1.0),
)
def test_proposition_3_2_first_order_bounds_zeroth_order(seed, hidden, n, activation, rho):
    params, batch, loss_fn = random_network(seed, hidden, n, activation)
    r1, p1 = metrics.first_order_flatness(params, batch, loss_fn, rho, return_point=True)
    r0, p0 = metrics.zeroth_order_flatness(params, batch, loss_fn, rho, return_point=True)
    assert r1 >= r0 >= 0
    # Each value is what its point gives, and each point lies in the ball.
    g1 = torch.func.grad(loss_fn)(p1, batch)
    torch.testing.assert_close(r1, rho * torch.sqrt(sum((v**2).sum() for v in g1.values())))
    torch.testing.assert_close(r0, loss_fn(p0, batch) - loss_fn(params, batch))
    for point in (p0, p1):
        dist = torch.sqrt(sum(((point[k] - params[k]) ** 2).sum() for k in params))
        assert dist <= rho * (1 + 1e-12)


# ---- the ascent against a naive loop on flat vectors ----------------------------------------------


def flat(p):
    return torch.cat([v.reshape(-1) for v in p.values()])


def unflat(x, like):
    out, i = {}, 0
    for k, v in like.items():
        out[k] = x[i : i + v.numel()].reshape(v.shape)
        i += v.numel()
    return out


def naive_ascent(phi, theta, rho, steps, lr):
    """Projected normalised gradient ascent of φ from ε_0 = ρ·∇φ(θ)/‖∇φ(θ)‖, with torch.autograd."""

    def value_and_grad(x):
        x = x.detach().requires_grad_(True)
        v = phi(x)
        (g,) = torch.autograd.grad(v, x)
        return v.detach(), g

    best, d = value_and_grad(theta)
    eps = rho * d / d.norm()
    for _ in range(steps + 1):
        v, d = value_and_grad(theta + eps)
        best = torch.maximum(best, v)
        eps = eps + lr * rho * d / d.norm()
        eps = eps * torch.clamp(rho / eps.norm(), max=1.0)
    return best


@pytest.mark.parametrize("lr", [0.3, 1.0])
def test_ascent_equals_a_naive_autograd_loop(lr):
    params, batch, loss_fn = random_network(3, 4, 10, "tanh")
    theta = flat(params)
    rho, steps = 0.4, 5

    def loss_at(x):
        return loss_fn(unflat(x, params), batch)

    def grad_norm_at(x):
        (g,) = torch.autograd.grad(loss_at(x), x, create_graph=True)
        return g.norm()

    r0 = metrics.zeroth_order_flatness(
        params, batch, loss_fn, rho, init="gradient", steps=steps, lr=lr
    )
    expected_r0 = naive_ascent(loss_at, theta, rho, steps, lr) - loss_at(theta)
    torch.testing.assert_close(r0, expected_r0, rtol=1e-10, atol=0)
    r1 = metrics.first_order_flatness(
        params, batch, loss_fn, rho, init="gradient", steps=steps, lr=lr
    )
    expected_r1 = rho * naive_ascent(grad_norm_at, theta, rho, steps, lr)
    torch.testing.assert_close(r1, expected_r1, rtol=1e-10, atol=0)


def test_more_steps_never_lower_the_estimate():
    params, batch, loss_fn = random_network(5, 5, 12, "softplus")
    values = [
        metrics.zeroth_order_flatness(params, batch, loss_fn, 0.5, steps=s, init="random")
        for s in (0, 2, 8)
    ]
    assert values[0] <= values[1] <= values[2]


def test_same_seed_same_result_and_inputs_untouched():
    params, batch, loss_fn = random_network(7, 3, 8, "tanh")
    before = {k: v.clone() for k, v in params.items()}

    def run(fn, seed):
        g = torch.Generator().manual_seed(seed)
        return fn(params, batch, loss_fn, 0.3, init="random", steps=2, generator=g)

    for fn in (metrics.first_order_flatness, metrics.zeroth_order_flatness):
        assert torch.equal(run(fn, 1), run(fn, 1))
        assert not torch.equal(run(fn, 1), run(fn, 2))
    assert all(torch.equal(before[k], params[k]) for k in params)


def test_loss_with_aux_is_accepted():
    params, batch, loss_fn = random_network(8, 3, 8, "tanh")

    def with_aux(p, b):
        return loss_fn(p, b), torch.zeros(2)

    for fn in (metrics.first_order_flatness, metrics.zeroth_order_flatness):
        assert torch.equal(fn(params, batch, loss_fn, 0.2), fn(params, batch, with_aux, 0.2))


@pytest.mark.parametrize(
    "kwargs",
    [{"rho": 0.0}, {"rho": -1.0}, {"steps": -1}, {"lr": 0.0}, {"init": "sam"}, {"mode": "x"}],
)
def test_bad_arguments_raise_value_error(kwargs):
    params, batch, loss_fn = random_network(0, 2, 4, "tanh")
    args = {"rho": 0.1} | kwargs
    for fn in (metrics.first_order_flatness, metrics.zeroth_order_flatness):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            fn(params, batch, loss_fn, **args)
