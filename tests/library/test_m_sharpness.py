"""gamfunc.m_sharpness: the mean of the estimator's directions over m sub-batches, by vmap or by loop."""

import helpers
import pytest
import torch
from helpers import mlp_loss
from registry import ESTIMATORS
from torch import nn

import gamfunc
from gamfunc import tree
from gamfunc.wrappers.m_sharpness import m_sharpness

# m-sharpness averages estimators that carry no state between steps (it refuses the others)
STATELESS = [n for n in ESTIMATORS if not ESTIMATORS[n]().stateful]
F64 = torch.float64
M = 4


def mlp_params():
    return helpers.mlp_params(width=6)


def data(n=16):
    g = torch.Generator().manual_seed(5)
    return torch.randn(n, 4, generator=g, dtype=F64), torch.randint(0, 3, (n,), generator=g)


def rel(a, b):
    return float(tree.norm(tree.sub(a, b)) / tree.norm(b))


def reference(est, params, batch, m):
    """The mean over m consecutive equal sub-batches of the estimator's direction and info."""
    n = batch[0].shape[0] // m
    outs = [est(params, tuple(t[j * n : (j + 1) * n] for t in batch), mlp_loss) for j in range(m)]
    direction = tree.scale(outs[0][0], 0.0)
    for d, _ in outs:
        direction = tree.axpy(1.0 / m, d, direction)
    info = {k: sum(o[1][k] for o in outs) / m for k in outs[0][1]}
    return direction, info


@pytest.mark.parametrize("name", STATELESS)
def test_m_sharpness_is_the_mean_over_sub_batches(name):
    params, batch = mlp_params(), data()
    est = m_sharpness(ESTIMATORS[name](), M)
    d, info = est(params, batch, mlp_loss)
    ref_d, ref_info = reference(ESTIMATORS[name](), params, batch, M)
    assert rel(d, ref_d) < 1e-13
    assert set(info) == set(ref_info)
    for k in info:
        assert torch.allclose(info[k], ref_info[k], rtol=1e-13, atol=0), k
    # per-sub-batch perturbations are not the full batch's (a decoupled form's direction is ∇L)
    if name != "gradient" and not ESTIMATORS[name]().decoupled:
        full, _ = ESTIMATORS[name]()(params, batch, mlp_loss)
        assert rel(d, full) > 1e-6
    assert est.hparams["m"] == M and est.hparams["vectorized"]


@pytest.mark.parametrize("name", STATELESS)
def test_vmap_path_equals_the_loop(name):
    params, batch = mlp_params(), data()
    vectorized = m_sharpness(ESTIMATORS[name](), M)
    assert vectorized.hparams["vectorized"]
    d, info = vectorized(params, batch, mlp_loss)
    d_loop, info_loop = m_sharpness(ESTIMATORS[name](), M, vectorize=False)(params, batch, mlp_loss)
    assert rel(d, d_loop) < 1e-12
    assert all(torch.allclose(info[k], info_loop[k], rtol=1e-12, atol=0) for k in info)


def test_m_equal_one_is_the_estimator():
    params, batch = mlp_params(), data()
    d, _ = m_sharpness(gamfunc.gam(0.1, 0.5), 1)(params, batch, mlp_loss)
    ref, _ = gamfunc.gam(0.1, 0.5)(params, batch, mlp_loss)
    assert rel(d, ref) < 1e-15


def test_in_a_step_with_batchnorm_statistics_are_the_sub_batch_mean():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 3)).to(F64)
    loss_fn, params, buffers = gamfunc.nn.functionalize(model)
    batch = data()
    est = m_sharpness(gamfunc.sam(0.1), M, vectorize=False)
    step = gamfunc.make_step(est, gamfunc.sgd(lr=0.1), loss_fn)
    _, state, metrics = step(params, step.init(params, buffers), batch)
    n = batch[0].shape[0] // M
    parts = [
        loss_fn(params, tuple(t[j * n : (j + 1) * n] for t in batch), buffers) for j in range(M)
    ]
    mean = sum(p[1]["1.running_mean"] for p in parts) / M
    assert torch.allclose(state.buffers["1.running_mean"], mean, rtol=1e-12)
    assert torch.allclose(metrics["loss"], sum(p[0] for p in parts) / M, rtol=1e-12)
    assert int(state.buffers["1.num_batches_tracked"]) == 1


def test_the_constructor_runs_nothing():
    """No trial run at construction: an estimator is only run on the batch it is given."""
    calls = []

    def run(params, batch, loss_fn, clean, step):
        calls.append(batch)
        return gamfunc.sam(0.1).run(params, batch, loss_fn, clean=clean, step=step)

    est = m_sharpness(gamfunc.Estimator("counted", run, {}), M)
    assert not calls and est.hparams["vectorized"] is True
    est(mlp_params(), data(), mlp_loss)
    assert len(calls) == 1  # one run, batched over the m sub-batches


def test_vectorize_true_failure_names_the_way_out():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 3)).to(F64)
    loss_fn, params, buffers = gamfunc.nn.functionalize(model)
    est = m_sharpness(gamfunc.sam(0.1), M, vectorize=True)
    with pytest.raises(RuntimeError, match="vectorize=False"):
        est(params, data(), lambda p, b: loss_fn(p, b, buffers))


def test_bad_arguments_raise():
    for m in (0, 2.0, True):
        with pytest.raises(ValueError, match="m must"):
            m_sharpness(gamfunc.sam(0.1), m)
    with pytest.raises(ValueError, match="randomness"):
        m_sharpness(gamfunc.sam(0.1), 2, randomness="sometimes")
    with pytest.raises(TypeError, match="estimator"):
        m_sharpness(mlp_loss, 2)
    with pytest.raises(ValueError, match="multiple of m"):
        m_sharpness(gamfunc.sam(0.1), 3)(mlp_params(), data(16), mlp_loss)


def test_a_stateful_estimator_is_refused_naming_it():
    with pytest.raises(ValueError, match="estimator: 'friendly_sam'"):
        m_sharpness(gamfunc.friendly_sam(0.05), M)
