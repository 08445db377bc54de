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
    "grad_eval_func",
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
        "grad_eval_func",
        "gradient",
        "sam",
        "gnp",
        "gam_fd",
        "gam_accelerated",
        "sam_gam",
        "gam_every10",
    }
    # × grad evals: the same, over one plain gradient evaluation (the grad_eval row, eager
    # torch.autograd.grad) instead of a step; grad_eval_func (torch.func.grad) is measured against it.
    assert rows["grad_eval"]["grad_impl"] == "torch.autograd.grad"
    assert rows["grad_eval_func"]["grad_impl"] == "torch.func.grad"
    evals = {m for m, r in rows.items() if r.get("x_evals") is not None}
    assert evals == floors - {"grad_eval"}
    for m in evals:
        r = rows[m]
        assert r["x_evals"] == pytest.approx(r["ms"] / (r["grads"] * rows["grad_eval"]["ms"]))
    assert rows["grad_eval_func"]["x_evals"] == pytest.approx(
        rows["grad_eval_func"]["ms"] / rows["grad_eval"]["ms"]
    )
    meta = result["meta"]
    assert meta["torch"] == torch.__version__
    assert meta["device"] == "cpu"
    assert meta["no_loop_reorder"] is False
    assert meta["model_source"] == {"tiny": "benchmarks.step_cost.TinyNet"}
    assert meta["inductor_options"] == {}
    assert all("profile" not in r for r in rows.values())  # only with --profile
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


def tiny_model(step_cost):
    torch.manual_seed(0)
    loss_fn, params, buffers = step_cost.functional_loss(
        step_cost.TinyNet(), torch.device("cpu"), "fp32"
    )
    gen = torch.Generator().manual_seed(1)
    batch = (torch.randn(4, 3, 8, 8, generator=gen), torch.randint(0, 10, (4,), generator=gen))
    return loss_fn, params, buffers, batch


def test_grad_eval_rows_compute_the_gradient_with_the_stated_functions(monkeypatch):
    """Eager ``grad_eval`` is ``torch.autograd.grad`` and ``grad_eval_func`` ``torch.func.grad``;
    both give the gradient (and BatchNorm buffers) of ``torch.func.grad``, the reference."""
    step_cost = load_step_cost()
    loss_fn, params, buffers, batch = tiny_model(step_cost)
    want, want_buffers = torch.func.grad(loss_fn, has_aux=True)(params, batch, buffers)
    calls = []  # torch.func.grad's eager transform also ends in torch.autograd.grad: count both
    autograd_grad, func_grad = torch.autograd.grad, torch.func.grad
    monkeypatch.setattr(
        torch.autograd, "grad", lambda *a, **k: calls.append("autograd") or autograd_grad(*a, **k)
    )
    monkeypatch.setattr(
        torch.func, "grad", lambda *a, **k: calls.append("func") or func_grad(*a, **k)
    )
    for impl, want_calls in (("autograd", ["autograd"]), ("func", ["func", "autograd"])):
        calls.clear()
        runner = step_cost.GradEval(loss_fn, params, buffers, batch, "eager", impl)
        runner()
        assert calls == want_calls, impl
        assert runner.impl == {"autograd": "torch.autograd.grad", "func": "torch.func.grad"}[impl]
        got, got_buffers = runner.fn(runner.params, batch, runner.buffers)
        assert got.keys() == want.keys()
        for k in want:
            torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-7)
        for k in want_buffers:
            torch.testing.assert_close(got_buffers[k], want_buffers[k])
    # Compiled, both rows are torch.func.grad under torch.compile (not called: no compile here).
    for impl in ("autograd", "func"):
        runner = step_cost.GradEval(loss_fn, params, buffers, batch, "compile", impl)
        assert runner.impl == "torch.func.grad" and runner.compiled
    with pytest.raises(ValueError, match="impl"):
        step_cost.GradEval(loss_fn, params, buffers, batch, "eager", "vjp")


def test_inductor_options_are_parsed_as_literals_and_merged_over_the_mode():
    step_cost = load_step_cost()
    a = step_cost.parse(
        [
            "--tiny",
            "--inductor",
            "combo_kernels=True",
            "--inductor",
            "max_autotune_gemm_backends=ATEN,TRITON",
            "--inductor",
            "cpp.simdlen=8",
            "--inductor",
            "combo_kernels=False",  # the later one wins
        ]
    )
    assert a.inductor_options == {
        "combo_kernels": False,
        "max_autotune_gemm_backends": "ATEN,TRITON",
        "cpp.simdlen": 8,
    }
    assert step_cost.parse(["--tiny"]).inductor_options == {}
    assert step_cost.compile_options("compile", {"combo_kernels": True}) == {"combo_kernels": True}
    assert step_cost.compile_options("reduce-overhead", {"combo_kernels": True}) == {
        "triton.cudagraphs": True,
        "combo_kernels": True,
    }
    assert step_cost.compile_options("reduce-overhead", {"triton.cudagraphs": False}) == {
        "triton.cudagraphs": False
    }


def test_step_cost_pass_modes_compile_each_pass_with_the_named_mode():
    step_cost = load_step_cost()
    assert step_cost.split_mode("pass") == ("pass", "compile")
    assert step_cost.split_mode("pass-reduce-overhead") == ("pass", "reduce-overhead")
    assert step_cost.split_mode("reduce-overhead") == ("step", "reduce-overhead")
    assert step_cost.compile_options("pass-reduce-overhead") == step_cost.compile_options(
        "reduce-overhead"
    )
    assert step_cost.compile_options("pass") == {}


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("combo_kernels", "expected KEY=VALUE"),
        ("=True", "expected KEY=VALUE"),
        ("no_such_option=1", "unknown inductor option 'no_such_option'"),
        ("combo_kernels=1", "combo_kernels must be bool"),
    ],
)
def test_bad_inductor_options_are_rejected(capsys, item, message):
    step_cost = load_step_cost()
    with pytest.raises(SystemExit):
        step_cost.parse(["--tiny", "--inductor", item])
    err = capsys.readouterr().err
    assert "--inductor" in err and message in err
    with pytest.raises(ValueError, match="--inductor"):
        step_cost.inductor_options([item])


def test_tiny_profile_writes_the_profile_fields(tmp_path):
    """``--profile 2`` on CPU: per method the profiled steps, host time and the top aten ops by self
    CPU time, per step. The tiny net has two convolutions, so one gradient evaluation calls
    ``aten::convolution_backward`` twice; ``gam_every2`` (fd) averages 4 and 1 evaluations."""
    result, stdout = run(
        tmp_path,
        "--only",
        "grad_eval,grad_eval_func,gam_every2",
        "--profile",
        "2",
        "--inductor",
        "combo_kernels=True",
    )
    meta = result["meta"]
    assert meta["inductor_options"] == {"combo_kernels": True}
    assert meta["args"]["profile"] == 2
    assert "inductor combo_kernels=True" in stdout
    rows = {r["method"]: r for r in result["rows"]}
    assert set(rows) == {"torch_sgd", "grad_eval", "grad_eval_func", "gam_every2"}
    conv_backward = {"torch_sgd": 2.0, "grad_eval": 2.0, "grad_eval_func": 2.0, "gam_every2": 5.0}
    for name, r in rows.items():
        assert r["error"] is None, (name, r["error"])
        p = r["profile"]
        assert p["steps"] == 2, name
        for key in ("host_ms", "host_ms_unprofiled", "aten_ops"):
            assert finite_positive(float(p[key])), (name, key, p[key])
        assert "top_kernels" not in p and "device_ms" not in p  # CPU: no device
        top = p["top_ops"]
        assert 0 < len(top) <= 15
        times = [op["self_us_per_step"] for op in top]
        assert times == sorted(times, reverse=True)
        for op in top:
            assert op["name"].startswith("aten::") and len(op["name"]) <= 80
            assert op["calls_per_step"] > 0
        # Self times of one thread's ops never overlap: they fit in the step's wall time.
        assert sum(times) <= p["host_ms"] * 1e3
        calls = {op["name"]: op["calls_per_step"] for op in top}
        assert calls["aten::convolution_backward"] == conv_backward[name], name
