"""benchmarks/data_parallel.py on the CPU (gloo, two processes): every row gets its two rates and an
efficiency, and the efficiency is the ratio the README defines."""

from __future__ import annotations

import json
import statistics

import pytest

from benchmarks import data_parallel


def test_efficiency_is_n_gpu_rate_over_n_times_one():
    assert data_parallel.efficiency(300.0, 200.0, 2) == pytest.approx(0.75)
    assert data_parallel.efficiency(800.0, 200.0, 4) == pytest.approx(1.0)


@pytest.mark.slow
def test_rows_on_two_cpu_processes(tmp_path):
    out = tmp_path / "dp.json"
    args = ["--gpus", "2", "--runs", "digits:ddp,digits:gam_fd,digits:sgd:twin", "--batch", "8"]
    assert data_parallel.main([*args, "--steps", "2", "--warmup", "1", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["run"], r["perturbation"]) for r in rows] == [
        ("digits:ddp", "global"),
        ("digits:gam_fd", "global"),
        ("digits:gam_fd", "local"),
        ("digits:sgd:twin", "none"),
        ("digits:sgd:twin", "global"),
    ]
    twin = rows[3]  # the 1-GPU step alone, then two independent copies at once
    assert [c["world"] for c in twin["copies"]] == [1, 1]
    slowest = min(c["images_per_s"] for c in twin["copies"])
    assert twin["copies_rate_ratio"] == pytest.approx(
        slowest / twin["one"]["images_per_s"], abs=1e-3
    )
    for r in rows[:3] + rows[4:]:
        assert r["one"]["world"] == 1 and r["many"]["world"] == 2
        want = data_parallel.efficiency(r["many"]["images_per_s"], r["one"]["images_per_s"], 2)
        assert r["efficiency"] == pytest.approx(want, abs=1e-3)
        for run in (r["one"], r["many"]):  # the median of three timed windows
            assert len(run["window_ms"]) == 3
            assert run["ms_per_step"] == pytest.approx(
                statistics.median(run["window_ms"]), abs=0.01
            )
