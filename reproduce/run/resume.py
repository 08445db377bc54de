"""A run's checkpoint: what it holds, how a run starts from it, and writing it.

At start-up rank 0 decides (`decide`) whether the run resumes its checkpoint, starts afresh or
is already finished, and hands its decision, with the checkpoint, to the other ranks, so that the
nodes of a job need no shared disk; `resume` turns that into the run's `Progress`.
`write_checkpoint` writes the progress (atomically): parameters, step state, the epoch's order and
position, the epoch's sums and the RNG state, all a resumed run needs to continue bit for bit.
"""

from __future__ import annotations

import json
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
from reproduce.run.checkpoint_body import check_body, check_place, is_count, refusal
from reproduce.run.context import Progress, Run, global_sums, zero_accum
from reproduce.run.evaluation import to
from reproduce.run.launch import from_main

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
            raise refusal(path, f"its state.{field} is {v}, not in [0, {step}] (its steps)")
    taken, skipped = int(state.step), int(state.skipped)
    if taken + skipped != step:
        raise refusal(
            path,
            f"its state.step {taken} and state.skipped {skipped} are not its global_step {step} "
            "(each step is taken or skipped)",
        )
    if isinstance(state.cycle, Tensor) and int(state.cycle) != step:
        raise refusal(path, f"its state.cycle is {int(state.cycle)}, not its global_step {step}")
    counted = sum(h["skipped_steps"] for h in saved["history"])
    counted += int(saved["accum"]["skipped"]) // (world if is_count(world) and world else 1)
    if skipped != counted:
        raise refusal(
            path,
            f"its state.skipped is {skipped}, but its epoch records and sums count {counted} "
            "skipped steps",
        )
    for where, tree in (("params", params), ("state", state)):
        for key, v in pytree.tree_flatten_with_path(tree)[0]:
            if isinstance(v, Tensor) and v.is_floating_point() and not bool(v.isfinite().all()):
                raise refusal(path, f"its {where}{pytree.keystr(key)} is not finite")
    got = dict(pytree.tree_flatten_with_path(state.opt)[0])
    for key, v in pytree.tree_flatten_with_path(fresh.opt)[0]:
        is_hyper = any(getattr(k, "name", getattr(k, "key", None)) == "hyperparams" for k in key)
        if is_hyper and isinstance(v, Tensor) and not torch.equal(got[key].cpu(), v.cpu()):
            raise refusal(
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
