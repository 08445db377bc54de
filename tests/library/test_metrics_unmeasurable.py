"""Minima density and Hessian landscapes on weights that cannot be measured: NaN and one logged line
(as the metrics of gamfunc.metrics.guard), never a count that reads as flat or a raw LinAlgError."""

from __future__ import annotations

import logging

import pytest
import torch

from gamfunc.metrics import landscape_1d, landscape_2d, minima_density


def loss_fn(p, batch):
    x, y = batch
    return ((x @ p["w"] - y) ** 2).mean()


BATCH = (torch.randn(8, 3, generator=torch.Generator().manual_seed(0)), torch.zeros(8))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_minima_density_of_non_finite_weights_is_nan_with_one_line(caplog, bad):
    params = {"w": torch.tensor([1.0, bad, 0.0])}
    with caplog.at_level(logging.WARNING, logger="gamfunc.metrics"):
        d = minima_density(params, BATCH, loss_fn, rho=0.1, directions=4, steps=5)
    assert d.minima.shape == (4,) and torch.isnan(d.minima).all() and torch.isnan(d.maxima).all()
    assert torch.isnan(d.losses).all()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("minima_density: NaN")


def test_minima_density_of_finite_weights_still_counts():
    d = minima_density({"w": torch.zeros(3)}, None, lambda p, _: torch.cos(60 * p["w"].norm()),
                       rho=0.2, steps=40, directions=2)  # fmt: skip
    assert d.minima.tolist() == [2, 2] and d.minima.dtype == torch.int64


def test_a_hessian_landscape_of_nan_weights_is_nan_with_one_line(caplog):
    params = {"w": torch.tensor([1.0, float("nan"), 0.0])}
    with caplog.at_level(logging.WARNING, logger="gamfunc.metrics"):
        line = landscape_1d(params, BATCH, loss_fn, direction="hessian", points=3)
    assert torch.isnan(line.losses).all() and torch.isnan(line.direction["w"]).all()
    assert len(caplog.records) == 1 and "landscape: NaN" in caplog.records[0].getMessage()
    plane = landscape_2d(params, BATCH, loss_fn, directions="hessian", points=3)
    assert torch.isnan(plane.losses).all()


def test_a_failed_eigendecomposition_in_a_landscape_is_nan(monkeypatch, caplog):
    def fail(*a, **k):
        raise torch.linalg.LinAlgError("linalg.eigh: The algorithm failed to converge")

    monkeypatch.setattr(torch.linalg, "eigh", fail)
    with caplog.at_level(logging.WARNING, logger="gamfunc.metrics"):
        line = landscape_1d({"w": torch.ones(3)}, BATCH, loss_fn, direction="hessian", points=3)
    assert torch.isnan(line.losses).all()
    assert "eigendecomposition failed" in caplog.records[0].getMessage()
