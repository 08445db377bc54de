"""Regional compilation (``step.compile(scope="pass")``): the same step as eager, one compiled graph per
kind of pass, and no recompilation as lr, ρ or the state change."""

from __future__ import annotations

import pytest
import torch
from models import tiny_conv_bn
from torch._dynamo.testing import CompileCounter

import gamfunc
from gamfunc import schedules

ESTIMATORS = {
    "gradient": (lambda: gamfunc.gradient(), 1),
    "sam": (lambda: gamfunc.sam(schedules.cosine(0.05, 10)), 1),
    "gnp": (lambda: gamfunc.gnp(0.1), 1),
    "gam_fd": (lambda: gamfunc.gam(schedules.cosine(0.05, 10), 0.5, hvp="fd"), 1),
    "gam_exact": (lambda: gamfunc.gam(schedules.cosine(0.05, 10), 0.5, hvp="exact"), 1),
    "gam_reverse": (lambda: gamfunc.gam(0.05, 0.5, hvp="reverse"), 1),
    "gnp_exact": (lambda: gamfunc.gnp(0.1, hvp="exact"), 1),
    "gam_accelerated": (lambda: gamfunc.gam_accelerated(0.05, 0.02, 0.5, 0.5, 0.2), 1),
    "sam_gam": (lambda: gamfunc.gam(0.05, 0.5, hvp="fd", oracle=gamfunc.sam(0.05)), 1),
    # SAM's gradient at θ + ε and GAM's two points: a gradient pass and a point pass
    "sam_gam_exact": (lambda: gamfunc.gam(0.05, 0.5, oracle=gamfunc.sam(0.05)), 2),
}


def conv_bn(dtype=torch.float64, device="cpu", elementary=False):
    torch.manual_seed(0)
    model = tiny_conv_bn().to(device, dtype)
    if elementary:
        model = gamfunc.nn.elementary_norms(model)
    gen = torch.Generator().manual_seed(1)
    batches = [
        (
            torch.randn(8, 3, 6, 6, generator=gen, dtype=dtype).to(device),
            torch.randint(0, 5, (8,), generator=gen).to(device),
        )
        for _ in range(4)
    ]
    return (*gamfunc.nn.functionalize(model), batches)


def run(step, params, buffers, batches):
    state = step.init(params, buffers)
    for batch in batches:
        params, state, metrics = step(params, state, batch)
    return params, state, metrics


def assert_same(a, b, **tol):
    """Equal pytrees of tensors (bit for bit unless a tolerance is given); NaN equals NaN, the value
    of a metric that a branch of ``every=k`` did not compute."""
    flat_a, spec_a = torch.utils._pytree.tree_flatten(a)
    flat_b, spec_b = torch.utils._pytree.tree_flatten(b)
    assert spec_a == spec_b
    for x, y in zip(flat_a, flat_b, strict=True):
        torch.testing.assert_close(x, y, **(tol or {"rtol": 0, "atol": 0}), equal_nan=True)


@pytest.mark.parametrize("name", ESTIMATORS)
def test_pass_scope_is_the_eager_step_with_one_graph_per_kind_of_pass(name):
    make, graphs = ESTIMATORS[name]
    loss_fn, params, buffers, batches = conv_bn()
    lr = schedules.cosine(0.1, 10)  # lr and ρ change at every step
    step = gamfunc.make_step(make(), gamfunc.sgd(lr, momentum=0.9), loss_fn)
    counter = CompileCounter()  # dynamo only: the captured graphs replay the eager ops
    fast = step.compile(scope="pass", backend=counter)
    # The eager step forms its gradients with torch.autograd.grad, the compiled passes with
    # torch.func.grad: the same numbers, so bit-identical.
    assert_same(run(fast, params, buffers, batches), run(step, params, buffers, batches))
    assert counter.frame_count == graphs  # compiled at the first step, never again


def test_pass_scope_with_every_k_compiles_the_gradient_pass_once():
    loss_fn, params, buffers, batches = conv_bn()
    step = gamfunc.make_step(gamfunc.gam(0.05, 0.5, hvp="fd"), gamfunc.sgd(0.1), loss_fn, every=2)
    counter = CompileCounter()
    fast = step.compile(scope="pass", backend=counter)
    assert_same(run(fast, params, buffers, batches), run(step, params, buffers, batches))
    assert counter.frame_count == 1  # both branches call the same gradient pass


def test_pass_scope_keeps_fp16_loss_scale_and_accumulation():
    loss_fn, params, buffers, batches = conv_bn()
    for objective in (
        gamfunc.precision.fp16(loss_fn, init_scale=2.0**4),
        gamfunc.accumulate.accumulate(loss_fn, 2),
    ):
        step = gamfunc.make_step(gamfunc.gam(0.05, 0.5, hvp="fd"), gamfunc.sgd(0.1), objective)
        counter = CompileCounter()
        fast = step.compile(scope="pass", backend=counter)
        assert_same(run(fast, params, buffers, batches), run(step, params, buffers, batches))
        assert counter.frame_count == 1


def test_compiled_passes_fall_back_inside_a_transform_and_a_compiled_step():
    loss_fn, params, buffers, batches = conv_bn()
    counter = CompileCounter()
    fast = gamfunc.regional.compile_passes(loss_fn, backend=counter)
    step = gamfunc.make_step(gamfunc.sam(0.05), gamfunc.sgd(0.1), loss_fn)
    step_fast = gamfunc.make_step(gamfunc.sam(0.05), gamfunc.sgd(0.1), fast)
    # A whole-step compile traces straight through the objective: one graph, no nested compile.
    whole = torch.compile(step_fast, fullgraph=True, backend=counter)
    assert_same(run(whole, params, buffers, batches[:2]), run(step, params, buffers, batches[:2]))
    assert counter.frame_count == 1
    # Under vmap (m-sharpness runs its sub-batches so), the plain gradient pass.
    plain = lambda p, b: torch.tanh(b[0].flatten(1) @ p["w"]).pow(2).mean()  # noqa: E731
    p = {"w": torch.randn(108, 3, dtype=torch.float64)}
    est = gamfunc.m_sharpness.m_sharpness(gamfunc.sam(0.05), 2, vectorize=True)
    counter = CompileCounter()
    got = est(p, batches[0], gamfunc.regional.compile_passes(plain, backend=counter))
    assert_same(got, est(p, batches[0], plain))
    assert counter.frame_count == 0


def test_compiled_passes_is_the_loss_outside_a_step():
    loss_fn, params, buffers, batches = conv_bn()
    fast = gamfunc.regional.compile_passes(loss_fn, backend=CompileCounter())
    assert_same(fast(params, batches[0], buffers), loss_fn(params, batches[0], buffers))
    plain = lambda p, b: ((b[0].flatten(1) @ p["w"]) ** 2).mean()  # noqa: E731
    p = {"w": torch.randn(108, dtype=torch.float64)}
    # AOTAutograd's graphs, replayed: inductor's kernels are test_pass_scope_with_inductor's
    compiled = gamfunc.regional.compile_passes(plain, backend="aot_eager")
    d, info = gamfunc.gam(0.05, 0.5)(p, batches[0], compiled)
    d_ref, info_ref = gamfunc.gam(0.05, 0.5)(p, batches[0], plain)
    assert_same((d, info), (d_ref, info_ref), rtol=1e-12, atol=1e-14)


def test_step_compile_scope_is_checked():
    step = gamfunc.make_step(gamfunc.gradient(), gamfunc.sgd(0.1), lambda p, b: p["w"].sum())
    with pytest.raises(ValueError, match="scope"):
        step.compile(scope="layer")


@pytest.mark.slow
def test_pass_scope_with_inductor_matches_eager_cpu():
    """Inductor's kernels: equal to eager to float64 rounding, fd GAM and exact GAM. Exact GAM's
    BatchNorm in elementary operations, as reproduce/ compiles it: the pass's ∇L and H·∇L/‖∇L‖ then
    share their gradient (`gamfunc.graph_sharing`, on by default)."""
    for hvp in ("fd", "exact"):
        loss_fn, params, buffers, batches = conv_bn(elementary=hvp == "exact")
        step = gamfunc.make_step(gamfunc.gam(0.05, 0.5, hvp=hvp), gamfunc.sgd(0.1), loss_fn)
        got = run(step.compile(scope="pass"), params, buffers, batches[:2])
        assert_same(got, run(step, params, buffers, batches[:2]), rtol=1e-9, atol=1e-11)


@pytest.mark.gpu
@pytest.mark.slow
# CUDA-graph trees capture an empty graph when they set up their memory pool (torch 2.11).
@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty")
@pytest.mark.parametrize("hvp", ["fd", "exact"])
def test_pass_scope_with_cuda_graphs_matches_eager_cuda(hvp):
    """Each pass a CUDA-graph replay of one graph, four (fd) or two kinds of replays per step: the
    results are copied out, so a later replay overwrites none of them."""
    loss_fn, params, buffers, batches = conv_bn(device="cuda")
    step = gamfunc.make_step(gamfunc.gam(0.05, 0.5, hvp=hvp), gamfunc.sgd(0.1), loss_fn)
    got = run(step.compile(scope="pass", mode="reduce-overhead"), params, buffers, batches)
    assert_same(got, run(step, params, buffers, batches), rtol=1e-9, atol=1e-11)
