"""Running ``reproduce/train.py`` in the tests: its quiet flags, the digits preset without flatness
metrics, a run's folder, and the one-line error a refused run prints."""

from __future__ import annotations

from pathlib import Path

from reproduce import train

QUIET = ["--progress=false", "--landscape=false"]
NO_FLATNESS = ["--eig_iters=0", "--trace_samples=0", "--r1_steps=0"]
DIGITS = ["--preset=digits", "--estimator=sgd", *NO_FLATNESS]


def main(logdir: Path, *args: str) -> int:
    """``train.py`` with its logs under ``logdir``, quiet; its exit status."""
    return train.main([f"--logdir={logdir}", *QUIET, *args])


def out_dir(logdir: Path, estimator: str = "sgd") -> Path:
    """The folder of a digits run of ``estimator`` under ``logdir``."""
    return logdir / "digits" / estimator


def one_line_error(capsys) -> str:
    """What the run wrote to stderr, checked to be one line without a traceback."""
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err
