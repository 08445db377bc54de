"""The non-finite guard of every step: whether a step's results are finite, and how a step that
is not keeps the tensors it was given.

[`gamfunc.make_step`][gamfunc.make_step] checks, after each update, the loss at θ, the direction
and every floating-point entry of the new parameters and optimiser state ([`is_finite`][gamfunc.training.guard.is_finite]).
A step that fails keeps the old parameters, optimiser state, buffers and estimator state, and
counts itself in ``metrics["skipped"]``. An eager step reads the flag on the host and branches;
a compiled one, one captured in a CUDA graph, or one rank of several selects on the device
([`select`][gamfunc.training.guard.select]) and reads nothing. [`Guard`][gamfunc.training.guard.Guard] makes that
choice for one step function, with a count of its own: no state is shared between steps or
processes. The bridge of ``torch.optim`` optimisers (`gamfunc.torch_optim.bridge`) checks the
state a base optimiser forms with [`all_finite`][gamfunc.training.guard.all_finite].
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from gamfunc import tree
from gamfunc._compat import (
    any_dtensor,
    dtensor_type,
    flag_nonfinite,
    in_transform,
    nonfinite_check_runs,
    overlaps,
)

__all__ = ["SELECT_AFTER", "Guard", "all_finite", "is_finite", "select"]

# How many eager steps in a row must find the GPU behind the host before the guard selects: a
# select where the host bounds the step costs more than a read where the GPU does.
SELECT_AFTER = 3


class Guard:
    """Where one step function's guard decides whether to keep a step: on the host (a read of the
    flag, then a Python branch) or on the device (a select of every parameter, optimiser-state and
    buffer tensor, `gamfunc.tree.selects`), with the count that choice needs.

    A read waits for the step's last kernel, and the GPU then idles until the host has queued the
    next step's first ones; a select waits for nothing but costs host time per tensor (about 1,000
    views a step on ResNet-50). Which is cheaper depends on which of the two bounds the step, and
    the guard asks the GPU: ``passes_queued``, an event recorded once the host had queued the
    step's passes, has completed by the time the host has queued the update too when the GPU keeps
    up with the host. Then the host bounds the step, and the guard reads. Where the GPU was still
    behind at three eager steps in a row (`Guard.gpu_bounds`), it bounds the steps, and the guard
    selects: one step behind, a burst of large kernels, does not switch it, since a select where
    the host bounds the step costs more than a read where the GPU does (``benchmarks/RESULTS.md``,
    *Measured outside these commands*: the facade's non-finite guard).

    It always selects where the step cannot read or must not wait: under ``torch.compile`` or
    ``vmap``, while a CUDA graph is captured ([`gamfunc.cuda_graph`][gamfunc.training.cuda_graphs.cuda_graph],
    the facade's ``cuda_graph=True``), and on a GPU in a job of several processes, where each rank
    keeps its queue full while its all-reduces run (``tests/library/test_distributed.py``). On the CPU it
    reads.

    One instance belongs to one step function (both branches of a step made with ``every``); a
    compiled or graphed copy of the step gets its own.

    Attributes:
        behind: the eager steps in a row that found the GPU still running their passes.
    """

    def __init__(self) -> None:
        self.behind = 0

    def mark(self, device: torch.device) -> torch.cuda.Event | None:
        """An event on the current stream, recorded when the host has queued the step's passes,
        where the guard may read on the host (an eager step on a GPU, not captured); None
        elsewhere.

        Args:
            device: the device of the step's loss.

        Returns:
            The event, or None.
        """
        if device.type != "cuda" or torch.compiler.is_compiling():
            return None
        if torch.cuda.is_current_stream_capturing():
            return None
        event = torch.cuda.Event()
        event.record()
        return event

    def reads(self, finite: Tensor, passes_queued: torch.cuda.Event | None = None) -> bool:
        """Whether the guard reads ``finite`` on the host and branches (see the class).

        Args:
            finite: the step's 0-d bool flag.
            passes_queued: the event of [`mark`][gamfunc.training.guard.Guard.mark], or None.

        Returns:
            True to read and branch, False to select on the device.
        """
        if torch.compiler.is_compiling() or tree.vmapped([finite]):
            return False
        if finite.device.type == "cpu":
            return True
        capturing = finite.is_cuda and torch.cuda.is_current_stream_capturing()
        return _host_may_wait(capturing, _ranks() > 1, self.gpu_bounds(passes_queued))

    def gpu_bounds(self, passes_queued: torch.cuda.Event | None) -> bool:
        """Whether the GPU bounds the steps: it had yet to finish the passes (``passes_queued``)
        when the host had queued the update, at this eager step and the `SELECT_AFTER` - 1 before
        it.

        Args:
            passes_queued: the event of [`mark`][gamfunc.training.guard.Guard.mark], or None (no GPU, or
                the step cannot read).

        Returns:
            Whether to select.
        """
        if passes_queued is None:
            return False
        self.behind = self.behind + 1 if not passes_queued.query() else 0
        return self.behind >= SELECT_AFTER

    def keep(self, finite: Tensor, new, old, passes_queued: torch.cuda.Event | None = None):
        """``new`` where ``finite``, else ``old``: by a read and a branch, or by a select.

        Args:
            finite: the step's 0-d bool flag.
            new: a pytree of the step's results (parameters, states, buffers).
            old: the same structure, as the step was given it.
            passes_queued: the event of [`mark`][gamfunc.training.guard.Guard.mark], or None.

        Returns:
            ``new`` or ``old``, or their selection leaf by leaf.
        """
        if not self.reads(finite, passes_queued):  # no Python branch on a value
            return select(finite, new, old)
        return new if bool(finite) else old


def _host_may_wait(capturing: bool, distributed: bool, gpu_behind: bool = False) -> bool:
    """The rule of `Guard.reads` for a step on a GPU: read on the host unless a CUDA graph is
    being captured, the step is one rank of several, or the GPU has yet to finish the step's
    passes (it bounds the step)."""
    return not (capturing or distributed or gpu_behind)


def _ranks() -> int:
    """The processes of the default group (1 without one)."""
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def is_finite(est, *trees) -> Tensor:
    """The non-finite guard of every step: whether the loss at θ, the direction and every
    floating-point entry of ``trees`` (the new parameters and optimiser state) are finite.

    Args:
        est: the estimator's [`Estimate`][gamfunc.estimators.base.Estimate].
        *trees: pytrees of tensors after the update.

    Returns:
        A 0-d bool tensor, on the loss's device (no host synchronisation).
    """
    loss = est.info["loss"]
    finite = torch.isfinite(loss)
    norm = _known_norm(est)
    if norm is None:  # the direction's entries are checked with the others', in the same kernels
        return finite & all_finite(est.direction, *trees, device=loss.device)
    finite = finite & _moved(torch.isfinite(norm), loss.device)
    return finite & all_finite(*trees, device=loss.device) if trees else finite


def all_finite(*trees, device: torch.device | None = None) -> Tensor:
    """Whether every floating-point entry of ``trees`` (the new params and optimiser state) is
    finite, one group of tensors per (device, dtype).

    Eager, each group is one `gamfunc._compat.flag_nonfinite` (`_finite_groups`): the check of
    ``torch.amp.GradScaler``, one multi-tensor kernel that raises a flag, with no tensor made per
    input. Traced, inside ``vmap`` (foreach kernels have no batching rule), or
    where that kernel does not serve: the largest magnitude of each tensor (a nan stays nan), one
    ``_foreach_norm`` per group, then one ``isfinite`` per group. The flag is on ``device`` (by
    default the first tensor's), moved there without waiting for the GPU (`_moved`).

    Args:
        *trees: pytrees of tensors (parameters, optimiser states); entries that are not floating
            point, or empty, are not checked.
        device: where the flag is wanted; by default the first checked tensor's.

    Returns:
        A 0-d bool tensor, True where every entry is finite (True for nothing to check).
    """
    groups: dict[tuple, list[Tensor]] = {}
    for key, ((group,), _) in tree.grouped(tree.tensors(trees)).items():
        if key[1].is_floating_point and (group := [t for t in group if t.numel()]):
            groups[key] = group
    if not groups:
        return torch.ones((), dtype=torch.bool)
    leaves = [t for group in groups.values() for t in group]
    device = leaves[0].device if device is None else device
    vmapped = tree.vmapped(leaves)  # foreach kernels have no batching rule
    if not vmapped and _checks_in_place(groups, leaves):
        return _finite_groups(groups, device)
    flags = []
    for group in groups.values():
        if not torch.compiler.is_compiling() and any_dtensor(group):  # a shard may be empty
            flags.append(_moved(_sharded_finite(group), device))
            continue
        if vmapped:
            maxima = [torch.linalg.vector_norm(t, float("inf")) for t in group]
        else:
            maxima = list(torch._foreach_norm(group, float("inf")))
        flags.append(_moved(torch.isfinite(torch.stack(maxima)).all(), device))
    return flags[0] if len(flags) == 1 else torch.stack(flags).all()


def _sharded_finite(group: list[Tensor]) -> Tensor:
    """Whether every entry of ``group`` is finite, where some are DTensors (``fully_shard``): each
    rank checks its local shards (an empty one is finite) and the ranks of the shards' mesh agree by
    one all-reduce of the flag, so no rank gathers a parameter and every torch version's DTensor
    serves."""
    cls = dtensor_type()
    mesh_group, local = None, []
    for t in group:
        if cls is not None and isinstance(t, cls):
            shard: Any = t
            mesh_group = shard.device_mesh.get_group()
            t = shard.to_local()
        if t.numel():
            local.append(torch.isfinite(t).all())
    where = local[0].device if local else group[0].device
    ok = torch.stack(local).all() if local else torch.ones((), dtype=torch.bool, device=where)
    bad = (~ok).to(torch.int32)
    if mesh_group is not None:
        torch.distributed.all_reduce(bad, op=torch.distributed.ReduceOp.MAX, group=mesh_group)
    return bad == 0


# The dtypes GradScaler's check takes.
_CHECKED = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _checks_in_place(groups: dict, leaves: list[Tensor]) -> bool:
    """Whether `_finite_groups` may check ``groups``: eager, with autograd not recording, of the
    dtypes it takes, on devices where it runs, and each tensor one it may write (no two elements
    at one address, as in an expanded tensor)."""
    if torch.compiler.is_compiling() or in_transform() or torch.is_grad_enabled():
        return False
    if any_dtensor(leaves):  # a sharded tensor: a reduction over every rank's shard (below)
        return False
    if any(dtype not in _CHECKED or not nonfinite_check_runs(d.type) for d, dtype in groups):
        return False
    for t in leaves:
        dense = t.is_contiguous() or t.is_contiguous(memory_format=torch.channels_last)
        if not dense and overlaps(t):
            return False
    return True


def _finite_groups(groups: dict, device: torch.device) -> Tensor:
    """`all_finite` by `gamfunc._compat.flag_nonfinite`, one call per group raising one float flag
    per device, which writes each element back bit for bit."""
    found: dict[torch.device, Tensor] = {}
    for (d, _), group in groups.items():
        if d not in found:
            found[d] = torch.zeros(1, dtype=torch.float32, device=d)
        flag_nonfinite(group, found[d])
    flags = [_moved((f == 0).reshape(()), device) for f in found.values()]
    return flags[0] if len(flags) == 1 else torch.stack(flags).all()


def _moved(flag: Tensor, device: torch.device) -> Tensor:
    """``flag`` on ``device``. A flag formed on the CPU (say, over the CPU step counts of a
    ``torch.optim.AdamW`` whose parameters are on a GPU) goes without ``non_blocking``'s stream
    synchronisation: a copy from pageable host memory is staged before the call returns."""
    return flag.to(device, non_blocking=flag.device.type == "cpu" and device.type != "cpu")


def _known_norm(est) -> Tensor | None:
    """‖direction‖ where the step already has it: eager, the clean pass's norm where the direction
    is its gradient (the plain gradient step) and the pass carries it; None otherwise. (Dynamo
    cannot trace ``is`` between dicts on every torch.)"""
    clean = est.clean
    if (
        not torch.compiler.is_compiling()
        and est.direction is clean.grad
        and isinstance(clean.grad_norm, Tensor)
    ):
        return clean.grad_norm
    return None


def select(cond: Tensor, new, old):
    """``torch.where(cond, new, old)`` over two pytrees of one structure (parameters, states,
    buffers), by `gamfunc.tree.selects`: a few foreach kernels for all of them, eager. The leaves
    of ``old`` are matched to those of ``new`` by place (a dict's by key, whatever its order).
    Traced, one walk of the two trees, a ``torch.where`` per leaf (inductor fuses them).

    Args:
        cond: a 0-d bool tensor.
        new: a pytree of tensors, taken where ``cond`` holds.
        old: a pytree of the same structure (dicts may list their keys in another order).

    Returns:
        A pytree of the structure of ``new``: each leaf ``new``'s where ``cond``, else ``old``'s.
    """
    if torch.compiler.is_compiling():
        return pytree.tree_map(lambda n, o: torch.where(cond.to(n.device), n, o), new, old)
    leaves, spec = pytree.tree_flatten(new)
    before = pytree.tree_leaves(pytree.tree_map(lambda _, o: o, new, old))
    return pytree.tree_unflatten(tree.selects(cond, leaves, before), spec)
