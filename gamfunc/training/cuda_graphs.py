"""A whole step replayed as a CUDA graph: the host's work per step becomes a few copies and a replay.

A step compiled by pass (``scope="pass"``), and any step under [`gamfunc.distributed`][gamfunc.wrappers.distributed], runs its
update, its non-finite guard and its all-reduces eagerly around the compiled passes: hundreds of
small kernels per step, each launched by the host. On ResNet-50 that host work takes longer than the
GPU's (benchmarks/RESULTS.md, "Data-parallel scaling against DDP"), so the GPU waits, and under data parallel each rank
waits at every all-reduce for the rank whose host was slowest. [`cuda_graph`][gamfunc.training.cuda_graphs.cuda_graph] captures each branch
of the step once (compiled passes, eager update, guard and NCCL all-reduces alike; NCCL allows its
collectives in a graph) and replays it, so that one launch runs the whole step.

A capture fixes the step's shapes and its Python control flow: it is made per input signature (tree
structure, shapes, dtypes, strides) after ``warmup`` eager calls of that signature, which compile
whatever the step compiles and let NCCL and cuBLAS set up outside the capture. Each replay copies the
batch in and the results out, so the function stays pure: the caller's tensors are never written, and
the tensors it returns are its own. Parameters and state that the caller passes back unchanged (the
same tensors, not modified in place since: their version counters say so) are not copied in again;
the graph itself writes its new parameters and state into its inputs.

A step whose ``when`` policy chooses on the device ([`gamfunc.when.adaptive`][gamfunc.training.when.adaptive])
is three graphs: its probe (the pass at θ and the policy's choice), then one boolean read on the host
(the one synchronisation a step that the policy needs, graphed or not), then the chosen branch's graph,
which takes the probe's pass as an input.

Under ``torch.distributed`` with NCCL, [`release`][gamfunc.training.cuda_graphs.release] the step's graphs before
``destroy_process_group()``: NCCL cannot destroy a communicator that a live graph still holds, and
that call would hang (pytorch/pytorch#115388).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from gamfunc.checks import check_int
from gamfunc.compiling.compile import fresh_copies
from gamfunc.training.step import Step

__all__ = ["cuda_graph", "release"]


def cuda_graph(step: Step, *, warmup: int = 3) -> Step:
    """``step`` with each of its branches replayed as a CUDA graph (see the module's docstring).

    Args:
        step: a [`gamfunc.make_step`][gamfunc.make_step] step, eager or compiled without CUDA graphs of its own
            (``step.compile(scope="pass")``, or ``scope="step"`` with the default mode); data parallel
            or not. Every tensor it is given must be on one CUDA device.
        warmup: eager calls of each input signature before its capture (at least 1).

    Returns:
        A step of the same configuration; ``init`` is the original's. Under NCCL, [`release`][gamfunc.training.cuda_graphs.release]
            it before ``destroy_process_group()``.

    Raises:
        ValueError: ``warmup`` < 1, or ``step`` was made with ``on_nonfinite="raise"`` (which reads
            the loss on the host at every step); at a call, a tensor not on a CUDA device.
        RuntimeError: the capture failed; the message says what a step captured in a graph must not
            do (read a value on the host, copy from the host, nest another CUDA graph).

    Example (on a GPU):

    ```python
    step = gamfunc.make_step(gamfunc.gam(0.05, 0.1, hvp="fd"), gamfunc.sgd(0.1), loss_fn)
    step = gamfunc.cuda_graph(step.compile(scope="pass"))
    state = step.init(params, buffers)
    for batch in loader:  # drop_last=True: a new batch shape is a new capture
        params, state, metrics = step(params, state, batch)
    ```
    """
    if not isinstance(step, Step):
        raise TypeError(f"step must be made by gamfunc.make_step; got {type(step).__name__}")
    check_int("warmup", warmup)
    if step.on_nonfinite == "raise":
        raise ValueError(
            "on_nonfinite='raise' reads the loss on the host at every step, which a CUDA graph "
            "cannot: graph a step made with on_nonfinite='skip' (the default; metrics['skipped'] "
            "tells when one was skipped)"
        )
    probe = step.probe  # the adaptive policy's pass at θ (None for the others): carries no state
    return step.map_branches(lambda fn: _Graphed(fn, warmup, carries=fn is not probe))


def release(step: Step) -> None:
    """Drop every graph that [`cuda_graph`][gamfunc.training.cuda_graphs.cuda_graph] captured for ``step``, and their memory.

    The next call warms up and captures again. Call it before
    ``torch.distributed.destroy_process_group()`` (see the module's docstring).

    Args:
        step: a step made by [`cuda_graph`][gamfunc.training.cuda_graphs.cuda_graph].

    Raises:
        TypeError: ``step`` was not made by [`cuda_graph`][gamfunc.training.cuda_graphs.cuda_graph].
    """
    functions = [*getattr(step, "branches", ()), getattr(step, "probe", None)]
    graphed = [b for b in functions if isinstance(b, _Graphed)]
    if not graphed:
        raise TypeError("release takes a step made by gamfunc.cuda_graph")
    if any(c.graph is not None for b in graphed for c in b.captures.values()):
        torch.cuda.synchronize()
    for branch in graphed:
        for capture in branch.captures.values():
            if capture.graph is not None:
                capture.graph.reset()
        branch.captures.clear()


def _signature(leaves: list) -> tuple:
    return tuple(
        (t.shape, t.dtype, t.device, t.stride()) if isinstance(t, Tensor) else ("value", t)
        for t in leaves
    )


class _Graphed:
    """One function of a step replayed per input signature: a branch (``fn(params, state, batch[,
    clean]) -> (params, state, metrics)``, ``carries``: its new params and state become its next
    replay's inputs) or the adaptive policy's probe (``fn(params, state, batch) -> (clean, policy
    state, flat)``, which carries nothing)."""

    def __init__(self, fn: Callable, warmup: int, carries: bool = True):
        self.fn, self.warmup, self.carries = fn, warmup, carries
        self.captures: dict[tuple, _Capture] = {}

    def __call__(self, *args):
        leaves, spec = pytree.tree_flatten(args)
        carried = len(pytree.tree_leaves(args[:2])) if self.carries else 0
        key = (spec, _signature(leaves))
        capture = self.captures.get(key)
        if capture is None:
            _check_devices(leaves)
            capture = self.captures[key] = _Capture(self.fn, spec, carried, self.warmup)
        return capture(leaves)


def _check_devices(leaves: list) -> None:
    devices = {t.device for t in leaves if isinstance(t, Tensor)}
    if len(devices) != 1 or next(iter(devices)).type != "cuda":
        raise ValueError(
            "cuda_graph: every tensor of params, state and batch must be on one CUDA device; got "
            f"{sorted(map(str, devices))}"
        )


class _Capture:
    """The graph of one input signature: eager warm-up calls, then one capture, then replays."""

    def __init__(self, fn: Callable, spec, carried: int, warmup: int):
        self.fn, self.spec, self.carried, self.left = fn, spec, carried, warmup
        self.graph: torch.cuda.CUDAGraph | None = None
        self.inputs: list = []
        self.outputs: list = []
        self.out_spec: pytree.TreeSpec | None = None
        self.returned: list[
            tuple[Tensor, int]
        ] = []  # (tensor, version) of the last carried results
        self.carried_out = 0

    def __call__(self, leaves: list):
        if self.left > 0:  # eager, on a side stream, as a capture's warm-up must be
            self.left -= 1
            return _on_side_stream(lambda: self.fn(*pytree.tree_unflatten(leaves, self.spec)))
        if self.graph is None:
            self._capture(leaves)
        self._copy_in(leaves)
        assert self.graph is not None and self.out_spec is not None  # captured above
        self.graph.replay()
        out = fresh_copies(self.outputs)
        self.returned = [
            (t, t._version) if isinstance(t, Tensor) else (t, 0) for t in out[: self.carried_out]
        ]
        return pytree.tree_unflatten(out, self.out_spec)

    def _capture(self, leaves: list) -> None:
        self.inputs = [t.clone() if isinstance(t, Tensor) else t for t in leaves]
        graph = torch.cuda.CUDAGraph()
        try:
            # thread_local: NCCL's watchdog thread may query its events while this thread captures
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                out = self.fn(*pytree.tree_unflatten(self.inputs, self.spec))
                carried = pytree.tree_leaves(out[:2]) if self.carried else []
                # the new params and state become the next replay's inputs inside the graph, so a
                # caller who passes back what it was given costs no copy in
                same = len(carried) == self.carried and all(
                    isinstance(n, Tensor) and n.shape == i.shape and n.dtype == i.dtype
                    for n, i in zip(carried, self.inputs[: self.carried], strict=True)
                )
                if same:
                    pairs = zip(self.inputs[: self.carried], carried, strict=True)
                    targets = [(i, n) for i, n in pairs if i is not n]
                    if targets:
                        torch._foreach_copy_([i for i, _ in targets], [n for _, n in targets])
        except RuntimeError as e:
            raise RuntimeError(
                "cuda_graph: capturing the step failed. A step in a CUDA graph must not read a "
                "device value on the host (.item(), bool(), on_nonfinite='raise'), copy a host "
                "value to the device, synchronise, or contain a CUDA graph of its own (a step "
                f"compiled with mode='reduce-overhead'). torch said: {e}"
            ) from e
        self.graph = graph
        self.outputs, self.out_spec = pytree.tree_flatten(out)
        self.carried_out = len(carried) if same else 0

    def _copy_in(self, leaves: list) -> None:
        dst, src = [], []
        for i, (t, static) in enumerate(zip(leaves, self.inputs, strict=True)):
            if not isinstance(t, Tensor) or t is static:
                continue
            if i < len(self.returned):
                mine, version = self.returned[i]
                if t is mine and t._version == version:  # already in the graph's inputs
                    continue
            dst.append(static)
            src.append(t)
        if dst:
            torch._foreach_copy_(dst, src)


def _on_side_stream(call: Callable):
    """``call()`` on a stream of its own, as the calls before a capture must run; its results are
    then used on the current stream (``record_stream``, so that their memory is not reused early)."""
    current, stream = torch.cuda.current_stream(), torch.cuda.Stream()
    stream.wait_stream(current)
    with torch.cuda.stream(stream):
        out = call()
    current.wait_stream(stream)
    for t in pytree.tree_leaves(out):
        if isinstance(t, Tensor) and t.is_cuda:
            t.record_stream(current)
    return out
