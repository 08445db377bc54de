"""One epoch of training: its steps, with logging and the guards that stop a run, then its close.

The steps run from the epoch's position (within it, for a resumed run) and stop early at
``--max_steps``, ``--total_steps``, a signal or ``--max_skipped`` skipped steps in a row; a
checkpoint is written every ``checkpoint_every`` steps. The close takes the epoch's record, keeps
the best validation epoch (``best.pt``), moves the position to the next epoch and writes a
checkpoint (the last epoch's is written by :func:`reproduce.run.summary.end_of_run`).
"""

from __future__ import annotations

import time

import torch

from gamfunc.state import as_dict as plain
from reproduce.config import as_dict
from reproduce.data import sets as data_mod
from reproduce.run import checkpoint as ckpt
from reproduce.run import report
from reproduce.run.context import Parts, Progress, Run, Session, accumulate, zero_accum
from reproduce.run.evaluation import inputs, to
from reproduce.run.records import end_of_epoch
from reproduce.run.resume import write_checkpoint
from reproduce.run.signals import Interrupted, until_stopped
from reproduce.run.summary import Diverged, summary

__all__ = ["epoch"]


def epoch(r: Run, parts: Parts, p: Progress, s: Session) -> str | None:
    """Train the epoch at ``p.pos`` and close it; ``"max_steps"`` when ``--max_steps`` stopped the
    run within it (the epoch left open), else None.

    Raises:
        Interrupted: a signal arrived; a checkpoint was written first.
        Diverged: ``--max_skipped`` steps in a row were skipped; a checkpoint was written first.
    """
    number = p.pos["epoch"]
    stopped = _steps(r, parts, p, s)
    if r.stop.signum is not None:
        write_checkpoint(r, p, status="interrupted")
        r.stop.check()
    if stopped:
        return stopped
    _close(r, parts, p, s, number)
    return None


def _steps(r: Run, parts: Parts, p: Progress, s: Session) -> str | None:
    """The epoch's steps from ``p.pos["batch"]``, their time added to ``train_seconds``;
    ``"max_steps"`` when ``--max_steps`` was reached."""
    cfg, stop, procs, data, pos = r.cfg, r.stop, r.procs, parts.data, p.pos
    device, world, steps_per_epoch = procs.device, procs.world, parts.steps_per_epoch
    if p.order is None:
        order = data_mod.epoch_order(len(data.train), cfg.seed, pos["epoch"])
        p.order = order[: steps_per_epoch * cfg.batch_size]
    batches = data_mod.train_batches(
        data.train,
        p.order.to(data.train.indices.device),
        pos["batch"],
        cfg.batch_size,
        seed=cfg.seed,
        epoch=pos["epoch"],
        rank=procs.rank,
        world=world,
        loader=parts.train_loader,
    )
    bar = report.progress(
        total=steps_per_epoch,
        initial=pos["batch"],
        leave=False,
        enabled=cfg.progress and procs.main and steps_per_epoch > 20,
    )
    stopped = None
    clock = time.perf_counter()
    s.meter.mark()
    for x, y in until_stopped(batches, stop):
        x, y = inputs(x, device, cfg.channels_last), y.to(device, non_blocking=True)
        s.profiler.before(pos["global_step"])
        metrics = _step(r, parts, p, s, (x, y))
        if s.profiler.after():
            s.meter.mark()  # the profiled steps are not timed
        accumulate(p.accum, metrics, p.state, len(y))
        s.last_loss = metrics["loss"]
        if "skipped" in metrics:
            s.run_of_skips = torch.where(metrics["skipped"] != 0, s.run_of_skips + 1, 0)
        pos["batch"] += 1
        pos["global_step"] += 1
        s.meter.count(len(y) * world)
        bar.update()
        sync = pos["global_step"] % cfg.log_every == 0
        if sync:
            _log(r, parts, p, s, metrics)
        if cfg.max_steps and pos["global_step"] >= cfg.max_steps:
            stopped = "max_steps"
        if cfg.total_steps and pos["global_step"] >= cfg.total_steps:
            break  # the last epoch ends here
        signalled = stop.signum if world == 1 else (stop.agreed(procs) if sync else None)
        if stopped or signalled is not None:
            break
        if cfg.checkpoint_every and pos["global_step"] % cfg.checkpoint_every == 0:
            pos["train_seconds"] += time.perf_counter() - clock
            write_checkpoint(r, p)
            clock = time.perf_counter()
            s.meter.mark()
    bar.close()
    s.profiler.close()  # a profile that the run's end cut short
    pos["train_seconds"] += time.perf_counter() - clock
    return stopped


def _step(r: Run, parts: Parts, p: Progress, s: Session, batch) -> dict:
    """One step on ``batch``, its metrics. This process's first step compiles (with ``compile``:
    said, and its time kept) and a signal stops it at once, nothing being saved before it."""
    if not s.first_step:
        p.params, p.state, metrics = parts.step(p.params, p.state, batch)
        return metrics
    cfg, device = r.cfg, r.procs.device
    if cfg.compile:
        r.say(f"[{r.name}] compiling the step (first call)...")
        began = time.perf_counter()
    compiling = " and its compilation" if cfg.compile else ""
    with r.stop.during(f"start-up (the first step{compiling})", at_once=True):
        p.params, p.state, metrics = parts.step(p.params, p.state, batch)
    if cfg.compile:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        s.compile_seconds = round(time.perf_counter() - began, 1)
        r.say(f"[{r.name}] compiled and ran the first step in {s.compile_seconds} s")
    s.first_step = False
    return metrics


def _log(r: Run, parts: Parts, p: Progress, s: Session, metrics: dict) -> None:
    """A logging step: its scalars to TensorBoard; :class:`Diverged` (after a checkpoint of the last
    finite parameters) when the last ``--max_skipped`` steps were all skipped."""
    import gamfunc.logging as tblog

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
