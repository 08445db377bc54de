"""gamfunc.nn.elementary_norms and elementary_softmax compute what torch's fused modules compute:
outputs, gradients and running statistics against torch.nn in float64, dtypes under autocast."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import gamfunc
from gamfunc import hvps


def pair(module):
    native = module.double()
    return native, gamfunc.nn.elementary_norms(copy.deepcopy(native))


def assert_same_function(native, ours, x):
    """Equal outputs, and equal gradients of a random projection w.r.t. input and parameters."""
    y0, y1 = native(x), ours(x)
    torch.testing.assert_close(y1, y0, rtol=1e-10, atol=1e-12)
    w = torch.randn_like(y0)
    g0 = torch.autograd.grad((y0 * w).sum(), [x, *native.parameters()])
    g1 = torch.autograd.grad((y1 * w).sum(), [x, *ours.parameters()])
    for a, b in zip(g1, g0, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def randomise(module):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p))
    return module


BATCHNORMS = [
    (lambda **kw: nn.BatchNorm1d(5, **kw), (6, 5)),
    (lambda **kw: nn.BatchNorm1d(5, **kw), (6, 5, 7)),
    (lambda **kw: nn.BatchNorm2d(5, **kw), (6, 5, 3, 4)),
    (lambda **kw: nn.BatchNorm3d(5, **kw), (3, 5, 2, 3, 2)),
]
OPTIONS = [
    {},
    {"momentum": None},
    {"affine": False},
    {"track_running_stats": False},
]


@pytest.mark.parametrize("make,shape", BATCHNORMS, ids=["1d", "1d_seq", "2d", "3d"])
@pytest.mark.parametrize("options", OPTIONS, ids=["default", "cumulative", "no_affine", "no_stats"])
def test_batchnorm_matches_torch_in_train_and_eval(make, shape, options):
    torch.manual_seed(0)
    native, ours = pair(randomise(make(**options)))
    ours.load_state_dict(native.state_dict())
    for step in range(3):
        x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
        for train in (True, False):
            native.train(train), ours.train(train)
            assert_same_function(native, ours, x)
        for (k, a), (_, b) in zip(
            ours.state_dict().items(), native.state_dict().items(), strict=True
        ):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14, msg=f"{k} after step {step}")


@pytest.mark.parametrize(
    "options,shape",
    [({}, (5,)), ({"elementwise_affine": False}, (5,)), ({"bias": False}, (4, 5))],
    ids=["affine", "no_affine", "no_bias_2d"],
)
def test_layernorm_matches_torch(options, shape):
    torch.manual_seed(0)
    native, ours = pair(randomise(nn.LayerNorm(shape, **options)))
    x = torch.randn(3, 2, *shape, dtype=torch.float64, requires_grad=True)
    assert_same_function(native, ours, x)


def test_softmax_matches_torch():
    x = 30 * torch.randn(4, 3, 7, dtype=torch.float64, requires_grad=True)
    for dim in (-1, 1):
        y0, y1 = torch.softmax(x, dim), gamfunc.nn.elementary_softmax(x, dim)
        torch.testing.assert_close(y1, y0, rtol=1e-12, atol=1e-14)
        w = torch.randn_like(y0)
        (a,) = torch.autograd.grad((y1 * w).sum(), x)
        (b,) = torch.autograd.grad((y0 * w).sum(), x)
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def bn_net():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Flatten(),
        nn.LayerNorm(64),
        nn.Linear(64, 3),
    )


def test_names_stay_and_a_second_call_changes_nothing():
    net = bn_net()
    names = [k for k, _ in net.state_dict().items()]
    once = gamfunc.nn.elementary_norms(net)
    kinds = [type(m) for m in once.modules()]
    assert [k for k, _ in once.state_dict().items()] == names
    assert isinstance(once[1], nn.BatchNorm2d) and isinstance(once[4], nn.LayerNorm)
    assert [type(m) for m in gamfunc.nn.elementary_norms(once).modules()] == kinds


def test_dtypes_under_autocast_are_torchs_and_exact_hvp_runs():
    """bf16 autocast on the CPU: each module returns the dtype torch's returns, and forward-over-
    reverse H·v runs through the net (value and tangent agree in dtype) near its float32 value."""
    x = torch.randn(8, 3, 6, 6)
    native, ours = bn_net(), gamfunc.nn.elementary_norms(bn_net())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for i in range(len(native)):
            x0 = native[: i + 1](x)
            assert ours[: i + 1](x).dtype == x0.dtype, i
    loss_fn, params, buffers = gamfunc.nn.functionalize(ours)
    batch = (x, torch.randint(0, 3, (8,)))
    v = {k: torch.randn_like(p) for k, p in params.items()}

    def loss(p, b):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, new = loss_fn(p, b, buffers)
        return out.float(), new

    hv16, _ = hvps.exact()(loss, params, batch, v)
    hv32, _ = hvps.exact()(lambda p, b: loss_fn(p, b, buffers), params, batch, v)
    num = sum((hv16[k].float() - hv32[k]).norm() ** 2 for k in v) ** 0.5
    den = sum(hv32[k].norm() ** 2 for k in v) ** 0.5
    assert num / den < 0.25


def test_syncbatchnorm_is_left_alone():
    # SyncBatchNorm reduces its statistics across processes; a rewrite would silently lose that.
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.SyncBatchNorm(4), nn.BatchNorm2d(4))
    gamfunc.nn.elementary_norms(net)
    gamfunc.nn.autocast_batchnorm(net)
    assert type(net[1]) is nn.SyncBatchNorm
    assert type(net[2]).__name__ == "AutocastElementaryBatchNorm2d" or isinstance(
        net[2], gamfunc.nn.norms._ElementaryNorm
    )


@pytest.mark.parametrize("shape", [(1, 4), (1, 4, 1, 1)])
def test_a_training_batch_of_one_raises_as_torchs(shape):
    torch_bn = nn.BatchNorm1d(4) if len(shape) == 2 else nn.BatchNorm2d(4)
    ours = gamfunc.nn.elementary_norms(copy.deepcopy(torch_bn))
    x = torch.randn(*shape)
    with pytest.raises(ValueError, match="Expected more than 1 value per channel") as want:
        torch_bn(x)
    with pytest.raises(ValueError, match="Expected more than 1 value per channel") as got:
        ours(x)
    assert str(got.value) == str(want.value)
    ours.eval()
    assert torch.equal(ours(x), torch_bn.eval()(x))  # eval mode takes a batch of one
