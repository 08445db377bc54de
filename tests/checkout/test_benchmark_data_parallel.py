"""``python -m benchmarks.data_parallel`` on the CPU (gloo, two processes): every row gets its two
rates and an efficiency, and the efficiency is the ratio the README defines; the projection to more
GPUs, and the timeline reader (``trace_gaps``) on a small hand-made timeline."""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
from pathlib import Path

import pytest

from benchmarks import _common
from benchmarks.data_parallel import driver as data_parallel
from benchmarks.data_parallel import projection as dp_projection
from benchmarks.data_parallel import trace_gaps

ROOT = Path(__file__).resolve().parents[2]


def test_efficiency_is_n_gpu_rate_over_n_times_one():
    assert data_parallel.efficiency(300.0, 200.0, 2) == pytest.approx(0.75)
    assert data_parallel.efficiency(800.0, 200.0, 4) == pytest.approx(1.0)


@pytest.mark.slow
def test_rows_on_two_cpu_processes(monkeypatch, tmp_path):
    # The cost is the 9 timed launches, each importing torch (the 4 of two processes through
    # torchrun, the 1-process ones without it): no warm-up (--warm_at_once 0: the CPU's workers
    # compile nothing), and one thread per process (what torchrun sets for two) keeps
    # the 1-process runs' tiny steps from contending for the cores. One step per window still gives
    # three windows and a loss that falls.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "dp.json"
    args = ["--gpus", "2", "--runs", "digits:ddp,digits:gam_fd,digits:sgd:twin", "--batch", "4"]
    args += ["--logs", str(tmp_path / "dp_logs"), "--warm_at_once", "0"]
    assert data_parallel.main([*args, "--steps", "1", "--warmup", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["benchmark"] == "data_parallel" and result["meta"]["gpus"] == 0  # the CPU
    rows = result["rows"]
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
    # every run's output in a log of its own, in launch order, with its progress and its result
    logs = sorted((tmp_path / "dp_logs").glob("*.log"))
    assert [p.name[:2] for p in logs] == [f"{i:02d}" for i in range(len(logs))]
    timed = [
        p.read_text() for p in logs if "RESULT" in p.read_text() and "window 3:" in p.read_text()
    ]
    # ddp: 1 and 2 GPUs; gam_fd: 1, 2 global, 2 local; twin: alone (its 1 GPU), 2 copies, 2 GPUs
    assert len(timed) == 2 + 3 + 4
    assert rows[4]["one"] is not None and rows[4]["one"] == twin["one"]
    for r in rows[1:3]:  # gamfunc's runs say how many steps they took, and that they trained
        for run in (r["one"], r["many"]):
            assert run["steps_taken"] == 1 + 1 + 3 * 1 and run["skipped"] == 0
            assert run["last_loss"] < run["first_loss"]
    for r in rows[:3] + rows[4:]:
        assert r["one"]["world"] == 1 and r["many"]["world"] == 2
        want = data_parallel.efficiency(r["many"]["images_per_s"], r["one"]["images_per_s"], 2)
        assert r["efficiency"] == pytest.approx(want, abs=1e-3)
        for run in (r["one"], r["many"]):  # the median of three timed windows
            assert len(run["window_ms"]) == 3
            assert run["ms_per_step"] == pytest.approx(
                statistics.median(run["window_ms"]), abs=0.01
            )


def test_gpu_counts_are_two_or_more():
    assert data_parallel._counts("4,2,4") == [2, 4]
    with pytest.raises(argparse.ArgumentTypeError, match="--gpus"):
        data_parallel._counts("1,2")


def test_train_rows_time_each_count_and_the_folder_against_memory(monkeypatch, tmp_path):
    """A train row: train.py on 1 GPU and on each N in memory, and with --data on the folder
    through the loader at each count, 1 GPU included; the data path's cost is 1 − folder rate ÷
    in-memory rate at the same count."""
    rates = {(1, ""): 100.0, (2, ""): 190.0, (4, ""): 360.0, (2, "dali"): 171.0}
    rates[(4, "dali")] = 360.0
    rates[(1, "dali")] = 95.0
    calls = []

    def train_py(a, model, est, gpus, timeout, graph=False, folder=""):
        calls.append((model, est, gpus, graph, folder))
        return {"world": gpus, "images_per_s": rates[(gpus, folder)]}

    monkeypatch.setattr(data_parallel, "_train_py", train_py)
    out = tmp_path / "dp.json"
    args = ["--gpus", "2,4", "--runs", "r50:train_gam_fd:graph", "--data", str(tmp_path)]
    args += ["--logs", str(tmp_path), "--loader", "dali"]
    assert data_parallel.main([*args, "--no-busbw", "--out", str(out)]) == 0
    assert calls == [
        ("r50", "gam_fd", n, True, f)
        for n, f in [(1, ""), (1, "dali"), (2, ""), (2, "dali"), (4, ""), (4, "dali")]
    ]
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert report["meta"]["part"] == "data_path" and report["meta"]["loaders"] == ["dali"]
    assert _common.file_name(report["meta"]).startswith("data_parallel_data_path_")
    assert [r["gpus"] for r in rows] == [1, 2, 4]
    assert [r.get("efficiency") for r in rows] == [None, 0.95, 0.9]
    assert [r["data_path_cost"] for r in rows] == [0.05, 0.1, 0.0]

    calls.clear()  # without the 1-GPU runs: no efficiency, the folder's cost all the same
    assert data_parallel.main([*args, "--no-busbw", "--no-train_one", "--out", str(out)]) == 0
    assert 1 not in [c[2] for c in calls]
    rows = json.loads(out.read_text())["rows"]
    assert ["efficiency" in r for r in rows] == [False, False]
    assert [r["data_path_cost"] for r in rows] == [0.1, 0.0]

    # several loader settings: the in-memory run once, the folder once through each, a row each
    rates[(2, "dali+dali_roi")] = 152.0
    calls.clear()
    more = ["--gpus", "2", "--loader", "dali,dali+dali_roi", "--no-train_one"]
    assert data_parallel.main([*args[2:], *more, "--no-busbw", "--out", str(out)]) == 0
    assert [c[2:] for c in calls] == [(2, True, ""), (2, True, "dali"), (2, True, "dali+dali_roi")]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["loader"], r["data_path_cost"]) for r in rows] == [
        ("dali", 0.1),
        ("dali+dali_roi", 0.2),
    ]


def test_the_default_loader_settings_are_train_py_s_choice_then_each_loader():
    """train.py's choice first, then DALI's other arrangements and every other loader, each a
    setting that train.py takes."""
    from reproduce.config import LOADERS, resolve

    settings = data_parallel.TRAIN_LOADERS.split(",")
    assert settings[0] == "auto" and {s.split("+")[0] for s in settings} <= set(LOADERS)
    assert {"dali+dali_hw_load=1", "dali+dali_cpu", "gpu", "folder"} <= set(settings)
    for s in settings:
        resolve(["--preset=hp2.imagenet.resnet50", *data_parallel.loader_args(s)])


def test_data_synthetic_writes_a_jpeg_folder_of_imagenet_sizes_in_the_logs(monkeypatch, tmp_path):
    """--data synthetic: the folder is written into --logs before any run, every class with a
    training and a validation image, and the train rows read it."""
    from PIL import Image

    seen = []

    def train_py(a, model, est, gpus, timeout, graph=False, folder=""):
        seen.append(a.data)
        return {"world": gpus, "images_per_s": 10.0}

    monkeypatch.setattr(data_parallel, "_train_py", train_py)
    args = ["--gpus", "2", "--runs", "r50:train_sgd", "--data", "synthetic"]
    args += ["--synthetic_images", "3", "--logs", str(tmp_path), "--loader", "folder"]
    assert data_parallel.main([*args, "--no-busbw", "--out", str(tmp_path / "dp.json")]) == 0
    folder = tmp_path / "jpeg_folder"
    assert set(seen) == {str(folder)}
    for split in ("train", "val"):
        classes = sorted((folder / split).iterdir())
        assert len(classes) == 3 and all(len(list(c.iterdir())) == 1 for c in classes)
    with Image.open(next((folder / "train").rglob("*.JPEG"))) as im:
        assert im.format == "JPEG" and all(300 <= side <= 500 for side in im.size)
    with pytest.raises(ValueError, match="synthetic_images"):
        data_parallel.synthetic_folder(tmp_path / "none", 0)


def test_a_loader_setting_is_train_py_s_loader_and_its_options():
    assert data_parallel.loader_args("dali") == ["--loader=dali"]
    assert data_parallel.loader_args("dali+dali_roi+dali_hw_load=1.0") == [
        "--loader=dali",
        "--dali_roi",
        "--dali_hw_load=1.0",
    ]


def test_projection_scales_the_exposed_time_as_a_ring_all_reduce():
    # at the measured count the projection is the measurement
    assert dp_projection.project({2: 0.9, 4: 0.8}, 4) == pytest.approx(0.8)
    # 2 → 8: the time beyond the 1-GPU step (1/0.5 − 1 = 1) grows by 2·7/8 ÷ 2·1/2 = 1.75
    assert dp_projection.project({2: 0.5}, 8) == pytest.approx(1 / 2.75)
    # 4 → 8 from the largest count only
    assert dp_projection.project({2: 0.1, 4: 0.8}, 8) == pytest.approx(1 / (1 + 0.25 * 7 / 6))
    # 90 epochs of ImageNet on 8 GPUs of 1,000 images/s each, at efficiency 0.5
    assert dp_projection.hours(1000.0, 0.5, 8, 90) == pytest.approx(90 * 1_281_167 / 4000 / 3600)


def test_projections_read_every_report_and_take_the_largest_count(tmp_path):
    def report(path, gpus, eff, rate_1):
        row = {"run": "r50:sgd:graph", "perturbation": "global", "gpus": gpus, "efficiency": eff}
        row |= {"one": {"images_per_s": rate_1}, "many": {"world": gpus}}
        path.write_text(json.dumps({"rows": [row, {"run": "x", "error": "not run"}]}))
        return str(path)

    paths = [report(tmp_path / "a.json", 4, 0.8, 900.0), report(tmp_path / "b.json", 2, 0.9, 1e3)]
    (row,) = dp_projection.projections(paths, 8)
    assert row["efficiency"] == {4: 0.8, 2: 0.9} and row["rate_1"] == 900.0
    eff = dp_projection.project({4: 0.8}, 8)
    assert row["projected_efficiency_8"] == pytest.approx(eff, abs=1e-3)
    assert row["hours_90_epochs"] == pytest.approx(dp_projection.hours(900.0, eff, 8, 90), abs=0.01)


@pytest.mark.slow
def test_a_train_row_profiled_keeps_its_profile_in_the_logs(tmp_path):
    """--train_profile: train.py profiles that many steps; their summary comes back in the run's
    result and their tables in --logs."""
    from types import SimpleNamespace

    a = SimpleNamespace(logs=str(tmp_path), batch=8, train_steps=14, train_profile=2, data="")
    a.workers = 0
    run = data_parallel._train_py(a, "digits", "gam_fd", 1, 300)
    assert run["steps"] == 14 and run["profile"]["steps"] == 2
    (table,) = tmp_path.glob("profile_train_digits_gam_fd_1gpu*.txt")
    assert table.read_text().startswith("2 steps after step 10")
    assert len(list(tmp_path.glob("trace_train_digits_gam_fd_1gpu*.json.gz"))) == 1
    assert "timeline" not in run  # a CPU run's timeline holds no GPU stream


def test_a_profiled_run_says_how_long_its_training_stream_stood_idle(tmp_path):
    got = data_parallel._timeline(_trace(tmp_path))
    assert got == {
        "timeline": {
            "span_ms": 5.0,
            "busy_ms": 2.9,
            "gaps_over_min_ms": 2.0,
            "other_streams_ms": 1.5,
            "other_streams_overlapping_ms": 0.2,
        }
    }
    row = {"run": "r50:train_sgd:graph", "perturbation": "global", "gpus": 2, "one": {}}
    row |= {"many": {"images_per_s": 10.0, **got}, "data_path_cost": 0.1}
    line = data_parallel._line(row)
    assert "training stream idle 2.0 of 5.0 ms, other streams 1.5 ms (0.2 beside it)" in line


def test_a_first_step_past_its_time_prints_where_its_main_thread_is():
    """--stacks_after: a first step still running after that many seconds prints its main thread's
    stack once (a hung or slow compile then says where it was) and runs on; a cancelled one, and a
    worker's first step that ends in time, print nothing."""
    import subprocess
    import sys

    code = (
        "import time\n"
        "from benchmarks.data_parallel.worker import _stack_later\n"
        "def first_step():\n"
        "    time.sleep(1.0)\n"
        "_stack_later(0.05)\n"
        "first_step()\n"
        "_stack_later(0.5).cancel()\n"
        "time.sleep(1.0)\n"
        "print('done')\n"
    )
    cmd = [sys.executable, "-m", "benchmarks.data_parallel.worker", "--model", "digits"]
    cmd += ["--kind", "gam_fd"]
    cmd += ["--batch", "8", "--steps", "0", "--warmup", "0", "--stacks_after", "60"]
    # both at once: the worker imports torch while the first one sleeps
    timer, worker = (
        subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        for c in ([sys.executable, "-c", code], cmd)
    )
    out, err = timer.communicate(timeout=600)
    assert timer.returncode == 0 and out.strip() == "done", err
    assert err.count("most recent call first") == 1
    assert "in first_step" in err

    out, err = worker.communicate(timeout=600)
    assert worker.returncode == 0, err
    assert "rank 0: first step" in out
    assert "most recent call first" not in out + err


def test_warm_at_once_0_skips_the_warm_up_and_a_negative_count_is_refused(monkeypatch, tmp_path):
    launched = []
    monkeypatch.setattr(
        data_parallel,
        "_launch",
        lambda a, m, k, n, pert="global", steps=None, **_: launched.append(steps),
    )
    monkeypatch.setattr(
        data_parallel, "_result", lambda proc, timeout: {"world": 1, "images_per_s": 10.0}
    )
    args = ["--gpus", "2", "--runs", "vit:gam:graph", "--no-busbw", "--logs", str(tmp_path)]
    args += ["--out", str(tmp_path / "d.json")]
    assert data_parallel.main([*args, "--warm_at_once", "0"]) == 0
    assert launched and 0 not in launched  # timed runs only
    with pytest.raises(ValueError, match="--warm_at_once"):
        data_parallel.main([*args, "--warm_at_once", "-1"])


def test_the_warm_up_compiles_the_modes_timed_alone(monkeypatch, tmp_path):
    """GAM's warm-up compiles only the modes of --perturbations, each within --warm_timeout."""
    launched, waited = [], []

    def launch(a, model, kind, gpus, pert="global", steps=None, warmup=None, **_):
        launched.append((model, kind, gpus, pert, steps))
        return (model, kind, pert)

    def result(proc, timeout):
        waited.append(timeout)
        return {"world": 1, "images_per_s": 10.0}

    monkeypatch.setattr(data_parallel, "_launch", launch)
    monkeypatch.setattr(data_parallel, "_result", result)
    args = ["--gpus", "2", "--runs", "vit:gam:graph,r50:sgd:graph", "--no-busbw"]
    args += ["--perturbations", "local", "--warm_timeout", "77", "--out", str(tmp_path / "d.json")]
    args += ["--logs", str(tmp_path)]
    assert data_parallel.main(args) == 0
    warm = [(m, k, p) for m, k, n, p, steps in launched if steps == 0]
    assert warm == [("r50", "sgd", "global"), ("vit", "gam", "local")]
    assert waited[:2] == [77, 77]
    timed = [(m, k, n, p) for m, k, n, p, steps in launched if steps is None]
    assert timed == [
        ("vit", "gam", 1, "global"),
        ("vit", "gam", 2, "local"),
        ("r50", "sgd", 1, "global"),
        ("r50", "sgd", 2, "global"),
    ]


def _trace(tmp_path):
    def gpu(tid, ts, dur, name="k"):
        return {"ph": "X", "cat": "kernel", "tid": tid, "ts": ts, "dur": dur, "name": name}

    train = [gpu(7, 0, 1000), gpu(7, 1000, 500), gpu(7, 3500, 1000), gpu(7, 4600, 400)]
    decode = [gpu(20, 2000, 1000, "rgba2rgb"), gpu(20, 4000, 200, "rgba2rgb"), gpu(21, 2500, 300)]
    host = [
        # a decoder thread waits from within the first step until the gap has opened
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "tid": 99,
            "ts": 200,
            "dur": 1400,
            "name": "cudaEventSynchronize",
        },
        # a wait that ends after the gap, and a call that is no wait: neither held it
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "tid": 98,
            "ts": 100,
            "dur": 5000,
            "name": "cudaStreamSynchronize",
        },
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "tid": 99,
            "ts": 1400,
            "dur": 300,
            "name": "cudaLaunchKernel",
        },
        {"ph": "i", "cat": "kernel", "tid": 7, "ts": 0, "name": "an instant, not an event"},
    ]
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": train + decode + host}, f)
    return path


def test_gaps_and_what_filled_them(tmp_path):
    g = trace_gaps.gaps(trace_gaps.load(_trace(tmp_path)), min_ms=0.3)
    assert g["training_stream"] == 7
    assert g["span_ms"] == 5.0 and g["busy_ms"] == 2.9 and g["idle_ms"] == 2.1
    assert [(x["at_ms"], x["ms"]) for x in g["gaps"]] == [(1.5, 2.0)]  # 0.1 ms at 4.5 is too short
    gap = g["gaps"][0]
    assert gap["other_streams_ms"] == pytest.approx(1.3)  # 1.0 of stream 20, 0.3 of stream 21
    assert gap["other_streams_from_ms"] == 0.5
    assert gap["other_kinds"] == {"rgba2rgb": 1, "k": 1}
    assert gap["waits_ending_inside"] == [
        {
            "call": "cudaEventSynchronize",
            "thread": 99,
            "began_ms_before": 1.3,
            "ended_ms_after": 0.1,
        }
    ]
    # the decoder's 1.5 ms: 0.2 ms beside training work (4.0-4.2 inside 3.5-4.5)
    assert g["other_streams_ms"] == 1.5 and g["other_streams_overlapping_ms"] == 0.2


def test_the_command_writes_a_summary_per_trace(tmp_path, capsys):
    out = tmp_path / "gaps.json"
    assert trace_gaps.main([str(_trace(tmp_path)), "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert list(got) == ["t.json.gz"] and got["t.json.gz"]["gaps_over_min_ms"] == 2.0
    assert "1 gaps, 2.0 ms" in capsys.readouterr().out


def test_a_trace_without_gpu_work_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no GPU events"):
        trace_gaps.gaps([{"ph": "X", "cat": "cpu_op", "tid": 1, "ts": 0, "dur": 1, "name": "x"}])
