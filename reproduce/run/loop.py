"""The training loop of one estimator: epochs of steps, evaluation, checkpoints, resumption, signals.

:func:`run` trains one estimator of a :class:`~reproduce.config.Config` on this process's part of every
global batch. With several processes (``torchrun``) every rank runs this same loop on its own shard;
the step all-reduces what its perturbation mode says (:mod:`gamfunc.distributed`), the epoch's sums and
the evaluations are added over ranks, and rank 0 alone writes TensorBoard, checkpoints and the
summary. Checkpoints hold everything a resumed run needs to continue bit for bit: parameters, step
state, the epoch's order and position, the epoch's sums and the RNG state. Rank 0 reads a checkpoint
and hands it to the other ranks, so the nodes of a job need no shared disk.

SIGINT and SIGTERM stop a run in any phase, after it writes what it can keep
(:mod:`reproduce.run.signals`); :mod:`reproduce.run.loaders` chooses what feeds it its batches.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from gamfunc.step import as_dict as plain
from gamfunc.step import from_dict
from reproduce.build import CORRECT, fd_gam_warning, setup
from reproduce.config import Config, as_dict, estimators_of, run_name
from reproduce.data import sets as data_mod
from reproduce.models import count_parameters
from reproduce.run import checkpoint as ckpt
from reproduce.run import report
from reproduce.run.evaluation import evaluate, flatness, flatness_plan, inputs, to
from reproduce.run.launch import Processes, from_main, sum_over_ranks
from reproduce.run.loaders import loaders
from reproduce.run.signals import Interrupted, StopFlag, until_stopped

__all__ = ["Diverged", "Interrupted", "RunLocked", "StopFlag", "like", "run"]


class Diverged(Exception):
    """The run did not train (its summary says why, with ``"status": "diverged"``); exit 3."""

    def __init__(self, message: str, summary: dict | None = None):
        super().__init__(message)
        self.summary = summary


def like(loaded, template, where: str = "state"):
    """``loaded`` (plain dicts, as a checkpoint holds them: :func:`gamfunc.step.as_dict`) with the
    structure of ``template`` (a dict of tensors, or a fresh :class:`gamfunc.StepState`) and each
    tensor on the device and in the memory layout (strides) of its counterpart there: a checkpoint
    resumes in the layout of the resuming run, whether or not the run that wrote it used
    ``channels_last``. The values are copied bit for bit.

    Raises:
        CheckpointError: names or shapes differ (the message names the entry).
    """
    try:
        loaded = from_dict(loaded, template, where)
    except ValueError as e:
        raise ckpt.CheckpointError(f"checkpoint does not match the model: {e}") from None
    return pytree.tree_map(_placed, loaded, template)


def _placed(loaded, template):
    if not isinstance(template, Tensor):
        return loaded
    t = loaded.to(template.device)
    if t.stride() != template.stride():
        t = torch.empty_like(template, dtype=t.dtype).copy_(t)
    return t


def with_total_steps(cfg: Config, n_train: int) -> Config:
    """``cfg`` with ``total_steps`` turned into epochs: enough to hold them, the last one cut short."""
    if not cfg.total_steps:
        return cfg
    per_epoch = max(n_train // cfg.batch_size, 1)
    return dataclasses.replace(cfg, epochs=-(-cfg.total_steps // per_epoch))


def _summary_path(run_dir: Path) -> Path:
    return run_dir / "summary.json"


# What a checkpoint of this loop holds (the body `save` writes); one without them is refused.
CHECKPOINT_FIELDS = frozenset(
    {"config", "params", "state", "accum", "position", "data_order", "history", "best", "rng"}
)
CHECKPOINT_FIELDS |= {"finished", "status"}


def _prepare(cfg: Config, name: str, path: Path, world: int) -> dict | None:
    """The checkpoint body to resume from, or None to start afresh; refuses to clobber an unfinished
    run, and to resume with another number of processes."""
    if path.exists() and cfg.resume:
        saved = ckpt.load(path)
        missing = sorted(
            CHECKPOINT_FIELDS - set(saved) if isinstance(saved, dict) else CHECKPOINT_FIELDS
        )
        if missing or not isinstance(saved.get("position"), dict):
            raise ckpt.CheckpointError(
                f"{str(path)!r} is not a checkpoint of reproduce/train.py (it lacks "
                f"{', '.join(missing) or 'a position'}); start afresh with --overwrite"
            )
        ckpt.check_config(saved["config"], cfg, path)
        was = saved["position"].get("world", 1)
        if was != world:
            raise ckpt.CheckpointError(
                f"{str(path)!r} was written by {was} process(es); resume it with {was} "
                f"(torchrun --nproc_per_node and --nnodes giving WORLD_SIZE={was}), not {world}"
            )
        return saved
    if cfg.resume:
        print(f"[{name}] --resume: no checkpoint at {path} yet, starting afresh", flush=True)
    elif cfg.overwrite:
        _clear(path.parent)
    elif path.exists():
        try:
            finished = ckpt.load(path).get("finished", False)
        except ckpt.CheckpointError:
            finished = False
        what = (
            "a finished run: pass --resume to reuse its summary"
            if finished
            else ("an unfinished run: pass --resume to continue it")
        )
        raise ckpt.CheckpointError(f"{str(path)!r} holds {what} or --overwrite to start over")
    return None


def _clear(run_dir: Path) -> None:
    """Remove a run's outputs before ``--overwrite`` trains it again: TensorBoard events, summary and
    pictures. Checkpoints stay until the new run replaces them (atomically), so a new run killed
    early leaves the old one's last state."""
    for pattern in ("events.out.tfevents.*", "summary.json", "*.png"):
        for f in run_dir.glob(pattern):
            f.unlink(missing_ok=True)


class RunLocked(ckpt.CheckpointError):
    """Another process is training into the same run folder."""


def _lock(run_dir: Path):
    """An exclusive lock on ``run_dir`` (a ``.lock`` file, released when the process ends), or
    :class:`RunLocked`."""
    import fcntl

    run_dir.mkdir(parents=True, exist_ok=True)
    f = open(run_dir / ".lock", "a+")  # noqa: SIM115 - held for the whole run
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        raise RunLocked(
            f"another process is training into {str(run_dir)!r}; wait for it to end, or choose "
            "another --logdir or --name"
        ) from None
    return f


def _decide(cfg: Config, name: str, path: Path, procs: Processes) -> tuple[str, Any, Any]:
    """Rank 0's decision, on every rank: ("resume", body), ("fresh", None), ("finished", summary)
    or ("error" | "locked", message); and rank 0's lock on the run folder (None elsewhere)."""
    decision: tuple[str, Any] = ("fresh", None)
    lock = None
    if procs.main:
        try:
            lock = _lock(path.parent)
            saved = _prepare(cfg, name, path, procs.world)
            summary = _summary_path(path.parent)
            done = None
            if saved is not None and saved["finished"] and summary.exists():
                try:
                    done = json.loads(summary.read_text())
                except (json.JSONDecodeError, UnicodeDecodeError) as e:
                    raise ckpt.CheckpointError(
                        f"{str(summary)!r} of this finished run is not readable JSON ({e}); "
                        "train it again with --overwrite"
                    ) from None
            # a summary of another status: the end-of-run metrics were stopped; take them again
            if isinstance(done, dict) and done.get("status") == "finished":
                decision = ("finished", done)
            elif saved is not None:
                decision = ("resume", saved)
        except RunLocked as e:
            decision = ("locked", str(e))
        except ckpt.CheckpointError as e:
            decision = ("error", str(e))
    return (*from_main(procs, decision), lock)


def _zero_accum(device) -> dict[str, Tensor]:
    z = lambda dt: torch.zeros((), dtype=dt, device=device)  # noqa: E731
    return {
        "loss": z(torch.float64),
        "correct": z(torch.int64),
        "seen": z(torch.int64),
        "skipped": z(torch.int64),
    }


def _accumulate(accum: dict[str, Tensor], metrics: dict[str, Tensor], state: dict, n: int) -> None:
    """Add a step's loss and correct count to the epoch's sums, unless the step was skipped (no sync)."""
    loss = metrics["loss"]
    ok = (
        (metrics["skipped"] == 0).to(loss.device)
        if "skipped" in metrics
        else torch.ones((), dtype=torch.bool)
    )
    accum["loss"] += torch.where(ok, loss.double() * n, 0.0)
    accum["correct"] += torch.where(ok, state.buffers[CORRECT], 0)
    accum["seen"] += ok.to(torch.int64) * n
    accum["skipped"] += (~ok).to(torch.int64)


def _global(accum: dict[str, Tensor], procs: Processes) -> dict[str, Tensor]:
    """The epoch's sums over all ranks (a collective)."""
    keys = list(accum)
    return dict(zip(keys, sum_over_ranks(procs, [accum[k] for k in keys]), strict=True))


class _Run:
    """The state of one estimator's training that the loop's parts share."""

    def __init__(self, cfg: Config, name: str, stop: StopFlag, procs: Processes, run_dir: Path):
        self.cfg, self.name, self.stop, self.procs, self.run_dir = cfg, name, stop, procs, run_dir
        self.path = run_dir / "checkpoint.pt"
        self.saved_step: int | None = None  # the step of the checkpoint on disk, this run's
        self.trained = False  # the training is done: only the end-of-run metrics remain

    def say(self, text: str) -> None:
        if self.procs.main:
            print(text, flush=True)

    def kept(self) -> str:
        """What a run stopped now leaves on disk, in words."""
        if self.saved_step is None:
            return "nothing was saved yet"
        where = f"kept: the checkpoint of step {self.saved_step} at {self.path}"
        if self.trained:
            return f"{where} (training done) and summary.json; --resume computes the end-of-run metrics"
        return f"{where}; resume with --resume"


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
        cfg = with_total_steps(cfg, len(data.train))
        r = _Run(cfg, name, stop, procs, run_dir)
        kind, saved, lock = _decide(cfg, name, r.path, procs)
        try:
            if kind in ("error", "locked"):
                raise (RunLocked if kind == "locked" else ckpt.CheckpointError)(saved)
            if kind == "finished":
                r.say(f"[{name}] already finished; summary from {run_dir}")
                return saved
            return _train(r, data, saved if kind == "resume" else None)
        except Interrupted as e:
            e.kept = e.kept or r.kept()
            raise
        finally:
            if lock is not None:
                lock.close()


def _train(r: _Run, data, saved) -> dict:
    from torch.utils.tensorboard import SummaryWriter

    import gamfunc.logging as tblog

    cfg, name, stop, procs, run_dir = r.cfg, r.name, r.stop, r.procs, r.run_dir

    device = procs.device
    data = data_mod.to_device(data or data_mod.load(cfg), device)
    t = setup(cfg, name, data, procs)
    model, loss_fn, step, params, state = t.model, t.loss_fn, t.step, t.params, t.state
    steps_per_epoch, world, rank = t.steps_per_epoch, procs.world, procs.rank
    train_loader, eval_batches, loader_name = loaders(cfg, data, procs)
    r.say(f"[{name}] data: {loader_name}; {world} process(es), global batch {cfg.batch_size}")
    for note in t.notes:
        r.say(f"[{name}] {note}")
    # settings this run is known to train badly with: one line on stderr, and in the summary
    warnings = [w for w in (fd_gam_warning(cfg, name),) if w]
    for w in warnings:
        if procs.main:
            print(f"warning: [{name}] {w}", file=sys.stderr, flush=True)

    probe_idx = torch.randperm(len(data.probe), generator=data_mod.generator(cfg.seed, 6))
    probe = data_mod.stack(data.probe, probe_idx[: cfg.flatness_samples]) if procs.main else None
    pos = {"epoch": 0, "batch": 0, "global_step": 0, "train_seconds": 0.0, "world": world}
    pos |= {"timed_images": 0, "timed_seconds": 0.0}
    accum = _zero_accum(device)
    history: list[dict[str, Any]] = []
    best: dict[str, Any] | None = None  # the best validation epoch, with a validation split
    order = None
    if saved is not None:
        params = like(saved["params"], params, "params")
        state = like(saved["state"], state, "state")
        if procs.main:  # the saved sums are over all ranks: one rank carries them on
            accum = to(saved["accum"], device)
        pos, history, best = {**pos, **saved["position"]}, saved["history"], saved["best"]
        r.saved_step = pos["global_step"]
        order = saved["data_order"]
        ckpt.set_rng_state(saved["rng"])
        r.say(
            f"[{name}] resumed from {r.path} at epoch {pos['epoch']}, batch {pos['batch']} (step {pos['global_step']})"
        )
    else:
        torch.manual_seed(cfg.seed)
        if procs.main:
            report.write_json(run_dir / "config.json", as_dict(cfg))

    def save(finished: bool = False, status: str = "running") -> None:
        """A checkpoint (a collective: every rank calls it; rank 0 writes)."""
        sums = _global(accum, procs)
        if not procs.main:
            return
        ckpt.save(
            r.path,
            {
                "config": as_dict(cfg),
                "params": to(params, "cpu"),
                "state": plain(to(state, "cpu")),
                "accum": to(sums, "cpu"),
                "position": dict(pos),
                "data_order": order,
                "history": history,
                "best": best,
                "rng": ckpt.rng_state(),
                "finished": finished,
                "status": status,
            },
        )
        r.saved_step = pos["global_step"]

    if procs.main:
        # Points after the checkpoint's step were written by the run that stopped and are written
        # again; those at its step were written before the checkpoint and are not.
        purge = pos["global_step"] + 1 if saved else None
        writer = SummaryWriter(str(run_dir), purge_step=purge)
    else:
        writer = report.NullWriter()
    if saved is None:
        tblog.config(writer, as_dict(cfg))
        tblog.text(
            writer, "model", f"{cfg.model}: {count_parameters(model):,} parameters on {device}"
        )
    stopped = None
    meter = report.Meter(device, pos)
    first_step = True
    show = cfg.progress and procs.main
    epochs_bar = report.progress(
        total=cfg.epochs, initial=pos["epoch"], desc=name, enabled=show, unit="ep"
    )
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    compile_seconds = None

    def summary(
        status: str, final: dict | None = None, why: str | None = None, code: int = 0
    ) -> dict:
        """The run's summary.json (rank 0 writes it), also for a run that diverged or was stopped
        by a signal; ``code`` is the exit status of train.py for this outcome."""
        overall = pos["global_step"] * cfg.batch_size / max(pos["train_seconds"], 1e-9)
        rate = meter.rate() or overall
        out = {
            "estimator": name,
            "status": status,
            "reason": why,
            "warnings": warnings,
            # "chance_level": the final training accuracy is at chance (report.at_chance)
            "flags": report.flags(final, data.num_classes),
            "exit_code": code,
            "epochs_done": pos["epoch"],
            "steps": pos["global_step"],
            "skipped_steps": int(state.skipped),
            "train_seconds": round(pos["train_seconds"], 2),
            # steady state: the first logging interval of every (re)start (compilation) is left out
            "images_per_s": round(rate, 1),
            "images_per_s_per_process": round(rate / world, 1),
            "images_per_s_overall": round(overall, 1),
            "processes": world,
            "perturbation": cfg.perturbation if world > 1 else None,
            "loader": loader_name,
            "compile_seconds": compile_seconds,
            "peak_memory_gib": (
                round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
                if device.type == "cuda"
                else None
            ),
            "final": final,
            "best_val": best,
            # Appendix C.2 reports the best test accuracy seen during training; it is never used
            # for selection.
            "best_test_acc_reported_only": max(
                (h["test_acc"] for h in history if h.get("test_acc") is not None), default=None
            ),
            "history": history,
            "config": as_dict(cfg),
        }
        if procs.main:
            report.write_json(_summary_path(run_dir), out)
        return out

    run_of_skips = torch.zeros((), dtype=torch.int64, device=device)  # consecutive skipped steps
    last_loss = None
    try:
        stop.now("training")
        while pos["epoch"] < cfg.epochs:
            epoch = pos["epoch"]
            if order is None:
                order = data_mod.epoch_order(len(data.train), cfg.seed, epoch)
                order = order[: steps_per_epoch * cfg.batch_size]
            batches = data_mod.train_batches(
                data.train,
                order.to(data.train.indices.device),
                pos["batch"],
                cfg.batch_size,
                seed=cfg.seed,
                epoch=epoch,
                rank=rank,
                world=world,
                loader=train_loader,
            )
            bar = report.progress(
                total=steps_per_epoch,
                initial=pos["batch"],
                leave=False,
                enabled=show and steps_per_epoch > 20,
            )
            clock = time.perf_counter()
            meter.mark()
            for x, y in until_stopped(batches, stop):
                x, y = inputs(x, device, cfg.channels_last), y.to(device, non_blocking=True)
                if first_step and cfg.compile:
                    r.say(f"[{name}] compiling the step (first call)...")
                    began = time.perf_counter()
                if first_step:  # nothing to save before it: a signal stops it at once
                    compiling = " and its compilation" if cfg.compile else ""
                    with stop.during(f"start-up (the first step{compiling})", at_once=True):
                        params, state, metrics = step(params, state, (x, y))
                else:
                    params, state, metrics = step(params, state, (x, y))
                if first_step and cfg.compile:
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    compile_seconds = round(time.perf_counter() - began, 1)
                    r.say(f"[{name}] compiled and ran the first step in {compile_seconds} s")
                first_step = False
                _accumulate(accum, metrics, state, len(y))
                last_loss = metrics["loss"]
                if "skipped" in metrics:
                    run_of_skips = torch.where(metrics["skipped"] != 0, run_of_skips + 1, 0)
                pos["batch"] += 1
                pos["global_step"] += 1
                meter.count(len(y) * world)
                bar.update()
                sync = pos["global_step"] % cfg.log_every == 0
                if sync:
                    rate = meter.lap()
                    report.log_step(tblog, writer, metrics, state, pos["global_step"], rate)
                    if cfg.max_skipped and int(run_of_skips) >= cfg.max_skipped:
                        save(status="diverged")
                        why = (
                            f"stopped at step {pos['global_step']}: the last {int(run_of_skips)} "
                            f"steps were all skipped (non-finite loss or update; "
                            f"--max_skipped={cfg.max_skipped}); lower --lr or check the data. "
                            f"The checkpoint holds the last finite parameters."
                        )
                        raise Diverged(f"[{name}] {why}", summary("diverged", why=why, code=3))
                if cfg.max_steps and pos["global_step"] >= cfg.max_steps:
                    stopped = "max_steps"
                if cfg.total_steps and pos["global_step"] >= cfg.total_steps:
                    break  # the last epoch ends here
                signalled = stop.signum if world == 1 else (stop.agreed(procs) if sync else None)
                if stopped or signalled is not None:
                    break
                if cfg.checkpoint_every and pos["global_step"] % cfg.checkpoint_every == 0:
                    pos["train_seconds"] += time.perf_counter() - clock
                    save()
                    clock = time.perf_counter()
                    meter.mark()
            bar.close()
            pos["train_seconds"] += time.perf_counter() - clock
            if stop.signum is not None:
                save(status="interrupted")
                stop.check()
            if stopped:
                break
            # The epoch's steps are done. If a signal stops what follows, the checkpoint says so
            # (batch == steps_per_epoch) and a resumed run redoes the end-of-epoch work.
            try:
                record = _end_of_epoch(
                    r, epoch, loss_fn, params, state, accum, data, probe, writer, pos, eval_batches
                )
            except Interrupted:
                save(status="interrupted")
                raise
            history.append(record)
            if data.val is not None and (best is None or record["val_acc"] > best["val_acc"]):
                best = {
                    "val_acc": record["val_acc"],
                    "epoch": epoch + 1,
                    "test_acc": record.get("test_acc"),
                }
                if procs.main:
                    ckpt.save(
                        run_dir / "best.pt",
                        {
                            "config": as_dict(cfg),
                            "params": to(params, "cpu"),
                            "state": plain(to(state, "cpu")),
                            "best": best,
                        },
                    )
            pos.update(epoch=epoch + 1, batch=0)
            accum, order = _zero_accum(device), None
            epochs_bar.update()
            epochs_bar.set_postfix(test_acc=record.get("test_acc"), loss=record["train_loss"])
            line = report.epoch_line(name, cfg, record)
            if line:
                r.say(line)
            if pos["epoch"] < cfg.epochs:  # the last epoch's checkpoint is written below
                save()
                if (stop.signum if world == 1 else stop.agreed(procs)) is not None:
                    save(status="interrupted")
                    stop.check()

        why = diverged(cfg, params, state, pos["global_step"], last_loss)
        if why is not None:
            save(status="diverged")
            raise Diverged(f"[{name}] diverged: {why}", summary("diverged", why=why, code=3))
        status = stopped or "finished"
        save(finished=status == "finished", status=status)
        if stopped == "max_steps":
            r.say(
                f"[{name}] stopped at step {pos['global_step']} of "
                f"{cfg.epochs * steps_per_epoch} (--max_steps={cfg.max_steps})"
            )
        last = history[-1] if history and history[-1]["step"] == pos["global_step"] else None
        smoke = cfg.synthetic or 0 < cfg.max_steps < steps_per_epoch
        r.trained = True
        stop.now("the end-of-run metrics")
        final = _final_metrics(
            r, loss_fn, params, state, data, probe, writer, pos, last, eval_batches, smoke
        )
    except Interrupted as e:
        e.kept = r.kept()
        if r.saved_step is not None:  # the summary of what is kept, with the reason and status
            summary("interrupted", why=f"{e}; {e.kept}", code=e.code)
        raise
    finally:
        epochs_bar.close()
        writer.close()
    return summary(status=status, final=final)


def diverged(cfg: Config, params, state, steps: int, last_loss) -> str | None:
    """Why a run that reached its end did not train, or None: more than ``max_skipped_fraction`` of
    its steps skipped, non-finite parameters or a root mean square above ``max_param_rms``, or a
    non-finite loss at its last step."""
    skipped = int(state.skipped)
    if steps and skipped / steps > cfg.max_skipped_fraction:
        return (
            f"{skipped} of its {steps} steps were skipped as non-finite "
            f"(--max_skipped_fraction={cfg.max_skipped_fraction}); lower --lr or check the data"
        )
    values = list(params.values())
    if not all(bool(torch.isfinite(v).all()) for v in values):
        return "its final parameters are not finite; lower --lr or check the data"
    n = sum(v.numel() for v in values)
    rms = float(torch.sqrt(sum(v.double().pow(2).sum() for v in values) / max(n, 1)))
    if rms > cfg.max_param_rms:
        return (
            f"its final parameters have a root mean square of {rms:.3g} "
            f"(--max_param_rms={cfg.max_param_rms:g}); lower --lr"
        )
    if last_loss is not None and not bool(torch.isfinite(last_loss)):
        return f"its loss at the last step is {float(last_loss)}; lower --lr or check the data"
    return None


def _evaluations(r: _Run, splits: dict, params, buffers, loss_fn, eval_batches) -> dict:
    """``{split_loss, split_acc, split_top5}`` for each split given (each rank its share)."""
    out = {}
    procs = r.procs
    check = r.stop.check if procs.world == 1 else None
    for split, ds in splits.items():
        if ds is None:
            continue
        part = data_mod.shard(ds, procs.rank, procs.world)
        n = -(-len(part) // r.cfg.eval_batch_size)
        show = r.cfg.progress and procs.main and n > 20
        batches = report.progress(
            eval_batches(part), total=n, desc=split, leave=False, enabled=show
        )
        scores = evaluate(
            loss_fn,
            params,
            buffers,
            batches,
            procs.device,
            check,
            channels_last=r.cfg.channels_last,
            procs=procs,
        )
        out.update({f"{split}_{k}": v for k, v in scores.items()})
    return out


def _flatness(r: _Run, loss_fn, params, buffers, probe, writer, step: int) -> dict:
    """The flatness metrics on rank 0 (the others go on to the next collective and wait there):
    first a line of what they compute and their size, then a line per metric. A signal stops them
    at the next loss evaluation."""
    import gamfunc.logging as tblog

    if not r.procs.main:
        return {}
    cfg = r.cfg
    n = len(probe[1])
    parts, size = flatness_plan(cfg, n)
    if not parts:
        return {}
    r.say(
        f"[{r.name}] flatness at step {step} on {n} training examples, about {size}: "
        f"{', '.join(parts)}..."
    )
    began = time.perf_counter()
    values, figure = flatness(
        cfg,
        loss_fn,
        params,
        buffers,
        probe,
        r.procs.device,
        step,
        check=r.stop.check,
        say=lambda line: r.say(f"[{r.name}]   {line}"),
    )
    if figure is not None:
        figure.savefig(r.run_dir / f"landscape_step{step}.png", dpi=100)
        tblog.figure(writer, "flatness/landscape_1d", figure, step)
    r.say(f"[{r.name}] flatness done in {time.perf_counter() - began:.1f} s")
    return values


def _end_of_epoch(
    r: _Run, epoch, loss_fn, params, state, accum, data, probe, writer, pos, eval_batches
) -> dict:
    """The epoch's record: mean training loss and running accuracy, test/val (/train) evaluation, and
    flatness every ``flatness_every`` epochs; all written to TensorBoard at the epoch's last step."""
    import gamfunc.logging as tblog

    cfg = r.cfg
    step = pos["global_step"]
    sums = _global(accum, r.procs)
    seen, skipped = int(sums["seen"]), int(sums["skipped"]) // r.procs.world
    record: dict[str, Any] = {
        "epoch": epoch + 1,
        "step": step,
        # a mean over no step is no number: None when every step of the epoch was skipped
        "train_loss": float(sums["loss"]) / seen if seen else None,
        "train_acc": 100.0 * int(sums["correct"]) / seen if seen else None,
        "skipped_steps": skipped,
    }
    buffers = state.buffers
    last = epoch + 1 == cfg.epochs
    r.stop.now(f"the end of epoch {epoch + 1} (evaluation, metrics)")
    if (epoch + 1) % cfg.eval_every == 0 or last:
        splits = {
            "test": data.test,
            "val": data.val,
            "train_eval": data.probe if cfg.eval_train else None,
        }
        record.update(_evaluations(r, splits, params, buffers, loss_fn, eval_batches))
    if cfg.flatness_every and (epoch + 1) % cfg.flatness_every == 0 and not last:
        if r.procs.world == 1:
            r.stop.check()
        record.update(_flatness(r, loss_fn, params, buffers, probe, writer, step))
    r.stop.now("training")
    if cfg.histogram_every and (epoch + 1) % cfg.histogram_every == 0:
        tblog.histograms(writer, params, step)
    scalars = {k: v for k, v in record.items() if v is not None and k not in ("epoch", "step")}
    tblog.scalars(writer, {report.tag(k): v for k, v in scalars.items()}, step)
    tblog.scalars(writer, {"epoch": epoch + 1}, step, "train/")
    return record


# The end-of-run metrics of a smoke run, at most: seconds on a CPU, not the minutes of a full probe.
_SMOKE_METRICS = {"eig_iters": 5, "trace_samples": 2, "r1_steps": 2, "flatness_samples": 64}


def _smaller(cfg: Config) -> Config:
    """``cfg`` with its flatness metrics capped at :data:`_SMOKE_METRICS` (0 stays 0)."""
    return dataclasses.replace(
        cfg, **{k: min(getattr(cfg, k), cap) for k, cap in _SMOKE_METRICS.items()}
    )


def _final_metrics(
    r: _Run, loss_fn, params, state, data, probe, writer, pos, last, eval_batches, smoke=False
) -> dict:
    """The final record: ``last`` (the epoch record at this step) or, for a run stopped mid-epoch, a
    fresh test/validation evaluation; plus accuracy over the whole training set in eval mode
    (in-memory data, or with ``eval_train``) and the flatness metrics."""
    import gamfunc.logging as tblog

    cfg, step = r.cfg, pos["global_step"]
    out: dict[str, Any] = dict(last) if last is not None else {"step": step}
    buffers = state.buffers
    splits = {
        "train_eval": data.probe if data.probe.tensors() is not None or cfg.eval_train else None
    }
    if last is None:
        splits |= {"test": data.test, "val": data.val}
    splits = {k: v for k, v in splits.items() if f"{k}_acc" not in out}
    out.update(_evaluations(r, splits, params, buffers, loss_fn, eval_batches))
    measured = cfg.eig_iters or cfg.trace_samples or cfg.r1_steps or cfg.landscape
    if smoke and measured and not cfg.full_metrics and probe is not None:
        small = _SMOKE_METRICS
        r.say(
            f"[{r.name}] a smoke run (--synthetic, or --max_steps below one epoch): flatness at a "
            f"small size ({small['eig_iters']} Lanczos products, {small['trace_samples']} trace "
            f"probes, {small['r1_steps']} R1 steps, {small['flatness_samples']} examples at most); "
            "--full_metrics=true for the configured sizes"
        )
        r = _Run(_smaller(cfg), r.name, r.stop, r.procs, r.run_dir)
        n = r.cfg.flatness_samples
        probe = (probe[0][:n], probe[1][:n])
    out.update(_flatness(r, loss_fn, params, buffers, probe, writer, step))
    new = {
        k: v
        for k, v in out.items()
        if k not in (last or {}) and k not in ("epoch", "step") and v is not None
    }
    tblog.scalars(writer, {report.tag(k): v for k, v in new.items()}, step)
    return out
