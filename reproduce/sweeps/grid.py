"""The grid runner of ``reproduce/sweep.py``: each run of a sweep trained by ``reproduce/train.py``, in
this process or as subprocesses (one per slot or GPU), a finished run reused, SIGINT/SIGTERM forwarded.

The command line, the plan of the runs (`reproduce.sweeps.plan`) and the tables
(`reproduce.sweeps.table`) are elsewhere; ``reproduce/sweep.py`` joins them.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from reproduce import train
from reproduce.config import differences
from reproduce.sweeps.plan import Run, other_settings

__all__ = ["TRAIN", "diverged_reason", "execute", "finished_summary", "train_argv"]

TRAIN = Path(__file__).resolve().parent.parent / "train.py"


def finished_summary(run: Run) -> dict | None:
    """The run's ``summary.json`` if the run finished, else None.

    Raises:
        SweepError: the folder holds a finished run of another configuration (never reused silently).
    """
    path = run.run_dir / "summary.json"
    if not path.exists():
        return None
    summary = json.loads(path.read_text())
    if summary.get("status") != "finished":
        return None
    diff = differences(summary.get("config", {}), run.config)
    if diff:
        raise other_settings(run.run_dir, "a finished run", diff)
    return summary


def diverged_reason(run: Run) -> str:
    """Why the run diverged, as its ``summary.json`` says (``reason``), or ``""`` if it does not."""
    try:
        summary = json.loads((run.run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return ""
    reason = summary.get("reason") if isinstance(summary, dict) else None
    return reason if isinstance(reason, str) and summary.get("status") == "diverged" else ""


def train_argv(run: Run) -> list[str]:
    """``train.py``'s command line for ``run``: with ``--resume`` only where the run has a
    checkpoint (it was stopped, or diverged), so that a run started afresh says nothing of resuming."""
    argv = list(run.argv)
    if not (run.run_dir / "checkpoint.pt").exists():
        argv.remove("--resume")
    return argv


def _last_error(log: Path) -> str:
    """The line of a run's log that says why it failed: its last ``error:`` line, else its last line."""
    try:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        lines = []
    errors = [ln for ln in lines if ln.startswith("error:")]
    return (errors or lines or ["(no output)"])[-1]


class _Runner:
    """Starts runs in this process (one slot, no GPU) or as subprocesses (one per slot) and forwards
    SIGINT/SIGTERM to running subprocesses, which then checkpoint and stop."""

    def __init__(self, slots: list[int | None], in_process: bool):
        self.in_process = in_process
        self.slots: queue.Queue = queue.Queue()
        for s in slots:
            self.slots.put(s)
        self.children: set[subprocess.Popen] = set()
        self.lock = threading.Lock()
        self.signum: int | None = None

    def stop(self, signum, frame) -> None:
        """Signal handler: no new runs start; running subprocesses get the signal."""
        self.signum = self.signum or signum
        with self.lock:
            for p in self.children:
                with contextlib.suppress(OSError):
                    p.send_signal(signum)

    def __call__(self, run: Run) -> tuple[int | None, str]:
        """Train ``run``; its exit status (None: not started, the sweep is stopping) and, if it
        failed, the line saying why."""
        if self.signum is not None:
            return None, "not started (stopped)"
        if self.in_process:
            return train.main(train_argv(run)), ""
        gpu = self.slots.get()
        try:
            env = dict(os.environ)
            argv = train_argv(run)
            if gpu is not None:
                env["CUDA_VISIBLE_DEVICES"] = str(gpu)
                argv.append("--device=cuda")
            log = run.run_dir.parent / "train.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "a") as f:
                with self.lock:
                    if self.signum is not None:
                        return None, "not started (stopped)"
                    p = subprocess.Popen(
                        [sys.executable, str(TRAIN), *argv],
                        stdout=f,
                        stderr=subprocess.STDOUT,
                        env=env,
                    )
                    self.children.add(p)
                code = p.wait()
                with self.lock:
                    self.children.discard(p)
            if code < 0:  # killed by a signal before train.py handled it (while importing)
                code = 128 - code
            return code, (_last_error(log) + f" (log: {log})" if code else "")
        finally:
            self.slots.put(gpu)


def execute(runs: list[Run], jobs: int, gpus: list[int] | None) -> tuple[dict, int | None]:
    """Train every run not finished yet; ``({run index: (exit status, why)}, stopping signal)``."""
    in_process = jobs == 1 and gpus is None
    runner = _Runner(gpus if gpus is not None else [None] * jobs, in_process)
    done: dict[int, tuple[int, str]] = {}
    total = len(runs)

    def one(i: int) -> None:
        run = runs[i]
        began = time.perf_counter()
        code, why = runner(run)
        done[i] = (code, why)
        if code is not None:
            what = {0: "finished", 3: "diverged"}.get(code, f"failed (exit {code}): {why}")
            if code > 128:
                what = f"stopped by signal {code - 128}; rerun the sweep to continue"
            print(
                f"[sweep {len(done)}/{total}] {run.cell.label} seed={run.seed}: {what} "
                f"({time.perf_counter() - began:.0f} s)",
                flush=True,
            )
        if code is not None and code > 128:
            runner.signum = runner.signum or code - 128

    # In process, train.main installs its own handlers while it trains; these take a signal between
    # runs, so that no new run starts and the tables are written.
    handlers = {s: signal.signal(s, runner.stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if in_process:
            for i in range(total):
                one(i)
                if runner.signum is not None:
                    break
        else:
            with ThreadPoolExecutor(max_workers=jobs) as pool:
                futures = [pool.submit(one, i) for i in range(total)]
                while not all(f.done() for f in futures):
                    time.sleep(0.2)  # the main thread stays free to take signals
                for f in futures:
                    f.result()
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    return done, runner.signum
