"""A checkpoint's body checked entry by entry against what a run writes, before a run resumes
from it: its position, RNG state, data order, history, best record and sums (`check_body`), and its
position and data order against the run's data (`check_place`); one line naming what does not fit."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import Tensor

from reproduce.config import Config, as_dict
from reproduce.run import checkpoint as ckpt
from reproduce.run.context import zero_accum
from reproduce.run.records import EVALUATED, FLATNESS, RECORD_KEYS

__all__ = ["STATUSES", "check_body", "check_place", "is_count", "refusal"]


def refusal(path: Path, what: str) -> ckpt.CheckpointError:
    """The error of a checkpoint that cannot be resumed, saying ``what`` of it does not fit."""
    return ckpt.CheckpointError(
        f"{str(path)!r} cannot be resumed: {what}; start afresh with --overwrite"
    )


def is_count(v) -> bool:
    """Whether ``v`` is a whole count (an int >= 0, not a bool)."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def check_body(saved: dict, cfg: Config, path: Path) -> None:
    """Check every entry of a checkpoint body that the run's data does not decide: its position
    (whole counts within the run), RNG state, data order, history and best record.

    Args:
        saved: the body `reproduce.run.checkpoint.load` returned.
        cfg: the configuration resuming it.
        path: the checkpoint's file, for the message.

    Raises:
        CheckpointError: an entry is malformed or out of range (one line naming it).
    """
    _check_config(saved["config"], path)
    pos = saved["position"]
    for key in ("epoch", "batch", "global_step"):
        if not is_count(pos.get(key)):
            raise refusal(path, f"its position {key} is {pos.get(key)!r}, not an integer >= 0")
    if pos["epoch"] > cfg.epochs:
        raise refusal(
            path, f"its position epoch {pos['epoch']} is past the run's {cfg.epochs} epochs"
        )
    for key in ("train_seconds", "timed_seconds"):
        v = pos.get(key, 0.0)
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < float("inf"):
            raise refusal(path, f"its position {key} is {v!r}, not a finite number >= 0")
    if not is_count(pos.get("timed_images", 0)):
        raise refusal(path, f"its position timed_images is {pos.get('timed_images')!r}")
    rng = saved["rng"]
    if not isinstance(rng, dict) or not isinstance(rng.get("torch"), torch.Tensor):
        raise refusal(path, "its RNG state is not a dict holding torch's generator state")
    try:
        torch.Generator().set_state(rng["torch"])
    except (RuntimeError, TypeError, ValueError) as e:
        raise refusal(path, f"its RNG state is not torch's ({str(e).splitlines()[0]})") from None
    cuda = rng.get("cuda", [])
    if not isinstance(cuda, list | tuple) or not all(isinstance(t, torch.Tensor) for t in cuda):
        raise refusal(path, "its CUDA RNG state is not a list of tensors")
    order = saved["data_order"]
    if order is not None and not (
        isinstance(order, torch.Tensor)
        and order.dim() == 1
        and not order.is_floating_point()
        and not order.is_complex()
        and order.dtype != torch.bool
    ):
        raise refusal(path, "its data order is not None or a 1-d tensor of example indices")
    if order is not None and order.dtype != torch.int64:
        raise refusal(path, f"its data order is {order.dtype}, not torch.int64 example indices")
    history = saved["history"]
    if not isinstance(history, list) or not all(isinstance(h, dict) for h in history):
        raise refusal(path, "its history is not a list of epoch records")
    if len(history) != pos["epoch"]:
        raise refusal(
            path, f"its history holds {len(history)} epoch records for its {pos['epoch']} epochs"
        )
    for i, h in enumerate(history):
        if h.get("epoch") != i + 1 or not is_count(h.get("step")):
            raise refusal(path, f"its history record {i} is not that of epoch {i + 1}")
        _check_record(h, i, path)
    _check_best(saved["best"], pos["epoch"], path)
    _check_accum(saved["accum"], path)
    finished, status = saved["finished"], saved["status"]
    if not isinstance(finished, bool):
        raise refusal(path, f"its finished is {finished!r}, not true or false")
    if status not in STATUSES or finished != (status == "finished"):
        raise refusal(
            path,
            f"its status is {status!r} (finished {finished}), not one of {', '.join(STATUSES)} "
            "(finished exactly when its status is)",
        )


# The statuses a checkpoint of this loop holds (`write_checkpoint`'s ``status``).
STATUSES = ("running", "interrupted", "max_steps", "diverged", "finished")


def _number(v, low: float, high: float) -> bool:
    return not isinstance(v, bool) and isinstance(v, int | float) and low <= v <= high


def _check_record(h: dict, i: int, path: Path) -> None:
    """An epoch's record as `reproduce.run.records.end_of_epoch` writes it: its keys (`RECORD_KEYS`
    and the optional ones), the mean loss finite (None with the accuracy when every step was
    skipped), accuracies in [0, 100], evaluation losses >= 0, flatness metrics numbers (NaN where
    unmeasurable), counts of skipped steps >= 0 (the estimator's at most all)."""
    where = f"its history record {i} (epoch {i + 1})"
    unknown = sorted(set(h) - RECORD_KEYS - EVALUATED - FLATNESS - {"skipped_estimator_steps"})
    missing = sorted(RECORD_KEYS - set(h))
    if unknown or missing:
        what = f"has entries a run never writes ({', '.join(map(str, unknown))})" if unknown else ""
        what = what or f"lacks {', '.join(missing)}"
        raise refusal(path, f"{where} {what}")
    inf = float("inf")
    loss, acc = h["train_loss"], h["train_acc"]
    if (loss is None) != (acc is None):
        raise refusal(
            path, f"{where} has train_loss {loss!r} and train_acc {acc!r}: both or neither"
        )
    if loss is not None and not (_number(loss, -inf, inf) and math.isfinite(loss)):
        raise refusal(path, f"{where} has train_loss {loss!r}, not a finite number or None")
    for k in [*sorted(set(h) & EVALUATED), *(["train_acc"] if acc is not None else [])]:
        # an evaluation loss may overflow (inf); a NaN or a negative one is no mean of losses
        high = inf if k.endswith("_loss") else 100.0
        if not _number(h[k], 0.0, high):
            range_ = ">= 0" if high == inf else "in [0, 100]"
            raise refusal(path, f"{where} has {k} {h[k]!r}, not a number {range_}")
    for k in sorted(set(h) & FLATNESS):
        if isinstance(h[k], bool) or not isinstance(h[k], int | float):
            raise refusal(path, f"{where} has {k} {h[k]!r}, not a number")
    for k in ("skipped_steps", "skipped_estimator_steps"):
        if k in h and not is_count(h[k]):
            raise refusal(path, f"{where} has {k} {h[k]!r}, not a count >= 0")
    if h.get("skipped_estimator_steps", 0) > h["skipped_steps"]:
        raise refusal(path, f"{where} has more skipped_estimator_steps than skipped_steps")


def _check_config(config, path: Path) -> None:
    """A checkpoint's configuration: a dict holding every field of `Config` (a field it lacks
    would be taken at its default, which the run that wrote it may not have had)."""
    if not isinstance(config, dict):
        raise refusal(
            path, f"its config is a {type(config).__name__}, not a dict of the run's fields"
        )
    missing = sorted(set(as_dict(Config())) - set(config))
    if missing:
        raise refusal(
            path,
            f"its config lacks {', '.join(missing)} (edited, or written by another version of "
            "reproduce/train.py)",
        )


def _check_best(best, epochs: int, path: Path) -> None:
    """A checkpoint's best validation record: None, or the accuracy (finite, in [0, 100]) of one of
    its closed epochs, with that epoch's test accuracy."""
    if best is None:
        return
    if not isinstance(best, dict):
        raise refusal(path, "its best record is not None or a dict")
    if not _number(best.get("val_acc"), 0.0, 100.0):
        raise refusal(path, f"its best val_acc is {best.get('val_acc')!r}, not in [0, 100]")
    test = best.get("test_acc")
    if test is not None and not _number(test, 0.0, 100.0):
        raise refusal(path, f"its best test_acc is {test!r}, not None or in [0, 100]")
    if not (is_count(best.get("epoch")) and 1 <= best["epoch"] <= epochs):
        raise refusal(
            path, f"its best epoch is {best.get('epoch')!r}, not one of its {epochs} epochs"
        )


def _check_accum(accum, path: Path) -> None:
    """A checkpoint's sums of the epoch: the 0-d tensors of `zero_accum`, of its dtypes, the counts
    >= 0 (correct at most seen, the estimator's skipped steps at most all skipped), the loss
    finite."""
    want = zero_accum("cpu")
    if not isinstance(accum, dict) or set(accum) != set(want):
        got = sorted(accum) if isinstance(accum, dict) else type(accum).__name__
        raise refusal(path, f"its epoch sums (accum) have entries {got}; expected {sorted(want)}")
    for k, z in want.items():
        t = accum[k]
        if not isinstance(t, Tensor) or t.shape != z.shape or t.dtype != z.dtype:
            got = f"{t.dtype} of shape {tuple(t.shape)}" if isinstance(t, Tensor) else repr(t)
            raise refusal(path, f"its accum {k} is {got}, not a 0-d {z.dtype}")
    v = {k: t.item() for k, t in accum.items()}
    if not math.isfinite(v["loss"]):
        raise refusal(path, f"its accum loss is {v['loss']!r}, not a finite sum")
    for k in ("seen", "correct", "skipped", "skipped_estimator"):
        if v[k] < 0:
            raise refusal(path, f"its accum {k} is {v[k]}, not a count >= 0")
    if v["correct"] > v["seen"]:
        raise refusal(path, f"its accum correct {v['correct']} is more than its seen {v['seen']}")
    if v["skipped_estimator"] > v["skipped"]:
        raise refusal(path, f"its accum skipped_estimator {v['skipped_estimator']} is past skipped")


def check_place(
    saved: dict, steps_per_epoch: int, n_train: int, batch_size: int, path, total_steps: int = 0
) -> None:
    """Check a checkpoint's position and data order against the run's data: the batch within the
    epoch, the step count that the epoch and batch make, and the order a permutation of example
    indices of the epoch's length.

    Args:
        saved: a checkpoint body that `check_body` accepted.
        steps_per_epoch: the run's steps in an epoch.
        n_train: its training examples.
        batch_size: its global batch.
        path: the checkpoint's file, for the message.
        total_steps: its ``--total_steps`` (0: none).

    Raises:
        CheckpointError: the position or the order does not fit (one line naming it).
    """
    pos, order = saved["position"], saved["data_order"]
    epoch, batch, step = pos["epoch"], pos["batch"], pos["global_step"]
    if batch > steps_per_epoch:  # at the epoch's length: --max_steps stopped it before it closed
        raise refusal(
            path, f"its position batch {batch} is past the epoch's {steps_per_epoch} steps"
        )
    epochs = saved["config"].get("epochs")
    if is_count(epochs) and epoch >= epochs and batch:
        raise refusal(
            path, f"its position batch {batch} is in epoch {epoch + 1} of a {epochs}-epoch run"
        )
    if total_steps and step > total_steps:
        raise refusal(path, f"its position global_step {step} is past --total_steps={total_steps}")
    sums = {k: t.item() for k, t in saved["accum"].items()}
    if sums["seen"] > batch * batch_size:
        raise refusal(
            path, f"its accum seen {sums['seen']} is more than its {batch} batches of {batch_size}"
        )
    world = pos.get("world", 1)
    if sums["skipped"] > batch * (world if is_count(world) else 1):
        raise refusal(path, f"its accum skipped {sums['skipped']} is more than its {batch} batches")
    # --total_steps ends the last epoch at its step, which the closed epoch's count passes
    if step != epoch * steps_per_epoch + batch and not (total_steps and step == total_steps):
        raise refusal(
            path,
            f"its position global_step {step} is not epoch {epoch} × {steps_per_epoch} steps + "
            f"batch {batch}",
        )
    before = 0
    for i, h in enumerate(saved["history"]):  # each closed epoch's record, at its last step
        want = (i + 1) * steps_per_epoch
        if total_steps and want > total_steps:  # --total_steps closed it early
            want = total_steps
        if h["step"] != want:
            raise refusal(
                path,
                f"its history record {i} (epoch {i + 1}) is at step {h['step']}, not at its "
                f"epoch's last step {want}",
            )
        if h["skipped_steps"] > want - before:
            raise refusal(
                path,
                f"its history record {i} (epoch {i + 1}) has {h['skipped_steps']} skipped "
                f"steps, more than the epoch's {want - before}",
            )
        before = want
    if order is None:
        if batch:
            raise refusal(path, f"it stopped at batch {batch} of an epoch but holds no data order")
        return
    want = steps_per_epoch * batch_size
    if (
        len(order) != want
        or (len(order) and (int(order.min()) < 0 or int(order.max()) >= n_train))
        or len(torch.unique(order)) != len(order)
    ):
        raise refusal(
            path,
            f"its data order is not {want} distinct example indices in [0, {n_train})",
        )
