"""Lists of tensors as ``torch._foreach_*`` kernels take them, and when to take them at all.

The machinery under [`gamfunc.tree`][gamfunc.tree]'s math, which re-exports these names: tensors
grouped by device and dtype (`grouped`), exact copies (`copies`) and bitwise selects (`selects`) in a
few kernels, every tensor of a nest (`tensors`), a factor cast once for a product (`scalar_like`),
and whether the per-tensor forms must run instead (`per_tensor`, `vmapped`): traced, inside a
``torch.func`` transform (foreach kernels have no batching rule), or where autograd records.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from gamfunc._compat import (
    batched,
    batched_at_any_level,
    group_by_device_and_dtype,
    in_transform,
    traced_outside_transforms,
)

Scalar = float | Tensor

__all__ = [
    "copies",
    "grouped",
    "per_tensor",
    "scalar_like",
    "selects",
    "tensors",
    "vmapped",
]


def per_tensor(tensors) -> bool:
    """Whether `clone` and `selects` take their per-tensor form: traced (``torch.compile`` fuses
    it), inside a ``torch.func`` transform (foreach kernels have no batching rule), or where
    autograd records (the bit views of `selects` are not differentiable).

    Args:
        tensors: the tensors about to be copied or selected.

    Returns:
        True for a tensor at a time, False for the foreach kernels.
    """
    return (
        torch.compiler.is_compiling()
        or in_transform()
        or (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
    )


def copies(tensors: list[Tensor]) -> list[Tensor]:
    """New tensors equal to ``tensors``, strides kept: ``torch._foreach_mul(group, 1)`` per dtype
    and device (exact; a list that mixes them would take ``_foreach``'s slow path, a kernel per
    tensor), a clone for a boolean tensor (no foreach kernel takes it).

    Args:
        tensors: the tensors to copy.

    Returns:
        Their copies, in order.
    """
    out = list(tensors)
    for (_, dtype), ((group,), at) in grouped(out).items():
        new = [t.clone() for t in group] if dtype == torch.bool else torch._foreach_mul(group, 1)
        for i, t in zip(at, new, strict=True):
            out[i] = t
    return out


def grouped(first: list[Tensor], *others: list[Tensor]) -> dict[tuple, tuple[list, list[int]]]:
    """The tensors of ``first`` and ``others`` (lists of one length) grouped by the device and
    dtype of ``first``'s, as foreach kernels take them: ``(device, dtype) -> (lists, indices)``,
    ``lists`` holding each list's tensors of the group, ``indices`` their places.

    Eager, ``torch.optim``'s own grouping in C++ (`gamfunc._compat.group_by_device_and_dtype`), a
    fraction of a Python loop's cost per tensor; traced, that loop.

    Args:
        first: the tensors whose device and dtype group them.
        *others: tensors at the same places, which go with them.

    Returns:
        The groups.
    """
    lists = [list(first), *(list(o) for o in others)]
    if not lists[0]:
        return {}
    if not torch.compiler.is_compiling() and (found := group_by_device_and_dtype(lists)):
        return found
    groups: dict[tuple, tuple[list, list[int]]] = {}
    for i, t in enumerate(lists[0]):
        members, at = groups.setdefault((t.device, t.dtype), ([[] for _ in lists], []))
        for m, ts in zip(members, lists, strict=True):
            m.append(ts[i])
        at.append(i)
    return groups


# The integer dtype of each element width: a tensor seen as integers of its width (``view``).
_WIDTHS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def selects(cond: Tensor, new: list[Tensor], old: list[Tensor]) -> list[Tensor]:
    """``[torch.where(cond, n, o) for n, o in zip(new, old)]``, bit for bit, for a 0-d boolean
    ``cond``.

    Eager, with three foreach kernels per element width and device where ``torch.where`` takes a
    kernel per tensor (a ResNet-50 step selects 480 parameter, state and buffer tensors): each
    tensor is seen as integers of its width (``Tensor.view(dtype)``, no copy) and the result is
    ``n·c + o·(1 − c)`` with c = 1 where ``cond`` holds, else 0. A product of integers by 0 is 0
    whatever the bits, a NaN's too, which a float product would keep; the other term is the chosen
    tensor's bits. Traced, inside a ``torch.func`` transform, or where autograd records, a
    ``torch.where`` per tensor (a pair of other dtypes or shapes, too).

    Args:
        cond: a 0-d boolean tensor.
        new: the tensors taken where ``cond`` is True.
        old: the tensors taken where it is False, one per ``new``.

    Returns:
        New tensors, one per pair.
    """
    if len(new) != len(old):
        raise ValueError(f"selects needs one old tensor per new one; got {len(new)} and {len(old)}")
    if per_tensor((*new, *old)):
        return [torch.where(cond.to(n.device), n, o) for n, o in zip(new, old, strict=True)]
    out: list = [None] * len(new)
    groups: dict[tuple, list[int]] = {}
    for i, (n, o) in enumerate(zip(new, old, strict=True)):
        width = _WIDTHS.get(n.element_size())
        if width is None or n.dtype != o.dtype or n.shape != o.shape or n.device != o.device:
            out[i] = torch.where(cond.to(n.device), n, o)
        else:
            groups.setdefault((n.device, width), []).append(i)
    for (device, width), group in groups.items():
        take = cond.to(device=device, dtype=width)
        chosen = torch._foreach_mul([new[i].view(width) for i in group], take)
        torch._foreach_add_(
            chosen, torch._foreach_mul([old[i].view(width) for i in group], 1 - take)
        )
        for i, bits in zip(group, chosen, strict=True):
            out[i] = bits.view(new[i].dtype)
    return out


def tensors(nest) -> list[Tensor]:
    """Every tensor in ``nest``: its dicts, lists and tuples (NamedTuple states included) walked
    here, any other node registered with ``torch.utils._pytree`` through it; values that are not
    tensors are left out. The order is not pytree's.

    A step's guard looks at every tensor of the new parameters and optimiser state. The pytree walk
    costs a few microseconds of Python per tensor; this one a fraction of it.

    Args:
        nest: a tensor, or a nest of containers holding tensors.

    Returns:
        The tensors, each once per place it holds.
    """
    out, todo = [], [nest]
    eager = not torch.compiler.is_compiling()
    while todo:
        x = todo.pop()
        if isinstance(x, Tensor):
            out.append(x)
        elif isinstance(x, (dict, list, tuple)):
            items = x.values() if isinstance(x, dict) else x
            # eager, a container of plain tensors (a step's parameters, a state's list) at once
            plain = eager and {type(v) for v in items} <= _PLAIN
            (out if plain else todo).extend(items)
        elif type(x) in pytree.SUPPORTED_NODES:
            out.extend(t for t in pytree.tree_leaves(x) if isinstance(t, Tensor))
    return out


_PLAIN = {Tensor}


def vmapped(tensors: list) -> bool:
    """Whether any of ``tensors`` is batched by ``torch.func.vmap`` (at any level of the transforms
    around it). Eager and outside every torch.func transform nothing is, and one call says so
    without a look at each tensor."""
    if torch.compiler.is_compiling():  # traced: wrappers are not unwrapped, the outer one says
        if traced_outside_transforms():  # the tree math between a step's passes
            return False
        return batched(tensors)
    if not in_transform():
        return False
    return any(isinstance(t, Tensor) and batched_at_any_level(t) for t in tensors)


def scalar_like(s: Scalar, leaves: list[Tensor]) -> Scalar:
    """The factor ``s`` for a ``torch._foreach_*`` product with ``leaves``, cast once to their dtype
    where they all share float32 or float64.

    The product is the same: those kernels compute in the leaves' dtype, so type promotion casts a 0-d
    factor to it anyway, once per leaf. A Python number becomes such a 0-d tensor only on the CPU when
    eager, where the foreach kernels run leaf by leaf and would wrap the number once per leaf.
    Half-precision kernels compute in float32 with the factor unrounded, so there ``s`` is left as it is.

    Args:
        s: the factor, a Python number or a 0-d tensor.
        leaves: the tensors that ``s`` multiplies.

    Returns:
        Where the leaves all share float32 or float64, a floating-point tensor ``s`` (or a Python
            number, on the CPU when eager) as a 0-d tensor of their dtype; else ``s`` itself.
    """
    if not leaves:
        return s
    dtype = leaves[0].dtype
    if isinstance(s, Tensor) and (s.dtype == dtype or not s.is_floating_point()):
        return s
    if dtype not in (torch.float32, torch.float64) or any(v.dtype != dtype for v in leaves):
        return s
    if isinstance(s, Tensor):
        return s.to(dtype)
    if isinstance(s, int | float) and leaves[0].is_cpu and not torch.compiler.is_compiling():
        return torch.tensor(s, dtype=dtype)
    return s
