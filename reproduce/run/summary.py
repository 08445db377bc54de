"""The end of a run: whether it trained, its last checkpoint and final metrics, and summary.json.

`end_of_run` follows the last epoch (or ``--max_steps``): it refuses a run that did not train
(`diverged`, `Diverged`), writes the last checkpoint and takes the end-of-run metrics.
`summary` writes the summary of any outcome, a run that diverged or was stopped by a signal
included, on rank 0.
"""

from __future__ import annotations

import torch

from reproduce.build import run_steps
from reproduce.config import Config, as_dict
from reproduce.run import report
from reproduce.run.context import Parts, Progress, Run, Session, global_sums
from reproduce.run.records import final_metrics
from reproduce.run.resume import write_checkpoint

__all__ = ["Diverged", "diverged", "end_of_run", "estimator_skips", "skipped_too_many", "summary"]


class Diverged(Exception):
    """The run did not train (its summary says why, with ``"status": "diverged"``); exit 3."""

    def __init__(self, message: str, summary: dict | None = None):
        super().__init__(message)
        self.summary = summary


def end_of_run(
    r: Run, parts: Parts, p: Progress, s: Session, stopped: str | None
) -> tuple[str, dict]:
    """After the last epoch, or a stop at ``--max_steps`` (``stopped``): ``(status, final
    record)``, having written the last checkpoint; or `Diverged` if the run did not train."""
    cfg, name, pos = r.cfg, r.name, p.pos
    every = parts.step.every  # --every, or the period of a reusing estimator (looksam, look_gam)
    skips = estimator_skips(r, p, every)
    why = diverged(cfg, p.params, p.state, pos["global_step"], s.last_loss, skips, every)
    if why is not None:
        write_checkpoint(r, p, status="diverged")
        raise Diverged(
            f"[{name}] diverged: {why}", summary(r, parts, p, s, "diverged", why=why, code=3)
        )
    status = stopped or "finished"
    write_checkpoint(r, p, finished=status == "finished", status=status)
    if stopped == "max_steps":
        r.say(
            f"[{name}] stopped at step {pos['global_step']} of "
            f"{run_steps(cfg, parts.steps_per_epoch)} (--max_steps={cfg.max_steps})"
        )
    last = p.history[-1] if p.history and p.history[-1]["step"] == pos["global_step"] else None
    smoke = cfg.synthetic or 0 < cfg.max_steps < parts.steps_per_epoch
    r.trained = True
    r.stop.now("the end-of-run metrics")
    return status, final_metrics(r, parts, p, last, smoke)


def estimator_skips(r: Run, p: Progress, every: int | None = None) -> int:
    """The run's skipped steps that its estimator took (with a step period > 1, not the base
    gradient's): the closed epochs' records and the open epoch's sums (a collective).

    Args:
        r: the run.
        p: its progress.
        every: the step's period (``step.every``: ``--every``, or the period of a reusing
            estimator such as looksam); None reads ``--every``.

    Returns:
        The count, over all of the run's steps.
    """
    if (r.cfg.every if every is None else every) == 1:
        return int(p.state.skipped)
    done = sum(h.get("skipped_estimator_steps", 0) for h in p.history)
    return done + int(global_sums(p.accum, r.procs)["skipped_estimator"]) // r.procs.world


def skipped_too_many(
    cfg: Config,
    skipped: int,
    steps: int,
    estimator_skipped: int | None = None,
    every: int | None = None,
) -> str | None:
    """Why a run with ``skipped`` of its ``steps`` skipped did not train, or None: every step of
    its estimator skipped (every full step of a reusing estimator, looksam or look_gam), or with
    a period > 1 every step of its base gradient, or more than ``cfg.max_skipped_fraction`` of its
    steps.

    Args:
        cfg: the run's configuration (``every``, ``max_skipped_fraction``).
        skipped: its skipped (non-finite) steps.
        steps: the steps it took.
        estimator_skipped: how many of the skipped steps the estimator took (None: all of them).
        every: the step's period (``step.every``); None reads ``cfg.every``.

    Returns:
        The reason in words, or None.
    """
    own = skipped if estimator_skipped is None else estimator_skipped
    every = cfg.every if every is None else every
    # the estimator takes steps 0, every, 2·every, ...; the base gradient the others
    mine = -(-steps // every)
    for who, n, lost in (("estimator", mine, own), ("base gradient", steps - mine, skipped - own)):
        if n and lost >= n:
            return (
                f"every one of the {n} steps of its {who} was skipped as non-finite "
                f"({skipped} of its {steps} steps); lower --lr or --rho, or check the data"
            )
    if steps and skipped / steps > cfg.max_skipped_fraction:
        return (
            f"{skipped} of its {steps} steps were skipped as non-finite "
            f"(--max_skipped_fraction={cfg.max_skipped_fraction}); lower --lr or check the data"
        )
    return None


def diverged(
    cfg: Config,
    params,
    state,
    steps: int,
    last_loss,
    estimator_skipped: int | None = None,
    every: int | None = None,
) -> str | None:
    """Why a run that reached its end did not train, or None: every step of one of its
    gradients skipped (the estimator's, or with ``--every`` > 1 the base gradient's), more than
    ``max_skipped_fraction`` of its steps skipped, non-finite parameters or a root mean square above
    ``max_param_rms``, or a non-finite loss at its last step.

    Args:
        cfg: the run's configuration.
        params: its final parameters.
        state: its final step state (``state.skipped``: the run's skipped steps).
        steps: the steps it took.
        last_loss: the loss of its last step (None: unknown).
        estimator_skipped: how many of the skipped steps the estimator took (None: all of them).
        every: the step's period (``step.every``); None reads ``cfg.every``.

    Returns:
        The reason in words, or None when the run trained.
    """
    why = skipped_too_many(cfg, int(state.skipped), steps, estimator_skipped, every)
    if why is not None:
        return why
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


def summary(
    r: Run,
    parts: Parts,
    p: Progress,
    s: Session,
    status: str,
    final: dict | None = None,
    why: str | None = None,
    code: int = 0,
) -> dict:
    """The run's summary.json (rank 0 writes it), also for a run that diverged or was stopped by a
    signal; ``code`` is the exit status of train.py for this outcome."""
    cfg, pos, device, world = r.cfg, p.pos, r.procs.device, r.procs.world
    overall = pos["global_step"] * cfg.batch_size / max(pos["train_seconds"], 1e-9)
    rate = s.meter.rate() or overall
    out = {
        "estimator": r.name,
        "status": status,
        "reason": why,
        "warnings": parts.warnings,
        # "chance_level": the final training accuracy is at chance (report.at_chance)
        # "skipped_steps": some steps skipped, too few to call the run diverged
        "flags": report.flags(final, parts.data.num_classes, int(p.state.skipped)),
        "exit_code": code,
        "epochs_done": pos["epoch"],
        "steps": pos["global_step"],
        "skipped_steps": int(p.state.skipped),
        "train_seconds": round(pos["train_seconds"], 2),
        # steady state: the first logging interval of every (re)start (compilation) is left out
        "images_per_s": round(rate, 1),
        "images_per_s_per_process": round(rate / world, 1),
        "images_per_s_overall": round(overall, 1),
        "processes": world,
        "perturbation": cfg.perturbation if world > 1 else None,
        "loader": parts.loader,
        "compile_seconds": s.compile_seconds,
        "compile_cache": s.compile_cache.record() if s.compile_cache is not None else None,
        "profile": s.profiler.summary,
        "peak_memory_gib": (
            round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
            if device.type == "cuda"
            else None
        ),
        "final": final,
        "best_val": p.best,
        # Appendix C.2 reports the best test accuracy seen during training; it is never used
        # for selection.
        "best_test_acc_reported_only": max(
            (h["test_acc"] for h in p.history if h.get("test_acc") is not None), default=None
        ),
        "history": p.history,
        "config": as_dict(cfg),
    }
    if r.procs.main:
        report.write_json(r.summary_path, out)
    return out
