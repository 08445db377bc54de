"""`reproduce.run.epoch.train_epochs`'s ``train_seconds``: the steps' time, with the device's
queued work (``settle``) and without the epoch's close (``end``)."""

from __future__ import annotations

import time

from reproduce.run.epoch import train_epochs


def test_the_work_a_device_still_has_queued_counts_as_training_and_the_close_does_not():
    pos = {"epoch": 0, "batch": 0, "train_seconds": 0.0}
    waits = []

    def settle():  # a device that finishes the epoch's queued steps 0.05 s after the host
        waits.append(pos["batch"])
        time.sleep(0.05)

    def end(stopped):
        time.sleep(0.2)  # evaluation: not training
        pos.update(epoch=pos["epoch"] + 1, batch=0)

    batches = lambda epoch, first: range(first, 3)  # noqa: E731
    assert train_epochs(lambda b: {}, batches, pos, 2, lambda m, b: None, end, settle) is None
    assert waits == [3, 3]  # once an epoch, after its last step and before its close
    assert 0.1 <= pos["train_seconds"] < 0.2


def test_without_settle_an_epoch_counts_the_host_alone():
    pos = {"epoch": 0, "batch": 0, "train_seconds": 0.0}

    def end(stopped):
        time.sleep(0.1)
        pos.update(epoch=pos["epoch"] + 1, batch=0)

    train_epochs(lambda b: {}, lambda e, f: range(f, 2), pos, 1, lambda m, b: None, end)
    assert pos["train_seconds"] < 0.05
