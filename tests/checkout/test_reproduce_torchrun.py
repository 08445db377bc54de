"""reproduce/train.py under torchrun on the CPU (gloo): two processes train as one, resume bit for
bit, stop together when one dies, and two "nodes" on localhost take the multi-node code path."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from reproduce import train
from reproduce.run import checkpoint as ckpt

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["--preset=digits", "--progress=false", "--landscape=false", "--eig_iters=0"]
ARGS += ["--trace_samples=0", "--r1_steps=0", "--threads=1"]

pytestmark = pytest.mark.slow
# seconds: the longest a job may take before the test fails (it only keeps a broken job from
# hanging the suite; no assertion reads a clock)
WAIT = 600


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(*args: str, launcher=(), log: Path | None = None, wait=True):
    """Run train.py under torchrun to the end, or, with ``log``, start it writing its output there;
    ``wait=False`` starts it with its output piped (:func:`finish` waits for it)."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *launcher,
        str(ROOT / "reproduce/train.py"),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if log is None and wait:
        return subprocess.run(
            cmd + list(args), env=env, capture_output=True, text=True, timeout=WAIT
        )
    if log is None:
        pipe = subprocess.PIPE
        return subprocess.Popen(cmd + list(args), env=env, stdout=pipe, stderr=pipe, text=True)
    with open(log, "w") as out:
        return subprocess.Popen(cmd + list(args), env=env, stdout=out, stderr=subprocess.STDOUT)


def finish(job: subprocess.Popen) -> subprocess.CompletedProcess:
    """Wait for a job started with ``wait=False``; its exit status and output."""
    out, err = job.communicate(timeout=WAIT)
    return subprocess.CompletedProcess(job.args, job.returncode, out, err)


def standalone(n: int) -> list[str]:
    return ["--standalone", f"--nproc_per_node={n}", f"--master_port={free_port()}"]


def params(logdir: Path, estimator: str) -> dict[str, torch.Tensor]:
    return ckpt.load(logdir / "digits" / estimator / "checkpoint.pt")["params"]


def test_two_processes_train_as_one_and_resume_bit_for_bit(tmp_path, capsys):
    """Global mode: 2 processes × 50 examples take the step of one process on the batch of 100, for
    SGD and exact GAM (float32 rounding apart: the mean over ranks is summed in another order). A
    run stopped after 4 steps and resumed under torchrun ends bit for bit where an uninterrupted
    one does; a resume with another number of processes is refused in one line."""
    steps = ["--max_steps=10", "--estimator=sgd,gam"]
    cut = ["--estimator=gam", f"--logdir={tmp_path / 'cut'}"]
    # the whole run, the first part of the cut one and the 1-process run at once
    whole = torchrun(
        f"--logdir={tmp_path / 'two'}", *ARGS, *steps, launcher=standalone(2), wait=False
    )
    first = torchrun(*ARGS, *cut, "--max_steps=4", launcher=standalone(2), wait=False)
    assert train.main([f"--logdir={tmp_path / 'one'}", *ARGS, *steps]) == 0
    whole, first = finish(whole), finish(first)
    assert whole.returncode == 0, whole.stdout + whole.stderr
    assert "2 process(es), global batch 100" in whole.stdout
    for est in ("sgd", "gam"):
        a, b = params(tmp_path / "two", est), params(tmp_path / "one", est)
        assert any(not torch.equal(a[k], b[k]) for k in a) or est == "sgd"
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)

    assert first.returncode == 0, first.stdout + first.stderr
    rest = torchrun(*ARGS, *cut, "--max_steps=10", "--resume", launcher=standalone(2))
    assert rest.returncode == 0, rest.stdout + rest.stderr
    assert "resumed from" in rest.stdout
    a, b = params(tmp_path / "cut", "gam"), params(tmp_path / "two", "gam")
    assert all(torch.equal(a[k], b[k]) for k in a)

    capsys.readouterr()
    assert train.main([*ARGS, *cut, "--max_steps=12", "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert "written by 2 process(es)" in err and len(err.splitlines()) == 1


def _workers(parent: int) -> dict[int, int]:
    """{RANK: pid} of the worker processes under a torchrun process (Linux /proc)."""
    out, todo = {}, [parent]
    while todo:
        pid = todo.pop()
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        for c in map(int, children):
            todo.append(c)
            try:
                env = Path(f"/proc/{c}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            rank = [e for e in env if e.startswith(b"RANK=")]
            if rank:
                out[int(rank[0][5:])] = c
    return out


def test_a_killed_rank_stops_the_job_and_the_checkpoint_stays_whole(tmp_path):
    logdir = tmp_path / "runs"
    job = torchrun(
        f"--logdir={logdir}",
        *ARGS,
        "--estimator=sgd",
        "--epochs=100000",
        "--checkpoint_every=3",
        launcher=standalone(2),
        log=tmp_path / "job.log",
    )
    path = logdir / "digits" / "sgd" / "checkpoint.pt"
    try:
        deadline = time.monotonic() + WAIT
        while not path.exists() and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.2)
        assert path.exists(), (tmp_path / "job.log").read_text()
        workers = _workers(job.pid)
        assert set(workers) == {0, 1}
        os.kill(workers[1], signal.SIGKILL)
        code = job.wait(timeout=WAIT)  # the job would train 100000 epochs if it went on
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert code != 0
    deadline = time.monotonic() + WAIT  # the workers are reaped once torchrun is gone
    alive = lambda: [pid for pid in workers.values() if Path(f"/proc/{pid}").exists()]  # noqa: E731
    while alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert alive() == [], f"workers {workers} outlived the job"
    body = ckpt.load(path)  # whole: its digest checks
    assert body["position"]["world"] == 2 and body["position"]["global_step"] >= 3


def test_two_nodes_on_localhost_train_as_one_process(tmp_path):
    """--nnodes=2 --node_rank=0/1 with a static rendezvous on 127.0.0.1: the multi-node code path."""
    port = free_port()
    common = [
        "--nnodes=2",
        "--nproc_per_node=1",
        "--master_addr=127.0.0.1",
        f"--master_port={port}",
    ]
    args = [f"--logdir={tmp_path / 'nodes'}", *ARGS, "--estimator=gam", "--max_steps=6"]
    logs = [tmp_path / f"node{r}.log" for r in (0, 1)]
    nodes = [torchrun(*args, launcher=[*common, f"--node_rank={r}"], log=logs[r]) for r in (0, 1)]
    one = train.main([f"--logdir={tmp_path / 'one'}", *ARGS, "--estimator=gam", "--max_steps=6"])
    codes = [n.wait(timeout=WAIT) for n in nodes]
    assert codes == [0, 0], [log.read_text() for log in logs]
    assert one == 0
    a, b = params(tmp_path / "nodes", "gam"), params(tmp_path / "one", "gam")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)


def test_a_refusal_and_a_divergence_are_printed_once_and_the_summary_keeps_the_status(tmp_path):
    """torchrun exits 1 whatever its workers' status; it names the status in its report
    ("exitcode : 2"). The one-line error comes once (from the first process of the node), and a
    diverged run's summary.json keeps its real exit status, 3."""
    args = [*ARGS, "--estimator=sgd", "--lr=1e25", "--log_every=1", "--max_skipped=3"]
    bad = torchrun(*ARGS, "--epochs=-3", launcher=standalone(2), wait=False)  # both at once
    diverged = torchrun(f"--logdir={tmp_path}", *args, launcher=standalone(2), wait=False)
    bad, diverged = finish(bad), finish(diverged)
    assert bad.returncode == 1
    assert bad.stderr.count("error: --epochs must be") == 1, bad.stderr
    assert re.search(r"exitcode\s*:\s*2\b", bad.stderr), bad.stderr

    assert diverged.returncode == 1
    assert diverged.stderr.count("steps were all skipped") == 1, diverged.stderr
    assert re.search(r"exitcode\s*:\s*3\b", diverged.stderr), diverged.stderr
    s = json.loads((tmp_path / "digits" / "sgd" / "summary.json").read_text())
    assert (s["status"], s["exit_code"]) == ("diverged", 3)


def test_a_signal_to_torchrun_stops_every_rank_and_the_summary_says_143(tmp_path):
    """torchrun passes SIGTERM on to its workers and exits 1; the workers checkpoint and stop,
    one line says what was kept, and summary.json records the stop with exit status 143."""
    logdir = tmp_path / "runs"
    log = tmp_path / "job.log"
    args = [f"--logdir={logdir}", *ARGS, "--estimator=sgd", "--epochs=100000"]
    job = torchrun(*args, "--checkpoint_every=3", launcher=standalone(2), log=log)
    run = logdir / "digits" / "sgd"
    try:
        deadline = time.monotonic() + WAIT
        while not (run / "checkpoint.pt").exists() and time.monotonic() < deadline:
            assert job.poll() is None, log.read_text()
            time.sleep(0.2)
        job.send_signal(signal.SIGTERM)
        code = job.wait(timeout=WAIT)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    text = log.read_text()
    assert code == 1 and "SignalException" in text
    assert text.count("stopped by SIGTERM during training; kept: the checkpoint") == 1, text
    s = json.loads((run / "summary.json").read_text())
    assert (s["status"], s["exit_code"]) == ("interrupted", 143)
    assert ckpt.load(run / "checkpoint.pt")["position"]["global_step"] == kept_step(text)
    assert kept_step(text) <= s["steps"]  # equal unless a rank left a collective (test below)


def kept_step(text: str) -> int:
    """The step of the checkpoint that the one line of a stop says it kept."""
    (step,) = re.findall(r"kept: the checkpoint of step (\d+) at", text)
    return int(step)


def test_a_rank_that_leaves_a_collective_after_a_signal_stops_the_others_with_what_they_kept(
    tmp_path,
):
    """Rank 0 takes SIGTERM while rank 1 cannot answer (stopped), then rank 1 dies: rank 0's
    collective fails, and that failure is the signal's stop, in the phase it came in (training, or
    the epoch's end), with the last checkpoint written named as what is kept, exit 143 and an
    interrupted summary.
    Two processes joined through the environment, without torchrun, whose agent would signal
    rank 0 a second time."""
    logdir, port = tmp_path / "runs", free_port()
    args = [f"--logdir={logdir}", *ARGS, "--estimator=sgd", "--epochs=100000"]
    cmd = [sys.executable, str(ROOT / "reproduce/train.py"), *args, "--checkpoint_every=3"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", WORLD_SIZE="2")
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    logs = [tmp_path / f"rank{r}.log" for r in (0, 1)]
    ranks = []
    for r, log in enumerate(logs):
        with open(log, "w") as out:
            rank_env = dict(env, RANK=str(r), LOCAL_RANK=str(r))
            ranks.append(subprocess.Popen(cmd, env=rank_env, stdout=out, stderr=subprocess.STDOUT))
    run = logdir / "digits" / "sgd"
    try:
        deadline = time.monotonic() + WAIT
        while not (run / "checkpoint.pt").exists() and time.monotonic() < deadline:
            assert all(p.poll() is None for p in ranks), logs[0].read_text()
            time.sleep(0.2)
        ranks[1].send_signal(signal.SIGSTOP)  # rank 0's next collective waits for it
        ranks[0].send_signal(signal.SIGTERM)
        time.sleep(1)
        ranks[1].kill()
        code = ranks[0].wait(timeout=WAIT)
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
            p.wait()
    text = logs[0].read_text()
    assert code == 143, text
    # within a step, or in the epoch's end where a loaded machine let rank 0 reach its last step
    # before the signal: either way the one line says what the run kept
    phase = r"(training|the end of epoch \d+ \(evaluation, metrics\))"
    stops = re.findall(rf"stopped by SIGTERM during {phase}; kept: the checkpoint", text)
    assert len(stops) == 1, text
    assert "Traceback" not in text
    s = json.loads((run / "summary.json").read_text())
    assert (s["status"], s["exit_code"]) == ("interrupted", 143)
    assert ckpt.load(run / "checkpoint.pt")["position"]["global_step"] == kept_step(text)
