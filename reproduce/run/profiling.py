"""Training steps under ``torch.profiler`` (``--profile_steps``): where a step's time goes, the
loader's work on the GPU beside it included.

The ``n`` steps after the first logging interval (compiled and warm) are profiled on every process
(a step's collectives need them all); the main process writes the tables by GPU time and by host
time to ``profile.txt`` in the run's folder, the timeline of every thread and stream to
``profile_trace.json.gz`` (Perfetto or chrome://tracing open it), and keeps a summary for
``summary.json``: per step, the wall-clock time between two synchronisations, the GPU time of the
loader's kernels (DALI's and nvJPEG's), of NCCL, of copies and of the rest, and the host's time
waiting for the device. The profiled steps are left out of the run's images/s.
"""

from __future__ import annotations

import gzip
import shutil
import tempfile
import time
from pathlib import Path

import torch

from reproduce.run.launch import wait_for

__all__ = ["StepProfiler", "summarise"]

_WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


class StepProfiler:
    """Profiles steps ``first + 1 .. first + n`` of the run (``first``: the global step count before
    them); `before` and `after` bracket each step, `close` ends a profile that the
    run's end cut short. ``summary`` holds the result once the profile has ended."""

    def __init__(self, n: int, first: int, device: torch.device, path: Path | None):
        self.n, self.first, self.device, self.path = n, first, device, path
        self.prof, self.began, self.steps, self.summary = None, 0.0, 0, None

    def _sync(self) -> float:
        wait_for(self.device)
        return time.perf_counter()

    def before(self, global_step: int) -> None:
        if self.n and self.prof is None and self.summary is None and global_step == self.first:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU]
            if self.device.type == "cuda":
                activities.append(ProfilerActivity.CUDA)
            self.prof = profile(activities=activities)
            self.began = self._sync()
            self.prof.__enter__()

    def after(self) -> bool:
        """Count a step; True when it was the last profiled one (the profile has ended)."""
        if self.prof is None:
            return False
        self.steps += 1
        if self.steps < self.n:
            return False
        self.close()
        return True

    def close(self) -> None:
        if self.prof is None:
            return
        seconds = self._sync() - self.began
        self.prof.__exit__(None, None, None)
        prof, self.prof = self.prof, None
        events = prof.key_averages()
        self.summary = summarise(events, self.steps, seconds)
        if self.path is not None:
            by_device = events.table(sort_by="self_cuda_time_total", row_limit=40)
            by_host = events.table(sort_by="self_cpu_time_total", row_limit=40)
            head = f"{self.steps} steps after step {self.first}: {self.summary}\n\n"
            self.path.write_text(f"{head}By GPU time\n{by_device}\n\nBy host time\n{by_host}\n")
            self._trace(prof)

    def _trace(self, prof) -> None:
        """The timeline, gzipped beside the tables."""
        with tempfile.TemporaryDirectory() as tmp:
            raw = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(raw))
            target = self.path.with_name("profile_trace.json.gz")
            with raw.open("rb") as src, gzip.open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)


def _device_us(event) -> float:
    """The GPU time of the device's own events (kernels, copies); an operator's row repeats its
    kernels' time, so it counts nothing here."""
    if "CUDA" not in str(getattr(event, "device_type", "")):
        return 0.0
    return getattr(event, "self_device_time_total", None) or getattr(
        event, "self_cuda_time_total", 0.0
    )


def summarise(events, steps: int, seconds: float) -> dict:
    """Per step, in ms: the wall-clock time, the GPU time by kind (``loader``: kernels whose name
    says DALI or JPEG; ``nccl``; ``copy``: memory copies and sets; ``compute``: the rest) and the
    host's waits for the device."""
    kinds = {"loader": 0.0, "nccl": 0.0, "copy": 0.0, "compute": 0.0}
    waits = 0.0
    for e in events:
        name, us = e.key, _device_us(e)
        low = name.lower()
        if us and ("dali" in low or "jpeg" in low):
            kinds["loader"] += us
        elif us and "nccl" in low:
            kinds["nccl"] += us
        elif us and ("memcpy" in low or "memset" in low):
            kinds["copy"] += us
        elif us:
            kinds["compute"] += us
        if name in _WAITS:
            waits += e.cpu_time_total
    per = max(steps, 1) * 1e3
    return {
        "steps": steps,
        "wall_ms": round(seconds * 1e3 / max(steps, 1), 2),
        "device_ms": {k: round(v / per, 2) for k, v in kinds.items()},
        "host_wait_ms": round(waits / per, 2),
    }
