"""``train.py --fsdp``: the model sharded by FSDP2 (``fully_shard``), trained through the facade.

Under ``torchrun`` every rank holds 1/N of the parameters, of their gradients and of the
optimiser's state. The model is sharded per block (`reproduce.run.sharding.shard_model`: each
residual block of a ResNet, each transformer block of a ViT, its own ``fully_shard`` unit), then
the root. The step is [`gamfunc.torch_optim.FlatnessOptimizer`][gamfunc.torch_optim.FlatnessOptimizer]
over train.py's estimator (`reproduce.build.build_estimator`) and ``torch.optim``'s SGD or AdamW
with train.py's schedule (`reproduce.run.sharding.base_optimizer`): every pass runs through the
module's own autograd, every norm over the ranks' shards, so one rank's step is the step of one
process on the global batch. The epochs run on `reproduce.run.epoch.train_epochs` over train.py's
batches (``--batch_size`` is the global batch); checkpoints are sharded
(`gamfunc.torch_optim.sharded_checkpoint`: each rank writes its shards, atomically) and resume on
the same number of processes, bit for bit. After the first step, rank 0 prints every rank's bytes
of parameters, gradients and optimiser state.

What it does not run is refused before any training (`reproduce.run.sharding.refusal`). The
flatness metrics of the run's end are not computed (their functional form refuses a sharded
module), nor is ``best.pt`` written (the summary names the best validation epoch).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from gamfunc.torch_optim import FlatnessOptimizer, sharded_checkpoint
from gamfunc.torch_optim.sharded import per_rank_bytes, plain
from reproduce.build import (
    IMAGENET_CLASSES,
    SetupError,
    build_estimator,
    load_weights,
    lr_schedule,
    model_of,
    when_policy,
)
from reproduce.config import Config, as_dict, differences, estimators_of
from reproduce.data import sets as data_mod
from reproduce.models import count_parameters, new_head
from reproduce.run import checkpoint as ckpt
from reproduce.run import report
from reproduce.run.epoch import END, train_epochs
from reproduce.run.evaluation import inputs
from reproduce.run.launch import Processes, from_main
from reproduce.run.loaders import loaders
from reproduce.run.loop import with_total_steps
from reproduce.run.sharding import base_optimizer, evaluate, shard_model, state_bytes
from reproduce.run.signals import Interrupted, StopFlag, until_stopped
from reproduce.run.summary import Diverged

__all__ = ["CHECKPOINT", "run"]

CHECKPOINT = "checkpoint"  # the sharded checkpoint's folder in the run's folder


def _model(cfg: Config, data, procs: Processes) -> nn.Module:
    """The network of ``cfg`` (from ``--weights``, with a new head for ``--pretrained``), rank 0's
    tensors on every rank, on the process's device, before sharding."""
    if cfg.pretrained and not cfg.weights:
        raise SetupError(
            f"--preset={cfg.preset} fine-tunes a pretrained {cfg.model}: pass --weights"
        )
    classes = IMAGENET_CLASSES if cfg.pretrained else data.num_classes
    model = model_of(cfg, classes, data)
    if cfg.weights:
        load_weights(model, ckpt.state_dict(cfg.weights), cfg.weights)
    if cfg.pretrained:
        new_head(model, data.num_classes, seed=cfg.seed)
    model.to(procs.device)
    if procs.world > 1:
        with torch.no_grad():
            for t in (*model.parameters(), *model.buffers()):
                dist.broadcast(t, src=0)
    return model


def _decide(cfg: Config, run_dir: Path, procs: Processes) -> tuple[str, dict | None]:
    """``("fresh" | "resume" | "finished", the summary of a finished run)``, decided by rank 0."""
    decision: tuple[str, dict | None] | str = ("fresh", None)
    if procs.main:
        done = run_dir / "summary.json"
        if (run_dir / CHECKPOINT).is_dir():
            saved = json.loads(done.read_text()) if done.is_file() else None
            if cfg.overwrite:
                shutil.rmtree(run_dir / CHECKPOINT)
            elif saved is not None and saved.get("status") == "finished":
                decision = ("finished", saved)
            elif cfg.resume:
                decision = ("resume", None)
            else:
                decision = (
                    f"{str(run_dir)!r} holds a sharded checkpoint: --resume continues it, "
                    "--overwrite trains it again"
                )
    decision = from_main(procs, decision)
    if isinstance(decision, str):
        raise ckpt.CheckpointError(decision)
    return decision


class _Run:
    """One estimator's run under ``--fsdp``: its model, step, position and outputs."""

    def __init__(self, cfg: Config, name: str, stop: StopFlag, data, run_dir: Path, procs):
        self.cfg, self.name, self.stop, self.procs, self.run_dir = cfg, name, stop, procs, run_dir
        self.data = data
        self.steps_per_epoch = len(data.train) // cfg.batch_size
        if cfg.batch_size % procs.world or self.steps_per_epoch < 1:
            raise SetupError(
                f"--batch_size={cfg.batch_size} must divide evenly over the {procs.world} "
                f"processes and be at most the {len(data.train)} training examples"
            )
        from torch.distributed.device_mesh import init_device_mesh

        self.model = _model(cfg, data, procs)
        self.units = shard_model(self.model, init_device_mesh(procs.device.type, (procs.world,)))
        self.lr = lr_schedule(cfg, self.steps_per_epoch)
        estimator, base = build_estimator(cfg, name, self.lr)
        when = None if estimator.every > 1 else when_policy(cfg, self.steps_per_epoch)
        criterion = functools.partial(F.cross_entropy, label_smoothing=cfg.label_smoothing)
        cls, kwargs = base_optimizer(cfg, self.model)
        self.opt = FlatnessOptimizer(
            self.model,
            estimator,
            cls,
            criterion,
            when=when,
            base=None if estimator.every > 1 or when is None else base,
            max_grad_norm=cfg.clip_norm or None,
            **kwargs,
        )
        self.train_loader, self.eval_batches, self.loader_name = loaders(cfg, data, procs)
        self.pos = {"epoch": 0, "batch": 0, "global_step": 0, "train_seconds": 0.0}
        self.history: list[dict] = []
        self.sums = {"loss": 0.0, "seen": 0, "skipped": 0}
        self.run_of_skips, self.bytes, self.status = 0, None, "running"
        self.writer = report.NullWriter()

    def say(self, line: str) -> None:
        if self.procs.main:
            print(f"[{self.name}] {line}", flush=True)

    # ---- checkpoints -------------------------------------------------------------------------

    def _progress(self) -> str:
        return report.dumps(
            {
                "pos": self.pos,
                "history": self.history,
                "sums": self.sums,
                "world": self.procs.world,
                "config": as_dict(self.cfg),
                "status": self.status,
            },
            indent=None,
        )

    def save(self, status: str = "running") -> None:
        self.status = status
        state = {
            "model": self.model.state_dict(),
            "optim": self.opt.state_dict(),
            "progress": self._progress(),
        }
        sharded_checkpoint.save(state, self.run_dir / CHECKPOINT)

    def load(self) -> None:
        state = {
            "model": self.model.state_dict(),
            "optim": sharded_checkpoint.template(self.opt),
            "progress": "",
        }
        sharded_checkpoint.load(state, self.run_dir / CHECKPOINT)
        saved = json.loads(state["progress"])
        if saved["world"] != self.procs.world:
            raise ckpt.CheckpointError(
                f"{str(self.run_dir / CHECKPOINT)!r} was written by {saved['world']} process(es); "
                f"resume it on as many (this job has {self.procs.world})"
            )
        changed = differences(saved["config"], self.cfg)
        if changed:
            what = ", ".join(f"--{k}={new!r} (saved {old!r})" for k, (old, new) in changed.items())
            raise ckpt.ConfigMismatch(f"--resume with another configuration: {what}")
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optim"])
        self.pos, self.history, self.sums = saved["pos"], saved["history"], saved["sums"]
        self.say(f"resumed from {self.run_dir / CHECKPOINT} at step {self.pos['global_step']}")

    # ---- the steps ---------------------------------------------------------------------------

    def batches(self, epoch: int, first: int):
        cfg, data = self.cfg, self.data
        order = data_mod.epoch_order(len(data.train), cfg.seed, epoch)
        order = order[: self.steps_per_epoch * cfg.batch_size].to(data.train.indices.device)
        loaded = data_mod.train_batches(
            data.train,
            order,
            first,
            cfg.batch_size,
            seed=cfg.seed,
            epoch=epoch,
            rank=self.procs.rank,
            world=self.procs.world,
            loader=self.train_loader,
        )
        return until_stopped(loaded, self.stop)

    def step(self, batch) -> dict:
        x, y = batch
        x, y = inputs(x, self.procs.device), y.to(self.procs.device, non_blocking=True)
        if callable(self.lr):  # the schedule's lr of this step, as train.py's optimiser takes it
            lr = float(self.lr(torch.tensor(self.pos["global_step"])))
            for group in self.opt.param_groups:
                group["lr"] = lr
        self.opt.step((x, y))
        metrics = plain(self.opt.metrics)
        if self.bytes is None:  # the first step has allocated the gradients and the state
            mine = per_rank_bytes(self.model, self.opt)
            mine["state"] += state_bytes(self.opt)  # the step's own: counters, an estimator's
            self.bytes = _gathered(self.procs, mine)
            for rank, b in enumerate(self.bytes):
                self.say(
                    f"rank {rank} of {self.procs.world}: parameters {b['params']:,} B, "
                    f"gradients {b['grads']:,} B, optimiser state {b['state']:,} B"
                )
        return metrics

    def after_step(self, metrics: dict, batch) -> str | None:
        cfg, pos = self.cfg, self.pos
        pos["global_step"] += 1
        self.sums["loss"] += float(metrics["loss"]) * len(batch[1]) * self.procs.world
        self.sums["seen"] += len(batch[1]) * self.procs.world
        skipped = int(metrics.get("skipped", 0))
        self.sums["skipped"] += skipped
        self.run_of_skips = self.run_of_skips + 1 if skipped else 0
        sync = pos["global_step"] % cfg.log_every == 0
        if sync:
            for k, v in metrics.items():
                if v.numel() == 1:
                    self.writer.add_scalar(report.tag(k), float(v), pos["global_step"])
        if cfg.max_skipped and self.run_of_skips >= cfg.max_skipped:
            self.save("diverged")
            why = f"the last {self.run_of_skips} steps were all skipped (--max_skipped)"
            raise Diverged(f"[{self.name}] stopped at step {pos['global_step']}: {why}")
        if cfg.max_steps and pos["global_step"] >= cfg.max_steps:
            return "max_steps"
        if cfg.total_steps and pos["global_step"] >= cfg.total_steps:
            return END
        if sync and self.stop.agreed(self.procs) is not None:
            return "signal"
        if cfg.checkpoint_every and pos["global_step"] % cfg.checkpoint_every == 0:
            self.save()
        return None

    def end(self, stopped: str | None) -> str | None:
        if stopped == "signal" or self.stop.agreed(self.procs) is not None:
            self.save("interrupted")
            self.stop.check()
        if stopped:
            return stopped
        record = self.record(self.pos["epoch"])
        self.history.append(record)
        self.pos.update(epoch=self.pos["epoch"] + 1, batch=0)
        self.sums.update(loss=0.0, seen=0)
        self.say(
            f"epoch {record['epoch']}: train loss {record['train_loss']:.4f}, "
            f"test acc {record['test_acc']:.2f}"
        )
        if self.pos["epoch"] < self.cfg.epochs:
            self.save()
        return None

    def record(self, epoch: int) -> dict:
        cfg, data = self.cfg, self.data
        rec = {"epoch": epoch + 1, "step": self.pos["global_step"]}
        rec["train_loss"] = self.sums["loss"] / max(self.sums["seen"], 1)
        splits = [("test", data.test), ("val", data.val), ("train_eval", data.train)]
        for split, ds in splits:
            if ds is None or (split == "train_eval" and not cfg.eval_train):
                continue
            scores = evaluate(self.model, ds, self.eval_batches, self.procs, cfg.eval_batch_size)
            for k, v in scores.items():
                rec[f"{split}_{k}"] = v
                self.writer.add_scalar(f"{split}/{k}", v, self.pos["global_step"])
        return rec

    # ---- the run -----------------------------------------------------------------------------

    def train(self, resume: bool) -> dict:
        cfg = self.cfg
        if resume:
            self.load()
        if self.procs.main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            report.write_json(self.run_dir / "config.json", as_dict(cfg))
            purge = self.pos["global_step"] + 1 if resume else None
            self.writer = report.open_writer(self.run_dir, purge_step=purge)
        self.say(
            f"fsdp: {cfg.model} ({count_parameters(self.model):,} parameters) in {self.units} "
            f"units and the root over {self.procs.world} process(es), global batch "
            f"{cfg.batch_size}; data: {self.loader_name}; the flatness metrics are not computed"
        )
        try:
            with self.stop.during("training"):
                stopped = train_epochs(
                    self.step, self.batches, self.pos, cfg.epochs, self.after_step, self.end
                )
            status = stopped or "finished"
            self.save(status)
            if status == "max_steps":
                self.say(f"stopped at step {self.pos['global_step']} (--max_steps={cfg.max_steps})")
            return self.summary(status)
        finally:
            self.writer.close()

    def summary(self, status: str) -> dict:
        cfg, pos = self.cfg, self.pos
        last = self.history[-1] if self.history else {}
        final = {"train_loss": last.get("train_loss")}
        for key in ("test_acc", "test_loss", "val_acc", "train_eval_acc"):
            if key in last:
                final[key] = last[key]
        vals = [h for h in self.history if "val_acc" in h]
        best = max(vals, key=lambda h: h["val_acc"]) if vals else None
        seconds = pos["train_seconds"]
        out = {
            "estimator": self.name,
            "status": status,
            "config": as_dict(cfg),
            "final": final,
            "best_val": None
            if best is None
            else {"val_acc": best["val_acc"], "epoch": best["epoch"]},
            "history": self.history,
            "steps": pos["global_step"],
            "skipped_steps": self.sums["skipped"],
            "flags": report.flags(final, self.data.num_classes, self.sums["skipped"]),
            "images_per_s": pos["global_step"] * cfg.batch_size / seconds if seconds else 0.0,
            "train_seconds": seconds,
            "fsdp": {
                "processes": self.procs.world,
                "units": self.units,
                "per_rank_bytes": self.bytes,
            },
        }
        if self.procs.main:
            report.write_json(self.run_dir / "summary.json", out)
        return out


def _gathered(procs: Processes, obj: dict) -> list[dict]:
    if procs.world == 1:
        return [obj]
    out: list = [None] * procs.world
    dist.all_gather_object(out, obj)
    return out


def run(cfg: Config, stop: StopFlag, data, run_dir: Path, procs: Processes) -> dict:
    """Train one estimator of ``cfg`` (``cfg.estimator`` names one) with the model sharded; its
    summary (also written to ``run_dir/summary.json`` by rank 0).

    Raises:
        SetupError, CheckpointError: the run cannot start as configured.
        Interrupted: a signal arrived; a checkpoint was written first.
        Diverged: ``--max_skipped`` steps in a row were skipped.
    """
    with stop.during("start-up", at_once=True):
        (name,) = estimators_of(cfg)
        data = data_mod.to_device(data, procs.device)
        cfg = dataclasses.replace(with_total_steps(cfg, len(data.train)), mode="eager")
        kind, saved = _decide(cfg, run_dir, procs)
        if kind == "finished":
            if procs.main:
                print(f"[{name}] already finished; summary from {run_dir}", flush=True)
            return saved or {}
        r = _Run(cfg, name, stop, data, run_dir, procs)
    outer = stop.kept
    stop.kept = lambda: f"kept: the last sharded checkpoint in {str(run_dir / CHECKPOINT)!r}"
    try:
        return r.train(kind == "resume")
    except Interrupted as e:
        e.kept = stop.kept()
        raise
    finally:
        stop.kept = outer
