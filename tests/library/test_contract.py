"""Contracts that hold for every estimator and optimiser: purity, dtype and device, determinism,
torch.compile(fullgraph=True), no recompilation as hyperparameters change, and argument checks."""

import warnings

import pytest
import torch
from helpers import mlp_batch, mlp_loss, mlp_params, quadratic, split
from models import tiny_bn_mlp, vector_batch
from registry import ESTIMATORS, INVALID, OPTIMIZERS

import gamfunc
from gamfunc import schedules


def snapshot(tensors):
    return {k: v.clone() for k, v in tensors.items()}


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name", ESTIMATORS)
def test_estimator_is_pure_deterministic_and_keeps_dtype(name):
    est = ESTIMATORS[name]()
    for dtype in (torch.float32, torch.float64):
        params, batch = mlp_params(dtype), mlp_batch(dtype=dtype)
        before, x_before = snapshot(params), batch[0].clone()
        d1, info1 = est(params, batch, mlp_loss)
        d2, info2 = est(params, batch, mlp_loss)
        assert same(params, before) and torch.equal(batch[0], x_before)
        assert same(d1, d2) and all(torch.equal(info1[k], info2[k]) for k in info1)
        assert d1.keys() == params.keys()
        for k in params:
            assert d1[k].dtype == dtype and d1[k].shape == params[k].shape
            assert d1[k].device == params[k].device
            assert torch.isfinite(d1[k]).all()
        assert "loss" in info1 and all(v.ndim == 0 for v in info1.values())


# RWP's direction at a stationary point is the gradient at a random neighbour, not 0.
RANDOM = {"rwp"}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", [n for n in ESTIMATORS if n not in RANDOM])
def test_estimator_at_a_zero_gradient_gives_a_finite_direction(name, dtype):
    """At θ = θ* of a quadratic, ∇L = 0 exactly: ξ keeps every normalisation finite, also where
    ξ = 1e-12 rounds to 0 in the parameters' dtype (norms and ξ are summed in float32 or wider)."""
    loss_fn, _, theta_star = quadratic(dtype=dtype)
    d, info = ESTIMATORS[name]()(split(theta_star.clone()), None, loss_fn)
    assert all(v.dtype == dtype for v in d.values())
    assert all(torch.isfinite(v).all() and (v == 0).all() for v in d.values())
    assert all(torch.isfinite(v) for v in info.values())


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_optimizer_is_pure_and_keeps_dtype(name):
    opt = OPTIMIZERS[name]()
    for dtype in (torch.float32, torch.float64):
        params = mlp_params(dtype)
        direction = mlp_params(dtype, seed=5)
        state = opt.init(params)
        before, d_before = snapshot(params), snapshot(direction)
        zero = torch.tensor(0)
        updates, new_state = gamfunc.optim.call_update(opt, direction, state, params, zero)
        new = gamfunc.apply_updates(params, updates)
        assert same(params, before) and same(direction, d_before)
        assert type(new_state) is type(state)
        assert all(new[k].dtype == dtype and new[k].shape == params[k].shape for k in params)
        updates2, _ = gamfunc.optim.call_update(opt, direction, state, params, zero)
        assert same(updates, updates2)
        assert all(updates[k].dtype == dtype for k in params)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_direction_with_other_keys_is_a_clear_error(name):
    opt = OPTIMIZERS[name]()
    params = mlp_params()
    direction = {k: v for k, v in mlp_params(seed=3).items() if k != "b2"}
    with pytest.raises((ValueError, KeyError), match="b2"):
        gamfunc.optim.call_update(opt, direction, opt.init(params), params, torch.tensor(0))


@pytest.mark.parametrize(
    ("factory", "kwargs", "arg"),
    INVALID,
    ids=[f"{i}-{f.__name__}-{arg}" for i, (f, _, arg) in enumerate(INVALID)],
)
def test_invalid_hyperparameters_raise_value_error_naming_the_argument(factory, kwargs, arg):
    with pytest.raises(ValueError, match=arg):
        factory(**kwargs)


def test_bad_loss_and_params_give_clear_errors():
    params, batch = mlp_params(), mlp_batch()
    est = gamfunc.gam(0.05, 0.1)
    with pytest.raises(ValueError, match="scalar"):
        est(params, batch, lambda p, b: mlp_loss(p, b).expand(3))
    with pytest.raises(TypeError, match="floating"):
        est(params, batch, lambda p, b: mlp_loss(p, b).long())
    with pytest.raises(TypeError, match="params"):
        est([params["w1"]], batch, mlp_loss)
    with pytest.raises(TypeError, match="floating"):
        est({**params, "n": torch.ones(2, dtype=torch.int64)}, batch, mlp_loss)
    step = gamfunc.make_step(est, gamfunc.sgd(lr=0.1), mlp_loss)
    with pytest.raises(TypeError, match="params"):
        step.init([params["w1"]])


# ---- torch.compile -------------------------------------------------------------------------------

# Dynamo's capture of each estimator's step, whole (fullgraph), replayed op by op by the eager
# backend; exact GAM's also through AOTAutograd (aot_eager), whose functionalization of
# forward-mode AD is its own. Inductor lowers exact GAM's pass in test_regional, a whole step of
# gradient passes (fd GAM) in test_compile_regression, and every estimator's step on the GPU check:
# on the CPU each inductor graph builds its C++ kernels, about 2 s of g++ each.
AOT = {"gam_exact"}


@pytest.mark.slow
@pytest.mark.parametrize("name", ESTIMATORS)
def test_compiled_step_with_batchnorm_equals_eager(name):
    torch._dynamo.reset()
    model = tiny_bn_mlp()
    loss_fn, params, buffers = gamfunc.nn.functionalize(model)
    step = gamfunc.make_step(ESTIMATORS[name](), gamfunc.sgd(lr=0.1, momentum=0.9), loss_fn)
    backend = "aot_eager" if name in AOT else "eager"
    compiled = torch.compile(step, fullgraph=True, backend=backend)
    eager_p, eager_s = params, step.init(params, buffers)
    comp_p, comp_s = params, step.init(params, buffers)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Dynamo's notices
        for i in range(2):
            batch = vector_batch(seed=i)
            eager_p, eager_s, eager_m = step(eager_p, eager_s, batch)
            comp_p, comp_s, comp_m = compiled(comp_p, comp_s, batch)
    for k in params:
        torch.testing.assert_close(comp_p[k], eager_p[k], rtol=1e-5, atol=1e-6)
    for k in buffers:
        torch.testing.assert_close(comp_s.buffers[k], eager_s.buffers[k], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(comp_s.est, eager_s.est, rtol=1e-5, atol=1e-6)  # LookSAM's, ...
    torch.testing.assert_close(comp_m["loss"], eager_m["loss"], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_changing_lr_and_rho_every_step_does_not_recompile():
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    lr = schedules.cosine(0.1, total_steps=20)
    rho = schedules.proportional(0.05, lr, 0.1)
    step = gamfunc.make_step(
        gamfunc.gam(rho, 0.1, hvp="fd"), gamfunc.sgd(lr=lr, momentum=0.9), mlp_loss
    )
    compiled = torch.compile(step, fullgraph=True, backend=counter)
    params, state = mlp_params(torch.float32), step.init(mlp_params(torch.float32))
    rhos = []
    for i in range(6):
        params, state, metrics = compiled(params, state, mlp_batch(dtype=torch.float32, seed=i))
        rhos.append(float(metrics["rho"]))
    assert counter.frame_count == 1
    assert len(set(rhos)) == 6  # the values did change

    # a constant lr overwritten in the state between steps: no recompilation either
    torch._dynamo.reset()
    counter = CompileCounter()
    step = gamfunc.make_step(gamfunc.sam(0.05), gamfunc.sgd(lr=0.1), mlp_loss)
    compiled = torch.compile(step, fullgraph=True, backend=counter)
    state = step.init(params)
    for i in range(4):
        lr = torch.tensor(0.1 / (i + 1), dtype=torch.float64)
        state = state._replace(opt=gamfunc.set_hyperparams(state.opt, lr=lr))
        params, state, metrics = compiled(params, state, mlp_batch(dtype=torch.float32, seed=i))
        assert float(metrics["lr"]) == pytest.approx(0.1 / (i + 1))
    assert counter.frame_count == 1


@pytest.mark.slow
def test_gam_every_k_compiles_two_graphs_and_no_more():
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    step = gamfunc.make_step(
        gamfunc.gam(0.05, 0.1, hvp="fd"), gamfunc.sgd(lr=0.1), mlp_loss, every=3
    )
    compiled = step.compile(fullgraph=True, backend=counter)
    params = mlp_params(torch.float32)
    state = step.init(params)
    eager_p, eager_s = params, state
    for i in range(7):
        batch = mlp_batch(dtype=torch.float32, seed=i)
        params, state, _ = compiled(params, state, batch)
        eager_p, eager_s, _ = step(eager_p, eager_s, batch)
    assert counter.frame_count == 2
    assert same(params, eager_p)


@pytest.mark.slow
def test_many_steps_compile_in_one_process_without_hitting_the_recompile_limit():
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    params, batch = mlp_params(torch.float32), mlp_batch(dtype=torch.float32)
    # A limit of 1 instead of the default 8: going past it takes 3 steps of each kind, not 10, and
    # steps that shared one compiled frame would hit a limit of 1 as surely as one of 8.
    limit = 1
    with torch._dynamo.config.patch(recompile_limit=limit):
        for i in range(limit + 2):
            step = gamfunc.make_step(gamfunc.sam(0.01 * (i + 1)), gamfunc.sgd(lr=0.1), mlp_loss)
            torch.compile(step, fullgraph=True, backend=counter)(params, step.init(params), batch)
            every = gamfunc.make_step(gamfunc.sam(0.05), gamfunc.sgd(lr=0.1), mlp_loss, every=2)
            every.compile(fullgraph=True, backend=counter)(params, every.init(params), batch)
    assert counter.frame_count == 2 * (limit + 2)


@pytest.mark.slow
def test_compiled_step_skips_a_nonfinite_step_without_a_python_branch():
    step = gamfunc.make_step(
        gamfunc.gam(0.05, 0.1, hvp="fd"), gamfunc.sgd(lr=0.1, momentum=0.9), mlp_loss
    )
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    params, batch = mlp_params(torch.float32), mlp_batch(dtype=torch.float32)
    params, state, _ = compiled(params, step.init(params), batch)
    bad = (batch[0] * float("nan"), batch[1])
    new, new_state, metrics = compiled(params, state, bad)
    assert int(metrics["skipped"]) == 1 and int(new_state.skipped) == 1
    assert same(new, params)
    (buf, _), (new_buf, _) = state.opt.inner.states, new_state.opt.inner.states
    assert same(new_buf.momentum_buffer, buf.momentum_buffer)


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


@pytest.fixture
def one_thread():
    """One intra-op thread: the ops of a step of the tiny MLP are too small to share, and on a busy
    machine their threads would only wait on each other (ten times the step's time)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_soak_2000_compiled_steps_no_recompilation_and_flat_memory(one_thread):
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    lr = schedules.cosine(0.05, total_steps=2000, warmup_steps=100)
    rho = schedules.proportional(0.05, lr, 0.05)
    step = gamfunc.make_step(
        gamfunc.gam(rho, 0.1, hvp="fd"), gamfunc.sgd(lr=lr, momentum=0.9), mlp_loss
    )
    compiled = torch.compile(step, fullgraph=True, backend=counter)
    params = mlp_params(torch.float32)
    state = step.init(params)
    batches = [mlp_batch(dtype=torch.float32, seed=i) for i in range(10)]
    rss = {}
    for i in range(2000):
        params, state, metrics = compiled(params, state, batches[i % 10])
        if i in (499, 1999):
            rss[i] = _rss_mib()
    assert counter.frame_count == 1
    assert int(state.step) == 2000 and int(state.skipped) == 0
    assert torch.isfinite(metrics["loss"])
    assert rss[1999] - rss[499] < 20  # MiB: nothing accumulates from step to step


@pytest.mark.parametrize("name", [n for n in ESTIMATORS if n not in ("gradient", *RANDOM)])
def test_every_estimator_that_normalises_names_its_eps_in_hparams(name):
    est = ESTIMATORS[name]()
    assert est.hparams["eps"] == 1e-12
