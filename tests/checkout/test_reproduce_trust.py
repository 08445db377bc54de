"""What a user of reproduce/train.py can rely on: continuous TensorBoard series after a resume, no
silent retraining of a finished run, one process per run folder, a diverged run that stops and says
so, honest summaries, and one-line errors (exit 2) for unusable weights, devices and disks."""

from __future__ import annotations

import errno
import json
import os
import pickle
import signal
from pathlib import Path

import pytest
import torch
from train_cli import DIGITS, NO_FLATNESS, main, one_line_error, out_dir

from reproduce import train
from reproduce.run import checkpoint as ckpt
from reproduce.run import loop, report, resume


def scalars(run: Path) -> dict[str, list[int]]:
    """{tag: [steps]} as TensorBoard shows them (purges applied), over every events file."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [e.step for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_a_resumed_run_logs_each_step_of_each_tag_once_and_loses_none(tmp_path, monkeypatch):
    """Stopped by SIGINT mid-epoch and at an epoch's end, resumed each time: every scalar tag has the
    steps of an uninterrupted run, each once (the resume step's points included)."""
    args = [*DIGITS, "--epochs=3", "--log_every=2", "--checkpoint_every=4"]
    assert main(tmp_path / "a", *args) == 0
    log_step = report.log_step

    def stop_at(step):
        def hook(tblog, writer, metrics, state, s, rate):
            log_step(tblog, writer, metrics, state, s, rate)
            if s == step:
                os.kill(os.getpid(), signal.SIGINT)

        monkeypatch.setattr(report, "log_step", hook)

    stop_at(6)
    assert main(tmp_path / "b", *args) == 128 + signal.SIGINT
    stop_at(14)  # the last step of epoch 1 (1437 // 100 = 14 steps an epoch)
    assert main(tmp_path / "b", *args, "--resume") == 128 + signal.SIGINT
    monkeypatch.undo()
    assert main(tmp_path / "b", *args, "--resume") == 0
    want, got = scalars(out_dir(tmp_path / "a")), scalars(out_dir(tmp_path / "b"))
    assert set(got) == set(want) and {"test/acc", "train/loss", "step/loss"} <= set(got)
    for tag, steps in want.items():
        assert got[tag] == steps, tag
        assert len(set(steps)) == len(steps), tag


def test_rerunning_a_finished_run_is_refused_and_overwrite_starts_clean(tmp_path, capsys):
    assert main(tmp_path, *DIGITS, "--epochs=1") == 0
    run = out_dir(tmp_path)
    before = (run / "summary.json").read_text()
    capsys.readouterr()
    assert main(tmp_path, *DIGITS, "--epochs=1") == 2
    err = one_line_error(capsys)
    assert "finished run" in err and "--resume" in err and "--overwrite" in err
    assert (run / "summary.json").read_text() == before
    assert len(list(run.glob("events.out.tfevents.*"))) == 1
    assert main(tmp_path, *DIGITS, "--epochs=1", "--resume") == 0  # reuses the summary
    assert len(list(run.glob("events.out.tfevents.*"))) == 1
    assert main(tmp_path, *DIGITS, "--epochs=1", "--overwrite") == 0
    assert len(list(run.glob("events.out.tfevents.*"))) == 1  # the old events are gone
    steps = scalars(run)["step/loss"]
    assert len(steps) == len(set(steps))


def test_a_second_process_cannot_train_into_a_locked_run_folder(tmp_path, capsys):
    run = out_dir(tmp_path)
    held = resume.lock(run)
    try:
        assert main(tmp_path, *DIGITS, "--epochs=1") == 2
        err = one_line_error(capsys)
        assert "another process is training into" in err
        assert not (run / "checkpoint.pt").exists()
        assert (run / ".lock").exists()  # the refused process leaves the holder's lock alone
    finally:
        held.close()
    assert main(tmp_path, *DIGITS, "--epochs=1") == 0  # released: the run goes ahead
    assert not (run / ".lock").exists()  # a finished run leaves its outputs alone in its folder


def test_a_diverged_run_stops_with_a_message_and_no_fake_loss(tmp_path, capsys):
    args = [*DIGITS, "--lr=1e25", "--epochs=4", "--log_every=1", "--max_skipped=5"]
    assert main(tmp_path, *args) == 3
    err = one_line_error(capsys)
    assert "steps were all skipped" in err and "--max_skipped=5" in err
    body = ckpt.load(out_dir(tmp_path) / "checkpoint.pt")
    assert body["status"] == "diverged"
    assert all(torch.isfinite(p).all() for p in body["params"].values())


def test_an_epoch_of_skipped_steps_reports_no_mean_and_counts_them(tmp_path, capsys):
    args = [*DIGITS, "--lr=1e25", "--epochs=1", "--max_skipped=0"]
    assert main(tmp_path, *args) == 3  # and the run is diverged (see below)
    out = capsys.readouterr().out
    assert "every step skipped" in out or "skipped (non-finite)" in out
    assert "train loss 0.0000" not in out
    s = json.loads((out_dir(tmp_path) / "summary.json").read_text())
    record = s["history"][0]
    assert record["skipped_steps"] >= 13
    assert record["train_loss"] is None or record["skipped_steps"] < 14


def _strict(path: Path) -> dict:
    def refuse(name):
        raise ValueError(f"{path} holds {name}, which is not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


@pytest.mark.parametrize("metrics", [True, False], ids=["with_metrics", "without_metrics"])
def test_a_run_that_did_not_train_is_diverged_not_finished(tmp_path, capsys, metrics):
    """lr = 1e25: the first step sends the weights to ~1e25 and the other 27 are skipped. The run
    exits 3 with one line, computes no metric on those weights, and its summary parses strictly."""
    args = ["--preset=digits", "--estimator=sgd", "--lr=1e25", "--epochs=2"]
    args += ["--eig_iters=3", "--trace_samples=2", "--r1_steps=1"] if metrics else NO_FLATNESS
    assert main(tmp_path, *args) == 3
    err = one_line_error(capsys)
    assert "diverged" in err and "27 of its 28 steps were skipped" in err
    s = _strict(out_dir(tmp_path) / "summary.json")
    assert s["status"] == "diverged" and "--max_skipped_fraction" in s["reason"]
    assert s["final"] is None and s["skipped_steps"] == 27
    assert ckpt.load(out_dir(tmp_path) / "checkpoint.pt")["status"] == "diverged"


def test_parameters_that_grew_past_the_bound_make_a_run_diverged(tmp_path, capsys):
    assert main(tmp_path, *DIGITS, "--epochs=1", "--max_param_rms=1e-3") == 3
    assert "root mean square" in one_line_error(capsys)
    assert _strict(out_dir(tmp_path) / "summary.json")["status"] == "diverged"


@pytest.mark.parametrize("flag", ["--max_skipped_fraction=1.5", "--max_param_rms=0"])
def test_divergence_bounds_are_validated(tmp_path, capsys, flag):
    assert main(tmp_path, *DIGITS, flag) == 2
    assert flag.split("=")[0].lstrip("-") in one_line_error(capsys)


def test_summary_has_no_placeholders_and_the_end_says_where_outputs_are(tmp_path, capsys):
    args = ["--preset=digits", "--estimator=sgd", "--epochs=1", "--eig_iters=3"]
    args += ["--trace_samples=2", "--r1_steps=1", "--flatness_samples=50"]
    assert train.main([f"--logdir={tmp_path}", "--progress=false", *args]) == 0
    out = capsys.readouterr().out
    assert f"tensorboard --logdir {tmp_path / 'digits'}" in out
    assert "flatness at step" in out and "flatness done in" in out
    s = json.loads((out_dir(tmp_path) / "summary.json").read_text())
    assert s["best_val"] is None and -1.0 not in s["final"].values()
    pngs = list(out_dir(tmp_path).glob("landscape_step*.png"))
    assert len(pngs) == 1 and pngs[0].read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("kind", ["truncated", "text", "pickle", "other_model"])
def test_unusable_weights_give_one_line_and_exit_2(tmp_path, capsys, kind):
    from reproduce.models import build_model

    path = tmp_path / "w.pt"
    if kind == "truncated":
        torch.save(build_model("mlp", 10, 64).state_dict(), path)
        path.write_bytes(path.read_bytes()[:200])
    elif kind == "text":
        path.write_text("not weights\n")
    elif kind == "pickle":
        path.write_bytes(pickle.dumps(print))  # a pickle that would call code
    else:
        torch.save(build_model("mlp", 10, 40).state_dict(), path)  # another input size
    assert main(tmp_path / "runs", *DIGITS, "--max-steps=1", f"--weights={path}") == 2
    err = one_line_error(capsys)
    assert str(path) in err and "weights_only" not in err


def test_a_cuda_device_on_a_machine_without_one_is_one_line(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    assert main(tmp_path, *DIGITS, "--device=cuda", "--max-steps=1") == 2
    assert "no CUDA device" in one_line_error(capsys)


def test_a_disk_that_fills_mid_run_keeps_the_last_checkpoint(tmp_path, capsys, monkeypatch):
    save, calls = ckpt.save, []

    def full_disk(path, body):
        calls.append(path)
        if len(calls) >= 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        save(path, body)

    monkeypatch.setattr(ckpt, "save", full_disk)
    assert main(tmp_path, *DIGITS, "--epochs=3", "--checkpoint_every=3") == 2
    err = one_line_error(capsys)
    assert "No space left on device" in err and "--resume" in err
    body = ckpt.load(out_dir(tmp_path) / "checkpoint.pt")  # the first one, whole
    assert body["position"]["global_step"] == 3


def test_a_corrupt_resume_file_does_not_suggest_unsafe_loading(tmp_path, capsys):
    assert main(tmp_path, *DIGITS, "--max-steps=2") == 0
    path = out_dir(tmp_path) / "checkpoint.pt"
    path.write_bytes(pickle.dumps(print))
    capsys.readouterr()
    assert main(tmp_path, *DIGITS, "--resume") == 2
    err = one_line_error(capsys)
    assert "weights_only" not in err and str(path) in err


@pytest.mark.parametrize(
    ("flag", "named"),
    [("--name=/tmp/elsewhere", "name"), ("--name=../../x", "name"), ("--epochs=-3", "epochs")],
)
def test_values_that_would_leave_the_logdir_or_make_no_sense_are_refused(
    tmp_path, capsys, flag, named
):
    assert main(tmp_path, *DIGITS, flag) == 2
    assert one_line_error(capsys).startswith(f"error: --{named} must be")
    assert not (tmp_path.parent / "x").exists()


def test_help_lists_the_estimators(capsys):
    assert train.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "gam_accelerated_official" in out and "sam+gam" in out


def test_a_checkpoint_without_its_fields_is_refused_in_one_line(tmp_path, capsys):
    assert main(tmp_path, *DIGITS, "--max-steps=2") == 0
    path = out_dir(tmp_path) / "checkpoint.pt"
    body = ckpt.load(path)
    del body["position"], body["rng"]
    ckpt.save(path, body)  # a valid digest, the fields gone
    capsys.readouterr()
    assert main(tmp_path, *DIGITS, "--max-steps=4", "--resume") == 2
    err = one_line_error(capsys)
    assert "is not a checkpoint of reproduce/train.py" in err and "position, rng" in err


def test_a_corrupt_summary_of_a_finished_run_is_refused_in_one_line(tmp_path, capsys):
    assert main(tmp_path, *DIGITS, "--epochs=1") == 0
    (out_dir(tmp_path) / "summary.json").write_text('{"status": "finished", ')
    capsys.readouterr()
    assert main(tmp_path, *DIGITS, "--epochs=1", "--resume") == 2
    assert "not readable JSON" in one_line_error(capsys)


def test_a_smoke_run_takes_its_metrics_at_a_small_size_and_says_so(tmp_path, capsys):
    args = ["--preset=digits", "--estimator=sgd", "--max-steps=3", "--eig_iters=50"]
    args += ["--trace_samples=20", "--r1_steps=10", "--landscape=false"]
    assert main(tmp_path, *args) == 0
    out = capsys.readouterr().out
    assert "a smoke run" in out and "5 Lanczos products, 2 trace probes" in out
    assert "on 64 training examples" in out and "--full_metrics=true" in out
    final = json.loads((out_dir(tmp_path) / "summary.json").read_text())["final"]
    assert final["lambda_max"] is not None
    assert main(tmp_path / "full", *args, "--full_metrics=true") == 0
    assert "a smoke run" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--preset=digits", "--model=resnet18"], "resnet18 takes images"),
        (["--preset=hp1.cifar10.resnet18", "--synthetic", "--model=mlp"], "mlp takes vectors"),
    ],
)
def test_a_model_that_cannot_take_the_data_is_refused_in_one_line(tmp_path, capsys, args, says):
    assert main(tmp_path, *args, "--estimator=sgd", "--max-steps=1", *NO_FLATNESS) == 2
    assert says in one_line_error(capsys)


def test_a_run_stopped_by_max_steps_says_so_from_the_start_to_the_end(tmp_path, capsys):
    assert main(tmp_path, *DIGITS, "--max-steps=3") == 0
    out = capsys.readouterr().out
    assert "60 epochs (stopping at step 3, --max_steps)" in out.splitlines()[0]
    assert "[sgd] stopped at step 3 of 840 (--max_steps=3)" in out
    assert "a smoke run" not in out  # no metric asked for, none announced


def test_an_unexpected_error_is_not_hidden_as_a_refusal(tmp_path, monkeypatch):
    """A bug is no bad input: it is not turned into exit 2 and one line, but raised (as a script,
    a traceback and exit 1: the "other" row of the exit statuses in docs/guides/failure.md)."""

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in setup")

    monkeypatch.setattr(loop, "setup", broken)
    with pytest.raises(RuntimeError, match="a bug in setup"):
        main(tmp_path, *DIGITS, "--max-steps=1")


def test_the_docs_list_every_exit_status_with_its_tests():
    """The table of exit statuses in docs/guides/failure.md has a row for 0, 2, 3, 130, 143 and other, and every test
    it names exists."""
    import re

    root = Path(__file__).resolve().parents[2]
    text = (root / "docs" / "guides" / "failure.md").read_text()
    rows = re.findall(r"^\| (\d+|other[^|]*) \|.*\|(.*)\|$", text, re.M)
    assert [r[0].split()[0] for r in rows] == ["0", "2", "3", "130", "143", "other"]
    tests = "".join(p.read_text() for p in (root / "tests").rglob("test_*.py"))
    for _, named in rows:
        for name in re.findall(r"`(test_\w+?)(?:_\*)?`", named):
            assert f"def {name}" in tests, name


def test_every_test_the_failure_guide_names_exists():
    """Each promise of docs/guides/failure.md names the test that backs it (``name`` or a prefix
    ``name_*``): every one is a test of tests/, so that a promise cannot outlive its check."""
    import re

    root = Path(__file__).resolve().parents[2]
    text = (root / "docs" / "guides" / "failure.md").read_text()
    tests = "".join(p.read_text() for p in (root / "tests").rglob("test_*.py"))
    named = re.findall(r"(test_\w+?)(_?\*)?(?=[`\]),\s])", text)
    assert len(named) > 80  # the guide names its tests
    missing = [
        name + wild
        for name, wild in named
        if not (f"def {name}" in tests if wild else re.search(rf"def {name}\(", tests))
    ]
    assert missing == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a machine without a GPU")
def test_cuda_graph_without_a_gpu_is_refused_in_one_line(tmp_path, capsys):
    assert main(tmp_path, *DIGITS, "--cuda_graph", "--device=cpu") == 2
    err = one_line_error(capsys)
    assert "--cuda_graph" in err and "GPU" in err
