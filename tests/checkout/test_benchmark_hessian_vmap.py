"""``python -m benchmarks.hessian_cost`` and ``python -m benchmarks.vmap_members`` in their --quick
forms on the CPU: every row is written with the values it computed. No timing is asserted."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import hessian_cost, vmap_members


@pytest.mark.slow
def test_hessian_cost_quick_writes_a_table_and_json(tmp_path, capsys):
    out = tmp_path / "hessian_cost.json"
    result = hessian_cost.main(["--quick", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert result["benchmark"] == "hessian_cost" and result["meta"]["model"] == "tiny CNN"
    methods = [r["method"] for r in result["rows"]]
    assert any("PyHessian power iteration" in m for m in methods)
    assert any("gamfunc Lanczos" in m for m in methods)
    assert any("PyHessian loop" in m for m in methods)
    traces = [r["value"] for r in result["rows"] if r["method"].startswith("trace")]
    assert all(math.isfinite(t) for t in traces)
    # gamfunc's trace rows share one seed and one probe draw: they agree whatever the chunking.
    gamfunc_traces = traces[-4:]
    assert max(gamfunc_traces) - min(gamfunc_traces) < 1e-4 * abs(gamfunc_traces[0])
    assert "ratio" in capsys.readouterr().out


def test_vmap_members_quick_times_each_count_against_its_loop(tmp_path):
    out = tmp_path / "vmap.json"
    result = vmap_members.main(["--quick", "--device", "cpu", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert [r["members"] for r in result["rows"]] == [1, 4]
    for r in result["rows"]:
        assert r["looped_over_vmapped"] == r["looped_ms"] / r["vmapped_ms"]
