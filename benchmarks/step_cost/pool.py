"""``--compile-jobs N``: cold compiles in N parallel worker processes, so that the timing process
compiles from warm caches.

Each worker is ``python -m benchmarks.step_cost --compile-only`` for one (model, precision, mode, method)
with an inductor cache directory of its own, empty (``TORCHINDUCTOR_CACHE_DIR``, Triton's cache
inside it): its compile time is a cold compile, never helped by an earlier run or by a worker beside
it that compiled the same pass. When it ends, its cache is copied into the timing process's cache
directory (:func:`run_cache_dir`), where the same compile then takes seconds.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.step_cost.timing import log

ROOT = Path(__file__).resolve().parents[2]  # the checkout, so that workers import `benchmarks`
FORWARDED = (
    "device",
    "threads",
    "batch_size",
    "lr",
    "rho",
    "alpha",
    "composite_hvp",
    "on_nonfinite",
    "recompile_limit",
)


def run_cache_dir(root: Path) -> Path:
    """Give this process a fresh inductor cache directory under ``root`` (set before anything is
    compiled: inductor and Triton read the variable at each lookup) and return it."""
    path = root / "inductor_cache"
    path.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    os.environ.pop("TRITON_CACHE_DIR", None)  # Triton's cache then lives inside inductor's
    return path


def _copy_new(src: str, dst: str) -> None:
    # Never over an existing file: this process may have loaded it (a compiled kernel library,
    # mapped into memory, crashes the process when rewritten). Cache files are named by their
    # content's key, so an existing one already holds the same entry. A new file appears whole.
    if not os.path.exists(dst):
        tmp = f"{dst}.{os.getpid()}.tmp"
        shutil.copy2(src, tmp)
        os.replace(tmp, dst)


def merge_cache(src: Path, dst: Path) -> None:
    """Add a worker's inductor cache ``src`` to this process's ``dst``, file by file."""
    shutil.copytree(src, dst, copy_function=_copy_new, dirs_exist_ok=True)


def compile_threads(jobs: int) -> int:
    """Inductor's compile threads per worker (``TORCHINDUCTOR_COMPILE_THREADS``): four times a fair
    share of the cores, at most all of them. Most workers finish well before the slowest (exact
    GAM's jvp of the gradient: hundreds of Triton kernels), which then compiles its kernels on the
    cores the others left. With a fair share (2 threads each), exact GAM's cold compile on ResNet-18
    took 127 s beside two other workers, where it had taken 70 s alone."""
    cpus = os.cpu_count() or 2
    return min(cpus, max(2, 4 * cpus // max(1, jobs)))


class Precompiler:
    """Compiles steps once in parallel worker processes, at most ``--compile-jobs`` at a time, in the
    order given: the jobs of every model and precision of the run start together, so that the
    slowest compiles of all groups overlap. A worker still running after ``--compile-timeout``
    seconds is ended, with its compile subprocesses.

    A job is (model, precision, mode, method); its result ``{"compile_s": cold compile seconds,
    "error": ...}``. ``close()`` ends whatever still runs."""

    def __init__(self, a, jobs, root: Path | None = None, cache: Path | None = None):
        self.a, self.pending, self.running, self.results = a, list(jobs), {}, {}
        threads = a.compile_threads or compile_threads(a.compile_jobs)
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        self.env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": str(threads), "PYTHONPATH": path}
        self.env.pop("TRITON_CACHE_DIR", None)
        self.tmp = Path(tempfile.mkdtemp(prefix="workers_", dir=root)) if jobs else None
        self.cache = cache
        self.common = []
        for k in FORWARDED:
            if getattr(a, k) is not None:
                self.common += [f"--{k.replace('_', '-')}", str(getattr(a, k))]
        for flag in ("quick", "no_loop_reorder", "channels_last"):
            if getattr(a, flag):
                self.common.append(f"--{flag.replace('_', '-')}")
        for item in a.inductor:  # the same compile, so that the workers fill the right caches
            self.common += ["--inductor", item]
        if jobs:
            log(
                f"pre-compiling {len(jobs)} steps, {a.compile_jobs} at a time, {threads} threads "
                f"each; worker logs in {self.tmp}"
            )
        self.poll()

    def poll(self):
        for job, (proc, t0, out, logf) in list(self.running.items()):
            if proc.poll() is None and time.perf_counter() - t0 < self.a.compile_timeout:
                continue
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # the worker and its compile subprocesses
                proc.wait()
                res = {"error": f"compile did not finish in {self.a.compile_timeout:.0f} s"}
            elif out.exists():
                row = json.loads(out.read_text())["rows"][0]
                res = {"compile_s": row.get("compile_s"), "error": row.get("error")}
                if self.cache is not None:  # also after an error: what it compiled is valid
                    merge_cache(out.with_suffix(".cache"), self.cache)
            else:
                tail = out.with_suffix(".log").read_text()[-300:]
                res = {"error": f"worker exited with {proc.returncode}: {tail}"}
            logf.close()
            del self.running[job]
            self.results[job] = res
            status = res["error"] or f"cold compile {res['compile_s']:.1f} s"
            log(f"pre-compiled {'/'.join(job)}: {status[:200]}")
        while self.pending and len(self.running) < self.a.compile_jobs:
            job = self.pending.pop(0)
            model, token, mode, method = job
            out = self.tmp / f"{'_'.join(job)}.json"
            cache = out.with_suffix(".cache")
            cache.mkdir()
            cmd = [
                sys.executable,
                "-m",
                "benchmarks.step_cost",
                "--compile-only",
                "--out",
                str(out),
            ]
            cmd += ["--model", model, "--dtype", token, "--modes", mode, "--only", method]
            logf = open(out.with_suffix(".log"), "w")  # noqa: SIM115 - closed when the worker ends
            proc = subprocess.Popen(
                cmd + self.common,
                env={**self.env, "TORCHINDUCTOR_CACHE_DIR": str(cache)},
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            self.running[job] = (proc, time.perf_counter(), out, logf)

    def completed(self, jobs):
        """Yield ``(job, result)`` for each of ``jobs`` as its worker finishes, in that order,
        while the workers of other jobs go on."""
        left = list(jobs)
        lost = [j for j in left if j not in self.results and not self._queued(j)]
        if lost:
            raise ValueError(f"never submitted: {lost}")
        while left:
            for job in [j for j in left if j in self.results]:
                left.remove(job)
                yield job, self.results[job]
            if left:
                time.sleep(0.5)
                self.poll()

    def wait(self):
        """Return once every worker has finished (or been ended at ``--compile-timeout``)."""
        while self.pending or self.running:
            time.sleep(0.5)
            self.poll()

    def _queued(self, job) -> bool:
        return job in self.running or job in self.pending

    def close(self):
        for proc, _, _, logf in self.running.values():
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            logf.close()
        self.running.clear()
