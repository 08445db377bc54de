"""Flatness metrics over a data set taken in batches (PyHessian's "full dataset" mode) equal the same
metrics on one batch holding all of it: every H·v and gradient is the size-weighted mean over batches
(gamfunc.accumulate). Tiny tanh MLP, float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gamfunc import metrics
from gamfunc.wrappers.accumulate import accumulate

F64 = torch.float64


def problem(n=30):
    g = torch.Generator().manual_seed(0)
    params = {
        "w1": torch.randn(8, 5, generator=g, dtype=F64),
        "b1": torch.randn(8, generator=g, dtype=F64),
        "w2": torch.randn(3, 8, generator=g, dtype=F64),
    }
    batch = torch.randn(n, 5, generator=g, dtype=F64), torch.randint(0, 3, (n,), generator=g)
    return params, batch


def loss_fn(p, batch):
    x, y = batch
    return F.cross_entropy(torch.tanh(x @ p["w1"].T + p["b1"]) @ p["w2"].T, y)


@pytest.mark.parametrize("k", [3, 7])
def test_eigenvalues_trace_and_r1_over_k_batches_equal_the_whole_batch(k):
    params, batch = problem()
    whole, parts = loss_fn, accumulate(loss_fn, k)
    gen = lambda: torch.Generator().manual_seed(5)  # noqa: E731
    lam = metrics.top_eigenvalues(params, batch, whole, k=3, iters=40, generator=gen())
    lam_k = metrics.top_eigenvalues(params, batch, parts, k=3, iters=40, generator=gen())
    torch.testing.assert_close(lam_k, lam, rtol=1e-8, atol=1e-10)
    dense = torch.func.hessian(lambda w: loss_fn({**params, "w2": w}, batch))(params["w2"])
    assert lam[0] >= torch.linalg.eigvalsh(dense.reshape(24, 24))[-1] - 1e-8  # a real eigenvalue
    tr = metrics.hessian_trace(params, batch, whole, samples=20, generator=gen())
    tr_k = metrics.hessian_trace(params, batch, parts, samples=20, generator=gen())
    torch.testing.assert_close(tr_k, tr, rtol=1e-10, atol=1e-12)
    r1 = metrics.first_order_flatness(params, batch, whole, 0.05, steps=5, generator=gen())
    r1_k = metrics.first_order_flatness(params, batch, parts, 0.05, steps=5, generator=gen())
    torch.testing.assert_close(r1_k, r1, rtol=1e-8, atol=1e-12)


def test_reproduce_flatness_batches_give_the_one_batch_metrics(monkeypatch):
    """reproduce's --flatness_batch: the metrics of 200 digits over batches of 64 equal those of one
    batch of 200 (float32 rounding apart)."""
    pytest.importorskip("sklearn")
    from reproduce.build import setup
    from reproduce.config import resolve
    from reproduce.data import sets as D
    from reproduce.run.evaluation import flatness

    base = ["--preset=digits", "--estimator=sgd", "--eig_iters=20", "--trace_samples=5"]
    base += ["--r1_steps=2", "--landscape=false", "--flatness_samples=200"]
    cfg = resolve(base)
    data = D.load(cfg)
    t = setup(cfg, "sgd", data, torch.device("cpu"))
    probe = D.stack(data.probe, torch.arange(200))
    one, _ = flatness(cfg, t.loss_fn, t.params, t.state.buffers, probe, "cpu")
    cfg_k = resolve([*base, "--flatness_batch=64"])
    import gamfunc.wrappers.accumulate

    made = []
    real = gamfunc.wrappers.accumulate.accumulate
    monkeypatch.setattr(
        gamfunc.wrappers.accumulate, "accumulate", lambda f, k: made.append(k) or real(f, k)
    )
    many, _ = flatness(cfg_k, t.loss_fn, t.params, t.state.buffers, probe, "cpu")
    assert made == [4]  # 200 examples in batches of at most 64
    assert one.keys() == many.keys() == {"lambda_max", "trace", "r1"}
    for key in one:
        assert many[key] == pytest.approx(one[key], rel=1e-4), key
