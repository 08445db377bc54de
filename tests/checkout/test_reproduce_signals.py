"""SIGINT and SIGTERM stop reproduce/train.py in every phase, keep what is saved, exit 128 + signal
with one line saying what was kept; a second signal stops at once.

The waits below only keep a broken run from hanging the suite: each is minutes, far beyond what a
loaded machine needs, and no assertion reads a clock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reproduce import train
from reproduce.run import checkpoint as ckpt

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ["--preset=digits", "--estimator=sgd", "--progress=false", "--landscape=false"]
NO_FLATNESS = ["--eig_iters=0", "--trace_samples=0", "--r1_steps=0"]
WAIT = 300  # seconds: the longest a stopped run may take to exit before the test fails


def start(logdir: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    """train.py in a subprocess, its output in pipes."""
    cmd = [sys.executable, str(ROOT / "reproduce" / "train.py"), f"--logdir={logdir}", *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def signal_at(proc: subprocess.Popen, marker: str, signum: int) -> tuple[int, str]:
    """Send ``signum`` once ``marker`` is printed; (exit status, stderr)."""
    for line in proc.stdout:
        if marker in line:
            break
    else:
        pytest.fail(f"no {marker!r} in the output: {proc.communicate()}")
    proc.send_signal(signum)  # the marker is printed within its phase
    _, err = proc.communicate(timeout=WAIT)
    return proc.returncode, err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def run_dir(logdir: Path) -> Path:
    return logdir / "digits" / "sgd"


def test_a_signal_while_the_first_step_compiles_stops_at_once_and_keeps_the_checkpoint(tmp_path):
    """Start-up (a resumed run compiling its first step): SIGTERM stops it there, exit 143, with one
    line naming the checkpoint it resumed from, which stays whole at the step it was."""
    assert train.main([f"--logdir={tmp_path}", *DIGITS, *NO_FLATNESS, "--max-steps=2"]) == 0
    path = run_dir(tmp_path) / "checkpoint.pt"
    proc = start(tmp_path, *DIGITS, *NO_FLATNESS, "--max-steps=6", "--resume", "--compile")
    code, err = signal_at(proc, "compiling the step", signal.SIGTERM)
    assert code == 128 + signal.SIGTERM == 143, err
    line = one_line(err)
    assert line.startswith("stopped by SIGTERM during start-up (the first step and its compil")
    assert f"kept: the checkpoint of step 2 at {path}" in line and "--resume" in line
    assert ckpt.load(path)["position"]["global_step"] == 2


def test_a_fresh_run_stopped_in_start_up_says_nothing_was_saved(tmp_path):
    proc = start(tmp_path, *DIGITS, *NO_FLATNESS, "--max-steps=6", "--compile")
    code, err = signal_at(proc, "compiling the step", signal.SIGINT)
    assert code == 128 + signal.SIGINT == 130, err
    assert one_line(err).endswith("; nothing was saved yet")
    assert not (run_dir(tmp_path) / "checkpoint.pt").exists()


def test_a_signal_during_the_end_of_run_metrics_stops_them_and_resume_takes_them(tmp_path):
    """The metrics phase (Hutchinson with many probes, announced with its size): SIGINT stops it
    between probes, exit 130; the checkpoint (training done) and an interrupted summary stay, and
    --resume takes the metrics without training again."""
    args = [*DIGITS, "--epochs=1", "--eig_iters=0", "--r1_steps=0"]
    proc = start(tmp_path, *args, "--trace_samples=1000000")
    code, err = signal_at(proc, "flatness at step 14", signal.SIGINT)
    assert code == 130, err
    line = one_line(err)
    assert line.startswith("stopped by SIGINT during the end-of-run metrics; kept: the checkpoint")
    assert "(training done)" in line and "--resume computes the end-of-run metrics" in line
    s = json.loads((run_dir(tmp_path) / "summary.json").read_text())
    assert (s["status"], s["exit_code"], s["steps"]) == ("interrupted", 130, 14)
    assert ckpt.load(run_dir(tmp_path) / "checkpoint.pt")["finished"]
    assert train.main([f"--logdir={tmp_path}", *args, "--trace_samples=3", "--resume"]) == 0
    s = json.loads((run_dir(tmp_path) / "summary.json").read_text())
    assert (s["status"], s["exit_code"], s["steps"]) == ("finished", 0, 14)
    assert s["final"]["trace"] is not None


def test_the_metrics_say_what_they_compute_and_report_each(tmp_path, capsys):
    args = [*DIGITS, "--epochs=1", "--eig_iters=4", "--trace_samples=2", "--r1_steps=1"]
    assert train.main([f"--logdir={tmp_path}", *args, "--landscape=true"]) == 0
    out = capsys.readouterr().out
    assert "about 8 H·v products and 51 loss evaluations: λ_max (Lanczos, at most 4" in out
    for metric in ("λ_max = ", "trace = ", "R1 (ρ = 0.05) = ", "1-d landscape ("):
        assert f"[sgd]   {metric}" in out, metric


def sigterm_twice_in_a_write(tmp_path, path, args, second=signal.SIGTERM) -> str:
    """Start a run whose checkpoint writes are held open (the test hook), send SIGTERM once a write
    to ``path`` has begun and ``second`` a second later; check that the first waited and the second
    ended the process (exit 143, the first one's); its stderr."""
    proc = start(tmp_path, *args, env={ckpt.TEST_PAUSE_ENV: str(10 * WAIT)})
    deadline = time.monotonic() + WAIT
    while not list(path.parent.glob(".checkpoint.pt.tmp-*")) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    time.sleep(1.0)
    assert proc.poll() is None  # the first signal waits for the write
    proc.send_signal(second)
    _, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 143, err
    return err


def test_a_second_signal_stops_at_once_and_the_last_checkpoint_stays(tmp_path):
    """The first SIGTERM waits for a checkpoint write held open (the test hook, far longer than the
    wait for the exit); the second ends the process in the write, exit 143, saying so, and the
    checkpoint written before stays whole."""
    assert train.main([f"--logdir={tmp_path}", *DIGITS, *NO_FLATNESS, "--max-steps=2"]) == 0
    path = run_dir(tmp_path) / "checkpoint.pt"
    args = [*DIGITS, *NO_FLATNESS, "--max-steps=8", "--checkpoint_every=4", "--resume"]
    err = sigterm_twice_in_a_write(tmp_path, path, args)
    assert "SIGTERM again: stopping now" in err and "Traceback" not in err
    assert ckpt.load(path)["position"]["global_step"] == 2


# A signal that lands while a compiled function has Dynamo's frame hook on (here: a graph break that
# runs os.kill) must not have the handler's frames traced; an eager run never imports Dynamo for it.
_UNDER_THE_HOOK = """
import os, signal, sys, torch, warnings
import reproduce.train
from reproduce.run import signals
warnings.filterwarnings("ignore")  # Dynamo's notes on os.kill
traced = []
signals._say_once = lambda *a, **k: traced.append(torch.compiler.is_compiling())
print("dynamo at import:", "torch._dynamo" in sys.modules)
stop = signals.StopFlag()
with stop.installed():
    stop.now("training")
    print("bare before a compile:", signal.getsignal(signal.SIGINT) is stop)
    def f(x):
        os.kill(os.getpid(), signal.SIGINT)
        return x + 1
    compiled = torch.compile(f, backend="eager")
    stop.now("training")
    print("bare after:", signal.getsignal(signal.SIGINT) is stop)
    compiled(torch.ones(2))
print("signal:", stop.signum, "traced:", traced)
"""


def test_the_handler_stays_out_of_dynamo_and_an_eager_run_never_imports_it():
    out = subprocess.run(
        [sys.executable, "-c", _UNDER_THE_HOOK],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert out.returncode == 0, out
    assert out.stdout.splitlines() == [
        "dynamo at import: False",
        "bare before a compile: True",
        "bare after: False",
        "signal: 2 traced: [False]",
    ]


# A signal in start-up, where the handler ends the process itself: inside a finaliser (where a raised
# exception is printed as "Exception ignored" and dropped, and the run goes on) and inside a backward
# pass under anomaly mode (which a compiler turns on while it traces, and which prints a stack).
_IN_START_UP = """
import os, signal, sys, torch, warnings
from reproduce.run.signals import StopFlag
warnings.filterwarnings("ignore", message="Anomaly Detection has been enabled")  # the test's own
stop = StopFlag(exit_at_once=True)
stop.kept = lambda: ""  # as train.py's, before a run starts
with stop.installed(), stop.during("start-up (the first step and its compilation)", at_once=True):
    {body}
print("went on", flush=True)
"""
_BODIES = {
    "finaliser": (
        "class Dropped:\n"
        "        def __del__(self):\n"
        "            os.kill(os.getpid(), signal.SIGINT)\n"
        "    Dropped()"
    ),
    "anomaly_mode": (
        "class Kill(torch.autograd.Function):\n"
        "        @staticmethod\n"
        "        def forward(ctx, x):\n"
        "            return x * 2\n"
        "        @staticmethod\n"
        "        def backward(ctx, g):\n"
        "            os.kill(os.getpid(), signal.SIGINT)\n"
        "            return g * 2\n"
        "    with torch.autograd.detect_anomaly(check_nan=False):\n"
        "        Kill.apply(torch.ones(2, requires_grad=True)).sum().backward()"
    ),
}


@pytest.mark.parametrize("where", list(_BODIES))
def test_a_signal_in_start_up_ends_the_process_with_one_line_wherever_it_lands(where):
    code = _IN_START_UP.format(body=_BODIES[where])
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=WAIT
    )
    assert out.returncode == 130, out
    assert "went on" not in out.stdout
    assert one_line(out.stderr) == (
        "stopped by SIGINT during start-up (the first step and its compilation); "
        "nothing was saved yet"
    )


@pytest.mark.parametrize(
    ("marker", "signum", "compile_"),
    [
        # each phase once and each signal at least once (one handler takes both)
        ("compiling the step", signal.SIGINT, True),
        ("data: in memory", signal.SIGTERM, False),
        pytest.param("epoch 40/", signal.SIGTERM, False, marks=pytest.mark.slow),
    ],
    ids=["compile-int", "start-up-term", "training-term"],
)
def test_two_signals_back_to_back_give_one_line_and_the_first_ones_status(
    tmp_path, marker, signum, compile_
):
    args = [*DIGITS, *NO_FLATNESS, "--epochs=200"]  # an epoch line every 40 epochs
    proc = start(tmp_path, *args, *(["--compile"] if compile_ else []))
    for line in proc.stdout:
        if marker in line:
            break
    else:
        pytest.fail(f"no {marker!r} in the output: {proc.communicate()}")
    proc.send_signal(signum)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 128 + signum, err
    line = one_line(err)
    assert "Exception ignored" not in err and "SystemExit" not in err
    if "kept: the checkpoint" in line:
        assert (run_dir(tmp_path) / "checkpoint.pt").exists()
    else:
        assert line.endswith("nothing was saved yet")
        assert not (run_dir(tmp_path) / "checkpoint.pt").exists()
        # nothing of the run stays to make a rerun of its command be refused
        assert train.main([f"--logdir={tmp_path}", *DIGITS, *NO_FLATNESS, "--epochs=1"]) == 0


def test_a_second_signal_during_the_first_checkpoint_write_does_not_claim_one_stays(tmp_path):
    """The first SIGTERM waits for the first checkpoint's write (held open by the test hook); the
    second ends the process there: no checkpoint exists, and the line says so."""
    path = run_dir(tmp_path) / "checkpoint.pt"
    args = [*DIGITS, *NO_FLATNESS, "--max-steps=8", "--checkpoint_every=4"]
    err = sigterm_twice_in_a_write(tmp_path, path, args)
    line = one_line(err)
    assert line.startswith("SIGTERM again: stopping now") and line.endswith("nothing was saved yet")
    assert "stays" not in line and not path.exists()


def test_sigint_after_sigterm_in_a_write_exits_143_and_its_line_names_sigterm_first(tmp_path):
    path = run_dir(tmp_path) / "checkpoint.pt"
    args = [*DIGITS, *NO_FLATNESS, "--max-steps=8", "--checkpoint_every=4"]
    line = one_line(sigterm_twice_in_a_write(tmp_path, path, args, second=signal.SIGINT))
    assert line.startswith("SIGTERM, then SIGINT: stopping now"), line


@pytest.mark.parametrize(
    ("first", "second", "gap"),
    [
        (signal.SIGTERM, signal.SIGINT, 0.05),
        pytest.param(signal.SIGINT, signal.SIGTERM, 0.02, marks=pytest.mark.slow),
        pytest.param(signal.SIGTERM, signal.SIGINT, 0.15, marks=pytest.mark.slow),
    ],
    ids=["term-int-50ms", "int-term-20ms", "term-int-150ms"],
)
def test_a_second_signal_soon_after_the_first_in_training_keeps_the_first_ones_status(
    tmp_path, first, second, gap
):
    """The second signal lands while the run stops (its checkpoint written, the line printed, the
    interpreter ending): whatever it meets, the status and the line are the first signal's."""
    proc = start(tmp_path, *DIGITS, *NO_FLATNESS, "--epochs=200")  # a line every 40 epochs
    for line in proc.stdout:
        if "epoch 40/" in line:  # training for a while: past start-up and the first checkpoints
            break
    else:
        pytest.fail(f"no epoch line in the output: {proc.communicate()}")
    proc.send_signal(first)
    time.sleep(gap)
    proc.send_signal(second)
    _, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 128 + first, err
    line = one_line(err)
    name, then = signal.Signals(first).name, signal.Signals(second).name
    assert line.startswith((f"stopped by {name}", f"{name}, then {then}: stopping now")), line
    if line.startswith("stopped by"):
        assert "kept: the checkpoint" in line
    assert ckpt.load(run_dir(tmp_path) / "checkpoint.pt")["position"]["global_step"] > 0


@pytest.mark.parametrize("when", ["figure", "table"])
def test_a_signal_acknowledged_after_the_metrics_last_check_still_stops_the_run(
    tmp_path, capsys, monkeypatch, when
):
    """SIGINT while the landscape's figure is saved (after the metrics' last loss evaluation) or
    while the final table is printed: the handler says "stopping", so the run stops, exit 130,
    with one line; never "finished" and exit 0. In the metrics the summary is interrupted and
    --resume takes them again."""
    from reproduce.run import report

    hook = report.save_figure if when == "figure" else report.table

    def signalled(*a, **k):
        os.kill(os.getpid(), signal.SIGINT)  # handled at the next bytecode, in this frame
        return hook(*a, **k)

    args = [f"--logdir={tmp_path}", *DIGITS, *NO_FLATNESS, "--epochs=1", "--landscape=true"]
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with monkeypatch.context() as m:
            m.setattr(report, "save_figure" if when == "figure" else "table", signalled)
            assert train.main(args) == 130
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    out, err = capsys.readouterr()
    line = one_line(err)
    s = json.loads((run_dir(tmp_path) / "summary.json").read_text())
    if when == "figure":
        assert "SIGINT during the end-of-run metrics: stopping" in out
        assert line.startswith("stopped by SIGINT during the end-of-run metrics; kept: the checkp")
        assert (s["status"], s["exit_code"]) == ("interrupted", 130)
        assert train.main([*args, "--resume"]) == 0
        s = json.loads((run_dir(tmp_path) / "summary.json").read_text())
    else:  # the run finished before it: the line says it is kept
        assert line.startswith("stopped by SIGINT during the comparison; kept: the finished runs")
    assert (s["status"], s["exit_code"]) == ("finished", 0)
