"""The schedules of a run: its learning rate over the steps (`lr_schedule`) and which steps are
flat (`when_policy`)."""

from __future__ import annotations

import torch

import gamfunc
from gamfunc import schedules
from reproduce.build.model import SetupError
from reproduce.config import Config
from reproduce.config.checks import late_start

__all__ = ["lr_schedule", "run_steps", "when_policy"]


def run_steps(cfg: Config, steps_per_epoch: int) -> int:
    """The run's length in steps: ``--total_steps``, else ``--epochs`` × the steps of an epoch."""
    return cfg.total_steps or cfg.epochs * steps_per_epoch


def lr_schedule(cfg: Config, steps_per_epoch: int):
    """The learning rate at step t: linear warm-up over ``warmup_epochs``, then cosine decay to 0
    over the rest of the run (or constant).

    ``lr_schedule_unit="step"``: lr(t) = cosine(lr, T, W)(t), T and W counted in steps.
    ``"epoch"``: lr(t) = cosine(lr, E, W_e)(⌊t / steps_per_epoch⌋), E and W_e counted in epochs, so
    that the rate changes once per epoch: with no warm-up, lr·(1 + cos(π·e/E))/2 through epoch e, the
    authors' ``CosineAnnealingLR(T_max=epochs)`` (gam/optimizer_helper.py l.18 of
    github.com/xxgege/GAM) stepped after every epoch (main_cifar.py l.291).
    """
    if cfg.schedule == "constant" and cfg.warmup_epochs == 0:
        return cfg.lr
    if cfg.lr_schedule_unit == "epoch":
        # a --total_steps run ends in the epoch that holds its last step
        total = -(-cfg.total_steps // steps_per_epoch) if cfg.total_steps else cfg.epochs
        per_epoch = _lr_by_count(cfg, total, round(cfg.warmup_epochs))
        return lambda t: per_epoch(torch.div(t, steps_per_epoch, rounding_mode="floor"))
    total = run_steps(cfg, steps_per_epoch)
    return _lr_by_count(cfg, total, round(cfg.warmup_epochs * steps_per_epoch))


def when_policy(cfg: Config, steps_per_epoch: int):
    """The ``when=`` policy of ``--when`` (and of its shorthand ``--every``), None for every step.

    ``every:k`` is `gamfunc.when.every`; ``late:F`` with F < 1 a fraction of the run's steps (T:
    ``--total_steps``, else ``--epochs`` × steps per epoch; ``late:0.75`` is the last quarter),
    ``late:N`` from step N on (`gamfunc.when.late`); ``adaptive`` is AE-SAM's trigger with the
    paper's defaults over T steps (`gamfunc.when.adaptive`).

    Args:
        cfg: the run's configuration.
        steps_per_epoch: the steps of one epoch.

    Returns:
        A policy of `gamfunc.when`, or None.

    Raises:
        SetupError: ``late``'s first flat step is past the run's last step (no step would be
            flat), which ``--epochs`` lets the configuration's checks see only now.
    """
    total = run_steps(cfg, steps_per_epoch)
    kind, _, arg = cfg.when.partition(":")
    if kind == "every":
        return gamfunc.when.every(int(arg))
    if kind == "late":
        try:
            return gamfunc.when.late(late_start(arg), total_steps=total)
        except ValueError as e:
            raise SetupError(
                f"--when={cfg.when} over the run's {total} steps: {str(e).removeprefix('start: ')}"
            ) from None
    if kind == "adaptive":
        return gamfunc.when.adaptive(total)
    return gamfunc.when.every(cfg.every) if cfg.every > 1 else None


def _lr_by_count(cfg: Config, total: int, warm: int):
    """The schedule of ``cfg`` over ``total`` counts (steps or epochs), ``warm`` of them warm-up."""
    if cfg.schedule == "constant":
        return lambda t: torch.clamp((t.to(torch.float64) + 1) / max(warm, 1), max=1.0) * cfg.lr
    return schedules.cosine(cfg.lr, total, warm)
