"""Smoke test of benchmarks/gam_passes.py: every region of the per-pass profile runs on the CPU and
is reported in units of one gradient pass. No timing is asserted; the regions' values are: the point
regions return the same ∇L and the same H·∇L/‖∇L‖ (forward-over-reverse and reverse-over-reverse)."""

from __future__ import annotations

import json

import torch

from benchmarks import gam_passes
from gamfunc import tree


def test_every_region_runs_and_is_reported_in_gradient_passes(tmp_path):
    out = tmp_path / "passes.json"
    result = gam_passes.main(
        [
            "--model",
            "tiny",
            "--backend",
            "eager",
            "--steps",
            "1",
            "--repeats",
            "1",
            "--out",
            str(out),
        ]
    )
    rows = json.loads(out.read_text())["rows"]
    assert set(rows) == set(gam_passes.ROWS) == set(result["rows"])
    assert rows["grad"]["x_grad"] == 1.0
    for name in gam_passes.ROWS:
        assert rows[name]["ms"] > 0 and rows[name]["x_grad"] > 0, name


def test_the_point_regions_agree():
    torch.manual_seed(0)
    model = gam_passes.build("tiny").double()
    loss3, params, buffers = gam_passes.loss_of(model, False, torch.device("cpu"))
    x = torch.randn(4, 3, 8, 8, dtype=torch.float64)
    batch = (x, torch.randint(0, 10, (4,)))
    v = {k: torch.zeros_like(p) for k, p in params.items()}
    fns = gam_passes.regions(loss3)
    g_fwd, f_fwd, _ = fns["point_fwd"](params, buffers, batch, v)
    g_rev, f_rev, _ = fns["point_rev"](params, buffers, batch, v)
    g, _ = fns["grad"](params, buffers, batch, v)
    for k in params:
        torch.testing.assert_close(g_fwd[k], g[k], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(g_rev[k], g[k], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(f_fwd[k], f_rev[k], rtol=1e-9, atol=1e-12)
    assert float(tree.norm(f_fwd)) > 0
