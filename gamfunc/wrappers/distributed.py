"""Data parallel for the pure step over ``torch.distributed`` (NCCL or gloo), launched by ``torchrun``.

Each rank holds the same parameters and state and steps on its own shard of the global batch. Where
the ranks' results are averaged decides what the step computes; there are two documented modes:

* ``perturbation="global"`` ([`global_mean`][gamfunc.wrappers.distributed.global_mean]): every gradient a perturbation depends on is averaged
  over ranks before the perturbation is formed: g0 = mean_r ∇L_r(θ), θ + ρ·g0/‖g0‖, and so on for
  every gradient and H·v of the estimator (an [`Accumulated`][gamfunc.wrappers.accumulate.Accumulated] Objective whose
  ``reduce`` is an all-reduce). The step equals the single-process step on the concatenated batch.
  Cost: one all-reduce per gradient or H·v (SAM: 2, exact GAM: 4, accelerated GAM: 4).
* ``perturbation="local"`` ([`local`][gamfunc.wrappers.distributed.local]): each rank forms its perturbations from its local gradients
  (SAM's ε_r = ρ·g_r/‖g_r‖) and only the final direction is averaged, one all-reduce per step. This is
  what the SAM paper's m-sharpness and the authors' GAM code do, and what a DDP model gets when its
  ``no_sync`` skips the first pass. On one device, [`gamfunc.m_sharpness.m_sharpness`][gamfunc.wrappers.m_sharpness.m_sharpness] computes
  the same step for m sub-batches.

Averages are weighted by the ranks' batch sizes (equal shards give the plain mean), and BatchNorm
running statistics (the ``aux`` of the clean pass) are averaged too, so that every rank keeps the same
state; integer buffers (``num_batches_tracked``) are the same on every rank and are not reduced.

Every reduction goes through [`all_reduce_mean`][gamfunc.wrappers.distributed.all_reduce_mean], which flattens the tensors of any number of
pytrees into a few contiguous buffers of at most ``bucket_cap_mb`` each (one per dtype and device
where they fit) and calls ``torch.distributed.all_reduce`` once per buffer.

Launch with ``torchrun --nproc_per_node N script.py``; in the script:

```python
from gamfunc.wrappers.distributed import broadcast, data_parallel

torch.distributed.init_process_group("nccl")          # "gloo" on CPU
params, buffers = broadcast((params, buffers))        # the same start on every rank
estimator, loss_fn = data_parallel(estimator, loss_fn, perturbation="global")
step = gamfunc.make_step(estimator, optimizer, loss_fn)
# feed each rank its own shard (torch.utils.data.DistributedSampler)
```

References:
    Foret et al., "Sharpness-Aware Minimization for Efficiently Improving Generalization", ICLR 2021,
    https://arxiv.org/abs/2010.01412 (Section 4.1, m-sharpness).
    Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel Training", VLDB 2020,
    https://arxiv.org/abs/2006.15704 (gradient bucketing).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.utils import _pytree as pytree

from gamfunc.estimators.base import Estimate, Estimator, check_stateless
from gamfunc.estimators.gradient import gradient
from gamfunc.loss import Pass
from gamfunc.wrappers.accumulate import Accumulated, batch_size

__all__ = [
    "PERTURBATIONS",
    "all_reduce_mean",
    "broadcast",
    "buckets",
    "data_parallel",
    "global_mean",
    "local",
]

PERTURBATIONS = ("global", "local")


def buckets(tensors: list[Tensor], cap_bytes: int) -> list[list[int]]:
    """Indices of ``tensors`` grouped into the buckets of one all-reduce each.

    Args:
        tensors: the tensors to reduce, in order.
        cap_bytes: the largest bucket, in bytes.

    Returns:
        Lists of indices into ``tensors``, in order: each bucket holds tensors of one dtype and
            device and at most ``cap_bytes`` (a tensor larger than the cap gets a bucket of its own).
    """
    out: list[list[int]] = []
    open_: dict[tuple, tuple[list[int], int]] = {}
    for i, t in enumerate(tensors):
        key = (t.dtype, t.device)
        size = t.numel() * t.element_size()
        idx, used = open_.get(key, (None, 0))
        if idx is None or used + size > cap_bytes:
            idx, used = [], 0
            out.append(idx)
        idx.append(i)
        open_[key] = (idx, used + size)
    return out


def all_reduce_mean(
    trees: list, weight: float = 1.0, *, group=None, bucket_cap_mb: float = 25.0
) -> list:
    """The weighted mean over ranks of every floating-point tensor in ``trees``: Σ_r w_r·x_r / Σ_r w_r.

    The tensors are flattened into contiguous buckets of at most ``bucket_cap_mb`` MiB (one dtype
    and device each), each with w_r appended, so that one ``torch.distributed.all_reduce`` (sum) per
    bucket yields both Σ_r w_r·x_r and Σ_r w_r. Tensors that are not floating point are returned
    unchanged. Works with any backend that sums the buckets' dtype (NCCL, gloo).

    Args:
        trees: a list of pytrees of tensors (dicts, tuples, NamedTuples), the same structure on
            every rank.
        weight: w_r, this rank's weight (its number of examples); 1 gives the plain mean.
        group: the process group; the default group if None.
        bucket_cap_mb: the largest bucket, in MiB.

    Returns:
        ``trees`` with their floating-point tensors replaced by the means (new tensors).
    """
    leaves, spec = pytree.tree_flatten(trees)
    pos = [i for i, x in enumerate(leaves) if isinstance(x, Tensor) and x.is_floating_point()]
    floats = [leaves[i] for i in pos]
    out = list(leaves)
    for idx in buckets(floats, int(bucket_cap_mb * 2**20)):
        parts = [floats[i] for i in idx]
        w = torch.full((1,), float(weight), dtype=parts[0].dtype, device=parts[0].device)
        flat = torch.cat([torch.cat([p.reshape(-1) for p in parts]) * w, w])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        mean = flat[:-1] / flat[-1]
        for i, piece in zip(idx, mean.split([p.numel() for p in parts]), strict=True):
            out[pos[i]] = piece.view_as(floats[i])
    return pytree.tree_unflatten(out, spec)


def broadcast(obj, src: int = 0, *, group=None):
    """``obj`` as rank ``src`` holds it, on every rank.

    The same starting parameters and buffers everywhere, as ``DistributedDataParallel`` does at
    construction.

    Args:
        obj: a pytree of tensors (other leaves are kept as they are).
        src: the rank whose values every rank receives.
        group: the process group; the default group if None.

    Returns:
        ``obj`` with every tensor replaced by a new tensor holding rank ``src``'s values.
    """
    leaves, spec = pytree.tree_flatten(obj)
    out = []
    for x in leaves:
        if isinstance(x, Tensor):
            x = x.detach().clone()
            dist.broadcast(x, src, group=group)
        out.append(x)
    return pytree.tree_unflatten(out, spec)


def global_mean(
    loss_fn: Callable, *, micro_batches: int = 1, group=None, bucket_cap_mb: float = 25.0
) -> Accumulated:
    """``perturbation="global"``: ``loss_fn`` as the mean over all ranks' examples.

    Every gradient and H·v the estimator asks for is the mean over this rank's ``micro_batches``
    micro-batches ([`gamfunc.accumulate`][gamfunc.wrappers.accumulate]), then the size-weighted mean over ranks
    ([`all_reduce_mean`][gamfunc.wrappers.distributed.all_reduce_mean]); v(g) is taken at the global g. So each rank computes the direction of
    the single-process step on the concatenated batch, and all ranks take the same step.

    Args:
        loss_fn: the per-rank loss (two-argument or buffered; [`gamfunc.precision.fp16`][gamfunc.wrappers.precision.fp16] of it).
        micro_batches: gradient accumulation on each rank.
        group: the process group; the default group if None.
        bucket_cap_mb: bucket size of the all-reduce.

    Returns:
        An [`Accumulated`][gamfunc.wrappers.accumulate.Accumulated] Objective; give it to [`gamfunc.make_step`][gamfunc.make_step].
    """

    def reduce(trees: list, weight: float) -> list:
        return all_reduce_mean(trees, weight, group=group, bucket_cap_mb=bucket_cap_mb)

    return Accumulated(loss_fn, micro_batches, reduce=reduce)


def local(estimator: Estimator, *, group=None, bucket_cap_mb: float = 25.0) -> Estimator:
    """``perturbation="local"``: ``estimator`` on this rank's batch, then its direction averaged.

    direction = Σ_r n_r·d_r / Σ_r n_r with d_r the estimator's direction from rank r's batch alone
    (its perturbations formed from rank r's gradients) and n_r its batch size. The info scalars
    (``loss``, ``grad_norm``, ...), BatchNorm statistics and a decoupled part (WSAM's
    ``decouple=True``) are averaged in the same all-reduce; the
    clean pass's gradient stays this rank's. One all-reduce per step (one per bucket).

    Args:
        estimator: any gamfunc estimator.
        group: the process group; the default group if None.
        bucket_cap_mb: bucket size of the all-reduce.

    Returns:
        An Estimator with the hyperparameters of ``estimator`` and ``perturbation="local"``,
            ``group`` and ``bucket_cap_mb``. Its ``base`` is ``local(gradient())`` with the same
            group and buckets: the estimator that [`gamfunc.make_step`][gamfunc.make_step] runs on
            the steps a ``when=`` policy leaves plain, where no base is given, so that those steps
            average their gradients over the ranks too.

    Raises:
        TypeError: ``estimator`` is not an estimator.
        ValueError: ``estimator`` carries state between steps
            ([`looksam`][gamfunc.estimators.looksam.looksam],
            [`friendly_sam`][gamfunc.estimators.friendly_sam.friendly_sam]); ``global_mean`` runs it.

    Warning:
        ``info["grad_norm"]`` is the mean over ranks of ‖g_r‖, not the norm of the mean gradient.
    """
    check_stateless(
        estimator,
        "estimator",
        ", which local(): each rank would keep a state of its own; use perturbation='global'",
    )
    mean = _rank_mean(estimator, group, bucket_cap_mb)
    base = _rank_mean(gradient(), group, bucket_cap_mb)
    return dataclasses.replace(mean, base=base)


def _rank_mean(estimator: Estimator, group, bucket_cap_mb: float) -> Estimator:
    """`local`'s estimator, without a base of its own."""

    def run(params, batch, loss_fn, clean, step):
        est = estimator.run(params, batch, loss_fn, clean=clean, step=step)
        direction, info, aux, decoupled = all_reduce_mean(
            [est.direction, est.info, est.clean.aux, est.decoupled],
            float(batch_size(batch)),
            group=group,
            bucket_cap_mb=bucket_cap_mb,
        )
        clean = Pass(est.clean.grad, info["loss"], aux)
        return Estimate(direction, info, clean, decoupled=decoupled)

    hparams = estimator.hparams | {
        "perturbation": "local",
        "group": group,
        "bucket_cap_mb": bucket_cap_mb,
    }
    return Estimator(f"local({estimator.name})", run, hparams, decoupled=estimator.decoupled)


def data_parallel(
    estimator: Estimator,
    loss_fn: Callable,
    perturbation: str = "global",
    *,
    group=None,
    bucket_cap_mb: float = 25.0,
) -> tuple[Estimator, Any]:
    """The ``(estimator, loss_fn)`` pair to give [`gamfunc.make_step`][gamfunc.make_step] for data parallel training.

    ``perturbation="global"``: ``(estimator, global_mean(loss_fn))``, the single-process step on the
    concatenated batch. ``perturbation="local"``: ``(local(estimator), loss_fn)``, per-rank
    perturbations and one all-reduce of the direction. See the module docstring.

    With a ``when=`` policy of [`gamfunc.make_step`][gamfunc.make_step] the steps that are not flat run
    the step's ``base`` estimator. Under ``"global"`` it takes the all-reduced loss as the
    estimator does. Under ``"local"`` the loss is this rank's, so the base must be local too: the
    estimator brings ``local(gradient())`` with this ``group`` and ``bucket_cap_mb`` as its
    ``base``, the default of ``make_step``, which refuses a base that is not ``local`` (wrap one
    with [`local`][gamfunc.wrappers.distributed.local], or ``data_parallel(base, loss_fn,
    "local")[0]``), and refuses [`gamfunc.when.adaptive`][gamfunc.training.when.adaptive], whose
    choice would read each rank's own gradient (use ``"global"``).

    Args:
        estimator: the single-process estimator.
        loss_fn: this rank's loss (two-argument or buffered).
        perturbation: "global" or "local".
        group: the process group; the default group if None.
        bucket_cap_mb: the largest bucket of an all-reduce, in MiB.

    Returns:
        ``(estimator, loss_fn)`` for [`gamfunc.make_step`][gamfunc.make_step].

    Raises:
        ValueError: ``perturbation`` is neither "global" nor "local".

    Example (run under ``torchrun --nproc_per_node 2``):

    ```python
    dist.init_process_group("gloo")
    est, loss = data_parallel(gamfunc.gam(0.05, 0.1), loss_fn, "global")
    step = gamfunc.make_step(est, gamfunc.sgd(lr=0.1), loss)
    params = broadcast(params)
    params, state, metrics = step(params, step.init(params), my_shard)
    ```
    """
    if perturbation == "global":
        return estimator, global_mean(loss_fn, group=group, bucket_cap_mb=bucket_cap_mb)
    if perturbation == "local":
        return local(estimator, group=group, bucket_cap_mb=bucket_cap_mb), loss_fn
    raise ValueError(f"perturbation must be one of {PERTURBATIONS}; got {perturbation!r}")
