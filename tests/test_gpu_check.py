"""The GPU check (tests/gpu_check.py): every estimator in every precision and mode on a CUDA device,
each step against its float64 step. ``pytest -m gpu tests/test_gpu_check.py`` runs every case on a
CUDA machine; without CUDA those cases skip, and the check's own tests run its eager cases on the CPU."""

from __future__ import annotations

import json

import gpu_check
import pytest
import torch

import gamfunc

CUDA_CASES = gpu_check.cases("cuda")


def _id(case) -> str:
    return "-".join(case)


@pytest.fixture(scope="module")
def gpu_rows():
    """Every case's row, the groups run in parallel worker processes so that compiles overlap."""
    rows = gpu_check.run_all("cuda")
    return {(r["model"], r["precision"], r["mode"], r["estimator"]): r for r in rows}


def _row(rows: dict, case) -> dict:
    if case in rows:
        return rows[case]
    died = [r for r in rows.values() if r["estimator"] == "-" and r["mode"] == case[2]]
    pytest.fail(f"no result for {case}; " + "; ".join(r["error"] for r in died)[:2000])


@pytest.mark.gpu
@pytest.mark.parametrize("case", CUDA_CASES, ids=_id)
def test_the_step_on_the_gpu_matches_float64(gpu_rows, case):
    row = _row(gpu_rows, case)
    assert row["status"] == "pass", gpu_check._line(row) + "\n" + "\n".join(row.get("trace", []))


def test_every_checked_estimator_is_in_the_registry_and_each_case_is_listed_once():
    from registry import ESTIMATORS

    assert set(gpu_check.CHECKED) <= set(ESTIMATORS)
    assert len(CUDA_CASES) == len(set(CUDA_CASES)) == 11 * 2 * 2 * 4 + 3
    steps = [g for g, _ in gpu_check.groups("cuda") if g.endswith(":step")]
    assert len(steps) == 11 * 2 * 2  # every whole-step case a group of its own


def test_a_finite_difference_widens_the_tolerance_by_its_rounding_gain():
    h = gpu_check.ESTIMATORS["gam_fd"]().hparams
    assert gpu_check.amplification("gam_fd") == pytest.approx(
        1 + 2 * h["alpha"] * h["rho"] / h["hvp"].radius
    )
    assert gpu_check.amplification("gam_exact") == 1.0
    gamma = gpu_check.ESTIMATORS["wsam"]().hparams["gamma"]
    a = gamma / (1 - gamma)
    assert gpu_check.amplification("wsam") == pytest.approx(abs(1 - a) + a)


@pytest.mark.slow
def test_the_eager_cases_pass_on_the_cpu():
    rows = gpu_check.run_all("cpu", workers=2, names=("gam_exact", "gam_fd"))
    got = {(r["model"], r["precision"], r["estimator"]) for r in rows if r["estimator"] != "facade"}
    want = {
        (m, p, e)
        for m in ("resnet", "vit")
        for p in ("fp32", "bf16")
        for e in ("gam_exact", "gam_fd")
    }
    assert want <= got
    assert all(r["status"] == "pass" for r in rows), [r for r in rows if r["status"] != "pass"]


def test_a_wrong_step_fails_the_check(monkeypatch):
    # A bug that moves the update by more than rounding is a failed case, not a pass.
    real = gamfunc.make_step

    def off_by_a_little(estimator, optimizer, loss_fn, **kw):
        return real(estimator, gamfunc.sgd(lr=0.1 * 1.01, momentum=0.9), loss_fn, **kw)

    def reference(model, estimator, device):
        net, batch = gpu_check.build(model, device, torch.float64)
        loss_fn, params, buffers = gamfunc.nn.functionalize(net)
        step = real(gpu_check.ESTIMATORS[estimator](), gamfunc.sgd(lr=0.1, momentum=0.9), loss_fn)
        new, _, m = step(params, step.init(params, buffers), batch)
        return gpu_check._update(new, params), float(m["loss"])

    monkeypatch.setattr(gpu_check.gamfunc, "make_step", off_by_a_little)
    monkeypatch.setattr(gpu_check, "reference", reference)
    rows = gpu_check.run_group("vit", "fp32", "eager", torch.device("cpu"), ["gradient"])
    assert [r["status"] for r in rows] == ["fail"]
    assert 5e-3 < rows[0]["update_rel_err"] < 2e-2


@pytest.mark.slow
def test_the_command_writes_every_case_and_a_summary(tmp_path, capsys):
    out = tmp_path / "check.json"
    assert gpu_check.main(["--device", "cpu", "--estimators", "gradient", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["benchmark"] == "gpu_check" and result["meta"]["slug"] == "cpu"
    assert result["meta"]["passed"] == len(result["rows"]) == 2 * 2 + 3
    assert capsys.readouterr().out.splitlines()[-1].startswith("gpu_check: 7 passed, 0 failed")
