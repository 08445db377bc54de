"""The training loop, `train_epochs`, and the epochs of a run of train.py on it (`train`).

`train_epochs` is the one loop over epochs and batches in reproduce: a run of train.py, the
members of a vmapped sweep (`reproduce.sweeps.vmapped.train`) and the evidence commands
(`reproduce.evidence.common.train`) each drive it with their step and callbacks.

In a run, the steps run from the epoch's position (within it, for a resumed run) and stop early
at ``--max_steps``, ``--total_steps``, a signal or ``--max_skipped`` skipped steps in a row; a
checkpoint is written every ``checkpoint_every`` steps. The close takes the epoch's record, keeps
the best validation epoch (``best.pt``), moves the position to the next epoch and writes a
checkpoint (the last epoch's is written by `reproduce.run.summary.end_of_run`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from gamfunc.training.state import as_dict as plain
from reproduce.config import as_dict
from reproduce.data import sets as data_mod
from reproduce.run import checkpoint as ckpt
from reproduce.run import report
from reproduce.run.context import Parts, Progress, Run, Session, accumulate, zero_accum
from reproduce.run.evaluation import inputs, to
from reproduce.run.launch import wait_for
from reproduce.run.records import end_of_epoch
from reproduce.run.resume import write_checkpoint
from reproduce.run.signals import Interrupted, until_stopped
from reproduce.run.summary import Diverged, summary

__all__ = ["END", "epoch_batches", "train", "train_epochs"]

END = "end"  # what after_step returns to end an epoch's steps early and close the epoch


def train_epochs(
    step: Callable[[Any], dict],
    batches: Callable[[int, int], Iterable],
    pos: dict[str, Any],
    epochs: int,
    after_step: Callable[[dict, Any], str | None],
    end: Callable[[str | None], str | None],
    settle: Callable[[], None] = lambda: None,
) -> str | None:
    """Train epoch after epoch from ``pos`` until ``pos["epoch"]`` reaches ``epochs``.

    Each epoch runs ``step`` on its batches from ``pos["batch"]`` on, calling ``after_step`` after
    each step and ``end`` after the epoch's steps. The wall time of the steps, their batches and
    ``after_step`` is added to ``pos["train_seconds"]`` step by step (so a checkpoint written by
    ``after_step`` holds it up to that step), and ``settle``'s before ``end``: the steps a device
    still has queued when the host has issued the epoch's last one are the epoch's training, not
    ``end``'s; ``end``'s time is not added.

    Args:
        step: one step on a batch (it keeps the parameters and state); its metrics.
        batches: ``batches(epoch, first)``: the epoch's batches from batch ``first`` on.
        pos: where training stands, updated in place: ``epoch``, ``batch`` (the next batch of the
            epoch: counted here after each step) and ``train_seconds``.
        epochs: the number of epochs to train.
        after_step: ``after_step(metrics, batch)`` after each step: None goes on; `END` ends
            the epoch's steps there (the epoch is then closed as if its batches had run out); any
            other word stops training with the epoch left open.
        end: ``end(stopped)`` after an epoch's steps, with the word that stopped them (None when
            the epoch's steps are done). It closes a done epoch, moving ``pos`` to the next epoch,
            and returns the word that stops training, or None.
        settle: waits for the work queued on the device (`launch.wait_for`), called after
            an epoch's steps; nothing by default (a device that runs as the host issues).

    Returns:
        The word that stopped training, or None when ``epochs`` were trained.

    Raises:
        RuntimeError: ``end`` closed an epoch without moving ``pos`` to the next.
    """
    while pos["epoch"] < epochs:
        epoch = pos["epoch"]
        stopped = None
        clock = time.perf_counter()
        for batch in batches(epoch, pos["batch"]):
            metrics = step(batch)
            pos["batch"] += 1
            clock = _count(pos, clock)
            stopped = after_step(metrics, batch)
            clock = _count(pos, clock)
            if stopped is not None:
                break
        settle()
        _count(pos, clock)
        stopped = end(None if stopped == END else stopped)
        if stopped is not None:
            return stopped
        if pos["epoch"] == epoch:
            raise RuntimeError(f"end() closed epoch {epoch} without moving to the next")
    return None


def _count(pos: dict[str, Any], since: float) -> float:
    """Add the time since ``since`` to ``pos["train_seconds"]``; now."""
    now = time.perf_counter()
    pos["train_seconds"] += now - since
    return now


def epoch_batches(examples, seed: int, batch_size: int) -> Callable[[int, int], Iterable]:
    """``batches(epoch, first)`` for `train_epochs`: the batches of ``examples`` in the order
    of ``seed`` and the epoch, from batch ``first`` on, in one process (train.py's order)."""

    def batches(epoch: int, first: int):
        order = data_mod.epoch_order(len(examples), seed, epoch)
        return data_mod.train_batches(examples, order, first, batch_size, seed=seed, epoch=epoch)

    return batches


def train(r: Run, parts: Parts, p: Progress, s: Session) -> str | None:
    """Train the run's epochs from ``p.pos``, closing each; ``"max_steps"`` when ``--max_steps``
    stopped the run within an epoch (that epoch left open), else None.

    Raises:
        Interrupted: a signal arrived; a checkpoint was written first.
        Diverged: ``--max_skipped`` steps in a row were skipped; a checkpoint was written first.
    """
    cfg, stop, procs, data, pos = r.cfg, r.stop, r.procs, parts.data, p.pos
    device, world, steps_per_epoch = procs.device, procs.world, parts.steps_per_epoch
    bars = []

    def batches(epoch: int, first: int):
        if p.order is None:
            order = data_mod.epoch_order(len(data.train), cfg.seed, epoch)
            p.order = order[: steps_per_epoch * cfg.batch_size]
        bars.append(
            report.progress(
                total=steps_per_epoch,
                initial=first,
                leave=False,
                enabled=cfg.progress and procs.main and steps_per_epoch > 20,
            )
        )
        s.meter.mark()
        loaded = data_mod.train_batches(
            data.train,
            p.order.to(data.train.indices.device),
            first,
            cfg.batch_size,
            seed=cfg.seed,
            epoch=epoch,
            rank=procs.rank,
            world=world,
            loader=parts.train_loader,
        )
        return until_stopped(loaded, stop)

    def step(batch) -> dict:
        x, y = batch
        x, y = inputs(x, device, cfg.channels_last), y.to(device, non_blocking=True)
        s.profiler.before(pos["global_step"])
        metrics = _step(r, parts, p, s, (x, y))
        if s.profiler.after():
            s.meter.mark()  # the profiled steps are not timed
        return metrics

    def after_step(metrics: dict, batch) -> str | None:
        n = len(batch[1])
        # the step's period: --every, or the one a reusing estimator (looksam, look_gam) brings
        accumulate(p.accum, metrics, p.state, n, pos["global_step"] % parts.step.every == 0)
        s.last_loss = metrics["loss"]
        if "skipped" in metrics:
            s.run_of_skips = torch.where(metrics["skipped"] != 0, s.run_of_skips + 1, 0)
        pos["global_step"] += 1
        s.meter.count(n * world)
        bars[-1].update()
        sync = pos["global_step"] % cfg.log_every == 0
        if sync:
            _log(r, parts, p, s, metrics)
        stopped = "max_steps" if cfg.max_steps and pos["global_step"] >= cfg.max_steps else None
        if cfg.total_steps and pos["global_step"] >= cfg.total_steps:
            return stopped or END  # the last epoch ends here
        signalled = stop.signum if world == 1 else (stop.agreed(procs) if sync else None)
        if stopped or signalled is not None:
            return stopped or "signal"
        if cfg.checkpoint_every and pos["global_step"] % cfg.checkpoint_every == 0:
            began = time.perf_counter()
            write_checkpoint(r, p)
            pos["train_seconds"] -= time.perf_counter() - began  # writing is not training
            s.meter.mark()
        return None

    def end(stopped: str | None) -> str | None:
        bars[-1].close()
        s.profiler.close()  # a profile that the run's end cut short
        if stop.signum is not None:
            write_checkpoint(r, p, status="interrupted")
            stop.check()
        if stopped:
            return stopped
        _close(r, parts, p, s, pos["epoch"])
        return None

    return train_epochs(step, batches, pos, cfg.epochs, after_step, end, lambda: wait_for(device))


def _step(r: Run, parts: Parts, p: Progress, s: Session, batch) -> dict:
    """One step on ``batch``, its metrics. This process's first step compiles (with ``compile``:
    said, and its time kept) and a signal stops it at once, nothing being saved before it. After a
    cycle of ``every`` steps and one more (each branch of the cycle run, a graph made again at the
    second call kept too), what was compiled is saved to the compile cache
    (`reproduce.run.compile_cache`); a branch that first runs later (``late``'s flat steps) is
    saved at the run's end (`CompileCache.save_at_end`)."""
    s.steps_taken += 1
    if not s.first_step:
        p.params, p.state, metrics = parts.step(p.params, p.state, batch)
        cache = s.compile_cache
        if cache is not None and not cache.done and s.steps_taken > parts.step.every:
            cache.save()
        return metrics
    cfg, device = r.cfg, r.procs.device
    compiling = " and its compilation" if cfg.compile else ""
    with r.stop.during(f"start-up (the first step{compiling})", at_once=True):
        if cfg.compile:  # said within the phase: a signal from here on stops the run at once
            r.say(f"[{r.name}] compiling the step (first call)...")
            began = time.perf_counter()
        try:
            p.params, p.state, metrics = parts.step(p.params, p.state, batch)
        except Exception as e:  # a damaged compile cache: set it aside, compile afresh, once
            if s.compile_cache is None or not s.compile_cache.damaged_by(e):
                raise
            s.compile_cache.set_aside(e)
            p.params, p.state, metrics = parts.step(p.params, p.state, batch)
    if cfg.compile:
        wait_for(device)
        s.compile_seconds = round(time.perf_counter() - began, 1)
        r.say(f"[{r.name}] compiled and ran the first step in {s.compile_seconds} s")
    s.first_step = False
    return metrics


def _log(r: Run, parts: Parts, p: Progress, s: Session, metrics: dict) -> None:
    """A logging step: its scalars to TensorBoard; `Diverged` (after a checkpoint of the last
    finite parameters) when the last ``--max_skipped`` steps were all skipped."""
    from reproduce.run import tensorboard as tblog

    cfg, step = r.cfg, p.pos["global_step"]
    rate = s.meter.lap()
    report.log_step(tblog, parts.writer, metrics, p.state, step, rate)
    if cfg.max_skipped and int(s.run_of_skips) >= cfg.max_skipped:
        write_checkpoint(r, p, status="diverged")
        why = (
            f"stopped at step {step}: the last {int(s.run_of_skips)} "
            f"steps were all skipped (non-finite loss or update; "
            f"--max_skipped={cfg.max_skipped}); lower --lr or check the data. "
            f"The checkpoint holds the last finite parameters."
        )
        raise Diverged(f"[{r.name}] {why}", summary(r, parts, p, s, "diverged", why=why, code=3))


def _close(r: Run, parts: Parts, p: Progress, s: Session, epoch: int) -> None:
    """The epoch's steps are done: its record, the best validation epoch, the next epoch's position
    and, unless it was the last epoch, a checkpoint (and there a signal stops the run)."""
    cfg, stop, procs = r.cfg, r.stop, r.procs
    # If a signal stops what follows, the checkpoint says so (batch == steps_per_epoch) and a
    # resumed run redoes the end-of-epoch work.
    try:
        record = end_of_epoch(r, parts, p, epoch)
    except Interrupted:
        write_checkpoint(r, p, status="interrupted")
        raise
    p.history.append(record)
    if parts.data.val is not None and (p.best is None or record["val_acc"] > p.best["val_acc"]):
        p.best = {
            "val_acc": record["val_acc"],
            "epoch": epoch + 1,
            "test_acc": record.get("test_acc"),
        }
        if procs.main:
            ckpt.save(
                r.run_dir / "best.pt",
                {
                    "config": as_dict(cfg),
                    "params": to(p.params, "cpu"),
                    "state": plain(to(p.state, "cpu")),
                    "best": p.best,
                },
            )
    p.pos.update(epoch=epoch + 1, batch=0)
    p.accum, p.order = zero_accum(procs.device), None
    s.epochs_bar.update()
    s.epochs_bar.set_postfix(test_acc=record.get("test_acc"), loss=record["train_loss"])
    line = report.epoch_line(r.name, cfg, record)
    if line:
        r.say(line)
    if p.pos["epoch"] < cfg.epochs:  # the last epoch's checkpoint is written by end_of_run
        write_checkpoint(r, p)
        if (stop.signum if procs.world == 1 else stop.agreed(procs)) is not None:
            write_checkpoint(r, p, status="interrupted")
            stop.check()
