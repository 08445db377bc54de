"""Smoke test of benchmarks/step_cost.py: its ``--tiny`` CPU mode runs every estimator and writes a
complete table and JSON. No timing is asserted (CPU timings on a shared machine say nothing)."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "step_cost.py"
ESTIMATORS = [
    "gradient",
    "sam",
    "gnp",
    "gam_exact",
    "gam_reverse",
    "gam_fd",
    "gam_accelerated",
    "sam_gam",
    "gam_every10",
]


def run(tmp_path, *args):
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny", "--out", str(out), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


def finite_positive(v):
    return isinstance(v, float) and math.isfinite(v) and v > 0


def test_tiny_runs_every_estimator_and_reports_every_column(tmp_path):
    result, stdout = run(tmp_path)
    rows = {r["method"]: r for r in result["rows"]}
    assert sorted(rows) == sorted(["torch_sgd", *ESTIMATORS])
    for name, r in rows.items():
        assert r["error"] is None, (name, r["error"])
        assert (r["model"], r["dtype"], r["mode"], r["batch"]) == ("tiny", "fp32", "eager", 4)
        for key in ("ms", "img_s", "x_sgd", "first_call_s"):
            assert finite_positive(r[key]), (name, key, r[key])
        assert len(r["ms_samples"]) == 2  # --tiny: two interleaved rounds
        assert r["img_s"] == r["batch"] / r["ms"] * 1e3
        if name != "torch_sgd":
            assert finite_positive(r["x_grad"]), name
    assert rows["torch_sgd"]["x_sgd"] == 1.0
    assert rows["gradient"]["x_grad"] == 1.0
    # × floor exists exactly for the estimators built from gradients only.
    floors = {m for m, r in rows.items() if r.get("x_floor") is not None}
    assert floors == {
        "gradient",
        "sam",
        "gnp",
        "gam_fd",
        "gam_accelerated",
        "sam_gam",
        "gam_every10",
    }
    meta = result["meta"]
    assert meta["torch"] == torch.__version__
    assert meta["device"] == "cpu"
    assert meta["no_loop_reorder"] is False
    assert meta["model_source"] == {"tiny": "benchmarks.step_cost.TinyNet"}
    assert "| model | dtype | mode | method | ms/step |" in stdout
    for name in rows:
        assert f"| {name} |" in stdout


def test_only_dtype_and_loop_reorder_flags(tmp_path):
    result, _ = run(tmp_path, "--only", "sam,gam_fd", "--dtype", "fp32,bf16", "--no-loop-reorder")
    got = sorted((r["method"], r["dtype"]) for r in result["rows"])
    want = sorted((m, d) for m in ("torch_sgd", "sam", "gam_fd") for d in ("fp32", "bf16"))
    assert got == want
    for r in result["rows"]:
        assert r["error"] is None, r["error"]
        if r["dtype"] == "bf16":  # bf16 images/s over the same method's fp32 images/s
            assert finite_positive(r["x_fp32"])
    assert result["meta"]["no_loop_reorder"] is True
    assert result["meta"]["loop_ordering_after_fusion"] is False


def test_unknown_estimator_is_rejected(capsys):
    spec = importlib.util.spec_from_file_location("step_cost", SCRIPT)
    step_cost = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(step_cost)
    with pytest.raises(SystemExit) as exit_info:
        step_cost.parse(["--tiny", "--only", "sam,adam"])
    assert exit_info.value.code == 2
    assert "--only: unknown ['adam']" in capsys.readouterr().err
