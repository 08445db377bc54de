"""The multi-tensor kernels of ``torch.amp`` and ``torch.optim`` that torch keeps private.

* `flag_nonfinite` and `nonfinite_check_runs` (``torch._amp_foreach_non_finite_check_and_unscale_``,
  the check of ``torch.amp.GradScaler``), `overlaps` (``torch._debug_has_internal_overlap``): without
  them the step's non-finite guard checks its tensors by one ``_foreach_norm`` per group and a stack
  of their maxima, more host time per tensor.
* `group_by_device_and_dtype` (``torch.utils._foreach_utils._group_tensors_by_device_and_dtype``,
  the grouping of ``torch.optim``'s foreach steps, in C++): without it `gamfunc.tree.grouped`
  groups tensors by a Python loop, more host time per tensor.
"""

from __future__ import annotations

import functools

import torch

from gamfunc._compat.base import fall_back

__all__ = ["flag_nonfinite", "group_by_device_and_dtype", "nonfinite_check_runs", "overlaps"]


def flag_nonfinite(tensors: list, found: torch.Tensor) -> None:
    """Set ``found`` (a 1-element float32 tensor on the device of ``tensors``) to 1 where any element
    of ``tensors`` (of one dtype and device, none two elements at one address) is inf or nan, leaving
    it as it is otherwise: ``torch.amp.GradScaler``'s check, one multi-tensor kernel, with an inverse
    scale of 1, so that each element it writes back is itself, bit for bit (a nan stays a nan). Call
    it only where `nonfinite_check_runs` says it runs."""
    one = torch.ones(1, dtype=torch.float32, device=found.device)
    torch._amp_foreach_non_finite_check_and_unscale_(tensors, found, one)


@functools.cache
def nonfinite_check_runs(device_type: str) -> bool:
    """Whether `flag_nonfinite` runs on ``device_type``: on CUDA, and on the CPU where this torch has
    a kernel for it; False where it has none there, or none at all."""
    if not hasattr(torch, "_amp_foreach_non_finite_check_and_unscale_"):
        fall_back(
            "flag_nonfinite",
            "torch._amp_foreach_non_finite_check_and_unscale_",
            "one _foreach_norm per group",
        )
        return False
    try:
        flag_nonfinite([torch.ones(1, device=device_type)], torch.zeros(1, device=device_type))
    except (RuntimeError, NotImplementedError):
        return False
    return True


def overlaps(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` may sit at one address (an expanded tensor): True where torch
    cannot say."""
    check = getattr(torch, "_debug_has_internal_overlap", None)
    if check is None:
        fall_back("overlaps", "torch._debug_has_internal_overlap", "True")
        return True
    return check(t) != 0


def group_by_device_and_dtype(lists: list[list]) -> dict | None:
    """``lists`` (of tensors, one length) grouped by the device and dtype of the first list's
    tensors, by ``torch.optim``'s own grouping in C++: ``(device, dtype) -> (lists, indices)``.
    None where this torch lacks it (the caller groups them itself)."""
    try:
        from torch.utils._foreach_utils import _group_tensors_by_device_and_dtype
    except ImportError:
        fall_back(
            "group_by_device_and_dtype",
            "torch.utils._foreach_utils._group_tensors_by_device_and_dtype",
            "a Python loop",
        )
        return None
    return dict(_group_tensors_by_device_and_dtype(lists, with_indices=True))
