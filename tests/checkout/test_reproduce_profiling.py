"""--profile_steps: steps of reproduce/train.py under torch.profiler, summarised by kind of work."""

import gzip
import json
from types import SimpleNamespace

import torch

from reproduce import train
from reproduce.run import checkpoint as ckpt
from reproduce.run.profiling import summarise

ARGS = ["--preset=digits", "--estimator=gam", "--progress=false", "--landscape=false"]
ARGS += ["--eig_iters=0", "--trace_samples=0", "--r1_steps=0", "--log_every=2"]


def event(key, device_us=0.0, cpu_us=0.0):
    kind = "DeviceType.CUDA" if device_us else "DeviceType.CPU"
    return SimpleNamespace(
        key=key, device_type=kind, self_device_time_total=device_us, cpu_time_total=cpu_us
    )


def test_a_profile_splits_the_gpu_time_by_kind_per_step():
    events = [
        event("void dali::kernels::BatchResampleGPU<...>", 300.0),
        event("nvjpegDecodeBatchedKernel", 100.0),
        event("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 500.0),
        event("Memcpy DtoD (Device -> Device)", 40.0),
        event("sm90_xmma_gemm_bf16bf16", 4000.0),
        event("aten::mm", 0.0, 900.0),  # an operator: its kernels' time is counted once, above
        event("cudaStreamSynchronize", 0.0, 60.0),
    ]
    s = summarise(events, steps=2, seconds=0.01)
    assert s["device_ms"] == {"loader": 0.2, "nccl": 0.25, "copy": 0.02, "compute": 2.0}
    assert s["wall_ms"] == 5.0 and s["host_wait_ms"] == 0.03 and s["steps"] == 2


def test_train_py_profiles_the_steps_asked_for_and_trains_as_without(tmp_path):
    def run(name, *more):
        assert train.main([f"--logdir={tmp_path / name}", *ARGS, "--max_steps=7", *more]) == 0
        folder = tmp_path / name / "digits" / "gam"
        return folder, json.loads((folder / "summary.json").read_text())

    folder, s = run("profiled", "--profile_steps=3")
    assert s["profile"]["steps"] == 3 and s["profile"]["wall_ms"] > 0
    assert (folder / "profile.txt").read_text().startswith("3 steps after step 2")
    with gzip.open(folder / "profile_trace.json.gz", "rt") as f:  # the timeline, for Perfetto
        assert any(e.get("name") == "aten::mm" for e in json.load(f)["traceEvents"])
    plain, p = run("plain")
    assert p["profile"] is None and not (plain / "profile.txt").exists()
    a = ckpt.load(folder / "checkpoint.pt")["params"]
    b = ckpt.load(plain / "checkpoint.pt")["params"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    _, cut = run("cut", "--profile_steps=50")  # the run ends first: the steps it had
    assert cut["profile"]["steps"] == 5
