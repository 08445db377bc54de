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
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gamfunc.state import as_dict

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
    dcp.save(state_dict, checkpoint_id=str(tmp), process_group=group)
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
    dcp.load(state_dict, checkpoint_id=str(path), process_group=group)
