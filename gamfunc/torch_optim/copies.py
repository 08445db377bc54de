"""Copies that the facade keeps from step to step: the tensors of a ``torch.optim`` optimiser's
state, the parameters' copies, the buffers a pass writes. Only the facade knows when the last
copies are no longer read, so only it may write new values into them instead of allocating."""

from __future__ import annotations

import torch
from torch import Tensor

from gamfunc._compat import local_pairs
from gamfunc.tree import copies, grouped

__all__ = ["copy_into", "recopy"]


def copy_into(dst: list[Tensor], src: list[Tensor]) -> None:
    """``dst[i].copy_(src[i])`` for every i, as one ``_foreach_copy_`` per device and dtype of
    ``dst`` (a list that mixes them would take ``_foreach``'s slow path, a kernel per tensor).

    Args:
        dst: the tensors written.
        src: the tensors read, one per ``dst``.
    """
    if len(dst) != len(src):
        raise ValueError(f"copy_into: {len(dst)} tensors to write, {len(src)} to read")
    dst, src = local_pairs(dst, src)
    for (into, out), _ in grouped(dst, src).values():
        torch._foreach_copy_(into, out)


def recopy(kept: list[Tensor], tensors: list[Tensor], sources: list[Tensor]) -> list[Tensor]:
    """Copies of ``tensors``, written into ``kept`` where it can hold them, new tensors otherwise.

    ``kept`` holds copies of ``sources`` made earlier (by `copies` or by this function) that nothing
    reads any more. Where ``tensors`` are the very tensors of ``sources`` (a module's buffers, an
    optimiser's state, from one step to the next), or have, tensor for tensor, their shapes,
    strides, dtypes and devices, the copies are written into ``kept`` by `copy_into`, and nothing
    is allocated: one kernel per dtype, where `copies` also makes a tensor for each.

    Args:
        kept: earlier copies, overwritten where they can hold the new ones.
        tensors: the tensors to copy.
        sources: the tensors ``kept`` copied.

    Returns:
        ``kept`` itself, holding the copies, or new tensors.
    """
    if _same_layout(kept, tensors, sources):
        copy_into(kept, tensors)
        return kept
    return copies(tensors)


def _same_layout(kept: list[Tensor], tensors: list[Tensor], sources: list[Tensor]) -> bool:
    """Whether ``kept``, copies of ``sources``, can hold copies of ``tensors``."""
    if len(kept) != len(tensors):
        return False
    if len(sources) == len(tensors) and all(t is s for t, s in zip(tensors, sources, strict=True)):
        return True
    return all(
        k.shape == t.shape
        and k.stride() == t.stride()
        and k.dtype == t.dtype
        and k.device == t.device
        for k, t in zip(kept, tensors, strict=True)
    )
