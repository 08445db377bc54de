"""The Hessian's eigenvalue density (stochastic Lanczos quadrature) against the dense
torch.func.hessian, and against PyHessian's ``density()`` on a network with BatchNorm in eval mode."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import dense_hessian
from models import tiny_bn_mlp, vector_batch

import gamfunc
from gamfunc import metrics
from gamfunc.metrics._common import rademacher

F64 = torch.float64
CLS = {"w1": (5, 4), "b1": (5,), "w2": (3, 5), "b2": (3,)}  # 43 parameters


def mlp(shapes=CLS, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(s, generator=g, dtype=F64) for k, s in shapes.items()}


def batch(n=20, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=g, dtype=F64), torch.randint(0, 3, (n,), generator=g)


def tanh_ce(params, batch):
    x, y = batch
    h = torch.tanh(x @ params["w1"].T + params["b1"])
    return F.cross_entropy(h @ params["w2"].T + params["b2"], y)


# ---- against the dense Hessian ---------------------------------------------------------------------


@pytest.mark.parametrize("hvp", ["reverse", "exact"])
def test_full_lanczos_nodes_are_the_eigenvalues(hvp):
    """m = n steps: the nodes are all n eigenvalues, the zero eigenvalues of the softmax's shift
    invariance (multiplicity > 1, reached by restarts) included."""
    params, b = mlp(), batch()
    n = sum(v.numel() for v in params.values())
    expected = torch.linalg.eigvalsh(dense_hessian(tanh_ce, params, b))
    nodes, weights = metrics.lanczos_quadrature(params, b, tanh_ce, iters=n, hvp=hvp)
    assert nodes.shape == weights.shape == (1, n)
    scale = float(expected.abs().max())
    assert float((nodes[0] - expected).abs().max()) <= 1e-9 * scale
    assert float(weights.sum()) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("iters", [3, 6])
def test_quadrature_is_exact_for_polynomials_of_degree_below_2m(iters):
    """Σ_i τ_i λ_i^k = vᵀH^k v/vᵀv for k ≤ 2m − 1, v the probe drawn from the same generator."""
    params, b = mlp(), batch()
    H = dense_hessian(tanh_ce, params, b)
    probes = 2
    nodes, weights = metrics.lanczos_quadrature(
        params, b, tanh_ce, iters=iters, probes=probes, generator=torch.Generator().manual_seed(4)
    )
    gen = torch.Generator().manual_seed(4)
    for p in range(probes):
        v = rademacher(H.shape[0], gen, H)
        v = v / v.norm()
        hk = v
        for k in range(1, 2 * iters):
            hk = H @ hk
            exact = float(v @ hk)
            quad = float((weights[p] * nodes[p] ** k).sum())
            assert quad == pytest.approx(exact, rel=1e-9, abs=1e-12 * float(H.norm()) ** k), (p, k)


def test_full_lanczos_density_is_the_probes_spectral_measure_smoothed():
    """m = n: φ(t) = Σ_j (u_jᵀv)²·N(t; λ_j, σ²) over the dense eigenpairs (λ_j, u_j) of H and the
    unit probe v, and it integrates to 1."""
    params, b = mlp(), batch()
    n = sum(v.numel() for v in params.values())
    eig, u = torch.linalg.eigh(dense_hessian(tanh_ce, params, b))
    v = rademacher(n, torch.Generator().manual_seed(0), eig)
    mass = (u.T @ (v / v.norm())) ** 2
    t = torch.linspace(float(eig.min()) - 1, float(eig.max()) + 1, 20001, dtype=F64)
    sigma = 0.02
    grid, phi = metrics.spectral_density(
        params, b, tanh_ce, iters=n, grid=t, sigma=sigma, normalize=False
    )
    expected = (mass * torch.exp(-((t[:, None] - eig) ** 2) / (2 * sigma**2))).sum(1)
    expected = expected / (2 * torch.pi * sigma**2) ** 0.5
    assert torch.equal(grid, t)
    assert float((phi - expected).abs().max()) <= 1e-7 * float(expected.max())
    assert float(torch.trapezoid(phi, grid)) == pytest.approx(1.0, abs=1e-6)
    # the default grid and σ: the Riemann sum is 1 exactly, as PyHessian's
    grid, phi = metrics.spectral_density(params, b, tanh_ce, iters=10)
    assert grid.shape == phi.shape == (10000,)
    assert float(phi.sum() * (grid[1] - grid[0])) == pytest.approx(1.0, abs=1e-12)


def test_inputs_are_unchanged_and_calls_repeat():
    params, b = mlp(), batch()
    before = {k: v.clone() for k, v in params.items()}
    one = metrics.spectral_density(params, b, tanh_ce, iters=8, probes=2)
    two = metrics.spectral_density(params, b, tanh_ce, iters=8, probes=2)
    assert all(torch.equal(params[k], before[k]) for k in params)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])


@pytest.mark.parametrize(
    ("kwargs", "arg"),
    [
        ({"iters": 0}, "iters"),
        ({"probes": 0}, "probes"),
        ({"grid": 1}, "grid"),
        ({"grid": torch.tensor([0.0, 2.0, 3.0])}, "grid"),
        ({"sigma": 0.0}, "sigma"),
        ({"sigma": float("nan")}, "sigma"),
        ({"mode": "test"}, "mode"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(kwargs, arg):
    with pytest.raises(ValueError, match=arg):
        metrics.spectral_density(mlp(), batch(), tanh_ce, **kwargs)


# ---- against PyHessian -----------------------------------------------------------------------------


def pyhessian_density_generate(
    eigenvalues, weights, num_bins=10000, sigma_squared=1e-5, overhead=0.01
):
    """``density_generate`` of PyHessian's density_plot.py (github.com/amirgholami/PyHessian, commit
    f4c3f77), vectorised over the grid; the same numbers."""
    eigenvalues, weights = np.array(eigenvalues), np.array(weights)
    lambda_max = np.mean(np.max(eigenvalues, axis=1), axis=0) + overhead
    lambda_min = np.mean(np.min(eigenvalues, axis=1), axis=0) - overhead
    grids = np.linspace(lambda_min, lambda_max, num=num_bins)
    s2 = sigma_squared * max(1, (lambda_max - lambda_min))
    g = np.exp(-((grids[None, :, None] - eigenvalues[:, None, :]) ** 2) / (2.0 * s2))
    g = g / np.sqrt(2 * np.pi * s2)
    density = np.mean(np.sum(g * weights[:, None, :], axis=2), axis=0)
    density = density / (np.sum(density) * (grids[1] - grids[0]))
    return density, grids


def pyhessian_slq(monkeypatch, model, data, bits, iters, probes, exact_norm):
    """PyHessian's ``hessian(model, criterion, data).density(iters, probes)`` in float64, its
    Rademacher draws replaced by ``bits`` (one row per probe) and its removed ``torch.eig`` by
    ``torch.linalg.eigh`` (T is symmetric); each row's nodes ascending. With ``exact_norm`` its
    ``normalization`` divides by ‖v‖ instead of ‖v‖ + 10⁻⁶."""
    pyhessian = pytest.importorskip("pyhessian")
    rows = iter(bits)
    state = {"row": None, "at": 0}

    def randint_like(p, high=2, device=None):
        if state["at"] == 0:
            state["row"] = next(rows)
        n = p.numel()
        out = state["row"][state["at"] : state["at"] + n].reshape(p.shape).to(p.dtype)
        state["at"] = (state["at"] + n) % state["row"].numel()
        return out

    def eig(t, eigenvectors=False):
        values, vectors = torch.linalg.eigh(t)
        return torch.stack([values, torch.zeros_like(values)], dim=1), vectors

    def normalization(v):
        s = float(sum(torch.sum(x * x) for x in v)) ** 0.5
        return [x / s for x in v]

    default = torch.get_default_dtype()
    with monkeypatch.context() as mp:
        mp.setattr(torch, "randint_like", randint_like)
        mp.setattr(torch, "eig", eig, raising=False)
        if exact_norm:
            for module in ("pyhessian.hessian", "pyhessian.utils"):  # the class hides the module
                mp.setattr(sys.modules[module], "normalization", normalization)
        torch.set_default_dtype(F64)  # its T and zero vectors take the default dtype
        try:
            h = pyhessian.hessian(model, F.cross_entropy, data=data, cuda=False)
            eigen, weights = h.density(iter=iters, n_v=probes)
        finally:
            torch.set_default_dtype(default)
    eigen, weights = np.array(eigen), np.array(weights)
    order = np.argsort(eigen, axis=1)
    return np.take_along_axis(eigen, order, axis=1), np.take_along_axis(weights, order, axis=1)


@pytest.fixture
def bn_model():
    """A BatchNorm MLP with non-trivial running statistics, then in eval mode."""
    model = tiny_bn_mlp(F64)
    with torch.no_grad():
        for seed in range(3):
            model(vector_batch(n=16, dtype=F64, seed=10 + seed)[0])
    return model.eval()


# PyHessian differentiates with backward(create_graph=True), which warns about its reference cycle
@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
@pytest.mark.parametrize(("iters", "probes"), [(12, 1), (20, 3)])
def test_density_equals_pyhessian_with_batchnorm_in_eval_mode(monkeypatch, bn_model, iters, probes):
    data = vector_batch(n=16, dtype=F64, seed=0)
    loss_fn, params, buffers = gamfunc.nn.functionalize(bn_model)
    n = sum(v.numel() for v in params.values())
    assert [k for k, _ in bn_model.named_parameters()] == list(params)
    # the probes gamfunc draws: ±1 from randint(0, 2) of a generator seeded with 7
    gen = torch.Generator().manual_seed(7)
    bits = [torch.randint(0, 2, (n,), generator=gen) for _ in range(probes)]

    nodes, weights = metrics.lanczos_quadrature(
        params, data, loss_fn, iters, probes, torch.Generator().manual_seed(7), buffers=buffers
    )
    ref_nodes, ref_weights = pyhessian_slq(
        monkeypatch, bn_model, data, bits, iters, probes, exact_norm=True
    )
    scale = np.abs(ref_nodes).max()
    np.testing.assert_allclose(nodes.numpy(), ref_nodes, rtol=0, atol=1e-10 * scale)
    np.testing.assert_allclose(weights.numpy(), ref_weights, rtol=0, atol=1e-10)
    # As released, PyHessian divides every Lanczos vector by ‖w‖ + 1e-6 (utils.normalization), a
    # relative error of order 1e-6/β_j in each vector, which its nodes and weights inherit.
    raw_nodes, raw_weights = pyhessian_slq(
        monkeypatch, bn_model, data, bits, iters, probes, exact_norm=False
    )
    assert 1e-8 < np.abs(raw_nodes - ref_nodes).max() <= 1e-4 * scale
    np.testing.assert_allclose(weights.numpy(), raw_weights, rtol=0, atol=1e-4)

    grid, phi = metrics.spectral_density(
        params,
        data,
        loss_fn,
        iters,
        probes,
        generator=torch.Generator().manual_seed(7),
        buffers=buffers,
    )
    ref_phi, ref_grid = pyhessian_density_generate(ref_nodes, ref_weights)
    np.testing.assert_allclose(grid.numpy(), ref_grid, rtol=0, atol=1e-10 * scale)
    np.testing.assert_allclose(phi.numpy(), ref_phi, rtol=1e-8, atol=1e-10 * ref_phi.max())


# ---- pictures ----------------------------------------------------------------------------------------


def test_plot_is_a_log_scale_png(tmp_path):
    pytest.importorskip("matplotlib")
    grid, phi = metrics.spectral_density(mlp(), batch(), tanh_ce, iters=10)
    path = tmp_path / "density.png"
    fig = metrics.plot.plot_spectral_density(grid, phi, path, title="SLQ")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (ax,) = fig.axes
    assert ax.get_yscale() == "log"
    (line,) = ax.get_lines()
    np.testing.assert_array_equal(line.get_ydata(), phi.numpy() + 1e-7)
    with pytest.raises(ValueError, match="grid"):
        metrics.plot.plot_spectral_density(grid, phi[:-1])
    with pytest.raises(ValueError, match="floor"):
        metrics.plot.plot_spectral_density(grid, phi, floor=0.0)


def test_density_figure_is_logged_to_tensorboard(tmp_path):
    pytest.importorskip("matplotlib")
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    grid, phi = metrics.spectral_density(mlp(), batch(), tanh_ce, iters=10)
    with SummaryWriter(str(tmp_path)) as writer:
        metrics.plot.log_figure(
            writer, "hessian/density", metrics.plot.plot_spectral_density(grid, phi), step=5
        )
    events = EventAccumulator(str(tmp_path), size_guidance={"images": 0})
    events.Reload()
    (image,) = events.Images("hessian/density")
    assert image.step == 5 and image.encoded_image_string[:8] == b"\x89PNG\r\n\x1a\n"
