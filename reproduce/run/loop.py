"""The training loop of one estimator: start-up, then epoch after epoch, then the end of the run.

`run` trains one estimator of a `Config` on this process's part of every
global batch. With several processes (``torchrun``) every rank runs this same loop on its own shard;
the step all-reduces what its perturbation mode says ([`gamfunc.distributed`][gamfunc.wrappers.distributed]), the epoch's sums and
the evaluations are added over ranks, and rank 0 alone writes TensorBoard, checkpoints and the
summary. Its parts, each in a module of `reproduce.run`: the decision to resume, start afresh
or reuse a finished run, and the checkpoints (`resume`); the epochs
(`epoch`, whose loop every training in reproduce drives); the epoch's record and the end-of-run metrics
(`records`); the end of the run and its summary (`summary`);
SIGINT and SIGTERM (`signals`). They share what `context`
holds, passed explicitly.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch

import gamfunc
from reproduce.build import fd_gam_warning, setup, with_step_mode
from reproduce.config import Config, as_dict, estimators_of, run_name
from reproduce.data import sets as data_mod
from reproduce.models import count_parameters
from reproduce.run import checkpoint as ckpt
from reproduce.run import compile_cache, report
from reproduce.run.context import Parts, Progress, Run, Session
from reproduce.run.epoch import train
from reproduce.run.launch import Processes
from reproduce.run.loaders import loaders
from reproduce.run.profiling import StepProfiler
from reproduce.run.resume import RunLocked, clear, decide, like, release, resume
from reproduce.run.signals import Interrupted, StopFlag
from reproduce.run.summary import Diverged, end_of_run, summary

__all__ = ["Diverged", "Interrupted", "RunLocked", "StopFlag", "like", "run"]


def with_total_steps(cfg: Config, n_train: int) -> Config:
    """``cfg`` with ``total_steps`` turned into epochs: enough to hold them, the last one cut short."""
    if not cfg.total_steps:
        return cfg
    per_epoch = max(n_train // cfg.batch_size, 1)
    return dataclasses.replace(cfg, epochs=-(-cfg.total_steps // per_epoch))


def run(
    cfg: Config,
    stop: StopFlag,
    data: data_mod.Data | None = None,
    run_dir: Path | None = None,
    procs: Processes | None = None,
) -> dict:
    """Train one estimator (``cfg.estimator`` names exactly one) and return its summary.

    Raises:
        Interrupted: SIGINT/SIGTERM arrived (through ``stop``); a checkpoint was written first.
        CheckpointError, DataError, SetupError: the run cannot start as configured.
    """

    from reproduce.run.launch import start

    with stop.during("start-up", at_once=True):  # until the first step is taken
        procs = procs or start(cfg.device)
        (name,) = estimators_of(cfg)
        run_dir = run_dir or Path(cfg.logdir).expanduser() / run_name(cfg) / name
        data = data or data_mod.load(cfg)
        cfg = with_step_mode(with_total_steps(cfg, len(data.train)), procs.device.type)
        r = Run(cfg, name, stop, procs, run_dir)
        kind, saved, lock = decide(r)
        fresh = kind == "fresh"

        def kept() -> str:  # what a stop now leaves; a fresh run's outputs without a checkpoint go
            if fresh and r.saved_step is None and procs.main:
                clear(run_dir)
            return r.kept()

        outer, stop.kept = stop.kept, kept
        try:
            if kind in ("error", "locked"):
                raise (RunLocked if kind == "locked" else ckpt.CheckpointError)(saved)
            if kind == "finished":
                r.say(f"[{name}] already finished; summary from {run_dir}")
                return saved
            return _train(r, data, saved if kind == "resume" else None)
        except Interrupted as e:
            e.kept = kept()
            raise
        finally:
            stop.kept = outer
            if lock is not None:
                release(lock)


def _train(r: Run, data, saved: dict | None) -> dict:
    """Train from ``saved`` (a checkpoint body; None: afresh) to the end of the run; its summary."""
    parts, p, s = _start(r, data, saved)
    try:
        try:
            r.stop.now("training")
            stopped = train(r, parts, p, s)
            if s.compile_cache is not None:  # a branch first run late, or fewer steps than a cycle
                s.compile_cache.save_at_end()
            status, final = end_of_run(r, parts, p, s, stopped)
            # the metrics' last part (the figure and its file, the scalars) checks no flag: a
            # signal there, acknowledged, stops the run here, before a summary says "finished"
            # (rank 0's metrics check its flag alone, as here)
            if r.procs.main:
                r.stop.check()
        except RuntimeError as error:
            # the checkpoint a stop writes is a collective too: the last one written is what is kept
            interrupted = r.stop.left_collective(r.procs.world)
            if interrupted is None:
                raise
            raise interrupted from error
    except Interrupted as e:
        e.kept = r.kept()
        if r.saved_step is not None:  # the summary of what is kept, with the reason and status
            summary(r, parts, p, s, "interrupted", why=f"{e}; {e.kept}", code=e.code)
        raise
    finally:
        s.epochs_bar.close()
        parts.writer.close()
        if r.cfg.cuda_graph:  # before the process group goes: NCCL cannot destroy a graph's comm
            gamfunc.cuda_graphs.release(parts.step)
        if s.compile_cache is not None:
            s.compile_cache.close()
    return summary(r, parts, p, s, status, final=final)


def _start(r: Run, data, saved: dict | None) -> tuple[Parts, Progress, Session]:
    """What training needs before its first step: the model and step, the data and its loader, the
    flatness metrics' examples, the progress to start from (`resume`),
    the TensorBoard writer and the session's meters."""
    from reproduce.run import tensorboard as tblog

    cfg, name, procs = r.cfg, r.name, r.procs
    device = procs.device
    data = data_mod.to_device(data or data_mod.load(cfg), device)
    weights = ckpt.state_dict(cfg.weights) if cfg.weights else None
    t = setup(cfg, name, data, procs, weights)
    train_loader, eval_batches, loader_name = loaders(
        cfg, data, procs, say=lambda line: r.say(f"[{name}] {line}")
    )
    r.say(f"[{name}] data: {loader_name}; {procs.world} process(es), global batch {cfg.batch_size}")
    for note in t.notes:
        r.say(f"[{name}] {note}")
    # settings this run is known to train badly with: one line on stderr, and in the summary
    warnings = [w for w in (fd_gam_warning(cfg, name),) if w]
    for w in warnings:
        if procs.main:
            print(f"warning: [{name}] {w}", file=sys.stderr, flush=True)

    probe_idx = torch.randperm(len(data.probe), generator=data_mod.generator(cfg.seed, 6))
    probe = data_mod.stack(data.probe, probe_idx[: cfg.flatness_samples]) if procs.main else None
    p = resume(r, saved, t.params, t.state, t.steps_per_epoch, len(data.train))

    if procs.main:
        # Points after the checkpoint's step were written by the run that stopped and are written
        # again; those at its step were written before the checkpoint and are not.
        purge = p.pos["global_step"] + 1 if saved else None
        writer = report.open_writer(r.run_dir, purge_step=purge)
    else:
        writer = report.NullWriter()
    if saved is None:
        tblog.config(writer, as_dict(cfg))
        tblog.text(
            writer, "model", f"{cfg.model}: {count_parameters(t.model):,} parameters on {device}"
        )
    parts = Parts(
        t.model,
        t.loss_fn,
        t.step,
        t.steps_per_epoch,
        data,
        train_loader,
        eval_batches,
        loader_name,
        probe,
        warnings,
        writer,
    )
    meter = report.Meter(device, p.pos)
    epochs_bar = report.progress(
        total=cfg.epochs,
        initial=p.pos["epoch"],
        desc=name,
        enabled=cfg.progress and procs.main,
        unit="ep",
    )
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    run_of_skips = torch.zeros((), dtype=torch.int64, device=device)
    path = r.run_dir / "profile.txt" if procs.main else None
    profiler = StepProfiler(cfg.profile_steps, cfg.log_every, device, path)
    session = Session(meter, epochs_bar, run_of_skips, profiler)
    where = compile_cache.folder(cfg.compile_cache, cfg.logdir) if cfg.compile else None
    if where is not None:  # last, so that nothing after it can fail with inductor pointed there
        say = lambda line: r.say(f"[{name}] {line}")  # noqa: E731
        session.compile_cache = compile_cache.CompileCache(where, device, procs.local_rank, say)
        session.compile_cache.open().load()
    return parts, p, session
