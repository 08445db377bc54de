"""Loss landscapes, filter normalisation, minima density and the plots."""

from __future__ import annotations

import math

import pytest
import torch

from gamfunc import metrics
from gamfunc.metrics.minima import count_extrema

F64 = torch.float64


def quadratic(seed=0):
    """L(θ) = ½(θ−θ*)ᵀA(θ−θ*) on {"w": (3, 2), "b": (2,)}; returns (loss_fn, θ*, A, eigenvalues)."""
    g = torch.Generator().manual_seed(seed)
    lam = torch.tensor([6.0, 3.0, 2.0, 1.0, 0.5, 0.4, 0.2, 0.1], dtype=F64)
    q, _ = torch.linalg.qr(torch.randn(8, 8, generator=g, dtype=F64))
    a = q @ torch.diag(lam) @ q.T
    star = torch.randn(8, generator=g, dtype=F64)

    def loss_fn(p, batch):
        e = torch.cat([p["w"].reshape(-1), p["b"]]) - star
        return 0.5 * e @ (a @ e)

    return loss_fn, {"w": star[:6].reshape(3, 2).clone(), "b": star[6:].clone()}, a, lam


def flat(p):
    return torch.cat([p["w"].reshape(-1), p["b"]])


# ---- directions -------------------------------------------------------------------------------------


def test_random_direction_is_filter_normalised():
    g = torch.Generator().manual_seed(0)
    params = {
        "conv": torch.randn(4, 3, 3, 3, generator=g),
        "fc": torch.randn(5, 7, generator=g),
        "bias": torch.randn(5, generator=g),
        "bn.weight": torch.rand(4, generator=g),
    }
    d = metrics.random_direction(params, torch.Generator().manual_seed(1))
    for k in ("conv", "fc"):
        rows = d[k].reshape(d[k].shape[0], -1).norm(dim=1)
        expected = params[k].reshape(params[k].shape[0], -1).norm(dim=1)
        torch.testing.assert_close(rows, expected, rtol=1e-6, atol=0)
        assert not torch.allclose(d[k], params[k])  # random, only the norms are copied
    assert torch.equal(d["bias"], torch.zeros(5)) and torch.equal(d["bn.weight"], torch.zeros(4))
    included = metrics.random_direction(params, torch.Generator().manual_seed(1), biasbn="include")
    assert torch.equal(included["bias"], params["bias"])
    assert torch.equal(included["bn.weight"], params["bn.weight"])
    assert torch.equal(included["fc"], d["fc"])
    with pytest.raises(ValueError, match="biasbn"):
        metrics.random_direction(params, biasbn="keep")


# ---- the landscape of a quadratic is the known paraboloid ----------------------------------------------


def test_landscape_1d_of_a_quadratic_is_the_parabola():
    loss_fn, star, a, _ = quadratic()
    theta = {"w": star["w"] + 0.3, "b": star["b"] - 0.2}  # off the minimum: a shifted parabola
    line = metrics.landscape_1d(theta, None, loss_fn, span=(-2.0, 1.0), points=13)
    d, e0 = flat(line.direction), flat(theta) - flat(star)
    expected = 0.5 * e0 @ a @ e0 + line.alphas * (e0 @ a @ d) + 0.5 * line.alphas**2 * (d @ a @ d)
    torch.testing.assert_close(line.losses, expected, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(line.alphas, torch.linspace(-2.0, 1.0, 13, dtype=F64))
    assert torch.equal(line.direction["b"], torch.zeros(2, dtype=F64))  # biasbn="ignore"


def test_landscape_2d_of_a_quadratic_at_its_minimum_is_the_paraboloid():
    loss_fn, star, a, _ = quadratic(1)
    grid = metrics.landscape_2d(star, None, loss_fn, span=((-1.0, 1.0), (-0.5, 2.0)), points=(7, 9))
    d1, d2 = (flat(d) for d in grid.directions)
    gram = torch.stack([torch.stack([x @ a @ y for y in (d1, d2)]) for x in (d1, d2)])
    ab = torch.stack(torch.meshgrid(grid.alphas, grid.betas, indexing="ij"), dim=-1)
    expected = 0.5 * torch.einsum("ijk,kl,ijl->ij", ab, gram, ab)
    assert grid.losses.shape == (7, 9)
    torch.testing.assert_close(grid.losses, expected, rtol=1e-12, atol=1e-14)


def test_landscape_along_the_top_hessian_eigenvectors():
    loss_fn, star, _, lam = quadratic(2)
    grid = metrics.landscape_2d(star, None, loss_fn, directions="hessian", points=5)
    ab = torch.stack(torch.meshgrid(grid.alphas, grid.betas, indexing="ij"), dim=-1)
    expected = 0.5 * (lam[0] * ab[..., 0] ** 2 + lam[1] * ab[..., 1] ** 2)
    torch.testing.assert_close(grid.losses, expected, rtol=1e-6, atol=1e-12)
    line = metrics.landscape_1d(star, None, loss_fn, direction="hessian", points=5)
    torch.testing.assert_close(line.losses, 0.5 * lam[0] * line.alphas**2, rtol=1e-6, atol=1e-12)


def test_landscape_along_given_directions_and_determinism():
    loss_fn, star, _, _ = quadratic(3)
    d = {"w": torch.ones(3, 2, dtype=F64), "b": torch.zeros(2, dtype=F64)}
    line = metrics.landscape_1d(star, None, loss_fn, direction=d, points=3)
    assert line.direction is d
    g = lambda s: torch.Generator().manual_seed(s)  # noqa: E731
    a = metrics.landscape_2d(star, None, loss_fn, points=3, generator=g(0)).losses
    assert torch.equal(
        a, metrics.landscape_2d(star, None, loss_fn, points=3, generator=g(0)).losses
    )
    assert not torch.equal(
        a, metrics.landscape_2d(star, None, loss_fn, points=3, generator=g(1)).losses
    )
    with pytest.raises(ValueError, match="points"):
        metrics.landscape_1d(star, None, loss_fn, points=1)
    with pytest.raises(ValueError, match="direction"):
        metrics.landscape_2d(star, None, loss_fn, directions=(d,))


# ---- minima density (paper Section 5.1) ------------------------------------------------------------


def test_minima_density_counts_the_known_minima_of_a_1d_function():
    # cos(2π·3·t/ρ) on t ∈ [0, ρ]: minima at t/ρ = 1/6, 1/2, 5/6, interior maxima at 1/3, 2/3.
    rho = 0.3

    def loss_fn(p, _):
        return torch.cos(2 * math.pi * 3 * p["x"].sum() / rho)

    out = metrics.minima_density(
        {"x": torch.zeros(1, dtype=F64)}, None, loss_fn, rho=rho, steps=60, directions=4
    )
    assert out.minima.tolist() == [3, 3, 3, 3] and out.maxima.tolist() == [2, 2, 2, 2]
    assert out.losses.shape == (4, 61) and out.radii[-1] == rho


def test_minima_density_along_random_directions_of_a_radial_function():
    # L = cos(2π·k‖θ‖/ρ) from θ = 0: every direction sees k minima (at odd multiples of ρ/2k).
    rho, k = 0.1, 4

    def loss_fn(p, _):
        r = torch.sqrt(sum((v**2).sum() for v in p.values()))
        return torch.cos(2 * math.pi * k * r / rho)

    params = {"w": torch.zeros(3, 2, dtype=F64), "b": torch.zeros(4, dtype=F64)}
    out = metrics.minima_density(params, None, loss_fn, rho=rho, steps=80, directions=6)
    assert out.minima.tolist() == [k] * 6 and out.maxima.tolist() == [k - 1] * 6
    monotone = metrics.minima_density(params, None, lambda p, _: p["w"].sum() ** 2, rho=rho)
    assert monotone.minima.sum() == 0 and monotone.maxima.sum() == 0


def test_count_extrema_handles_plateaus_and_ends():
    losses = torch.tensor(
        [
            [3.0, 1.0, 2.0, 0.0, 5.0],  # minima at 1 and 3, maximum at 2
            [0.0, 1.0, 1.0, 1.0, 0.0],  # one flat maximum
            [2.0, 1.0, 1.0, 3.0, 3.0],  # one flat minimum; the flat end is not an extremum
            [1.0, 2.0, 3.0, 4.0, 5.0],  # monotone
        ]
    )
    minima, maxima = count_extrema(losses)
    assert minima.tolist() == [2, 0, 1, 0] and maxima.tolist() == [1, 1, 0, 0]


def test_minima_density_is_deterministic_and_validates():
    loss_fn, star, _, _ = quadratic(4)
    g = lambda s: torch.Generator().manual_seed(s)  # noqa: E731
    a = metrics.minima_density(star, None, loss_fn, directions=3, generator=g(0)).losses
    assert torch.equal(
        a, metrics.minima_density(star, None, loss_fn, directions=3, generator=g(0)).losses
    )
    for kwargs in ({"directions": 0}, {"steps": 0}, {"rho": 0.0}):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            metrics.minima_density(star, None, loss_fn, **kwargs)


# ---- plots ----------------------------------------------------------------------------------------


def is_png(path):
    data = path.read_bytes()
    return len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"


def test_plots_write_non_empty_png_files(tmp_path):
    pytest.importorskip("matplotlib")
    loss_fn, star, _, _ = quadratic(5)
    line = metrics.landscape_1d(star, None, loss_fn, points=9)
    grid = metrics.landscape_2d(star, None, loss_fn, points=7)
    density = metrics.minima_density(star, None, loss_fn, directions=4)
    values = metrics.top_eigenvalues(star, None, loss_fn, k=5)
    paths = {
        name: tmp_path / "out" / f"{name}.png" for name in ("1d", "2d", "2d_log", "eig", "min")
    }
    metrics.plot.plot_landscape(line, paths["1d"], title="1-D")
    metrics.plot.plot_landscape(grid, paths["2d"], title="2-D")
    metrics.plot.plot_landscape(grid, paths["2d_log"], log=True, filled=False)
    metrics.plot.plot_eigenvalues(values, paths["eig"])
    metrics.plot.plot_minima_density(density, paths["min"])
    for path in paths.values():
        assert is_png(path), path


def test_a_figure_that_cannot_be_written_names_its_file(tmp_path, monkeypatch):
    """The image writer's error on a full disk names no file; the plot's error names the path."""
    import errno

    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    def full(self, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", full)
    loss_fn, star, _, _ = quadratic(5)
    line = metrics.landscape_1d(star, None, loss_fn, points=5)
    with pytest.raises(OSError) as failed:
        metrics.plot.plot_landscape(line, tmp_path / "line.png")
    assert failed.value.filename == str(tmp_path / "line.png")
    assert failed.value.errno == errno.ENOSPC


def test_tensorboard_figure_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    loss_fn, star, _, _ = quadratic(6)
    grid = metrics.landscape_2d(star, None, loss_fn, points=5)
    with SummaryWriter(str(tmp_path)) as writer:
        metrics.plot.log_figure(writer, "landscape/2d", grid, step=3)
    events = EventAccumulator(str(tmp_path), size_guidance={"images": 0})
    events.Reload()
    (image,) = events.Images("landscape/2d")
    assert image.step == 3 and image.encoded_image_string[:8] == b"\x89PNG\r\n\x1a\n"
