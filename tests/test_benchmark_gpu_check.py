"""benchmarks/gpu_check.py on the CPU: its eager cases pass, its failures are reported as failures."""

from __future__ import annotations

import json

import pytest
import torch

import gamfunc
from benchmarks import gpu_check


@pytest.mark.slow
def test_eager_cases_pass_against_float64_and_are_written(tmp_path, capsys):
    out = tmp_path / "check.json"
    args = ["--device", "cpu", "--models", "resnet,vit", "--estimators", "gam_exact,gam_fd"]
    code = gpu_check.main([*args, "--workers", "2", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert code == 0
    got = {(r["model"], r["precision"], r["estimator"]) for r in rows if r["estimator"] != "facade"}
    want = {
        (m, p, e)
        for m in ("resnet", "vit")
        for p in ("fp32", "bf16")
        for e in ("gam_exact", "gam_fd")
    }
    assert want <= got
    assert all(r["status"] == "pass" for r in rows), [r for r in rows if r["status"] != "pass"]
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("gpu_check: ") and " 0 failed" in lines[-1]


def test_a_wrong_step_fails_the_check(monkeypatch):
    # A bug that moves the update by more than rounding is a failed case, not a pass.
    real = gamfunc.make_step

    def off_by_a_little(estimator, optimizer, loss_fn, **kw):
        return real(estimator, gamfunc.sgd(lr=0.1 * 1.01, momentum=0.9), loss_fn, **kw)

    monkeypatch.setattr(gpu_check.gamfunc, "make_step", off_by_a_little)
    monkeypatch.setattr(gpu_check, "reference", _reference_with(real))
    rows = gpu_check.run_group(
        "vit", "fp32", "eager", torch.device("cpu"), float("inf"), ["gradient"]
    )
    assert [r["status"] for r in rows] == ["fail"]
    assert 5e-3 < rows[0]["update_rel_err"] < 2e-2


def _reference_with(make_step):
    def reference(model, estimator, device):
        net, batch = gpu_check.build(model, device, torch.float64)
        loss_fn, params, buffers = gamfunc.nn.functionalize(net)
        opt = gamfunc.sgd(lr=0.1, momentum=0.9)
        step = make_step(gpu_check.ESTIMATORS[estimator](), opt, loss_fn)
        new, _, m = step(params, step.init(params, buffers), batch)
        return gpu_check._update(new, params), float(m["loss"])

    return reference
