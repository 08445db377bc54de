"""Metrics on weights that cannot be measured give NaN and one logged line, never a traceback."""

from __future__ import annotations

import logging

import pytest
import torch

from gamfunc import metrics


def loss_fn(p, x):
    return ((x @ p["w"]) ** 2).mean()


X = torch.randn(8, 3, generator=torch.Generator().manual_seed(0))
CALLS = {
    "top_eigenvalues": lambda p: metrics.top_eigenvalues(p, X, loss_fn, k=2, iters=5),
    "hessian_trace": lambda p: metrics.hessian_trace(p, X, loss_fn, samples=2),
    "first_order_flatness": lambda p: metrics.first_order_flatness(p, X, loss_fn, 0.1, steps=2),
    "zeroth_order_flatness": lambda p: metrics.zeroth_order_flatness(p, X, loss_fn, 0.1, steps=2),
}


@pytest.mark.parametrize("name", list(CALLS))
@pytest.mark.parametrize(
    ("w", "why"),
    [(float("nan"), "not finite"), (1e25, "the loss at these parameters is inf")],
    ids=["nan_params", "overflowing_loss"],
)
def test_unmeasurable_weights_give_nan_and_one_line(caplog, name, w, why):
    with caplog.at_level(logging.WARNING, logger="gamfunc.metrics"):
        got = CALLS[name]({"w": torch.full((3,), w)})
    assert torch.isnan(got).all()
    assert got.shape == ((2,) if name == "top_eigenvalues" else ())
    assert len(caplog.records) == 1 and why in caplog.records[0].getMessage()


def test_a_failed_eigendecomposition_gives_nan(monkeypatch, caplog):
    def fail(*args, **kwargs):
        raise torch.linalg.LinAlgError("the algorithm failed to converge")

    monkeypatch.setattr(torch.linalg, "eigh", fail)
    with caplog.at_level(logging.WARNING, logger="gamfunc.metrics"):
        got = metrics.top_eigenvalues({"w": torch.ones(3)}, X, loss_fn, k=1, iters=5)
    assert torch.isnan(got).all() and "eigendecomposition failed" in caplog.text


def test_measurable_weights_are_measured_as_before():
    p = {"w": torch.ones(3)}
    want = torch.linalg.eigvalsh(2 * X.T @ X / len(X)).flip(0)[:2]
    torch.testing.assert_close(metrics.top_eigenvalues(p, X, loss_fn, k=2, iters=20), want)
    value, vectors = metrics.top_eigenvalues(p, X, loss_fn, k=1, iters=20, return_eigenvectors=True)
    torch.testing.assert_close(value, want[:1])
    assert len(vectors) == 1
    nan, none = metrics.top_eigenvalues(
        {"w": torch.full((3,), float("nan"))}, X, loss_fn, return_eigenvectors=True
    )
    assert torch.isnan(nan).all() and none is None


def test_each_guarded_metric_has_one_name():
    """The public metric is the guarded one, under its package name and its module's name alike."""
    from gamfunc.metrics import flatness, hessian

    assert metrics.top_eigenvalues is hessian.top_eigenvalues
    assert metrics.hessian_trace is hessian.hessian_trace
    assert metrics.first_order_flatness is flatness.first_order_flatness
    assert metrics.zeroth_order_flatness is flatness.zeroth_order_flatness
    with_nan = {"w": torch.full((3,), float("nan"))}
    for name in CALLS:
        assert torch.isnan(CALLS[name](with_nan)).all()  # the names above are the guarded ones


def test_a_metric_inside_another_is_checked_once(monkeypatch, caplog):
    """R1's Lanczos start runs top_eigenvalues inside first_order_flatness: a failed
    eigendecomposition there is the outer metric's NaN and its one line."""

    def fail(*args, **kwargs):
        raise torch.linalg.LinAlgError("the algorithm failed to converge")

    monkeypatch.setattr(torch.linalg, "eigh", fail)
    with caplog.at_level(logging.WARNING, logger="gamfunc.metrics"):
        got = metrics.first_order_flatness(
            {"w": torch.ones(3)}, X, loss_fn, 0.1, init="eigenvector"
        )
    assert torch.isnan(got)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("first_order_flatness: NaN, the eigendecomp")


def test_inside_checked_a_metric_runs_unchecked(monkeypatch):
    """A caller that checks θ itself (the landscapes) gets the failure, to log it once."""
    from gamfunc.metrics.guard import checked

    def fail(*args, **kwargs):
        raise torch.linalg.LinAlgError("the algorithm failed to converge")

    monkeypatch.setattr(torch.linalg, "eigh", fail)
    with checked(), pytest.raises(torch.linalg.LinAlgError):
        metrics.top_eigenvalues({"w": torch.ones(3)}, X, loss_fn, k=1, iters=5)
    assert torch.isnan(metrics.top_eigenvalues({"w": torch.ones(3)}, X, loss_fn, k=1, iters=5))
