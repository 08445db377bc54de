"""A step state loaded from a ``state_dict``, restored onto a fresh one: each tensor copied in the
dtype and on the device of the fresh state's, a count refused where it holds no integer."""

from __future__ import annotations

from torch import Tensor
from torch.utils import _pytree as pytree

__all__ = ["check_kinds", "placed", "restore"]


def restore(saved, reference):
    """``saved`` (a step state read from a ``state_dict``) with each tensor copied in the dtype and
    on the device of its ``reference`` (a fresh state's), after `check_kinds`."""
    check_kinds(saved, reference)
    return pytree.tree_map(placed, saved, reference)


def check_kinds(saved, reference) -> None:
    """A saved tensor where the fresh state keeps an integer one (a count: ``step``, ``skipped``)
    must hold integers: a float one (``skipped = 1.5``) would be cast to another count without a
    word. Floating tensors may change their precision, as ``torch.optim`` casts its state to the
    parameters' dtype.

    Raises:
        ValueError: naming the entry.
    """
    got, _ = pytree.tree_flatten_with_path(saved)
    for (key, a), b in zip(got, pytree.tree_leaves(reference), strict=True):
        if not (isinstance(a, Tensor) and isinstance(b, Tensor)):
            continue
        if not (b.is_floating_point() or b.is_complex()) and (
            a.is_floating_point() or a.is_complex()
        ):
            shown = a.item() if a.numel() == 1 else f"a {tuple(a.shape)} tensor"
            raise ValueError(
                f"state_dict state{pytree.keystr(key)} is {str(a.dtype).removeprefix('torch.')} "
                f"({shown}), where the step keeps an integer count "
                f"({str(b.dtype).removeprefix('torch.')}); load a state_dict() that the optimiser saved"
            )


def placed(saved, reference):
    """A saved tensor as a copy in the dtype and on the device of its ``reference`` (a fresh state's)."""
    if isinstance(reference, Tensor):
        return saved.to(device=reference.device, dtype=reference.dtype, copy=True)
    return saved
