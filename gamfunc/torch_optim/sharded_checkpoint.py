"""Sharded checkpoints of a model under ``fully_shard`` and its facade, by
``torch.distributed.checkpoint`` (DCP): each rank writes and reads its own shards, nobody gathers
the whole model.

```python
# not run in tests: needs a process group
state = {"model": model.state_dict(), "optim": opt.state_dict()}
save(state, "ckpt")                              # every rank; atomic
state = {"model": model.state_dict(), "optim": template(opt)}
load(state, "ckpt")                              # filled in place
model.load_state_dict(state["model"]); opt.load_state_dict(state["optim"])
```

DCP loads in place into a state dict of the layout it saved: `template` is the facade's
``state_dict()`` as it is after a step, every tensor allocated, before the first one. A save
writes a folder beside the target and renames it into place once every rank has written, so a
reader finds the old checkpoint or the new one, never a part of one. Resuming on the same number
of ranks gives the uninterrupted run's numbers bit for bit.

DCP traverses dicts (and lists) but writes a tuple as one pickled object, which one rank writes
for all and every rank reads back: its DTensors would come back as that rank's shards on every
rank, of other sizes where the shards are uneven, of other values always. A gamfunc base optimiser's state holds its transforms' states in a tuple, so
`save` and `load` hand DCP every tuple and list that holds a tensor as a dict keyed by position,
whose tensors each rank writes and reads as its own shards.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gamfunc.training.state import as_dict

__all__ = ["load", "save", "template"]


def template(opt) -> dict[str, Any]:
    """``opt.state_dict()`` with every tensor it holds after a step: the step state of
    ``init`` where no step was taken; with a ``torch.optim`` base optimiser without state, the
    state its ``step()`` allocates (taken with zero gradients and a zero lr, the parameters
    unchanged), as ``torch.distributed.checkpoint.state_dict`` does.

    Args:
        opt: a [`FlatnessOptimizer`][gamfunc.torch_optim.FlatnessOptimizer].

    Returns:
        A state dict for ``torch.distributed.checkpoint.load`` to fill in place.
    """
    base = opt._torch
    if base is not None and not base.state:
        held = [p for g in base.param_groups for p in g["params"]]
        grads, lrs = [p.grad for p in held], [g["lr"] for g in base.param_groups]
        for p in held:
            p.grad = torch.zeros_like(p)
        for g in base.param_groups:
            g["lr"] = torch.zeros_like(g["lr"]) if isinstance(g["lr"], torch.Tensor) else 0.0
        try:
            base.step()
        finally:
            for g, lr in zip(base.param_groups, lrs, strict=True):
                g["lr"] = lr
            for p, grad in zip(held, grads, strict=True):
                p.grad = grad
    out = opt.state_dict()
    if not out["state"]:
        out["state"] = as_dict(opt._batch_step.init(opt._params(), None))
    return out


def save(state_dict: dict[str, Any], path: str | os.PathLike, *, group=None) -> None:
    """Write ``state_dict`` (DTensors as each rank's shards) to the folder ``path``, atomically.

    Every rank writes into ``path.tmp``; after a barrier, rank 0 renames it to ``path`` (the old
    checkpoint moved aside first, then removed); a second barrier returns when it is in place.

    Args:
        state_dict: e.g. ``{"model": model.state_dict(), "optim": opt.state_dict()}``.
        path: the checkpoint's folder.
        group: the process group; the default group if None.
    """
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    tmp, old = path.with_name(path.name + ".tmp"), path.with_name(path.name + ".old")
    first = dist.get_rank(group) == 0
    if first:
        shutil.rmtree(tmp, ignore_errors=True)
    dist.barrier(group)
    dcp.save(_by_position(state_dict), checkpoint_id=str(tmp), process_group=group)
    dist.barrier(group)
    if first:
        if path.exists():
            shutil.rmtree(old, ignore_errors=True)
            path.rename(old)
        tmp.rename(path)
        shutil.rmtree(old, ignore_errors=True)
    dist.barrier(group)


def load(state_dict: dict[str, Any], path: str | os.PathLike, *, group=None) -> None:
    """Fill ``state_dict`` in place from the folder ``path`` that `save` wrote.

    Args:
        state_dict: of the layout saved (for the facade, `template`).
        path: the checkpoint's folder.
        group: the process group; the default group if None.

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    import torch.distributed.checkpoint as dcp

    if not Path(path).is_dir():
        raise FileNotFoundError(f"path: no sharded checkpoint at {path}")
    mirror = _by_position(state_dict)
    dcp.load(mirror, checkpoint_id=str(path), process_group=group)
    for k in state_dict:
        state_dict[k] = _written_back(state_dict[k], mirror[k])


def _holds_tensor(obj) -> bool:
    if isinstance(obj, torch.Tensor):
        return True
    if isinstance(obj, dict):
        return any(_holds_tensor(v) for v in obj.values())
    if isinstance(obj, tuple | list):
        return any(_holds_tensor(v) for v in obj)
    return False


def _by_position(obj):
    """``obj`` with every tuple and list that holds a tensor as a dict ``{"0": ..., "1": ...}``
    (the keys DCP gives a list it traverses), the same tensors in it: DCP traverses dicts, where it
    pickles a tuple whole."""
    if isinstance(obj, dict):
        return {k: _by_position(v) for k, v in obj.items()}
    if isinstance(obj, tuple | list) and _holds_tensor(obj):
        return {str(i): _by_position(v) for i, v in enumerate(obj)}
    return obj


def _written_back(obj, loaded):
    """``obj`` with what DCP loaded into its `_by_position` form ``loaded``: its tensors are
    ``obj``'s, filled in place; the values it read whole (numbers, lists of them) are put back,
    dicts and lists in place, tuples rebuilt."""
    if isinstance(obj, dict):
        for k in obj:
            obj[k] = _written_back(obj[k], loaded[k])
        return obj
    if isinstance(obj, tuple | list) and isinstance(loaded, dict):
        items = [_written_back(v, loaded[str(i)]) for i, v in enumerate(obj)]
        if isinstance(obj, list):
            obj[:] = items
            return obj
        return type(obj)._make(items) if hasattr(obj, "_fields") else type(obj)(items)
    return loaded
