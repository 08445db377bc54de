"""Probe-based metrics where a probe loss is not finite, and the spans of landscapes: a hole never
reads as flat (NaN counts and values, a count of the holes, one logged line); a span is finite and
increasing; the default span fits the directions (Hessian ones: the quadratic model rises by 1)."""

from __future__ import annotations

import logging
import math

import pytest
import torch
import torch.nn.functional as F

from gamfunc import metrics

F64 = torch.float64


def problem():
    g = torch.Generator().manual_seed(0)
    params = {"w": torch.randn(10, 5, generator=g), "b": torch.randn(10, generator=g)}
    batch = torch.randn(32, 5, generator=g), torch.randint(0, 10, (32,), generator=g)
    return params, batch


def loss_fn(p, batch):
    x, y = batch
    return F.cross_entropy(x @ p["w"].T + p["b"], y)


def lines(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "gamfunc.metrics"]


def test_minima_density_past_overflow_is_nan_with_a_count_and_one_line(caplog):
    params, batch = problem()
    with caplog.at_level(logging.WARNING, logger="gamfunc.metrics"):
        d = metrics.minima_density(params, batch, loss_fn, rho=1e39, directions=5, steps=10)
    assert d.nonfinite.dtype == torch.int64 and d.nonfinite.shape == (5,)
    assert int(d.nonfinite.sum()) == int((~torch.isfinite(d.losses)).sum()) > 25
    assert torch.isnan(d.minima).all() and torch.isnan(d.maxima).all()  # never a count of 0
    (line,) = lines(caplog)
    assert line.startswith("minima_density: NaN counts on 5 of 5 directions")


def test_minima_density_keeps_the_counts_of_directions_without_holes(caplog):
    """Only the directions that cross a hole lose their counts."""
    params = {"w": torch.zeros(2, dtype=F64)}

    def wall(p, _):  # finite for w[0] < 0.5, inf beyond
        w = p["w"]
        return torch.where(w[0] < 0.5, torch.cos(40 * w.norm()), torch.tensor(math.inf, dtype=F64))

    with caplog.at_level(logging.WARNING, logger="gamfunc.metrics"):
        d = metrics.minima_density(params, None, wall, rho=1.0, directions=8, steps=40)
    u0 = (d.losses[:, 1:] != math.inf).all(dim=1)  # directions that never pass w[0] = 0.5
    assert 0 < int(u0.sum()) < 8
    assert torch.equal(torch.isnan(d.minima), ~u0) and (d.minima[u0] >= 1).all()
    assert torch.equal(d.nonfinite > 0, ~u0)
    assert len(lines(caplog)) == 1
    clean = metrics.minima_density(params, None, wall, rho=0.2, directions=3, steps=10)
    assert clean.minima.dtype == torch.int64 and int(clean.nonfinite.sum()) == 0


@pytest.mark.parametrize("metric", ["zeroth_order_flatness", "first_order_flatness"])
def test_r0_and_r1_past_overflow_are_nan_with_one_line(caplog, metric):
    params, batch = problem()
    with caplog.at_level(logging.WARNING, logger="gamfunc.metrics"):
        value = getattr(metrics, metric)(params, batch, loss_fn, rho=1e39, steps=3)
        fine = getattr(metrics, metric)(params, batch, loss_fn, rho=0.1, steps=3)
    assert torch.isnan(value) and torch.isfinite(fine) and fine > 0
    (line,) = lines(caplog)
    assert line.startswith(f"{metric}: NaN, ") and "not finite" in line


def test_a_landscape_counts_and_logs_its_holes(caplog):
    params, batch = problem()
    with caplog.at_level(logging.WARNING, logger="gamfunc.metrics"):
        line = metrics.landscape_1d(params, batch, loss_fn, span=(-1e38, 1e38), points=5)
        grid = metrics.landscape_2d(params, batch, loss_fn, span=(-1e38, 1e38), points=3)
        fine = metrics.landscape_1d(params, batch, loss_fn, points=5)
    assert line.nonfinite == 4 and torch.isfinite(line.losses[2])  # α = 0 is θ
    assert grid.nonfinite == int((~torch.isfinite(grid.losses)).sum()) == 8
    assert fine.nonfinite == 0
    assert [m.split(":")[0] for m in lines(caplog)] == ["landscape_1d", "landscape_2d"]


@pytest.mark.parametrize(
    "span",
    [(math.nan, 1.0), (0.0, math.inf), (1.0, -1.0), (1.0, 1.0), (0.0,), "ab", (None, 1.0)],
)
def test_a_span_must_be_finite_and_increasing(span):
    params, batch = problem()
    with pytest.raises(ValueError, match="span"):
        metrics.landscape_1d(params, batch, loss_fn, span=span, points=3)
    with pytest.raises(ValueError, match="span"):
        metrics.landscape_2d(params, batch, loss_fn, span=span, points=3)
    if isinstance(span, tuple):
        with pytest.raises(ValueError, match=r"span\[1\]"):
            metrics.landscape_2d(params, batch, loss_fn, span=((-1.0, 1.0), span), points=3)


@pytest.mark.parametrize("span", [(-1e39, 1e39), (-3e38, 3e38), (1.0, 1.0 + 1e-9)])
def test_a_span_must_be_finite_and_increasing_in_the_parameters_dtype(span):
    """In float64 each is a finite increasing pair; in the float32 parameters' dtype 1e39 is no
    number (torch.linspace raised a RuntimeError), 3e38 − (−3e38) overflows (NaN and inf
    coordinates), and 1 + 1e-9 rounds to 1: a ValueError naming span and the dtype."""
    params, batch = problem()
    for landscape in (metrics.landscape_1d, metrics.landscape_2d):
        with pytest.raises(ValueError, match=r"^span must be a pair \(min, max\) finite in the "):
            landscape(params, batch, loss_fn, span=span, points=3)
    with pytest.raises(ValueError, match=r"^span\[0\] .* float32"):
        metrics.landscape_2d(params, batch, loss_fn, span=(span, (-1.0, 1.0)), points=3)
    wide = {k: v.double() for k, v in params.items()}
    if span[0] < -1e38:  # in float64 the two big spans are pairs of numbers
        line = metrics.landscape_1d(
            wide, (batch[0].double(), batch[1]), loss_fn, span=span, points=3
        )
        assert line.alphas.dtype == torch.float64 and torch.isfinite(line.alphas).all()


def test_the_default_span_fits_hessian_directions():
    """A unit eigenvector of λ_1 = 1620 with (−1, 1) rises to 810; the default span (−s, s),
    s = √(2/λ_1), rises by 1 at its ends, and the plane by 1 + λ_2/λ_1 at its corners."""
    lam = torch.tensor([1620.0, 400.0, 3.0, 1.0], dtype=F64)
    q, _ = torch.linalg.qr(torch.randn(4, 4, generator=torch.Generator().manual_seed(1), dtype=F64))
    a = q @ torch.diag(lam) @ q.T
    star = {"w": torch.zeros(4, dtype=F64)}
    quad = lambda p, _: 0.5 * p["w"] @ a @ p["w"]  # noqa: E731
    line = metrics.landscape_1d(star, None, quad, direction="hessian", points=5)
    s = math.sqrt(2 / 1620)
    torch.testing.assert_close(line.alphas[[0, -1]], torch.tensor([-s, s], dtype=F64))
    torch.testing.assert_close(line.losses[[0, -1]], torch.ones(2, dtype=F64))
    grid = metrics.landscape_2d(star, None, quad, directions="hessian", points=3)
    torch.testing.assert_close(grid.losses[0, 0], torch.tensor(1 + 400 / 1620, dtype=F64))
    torch.testing.assert_close(grid.betas, grid.alphas)
    random = metrics.landscape_1d(star | {"v": torch.ones(2, 2, dtype=F64)}, None,
                                  lambda p, _: quad(p, None), points=3)  # fmt: skip
    assert random.alphas.tolist() == [-1.0, 0.0, 1.0]  # filter-normalised: Li et al.'s (−1, 1)
    given = metrics.landscape_1d(
        star, None, quad, direction={"w": torch.ones(4, dtype=F64)}, points=3
    )
    assert given.alphas.tolist() == [-1.0, 0.0, 1.0]
    explicit = metrics.landscape_1d(star, None, quad, direction="hessian", span=(-1, 1), points=3)
    torch.testing.assert_close(explicit.losses[0], torch.tensor(810.0, dtype=F64))


def test_hessian_half_width_falls_back_to_one():
    from gamfunc.metrics.landscape import hessian_half_width

    assert hessian_half_width(2.0) == 1.0
    assert [hessian_half_width(v) for v in (0.0, -3.0, math.nan, math.inf)] == [1.0] * 4


def test_the_plots_take_holes(tmp_path):
    pytest.importorskip("matplotlib")
    params, batch = problem()
    density = metrics.minima_density(params, batch, loss_fn, rho=1e39, directions=3, steps=4)
    metrics.plot.plot_minima_density(density, tmp_path / "m.png")
    line = metrics.landscape_1d(params, batch, loss_fn, span=(-1e38, 1e38), points=5)
    grid = metrics.landscape_2d(params, batch, loss_fn, span=(-1e38, 1e38), points=3)
    metrics.plot.plot_landscape(line, tmp_path / "l.png", log=True)
    metrics.plot.plot_landscape(grid, tmp_path / "g.png")
    assert all((tmp_path / f).stat().st_size > 0 for f in ("m.png", "l.png", "g.png"))
