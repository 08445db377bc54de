r"""Gradient accumulation: every gradient and Hessian-vector product of a step is a mean over micro-batches.

[`Accumulated`][gamfunc.wrappers.accumulate.Accumulated] is an `Objective`. Every estimator reaches ∇L only through
`gradient_pass` and the backends of [`gamfunc.hvps`][gamfunc.hvps], and these delegate to the
Objective. So SAM's two gradients, GAM's H·v products and accelerated GAM's g0..g3 are all
full-batch quantities, formed one micro-batch at a time, and the estimators are unchanged. With
micro-batches B_1..B_k of sizes n_i (Σ n_i = N) and a loss that is a mean over examples:

$$
\nabla L_B(\theta ) = \sum _i (n_i/N)\cdot \nabla L_{B_i}(\theta ), \qquad H_B(\theta )\cdot v = \sum _i (n_i/N)\cdot H_{B_i}(\theta )\cdot v
$$

so the accumulated step equals the full-batch step up to rounding. The perturbations (θ + ρ·g/‖g‖,
θ_adv, ...) are formed from the accumulated g, never from one micro-batch. A v that is a function of g
(``grad_norm_grad``) is evaluated at the accumulated g first, then H·v is accumulated.

The same class, given a ``reduce`` across ranks, is the ``perturbation="global"`` data parallel of
[`gamfunc.distributed`][gamfunc.wrappers.distributed]: the mean over this rank's micro-batches, then the weighted mean over ranks.

Warning:
    BatchNorm in train mode normalises each micro-batch with its own statistics (as any gradient
    accumulation in PyTorch does), so with BatchNorm the accumulated gradient is the one of k
    "ghost batches", not of one batch of N. Equality with the full batch holds for models without
    batch-dependent layers. The new running statistics (the ``aux`` of the clean pass) are the
    ``n_i/N``-weighted mean over micro-batches of each micro-batch's updated statistics, and the
    integer ``num_batches_tracked`` is the first micro-batch's (every integer aux leaf is: they are
    counters equal in every micro-batch; carry per-example quantities such as accuracy as
    floating-point means, which are averaged): one update per step, as
    [`gamfunc.make_step`][gamfunc.make_step] keeps it, whose running mean is exactly the momentum update with the
    full batch's mean (the running variance misses the spread of the micro-batch means). It is also
    what the global data-parallel mode does across ranks, so k micro-batches on one device and k
    ranks keep the same statistics.

Cost: with k = 1 (data parallel without accumulation) an H·v costs what it costs on one device, plus
the all-reduces. With k > 1, an H·v with v a function of g costs the k gradient passes that form g,
then k H·v passes; for ``hvp="reverse"`` that is k gradient passes more than one device's vjp, which
forms g and H·v in one pass (keeping k vjp closures alive instead would cost k times the memory
accumulation exists to save).

Example:
    >>> import torch, gamfunc
    >>> from gamfunc.wrappers.accumulate import accumulate
    >>> loss_fn = lambda p, b: ((b[0] @ p["w"] - b[1]) ** 2).mean()
    >>> params, batch = {"w": torch.zeros(3)}, (torch.randn(8, 3), torch.randn(8))
    >>> step = gamfunc.make_step(gamfunc.gam(0.05, 0.1), gamfunc.sgd(lr=0.1), accumulate(loss_fn, 4))
    >>> params, state, metrics = step(params, step.init(params), batch)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from gamfunc.checks import check_int
from gamfunc.hvps import of_gradient, resolve
from gamfunc.loss import Objective, Pass, gradient_pass
from gamfunc.tree import Tree

__all__ = ["Accumulated", "accumulate", "batch_size", "split_batch"]

Reduce = Callable[[list, float], list]


def split_batch(batch, k: int) -> list:
    """``batch`` cut into k micro-batches along dim 0 of every tensor.

    Args:
        batch: a pytree of tensors and other values.
        k: the number of micro-batches.

    Returns:
        A list of k pytrees shaped like ``batch``: each tensor with a dimension split by
            ``torch.tensor_split`` (sizes differ by at most one), every other leaf repeated in each.
    """
    leaves, spec = pytree.tree_flatten(batch)
    cut = [torch.tensor_split(x, k) if _batched(x) else (x,) * k for x in leaves]
    return [pytree.tree_unflatten([c[i] for c in cut], spec) for i in range(k)]


def batch_size(batch) -> int:
    """The number of examples in ``batch``: dim 0 of its first tensor with at least one dimension, or 1.

    Args:
        batch: a pytree of tensors and other values.

    Returns:
        The size of dim 0 of the first tensor with a dimension; 1 when no tensor has one.
    """
    for x in pytree.tree_leaves(batch):
        if _batched(x):
            return int(x.shape[0])
    return 1


def _batched(x) -> bool:
    return isinstance(x, Tensor) and x.ndim > 0


def weighted_sum(acc, w: float, x):
    """``acc + w·x`` over matching pytrees (``w·x`` when ``acc`` is None); a leaf that is not floating
    point keeps the value in ``acc`` (the first one summed)."""
    if acc is None:
        return x if w == 1.0 else pytree.tree_map(lambda b: b * w if _floating(b) else b, x)
    return pytree.tree_map(lambda a, b: a + w * b if _floating(b) else a, acc, x)


def _floating(x) -> bool:
    return isinstance(x, Tensor) and x.is_floating_point()


@dataclass(frozen=True, eq=False)
class Accumulated(Objective):
    """``loss_fn`` as a mean over ``micro_batches`` micro-batches, optionally also over ranks.

    Build it with [`accumulate`][gamfunc.wrappers.accumulate.accumulate] (one device) or [`gamfunc.distributed.global_mean`][gamfunc.wrappers.distributed.global_mean] (data
    parallel). Calling it gives the (weighted) mean loss, and aux where ``loss_fn`` returns one. Step
    state (an fp16 loss scale of ``loss_fn``) is forwarded by the defaults of
    `Objective`.

    Attributes:
        loss_fn: the loss of one micro-batch: ``loss_fn(params, batch)`` or the buffered form
            ``loss_fn(params, batch, buffers) -> (loss, new_buffers)``; another Objective (e.g. the
            fp16 loss scale of [`gamfunc.precision.fp16`][gamfunc.wrappers.precision.fp16]) is fine.
        micro_batches: k >= 1.
        split: ``split(batch, k) -> list of k micro-batches``; [`split_batch`][gamfunc.wrappers.accumulate.split_batch] by default. Each
            micro-batch is weighted by its [`batch_size`][gamfunc.wrappers.accumulate.batch_size].
        reduce: ``reduce(trees, weight) -> trees``, the weighted mean over ranks of a list of pytrees
            ([`gamfunc.distributed.all_reduce_mean`][gamfunc.wrappers.distributed.all_reduce_mean]); None on one device.
    """

    loss_fn: Callable
    micro_batches: int = 1
    split: Callable[[Any, int], list] | None = None
    reduce: Reduce | None = None

    def __post_init__(self):
        k = self.micro_batches
        check_int("micro_batches", k)
        if not callable(self.loss_fn):
            raise TypeError(f"loss_fn must be callable; got {type(self.loss_fn).__name__}")

    def parts(self, batch) -> tuple[list[tuple[float, Any]], int]:
        """``([(n_i/N, B_i)], N)``: the micro-batches with their weights, and N."""
        if self.micro_batches == 1:
            return [(1.0, batch)], batch_size(batch)
        parts = (self.split or split_batch)(batch, self.micro_batches)
        sizes = [batch_size(b) for b in parts]
        if len(parts) != self.micro_batches or min(sizes) < 1:
            raise ValueError(
                f"micro_batches={self.micro_batches} needs a batch of at least that many examples "
                f"cut into non-empty parts; got parts of sizes {sizes}"
            )
        total = sum(sizes)
        return [(n / total, b) for n, b in zip(sizes, parts, strict=True)], total

    def _across_ranks(self, trees: list, total: int) -> list:
        return trees if self.reduce is None else self.reduce(trees, float(total))

    def __call__(self, params: Tree, batch, *args, **kwargs):
        """The mean loss over micro-batches (and ranks); ``(loss, aux)`` if ``loss_fn`` returns aux."""
        parts, total = self.parts(batch)
        loss = aux = None
        for w, b in parts:
            out = self.loss_fn(params, b, *args, **kwargs)
            part_loss, part_aux = out if isinstance(out, tuple) else (out, ())
            loss, aux = weighted_sum(loss, w, part_loss), weighted_sum(aux, w, part_aux)
        loss, aux = self._across_ranks([loss, aux], total)
        return (loss, aux) if isinstance(out, tuple) else loss

    def gradient_pass(self, params: Tree, batch) -> Pass:
        """Σ_i (n_i/N)·(∇L_i, L_i, aux_i), one micro-batch at a time, then the mean over ranks."""
        parts, total = self.parts(batch)
        acc = None
        for w, b in parts:
            acc = weighted_sum(acc, w, tuple(gradient_pass(self.loss_fn, params, b)))
        assert acc is not None  # parts holds one micro-batch at least
        return Pass(*self._across_ranks(list(acc), total))

    def hvp(self, backend, params: Tree, batch, v, clean: Pass | None):
        """Σ_i (n_i/N)·H_i·v with ``backend`` per micro-batch; v(g) is taken at the accumulated g."""
        parts, total = self.parts(batch)
        if of_gradient(v) and clean is None and len(parts) == 1:
            return self._hvp_whole_batch(backend, params, batch, v, total)
        if of_gradient(v):
            v, clean = resolve(v, clean if clean is not None else self.gradient_pass(params, batch))
        hv = acc = None
        for w, b in parts:
            part_hv, part_clean = backend(self.loss_fn, params, b, v)
            hv = weighted_sum(hv, w, part_hv)
            if clean is None:  # a dict v: the backend's pass at θ comes for free
                acc = weighted_sum(acc, w, tuple(part_clean))
        if clean is None:
            assert acc is not None  # parts holds one micro-batch at least
            hv, *acc = self._across_ranks([hv, *acc], total)
            return hv, Pass(*acc)
        (hv,) = self._across_ranks([hv], total)
        return hv, clean

    def _hvp_whole_batch(self, backend, params: Tree, batch, v, total: int):
        """One micro-batch: the backend forms this rank's g in its own pass at θ (``reverse`` in the
        very vjp that gives H·v) and g is reduced over ranks before v(g) is taken, so the H·v costs
        no gradient pass more than on one device."""
        reduced = []

        def v_of_reduced(g: Tree) -> Tree:
            (g,) = self._across_ranks([g], total)
            reduced.append(g)
            return v(g)

        hv, local = backend(self.loss_fn, params, batch, v_of_reduced)
        hv, loss, aux = self._across_ranks([hv, local.loss, local.aux], total)
        return hv, Pass(reduced[0], loss, aux)


def accumulate(loss_fn: Callable, micro_batches: int, *, split=None) -> Accumulated:
    """``loss_fn`` evaluated over ``micro_batches`` micro-batches per step: gradient accumulation.

    Every gradient and H·v an estimator forms is Σ_i (n_i/N)·(that quantity on micro-batch i), so a
    step over k micro-batches equals the step over the whole batch (see the module docstring for
    BatchNorm). Pass the result to [`gamfunc.make_step`][gamfunc.make_step] in place of ``loss_fn``; feed the step
    the whole batch of N examples, it is cut inside.

    Args:
        loss_fn: ``loss_fn(params, batch)`` (a mean over the examples of ``batch``), the buffered
            form of [`gamfunc.nn.functionalize`][gamfunc.nn.functionalize], or [`gamfunc.precision.fp16`][gamfunc.wrappers.precision.fp16] of either.
        micro_batches: k >= 1; peak activation memory is that of N/k examples.
        split: ``split(batch, k) -> list``; default: [`split_batch`][gamfunc.wrappers.accumulate.split_batch] (dim 0 of every tensor).

    Returns:
        An [`Accumulated`][gamfunc.wrappers.accumulate.Accumulated] Objective.

    Example:
        >>> import torch, gamfunc
        >>> loss_fn = lambda p, b: ((b[0] @ p["w"] - b[1]) ** 2).mean()
        >>> p, b = {"w": torch.ones(3, dtype=torch.float64)}, (torch.randn(8, 3).double(), torch.randn(8).double())
        >>> d1, _ = gamfunc.sam(0.05)(p, b, loss_fn)
        >>> d4, _ = gamfunc.sam(0.05)(p, b, accumulate(loss_fn, 4))
        >>> bool(torch.allclose(d1["w"], d4["w"]))
        True
    """
    return Accumulated(loss_fn, micro_batches, split=split)
