"""Inductor compiles a full GAM step, with its default loop ordering, and the result equals eager.

The regression test for issue 5's compile failure: on torch 2.11 (CUDA), ``torch.compile(fullgraph=True)``
of finite-difference GAM stopped with an ``InductorError`` in ``Scheduler.reorder_loops_by_dep_pair``
(``assert isinstance(snode, SchedulerNode)``), and the only way through was
``torch._inductor.config.loop_ordering_after_fusion = False`` (``python -m benchmarks.step_cost
--no-loop-reorder``). The assertion is inductor's and matches pytorch/pytorch#176591: a
``ForeachKernelSchedulerNode`` (``torch._foreach_*`` kernels, as in :mod:`gamfunc.tree`) fused with
per-tensor reductions over tensors of different shapes can hold another foreach node, which
``FusedSchedulerNode.reorder_loops_by_dep_pair`` asserted against; pytorch/pytorch#176849 made it
return "no reordering" instead (torch 2.14.1 has that code).
These tests compile with the default ``loop_ordering_after_fusion = True`` and with inductor's
caches off, so that the scheduler really runs.

Warning:
    On CPU the failure cannot reproduce: inductor skips loop reordering for CPU kernels
    (``Scheduler.shared_data_after_reordering_loop`` returns early for them). The CPU test still checks
    that the whole step compiles to one graph and matches eager; the ``gpu`` tests are the ones that
    would catch the assertion coming back.
"""

from __future__ import annotations

import pytest
import torch
import torch._functorch.config
import torch._inductor.config
from models import CifarResNet, tiny_conv_bn
from torch._dynamo.utils import counters

import gamfunc
from gamfunc import tree


def estimator(name):
    if name == "gam_fd":
        return gamfunc.gam(rho=0.05, alpha=0.5, hvp=gamfunc.hvps.fd(radius=1e-3))
    # Algorithm 2 adds ⟨h−, ĥ+⟩: per-tensor sums next to the foreach kernels, the pattern of #176591.
    return gamfunc.gam_accelerated(0.05, 0.02, alpha=0.5, beta=0.5, gamma=0.2)


# f_norm = ‖(∇L(θ + r·v) − ∇L(θ))/r‖ is itself the difference quotient: float32 rounding of the
# gradients (~1e-7·‖∇L‖) divided by r = 1e-3 moves it by ~1e-4·‖∇L‖, ~1e-4 of f_norm here. On one
# CPU thread (the suite's workers) the compiled and eager values differ by 1.8e-4 of it at step 3,
# and the eager float32 value is 5e-5 of it from the float64 one; the parameters, whose update takes
# f/‖f‖, agree to 1e-4.
QUOTIENT_TOL = {"rtol": 1e-3, "atol": 1e-5}


def compiled_equals_eager(device: torch.device, name: str, direct: bool = False) -> None:
    torch.manual_seed(0)
    loss_fn, params, buffers = gamfunc.nn.functionalize(tiny_conv_bn().to(device))
    gen = torch.Generator().manual_seed(1)
    batches = [
        (torch.randn(8, 3, 6, 6, generator=gen), torch.randint(0, 5, (8,), generator=gen))
        for _ in range(3)
    ]
    batches = [(x.to(device), y.to(device)) for x, y in batches]
    step = gamfunc.make_step(estimator(name), gamfunc.sgd(lr=0.1, momentum=0.9), loss_fn)
    graphs = counters["stats"]["unique_graphs"]
    cache_hits = (
        counters["inductor"]["fxgraph_cache_hit"],
        counters["aot_autograd"]["autograd_cache_hit"],
    )
    with (
        torch._inductor.config.patch(loop_ordering_after_fusion=True, fx_graph_cache=False),
        torch._functorch.config.patch(enable_autograd_cache=False),
        # True fp32 convolutions: the finite difference divides TF32 rounding by r = 1e-3.
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False),
    ):
        # step.compile() carries gamfunc's scoped workaround on torch < 2.14; a direct torch.compile
        # runs inductor exactly as configured.
        compiled = torch.compile(step, fullgraph=True) if direct else step.compile(fullgraph=True)
        p_c, s_c = params, step.init(params, buffers)
        p_e, s_e = params, step.init(params, buffers)
        for batch in batches:
            p_c, s_c, m_c = compiled(p_c, s_c, batch)
            p_e, s_e, m_e = step(p_e, s_e, batch)
    assert counters["stats"]["unique_graphs"] - graphs == 1  # one graph, compiled once
    # ... by inductor's scheduler, not loaded from a cache.
    assert (
        counters["inductor"]["fxgraph_cache_hit"],
        counters["aot_autograd"]["autograd_cache_hit"],
    ) == cache_hits
    # float32, three steps: kernels fused and reassociated by inductor round differently, and
    # rounding in ∇L(θ + r·v) − ∇L(θ) is divided by r = 1e-3 in the finite difference.
    tol = {"rtol": 1e-4, "atol": 1e-5}
    for k in params:
        torch.testing.assert_close(p_c[k], p_e[k], **tol)
    for k in buffers:
        torch.testing.assert_close(s_c.buffers[k], s_e.buffers[k], **tol)
    momentum_c, momentum_e = (s.opt.inner.states[0].momentum_buffer for s in (s_c, s_e))
    assert momentum_e.keys() == params.keys()
    for k in momentum_e:
        torch.testing.assert_close(momentum_c[k], momentum_e[k], **tol)
    for k in m_e:
        torch.testing.assert_close(m_c[k], m_e[k], **(QUOTIENT_TOL if k == "f_norm" else tol))


@pytest.mark.slow
def test_fd_gam_step_compiles_fullgraph_and_matches_eager_cpu():
    compiled_equals_eager(torch.device("cpu"), "gam_fd")


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("name", ["gam_fd", "gam_accelerated"])
def test_gam_step_compiles_fullgraph_and_matches_eager_cuda(name):
    compiled_equals_eager(torch.device("cuda"), name)


OLD_TORCH = gamfunc.compile.loop_reordering_asserts()


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.xfail(
    OLD_TORCH,
    reason="inductor's loop-reordering assertion (pytorch/pytorch#176591) on torch < 2.14",
    raises=torch._inductor.exc.InductorError,
    strict=True,
)
def test_accelerated_gam_compiles_with_inductor_defaults_cuda():
    """Without gamfunc's workaround: fails on torch < 2.14 (strict xfail: when it passes there, the
    workaround can go), must compile on 2.14 and later (if it fails there, the bug came back).

    The tiny model of the tests above does not trip the assertion; the CIFAR ResNet-18 does (seen on
    an H200 with torch 2.11)."""
    torch._dynamo.reset()
    resnet18 = CifarResNet([2, 2, 2, 2], num_classes=10)  # reproduce/'s CIFAR ResNet-18
    loss_fn, params, buffers = gamfunc.nn.functionalize(resnet18.cuda())
    step = gamfunc.make_step(estimator("gam_accelerated"), gamfunc.sgd(lr=0.1), loss_fn)
    batch = (torch.randn(16, 3, 32, 32, device="cuda"), torch.randint(0, 10, (16,), device="cuda"))
    with torch._inductor.config.patch(loop_ordering_after_fusion=True, fx_graph_cache=False):
        *_, metrics = torch.compile(step, fullgraph=True)(params, step.init(params, buffers), batch)
    assert torch.isfinite(metrics["loss"])


@pytest.mark.gpu
@pytest.mark.slow
def test_tree_math_mixing_foreach_kernels_and_reductions_compiles_cuda():
    """The shape of pytorch/pytorch#176591 in gamfunc's own terms: foreach kernels (axpy, scale, norm)
    and per-tensor sums (vdot) over tensors of different shapes, in one graph."""
    gen = torch.Generator().manual_seed(0)
    shapes = {"conv": (4, 3, 3, 3), "bias": (4,), "fc": (5, 16), "fc_bias": (5,)}
    a = {k: torch.randn(s, generator=gen).cuda() for k, s in shapes.items()}
    b = {k: torch.randn(s, generator=gen).cuda() for k, s in shapes.items()}

    def f(a, b):
        c = tree.axpy(0.1, a, b)
        d = tree.axpy(-tree.vdot(a, c), a, c)
        return tree.normalize(d)[0], tree.norm(d)

    with torch._inductor.config.patch(loop_ordering_after_fusion=True, fx_graph_cache=False):
        got = torch.compile(f, fullgraph=True)(a, b)
    torch.testing.assert_close(got, f(a, b))
