"""The GPU check (tests/gpu_check.py): every estimator in every precision and mode on a CUDA device,
each step against its float64 step. ``pytest -m gpu tests/library/test_gpu_check.py`` runs every case on a
CUDA machine; without CUDA those cases skip, and the check's own tests run its eager cases on the CPU."""

from __future__ import annotations

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
    assert set(gpu_check.STATEFUL) <= set(gpu_check.CHECKED)
    # 14 estimators without state on both models, the 6 with state on the ResNet
    # and the extras: the ensemble (2), the facade, the adaptive and late policies' graphed steps
    assert len(CUDA_CASES) == len(set(CUDA_CASES)) == (14 * 2 + 6) * 2 * 4 + 5 == 277
    assert {c[0] for c in CUDA_CASES if c[3] in gpu_check.STATEFUL} == {"resnet"}
    steps = [g for g, _ in gpu_check.groups("cuda") if g.endswith(":step")]
    assert len(steps) == (14 * 2 + 6) * 2  # every whole-step case a group of its own
    listed = [(g.split(":")[0], n) for g, part in gpu_check.groups("cuda") for n in part]
    assert not [c for c in listed if c[0] == "vit" and c[1] in gpu_check.STATEFUL]


def test_a_trajectory_runs_each_branch_of_a_cycle_three_times():
    for name in gpu_check.STATEFUL:
        every = gpu_check.ESTIMATORS[name]().every
        branches = [t % every == 0 for t in range(gpu_check.trajectory(name))]
        assert branches[0] and branches.count(True) == gpu_check.CALLS, name
        if every > 1:
            assert branches.count(False) >= gpu_check.CALLS, name
    assert gpu_check.trajectory("looksam") == 7 and gpu_check.trajectory("gam_exact") == 1


def test_a_finite_difference_widens_the_tolerance_by_its_rounding_gain():
    h = gpu_check.ESTIMATORS["gam_fd"]().hparams
    assert gpu_check.amplification("gam_fd") == pytest.approx(
        1 + 2 * h["alpha"] * h["rho"] / h["hvp"].radius
    )
    assert gpu_check.amplification("gam_exact") == 1.0
    gamma = gpu_check.ESTIMATORS["wsam"]().hparams["gamma"]
    a = gamma / (1 - gamma)
    assert gpu_check.amplification("wsam") == pytest.approx(abs(1 - a) + a)
    assert gpu_check.amplification("wsam_decoupled") == gpu_check.amplification("wsam")
    alpha = gpu_check.ESTIMATORS["looksam"]().hparams["alpha"]
    assert gpu_check.amplification("looksam", 15.0) == pytest.approx(1 + alpha * 15.0)
    assert gpu_check.amplification("look_gam") == gpu_check.amplification("friendly_sam") == 1.0


def test_the_stateful_trajectories_pass_on_the_cpu():
    # On the ViT with batches of 8 images, where a CPU runs them in seconds; LookGAM, whose
    # float64 reference (forward-over-reverse) alone takes ~20 s there, runs on the GPU only.
    names = ["looksam", "friendly_sam", "msam", "rwp"]
    cpu = torch.device("cpu")
    rows = [
        r
        for p in gpu_check.PRECISIONS
        for r in gpu_check.run_group("vit", p, "eager", cpu, names, 8)
    ]
    assert [(r["precision"], r["estimator"]) for r in rows] == [
        (p, n) for p in gpu_check.PRECISIONS for n in names
    ]
    assert all(r["status"] == "pass" for r in rows), rows
    assert {r["steps"] for r in rows} == {7, 3}  # msam and rwp: 3, as friendly_sam
    looksam = [r for r in rows if r["estimator"] == "looksam"]
    assert all(r["reuse_ratio"] > 1 for r in looksam)  # ‖g_s‖/‖g_v‖ = 1/sin∠(g, g_s)


@pytest.mark.slow
def test_the_authors_forms_pass_on_the_cpu():
    # WSAM's decoupled form, GSAM's adaptive ascent, ASAM with a mask, Friendly-SAM in the
    # authors' order: eager, both precisions, the ViT with batches of 8 images.
    names = ["wsam_decoupled", "gsam_adaptive", "asam_masked", "friendly_sam_authors"]
    cpu = torch.device("cpu")
    rows = [
        r
        for p in gpu_check.PRECISIONS
        for r in gpu_check.run_group("vit", p, "eager", cpu, names, 8)
    ]
    assert len(rows) == 2 * len(names)
    assert all(r["status"] == "pass" for r in rows), rows


def test_a_state_lost_between_steps_fails_the_check(monkeypatch):
    # Friendly-SAM whose running mean starts from zero at every step: each step alone is right, the
    # trajectory is not.
    real = gamfunc.make_step
    want = gpu_check.reference("vit", "friendly_sam", torch.device("cpu"), 3, 8)

    def forgetful(estimator, optimizer, loss_fn, **kw):
        step = real(estimator, optimizer, loss_fn, **kw)

        def call(params, state, batch):
            return step(params, state._replace(est=estimator.init(params)), batch)

        call.init = step.init
        return call

    monkeypatch.setattr(gpu_check.gamfunc, "make_step", forgetful)
    monkeypatch.setattr(gpu_check, "reference", lambda *args: want)
    rows = gpu_check.run_group("vit", "fp32", "eager", torch.device("cpu"), ["friendly_sam"], 8)
    assert [r["status"] for r in rows] == ["fail"]
    assert rows[0]["update_rel_err"] > 10 * rows[0]["tolerance"]


def test_a_wrong_step_fails_the_check(monkeypatch):
    # A bug that moves the update by more than rounding is a failed case, not a pass.
    real = gamfunc.make_step

    def off_by_a_little(estimator, optimizer, loss_fn, **kw):
        return real(estimator, gamfunc.sgd(lr=0.1 * 1.01, momentum=0.9), loss_fn, **kw)

    def reference(model, estimator, device, steps, size):
        net, batch = gpu_check.build(model, device, torch.float64)
        loss_fn, params, buffers = gamfunc.nn.functionalize(net)
        step = real(gpu_check.ESTIMATORS[estimator](), gamfunc.sgd(lr=0.1, momentum=0.9), loss_fn)
        new, _, m = step(params, step.init(params, buffers), batch)
        return gpu_check.Reference([gpu_check._update(new, params)], [float(m["loss"])])

    monkeypatch.setattr(gpu_check.gamfunc, "make_step", off_by_a_little)
    monkeypatch.setattr(gpu_check, "reference", reference)
    rows = gpu_check.run_group("vit", "fp32", "eager", torch.device("cpu"), ["gradient"])
    assert [r["status"] for r in rows] == ["fail"]
    assert 5e-3 < rows[0]["update_rel_err"] < 2e-2


@pytest.mark.slow
def test_the_command_passes_the_eager_cases_on_the_cpu_and_prints_a_summary(capsys):
    # The command's whole path (groups in worker processes, rows, a line each, summary) on a few
    # cases: exact GAM on the ResNet and the extras, batches of 8 images, the same tolerances.
    argv = ["--device", "cpu", "--estimators", "gam_exact", "--models", "resnet", "--size", "8"]
    assert gpu_check.main(argv) == 0
    *lines, last = capsys.readouterr().out.splitlines()
    rows = [line.split()[:5] for line in lines]  # status, model, precision, mode, estimator
    assert all(r[0] == "pass" for r in rows), lines
    got = {(m, p, e) for _, m, p, _, e in rows}
    assert got == {("resnet", p, "gam_exact") for p in ("fp32", "bf16")} | {
        (m, p, e) for m, p, _, e in gpu_check.EXTRAS
    }
    assert len(rows) == 2 + 3 and last.startswith(f"gpu_check: {len(rows)} passed, 0 failed")
