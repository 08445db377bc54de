"""The metrics on a model, a criterion and a batch or a loader (gamfunc.metrics.from_model): over k
batches they equal the same metric on one batch holding all the data (float64, PyHessian's
full_dataset weighting by batch size); the model is never modified; wrong arguments get one line."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gamfunc
from gamfunc import metrics

F64 = torch.float64


def problem(n=30):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 3)).double()
    with torch.no_grad():
        for _ in range(3):  # running statistics that are not the initial ones
            model(torch.randn(16, 5, dtype=F64))
    x, y = torch.randn(n, 5, dtype=F64), torch.randint(0, 3, (n,))
    data = torch.utils.data.TensorDataset(x, y)
    return model, (x, y), torch.utils.data.DataLoader(data, batch_size=7)  # 7, 7, 7, 7, 2


def gen():
    return torch.Generator().manual_seed(3)


CE = nn.CrossEntropyLoss()
METRICS = {
    "top_eigenvalues": lambda *a: metrics.top_eigenvalues(*a, k=2, iters=16, generator=gen()),
    "power": lambda *a: metrics.top_eigenvalues(*a, k=1, iters=10, method="power", generator=gen()),
    "hessian_trace": lambda *a: metrics.hessian_trace(*a, samples=10, generator=gen()),
    "trace_fd": lambda *a: metrics.hessian_trace(*a, samples=3, hvp="fd", generator=gen()),
    "trace_exact": lambda *a: metrics.hessian_trace(*a, samples=3, hvp="exact", generator=gen()),
    "spectral_density": lambda *a: metrics.spectral_density(*a, iters=10, generator=gen())[1],
    "first_order_flatness": lambda *a: metrics.first_order_flatness(*a, 0.05, steps=1),
    "zeroth_order_flatness": lambda *a: metrics.zeroth_order_flatness(
        *a, 0.05, steps=2, init="gradient"
    ),
    "landscape_1d": lambda *a: metrics.landscape_1d(*a, points=5).losses,
    "landscape_2d": lambda *a: metrics.landscape_2d(*a, directions="hessian", points=3).losses,
    "minima_density": lambda *a: metrics.minima_density(*a, directions=3, steps=4).losses,
}


@pytest.mark.parametrize("name", list(METRICS))
def test_a_metric_over_a_loader_equals_it_on_the_concatenated_batch(name):
    model, whole, loader = problem()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    over_batches = METRICS[name](model, loader, CE)
    on_one = METRICS[name](model, whole, CE)
    torch.testing.assert_close(over_batches, on_one, rtol=1e-9, atol=1e-12)
    assert model.training  # the mode it had, although the metric ran in eval mode
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("name", ["top_eigenvalues", "hessian_trace", "spectral_density"])
def test_a_metric_in_train_mode_over_a_loader_prints_no_torch_warning(name):
    """mode="train" over several batches: each batch's H·v (the reverse backend's pullback) comes
    without a graph, so the Lanczos coefficients read no tensor that requires grad (the suite turns
    warnings into errors)."""
    model, _, loader = problem()
    value = {
        "top_eigenvalues": lambda: metrics.top_eigenvalues(model, loader, CE, k=2, mode="train"),
        "hessian_trace": lambda: metrics.hessian_trace(model, loader, CE, samples=3, mode="train"),
        "spectral_density": lambda: metrics.spectral_density(
            model, loader, CE, iters=10, mode="train"
        )[1],
    }[name]()
    assert not value.requires_grad and torch.isfinite(value).all()


def test_the_model_form_is_the_functional_form_in_eval_mode():
    model, (x, y), _ = problem()
    loss_fn, params, buffers = gamfunc.nn.functionalize(model, CE)
    functional = metrics.top_eigenvalues(params, (x, y), loss_fn, k=2, buffers=buffers)
    torch.testing.assert_close(metrics.top_eigenvalues(model, (x, y), CE, k=2), functional)
    train = metrics.hessian_trace(model, (x, y), CE, samples=4, mode="train")
    functional = metrics.hessian_trace(
        params, (x, y), loss_fn, samples=4, buffers=buffers, mode="train"
    )
    torch.testing.assert_close(train, functional)


def test_a_list_of_batches_a_generator_and_a_one_batch_loader():
    model, (x, y), _ = problem()
    batches = [(x[:10], y[:10]), (x[10:], y[10:])]
    want = metrics.hessian_trace(model, (x, y), CE, samples=5)
    torch.testing.assert_close(metrics.hessian_trace(model, batches, CE, samples=5), want)
    torch.testing.assert_close(metrics.hessian_trace(model, iter(batches), CE, samples=5), want)
    one = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64)
    torch.testing.assert_close(metrics.hessian_trace(model, one, CE, samples=5), want)


def test_frozen_parameters_are_held_fixed():
    model, whole, _ = problem()
    model[0].weight.requires_grad_(False)
    params, _, _ = metrics.from_model(model, whole, CE)
    assert "0.weight" not in params and "3.weight" in params
    assert metrics.top_eigenvalues(model, whole, CE).isfinite().all()


def test_from_model_gives_the_mean_over_all_examples():
    model, (x, y), loader = problem()
    params, batches, loss_fn = metrics.from_model(model, loader, CE)
    assert len(batches) == 5 and batches.total == 30
    model.eval()
    torch.testing.assert_close(loss_fn(params, batches), CE(model(x), y))


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda m, d: metrics.top_eigenvalues(m, d), TypeError, "criterion is missing"),
        (lambda m, d: metrics.hessian_trace(m, d[0], CE), TypeError, "data must be a batch"),
        (lambda m, d: metrics.hessian_trace(m, [], CE), ValueError, "data holds no batch"),
        (lambda m, d: metrics.hessian_trace(m, [d, 3], CE), TypeError, "batch 1"),
        (lambda m, d: metrics.hessian_trace(m, d, "ce"), TypeError, "criterion must be callable"),
        (lambda m, d: metrics.hessian_trace(m, d, CE, buffers={}), ValueError, "buffers"),
        (lambda m, d: metrics.hessian_trace(m, d, CE, mode="test"), ValueError, "mode"),
        (lambda m, d: metrics.hessian_trace([m], d, CE), TypeError, "params must be a dict"),
        (
            lambda m, d: metrics.landscape_1d({"w": torch.ones(2)}, d),
            TypeError,
            "loss_fn is missing",
        ),
        (
            lambda m, d: metrics.hessian_trace(m, [d, d], nn.CrossEntropyLoss(reduction="sum")),
            ValueError,
            "reduction",
        ),
    ],
)
def test_wrong_arguments_get_one_line(call, error, words):
    model, whole, _ = problem()
    with pytest.raises(error, match=words) as info:
        call(model, whole)
    assert "\n" not in str(info.value)


def test_a_compiled_module_is_refused_naming_the_module_inside():
    model, whole, _ = problem()
    for call, words in (
        (lambda m: metrics.top_eigenvalues(m, whole, CE), r"top_eigenvalues\(model._orig_mod"),
        (lambda m: metrics.from_model(m, whole, CE), r"from_model\(model._orig_mod"),
    ):
        with pytest.raises(TypeError, match=words) as info:
            call(torch.compile(model))
        assert "\n" not in str(info.value)


def test_a_buffered_loss_without_buffers_names_them():
    model, whole, _ = problem()
    loss_fn, params, _ = gamfunc.nn.functionalize(model, CE)
    for metric in (metrics.top_eigenvalues, metrics.minima_density, metrics.landscape_1d):
        with pytest.raises(TypeError, match="pass buffers="):
            metric(params, whole, loss_fn)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_model_over_a_host_loader():
    """The loader's batches stay on the host and move to the model's device one at a time."""
    model, whole, loader = problem()
    model = model.cuda()
    for name in ("top_eigenvalues", "hessian_trace", "first_order_flatness", "minima_density"):
        over_batches = METRICS[name](model, loader, CE)
        assert over_batches.device.type == "cuda"
        cpu = METRICS[name](model.cpu(), whole, CE)
        model.cuda()
        torch.testing.assert_close(over_batches.cpu(), cpu, rtol=1e-7, atol=1e-10)
    params, batches, _ = metrics.from_model(model, loader, CE)
    assert batches.batches[0][0].device.type == "cpu" and params["0.weight"].is_cuda
