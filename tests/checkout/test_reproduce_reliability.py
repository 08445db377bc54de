"""Failures of reproduce/train.py and the evidence commands under attack, each reproduced: a rerun that
would replace a finished run, skipped steps reported as success, crafted checkpoints, bad values and
signals, each refused or stopped in one line with its exit status."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from train_cli import DIGITS, NO_FLATNESS, main, one_line_error, out_dir

from reproduce.run import checkpoint as ckpt


def strict(path: Path) -> dict:
    def refuse(text):
        raise ValueError(text)

    return json.loads(path.read_text(), parse_constant=refuse)


# 1. A rerun never replaces a finished run, whichever of its outputs is left.
@pytest.mark.parametrize("left", ["summary.json", "events", "config.json"])
def test_a_finished_run_without_its_checkpoint_is_not_overwritten(tmp_path, capsys, left):
    assert main(tmp_path, *DIGITS, "--epochs=1") == 0
    run = out_dir(tmp_path)
    (run / "checkpoint.pt").unlink()
    for f in run.iterdir():  # keep only the one output named
        if (
            f.is_file()
            and f.name != ".lock"
            and not (f.name == left or (left == "events" and f.name.startswith("events.")))
        ):
            f.unlink()
    before = sorted((f.name, f.read_bytes()) for f in run.iterdir() if f.is_file())
    capsys.readouterr()
    for extra in ([], ["--resume"]):
        assert main(tmp_path, *DIGITS, "--epochs=1", "--lr=0.2", *extra) == 2
        err = one_line_error(capsys)
        assert "--overwrite" in err and "no checkpoint" in err
        assert sorted((f.name, f.read_bytes()) for f in run.iterdir() if f.is_file()) == before
    assert main(tmp_path, *DIGITS, "--epochs=1", "--lr=0.2", "--overwrite") == 0
    assert strict(run / "summary.json")["config"]["lr"] == 0.2
    assert len(list(run.glob("events.out.tfevents.*"))) == 1


class Killed(BaseException):
    """The process killed (kill -9) in the first checkpoint's write: nothing after it runs."""


@pytest.mark.parametrize("extra", [[], ["--resume"]])
def test_a_run_killed_before_its_first_checkpoint_starts_again_from_scratch(
    tmp_path, capsys, monkeypatch, extra
):
    """Its outputs (config.json, events) hold no result: the same command, or --resume, trains it
    again and says so in one line; a finished run's outputs are still never replaced (above)."""

    def killed(path, body):
        raise Killed

    with monkeypatch.context() as m:
        m.setattr(ckpt, "save", killed)
        with pytest.raises(Killed):
            main(tmp_path, *DIGITS, "--epochs=1", "--lr=0.2")
    run = out_dir(tmp_path)
    assert (run / "config.json").exists() and list(run.glob("events.out.tfevents.*"))
    assert not (run / "checkpoint.pt").exists()
    capsys.readouterr()
    assert main(tmp_path, *DIGITS, "--epochs=1", *extra) == 0
    said = [ln for ln in capsys.readouterr().out.splitlines() if "first checkpoint" in ln]
    assert len(said) == 1 and "starting it from scratch" in said[0], said
    assert strict(run / "summary.json")["config"]["lr"] == 0.05  # this command's run, not the old
    assert len(list(run.glob("events.out.tfevents.*"))) == 1
    # from now on it holds a result: neither command replaces it
    assert main(tmp_path, *DIGITS, "--epochs=1", "--lr=0.2") == 2
    assert "--resume" in one_line_error(capsys)


@pytest.mark.slow
def test_a_run_killed_9_in_its_first_checkpoint_write_reruns_with_the_same_command(tmp_path):
    """A real kill -9 while the first checkpoint is half written (the save's test pause): the same
    command trains the run from scratch, exit 0."""
    import os
    import signal
    import subprocess
    import time

    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, str(root / "reproduce" / "train.py"), f"--logdir={tmp_path}"]
    cmd += ["--progress=false", "--landscape=false", *DIGITS, "--epochs=1"]
    env = {**os.environ, ckpt.TEST_PAUSE_ENV: "300"}
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL)
    run = out_dir(tmp_path)
    deadline = time.monotonic() + 300  # only keeps a broken run from hanging the suite
    while not list(run.glob(".checkpoint.pt.tmp-*")) and time.monotonic() < deadline:
        assert proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert not (run / "checkpoint.pt").exists() and (run / "config.json").exists()
    del env[ckpt.TEST_PAUSE_ENV]
    again = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "starting it from scratch" in again.stdout
    assert strict(run / "summary.json")["status"] == "finished"


@pytest.mark.slow
def test_a_sweep_killed_before_a_runs_first_checkpoint_continues_when_rerun(
    tmp_path, capsys, monkeypatch
):
    """The sweep's process killed in its run's first checkpoint write (in-process runs): the same
    command trains that run from scratch and selects its cell, which is not marked failed."""
    from reproduce import sweep

    args = ["--grid=rho=0.05", "--seeds=0", "--", f"--logdir={tmp_path}", *DIGITS]
    args += ["--epochs=1", "--val_fraction=0.2", "--estimator=gam"]

    def killed(path, body):
        raise Killed

    with monkeypatch.context() as m:
        m.setattr(ckpt, "save", killed)
        with pytest.raises(Killed):
            sweep.main(args)
    run = tmp_path / "sweep.digits" / "rho=0.05" / "seed=0" / "gam"
    assert (run / "config.json").exists() and not (run / "checkpoint.pt").exists()
    capsys.readouterr()
    assert sweep.main(args) == 0
    out = capsys.readouterr().out
    assert "starting it from scratch" in out and "selected rho=0.05" in out, out
    (cell,) = strict(tmp_path / "sweep.digits" / "sweep.json")["cells"]
    assert cell["status"] == "complete" and cell["seeds"]["0"]["status"] == "finished", cell


# 2. Skipped steps: every step of one gradient skipped is a divergence; fewer are flagged.
@pytest.mark.parametrize("every", [2, 3])
def test_a_run_whose_estimator_steps_were_all_skipped_is_diverged(tmp_path, capsys, every):
    args = [*DIGITS, "--estimator=gam", f"--every={every}", "--epochs=2", "--rho=1e308"]
    assert main(tmp_path, *args) == 3
    err = one_line_error(capsys)
    assert "diverged" in err and "estimator was skipped" in err
    s = strict(out_dir(tmp_path, "gam") / "summary.json")
    assert s["status"] == "diverged" and s["exit_code"] == 3 and s["final"] is None


@pytest.mark.parametrize("estimator", ["looksam", "look_gam"])
def test_a_reusing_estimator_whose_full_steps_were_all_skipped_is_diverged(
    tmp_path, capsys, estimator
):
    """ρ = 1e308: every full step (0, 5, ..., 25 of 28) is skipped; the steps between train plain
    SGD from a stored part that never was. The rule of --every holds for the estimator's period."""
    args = [*DIGITS, f"--estimator={estimator}", "--epochs=2", "--rho=1e308"]
    assert main(tmp_path, *args, "--landscape=false") == 3
    err = one_line_error(capsys)
    assert "diverged" in err and "every one of the 6 steps of its estimator was skipped" in err
    s = strict(out_dir(tmp_path, estimator) / "summary.json")
    assert s["status"] == "diverged" and s["exit_code"] == 3 and s["final"] is None


def test_a_run_with_some_skipped_steps_is_flagged_in_its_summary_and_table(
    tmp_path, capsys, monkeypatch
):
    """The first batch made NaN: its step is skipped, the other 13 train."""
    import gamfunc

    make_step = gamfunc.make_step

    def first_batch_nan(*a, **k):
        inner, calls = make_step(*a, **k), []

        class FirstNaN:
            def __getattr__(self, name):
                return getattr(inner, name)

            def __call__(self, params, state, batch):
                calls.append(1)
                if len(calls) == 1:
                    batch = (torch.full_like(batch[0], float("nan")), batch[1])
                return inner(params, state, batch)

        return FirstNaN()

    monkeypatch.setattr(gamfunc, "make_step", first_batch_nan)
    assert main(tmp_path, *DIGITS, "--epochs=1") == 0
    s = strict(out_dir(tmp_path) / "summary.json")
    assert s["status"] == "finished" and s["skipped_steps"] == 1
    assert "skipped_steps" in s["flags"]
    assert "(1 of 14 steps skipped)" in capsys.readouterr().out


# 6. Every entry of a checkpoint is checked on load; a crafted one is refused in one line.
def _craft(path: Path, change) -> None:
    body = ckpt.load(path)
    change(body)
    ckpt.save(path, body)  # a valid digest over the crafted body


def _record(epoch: int, step: int) -> dict:
    return {"epoch": epoch, "step": step, "train_loss": 2.0, "train_acc": 30.0, "skipped_steps": 0}


def _past_the_last_epoch(body) -> None:
    """Step 33 of a 2-epoch run of 14 steps an epoch: epoch 2 (both closed), batch 5."""
    body["position"].update(epoch=2, batch=5, global_step=33)
    body["history"] = [_record(1, 14), _record(2, 28)]


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda b: b["position"].update(epoch=-5, batch=10**9), "epoch"),
        (lambda b: b["position"].update(batch=10**9), "batch"),
        (lambda b: b["position"].update(global_step=7), "global_step"),
        (lambda b: b["position"].update(epoch=1.5), "epoch"),
        (lambda b: b["position"].update(train_seconds=float("nan")), "train_seconds"),
        (lambda b: b.update(rng={"torch": torch.zeros(7, dtype=torch.uint8)}), "RNG"),
        (lambda b: b.update(rng="nope"), "RNG"),
        (lambda b: b.update(data_order="nope"), "data order"),
        (lambda b: b.update(data_order=torch.arange(5)), "data order"),
        (lambda b: b.update(data_order=torch.zeros(1400, dtype=torch.int64)), "data order"),
        (lambda b: b.update(data_order=None), "data order"),
        (lambda b: b.update(history={"a": 1}), "history"),
        # fields with a valid digest that resumed into false summaries or tracebacks
        (lambda b: b.update(history=[_record(i + 1, 14) for i in range(9)]), "history"),
        (lambda b: b["accum"].update(seen=torch.tensor(-1000)), "accum seen"),
        (lambda b: b["accum"].pop("seen"), "accum"),
        (lambda b: b["accum"].update(correct=torch.tensor(10**6)), "accum correct"),
        (lambda b: b["accum"].update(loss=torch.tensor(float("nan"), dtype=torch.float64)), "loss"),
        (lambda b: b["accum"].update(loss=torch.zeros(3, dtype=torch.float64)), "accum loss"),
        (lambda b: b["accum"].update(seen=torch.tensor(0.0)), "accum seen"),
        (_past_the_last_epoch, "batch 5 is in epoch 3"),
        (lambda b: b["state"].update(skipped=torch.tensor(-5)), "state.skipped"),
        (lambda b: b["state"].update(skipped=torch.tensor(99)), "state.skipped"),
        (lambda b: b.update(best={"val_acc": float("nan"), "epoch": 1}), "best val_acc"),
        (lambda b: b.update(best={"val_acc": 50.0, "epoch": 7}), "best epoch"),
        (lambda b: b.update(finished="yes"), "finished"),
        (lambda b: b.update(status="garbage"), "status"),
        (lambda b: b.update(finished=True), "status"),
        (lambda b: b["config"].pop("lr"), "config lacks lr"),
        (lambda b: b.update(config=[1, 2]), "config is a list"),
        (
            lambda b: b.update(data_order=b["data_order"].to(torch.int16)),
            "data order is torch.int16",
        ),
        (lambda b: b["params"].update({k: v.double() for k, v in b["params"].items()}), "float64"),
    ],
)
def test_a_crafted_checkpoint_is_refused_in_one_line(tmp_path, capsys, change, says):
    args = [*DIGITS, "--epochs=2", "--max_steps=3"]
    assert main(tmp_path, *args) == 0  # stopped at batch 3 of epoch 0: an order is saved
    path = out_dir(tmp_path) / "checkpoint.pt"
    _craft(path, change)
    capsys.readouterr()
    assert main(tmp_path, *DIGITS, "--epochs=2", "--resume") == 2
    err = one_line_error(capsys)
    assert says in err and "--overwrite" in err
    assert not (out_dir(tmp_path) / "summary.json").read_text().count('"finished"')


@pytest.fixture(scope="module")
def stopped_at_step_20(tmp_path_factory) -> Path:
    """A run stopped at step 20 of 28 (epoch 1 closed, batch 6 of epoch 2), a checkpoint every
    5 steps; its logdir."""
    logdir = tmp_path_factory.mktemp("step20")
    assert main(logdir, *DIGITS, "--epochs=2", "--max_steps=20", "--checkpoint_every=5") == 0
    return logdir


def _first_record(b) -> dict:
    return b["history"][0]


def _nan_momentum(b) -> None:
    buf = b["state"]["opt"]["inner"]["states"][1]["momentum_buffer"]
    buf["net.0.bias"] = torch.full_like(buf["net.0.bias"], float("nan"))


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda b: None, None),  # untouched: it resumes and finishes
        # the epoch records, which summary.json repeats as they are
        (lambda b: _first_record(b).update(train_acc=500.0), "train_acc 500.0"),
        (lambda b: _first_record(b).update(test_acc=-40.0), "test_acc -40.0"),
        (lambda b: _first_record(b).update(train_loss="low"), "train_loss 'low'"),
        (lambda b: _first_record(b).update(train_loss=float("nan")), "train_loss nan"),
        (lambda b: _first_record(b).update(train_loss=float("inf")), "train_loss inf"),
        (lambda b: _first_record(b).update(test_loss=float("nan")), "test_loss nan"),
        (lambda b: _first_record(b).update(step=999), "at step 999"),
        (lambda b: _first_record(b).update(skipped_steps=-7), "skipped_steps -7"),
        (lambda b: _first_record(b).update(skipped_steps=99), "99 skipped steps"),
        (lambda b: _first_record(b).update(lambda_max="flat"), "lambda_max 'flat'"),
        (lambda b: _first_record(b).update(mood="good"), "never writes (mood)"),
        (lambda b: _first_record(b).pop("train_acc"), "lacks train_acc"),
        # the step state against the position: the lr schedule reads state.step
        (lambda b: b["state"].update(step=torch.tensor(0)), "state.step 0"),
        (lambda b: b["state"].update(step=torch.tensor(5)), "state.step 5"),
        (
            lambda b: b["state"].update(skipped=torch.tensor(5), step=torch.tensor(15)),
            "state.skipped is 5, but its epoch records and sums count 0",
        ),
        # values a step never keeps, and hyperparameters that are not the configuration's
        (
            lambda b: b["state"]["opt"]["hyperparams"].update(weight_decay=torch.tensor(np.nan)),
            "['weight_decay'] is not finite",
        ),
        (
            lambda b: b["state"]["opt"]["hyperparams"].update(weight_decay=torch.tensor(0.5)),
            "['weight_decay'] is 0.5, not the",
        ),
        (_nan_momentum, "['net.0.bias'] is not finite"),
        (
            lambda b: b["params"].update({"net.0.bias": b["params"]["net.0.bias"] * np.inf}),
            "params",
        ),
    ],
)
def test_a_checkpoint_edited_with_a_valid_digest_never_resumes_into_a_false_summary(
    stopped_at_step_20, tmp_path, capsys, change, says
):
    """Each entry loaded and saved again with `checkpoint.load` and `save` (a valid digest): the
    resume checks its fields against what a run writes and refuses the edit in one line, exit 2,
    before anything trains."""
    import shutil

    shutil.copytree(stopped_at_step_20, tmp_path / "runs")
    path = out_dir(tmp_path / "runs") / "checkpoint.pt"
    _craft(path, change)
    capsys.readouterr()
    status = main(tmp_path / "runs", *DIGITS, "--epochs=2", "--checkpoint_every=5", "--resume")
    if says is None:
        assert status == 0
        assert strict(out_dir(tmp_path / "runs") / "summary.json")["status"] == "finished"
        return
    assert status == 2
    err = one_line_error(capsys)
    assert says in err and "--overwrite" in err, err
    assert strict(out_dir(tmp_path / "runs") / "summary.json")["status"] == "max_steps"


# 13. An image past PIL's decompression-bomb limit, or truncated, is named in one line.
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("damage", ["bomb", "truncated"])
def test_an_undecodable_image_is_a_data_error_naming_it(
    tmp_path, capsys, monkeypatch, workers, damage
):
    from PIL import Image
    from test_reproduce_data import make_image_folder

    data = make_image_folder(tmp_path / "cifar", splits=("train", "test"), per_class=4, size=32)
    bad = data / "train" / "bee" / "1.png"
    if damage == "bomb":  # 64×64 pixels past twice a limit of 1500 (the real one: 89 million)
        Image.new("RGB", (64, 64)).save(bad)
        monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1500)
    else:
        bad.write_bytes(bad.read_bytes()[: len(bad.read_bytes()) // 2])
    args = ["--preset=hp1.cifar10.resnet18", f"--data={data}", "--model=resnet32"]
    args += ["--batch_size=8", "--max-steps=1", "--estimator=sgd", f"--workers={workers}"]
    assert main(tmp_path / "runs", *args, *NO_FLATNESS) == 2
    err = one_line_error(capsys)
    assert err.startswith("error: cannot read the data") and "1.png" in err, err


# Data folders that would hang, repeat images or train one class: one line naming what, exit 2.
@pytest.mark.parametrize("bad", ["fifo", "socket", "link_loop", "folder_loop", "one_class"])
def test_a_bad_data_folder_is_refused_in_one_line_naming_it(tmp_path, capsys, bad):
    import os
    import socket

    from test_reproduce_data import make_image_folder

    classes = ("ant",) if bad == "one_class" else ("ant", "bee")
    data = make_image_folder(tmp_path / "cifar", ("train", "test"), classes, per_class=4, size=8)
    ant = data / "train" / "ant"
    if bad == "fifo":  # opening it would block start-up for ever
        os.mkfifo(ant / "9.png")
    elif bad == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(ant / "9.png"))
    elif bad == "link_loop":
        (data / "train" / "cat").symlink_to("cat")
    elif bad == "folder_loop":
        (ant / "again").symlink_to("../ant")
    args = ["--preset=hp1.cifar10.resnet18", f"--data={data}", "--model=resnet32"]
    args += ["--batch_size=2", "--max-steps=1", "--estimator=sgd"]
    try:
        assert main(tmp_path / "runs", *args, *NO_FLATNESS) == 2
    finally:
        if bad == "socket":
            sock.close()
    err = one_line_error(capsys)
    says = {
        "fifo": "9.png' is not a regular file",
        "socket": "9.png' is not a regular file",
        "link_loop": "cat': Too many levels of symbolic links",
        "folder_loop": "again' is",
        "one_class": "has 1 class folder(s) (ant); a classifier needs at least 2",
    }[bad]
    assert says in err, err
    assert not list((tmp_path / "runs").rglob("checkpoint.pt"))


# 11, 12, 14, 18. Bad values: one line naming the flag and its rule, exit 2, before any training.
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--flatness_rho=inf"], "--flatness_rho must be a finite number"),  # 11
        (["--lr=nan"], "--lr must be a finite number"),
        (["--threads=100000"], "--threads must be at most"),  # 12
        (["--synthetic", "--num_classes=1", "--label_noise=0.1"], "--num_classes must be"),  # 14
        (["--synthetic", "--synthetic_size=100000000000"], "--synthetic_size=100000000000"),
        (["--synthetic", "--preset=hp1.cifar10.resnet18", "--image_size=100000"], "--image_size"),
        (["--rho=-1"], "--rho must be a finite number >= 0"),  # 18
        (["--seed=100000000000000000000"], "--seed must be an integer in [0, 2**63)"),
        (["--seed=1e20"], "--seed takes an integer"),
        (["--preset=hp2.imagenet.resnet50", "--data=/nonexistent"], "ImageNet not found"),
        (["--preset=hp1.cifar10.resnet18", "--data=/nonexistent"], "not found"),
        # counts have upper bounds: a typo is refused, not run for days or forked 100,000 times
        (["--ascent_steps=99999999999999999999999"], "--ascent_steps must be at most 100"),
        (["--epochs=99999999999999999999999"], "--epochs must be at most"),
        (["--eig_iters=100000000"], "--eig_iters must be at most"),
        (["--synthetic", "--num_classes=1000000000000"], "--num_classes must be at most"),
        (["--workers=100000"], "--workers must be at most"),
        # a method that cycles by itself takes no --every beside it
        (["--estimator=looksam", "--every=2"], "--every must be 1 with looksam"),
        (["--estimator=look_gam", "--every=2"], "--every must be 1 with look_gam"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_flag_before_training(tmp_path, capsys, args, says):
    assert main(tmp_path, *DIGITS, "--epochs=1", *args) == 2
    err = one_line_error(capsys)
    assert says in err, err
    assert not list(tmp_path.rglob("checkpoint.pt")) and not list(tmp_path.rglob("events.*"))


# 19. A folder that cannot be written says what exists: no checkpoint, or the last one.
@pytest.mark.parametrize("how", ["lock_is_a_folder", "logdir_is_a_file", "disk_full"])
def test_a_run_folder_that_cannot_be_written_says_what_exists(tmp_path, capsys, monkeypatch, how):
    logdir = tmp_path / "runs"
    if how == "lock_is_a_folder":
        (out_dir(logdir) / ".lock").mkdir(parents=True)
    elif how == "logdir_is_a_file":
        logdir.write_text("")
    else:  # a write that fails names no file: the line names the one being written

        def full(path, text, *a, **k):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(Path, "write_text", full)
    assert main(logdir, *DIGITS, "--epochs=1") == 2
    err = one_line_error(capsys)
    assert "cannot write" in err and "no checkpoint was written" in err, err
    assert "--resume" not in err and "intact" not in err
    if how == "disk_full":  # the line names the file that failed, not the run's folder
        assert "config.json'" in err, err


@pytest.mark.parametrize("when", ["start", "later"])
def test_a_full_disk_under_tensorboards_writer_is_one_line_naming_its_file(
    tmp_path, capsys, monkeypatch, when
):
    """The events are written on TensorBoard's own thread: its failure prints no traceback of that
    thread beside the run's one line, which names the events file; the same command then runs."""
    import errno

    from tensorboard.summary.writer import record_writer

    write, calls = record_writer.RecordWriter.write, []

    def full(self, data):
        calls.append(1)
        if when == "start" or len(calls) > 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(self, data)

    with monkeypatch.context() as m:
        m.setattr(record_writer.RecordWriter, "write", full)
        assert main(tmp_path, *DIGITS, "--epochs=2", "--log_every=1") == 2
    err = one_line_error(capsys)
    assert "Exception in thread" not in err and "events.out.tfevents." in err, err
    assert err.startswith("error: cannot write") and "No space left on device" in err, err
    assert main(tmp_path, *DIGITS, "--epochs=2", *(["--resume"] if when == "later" else [])) == 0


def test_a_full_disk_while_saving_a_figure_names_the_figure(tmp_path):
    """matplotlib's failed write names no file; the error the run's one line quotes names it."""
    import errno

    from reproduce.run import report

    class Figure:
        def savefig(self, path, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device")

    path = tmp_path / "landscape_step5.png"
    with pytest.raises(OSError) as failed:
        report.save_figure(Figure(), path, dpi=100)
    assert failed.value.filename == str(path) and failed.value.errno == errno.ENOSPC
