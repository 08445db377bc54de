"""What a run measures besides training: each epoch's record and the end-of-run metrics.

An epoch's record holds its mean training loss and running accuracy, the test/validation (/train)
evaluation every ``eval_every`` epochs and the flatness metrics every ``flatness_every``; the final
record adds what the last epoch did not measure. Every rank evaluates its share of a split; the
flatness metrics run on rank 0. A signal stops them at the next batch or loss evaluation.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from reproduce.config import Config
from reproduce.data import sets as data_mod
from reproduce.run import report
from reproduce.run.context import Parts, Progress, Run, global_sums
from reproduce.run.evaluation import evaluate, flatness, flatness_plan

__all__ = ["EVALUATED", "FLATNESS", "RECORD_KEYS", "end_of_epoch", "final_metrics"]

# What an epoch's record holds (`end_of_epoch`): these always; the evaluation of each split
# (``{split}_{score}``) on the epochs it evaluates; the flatness metrics every ``flatness_every``;
# ``skipped_estimator_steps`` with a step period above 1. A resumed run checks its records against
# them (`reproduce.run.checkpoint_body.check_place`).
RECORD_KEYS = frozenset({"epoch", "step", "train_loss", "train_acc", "skipped_steps"})
EVALUATED = frozenset(
    f"{split}_{score}"
    for split in ("test", "val", "train_eval")
    for score in ("loss", "acc", "top5")
)
FLATNESS = frozenset({"lambda_max", "trace", "r1"})


def end_of_epoch(r: Run, parts: Parts, p: Progress, epoch: int) -> dict:
    """The epoch's record: mean training loss and running accuracy, test/val (/train) evaluation, and
    flatness every ``flatness_every`` epochs; all written to TensorBoard at the epoch's last step."""
    from reproduce.run import tensorboard as tblog

    cfg, data, writer = r.cfg, parts.data, parts.writer
    step = p.pos["global_step"]
    sums = global_sums(p.accum, r.procs)
    seen, skipped = int(sums["seen"]), int(sums["skipped"]) // r.procs.world
    record: dict[str, Any] = {
        "epoch": epoch + 1,
        "step": step,
        # a mean over no step is no number: None when every step of the epoch was skipped
        "train_loss": float(sums["loss"]) / seen if seen else None,
        "train_acc": 100.0 * int(sums["correct"]) / seen if seen else None,
        "skipped_steps": skipped,
    }
    if parts.step.every > 1:  # the estimator's share of them: it took every every-th step
        record["skipped_estimator_steps"] = int(sums["skipped_estimator"]) // r.procs.world
    params, buffers = p.params, p.state.buffers
    last = epoch + 1 == cfg.epochs
    r.stop.now(f"the end of epoch {epoch + 1} (evaluation, metrics)")
    if (epoch + 1) % cfg.eval_every == 0 or last:
        splits = {
            "test": data.test,
            "val": data.val,
            "train_eval": data.probe if cfg.eval_train else None,
        }
        record.update(_evaluations(r, splits, params, buffers, parts.loss_fn, parts.eval_batches))
    if cfg.flatness_every and (epoch + 1) % cfg.flatness_every == 0 and not last:
        if r.procs.world == 1:
            r.stop.check()
        record.update(_flatness(r, parts.loss_fn, params, buffers, parts.probe, writer, step))
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
    """``cfg`` with its flatness metrics capped at `_SMOKE_METRICS` (0 stays 0)."""
    return dataclasses.replace(
        cfg, **{k: min(getattr(cfg, k), cap) for k, cap in _SMOKE_METRICS.items()}
    )


def final_metrics(
    r: Run, parts: Parts, p: Progress, last: dict | None, smoke: bool = False
) -> dict:
    """The final record: ``last`` (the epoch record at this step) or, for a run stopped mid-epoch, a
    fresh test/validation evaluation; plus accuracy over the whole training set in eval mode
    (in-memory data, or with ``eval_train``) and the flatness metrics (at a small size for a
    ``smoke`` run, unless ``full_metrics``)."""
    from reproduce.run import tensorboard as tblog

    cfg, step, data, probe = r.cfg, p.pos["global_step"], parts.data, parts.probe
    out: dict[str, Any] = dict(last) if last is not None else {"step": step}
    params, buffers = p.params, p.state.buffers
    splits = {
        "train_eval": data.probe if data.probe.tensors() is not None or cfg.eval_train else None
    }
    if last is None:
        splits |= {"test": data.test, "val": data.val}
    splits = {k: v for k, v in splits.items() if f"{k}_acc" not in out}
    out.update(_evaluations(r, splits, params, buffers, parts.loss_fn, parts.eval_batches))
    measured = cfg.eig_iters or cfg.trace_samples or cfg.r1_steps or cfg.landscape
    if smoke and measured and not cfg.full_metrics and probe is not None:
        small = _SMOKE_METRICS
        r.say(
            f"[{r.name}] a smoke run (--synthetic, or --max_steps below one epoch): flatness at a "
            f"small size ({small['eig_iters']} Lanczos products, {small['trace_samples']} trace "
            f"probes, {small['r1_steps']} R1 steps, {small['flatness_samples']} examples at most); "
            "--full_metrics=true for the configured sizes"
        )
        r = Run(_smaller(cfg), r.name, r.stop, r.procs, r.run_dir)
        n = r.cfg.flatness_samples
        probe = (probe[0][:n], probe[1][:n])
    out.update(_flatness(r, parts.loss_fn, params, buffers, probe, parts.writer, step))
    new = {
        k: v
        for k, v in out.items()
        if k not in (last or {}) and k not in ("epoch", "step") and v is not None
    }
    tblog.scalars(parts.writer, {report.tag(k): v for k, v in new.items()}, step)
    return out


def _evaluations(r: Run, splits: dict, params, buffers, loss_fn, eval_batches) -> dict:
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


def _flatness(r: Run, loss_fn, params, buffers, probe, writer, step: int) -> dict:
    """The flatness metrics on rank 0 (the others go on to the next collective and wait there):
    first a line of what they compute and their size, then a line per metric. A signal stops them
    at the next loss evaluation."""
    from reproduce.run import tensorboard as tblog

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
        report.save_figure(figure, r.run_dir / f"landscape_step{step}.png", dpi=100)
        tblog.figure(writer, "flatness/landscape_1d", figure, step)
    r.say(f"[{r.name}] flatness done in {time.perf_counter() - began:.1f} s")
    return values
