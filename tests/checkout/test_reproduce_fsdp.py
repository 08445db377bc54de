"""reproduce/train.py --fsdp: under torchrun on 2 CPU processes (gloo) the model is sharded, fd GAM
trains through the facade, each rank's bytes are printed, a sharded checkpoint resumes bit for bit,
and the trajectory is that of train.py in one process; what --fsdp cannot run is refused in one
line, exit 2."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from test_reproduce_torchrun import finish, standalone, torchrun

from reproduce import train
from reproduce.run import checkpoint as ckpt

ARGS = ["--preset=digits", "--estimator=gam_fd", "--progress=false", "--landscape=false"]
ARGS += ["--eig_iters=0", "--trace_samples=0", "--r1_steps=0", "--threads=1"]


@pytest.mark.parametrize(
    ("flags", "names"),
    [
        (["--estimator=gam"], "--estimator=gam_fd"),
        (["--estimator=sgd,sam+gam"], "--estimator=sam or --estimator=gam_fd"),
        (["--estimator=gnp", "--gnp_hvp=exact"], "--gnp_hvp=fd"),
        (["--compile"], "--compile"),
        (["--mode=graph"], "--cuda_graph"),
        (["--bf16"], "--bf16"),
        (["--channels_last"], "--channels_last"),
        (["--perturbation=local"], "--perturbation=local"),
    ],
)
def test_what_fsdp_cannot_run_is_refused(flags, names, tmp_path, capsys):
    assert train.main([*ARGS, "--fsdp", *flags, f"--logdir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--fsdp" in err and names in err, err
    assert not any(tmp_path.iterdir())


def sharded(folder: Path) -> dict[str, torch.Tensor]:
    """The model's tensors of a sharded checkpoint, gathered in this process."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = folder.with_name("gathered.pt")
    dcp_to_torch_save(folder, out)
    return torch.load(out, weights_only=False)["model"]


@pytest.mark.slow
def test_fsdp_trains_as_one_process_and_resumes_bit_for_bit(tmp_path):
    """2 ranks × 50 examples, 20 steps of fd GAM: one run whole, one stopped after 8 steps and
    resumed. The sharded run ends where train.py in one process does on the batches of 100, to the
    tolerance of the data-parallel test (float32, the mean over ranks summed in another order: 20
    steps differed by at most 1.5e-7 when measured); the resumed run ends bit for bit where the
    whole one does."""
    cut, whole = tmp_path / "cut", tmp_path / "whole"
    jobs = [
        torchrun(
            *ARGS,
            "--fsdp",
            "--max_steps=20",
            f"--logdir={whole}",
            launcher=standalone(2),
            wait=False,
        ),
        torchrun(
            *ARGS, "--fsdp", "--max_steps=8", f"--logdir={cut}", launcher=standalone(2), wait=False
        ),
    ]
    done = [finish(j) for j in jobs]
    for job in done:
        assert job.returncode == 0, job.stdout + job.stderr
    out = done[1].stdout
    assert "in 3 units and the root over 2 process(es)" in out
    for rank in (0, 1):  # the MLP's 17,610 float32 parameters, half on each rank
        line = f"rank {rank} of 2: parameters 35,220 B, gradients 35,220 B, optimiser state 35,2"
        assert line in out, out
    assert (cut / "digits/gam_fd/checkpoint").is_dir()
    rest = torchrun(
        *ARGS, "--fsdp", "--max_steps=20", "--resume", f"--logdir={cut}", launcher=standalone(2)
    )
    assert rest.returncode == 0, rest.stdout + rest.stderr
    assert "resumed from" in rest.stdout and "at step 8" in rest.stdout
    a, b = sharded(cut / "digits/gam_fd/checkpoint"), sharded(whole / "digits/gam_fd/checkpoint")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    assert train.main([*ARGS, "--max_steps=20", f"--logdir={tmp_path / 'one'}"]) == 0
    one = ckpt.load(tmp_path / "one/digits/gam_fd/checkpoint.pt")["params"]
    assert one.keys() == b.keys()
    assert any(not torch.equal(one[k], b[k]) for k in one)
    for k in one:
        torch.testing.assert_close(b[k], one[k], rtol=1e-5, atol=1e-6)
