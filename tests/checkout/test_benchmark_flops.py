"""``python -m benchmarks.flops`` counts each region in gradient passes: on the tiny conv net the
shared forward-over-reverse point costs the gradient and the tangent's two passes, the unshared one
four. ``python -m benchmarks.flops.passes`` runs every region on the CPU and reports it in units of
one gradient pass; the point regions return the same ∇L and the same H·∇L/‖∇L‖ (forward-over-reverse
and reverse-over-reverse). No timing is asserted."""

from __future__ import annotations

import json

import torch

from benchmarks.flops import __main__ as flops
from benchmarks.flops import passes
from gamfunc import tree


def test_the_counts_of_the_tiny_net(tmp_path):
    out = tmp_path / "flops.json"
    flops.main(["--quick", "--only", "grad,jvp_of_grad,point_fwd", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["benchmark"] == "flops" and result["meta"]["slug"] == "any"
    table = {r["region"]: r for r in result["rows"] if r["model"] == "tiny"}
    assert set(table) == {"grad", "jvp_of_grad", "point_fwd"}
    for way in flops.WAYS:
        assert table["grad"][way] == 1.0
        assert table["jvp_of_grad"][way] == 3.0  # primal 1 + tangent 2
    assert table["point_fwd"]["native"] == table["point_fwd"]["elementary"] == 4.0
    assert table["point_fwd"]["elementary_shared"] == 3.0


def test_every_region_runs_and_is_reported_in_gradient_passes(tmp_path):
    out = tmp_path / "passes.json"
    result = passes.main(["--quick", "--backend", "eager", "--out", str(out)])
    rows = {r["region"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == set(passes.ROWS) == {r["region"] for r in result["rows"]}
    assert rows["grad"]["x_grad"] == 1.0
    for name in passes.ROWS:
        assert rows[name]["ms"] > 0 and rows[name]["x_grad"] > 0, name
        assert rows[name]["x_grad"] == rows[name]["ms"] / rows["grad"]["ms"]


def test_the_point_regions_agree():
    torch.manual_seed(0)
    model = passes.build("tiny").double()
    loss3, params, buffers = passes.loss_of(model, False, torch.device("cpu"))
    x = torch.randn(4, 3, 8, 8, dtype=torch.float64)
    batch = (x, torch.randint(0, 10, (4,)))
    v = {k: torch.zeros_like(p) for k, p in params.items()}
    fns = passes.regions(loss3)
    g_fwd, f_fwd, _ = fns["point_fwd"](params, buffers, batch, v)
    g_rev, f_rev, _ = fns["point_rev"](params, buffers, batch, v)
    g, _ = fns["grad"](params, buffers, batch, v)
    for k in params:
        torch.testing.assert_close(g_fwd[k], g[k], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(g_rev[k], g[k], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(f_fwd[k], f_rev[k], rtol=1e-9, atol=1e-12)
    assert float(tree.norm(f_fwd)) > 0
