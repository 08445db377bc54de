"""What gamfunc asks of ``torch.distributed``: the DTensor of ``fully_shard``'s parameters (whose
path moved in torch 2.5) and the wrappers whose hooks run around a module's autograd (FSDP2's
moved in torch 2.6), which ``torch.func.functional_call`` would bypass.
"""

from __future__ import annotations

import functools

import torch

__all__ = ["any_dtensor", "check_unhooked", "distributed_hooks", "dtensor_type", "local_pairs"]


@functools.cache
def dtensor_type() -> type | None:
    """``DTensor``, the tensor of ``fully_shard``'s parameters (``torch.distributed.tensor`` from
    torch 2.5, ``torch.distributed._tensor`` before), or None where torch has no distributed
    package."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        try:
            from torch.distributed._tensor import DTensor  # torch 2.4
        except ImportError:
            return None
    return DTensor


def local_pairs(dst: list, src: list) -> tuple[list, list]:
    """``dst`` and ``src`` with each pair of DTensors of one layout replaced by their local shards,
    which an in-place kernel without a sharding rule (``_foreach_copy_``) then writes; other
    tensors as they are."""
    cls = dtensor_type()
    if cls is None or not any(isinstance(t, cls) for t in dst):
        return dst, src
    local = lambda d, s: (  # noqa: E731
        isinstance(d, cls) and isinstance(s, cls) and d.placements == s.placements  # type: ignore[attr-defined]
    )
    pairs = [
        (d.to_local(), s.to_local()) if local(d, s) else (d, s)
        for d, s in zip(dst, src, strict=True)
    ]
    return [d for d, _ in pairs], [s for _, s in pairs]


def any_dtensor(tensors) -> bool:
    """Whether any of ``tensors`` is a DTensor (a ``fully_shard`` model's parameter, its gradient,
    its optimiser state)."""
    cls = dtensor_type()
    return cls is not None and any(isinstance(t, cls) for t in tensors)


@functools.cache
def _hook_types() -> tuple[tuple[type, str], ...]:
    """The module types that carry distributed hooks around their autograd, with their names."""
    found: list[tuple[type, str]] = [
        (torch.nn.parallel.DistributedDataParallel, "DistributedDataParallel")
    ]
    fsdp2: type | None
    try:
        from torch.distributed.fsdp import FSDPModule as fsdp2  # torch 2.6
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import FSDPModule as fsdp2  # torch 2.4, 2.5
        except ImportError:
            fsdp2 = None
    if fsdp2 is not None:
        found.append((fsdp2, "fully_shard (FSDP2)"))
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:
        pass
    else:
        found.append((FullyShardedDataParallel, "FullyShardedDataParallel"))
    return tuple(found)


def distributed_hooks(model) -> str | None:
    """The wrapper whose hooks run around ``model``'s autograd (``fully_shard``'s all-gathers and
    reduce-scatters, ``DistributedDataParallel``'s all-reduces), by name, or None."""
    if not torch.distributed.is_available():
        return None
    types = _hook_types()
    for m in model.modules():
        for cls, name in types:
            if isinstance(m, cls):
                return name
    return None


def check_unhooked(model, where: str) -> None:
    """One line, unless ``model`` carries no distributed hooks (`distributed_hooks`).

    ``torch.func.functional_call`` runs a module with other tensors in its parameters' place and
    differentiates them by ``torch.func``, outside the hooks of ``fully_shard`` and
    ``DistributedDataParallel``, which act on the module's own parameters in its autograd: the
    gradients come out wrong (under ``fully_shard``, by 0.12 on a small MLP) and nothing says so.

    Args:
        model: the module given.
        where: the call as the user wrote it, e.g. ``"functionalize(model)"``.

    Raises:
        TypeError: ``model`` or a submodule of it carries such hooks.
    """
    hooks = distributed_hooks(model)
    if hooks is None:
        return
    raise TypeError(
        f"{where}: model carries {hooks}'s hooks, which torch.func's functional_call bypasses "
        "(its gradients would be wrong, without an error): train it with gamfunc.torch_optim "
        "(GAM(model, ..., hvp='fd'), SAM(model, ...)), which runs each pass through the module's "
        "own autograd, or functionalize the unwrapped module with gamfunc.distributed"
    )
