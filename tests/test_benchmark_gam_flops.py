"""benchmarks/gam_flops.py counts each region in gradient passes; on the tiny conv net the shared
forward-over-reverse point costs the gradient and the tangent's two passes, the unshared one four."""

from __future__ import annotations

import json

from benchmarks import gam_flops


def test_the_counts_of_the_tiny_net(tmp_path):
    out = tmp_path / "flops.json"
    gam_flops.main(["--models", "tiny", "--only", "grad,jvp_of_grad,point_fwd", "--out", str(out)])
    table = json.loads(out.read_text())["models"]["tiny"]
    assert set(table) == {"grad", "jvp_of_grad", "point_fwd"}
    for way in gam_flops.WAYS:
        assert table["grad"][way] == 1.0
        assert table["jvp_of_grad"][way] == 3.0  # primal 1 + tangent 2
    assert table["point_fwd"]["native"] == table["point_fwd"]["elementary"] == 4.0
    assert table["point_fwd"]["elementary_shared"] == 3.0
