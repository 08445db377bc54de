"""Where the caller runs among ``torch.func``'s transforms, asked of ``torch._C._functorch``; and
the forward-mode decompositions that ``torch.func.jvp`` loads.

* `in_transform`, `batched`, `batched_at_any_level`, `in_forward_ad`,
  `traced_outside_transforms` (``torch._C._functorch``): without them gamfunc cannot tell whether
  it runs inside a ``torch.func`` transform, and assumes it does. Then gradients come from
  ``torch.func.grad`` rather than ``torch.autograd.grad`` (more memory), tree math runs per tensor
  rather than through the ``torch._foreach_*`` kernels, compiled passes run eagerly, BatchNorm
  under autocast computes in float32, and the metrics' guard lets every input through.
* `load_jvp_decompositions` (``torch.autograd.forward_ad._maybe_load_decompositions``):
  without it the first ``torch.func.jvp`` loads them itself, and torch's own warning may show.

`batched`, which Dynamo traces once per tensor of every tree operation of a compiled step, finds
its internal once, at import (as does `traced_outside_transforms`); the others when called.
"""

from __future__ import annotations

import functools
import warnings

import torch

from gamfunc._compat.base import TORCH_VERSION, fall_back, functorch_attr

__all__ = [
    "batched",
    "batched_at_any_level",
    "in_forward_ad",
    "in_transform",
    "load_jvp_decompositions",
    "traced_outside_transforms",
]


def in_transform() -> bool:
    """Whether the caller runs inside a ``torch.func`` transform (grad, vjp, jvp, vmap).

    Returns:
        True inside one, and where torch cannot say (the paths that work inside a transform work
            outside too).
    """
    level = functorch_attr("maybe_current_level")
    if level is None:
        fall_back("in_transform", "torch._C._functorch.maybe_current_level", "True")
        return True
    return level() is not None


# torch.compile traces torch._C._functorch.is_batchedtensor from torch 2.5 on; before, it stops the
# graph ("torch.* op returned non-Tensor bool").
_TRACES_IS_BATCHED = TORCH_VERSION >= (2, 5)
# Dynamo folds torch._C._functorch.get_dynamic_layer_stack_depth to a constant, with a guard, and
# enters the torch.func transforms it traces on that stack (torch 2.14); torch 2.11's Dynamo skips
# the function ("marked as skipped"), and neither traces maybe_current_level.
_TRACES_LAYER_DEPTH = TORCH_VERSION >= (2, 14)
_LAYER_DEPTH = functorch_attr("get_dynamic_layer_stack_depth")


def traced_outside_transforms() -> bool:
    """Whether ``torch.compile`` traces the caller outside every ``torch.func`` transform, where no
    tensor is batched and no question need be asked of each one.

    Returns:
        True only while tracing, outside every transform, on a torch whose tracer can say so; False
            where torch cannot say (the tensors are then asked one by one).
    """
    if not (_TRACES_LAYER_DEPTH and torch.compiler.is_compiling()):
        return False
    if _LAYER_DEPTH is None:
        fall_back(
            "traced_outside_transforms",
            "torch._C._functorch.get_dynamic_layer_stack_depth",
            "False",
        )
        return False
    return _LAYER_DEPTH() == 0


_IS_BATCHED = functorch_attr("is_batchedtensor")


def batched(tensors) -> bool:
    """Whether any of ``tensors`` is batched by ``torch.func.vmap`` at its outermost level (values
    that are not tensors are passed over), asked of the tensors at once: ``torch.compile`` traces
    the question once per tensor of every tree operation in a step.

    Returns:
        True where one is, and where torch cannot say; False while ``torch.compile`` traces on
            torch < 2.5, which cannot trace the question (there a vmapped step cannot be compiled
            whole).
    """
    if not _TRACES_IS_BATCHED and torch.compiler.is_compiling():
        return False
    if _IS_BATCHED is None:
        fall_back("batched", "torch._C._functorch.is_batchedtensor", "True")
        return True
    for t in tensors:  # noqa: SIM110 (traced, a generator costs Dynamo a third more steps)
        if isinstance(t, torch.Tensor) and _IS_BATCHED(t):
            return True
    return False


def batched_at_any_level(t) -> bool:
    """Whether the tensor ``t`` is batched at any level of the transforms that wrap it (a gradient
    taken inside ``vmap`` is a batched tensor under a grad-tracking wrapper).

    Returns:
        True for such a tensor, and where torch cannot say.
    """
    wrapped, is_batched, unwrap = (
        functorch_attr(a)
        for a in ("is_functorch_wrapped_tensor", "is_batchedtensor", "get_unwrapped")
    )
    if wrapped is None or is_batched is None or unwrap is None:
        fall_back("batched_at_any_level", "torch._C._functorch's tensor wrappers", "True")
        return True
    while wrapped(t):
        if is_batched(t):
            return True
        t = unwrap(t)
    return False


def in_forward_ad() -> bool:
    """Whether a ``torch.func.jvp`` (forward-mode AD) transform is active.

    Returns:
        True inside one, and where torch cannot say.
    """
    stack_fn, kinds = functorch_attr("get_interpreter_stack"), functorch_attr("TransformType")
    jvp = getattr(kinds, "Jvp", None)
    if stack_fn is None or jvp is None:
        fall_back("in_forward_ad", "torch._C._functorch.get_interpreter_stack", "True")
        return True
    return any(i.key() == jvp for i in stack_fn() or ())


@functools.cache
def load_jvp_decompositions() -> None:
    """Load torch's forward-mode decompositions now, which the first ``torch.func.jvp`` of a process
    loads otherwise, with the one warning that gives silenced: on recent torch it calls
    ``torch.jit.script``, which warns ``torch.jit.script is deprecated`` (a ``DeprecationWarning`` on
    torch 2.13, a ``FutureWarning`` from 2.14) about code that is torch's, not the user's. Where torch
    has no such loader, the first jvp loads them."""
    load = getattr(torch.autograd.forward_ad, "_maybe_load_decompositions", None)
    if load is None:
        fall_back(
            "load_jvp_decompositions",
            "torch.autograd.forward_ad._maybe_load_decompositions",
            "the first jvp's own loading",
        )
        return
    with warnings.catch_warnings():
        for category in (DeprecationWarning, FutureWarning):
            warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*", category=category)
        load()
