"""Compile any function: inductor options, CUDA-graph results copied out, a code object per function.

These helpers know nothing of steps or losses. `gamfunc.Step.compile` calls them for a whole
step (``scope="step"``) and [`gamfunc.regional.compile_passes`][gamfunc.wrappers.regional.compile_passes] for each differentiation pass
(``scope="pass"``).
"""

from __future__ import annotations

import types
from collections.abc import Callable

import torch
from torch import Tensor

from gamfunc._compat import TORCH_VERSION, cacheable_state_calls, mode_options
from gamfunc.compiling.graph_sharing import share_equal_work_pass
from gamfunc.tree import copies

__all__ = ["INDUCTOR_WORKAROUNDS", "compile_with", "cudagraph_safe", "fresh", "fresh_copies"]


def compile_with(fullgraph: bool, mode: str | None, kwargs: dict) -> Callable[[Callable], Callable]:
    """``fn -> torch.compile(fn, fullgraph=fullgraph, mode/options..., **kwargs)``, inductor's options
    with `INDUCTOR_WORKAROUNDS`, the state calls of H·v passes cacheable by AOTAutograd
    (`gamfunc._compat.cacheable_state_calls`), equal work computed once (`gamfunc.graph_sharing`, unless
    the options name a ``post_grad_custom_pre_pass`` of their own), and each CUDA-graph result copied
    out (`cudagraph_safe`)."""
    kwargs = dict(kwargs)
    kwargs.setdefault("backend", "inductor")
    if kwargs["backend"] == "inductor":
        options = dict(kwargs.pop("options", None) or {})
        if mode is not None:
            options = {**mode_options(mode), **options}
        options.update(INDUCTOR_WORKAROUNDS)
        for key, names in cacheable_state_calls().items():
            options[key] = {**names, **options.get(key, {})}
        if (sharing := share_equal_work_pass()) is not None:
            options.setdefault("post_grad_custom_pre_pass", sharing)
        kwargs["options"] = options
    elif mode is not None:
        kwargs["mode"] = mode
    graphs = bool(kwargs.get("options", {}).get("triton.cudagraphs")) or mode == "reduce-overhead"

    def compile_fn(fn):
        compiled = torch.compile(fn, fullgraph=fullgraph, **kwargs)
        return cudagraph_safe(compiled) if graphs else compiled

    return compile_fn


def cudagraph_safe(fn):
    """A CUDA-graph function (a step or a pass) whose results outlive the next replay.

    CUDA-graph trees reuse one memory pool: the outputs of a replay are overwritten by later replays.
    A functional loop keeps its params and state from step to step (and a second branch, another
    step or another pass may replay in between), so each result is copied out of the pool, with one
    ``_foreach`` kernel per dtype, which costs a read and a write of the state per step.
    """

    def call(*args):
        torch.compiler.cudagraph_mark_step_begin()
        leaves, spec = torch.utils._pytree.tree_flatten(fn(*args))
        return torch.utils._pytree.tree_unflatten(fresh_copies(leaves), spec)

    return call


def fresh_copies(leaves: list) -> list:
    """``leaves`` with each CUDA tensor replaced by a copy of its own (`gamfunc.tree.copies`: one
    ``_foreach`` kernel per dtype and device); anything else as it is."""
    out = list(leaves)
    on_gpu = [i for i, t in enumerate(out) if isinstance(t, Tensor) and t.is_cuda]
    for i, t in zip(on_gpu, copies([out[i] for i in on_gpu]), strict=True):
        out[i] = t
    return out


def fresh(fn):
    """A copy of ``fn`` with a code object of its own.

    torch.compile keeps its cache, and its recompile limit (8 by default), per code object. Without
    this every step (or pass) made in a process would share one function's code, and the ninth one
    compiled with ``fullgraph=True`` would fail with "recompile limit exceeded". Inside a function
    being compiled (a step made in a compiled region, as [`gamfunc.ensemble`][gamfunc.training.ensemble] makes one per
    trace), ``fn`` itself: it is traced, not cached.
    """
    if torch.compiler.is_compiling():
        return fn
    code = fn.__code__.replace()
    return types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def loop_reordering_asserts() -> bool:
    """Whether this torch has inductor's loop-reordering assertion (fixed in 2.14)."""
    return TORCH_VERSION < (2, 14)


INDUCTOR_WORKAROUNDS = {"loop_ordering_after_fusion": False} if loop_reordering_asserts() else {}
"""Inductor options every `compile_with` sets: on torch < 2.14, loop reordering off
(pytorch/pytorch#176591, fixed by #176849), see `gamfunc.Step.compile`."""
