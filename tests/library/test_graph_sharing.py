"""gamfunc.graph_sharing: a compiled exact-GAM point computes ∇L once.

The point (g = ∇L, then H·g/‖g‖ by ``jvp`` of ``grad``) is traced as inductor traces it (functional,
inductor's decompositions); its matmul and convolution FLOPs are counted before and after the pass,
in units of one gradient pass, and its results must not move."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils.flop_counter import FlopCounterMode

import gamfunc
from gamfunc import tree
from gamfunc.compiling import graph_sharing
from gamfunc.compiling.compile import compile_with
from gamfunc.compiling.graph_sharing import share_equal_work
from gamfunc.loss import grad_fn

decomp = pytest.importorskip("torch._inductor.decomposition")


def conv_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.GELU(),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 6 * 6, 5),
    ).double()


def attention_net():
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(6)
            self.qkv = torch.nn.Linear(6, 18)
            self.head = torch.nn.Linear(6 * 4, 5)

        def forward(self, x):
            tokens = x.reshape(x.shape[0], 18, 6)[:, :4]
            q, k, v = self.qkv(self.norm(tokens)).chunk(3, -1)
            attn = gamfunc.nn.elementary_softmax(q @ k.transpose(-2, -1), -1)
            return self.head((attn @ v).flatten(1))

    return Net().double()


def point(loss_fn):
    """g and H·g/‖g‖ at θ: a gradient pass, then forward-over-reverse at the unit gradient."""

    def at(params, batch, buffers):
        loss = lambda p, b: loss_fn(p, b, buffers)  # noqa: E731
        g, _ = grad_fn(loss, batch)(params)
        u = tree.scale(g, tree.norm(g).reciprocal())
        _, hv, _ = torch.func.jvp(grad_fn(loss, batch), (params,), (u,), has_aux=True)
        return g, hv

    return at


def gradient(loss_fn):
    return lambda params, batch, buffers: grad_fn(lambda p, b: loss_fn(p, b, buffers), batch)(
        params
    )[0]


def flops(fn, *args) -> int:
    with FlopCounterMode(display=False) as counter:
        fn(*args)
    return counter.get_total_flops()


def traced(fn, *args, share: bool):
    """``fn`` as inductor receives it after autograd, optionally with the pass applied."""
    gm = make_fx(
        torch.func.functionalize(fn, remove="mutations_and_views"),
        tracing_mode="fake",
        decomposition_table=decomp.select_decomp_table(),
    )(*args)
    if share:
        share_equal_work(gm.graph)
        gm.recompile()
    return gm


def setup(net):
    model = net()
    loss_fn, params, buffers = gamfunc.nn.functionalize(model)
    batch = (torch.randn(4, 3, 6, 6, dtype=torch.float64), torch.randint(0, 5, (4,)))
    return loss_fn, params, buffers, batch


@pytest.mark.parametrize("net", [conv_net, attention_net], ids=["batchnorm", "layernorm_softmax"])
def test_with_elementary_norms_a_shared_point_costs_three_gradient_passes(net):
    def elementary():
        return gamfunc.nn.elementary_norms(net())

    loss_fn, params, buffers, batch = setup(elementary)
    unit = flops(gradient(loss_fn), params, batch, buffers)
    fn = point(loss_fn)
    plain = traced(fn, params, batch, buffers, share=False)
    shared = traced(fn, params, batch, buffers, share=True)
    assert flops(plain, params, batch, buffers) == 4 * unit  # the jvp recomputes ∇L as its primal
    assert (
        flops(shared, params, batch, buffers) == 3 * unit
    )  # ∇L once, then the tangent's two passes
    for a, b in zip(fn(params, batch, buffers), shared(params, batch, buffers), strict=True):
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=1e-10, atol=1e-12)


def test_with_fused_batchnorm_the_backward_is_not_shared():
    """jvp differentiates native_batch_norm_backward through a decomposition that recomputes the
    batch statistics, so only the forward pass can be shared: the reason for elementary_norms."""
    loss_fn, params, buffers, batch = setup(conv_net)
    unit = flops(gradient(loss_fn), params, batch, buffers)
    shared = traced(point(loss_fn), params, batch, buffers, share=True)
    assert 3 * unit < flops(shared, params, batch, buffers) < 4 * unit


def test_random_operations_and_outputs_are_never_merged():
    def fn(x):
        a = torch.nn.functional.dropout(x, 0.5, training=True)
        b = torch.nn.functional.dropout(x, 0.5, training=True)
        return a, b, x.clone(), (x * 2).sin(), (x * 2).sin()

    x = torch.randn(64)
    gm = make_fx(torch.func.functionalize(fn, remove="mutations_and_views"))(x)
    share_equal_work(gm.graph)
    gm.recompile()
    a, b, c, d, e = gm(x)
    assert not torch.equal(a, b)  # two draws stay two draws
    assert c is not x and torch.equal(c, x)  # an output never becomes an alias of an input
    assert torch.equal(d, e) and d is not e
    sins = [n for n in gm.graph.nodes if n.target == torch.ops.aten.sin.default]
    muls = [n for n in gm.graph.nodes if n.target == torch.ops.aten.mul.Tensor]
    assert len(sins) == 2 and len(muls) <= 3  # x * 2 computed once (dropout's masks multiply too)


def test_compile_with_installs_the_pass_unless_the_caller_has_one():
    seen = {}

    def spy(**kwargs):
        seen.update(kwargs)
        return lambda fn: fn

    original = torch.compile
    try:
        torch.compile = lambda fn, **kw: spy(**kw)(fn)
        compile_with(True, None, {})(lambda x: x)
        # read now: a test that reloads gamfunc.graph_sharing makes a new pass object
        assert seen["options"]["post_grad_custom_pre_pass"] is graph_sharing.share_equal_work_pass()
        mine = object()
        compile_with(True, None, {"options": {"post_grad_custom_pre_pass": mine}})(lambda x: x)
        assert seen["options"]["post_grad_custom_pre_pass"] is mine
    finally:
        torch.compile = original


def test_equal_work_with_another_layout_is_not_merged():
    """Two nodes of the same op on the same inputs are one tensor only if their results also share
    shape, strides and storage offset: a value's layout is part of its merge key."""
    x = torch.randn(4, 6)
    gm = make_fx(lambda t: (t.sin() + 1, t.sin() + 1))(x)
    sins = [n for n in gm.graph.nodes if n.target == torch.ops.aten.sin.default]
    assert len(sins) == 2
    val = sins[1].meta["val"]
    sins[1].meta["val"] = val.as_strided(val.shape, val.stride(), 1)  # another storage offset
    share_equal_work(gm.graph)
    assert len([n for n in gm.graph.nodes if n.target == torch.ops.aten.sin.default]) == 2
    sins[1].meta["val"] = val.t().contiguous().t()  # same shape, other strides
    share_equal_work(gm.graph)
    assert len([n for n in gm.graph.nodes if n.target == torch.ops.aten.sin.default]) == 2
    sins[1].meta["val"] = val
    share_equal_work(gm.graph)
    assert len([n for n in gm.graph.nodes if n.target == torch.ops.aten.sin.default]) == 1


def test_a_channels_last_shared_point_equals_the_eager_point():
    """The pass on channels-last inputs (NHWC activations throughout) shares the gradient pass and
    keeps the point's values. (Channels-last kernels are not shared: jvp copies its primal θ
    contiguous, so the jvp's convolutions take other weights than the gradient pass's.)"""
    loss_fn, params, buffers, batch = setup(lambda: gamfunc.nn.elementary_norms(conv_net()))
    x, y = batch
    batch = (x.to(memory_format=torch.channels_last), y)
    fn = point(loss_fn)
    shared = traced(fn, params, batch, buffers, share=True)
    unit = flops(gradient(loss_fn), params, batch, buffers)
    assert flops(shared, params, batch, buffers) == 3 * unit
    for a, b in zip(fn(params, batch, buffers), shared(params, batch, buffers), strict=True):
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=1e-10, atol=1e-12)


@pytest.mark.gpu
def test_a_compiled_point_with_the_pass_equals_the_eager_point_on_cuda():
    """Inductor on CUDA with the pass, channels-last: the same g and H·g/‖g‖ as eager (float64)."""
    loss_fn, params, buffers, batch = setup(lambda: gamfunc.nn.elementary_norms(conv_net()))
    dev = torch.device("cuda")
    params = {k: v.to(dev) for k, v in params.items()}
    buffers = {k: v.to(dev) for k, v in buffers.items()}
    x, y = batch
    batch = (x.to(dev, memory_format=torch.channels_last), y.to(dev))
    fn = point(loss_fn)
    torch._dynamo.reset()
    compiled = compile_with(True, None, {})(fn)
    for a, b in zip(fn(params, batch, buffers), compiled(params, batch, buffers), strict=True):
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=1e-9, atol=1e-11)


def test_a_graph_of_symbolic_shapes_is_merged_too():
    """A compile with dynamic shapes (Dynamo marks a dimension dynamic once a pass of the same
    code has seen two batch sizes) hands the pass SymInt shapes, which no set or dict can hash:
    the same work is still found and merged."""
    gm = make_fx(lambda t: ((t * 2).sin(), (t * 2).sin()), tracing_mode="symbolic")(
        torch.randn(5, 3)
    )
    assert not isinstance(gm.graph.find_nodes(op="placeholder")[0].meta["val"].shape[0], int)
    share_equal_work(gm.graph)
    gm.recompile()
    muls = [n for n in gm.graph.nodes if n.target == torch.ops.aten.mul.Tensor]
    assert len(muls) == 1  # t * 2 once; the sines are outputs, which are never merged
    x = torch.randn(7, 3)
    a, b = gm(x)
    torch.testing.assert_close(a, (x * 2).sin())
    torch.testing.assert_close(b, a)
