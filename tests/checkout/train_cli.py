"""Running ``reproduce/train.py`` in the tests: its quiet flags, the digits preset without flatness
metrics, a run's folder, the one-line error a refused run prints, and the digits preset's test
labels made wrong. A helper of the checkout tests (tests/checkout/)."""

from __future__ import annotations

from pathlib import Path

import torch

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


def poison_digits_test_labels(monkeypatch) -> None:
    """Make the digits preset's test labels all wrong (never the true class), its training set as it
    is: a selection on the validation split must not notice."""
    from reproduce.data import sets as data_mod

    real = data_mod._digits.__wrapped__  # the lru_cache of the clean data stays as it is

    def poisoned():
        train_set, test_set = real()
        wrong = (test_set.y + 1 + torch.arange(len(test_set.y)) % 9) % 10
        return train_set, data_mod.TensorData(test_set.x, wrong)

    monkeypatch.setattr(data_mod, "_digits", poisoned)
