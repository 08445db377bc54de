"""benchmarks/hessian_cost.py runs end to end in its --tiny CPU mode."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "hessian_cost.py"


@pytest.mark.slow
def test_hessian_cost_tiny_writes_a_table_and_json(tmp_path, capsys):
    pytest.importorskip("torchvision")
    spec = importlib.util.spec_from_file_location("hessian_cost", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "hessian_cost.json"
    result = module.main(["--tiny", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    methods = [r["method"] for r in result["rows"]]
    assert any("PyHessian power iteration" in m for m in methods)
    assert any("gamfunc Lanczos" in m for m in methods)
    assert any("PyHessian loop" in m for m in methods)
    assert all(r["seconds"] > 0 for r in result["rows"])
    traces = [r["value"] for r in result["rows"] if r["method"].startswith("trace")]
    assert all(math.isfinite(t) for t in traces)
    # gamfunc's trace rows share one seed and one probe draw: they agree whatever the chunking.
    gamfunc_traces = traces[-4:]
    assert max(gamfunc_traces) - min(gamfunc_traces) < 1e-4 * abs(gamfunc_traces[0])
    assert "ratio" in capsys.readouterr().out
