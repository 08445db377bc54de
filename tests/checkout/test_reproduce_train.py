"""reproduce/train.py end to end: the default benchmark, TensorBoard output, exact resume, signals,
atomic checkpoints, and the refusals that keep a run from being lost or mixed up."""

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

# reproduce/ lives at the repository root
from test_reproduce_data import make_image_folder

from reproduce import build, train
from reproduce.run import checkpoint as ckpt
from reproduce.run import loaders, report

ROOT = Path(__file__).resolve().parents[2]

QUIET = ["--progress=false", "--landscape=false"]
NO_FLATNESS = ["--eig_iters=0", "--trace_samples=0", "--r1_steps=0"]


def run_dir(logdir: Path, name: str, estimator: str) -> Path:
    return logdir / name / estimator


def summary(logdir: Path, name: str, estimator: str) -> dict:
    return json.loads((run_dir(logdir, name, estimator) / "summary.json").read_text())


def main(logdir: Path, *args: str) -> int:
    return train.main([f"--logdir={logdir}", *QUIET, *args])


def test_shortened_default_reaches_its_accuracy_and_prints_the_table(tmp_path, capsys):
    """The main job cut to 20 of its 100 epochs. The full run (docs/guides/reproduce.md) ends at SGD 100% train / 66.0%
    test, λ_max 3.5; SGD+GAM 90.3% / 71.7%, λ_max 0.9."""
    args = ["--epochs=20", "--eig_iters=20", "--trace_samples=10", "--r1_steps=2"]
    assert main(tmp_path, *args) == 0
    sgd = summary(tmp_path, "mnist1d", "sgd")["final"]
    gam = summary(tmp_path, "mnist1d", "gam")["final"]
    assert (
        sgd["test_acc"] >= 55.0 and sgd["train_eval_acc"] >= 70.0
    )  # 60.9 and 74.7 on torch 2.14 CPU
    assert gam["test_acc"] >= 40.0  # 44.9: GAM converges later (cosine over 20 epochs)
    assert gam["lambda_max"] < 0.5 * sgd["lambda_max"]  # 1.4 against 7.9
    assert gam["trace"] < sgd["trace"] and gam["r1"] < sgd["r1"]
    assert len(summary(tmp_path, "mnist1d", "gam")["history"]) == 20
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("estimator"))
    for column in ("train acc", "test acc", "gap", "λ_max", "trace", "R1"):
        assert column in header
    rows = [line for line in out.splitlines() if line.startswith(("sgd ", "gam "))]
    assert len(rows) == 2 and "ρ=0.5,α=1" in rows[1]
    comparison = json.loads((tmp_path / "mnist1d" / "comparison.json").read_text())
    assert [c["estimator"] for c in comparison] == ["sgd", "gam"]
    assert all(c["status"] == "finished" for c in comparison)
    cfg = json.loads((run_dir(tmp_path, "mnist1d", "gam") / "config.json").read_text())
    assert (cfg["estimator"], cfg["epochs"], cfg["rho"], cfg["alpha"]) == ("gam", 20, 0.5, 1.0)


def test_image_folder_trains_and_writes_tensorboard_events(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    data = make_image_folder(tmp_path / "imagenet", per_class=4, size=16)
    args = [
        "--preset=hp2.imagenet.resnet50",
        f"--data={data}",
        "--model=wrn28_2",
        "--image_size=16",
        "--batch_size=4",
        "--eval_batch_size=8",
        "--epochs=2",
        "--workers=0",
        "--augment=cutout",
        "--log_every=1",
        "--flatness_every=1",
        "--flatness_samples=4",
        "--eig_iters=3",
        "--trace_samples=2",
        "--r1_steps=1",
        "--histogram_every=1",
        "--landscape=true",
    ]
    assert train.main([f"--logdir={tmp_path / 'runs'}", "--progress=false", *args]) == 0
    out = run_dir(tmp_path / "runs", "hp2.imagenet.resnet50", "gam")
    events = EventAccumulator(str(out), size_guidance={"images": 0, "scalars": 0, "histograms": 0})
    events.Reload()
    tags = events.Tags()
    expected = {
        "step/loss",
        "opt/lr",
        "opt/rho",
        "grad/grad_norm",
        "grad/f_norm",
        "grad/adv_grad_norm",
        "perf/images_per_s",
        "train/loss",
        "train/acc",
        "test/loss",
        "test/acc",
        "flatness/lambda_max",
        "flatness/trace",
        "flatness/r1",
    }
    assert expected <= set(tags["scalars"])
    assert [e.step for e in events.Scalars("step/loss")] == [1, 2, 3, 4]
    assert len(events.Scalars("test/acc")) == 2  # once per epoch
    assert len(events.Scalars("flatness/lambda_max")) == 2  # epoch 1, and at the end
    assert "flatness/landscape_1d" in tags["images"]
    assert any(t.startswith("params/") for t in tags["histograms"])
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "finished" and s["steps"] == 4 and s["final"]["epoch"] == 2
    assert json.loads((out / "config.json").read_text())["model"] == "wrn28_2"


def _signal_at_step(monkeypatch, at: int, signum=signal.SIGINT):
    """Deliver ``signum`` to this process right after step ``at`` (from inside the loop)."""
    log_step = report.log_step

    def hook(tblog, writer, metrics, state, step, rate):
        log_step(tblog, writer, metrics, state, step, rate)
        if step == at:
            os.kill(os.getpid(), signum)

    monkeypatch.setattr(report, "log_step", hook)


def _tensors(obj, prefix=""):
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _tensors(v, f"{prefix}.{k}")
    elif isinstance(obj, tuple | list):
        for i, v in enumerate(obj):
            yield from _tensors(v, f"{prefix}[{i}]")


def test_resume_after_sigint_and_max_steps_is_bit_exact(tmp_path, monkeypatch):
    """Interrupted at step 5 (SIGINT), resumed to step 24 (an epoch's end), resumed to the end:
    params, optimiser state, buffers, history and final metrics equal an uninterrupted run's bit for bit."""
    common = [
        "--preset=digits",
        "--estimator=gam",
        "--every=3",
        "--rho=0.1",
        "--alpha=0.5",
        "--val-fraction=0.1",
        "--epochs=3",
        "--flatness_every=1",
        "--eig_iters=5",
        "--trace_samples=2",
        "--r1_steps=2",
    ]
    assert main(tmp_path / "a", *common) == 0
    _signal_at_step(monkeypatch, 5)
    assert main(tmp_path / "b", *common, "--log_every=1") == 128 + signal.SIGINT
    monkeypatch.undo()
    b = run_dir(tmp_path / "b", "digits", "gam")
    first = ckpt.load(b / "checkpoint.pt")
    assert (first["status"], first["position"]["global_step"]) == ("interrupted", 5)
    assert main(tmp_path / "b", *common, "--resume", "--max-steps=24", "--checkpoint_every=5") == 0
    second = ckpt.load(b / "checkpoint.pt")
    assert (second["status"], second["position"]["batch"]) == ("max_steps", 12)  # 1293 // 100
    assert main(tmp_path / "b", *common, "--resume") == 0

    end_a = ckpt.load(run_dir(tmp_path / "a", "digits", "gam") / "checkpoint.pt")
    end_b = ckpt.load(b / "checkpoint.pt")
    pairs = list(zip(_tensors(end_a["params"]), _tensors(end_b["params"]), strict=True))
    pairs += list(zip(_tensors(end_a["state"]), _tensors(end_b["state"]), strict=True))
    for (ka, ta), (kb, tb) in pairs:
        assert ka == kb and torch.equal(ta, tb), ka
    assert end_a["history"] == end_b["history"] and end_a["best"] == end_b["best"]
    sa, sb = summary(tmp_path / "a", "digits", "gam"), summary(tmp_path / "b", "digits", "gam")
    assert sa["final"] == sb["final"] and sa["steps"] == sb["steps"] == 36
    best_a = ckpt.load(run_dir(tmp_path / "a", "digits", "gam") / "best.pt")
    best_b = ckpt.load(b / "best.pt")
    assert all(torch.equal(best_a["params"][k], best_b["params"][k]) for k in best_a["params"])


def test_sigterm_writes_a_final_checkpoint_and_exits_cleanly(tmp_path):
    logdir = tmp_path / "runs"
    cmd = [
        sys.executable,
        str(ROOT / "reproduce" / "train.py"),
        "--preset=digits",
        "--estimator=sgd",
    ]
    cmd += ["--epochs=400", f"--logdir={logdir}", *QUIET, *NO_FLATNESS]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    path = run_dir(logdir, "digits", "sgd") / "checkpoint.pt"
    deadline = time.monotonic() + 300  # only keeps a broken run from hanging the suite
    while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert path.exists(), proc.communicate()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "SIGTERM" in err and "resume with --resume" in err and "Traceback" not in err
    saved = ckpt.load(path)
    assert saved["status"] == "interrupted" and not saved["finished"]
    steps = saved["position"]["global_step"]
    assert steps > 0
    args = ["--preset=digits", "--estimator=sgd", "--epochs=400", *NO_FLATNESS]
    assert main(logdir, *args, "--resume", f"--max-steps={steps + 3}") == 0
    assert summary(logdir, "digits", "sgd")["steps"] == steps + 3


def test_a_checkpoint_write_killed_midway_leaves_the_previous_one(tmp_path):
    logdir = tmp_path / "runs"
    args = ["--preset=digits", "--estimator=sgd", "--epochs=1", *NO_FLATNESS]
    assert main(logdir, *args) == 0
    path = run_dir(logdir, "digits", "sgd") / "checkpoint.pt"
    before = ckpt.load(path)
    cmd = [sys.executable, str(ROOT / "reproduce" / "train.py"), *args, "--seed=1", "--overwrite"]
    cmd += [f"--logdir={logdir}", *QUIET]
    env = {**os.environ, ckpt.TEST_PAUSE_ENV: "3000"}  # the write stays half done until the kill
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300  # only keeps a broken run from hanging the suite
    half = lambda: [t for t in path.parent.glob(".checkpoint.pt.tmp-*") if t.stat().st_size > 0]  # noqa: E731
    while not half() and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.kill()  # SIGKILL: no handler runs
    proc.communicate()
    (tmp,) = path.parent.glob(".checkpoint.pt.tmp-*")
    assert 0 < tmp.stat().st_size < path.stat().st_size  # half written
    after = ckpt.load(path)
    assert after["config"]["seed"] == 0 and after["finished"]
    assert all(torch.equal(before["params"][k], after["params"][k]) for k in before["params"])


def test_resume_refuses_another_configuration(tmp_path, capsys):
    args = ["--preset=digits", "--estimator=sgd", "--epochs=2", *NO_FLATNESS]
    assert main(tmp_path, *args, "--max-steps=3") == 0
    assert main(tmp_path, *args, "--resume", "--lr=0.01", "--weight_decay=0") == 2
    err = capsys.readouterr().err
    assert "differing fields: lr, weight_decay" in err and "Traceback" not in err


def test_an_unfinished_run_is_not_overwritten_by_accident(tmp_path, capsys):
    args = ["--preset=digits", "--estimator=sgd", "--epochs=2", *NO_FLATNESS]
    assert main(tmp_path, *args, "--max-steps=3") == 0
    assert main(tmp_path, *args) == 2
    assert "--resume to continue it or --overwrite" in capsys.readouterr().err
    assert main(tmp_path, *args, "--overwrite", "--max-steps=1") == 0


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_corrupt_checkpoint_gives_a_clear_error(tmp_path, capsys, damage):
    args = ["--preset=digits", "--estimator=sgd", "--epochs=2", *NO_FLATNESS]
    assert main(tmp_path, *args, "--max-steps=3") == 0
    path = run_dir(tmp_path, "digits", "sgd") / "checkpoint.pt"
    raw = bytearray(path.read_bytes())
    if damage == "truncate":
        raw = raw[: len(raw) // 3]
    else:
        raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(raw)
    assert main(tmp_path, *args, "--resume") == 2
    err = capsys.readouterr().err
    assert "corrupt" in err and str(path) in err and "Traceback" not in err


def test_missing_data_exits_with_the_expected_layout(tmp_path, capsys):
    missing = tmp_path / "cifar"
    assert main(tmp_path, "--preset=hp1.cifar10.resnet18", f"--data={missing}") == 2
    err = capsys.readouterr().err
    assert str(missing) in err and "cifar-10-batches-py" in err and "--download" in err


def test_bad_options_exit_2_and_help_lists_fields_and_presets(tmp_path, capsys):
    assert main(tmp_path, "--lerning_rate=3") == 2
    assert "did you mean --learning" not in capsys.readouterr().err
    assert train.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert (
        "--val_fraction" in out
        and "hp2.imagenet.vit_b32" in out
        and "noise.cifar10.resnet32.p80" in out
    )


def test_run_as_a_script_it_gives_cuda_32_hardware_queues_unless_the_environment_sets_them():
    """``CUDA_DEVICE_MAX_CONNECTIONS``, which CUDA reads when it starts, is set before torch loads:
    32 (``reproduce.run.loaders.QUEUES``) where unset, and a value already there is kept. With 32 a
    loader's streams run beside the step's kernels; CUDA's default, 8, added DALI's decoding to the
    step (benchmarks/RESULTS.md)."""
    script = (
        "import os, runpy, sys\n"
        "def run():\n"
        "    sys.argv = [sys.argv[0], '--help']\n"
        "    try:\n"
        f"        runpy.run_path({str(ROOT / 'reproduce' / 'train.py')!r}, run_name='__main__')\n"
        "    except SystemExit:\n"
        "        pass\n"
        "    return os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS')\n"
        "first = run()\n"
        "os.environ['CUDA_DEVICE_MAX_CONNECTIONS'] = '8'\n"
        "print('queues', first, run())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == f"queues {loaders.QUEUES} 8"  # the loader's threshold


def test_bf16_autocast_runs_exact_gam(tmp_path):
    args = ["--preset=digits", "--estimator=gam", "--bf16", "--max-steps=3", *NO_FLATNESS]
    assert main(tmp_path, *args) == 0
    s = summary(tmp_path, "digits", "gam")
    assert s["steps"] == 3 and s["skipped_steps"] == 0


@pytest.mark.slow
def test_compiled_step_matches_eager(tmp_path):
    """--compile on the default preset (plain gradient: the cheapest graph to compile on CPU; every
    estimator's step is compiled by the core tests)."""
    args = ["--estimator=sgd", "--max-steps=3", *NO_FLATNESS]
    assert main(tmp_path / "eager", *args) == 0
    assert main(tmp_path / "compiled", *args, "--compile") == 0
    a = ckpt.load(run_dir(tmp_path / "eager", "mnist1d", "sgd") / "checkpoint.pt")["params"]
    b = ckpt.load(run_dir(tmp_path / "compiled", "mnist1d", "sgd") / "checkpoint.pt")["params"]
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)


def test_weights_start_from_a_local_state_dict(tmp_path, capsys):
    from reproduce.models import build_model

    net = build_model("mlp", 10, 64, seed=42)
    torch.save(net.state_dict(), tmp_path / "w.pt")
    args = ["--preset=digits", "--estimator=sgd", "--lr=0", "--max-steps=1", *NO_FLATNESS]
    assert main(tmp_path / "runs", *args, f"--weights={tmp_path / 'w.pt'}") == 0
    params = ckpt.load(run_dir(tmp_path / "runs", "digits", "sgd") / "checkpoint.pt")["params"]
    assert all(torch.equal(params[k], v) for k, v in net.state_dict().items())
    torch.save(build_model("cnn1d", 10, 64).state_dict(), tmp_path / "other.pt")
    assert main(tmp_path / "runs", *args, "--overwrite", f"--weights={tmp_path / 'other.pt'}") == 2
    assert "does not fit the model" in capsys.readouterr().err


def test_bf16_hvp_reverse_takes_the_reverse_hvp_and_says_so(tmp_path, capsys):
    """--bf16_hvp=reverse: exact GAM on a convolutional net in bf16 forms its H·v by reverse-over-
    reverse AD, the same estimator as --estimator=gam_reverse, step for step."""
    args = ["--preset=noise.cifar10.resnet32.p0", "--synthetic", "--synthetic_size=4", "--bf16"]
    args += ["--batch_size=2", "--max-steps=2", *NO_FLATNESS]
    assert main(tmp_path / "gam", *args, "--estimator=gam", "--bf16_hvp=reverse") == 0
    assert "reverse-over-reverse" in capsys.readouterr().out
    assert main(tmp_path / "rev", *args, "--estimator=gam_reverse") == 0
    name = "noise.cifar10.resnet32.p0"
    a = ckpt.load(run_dir(tmp_path / "gam", name, "gam") / "checkpoint.pt")["params"]
    b = ckpt.load(run_dir(tmp_path / "rev", name, "gam_reverse") / "checkpoint.pt")["params"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_is_bit_exact_with_augmented_folder_data_and_any_worker_count(tmp_path):
    """Augmentation draws from per-example seeds, so neither the resume point nor the number of
    DataLoader workers changes a single bit. 8 images of 16 px in batches of 4: 2 steps an epoch, so
    a stop after step 1 falls mid-epoch and the resumed run crosses into the second epoch."""
    data = make_image_folder(tmp_path / "cifar", splits=("train", "test"), per_class=4, size=16)
    common = [
        "--preset=hp1.cifar10.resnet18",
        f"--data={data}",
        "--model=resnet32",
        "--image_size=16",
        "--batch_size=4",
    ]
    common += ["--epochs=2", "--augment=autoaugment", "--eval_batch_size=16", *NO_FLATNESS]
    assert main(tmp_path / "a", *common) == 0
    assert main(tmp_path / "b", *common, "--max-steps=1") == 0
    assert main(tmp_path / "b", *common, "--resume", "--workers=2") == 0
    a = ckpt.load(run_dir(tmp_path / "a", "hp1.cifar10.resnet18", "gam") / "checkpoint.pt")
    b = ckpt.load(run_dir(tmp_path / "b", "hp1.cifar10.resnet18", "gam") / "checkpoint.pt")
    assert b["position"]["global_step"] == 4
    for (ka, ta), (kb, tb) in zip(_tensors(a["params"]), _tensors(b["params"]), strict=True):
        assert ka == kb and torch.equal(ta, tb), ka
    for (ka, ta), (kb, tb) in zip(_tensors(a["state"]), _tensors(b["state"]), strict=True):
        assert ka == kb and torch.equal(ta, tb), ka
    assert a["history"] == b["history"]


# ---------------------------------------------------------------- --channels_last

CHANNELS_LAST = torch.channels_last
# ResNet-32 on 8×8 synthetic images, 16 examples in batches of 8: 2 steps an epoch.
SMALL_CONV = [
    "--preset=noise.cifar10.resnet32.p0",
    "--synthetic",
    "--synthetic_size=16",
    "--image_size=8",
    "--batch_size=8",
    "--eval_batch_size=8",
    "--lr=0.01",
    *NO_FLATNESS,
]


def _spy_inputs(monkeypatch) -> list[tuple[bool, int, bool]]:
    """Record ``(train, input rank, channels-last)`` of every loss evaluation of the runs that follow."""
    seen: list[tuple[bool, int, bool]] = []
    make = train.classification_loss

    def spy(model, *args, **kwargs):
        inner = make(model, *args, **kwargs)

        def loss_fn(params, batch, buffers, *, train: bool = True):
            x = batch[0]
            seen.append(
                (train, x.dim(), x.dim() == 4 and x.is_contiguous(memory_format=CHANNELS_LAST))
            )
            return inner(params, batch, buffers, train=train)

        return loss_fn

    monkeypatch.setattr(build.training, "classification_loss", spy)  # where setup reads it
    return seen


def _is_channels_last(t: torch.Tensor) -> bool:
    return t.is_contiguous(memory_format=CHANNELS_LAST)


@pytest.fixture
def float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


@pytest.mark.parametrize("estimator", ["gam", "gam_fd"])
def test_channels_last_trains_like_the_default_layout_and_keeps_it(
    tmp_path, monkeypatch, float64, estimator
):
    """4 steps (2 epochs) of exact and finite-difference GAM with --channels_last equal those of the
    default layout to float64 rounding, inputs of training, evaluation and the flatness metrics reach
    the loss in the channels-last layout, and the 4-d parameters and momentum buffers stay channels-last.

    Run in float64 (the default dtype while the test runs): the layout changes only the order of the
    convolutions' sums, so the runs differ by rounding, ~1e-16 relative per operation, measured at most
    ~5e-14 relative in the parameters after 4 steps (gam_fd divides a gradient difference by r = 1e-3);
    rtol 1e-10 leaves room and still fails at any float32 rounding. In float32 the same comparison is
    not tight: the ~1e5 ReLU inputs of these steps include some within float32 rounding of zero, and
    a sum taken in another order flips them, changing a gradient by up to ~1e-2 (measured); float64
    makes such a flip improbable.
    """
    flatness = ["--eig_iters=3", "--trace_samples=2", "--r1_steps=1"]  # the probe batch too
    args = [*SMALL_CONV, f"--estimator={estimator}", "--epochs=2", *flatness]
    seen = _spy_inputs(monkeypatch)
    assert main(tmp_path / "nchw", *args) == 0
    default_inputs, seen[:] = list(seen), []
    assert main(tmp_path / "nhwc", *args, "--channels_last") == 0
    name = "noise.cifar10.resnet32.p0"
    a = ckpt.load(run_dir(tmp_path / "nchw", name, estimator) / "checkpoint.pt")
    b = ckpt.load(run_dir(tmp_path / "nhwc", name, estimator) / "checkpoint.pt")

    assert {t for t, *_ in seen} == {True, False}  # training steps and evaluations
    assert all(rank == 4 and cl for _, rank, cl in seen)
    assert not any(cl for *_, cl in default_inputs)
    kernels = [k for k, p in b["params"].items() if p.dim() == 4]
    assert len(kernels) == 31 and b["params"]["conv1.weight"].dtype == torch.float64
    assert all(_is_channels_last(b["params"][k]) for k in kernels)
    assert not any(
        _is_channels_last(a["params"][k]) for k in kernels
    )  # 3×3 kernels: distinguishable
    momentum = [(k, t) for k, t in _tensors(b["state"]["opt"]) if t.dim() == 4]
    assert len(momentum) == len(kernels) and all(_is_channels_last(t) for _, t in momentum)

    assert a["position"]["global_step"] == b["position"]["global_step"] == 4
    for (ka, ta), (kb, tb) in zip(_tensors(a["params"]), _tensors(b["params"]), strict=True):
        assert ka == kb
        torch.testing.assert_close(tb, ta, rtol=1e-10, atol=1e-12, msg=ka)
    for (ka, ta), (kb, tb) in zip(_tensors(a["state"]), _tensors(b["state"]), strict=True):
        assert ka == kb
        torch.testing.assert_close(tb, ta, rtol=1e-10, atol=1e-12, msg=ka)
    for ra, rb in zip(a["history"], b["history"], strict=True):
        assert ra.keys() == rb.keys() and ra["test_acc"] == rb["test_acc"]
        for k in ("train_loss", "test_loss"):
            assert rb[k] == pytest.approx(ra[k], rel=1e-10), k
    sa, sb = (
        summary(tmp_path / "nchw", name, estimator),
        summary(tmp_path / "nhwc", name, estimator),
    )
    for k in ("train_eval_loss", "lambda_max", "trace", "r1"):
        assert sb["final"][k] == pytest.approx(sa["final"][k], rel=1e-10), k
    assert sb["config"]["channels_last"] and not sa["config"]["channels_last"]


def test_a_channels_last_checkpoint_resumes_in_either_layout_and_loads_as_weights(tmp_path):
    """float32, as trained: a channels-last checkpoint holds channels-last kernels; resumed with
    --channels_last it ends bit for bit where an uninterrupted channels-last run ends; resumed without
    it (a speed option: allowed) it continues in the default layout; --weights loads it."""
    name = "noise.cifar10.resnet32.p0"
    args = [*SMALL_CONV, "--estimator=gam_fd", "--epochs=2", "--channels_last"]
    assert main(tmp_path / "a", *args) == 0
    assert main(tmp_path / "b", *args, "--max-steps=3") == 0
    path = run_dir(tmp_path / "b", name, "gam_fd") / "checkpoint.pt"
    half = ckpt.load(path)
    kernels = [k for k, p in half["params"].items() if p.dim() == 4]
    assert half["params"]["conv1.weight"].dtype == torch.float32
    assert kernels and all(_is_channels_last(half["params"][k]) for k in kernels)
    shutil.copytree(tmp_path / "b", tmp_path / "nchw")  # the same checkpoint, resumed below without

    assert main(tmp_path / "b", *args, "--resume") == 0
    end_a = ckpt.load(run_dir(tmp_path / "a", name, "gam_fd") / "checkpoint.pt")
    end_b = ckpt.load(path)
    assert end_b["position"]["global_step"] == 4
    for (ka, ta), (kb, tb) in zip(
        _tensors(end_a["params"]), _tensors(end_b["params"]), strict=True
    ):
        assert ka == kb and torch.equal(ta, tb), ka
    for (ka, ta), (kb, tb) in zip(_tensors(end_a["state"]), _tensors(end_b["state"]), strict=True):
        assert ka == kb and torch.equal(ta, tb), ka

    plain = [a for a in args if a != "--channels_last"]
    assert main(tmp_path / "nchw", *plain, "--resume") == 0
    end_c = ckpt.load(run_dir(tmp_path / "nchw", name, "gam_fd") / "checkpoint.pt")
    assert end_c["position"]["global_step"] == 4
    assert not any(_is_channels_last(end_c["params"][k]) for k in kernels)

    weights = [*plain, "--lr=0", "--max-steps=1", f"--weights={path}"]
    assert main(tmp_path / "w", *weights) == 0
    loaded = ckpt.load(run_dir(tmp_path / "w", name, "gam_fd") / "checkpoint.pt")["params"]
    assert all(torch.equal(loaded[k], v) for k, v in end_b["params"].items())


@pytest.mark.parametrize("model", ["mlp", "cnn1d"])
def test_channels_last_leaves_vector_and_1d_models_alone(tmp_path, monkeypatch, model):
    """Inputs of rank 2 (vectors) and 3-d kernels (1-D convolutions) have no channels-last layout:
    --channels_last changes nothing, not a bit."""
    args = ["--preset=digits", f"--model={model}", "--estimator=gam_fd", "--max-steps=2"]
    seen = _spy_inputs(monkeypatch)
    assert main(tmp_path / "a", *args, *NO_FLATNESS) == 0
    assert main(tmp_path / "b", *args, *NO_FLATNESS, "--channels_last") == 0
    assert seen and all(rank == 2 and not cl for _, rank, cl in seen)
    a = ckpt.load(run_dir(tmp_path / "a", "digits", "gam_fd") / "checkpoint.pt")
    b = ckpt.load(run_dir(tmp_path / "b", "digits", "gam_fd") / "checkpoint.pt")
    for (ka, ta), (kb, tb) in zip(_tensors(a["params"]), _tensors(b["params"]), strict=True):
        assert ka == kb and torch.equal(ta, tb) and ta.stride() == tb.stride(), ka
    assert (
        summary(tmp_path / "a", "digits", "gam_fd")["final"]
        == summary(tmp_path / "b", "digits", "gam_fd")["final"]
    )


def test_bf16_exact_gam_on_a_batchnorm_net_runs_forward_over_reverse(tmp_path, capsys):
    """--bf16 exact GAM on a BatchNorm net: forward-over-reverse H·v runs (the default), and its steps
    are as near the fp32 run's as those of --bf16_hvp=reverse (on this synthetic batch bf16 moves
    both about a third of the update away). Images of 16×16: bf16 convolutions are slow on a CPU."""
    args = ["--preset=noise.cifar10.resnet32.p0", "--synthetic", "--synthetic_size=32"]
    args += ["--image_size=16", "--batch_size=16", "--max-steps=2", "--estimator=gam", *NO_FLATNESS]
    assert main(tmp_path / "exact", *args, "--bf16") == 0
    assert "reverse-over-reverse" not in capsys.readouterr().out
    assert main(tmp_path / "reverse", *args, "--bf16", "--bf16_hvp=reverse") == 0
    assert "reverse-over-reverse" in capsys.readouterr().out
    assert main(tmp_path / "fp32", *args) == 0
    assert main(tmp_path / "start", *args, "--lr=0", "--estimator=sgd") == 0  # θ₀, at SGD's cost
    p = {
        d: ckpt.load(run_dir(tmp_path / d, "noise.cifar10.resnet32.p0", e) / "checkpoint.pt")
        for d, e in (("exact", "gam"), ("reverse", "gam"), ("fp32", "gam"), ("start", "sgd"))
    }
    p = {d: c["params"] for d, c in p.items()}

    def dist(a, b):
        return sum(float((p[a][k] - p[b][k]).norm() ** 2) for k in p[a]) ** 0.5

    assert dist("exact", "fp32") < 1.25 * dist("reverse", "fp32")
    assert dist("exact", "fp32") < 0.5 * dist("fp32", "start")


def test_compiled_exact_gam_writes_the_norms_in_elementary_operations():
    """--compile with exact GAM on a BatchNorm net: the model's norms become elementary (so that the
    compiled step computes each point's gradient once), and a note says so; without --compile, or
    with the finite-difference estimator, the model keeps torch's modules."""
    from reproduce.config import resolve
    from reproduce.data import sets as D

    args = ["--preset=noise.cifar10.resnet32.p0", "--synthetic", "--synthetic_size=64"]
    args += ["--batch_size=32"]

    def built(*extra, name="gam"):
        cfg = resolve([*args, *extra])
        return build.setup(cfg, name, D.load(cfg), torch.device("cpu"))

    compiled = built("--compile")
    norms = [m for m in compiled.model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms and all(type(m).__name__ == "ElementaryBatchNorm2d" for m in norms)
    assert any("elementary operations" in n for n in compiled.notes)
    for t in (built(), built("--compile", name="gam_fd")):
        kinds = {type(m) for m in t.model.modules() if isinstance(m, torch.nn.BatchNorm2d)}
        assert {k.__name__ for k in kinds} == {"AutocastBatchNorm2d"}  # torch's, dtype-safe
        assert not any("elementary operations" in n for n in t.notes)


def test_label_smoothing_is_torchs_and_equals_the_authors_loss_in_gradient():
    """--label_smoothing is F.cross_entropy's, in training only; the .authors presets' value gives
    the gradient of the authors' smooth_crossentropy(0.1) (1 − s on the label, s/(K−1) elsewhere,
    as a KL divergence), written out here from its definition."""
    from reproduce.config import authors_smoothing
    from reproduce.models import build_model

    torch.manual_seed(0)
    model = build_model("mlp", 10, 64, seed=0)
    x, y = torch.randn(16, 64), torch.randint(0, 10, (16,))
    params = {k: v.detach() for k, v in model.named_parameters()}
    smooth = build.classification_loss(model, 0.2)
    got, _ = smooth(params, (x, y), {})
    logits = torch.func.functional_call(model, params, (x,))
    torch.testing.assert_close(got, F.cross_entropy(logits, y, label_smoothing=0.2))
    evaluated, _ = smooth(params, (x, y), {}, train=False)
    torch.testing.assert_close(evaluated, F.cross_entropy(logits, y))

    def authors(p):
        out = torch.func.functional_call(model, p, (x,))
        target = torch.full_like(out, 0.1 / 9).scatter(1, y[:, None], 0.9)
        return F.kl_div(F.log_softmax(out, 1), target, reduction="none").sum(-1).mean()

    ours = build.classification_loss(model, authors_smoothing(0.1, 10))
    g_ours = torch.func.grad(lambda p: ours(p, (x, y), {})[0])(params)
    g_theirs = torch.func.grad(authors)(params)
    for k in params:
        torch.testing.assert_close(g_ours[k], g_theirs[k], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("workers", [0, 2])
def test_an_unreadable_image_is_a_data_error_naming_it_not_a_disk_error(tmp_path, capsys, workers):
    data = make_image_folder(tmp_path / "cifar", splits=("train", "test"), per_class=4, size=32)
    (data / "train" / "bee" / "0.png").write_bytes(b"")  # a zero-byte image
    args = ["--preset=hp1.cifar10.resnet18", f"--data={data}", "--model=resnet32"]
    args += ["--batch_size=8", "--max-steps=1", "--estimator=sgd", f"--workers={workers}"]
    assert main(tmp_path / "runs", *args, *NO_FLATNESS) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: cannot read the data"), err
    assert "0.png" in err[-1] and "free space" not in err[-1]


@pytest.mark.parametrize("estimator", ["sam", "sam+gam"])
def test_sam_on_the_default_preset_trains_with_its_own_radius(tmp_path, estimator):
    """SAM's radius on MNIST-1D is its own (0.2), not GAM's 0.5, at which it stayed at chance."""
    from reproduce.config import resolve

    assert resolve([]).sam_rho == 0.2
    args = [f"--estimator={estimator}", "--epochs=3", *NO_FLATNESS]
    assert main(tmp_path, *args) == 0
    s = summary(tmp_path, "mnist1d", estimator)
    assert s["history"][-1]["train_acc"] > 0.3  # chance is 0.1


@pytest.mark.parametrize(
    ("args", "warns"),
    [
        ([], True),  # the MLP is ReLU; --fd_radius defaults to 1e-3
        (
            ["--fd_radius=0.01"],
            False,
        ),  # the smallest radius measured to train (reproduce/RESULTS.md)
        (["--model=mlp_gelu"], False),  # smooth: fd → exact
        (["--alpha=0"], False),  # no flatness term, no H·v in the update
    ],
)
def test_fd_gam_on_a_relu_net_warns_once_below_the_measured_radius(tmp_path, capsys, args, warns):
    assert main(tmp_path, "--estimator=sgd,gam_fd", "--max_steps=2", *NO_FLATNESS, *args) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(lines) == (1 if warns else 0), err
    got = summary(tmp_path, "mnist1d", "gam_fd")["warnings"]
    assert len(got) == len(lines) and summary(tmp_path, "mnist1d", "sgd")["warnings"] == []
    if warns:
        assert "--estimator=gam" in lines[0] and "--fd_radius=0.01" in lines[0]
        assert got[0] in lines[0]


def test_a_run_that_cannot_learn_is_flagged_at_chance_and_marked_in_the_table(tmp_path, capsys):
    """lr = 0 leaves the MLP at its initialisation (7.7% train accuracy on MNIST-1D, seed 0); two
    epochs at the preset's lr reach 31.7% (torch 2.14.1, CPU). Chance is 10% (10 classes), the
    flag's bound 15%."""
    base = ["--estimator=sgd", "--epochs=2", *NO_FLATNESS]
    assert main(tmp_path / "still", *base, "--lr=0") == 0
    still_out = capsys.readouterr().out
    assert main(tmp_path / "learns", *base) == 0
    learns_out = capsys.readouterr().out
    still = summary(tmp_path / "still", "mnist1d", "sgd")
    learns = summary(tmp_path / "learns", "mnist1d", "sgd")
    assert report.train_accuracy(still["final"]) <= 1.5 * 100 / 10
    assert report.train_accuracy(learns["final"]) > 1.5 * 100 / 10
    assert still["flags"] == ["chance_level"] and learns["flags"] == []
    row = next(line for line in still_out.splitlines() if line.startswith("sgd "))
    assert row.endswith("(chance)") and "did not learn" in still_out
    row = next(line for line in learns_out.splitlines() if line.startswith("sgd "))
    assert "(chance)" not in row and "did not learn" not in learns_out


def test_chance_is_one_over_the_classes_with_the_stated_margin():
    assert report.CHANCE_MARGIN == 0.5
    assert report.at_chance(15.0, 10) and not report.at_chance(15.01, 10)
    assert (
        report.at_chance(0.0, 100) and report.at_chance(1.5, 100) and not report.at_chance(1.6, 100)
    )
    assert not report.at_chance(None, 10)
    assert report.flags({"train_acc": 90.0, "train_eval_acc": 12.0}, 10) == ["chance_level"]
    assert (
        report.flags({"train_acc": 12.0}, 10) == ["chance_level"] and report.flags(None, 10) == []
    )


def test_gsam_gam_trains_the_digits_preset(tmp_path):
    """GAM around a GSAM oracle by name: the loss falls every epoch and the test accuracy ends far
    above chance (10%); 91.7% after 5 epochs on torch 2.14 CPU."""
    args = ["--preset=digits", "--estimator=gsam+gam", "--epochs=5", *NO_FLATNESS]
    assert main(tmp_path, *args) == 0
    s = summary(tmp_path, "digits", "gsam+gam")
    losses = [h["train_loss"] for h in s["history"]]
    assert s["status"] == "finished" and s["skipped_steps"] == 0
    assert all(b < a for a, b in itertools.pairwise(losses)), losses
    assert s["final"]["test_acc"] > 60.0


@pytest.mark.parametrize(
    "estimator", ["gsam", "wsam", "looksam", "friendly_sam", "look_gam", "asam", "gsam+gam"]
)
def test_each_estimator_of_the_flatness_family_trains_through_train_py(tmp_path, estimator):
    """Named in --estimator, each builds, steps (a full and a reusing step for the cycles, k = 2)
    and writes its summary with every step taken."""
    args = ["--preset=digits", f"--estimator={estimator}", "--max_steps=4", "--look_k=2"]
    assert main(tmp_path, *args, "--ascent_steps=2", *NO_FLATNESS) == 0
    s = summary(tmp_path, "digits", estimator)
    assert s["steps"] == 4 and s["skipped_steps"] == 0
    assert s["config"]["estimator"] == estimator and s["config"]["look_k"] == 2


@pytest.mark.parametrize("code", [0, 3])
@pytest.mark.parametrize("world", ["1", "2", "", "two"])
def test_a_process_of_a_job_of_several_ends_without_the_interpreters_finalisation(
    monkeypatch, world, code
):
    """A torchrun process whose run succeeded exits by ``os._exit`` (its files closed, its process
    group left); one that failed, a single process, or one whose WORLD_SIZE start() refuses, by
    ``sys.exit``."""
    from reproduce.run import launch

    calls = []
    monkeypatch.setenv("WORLD_SIZE", world)
    monkeypatch.setattr(launch.os, "_exit", lambda c: calls.append(("os._exit", c)))
    monkeypatch.setattr(launch.sys, "exit", lambda c: calls.append(("sys.exit", c)))
    launch.exit_process(code)
    assert calls[0] == ("os._exit" if world == "2" and code == 0 else "sys.exit", code)


def test_the_authors_released_forms_train_from_their_flags(tmp_path):
    """WSAM decoupled and clipped, GSAM adaptive and ASAM on the weights, a few steps each; the
    saved configuration holds the flags."""
    args = ["--estimator=wsam,gsam,asam", "--wsam_decouple", "--wsam_max_norm=1", "--gsam_adaptive"]
    assert main(tmp_path, *args, "--asam_mask=weights", "--max_steps=5", *NO_FLATNESS) == 0
    for name in ("wsam", "gsam", "asam"):
        cfg = json.loads((run_dir(tmp_path, "mnist1d", name) / "config.json").read_text())
        assert (cfg["wsam_decouple"], cfg["wsam_max_norm"]) == (True, 1.0)
        assert (cfg["gsam_adaptive"], cfg["asam_mask"]) == (True, "weights")
        assert summary(tmp_path, "mnist1d", name)["steps"] == 5
