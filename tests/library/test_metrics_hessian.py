"""Hessian eigenvalues and trace against the dense torch.func.hessian; BatchNorm handling of every
metric."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import dense_hessian, flatten, unflatten

import gamfunc
from gamfunc import metrics

F64 = torch.float64


# ---- tiny models and their dense Hessians ----------------------------------------------------------


def mlp(shapes, dtype=F64, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return {k: scale * torch.randn(s, generator=g, dtype=dtype) for k, s in shapes.items()}


CLS = {"w1": (5, 4), "b1": (5,), "w2": (3, 5), "b2": (3,)}  # 43 parameters
REG = {"w1": (8, 5), "b1": (8,), "w2": (5, 8), "b2": (5,)}  # 93 parameters


def classification_batch(n=20, dtype=F64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=g, dtype=dtype), torch.randint(0, 3, (n,), generator=g)


def regression_batch(n=24, dtype=F64, seed=2):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 5, generator=g, dtype=dtype), torch.randn(n, 5, generator=g, dtype=dtype)


def tanh_ce(params, batch):
    x, y = batch
    h = torch.tanh(x @ params["w1"].T + params["b1"])
    return F.cross_entropy(h @ params["w2"].T + params["b2"], y)


def tanh_mse(params, batch):
    """No softmax, so no exactly repeated (zero) eigenvalues: the top 50 are all distinct."""
    x, y = batch
    h = torch.tanh(x @ params["w1"].T + params["b1"])
    return ((h @ params["w2"].T + params["b2"] - y) ** 2).mean()


def rel(a, b):
    return ((a - b).abs() / b.abs()).max().item()


# ---- top eigenvalues -------------------------------------------------------------------------------


@pytest.mark.parametrize("hvp", ["exact", "reverse"])
@pytest.mark.parametrize("k", [1, 5])
def test_top_eigenvalues_equal_dense_eigvalsh(k, hvp):
    params, batch = mlp(CLS), classification_batch()
    expected = torch.linalg.eigvalsh(dense_hessian(tanh_ce, params, batch)).flip(0)[:k]
    values = metrics.top_eigenvalues(params, batch, tanh_ce, k=k, hvp=hvp)
    assert values.shape == (k,) and values.dtype == F64
    assert torch.all(values[:-1] >= values[1:])
    assert rel(values, expected) < 1e-6


def test_top_50_equal_dense_eigvalsh():
    params, batch = mlp(REG, scale=0.7), regression_batch()
    n = flatten(params).numel()
    expected = torch.linalg.eigvalsh(dense_hessian(tanh_mse, params, batch)).flip(0)[:50]
    values = metrics.top_eigenvalues(params, batch, tanh_mse, k=50, iters=n)
    assert rel(values, expected) < 1e-6


def test_repeated_eigenvalues_are_all_found():
    # diag(5, 3, 3, 3, 1, 0.5): one Krylov space holds one copy of 3; the restarts find the others.
    lam = torch.tensor([5.0, 3.0, 3.0, 3.0, 1.0, 0.5], dtype=F64)
    q, _ = torch.linalg.qr(torch.randn(6, 6, generator=torch.Generator().manual_seed(0), dtype=F64))
    a = q @ torch.diag(lam) @ q.T

    def loss_fn(p, _):
        return 0.5 * p["x"] @ a @ p["x"]

    values = metrics.top_eigenvalues({"x": torch.zeros(6, dtype=F64)}, None, loss_fn, k=5)
    torch.testing.assert_close(values, lam[:5], rtol=1e-10, atol=0)


def test_power_iteration_equals_dense_on_a_positive_definite_hessian():
    lam = torch.tensor([8.0, 4.0, 2.0, 1.0, 0.5, 0.25, 0.1], dtype=F64)
    q, _ = torch.linalg.qr(torch.randn(7, 7, generator=torch.Generator().manual_seed(1), dtype=F64))
    a = q @ torch.diag(lam) @ q.T

    def loss_fn(p, _):
        return 0.5 * p["x"] @ a @ p["x"] + torch.cos(p["x"]).sum() * 0  # plain quadratic

    values = metrics.top_eigenvalues(
        {"x": torch.ones(7, dtype=F64)}, None, loss_fn, k=3, iters=500, tol=1e-12, method="power"
    )
    assert rel(values, lam[:3]) < 1e-6


def test_power_iteration_on_the_mlp_finds_the_largest_magnitudes():
    params, batch = mlp(CLS), classification_batch()
    dense = torch.linalg.eigvalsh(dense_hessian(tanh_ce, params, batch))
    by_magnitude = dense[dense.abs().argsort(descending=True)][:2].sort(descending=True).values
    values = metrics.top_eigenvalues(
        params, batch, tanh_ce, k=2, iters=3000, tol=1e-13, method="power"
    )
    assert rel(values, by_magnitude) < 1e-5


def test_eigenvectors_satisfy_hv_equal_lambda_v():
    params, batch = mlp(CLS), classification_batch()
    h = dense_hessian(tanh_ce, params, batch)
    values, vectors = metrics.top_eigenvalues(
        params, batch, tanh_ce, k=3, tol=1e-10, return_eigenvectors=True
    )
    for lam, v in zip(values, vectors, strict=True):
        x = flatten(v)
        assert abs(x.norm().item() - 1) < 1e-10
        assert (h @ x - lam * x).norm() < 1e-8


def test_finite_difference_hvp_approaches_exact():
    params, batch = mlp(CLS), classification_batch()
    expected = torch.linalg.eigvalsh(dense_hessian(tanh_ce, params, batch)).flip(0)[:2]
    values = metrics.top_eigenvalues(params, batch, tanh_ce, k=2, hvp=gamfunc.hvps.fd(radius=1e-6))
    assert rel(values, expected) < 1e-4


def test_same_generator_seed_same_eigenvalues_and_params_untouched():
    params, batch = mlp(CLS), classification_batch()
    before = {k: v.clone() for k, v in params.items()}

    def run(seed):
        g = torch.Generator().manual_seed(seed)
        return metrics.top_eigenvalues(params, batch, tanh_ce, k=3, iters=4, generator=g)

    assert torch.equal(run(3), run(3))
    assert not torch.equal(run(3), run(4))  # 4 products: not converged, so the start shows
    assert all(torch.equal(before[k], params[k]) for k in params)


def test_loss_with_aux_gives_the_same_result():
    params, batch = mlp(CLS), classification_batch()

    def with_aux(p, b):
        return tanh_ce(p, b), {"logits": torch.zeros(3)}

    a = metrics.top_eigenvalues(params, batch, tanh_ce, k=2)
    b = metrics.top_eigenvalues(params, batch, with_aux, k=2)
    assert torch.equal(a, b)
    assert torch.equal(
        metrics.hessian_trace(params, batch, tanh_ce, samples=4),
        metrics.hessian_trace(params, batch, with_aux, samples=4),
    )


def test_float32_stays_float32():
    params, batch = mlp(CLS, dtype=torch.float32), classification_batch(dtype=torch.float32)
    values = metrics.top_eigenvalues(params, batch, tanh_ce, k=2)
    trace = metrics.hessian_trace(params, batch, tanh_ce, samples=4)
    assert values.dtype == torch.float32 and trace.dtype == torch.float32
    expected = torch.linalg.eigvalsh(dense_hessian(tanh_ce, params, batch)).flip(0)[:2]
    assert rel(values, expected) < 1e-4


@pytest.mark.parametrize(
    "kwargs",
    [
        {"k": 0},
        {"k": 44},
        {"iters": 0},
        {"tol": 0.0},
        {"method": "arnoldi"},
        {"hvp": "forward"},
        {"mode": "test"},
        {"k": 5, "iters": 3},
    ],
)
def test_bad_arguments_raise_value_error(kwargs):
    params, batch = mlp(CLS), classification_batch()
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        metrics.top_eigenvalues(params, batch, tanh_ce, **kwargs)


# ---- trace -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("hvp", ["exact", "reverse", "fd"])
def test_trace_within_three_standard_errors_of_dense_trace(hvp):
    params, batch = mlp(CLS), classification_batch()
    expected = torch.trace(dense_hessian(tanh_ce, params, batch))
    g = torch.Generator().manual_seed(0)
    estimate, stderr = metrics.hessian_trace(
        params, batch, tanh_ce, samples=200, generator=g, hvp=hvp, return_stderr=True
    )
    assert 0 < stderr < 0.2 * expected.abs()
    assert (estimate - expected).abs() <= 3 * stderr


def test_trace_same_seed_same_result_and_chunking_does_not_matter():
    params, batch = mlp(CLS), classification_batch()

    def run(seed, chunk_size):
        g = torch.Generator().manual_seed(seed)
        return metrics.hessian_trace(
            params, batch, tanh_ce, samples=12, generator=g, chunk_size=chunk_size
        )

    assert torch.equal(run(5, 4), run(5, 4))
    assert not torch.equal(run(5, 4), run(6, 4))
    torch.testing.assert_close(run(5, 1), run(5, 4), rtol=1e-13, atol=0)
    torch.testing.assert_close(run(5, None), run(5, 5), rtol=1e-13, atol=0)


@pytest.mark.parametrize("hvp", ["exact", "reverse"])
def test_vmap_trace_equals_a_python_loop_over_the_same_probes(hvp):
    params, batch = mlp(CLS), classification_batch()
    n, samples = flatten(params).numel(), 9
    g = torch.Generator().manual_seed(7)
    forms = []
    for _ in range(samples):  # the documented draw: one ±1 vector of all parameters per probe
        z = (2 * torch.randint(0, 2, (n,), generator=g) - 1).to(F64)
        hv, _ = gamfunc.hvps.exact()(tanh_ce, params, batch, unflatten(z, params))
        forms.append(flatten(hv) @ z)
    forms = torch.stack(forms)
    estimate, stderr = metrics.hessian_trace(
        params, batch, tanh_ce, samples=samples, generator=torch.Generator().manual_seed(7),
        hvp=hvp, chunk_size=4, return_stderr=True,
    )  # fmt: skip
    torch.testing.assert_close(estimate, forms.mean(), rtol=1e-12, atol=0)
    torch.testing.assert_close(stderr, forms.std() / math.sqrt(samples), rtol=1e-10, atol=0)


def test_trace_of_a_single_probe_has_nan_stderr():
    params, batch = mlp(CLS), classification_batch()
    _, stderr = metrics.hessian_trace(params, batch, tanh_ce, samples=1, return_stderr=True)
    assert math.isnan(stderr)


@pytest.mark.parametrize("kwargs", [{"samples": 0}, {"chunk_size": 0}, {"hvp": "x"}])
def test_trace_bad_arguments_raise_value_error(kwargs):
    params, batch = mlp(CLS), classification_batch()
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        metrics.hessian_trace(params, batch, tanh_ce, **kwargs)


# ---- BatchNorm: every metric, both modes ------------------------------------------------------------


def bn_model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6), torch.nn.Tanh(), torch.nn.Linear(6, 3)
    ).to(F64)
    with torch.no_grad():  # running statistics far from this batch's, so the modes differ
        model[1].running_mean.uniform_(-1, 1)
        model[1].running_var.uniform_(0.3, 3.0)
    return model


METRICS = {
    "top_eigenvalues": lambda p, b, f, **kw: metrics.top_eigenvalues(p, b, f, k=2, **kw),
    "hessian_trace": lambda p, b, f, **kw: metrics.hessian_trace(p, b, f, samples=6, **kw),
    "first_order": lambda p, b, f, **kw: metrics.first_order_flatness(p, b, f, 0.1, steps=2, **kw),
    "zeroth_order": lambda p, b, f, **kw: metrics.zeroth_order_flatness(
        p, b, f, 0.1, steps=2, **kw
    ),
    "landscape_1d": lambda p, b, f, **kw: metrics.landscape_1d(p, b, f, points=3, **kw).losses,
    "landscape_2d": lambda p, b, f, **kw: metrics.landscape_2d(p, b, f, points=2, **kw).losses,
    "minima_density": lambda p, b, f, **kw: (
        metrics.minima_density(p, b, f, directions=2, steps=3, **kw).losses
    ),
}


@pytest.mark.parametrize("name", sorted(METRICS))
def test_buffers_are_untouched_and_train_and_eval_modes_differ(name):
    loss_fn, params, buffers = gamfunc.nn.functionalize(bn_model())
    batch = classification_batch(n=16)
    before = {k: v.clone() for k, v in buffers.items()}
    before_params = {k: v.clone() for k, v in params.items()}
    evaluated = METRICS[name](params, batch, loss_fn, buffers=buffers, mode="eval")
    trained = METRICS[name](params, batch, loss_fn, buffers=buffers, mode="train")
    assert all(torch.equal(before[k], buffers[k]) for k in buffers)
    assert all(torch.equal(before_params[k], params[k]) for k in params)
    assert torch.isfinite(evaluated).all() and torch.isfinite(trained).all()
    assert not torch.allclose(evaluated, trained, rtol=1e-3, atol=0)


def test_eval_mode_equals_the_module_in_eval_mode():
    model = bn_model()
    loss_fn, params, buffers = gamfunc.nn.functionalize(model)
    batch = classification_batch(n=16)
    model.eval()

    def module_loss(p, b):
        return F.cross_entropy(torch.func.functional_call(model, (p, buffers), (b[0],)), b[1])

    a = metrics.top_eigenvalues(params, batch, loss_fn, k=2, buffers=buffers, mode="eval")
    b = metrics.top_eigenvalues(params, batch, module_loss, k=2)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=0)


@pytest.mark.gpu
def test_cuda_results_stay_on_cuda_and_match_cpu():
    params, batch = mlp(CLS), classification_batch()
    cuda = {k: v.cuda() for k, v in params.items()}
    cuda_batch = tuple(t.cuda() for t in batch)
    values = metrics.top_eigenvalues(cuda, cuda_batch, tanh_ce, k=3, tol=1e-10)
    trace = metrics.hessian_trace(cuda, cuda_batch, tanh_ce, samples=8)
    assert values.device.type == "cuda" and trace.device.type == "cuda"
    expected = metrics.top_eigenvalues(params, batch, tanh_ce, k=3, tol=1e-10)
    torch.testing.assert_close(values.cpu(), expected, rtol=1e-8, atol=0)
    for name, metric in METRICS.items():
        out = metric(cuda, cuda_batch, tanh_ce)
        assert out.device.type == "cuda", name
    density = metrics.minima_density(cuda, cuda_batch, tanh_ce, directions=2)
    assert all(t.device.type == "cuda" for t in density)
    _, vectors = metrics.top_eigenvalues(cuda, cuda_batch, tanh_ce, k=2, return_eigenvectors=True)
    assert all(v.device.type == "cuda" for d in vectors for v in d.values())


class _Stop(Exception):
    pass


@pytest.mark.parametrize("method", ["lanczos", "power"])
def test_the_callback_sees_every_product_and_can_stop_the_eigenvalues(method):
    params, batch = mlp(REG), (torch.randn(20, 5, dtype=F64), torch.randn(20, 5, dtype=F64))
    loss = lambda p, b: F.mse_loss(torch.tanh(b[0] @ p["w1"].T + p["b1"]) @ p["w2"].T, b[1])  # noqa: E731
    seen = []
    metrics.top_eigenvalues(
        params, batch, loss, iters=6, tol=1e-30, method=method, callback=seen.append
    )
    assert seen == list(range(1, 7))

    def stop(done):
        if done == 3:
            raise _Stop

    with pytest.raises(_Stop):
        metrics.top_eigenvalues(params, batch, loss, iters=50, method=method, callback=stop)


def test_the_callback_sees_every_chunk_of_trace_probes_and_can_stop_it():
    params, batch = mlp(REG), (torch.randn(20, 5, dtype=F64), torch.randn(20, 5, dtype=F64))
    loss = lambda p, b: F.mse_loss(torch.tanh(b[0] @ p["w1"].T + p["b1"]) @ p["w2"].T, b[1])  # noqa: E731
    seen = []
    metrics.hessian_trace(params, batch, loss, samples=25, chunk_size=10, callback=seen.append)
    assert seen == [10, 20, 25]
    with pytest.raises(_Stop):
        metrics.hessian_trace(params, batch, loss, samples=25, chunk_size=10, callback=_raise)


def _raise(done):
    raise _Stop


def test_the_radius_is_the_backend_values_and_fd_is_its_default():
    params, batch = mlp(CLS), classification_batch()
    fd = gamfunc.hvps.fd(radius=1e-3)
    by_value = metrics.top_eigenvalues(params, batch, tanh_ce, k=1, hvp=fd, iters=20)
    by_name = metrics.top_eigenvalues(params, batch, tanh_ce, k=1, hvp="fd", iters=20)
    assert torch.equal(by_value, by_name)
    wider = gamfunc.hvps.fd(radius=1e-1)
    assert not torch.equal(
        metrics.top_eigenvalues(params, batch, tanh_ce, k=1, hvp=wider, iters=20), by_name
    )
    with pytest.raises(ValueError, match="hvp"):
        metrics.top_eigenvalues(params, batch, tanh_ce, hvp=1e-3)
    with pytest.raises(ValueError, match="hvp"):
        metrics.hessian_trace(params, batch, tanh_ce, hvp=1e-3)
