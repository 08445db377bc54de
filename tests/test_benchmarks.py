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
    "grad_eval",
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
        "grad_eval",
        "gradient",
        "sam",
        "gnp",
        "gam_fd",
        "gam_accelerated",
        "sam_gam",
        "gam_every10",
    }
    # × grad evals: the same, over one plain gradient evaluation (grad_eval) instead of a step.
    evals = {m for m, r in rows.items() if r.get("x_evals") is not None}
    assert evals == floors - {"grad_eval"}
    for m in evals:
        r = rows[m]
        assert r["x_evals"] == pytest.approx(r["ms"] / (r["grads"] * rows["grad_eval"]["ms"]))
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


def load_step_cost():
    spec = importlib.util.spec_from_file_location("step_cost", SCRIPT)
    step_cost = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(step_cost)
    return step_cost


def test_every_k_methods_mix_estimators_as_stated():
    """``gam_every<k>``: GAM on one step in k, gradient steps between; ``sam_gam_every<k>``: SAM+GAM
    on one step in k, SAM steps between (the overhead table of paper Table app:tab:time)."""
    step_cost = load_step_cost()
    a = step_cost.parse(["--tiny", "--only", "sam_gam_every20,gam_every2,gradient,gam_every20"])
    assert step_cost.method_names(a.only) == [
        "gradient",
        "gam_every2",
        "gam_every20",
        "sam_gam_every20",
    ]
    methods = step_cost.build_methods(a, a.only)
    est, every, base, grads = methods["gam_every2"]
    assert (every, base, grads) == (2, None, (4 + 1) / 2)  # one 4-gradient step, one plain
    est, every, base, grads = methods["sam_gam_every20"]
    assert every == 20 and grads == (5 + 19 * 2) / 20  # one SAM+GAM step, 19 SAM steps
    assert base is methods["sam"][0]
    assert est.name != base.name


@pytest.mark.parametrize("bad", ["gam_every1", "gam_every0", "sam_every4", "gam_everyx"])
def test_bad_every_k_names_are_rejected(capsys, bad):
    step_cost = load_step_cost()
    with pytest.raises(SystemExit):
        step_cost.parse(["--tiny", "--only", bad])
    assert f"--only: unknown ['{bad}']" in capsys.readouterr().err


def test_tiny_every_k_runs(tmp_path):
    result, _ = run(tmp_path, "--only", "sam,gam_every2,sam_gam_every3")
    rows = {r["method"]: r for r in result["rows"]}
    assert set(rows) == {"torch_sgd", "sam", "gam_every2", "sam_gam_every3"}
    for r in rows.values():
        assert r["error"] is None, r["error"]
        assert r["img_s"] > 0
