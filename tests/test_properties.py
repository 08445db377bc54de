"""Property tests over random small MLPs, batches and in-range hyperparameters."""

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import gamfunc

SETTINGS = settings(max_examples=15, deadline=None, derandomize=True)


@st.composite
def problems(draw):
    width = draw(st.integers(1, 6))
    n_in, n_out = draw(st.integers(1, 4)), draw(st.integers(2, 4))
    n = draw(st.integers(1, 8))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    act = draw(st.sampled_from([torch.tanh, torch.relu, F.gelu]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    params = {
        "w1": torch.randn(width, n_in, generator=g, dtype=dtype),
        "b1": torch.randn(width, generator=g, dtype=dtype),
        "w2": torch.randn(n_out, width, generator=g, dtype=dtype),
    }
    batch = (
        torch.randn(n, n_in, generator=g, dtype=dtype),
        torch.randint(0, n_out, (n,), generator=g),
    )

    def loss_fn(p, b):
        return F.cross_entropy(act(b[0] @ p["w1"].T + p["b1"]) @ p["w2"].T, b[1])

    return params, batch, loss_fn


rhos = st.floats(0.0, 0.5)
alphas = st.floats(0.0, 1.0)
units = st.floats(0.0, 1.0)


@st.composite
def estimators(draw):
    rho, rho_p, alpha = draw(rhos), draw(rhos), draw(alphas)
    return draw(
        st.sampled_from(
            [
                gamfunc.gradient(),
                gamfunc.sam(rho),
                gamfunc.gnp(alpha, hvp=draw(st.sampled_from(["exact", "reverse", "fd"]))),
                gamfunc.gam(rho, alpha, hvp=draw(st.sampled_from(["exact", "reverse", "fd"]))),
                gamfunc.gam(rho, alpha, oracle=gamfunc.sam(rho_p)),
                gamfunc.gam_accelerated(
                    rho,
                    rho_p,
                    draw(units),
                    draw(units),
                    draw(st.floats(0.0, 2.0)),
                    convention=draw(st.sampled_from(["paper", "official"])),
                ),
            ]
        )
    )


@SETTINGS
@given(problems(), estimators())
def test_directions_are_finite_with_the_right_shapes_and_inputs_untouched(problem, est):
    params, batch, loss_fn = problem
    before = {k: v.clone() for k, v in params.items()}
    x_before = batch[0].clone()
    d, info = est(params, batch, loss_fn)
    assert d.keys() == params.keys()
    for k in params:
        assert d[k].shape == params[k].shape and d[k].dtype == params[k].dtype
        assert torch.isfinite(d[k]).all()
        assert torch.equal(params[k], before[k])
    assert torch.equal(batch[0], x_before)
    assert all(torch.isfinite(v) for v in info.values())


@SETTINGS
@given(problems(), rhos, st.sampled_from(["exact", "reverse", "fd"]))
def test_gam_with_zero_alpha_equals_its_oracle(problem, rho, hvp):
    params, batch, loss_fn = problem
    for oracle in (gamfunc.gradient(), gamfunc.sam(rho)):
        d, _ = gamfunc.gam(rho, 0.0, hvp=hvp, oracle=oracle)(params, batch, loss_fn)
        ref, _ = oracle(params, batch, loss_fn)
        assert all(torch.equal(d[k], ref[k]) for k in d)


@SETTINGS
@given(problems())
def test_sam_with_zero_rho_equals_the_gradient(problem):
    params, batch, loss_fn = problem
    d, _ = gamfunc.sam(0.0)(params, batch, loss_fn)
    ref, _ = gamfunc.gradient()(params, batch, loss_fn)
    assert all(torch.equal(d[k], ref[k]) for k in d)
