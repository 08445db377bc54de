"""A run's checkpoint: what it holds, how a run starts from it, and writing it.

At start-up rank 0 decides (`decide`) whether the run resumes its checkpoint, starts afresh or
is already finished, and hands its decision, with the checkpoint, to the other ranks, so that the
nodes of a job need no shared disk; `resume` turns that into the run's `Progress`.
`write_checkpoint` writes the progress (atomically): parameters, step state, the epoch's order and
position, the epoch's sums and the RNG state, all a resumed run needs to continue bit for bit.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from gamfunc.training.state import as_dict as plain
from gamfunc.training.state import from_dict
from reproduce.config import Config, as_dict
from reproduce.run import checkpoint as ckpt
from reproduce.run import report
from reproduce.run.context import Progress, Run, global_sums, zero_accum
from reproduce.run.evaluation import to
from reproduce.run.launch import from_main
from reproduce.run.records import EVALUATED, FLATNESS, RECORD_KEYS

__all__ = [
    "CHECKPOINT_FIELDS",
    "OUTPUTS",
    "UNSAVED",
    "RunLocked",
    "check_body",
    "check_loaded",
    "check_place",
    "clear",
    "decide",
    "like",
    "lock",
    "release",
    "resume",
    "write_checkpoint",
]

# What a checkpoint of this loop holds (the body `write_checkpoint` writes); one without them is refused.
CHECKPOINT_FIELDS = frozenset(
    {"config", "params", "state", "accum", "position", "data_order", "history", "best", "rng"}
)
CHECKPOINT_FIELDS |= {"finished", "status"}


class RunLocked(ckpt.CheckpointError):
    """Another process is training into the same run folder."""


def like(loaded, template, where: str = "state"):
    """``loaded`` (plain dicts, as a checkpoint holds them: `gamfunc.state.as_dict`) with the
    structure of ``template`` (a dict of tensors, or a fresh [`gamfunc.StepState`][gamfunc.StepState]) and each
    tensor on the device and in the memory layout (strides) of its counterpart there: a checkpoint
    resumes in the layout of the resuming run, whether or not the run that wrote it used
    ``channels_last``. The values are copied bit for bit.

    Raises:
        CheckpointError: names or shapes differ (the message names the entry).
    """
    try:
        loaded = from_dict(loaded, template, where)
    except ValueError as e:
        raise ckpt.CheckpointError(
            f"checkpoint does not match the model: {e}; start afresh with --overwrite"
        ) from None
    got, _ = pytree.tree_flatten_with_path(loaded)
    want = pytree.tree_leaves(template)
    for (key, a), b in zip(got, want, strict=True):
        if isinstance(b, Tensor) and a.dtype != b.dtype:
            raise ckpt.CheckpointError(
                f"checkpoint does not match the model: {where}{pytree.keystr(key)} is "
                f"{str(a.dtype).removeprefix('torch.')}; the model's is "
                f"{str(b.dtype).removeprefix('torch.')}; start afresh with --overwrite"
            )
    return pytree.tree_map(_placed, loaded, template)


def _placed(loaded, template):
    if not isinstance(template, Tensor):
        return loaded
    t = loaded.to(template.device)
    if t.stride() != template.stride():
        t = torch.empty_like(template, dtype=t.dtype).copy_(t)
    return t


def write_checkpoint(r: Run, p: Progress, finished: bool = False, status: str = "running") -> None:
    """Write ``p`` to ``r.path`` (a collective: every rank calls it; rank 0 writes, atomically, and
    records the step it saved in ``r.saved_step``)."""
    sums = global_sums(p.accum, r.procs)
    if not r.procs.main:
        return
    ckpt.save(
        r.path,
        {
            "config": as_dict(r.cfg),
            "params": to(p.params, "cpu"),
            "state": plain(to(p.state, "cpu")),
            "accum": to(sums, "cpu"),
            "position": dict(p.pos),
            "data_order": p.order,
            "history": p.history,
            "best": p.best,
            "rng": ckpt.rng_state(),
            "finished": finished,
            "status": status,
        },
    )
    (r.run_dir / UNSAVED).unlink(missing_ok=True)  # the run holds a result from here on
    r.saved_step = p.pos["global_step"]


def resume(
    r: Run, saved: dict | None, params, state, steps_per_epoch: int = 0, n_train: int = 0
) -> Progress:
    """The progress the run starts from: ``saved`` (the checkpoint body of `decide`) in the
    structure and layout of the fresh ``params`` and ``state``, with its RNG state; or, with
    ``saved`` None, the start of the first epoch, the seed set and ``config.json`` written.

    Args:
        r: the run.
        saved: the checkpoint body, or None to start afresh.
        params: the fresh parameters (the structure and layout to load into).
        state: the fresh step state.
        steps_per_epoch: the run's steps in an epoch (0: its position is not checked against it).
        n_train: its training examples (0: its data order is not checked against them).

    Returns:
        The progress to train from.

    Raises:
        CheckpointError: the checkpoint's position or data order does not fit this run's data, or
            its entries do not fit the model (the message names the entry).
    """
    cfg, procs = r.cfg, r.procs
    pos = {"epoch": 0, "batch": 0, "global_step": 0, "train_seconds": 0.0, "world": procs.world}
    pos |= {"timed_images": 0, "timed_seconds": 0.0}
    p = Progress(params, state, zero_accum(procs.device), pos, [], None, None)
    if saved is None:
        torch.manual_seed(cfg.seed)
        if procs.main:  # the mark first: a run killed before its first checkpoint is started again
            (r.run_dir / UNSAVED).touch()
            report.write_json(r.run_dir / "config.json", as_dict(cfg))
        return p
    if steps_per_epoch:
        check_place(saved, steps_per_epoch, n_train, cfg.batch_size, r.path, cfg.total_steps)
    p.params = like(saved["params"], params, "params")
    p.state = like(saved["state"], state, "state")
    check_loaded(saved, p.params, p.state, state, r.path)
    if procs.main:  # the saved sums are over all ranks: one rank carries them on
        p.accum |= to(saved["accum"], procs.device)
    p.pos, p.history, p.best = {**pos, **saved["position"]}, saved["history"], saved["best"]
    r.saved_step = p.pos["global_step"]
    p.order = saved["data_order"]
    ckpt.set_rng_state(saved["rng"])
    r.say(
        f"[{r.name}] resumed from {r.path} at epoch {p.pos['epoch']}, batch {p.pos['batch']} "
        f"(step {p.pos['global_step']})"
    )
    return p


def check_loaded(saved: dict, params, state, fresh, path: Path) -> None:
    """Check a checkpoint's parameters and step state (loaded: `like`) against its position and
    history: each of the run's steps was taken or skipped (``state.step + state.skipped`` is its
    ``global_step``, and ``state.cycle`` too with a step period above 1), the skipped ones are
    those its epoch records and sums count, every floating-point value is finite (a step never
    keeps a non-finite one), and the optimiser's hyperparameters are those the configuration
    gives (``fresh``: the step state a fresh run starts from).

    Raises:
        CheckpointError: one of them does not hold (one line naming it).
    """
    pos = saved["position"]
    step, world = pos["global_step"], pos.get("world", 1)
    for field in ("step", "skipped"):
        v = int(getattr(state, field))
        if not 0 <= v <= step:
            raise _bad(path, f"its state.{field} is {v}, not in [0, {step}] (its steps)")
    taken, skipped = int(state.step), int(state.skipped)
    if taken + skipped != step:
        raise _bad(
            path,
            f"its state.step {taken} and state.skipped {skipped} are not its global_step {step} "
            "(each step is taken or skipped)",
        )
    if isinstance(state.cycle, Tensor) and int(state.cycle) != step:
        raise _bad(path, f"its state.cycle is {int(state.cycle)}, not its global_step {step}")
    counted = sum(h["skipped_steps"] for h in saved["history"])
    counted += int(saved["accum"]["skipped"]) // (world if _count(world) and world else 1)
    if skipped != counted:
        raise _bad(
            path,
            f"its state.skipped is {skipped}, but its epoch records and sums count {counted} "
            "skipped steps",
        )
    for where, tree in (("params", params), ("state", state)):
        for key, v in pytree.tree_flatten_with_path(tree)[0]:
            if isinstance(v, Tensor) and v.is_floating_point() and not bool(v.isfinite().all()):
                raise _bad(path, f"its {where}{pytree.keystr(key)} is not finite")
    got = dict(pytree.tree_flatten_with_path(state.opt)[0])
    for key, v in pytree.tree_flatten_with_path(fresh.opt)[0]:
        is_hyper = any(getattr(k, "name", getattr(k, "key", None)) == "hyperparams" for k in key)
        if is_hyper and isinstance(v, Tensor) and not torch.equal(got[key].cpu(), v.cpu()):
            raise _bad(
                path,
                f"its state.opt{pytree.keystr(key)} is {got[key].item()!r}, not the "
                f"{v.item()!r} of its configuration",
            )


def decide(r: Run) -> tuple[str, Any, Any]:
    """Rank 0's decision, on every rank: ("resume", body), ("fresh", None), ("finished", summary)
    or ("error" | "locked", message); and rank 0's lock on the run folder (None elsewhere)."""
    decision: tuple[str, Any] = ("fresh", None)
    held = None
    if r.procs.main:
        try:
            held = lock(r.run_dir)
            saved = _prepare(r.cfg, r.name, r.path, r.procs.world)
            summary = r.summary_path
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
    return (*from_main(r.procs, decision), held)


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
        check_body(saved, cfg, path)
        ckpt.check_config(saved["config"], cfg, path)
        was = saved["position"].get("world", 1)
        if was != world:
            raise ckpt.CheckpointError(
                f"{str(path)!r} was written by {was} process(es); resume it with {was} "
                f"(torchrun --nproc_per_node and --nnodes giving WORLD_SIZE={was}), not {world}"
            )
        return saved
    if cfg.overwrite:
        clear(path.parent)
        return None
    outputs = [] if path.exists() else _outputs(path.parent)
    if outputs and (path.parent / UNSAVED).exists():  # they hold no result: train afresh
        print(
            f"[{name}] {str(path.parent)!r} holds a run stopped before its first checkpoint, "
            f"which holds no result ({', '.join(outputs)}): starting it from scratch",
            flush=True,
        )
        clear(path.parent)
        (path.parent / "best.pt").unlink(missing_ok=True)
        return None
    if outputs:  # a run trained here, its checkpoint gone: training again would replace its outputs
        raise ckpt.CheckpointError(
            f"{str(path.parent)!r} holds the outputs of a run ({', '.join(outputs)}) but no "
            "checkpoint to continue from; pass --overwrite to train it again (they are removed)"
        )
    if cfg.resume:
        print(f"[{name}] --resume: no checkpoint at {path} yet, starting afresh", flush=True)
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


def _bad(path: Path, what: str) -> ckpt.CheckpointError:
    return ckpt.CheckpointError(
        f"{str(path)!r} cannot be resumed: {what}; start afresh with --overwrite"
    )


def _count(v) -> bool:
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
        if not _count(pos.get(key)):
            raise _bad(path, f"its position {key} is {pos.get(key)!r}, not an integer >= 0")
    if pos["epoch"] > cfg.epochs:
        raise _bad(path, f"its position epoch {pos['epoch']} is past the run's {cfg.epochs} epochs")
    for key in ("train_seconds", "timed_seconds"):
        v = pos.get(key, 0.0)
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < float("inf"):
            raise _bad(path, f"its position {key} is {v!r}, not a finite number >= 0")
    if not _count(pos.get("timed_images", 0)):
        raise _bad(path, f"its position timed_images is {pos.get('timed_images')!r}")
    rng = saved["rng"]
    if not isinstance(rng, dict) or not isinstance(rng.get("torch"), torch.Tensor):
        raise _bad(path, "its RNG state is not a dict holding torch's generator state")
    try:
        torch.Generator().set_state(rng["torch"])
    except (RuntimeError, TypeError, ValueError) as e:
        raise _bad(path, f"its RNG state is not torch's ({str(e).splitlines()[0]})") from None
    cuda = rng.get("cuda", [])
    if not isinstance(cuda, list | tuple) or not all(isinstance(t, torch.Tensor) for t in cuda):
        raise _bad(path, "its CUDA RNG state is not a list of tensors")
    order = saved["data_order"]
    if order is not None and not (
        isinstance(order, torch.Tensor)
        and order.dim() == 1
        and not order.is_floating_point()
        and not order.is_complex()
        and order.dtype != torch.bool
    ):
        raise _bad(path, "its data order is not None or a 1-d tensor of example indices")
    if order is not None and order.dtype != torch.int64:
        raise _bad(path, f"its data order is {order.dtype}, not torch.int64 example indices")
    history = saved["history"]
    if not isinstance(history, list) or not all(isinstance(h, dict) for h in history):
        raise _bad(path, "its history is not a list of epoch records")
    if len(history) != pos["epoch"]:
        raise _bad(
            path, f"its history holds {len(history)} epoch records for its {pos['epoch']} epochs"
        )
    for i, h in enumerate(history):
        if h.get("epoch") != i + 1 or not _count(h.get("step")):
            raise _bad(path, f"its history record {i} is not that of epoch {i + 1}")
        _check_record(h, i, path)
    _check_best(saved["best"], pos["epoch"], path)
    _check_accum(saved["accum"], path)
    finished, status = saved["finished"], saved["status"]
    if not isinstance(finished, bool):
        raise _bad(path, f"its finished is {finished!r}, not true or false")
    if status not in STATUSES or finished != (status == "finished"):
        raise _bad(
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
        raise _bad(path, f"{where} {what}")
    inf = float("inf")
    loss, acc = h["train_loss"], h["train_acc"]
    if (loss is None) != (acc is None):
        raise _bad(path, f"{where} has train_loss {loss!r} and train_acc {acc!r}: both or neither")
    if loss is not None and not (_number(loss, -inf, inf) and math.isfinite(loss)):
        raise _bad(path, f"{where} has train_loss {loss!r}, not a finite number or None")
    for k in [*sorted(set(h) & EVALUATED), *(["train_acc"] if acc is not None else [])]:
        # an evaluation loss may overflow (inf); a NaN or a negative one is no mean of losses
        high = inf if k.endswith("_loss") else 100.0
        if not _number(h[k], 0.0, high):
            range_ = ">= 0" if high == inf else "in [0, 100]"
            raise _bad(path, f"{where} has {k} {h[k]!r}, not a number {range_}")
    for k in sorted(set(h) & FLATNESS):
        if isinstance(h[k], bool) or not isinstance(h[k], int | float):
            raise _bad(path, f"{where} has {k} {h[k]!r}, not a number")
    for k in ("skipped_steps", "skipped_estimator_steps"):
        if k in h and not _count(h[k]):
            raise _bad(path, f"{where} has {k} {h[k]!r}, not a count >= 0")
    if h.get("skipped_estimator_steps", 0) > h["skipped_steps"]:
        raise _bad(path, f"{where} has more skipped_estimator_steps than skipped_steps")


def _check_config(config, path: Path) -> None:
    """A checkpoint's configuration: a dict holding every field of `Config` (a field it lacks
    would be taken at its default, which the run that wrote it may not have had)."""
    if not isinstance(config, dict):
        raise _bad(path, f"its config is a {type(config).__name__}, not a dict of the run's fields")
    missing = sorted(set(as_dict(Config())) - set(config))
    if missing:
        raise _bad(
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
        raise _bad(path, "its best record is not None or a dict")
    if not _number(best.get("val_acc"), 0.0, 100.0):
        raise _bad(path, f"its best val_acc is {best.get('val_acc')!r}, not in [0, 100]")
    test = best.get("test_acc")
    if test is not None and not _number(test, 0.0, 100.0):
        raise _bad(path, f"its best test_acc is {test!r}, not None or in [0, 100]")
    if not (_count(best.get("epoch")) and 1 <= best["epoch"] <= epochs):
        raise _bad(path, f"its best epoch is {best.get('epoch')!r}, not one of its {epochs} epochs")


def _check_accum(accum, path: Path) -> None:
    """A checkpoint's sums of the epoch: the 0-d tensors of `zero_accum`, of its dtypes, the counts
    >= 0 (correct at most seen, the estimator's skipped steps at most all skipped), the loss
    finite."""
    want = zero_accum("cpu")
    if not isinstance(accum, dict) or set(accum) != set(want):
        got = sorted(accum) if isinstance(accum, dict) else type(accum).__name__
        raise _bad(path, f"its epoch sums (accum) have entries {got}; expected {sorted(want)}")
    for k, z in want.items():
        t = accum[k]
        if not isinstance(t, Tensor) or t.shape != z.shape or t.dtype != z.dtype:
            got = f"{t.dtype} of shape {tuple(t.shape)}" if isinstance(t, Tensor) else repr(t)
            raise _bad(path, f"its accum {k} is {got}, not a 0-d {z.dtype}")
    v = {k: t.item() for k, t in accum.items()}
    if not math.isfinite(v["loss"]):
        raise _bad(path, f"its accum loss is {v['loss']!r}, not a finite sum")
    for k in ("seen", "correct", "skipped", "skipped_estimator"):
        if v[k] < 0:
            raise _bad(path, f"its accum {k} is {v[k]}, not a count >= 0")
    if v["correct"] > v["seen"]:
        raise _bad(path, f"its accum correct {v['correct']} is more than its seen {v['seen']}")
    if v["skipped_estimator"] > v["skipped"]:
        raise _bad(path, f"its accum skipped_estimator {v['skipped_estimator']} is past skipped")


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
        raise _bad(path, f"its position batch {batch} is past the epoch's {steps_per_epoch} steps")
    epochs = saved["config"].get("epochs")
    if _count(epochs) and epoch >= epochs and batch:
        raise _bad(
            path, f"its position batch {batch} is in epoch {epoch + 1} of a {epochs}-epoch run"
        )
    if total_steps and step > total_steps:
        raise _bad(path, f"its position global_step {step} is past --total_steps={total_steps}")
    sums = {k: t.item() for k, t in saved["accum"].items()}
    if sums["seen"] > batch * batch_size:
        raise _bad(
            path, f"its accum seen {sums['seen']} is more than its {batch} batches of {batch_size}"
        )
    world = pos.get("world", 1)
    if sums["skipped"] > batch * (world if _count(world) else 1):
        raise _bad(path, f"its accum skipped {sums['skipped']} is more than its {batch} batches")
    # --total_steps ends the last epoch at its step, which the closed epoch's count passes
    if step != epoch * steps_per_epoch + batch and not (total_steps and step == total_steps):
        raise _bad(
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
            raise _bad(
                path,
                f"its history record {i} (epoch {i + 1}) is at step {h['step']}, not at its "
                f"epoch's last step {want}",
            )
        if h["skipped_steps"] > want - before:
            raise _bad(
                path,
                f"its history record {i} (epoch {i + 1}) has {h['skipped_steps']} skipped "
                f"steps, more than the epoch's {want - before}",
            )
        before = want
    if order is None:
        if batch:
            raise _bad(path, f"it stopped at batch {batch} of an epoch but holds no data order")
        return
    want = steps_per_epoch * batch_size
    if (
        len(order) != want
        or (len(order) and (int(order.min()) < 0 or int(order.max()) >= n_train))
        or len(torch.unique(order)) != len(order)
    ):
        raise _bad(
            path,
            f"its data order is not {want} distinct example indices in [0, {n_train})",
        )


# What a run writes besides its checkpoints; any of them marks the folder as a run's.
OUTPUTS = ("summary.json", "config.json", "events.out.tfevents.*", "best.pt", "*.png")
# The mark of a run started afresh that has written no checkpoint yet (written before its first
# output, removed once a checkpoint is written): its outputs hold no result, and the same command,
# or --resume, trains it again from scratch instead of refusing to replace them.
UNSAVED = ".no_checkpoint_yet"


def _outputs(run_dir: Path) -> list[str]:
    """The names of a run's outputs in ``run_dir`` (`OUTPUTS`), sorted."""
    return sorted({f.name for pattern in OUTPUTS for f in run_dir.glob(pattern)})


def clear(run_dir: Path) -> None:
    """Remove a run's outputs before ``--overwrite`` trains it again, or those of a fresh run stopped
    before its first checkpoint: TensorBoard events, configuration, summary and pictures.
    Checkpoints stay until the new run replaces them (atomically), so a new run killed early leaves
    the old one's last state."""
    for pattern in ("events.out.tfevents.*", "summary.json", "config.json", "*.png", UNSAVED):
        for f in run_dir.glob(pattern):
            f.unlink(missing_ok=True)


def lock(run_dir: Path):
    """An exclusive lock on ``run_dir`` (a ``.lock`` file, released when the process ends, or by
    `release`), or `RunLocked`."""
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


def release(held) -> None:
    """Give up the lock `lock` returned and remove its ``.lock`` file, so that a run folder keeps
    only the run's outputs. The file goes while the lock is still held: a process that opens it
    meanwhile finds it locked, and one that comes later makes a new one.

    Args:
        held: the open ``.lock`` file that `lock` returned.
    """
    Path(held.name).unlink(missing_ok=True)
    held.close()
