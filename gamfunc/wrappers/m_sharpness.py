r"""m-sharpness on one device: perturbations per sub-batch of m, directions averaged (local data parallel).

The SAM paper's m-sharpness (Foret et al., Section 4.1) splits the batch into m sub-batches
S_1..S_m of equal size and forms the estimator's perturbations from one sub-batch's gradients only:

$$
\mathrm{direction} = (1/m)\cdot \sum _j d(\theta , S_j), \qquad d = \ \text{the estimator's direction on}\ S_j \mathrm{alone}
$$

For SAM, d(θ, S_j) = ∇L_{S_j}(θ + ρ·g_j/‖g_j‖) with g_j = ∇L_{S_j}(θ). This is exactly the step of
``gamfunc.distributed.local`` over m ranks holding S_1..S_m, so one device reproduces the semantics
of multi-device SAM/GAM (whose perturbations are per device), and m is a hyperparameter of its own:
smaller sub-batches give stronger regularisation in the SAM paper's experiments.

The m estimator runs go through ``torch.func.vmap`` (one batched run instead of m small ones; every
estimator, HVP backend and [`gamfunc.tree`][gamfunc.tree] op runs under it), or through a Python loop over the
sub-batches with ``vectorize=False``; both give the same direction up to rounding.

Warning:
    BatchNorm in train mode updates its running statistics in place; under vmap the sub-batch
    statistics are batched while the buffers bound by the step are not, and torch refuses ("Batch
    norm got a batched tensor as input while the running_mean or running_var ... were not
    batched"). Pass ``vectorize=False`` for BatchNorm models in train mode (the error says so).

References:
    Foret, Kleiner, Mobahi, Neyshabur, "Sharpness-Aware Minimization for Efficiently Improving
    Generalization", ICLR 2021, https://arxiv.org/abs/2010.01412 (Section 4.1).
    Andriushchenko, Flammarion, "Towards Understanding Sharpness-Aware Minimization", ICML 2022,
    https://arxiv.org/abs/2206.06232 (m-sharpness).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from gamfunc.checks import check_int
from gamfunc.estimators.base import Estimate, Estimator, check_stateless
from gamfunc.loss import Pass
from gamfunc.wrappers.accumulate import weighted_sum

__all__ = ["RANDOMNESS", "m_sharpness"]

RANDOMNESS = ("error", "different", "same")


def m_sharpness(
    estimator: Estimator, m: int, *, randomness: str = "error", vectorize: bool = True
) -> Estimator:
    """``estimator`` run on each of m equal sub-batches, its m directions averaged (m-sharpness).

    direction = (1/m)·Σ_j d(θ, S_j); ``info`` and the clean pass (loss, gradient, BatchNorm
    statistics) are the means over sub-batches too, so ``info["loss"]`` is the loss on the whole
    batch (``info["grad_norm"]`` is the mean of the sub-batches' ‖g_j‖), and so is a decoupled part
    (WSAM's ``decouple=True``). Equals ``gamfunc.distributed.local(estimator)`` over m ranks holding
    S_1..S_m.

    Args:
        estimator: any gamfunc estimator (SAM, GAM, ...).
        m: the number of sub-batches (integer >= 1); the batch size must be a multiple of m.
        randomness: ``torch.func.vmap``'s ``randomness`` for a ``loss_fn`` that draws random numbers
            (dropout): "error" (default: refuse), "different" (independent draws per sub-batch, as on
            m devices) or "same". The loop draws independently per sub-batch.
        vectorize: True (default): vmap; False: loop over sub-batches (BatchNorm in train mode,
            see the Warning of the module).

    Returns:
        An Estimator with the hyperparameters of ``estimator`` plus ``m`` and ``vectorized``.

    Raises:
        TypeError: ``estimator`` is not an estimator.
        ValueError: ``m`` is not an integer >= 1, ``randomness`` is not one of `RANDOMNESS`, or
            ``estimator`` carries state between steps
            ([`looksam`][gamfunc.estimators.looksam.looksam],
            [`friendly_sam`][gamfunc.estimators.friendly_sam.friendly_sam]).

    Example:
        >>> import torch, gamfunc
        >>> from gamfunc.wrappers.m_sharpness import m_sharpness
        >>> loss_fn = lambda p, b: ((b[0] @ p["w"] - b[1]) ** 2).mean()
        >>> est = m_sharpness(gamfunc.sam(0.05), m=4)
        >>> d, info = est({"w": torch.ones(3)}, (torch.randn(8, 3), torch.randn(8)), loss_fn)
    """
    check_stateless(
        estimator, "estimator", ", which m_sharpness: its sub-batches would each need one"
    )
    check_int("m", m)
    if randomness not in RANDOMNESS:
        raise ValueError(f"randomness must be one of {RANDOMNESS}; got {randomness!r}")
    vectorized = True if vectorize is None else bool(vectorize)  # None: the old "probe" default

    def run(params, batch, loss_fn, clean, step):
        del clean  # the pass at θ over the whole batch is no sub-batch's
        leaves, spec = pytree.tree_flatten(batch)
        where = [i for i, x in enumerate(leaves) if isinstance(x, Tensor) and x.ndim > 0]
        sizes = {leaves[i].shape[0] for i in where}
        if len(sizes) != 1 or next(iter(sizes)) % m:
            raise ValueError(
                f"m={m} needs batch tensors whose common dim 0 is a multiple of m; got {sizes}"
            )
        stacked = [leaves[i].reshape(m, -1, *leaves[i].shape[1:]) for i in where]

        def one(*tensors):
            sub = list(leaves)
            for i, t in zip(where, tensors, strict=True):
                sub[i] = t
            est = estimator.run(params, pytree.tree_unflatten(sub, spec), loss_fn, step=step)
            return est.direction, est.info, est.clean, est.decoupled

        if vectorized:
            try:
                out = torch.func.vmap(one, randomness=randomness)(*stacked)
            except RuntimeError as e:
                raise RuntimeError(
                    f"m_sharpness: {estimator.name} failed under torch.func.vmap ({e}); "
                    "pass vectorize=False to loop over the sub-batches"
                ) from e
            mean = pytree.tree_map(lambda x: x.mean(0) if x.is_floating_point() else x[0], out)
        else:
            mean = None
            for j in range(m):
                mean = weighted_sum(mean, 1.0 / m, one(*(t[j] for t in stacked)))
        direction, info, clean_mean, decoupled = mean
        # The mean of the sub-batches' ‖g_j‖ is not the norm of the mean gradient: drop it.
        clean = Pass(clean_mean.grad, clean_mean.loss, clean_mean.aux)
        return Estimate(direction, info, clean, decoupled=decoupled)

    hparams = estimator.hparams | {"m": m, "vectorized": vectorized}
    return Estimator(f"{estimator.name}[m={m}]", run, hparams, decoupled=estimator.decoupled)
