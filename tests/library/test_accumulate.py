"""gamfunc.accumulate: k micro-batches give the full-batch step for every estimator (float64)."""

import helpers
import pytest
import torch
from helpers import mlp_loss
from registry import ESTIMATORS
from torch import nn

import gamfunc
from gamfunc import hvps, tree
from gamfunc.loss import gradient_pass
from gamfunc.wrappers.accumulate import Accumulated, accumulate, batch_size, split_batch

F64 = torch.float64


def mlp_params():
    return helpers.mlp_params(width=6)


def data(step, n=18):
    g = torch.Generator().manual_seed(10 + step)
    return torch.randn(n, 4, generator=g, dtype=F64), torch.randint(0, 3, (n,), generator=g)


def rel(a, b):
    return float(tree.norm(tree.sub(a, b)) / tree.norm(b))


def run(step, params, batches, buffers=None):
    state = step.init(params, buffers)
    for b in batches:
        params, state, metrics = step(params, state, b)
    return params, state, metrics


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_four_micro_batches_equal_the_full_batch(name):
    # 18 examples: micro-batches of 5, 5, 4 and 4, weighted by size.
    opt = gamfunc.sgd(lr=0.1, momentum=0.9)
    batches = [data(s) for s in range(3)]
    ref, _, ref_m = run(gamfunc.make_step(ESTIMATORS[name](), opt, mlp_loss), mlp_params(), batches)
    acc, _, m = run(
        gamfunc.make_step(ESTIMATORS[name](), opt, accumulate(mlp_loss, 4)), mlp_params(), batches
    )
    assert rel(tree.sub(acc, mlp_params()), tree.sub(ref, mlp_params())) < 1e-11
    assert set(m) == set(ref_m)
    for k in m:
        assert torch.allclose(m[k], ref_m[k], rtol=1e-11, atol=0, equal_nan=True), k


def test_one_micro_batch_is_the_plain_loss_bit_for_bit():
    params, batch = mlp_params(), data(0)
    d, info = gamfunc.gam(0.1, 0.5)(params, batch, mlp_loss)
    d1, info1 = gamfunc.gam(0.1, 0.5)(params, batch, accumulate(mlp_loss, 1))
    assert all(torch.equal(d[k], d1[k]) for k in d)
    assert all(torch.equal(info[k], info1[k]) for k in info)


@pytest.mark.parametrize("fn", [hvps.exact(), hvps.reverse(), hvps.fd(radius=1e-4)], ids=repr)
def test_hvp_of_a_given_vector_is_the_full_batch_hvp_with_its_clean_pass(fn):
    params, batch = mlp_params(), data(0)
    g = torch.Generator().manual_seed(3)
    v = {k: torch.randn(p.shape, generator=g, dtype=F64) for k, p in params.items()}
    ref, ref_clean = fn(mlp_loss, params, batch, v)
    got, clean = fn(accumulate(mlp_loss, 3), params, batch, v)
    assert rel(got, ref) < 1e-10
    assert rel(clean.grad, ref_clean.grad) < 1e-12
    assert torch.allclose(clean.loss, ref_clean.loss, rtol=1e-12, atol=0)
    dense = torch.func.hessian(lambda w: mlp_loss(params | {"w1": w}, batch))(params["w1"])
    # against the dense Hessian block of w1 (v nonzero in w1 only)
    if not isinstance(fn, hvps.FiniteDifference):
        only_w1 = {k: (x if k == "w1" else torch.zeros_like(x)) for k, x in v.items()}
        got_w1, _ = fn(accumulate(mlp_loss, 3), params, batch, only_w1)
        want = torch.einsum("ijkl,kl->ij", dense, v["w1"])
        assert torch.allclose(got_w1["w1"], want, rtol=1e-10, atol=1e-13)


def test_calling_the_objective_gives_the_full_batch_loss():
    params, batch = mlp_params(), data(0)
    assert torch.allclose(
        accumulate(mlp_loss, 4)(params, batch), mlp_loss(params, batch), rtol=1e-14
    )
    p = gradient_pass(accumulate(mlp_loss, 4), params, batch)
    assert torch.allclose(p.loss, mlp_loss(params, batch), rtol=1e-14)


def bn_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 3)).to(F64)


def test_batchnorm_statistics_are_the_size_weighted_mean_of_the_micro_batches():
    loss_fn, params, buffers = gamfunc.nn.functionalize(bn_model())
    batch = data(0, n=16)
    step = gamfunc.make_step(gamfunc.gam(0.05, 0.1), gamfunc.sgd(lr=0.1), accumulate(loss_fn, 4))
    _, state, _ = step(params, step.init(params, buffers), batch)
    parts = [loss_fn(params, b, buffers)[1] for b in split_batch(batch, 4)]
    for k in ("1.running_mean", "1.running_var"):
        want = sum(p[k] for p in parts) / 4
        assert torch.allclose(state.buffers[k], want, rtol=1e-12, atol=1e-15)
    # running_mean equals the momentum update with the full batch's mean.
    full = loss_fn(params, batch, buffers)[1]
    assert torch.allclose(state.buffers["1.running_mean"], full["1.running_mean"], rtol=1e-12)
    assert int(state.buffers["1.num_batches_tracked"]) == 1
    assert all(torch.equal(buffers[k], bn_model().state_dict()[k]) for k in buffers)  # inputs kept


def test_split_batch_and_batch_size():
    x, y = torch.arange(10.0).reshape(5, 2), torch.arange(5)
    parts = split_batch({"x": x, "y": y, "tag": "a", "t": torch.tensor(2.0)}, 2)
    assert [batch_size(p) for p in parts] == [3, 2]
    assert torch.equal(parts[1]["y"], torch.tensor([3, 4])) and parts[1]["tag"] == "a"
    assert float(parts[0]["t"]) == 2.0  # 0-d tensors are repeated, not cut


def test_custom_split_is_used_and_weighted_by_size():
    params, batch = mlp_params(), data(0)

    def first_then_rest(b, k):
        return [tuple(t[:2] for t in b), tuple(t[2:] for t in b)]

    d, _ = gamfunc.sam(0.1)(params, batch, Accumulated(mlp_loss, 2, split=first_then_rest))
    ref, _ = gamfunc.sam(0.1)(params, batch, mlp_loss)
    assert rel(d, ref) < 1e-12


def test_bad_micro_batches_raise():
    for k in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="micro_batches"):
            accumulate(mlp_loss, k)
    with pytest.raises(ValueError, match="micro_batches=4"):
        gamfunc.gradient()(mlp_params(), data(0, n=3), accumulate(mlp_loss, 4))
