"""Property tests over random small MLPs, batches and in-range hyperparameters."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import gamfunc
from gamfunc import tree
from gamfunc.wrappers.accumulate import accumulate

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
                gamfunc.asam(rho, eta=draw(st.floats(0.0, 1.0))),
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


def rel(a, b):
    return float(tree.norm(tree.sub(a, b)) / tree.norm(b).clamp_min(1e-300))


def tolerance(params):
    return 1e-10 if next(iter(params.values())).dtype == torch.float64 else 1e-4


@SETTINGS
@given(problems(), rhos, st.floats(0.0, 2.0), st.sampled_from(["exact", "reverse", "fd"]))
def test_gam_direction_is_linear_in_alpha_with_a_fixed_oracle(problem, rho, alpha, hvp):
    """d(α) = h_loss + α·h_norm: d(α) = d(0) + α·(d(1) − d(0)) (Algorithm 1, line 8)."""
    params, batch, loss_fn = problem
    for oracle in (gamfunc.gradient(), gamfunc.sam(rho)):
        d0, d1, d = (
            gamfunc.gam(rho, a, hvp=hvp, oracle=oracle)(params, batch, loss_fn)[0]
            for a in (0.0, 1.0, alpha)
        )
        line = tree.axpy(alpha, tree.sub(d1, d0), d0)
        assert rel(d, line) < tolerance(params)


@st.composite
def optimizers(draw):
    return draw(
        st.sampled_from(
            [
                gamfunc.sgd(lr=0.1, momentum=0.9, weight_decay=1e-3),
                gamfunc.adamw(lr=1e-2),
                gamfunc.chain(gamfunc.clip_by_global_norm(0.5), gamfunc.sgd(lr=0.1, momentum=0.5)),
            ]
        )
    )


def buffered(loss_fn):
    """``loss_fn`` in the buffered form, with a running mean of the inputs as its buffer."""

    def loss(params, batch, buffers):
        mean = 0.9 * buffers["mean"] + 0.1 * batch[0].mean(0)
        return loss_fn(params, batch), {"mean": mean, "count": buffers["count"] + 1}

    return loss


def bit_identical(a, b):
    """Two pytrees (dicts, step states) of one structure with bit-identical tensors."""
    (la, sa), (lb, sb) = (torch.utils._pytree.tree_flatten(t) for t in (a, b))
    return sa == sb and all(torch.equal(x, y) for x, y in zip(la, lb, strict=True))


@SETTINGS
@given(problems(), estimators(), optimizers(), st.sampled_from(["nan", "inf"]))
def test_a_skipped_step_leaves_params_state_and_buffers_bit_identical(problem, est, opt, bad):
    params, batch, loss_fn = problem
    step = gamfunc.make_step(est, opt, buffered(loss_fn))
    buffers = {"mean": torch.zeros_like(batch[0][0]), "count": torch.zeros((), dtype=torch.int64)}
    params, state, _ = step(params, step.init(params, buffers), batch)
    poisoned = (batch[0] * float(bad), batch[1])
    new_params, new_state, metrics = step(params, state, poisoned)
    assert int(metrics["skipped"]) == 1
    assert bit_identical(new_params, params)
    assert int(new_state.skipped) == int(state.skipped) + 1
    assert bit_identical(new_state._replace(skipped=state.skipped), state)


@SETTINGS
@given(problems(), estimators(), st.data())
def test_accumulation_over_random_k_equals_the_full_batch(problem, est, data):
    params, batch, loss_fn = problem
    params = {k: v.double() for k, v in params.items()}
    batch = (batch[0].double(), batch[1])
    k = data.draw(st.integers(1, batch[0].shape[0]), label="micro_batches")
    d, info = est(params, batch, accumulate(loss_fn, k))
    ref, ref_info = est(params, batch, loss_fn)
    assert rel(d, ref) < 1e-10
    assert all(torch.allclose(info[n], ref_info[n], rtol=1e-10, atol=1e-12) for n in ref_info)


@pytest.mark.slow
@settings(max_examples=4, deadline=None, derandomize=True)
@given(problems(), estimators(), optimizers())
def test_compiled_step_equals_eager(problem, est, opt):
    """Dynamo captures a random composition whole (the backend that replays the capture op by op:
    the compilers' lowering of each pass is test_contract's)."""
    params, batch, loss_fn = problem
    step = gamfunc.make_step(est, opt, loss_fn)
    compiled = torch.compile(step, fullgraph=True, backend="eager")
    eager_p, eager_s, comp_p, comp_s = params, step.init(params), params, step.init(params)
    for _ in range(2):
        eager_p, eager_s, eager_m = step(eager_p, eager_s, batch)
        comp_p, comp_s, comp_m = compiled(comp_p, comp_s, batch)
    assert rel(comp_p, eager_p) < tolerance(params)
    assert torch.allclose(comp_m["loss"], eager_m["loss"], rtol=tolerance(params))
