r"""Random weight perturbation: the gradient at a filter-wise scaled Gaussian neighbour of θ."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from gamfunc import tree
from gamfunc.checks import check_int, check_nonnegative, check_unit
from gamfunc.estimators.base import Estimate, Estimator, Summary
from gamfunc.estimators.gradient import clean_info
from gamfunc.loss import gradient_pass
from gamfunc.schedules import value
from gamfunc.tree import Tree

__all__ = ["RWPState", "gaussian", "noise", "normals", "rwp"]

# its row of README's table of estimators
SUMMARY = Summary(
    call="gamfunc.rwp(sigma, mix=0.0, seed=0)",
    computes="RWP (Li et al. 2022): ∇L(θ + ε), ε Gaussian scaled by each filter's norm; `mix=λ`: m-RWP, λ·g + (1 − λ)·∇L(θ + ε)",
    passes="1 (m-RWP: 2)",
)

_M32 = 0xFFFFFFFF


class RWPState(NamedTuple):
    """RWP's state, kept in ``StepState.est``.

    Attributes:
        key: a 0-d int64 tensor, the random key (``seed``): the noise of step t is a pure
            function of (key, t), so a state stacked with other keys (an ensemble's members)
            draws other noise.
    """

    key: Tensor


def _mul32(x: Tensor, c: int) -> Tensor:
    """The low 32 bits of x·c for 0 <= x < 2³², in int64 without overflow (two 16-bit halves of
    c)."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _M32


def _mix32(x: Tensor) -> Tensor:
    """A bijection of 32-bit integers with full avalanche (the "lowbias32" integer hash, constants
    0x7feb352d and 0x846ca68b), on int64 tensors holding values in [0, 2³²)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def gaussian(key: Tensor, step: Tensor, offset: int, shape, dtype, device) -> Tensor:
    """Standard normal numbers, a pure function of (``key``, ``step``, ``offset`` + index).

    Element i (flat index) of the result is counter c = offset + i: its two uniforms u₁, u₂ in
    (0, 1) hash 2c and 2c + 1 (their low 32 bits, `_mix32` twice) with a seed of the key and the
    step, then Box–Muller: z = √(−2 ln u₁)·cos(2π u₂), in float32 (float64 for float64). The bits of
    2c from bit 32 up, non-zero from counter 2³¹ on (a model of more than 2³¹ elements), re-key the
    seed; below 2³¹ the seed is the key's and the step's alone. Every counter draws its own numbers,
    so tensors given disjoint offsets draw independent ones. The same arguments give the same
    numbers on every device and under ``torch.compile`` and ``vmap`` (no generator, no global RNG).

    Args:
        key: a 0-d integer tensor, the random key.
        step: a 0-d integer tensor, the step count.
        offset: the counter of the first element.
        shape: the shape of the result.
        dtype: its dtype.
        device: its device.

    Returns:
        A tensor of ``shape`` and ``dtype``.
    """
    n = 1
    for s in shape:
        n *= s
    wide = tree.wide_dtype(dtype)
    seed = _mix32(_mix32(key.to(torch.int64) & _M32) ^ (step.to(torch.int64) & _M32))
    seed = seed.to(device)
    c = (torch.arange(n, dtype=torch.int64, device=device) + offset) * 2
    if offset + n > 2**31:  # the high word keys the hash too (`_mix32(0)` = 0: none below)
        seed = seed ^ _mix32(c >> 32)
    h1 = _mix32(_mix32(c & _M32) ^ seed)
    h2 = _mix32(_mix32((c + 1) & _M32) ^ seed)
    u1 = (h1.to(wide) + 0.5) / 2.0**32
    u2 = (h2.to(wide) + 0.5) / 2.0**32
    z = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos((2.0 * torch.pi) * u2)
    return z.reshape(shape).to(dtype)


# the most counters a draw of `normals` over several tensors covers (32 MiB an int64 temporary)
_RUN = 1 << 22


def normals(params: Tree, key: Tensor, step: Tensor) -> list[Tensor]:
    """The standard normal numbers of each tensor of ``params``, in its order and dtype: tensor l's
    are `gaussian`'s at offset = the sizes of the tensors before it. Consecutive tensors of one
    device and one `tree.wide_dtype` share a draw over their joint counter range while it stays
    within 2²² counters (and a larger tensor draws alone): the numbers are the same as one draw a
    tensor, in a handful of elementwise passes rather than one set per tensor."""
    ws = list(params.values())
    kinds = [(tree.wide_dtype(w.dtype), w.device) for w in ws]
    out, offset, i = [], 0, 0
    while i < len(ws):
        j, n = i + 1, ws[i].numel()
        while j < len(ws) and kinds[j] == kinds[i] and n + ws[j].numel() <= _RUN:
            n, j = n + ws[j].numel(), j + 1
        flat = gaussian(key, step, offset, (n,), *kinds[i])
        parts = flat.split([w.numel() for w in ws[i:j]])
        out += [z.reshape(w.shape).to(w.dtype) for z, w in zip(parts, ws[i:j], strict=True)]
        offset, i = offset + n, j
    return out


def noise(params: Tree, sigma, key: Tensor, step: Tensor) -> Tree:
    """RWP's perturbation ε: for each tensor W of θ with two or more dimensions, ε_j = σ·‖W_j‖·z_j
    for each filter j (a slice along dim 0), z standard normal; for a tensor of one dimension or
    none, σ·(‖W‖ + 10⁻¹⁶)·z (the authors' code). Norms in float32 or wider. The numbers z are
    `normals`': each tensor's from `gaussian` at its own offset (the sizes of the tensors before
    it, in the order of ``params``)."""
    out = {}
    for (k, w), z in zip(params.items(), normals(params, key, step), strict=True):
        wide = w.to(tree.wide_dtype(w.dtype))
        if w.dim() > 1:
            scale = torch.linalg.vector_norm(wide.reshape(w.shape[0], -1), dim=1)
            scale = scale.reshape((-1,) + (1,) * (w.dim() - 1))
        else:
            scale = torch.linalg.vector_norm(wide) + 1e-16
        out[k] = (sigma * scale * z).to(w.dtype)
    return out


def rwp(sigma, mix: float = 0.0, seed: int = 0) -> Estimator:
    r"""RWP (Li et al. 2022): the gradient at θ + ε, ε a random filter-wise scaled Gaussian.

    Random weight perturbation takes the gradient at a random neighbour of θ whose scale follows
    each filter's norm (Li et al. 2022, Section 3, the filter-wise form of their Eq. 6):

    $$
    \varepsilon_{l,j} \sim \mathcal N\big(0,\ \sigma^2\,\lVert W_{l,j}\rVert^2\,I\big),\qquad
    \text{direction} = (1-\lambda)\,\nabla L(\theta + \varepsilon) + \lambda\,\nabla L(\theta),
    $$

    W_{l,j} the j-th filter (slice along dim 0) of tensor l; a tensor of one dimension (a bias, a
    BatchNorm weight) is scaled by its whole norm, as the authors' code does. λ = ``mix`` = 0 is
    RWP, one gradient a step; λ in (0, 1) is the mixed form (m-RWP, and ARWP's), whose two
    gradients are independent of each other (λ = 1 would be the gradient alone:
    [`gamfunc.gradient`][gamfunc.estimators.gradient.gradient]). σ is ``sigma``. The authors'
    code for m-RWP (Li et al. 2024) weights the perturbed gradient by its λ, so theirs is
    1 − ``mix``, and it takes the two gradients on consecutive batches (two batches a step); here
    both are on the step's batch.

    Randomness: the noise of step t is a pure function of a key and t (`gaussian`, a counter-based
    hash, no ``torch.Generator`` and no global RNG), so the step stays pure and compiles in one
    graph, a skipped step retried draws the same noise, and runs repeat exactly. A step whose loss
    is not finite at θ + ε because of the noise itself is therefore retried with the same noise on
    the next batch: where every batch fails there (a parameter that must keep its sign, a large σ),
    each later step is skipped too, and ``StepState.skipped`` counts them; lower σ. The key lives in
    ``StepState.est`` ([`RWPState`][gamfunc.estimators.rwp.RWPState]), set from ``seed`` by
    ``step.init``; give each member of an ensemble a key of its own there.

    Warning:
        With ``mix`` = 0 the one pass is at θ + ε: ``info["loss"]`` and ``info["grad_norm"]`` are
        L(θ + ε) and ‖∇L(θ + ε)‖, and a BatchNorm model's running statistics come from that pass
        (as in the authors' code, which evaluates the model at the perturbed weights). Where the
        step already has the pass at θ ([`gamfunc.when.adaptive`][gamfunc.training.when.adaptive]'s probe),
        or with ``mix`` > 0, they are the pass at θ's. At a stationary point the direction is not
        0: it is the gradient at a random neighbour.

    Args:
        sigma: σ >= 0, the noise's scale relative to each filter's norm (float or a schedule).
        mix: λ in [0, 1), the weight of ∇L(θ) (0: RWP, one gradient; > 0: m-RWP, two).
        seed: the key of the noise, an integer in [0, 2³²).

    Returns:
        A stateful [`Estimator`][gamfunc.estimators.base.Estimator] named "rwp"; its info adds
            ``perturbed_loss`` = L(θ + ε) with ``mix`` > 0.

    Raises:
        ValueError: ``sigma`` is negative or not finite, ``mix`` not in [0, 1), ``seed`` not an
            integer in [0, 2³²) (naming the argument).

    Example:
        >>> import torch, gamfunc
        >>> loss_fn = lambda p, b: ((b[0] @ p["w"] - b[1]) ** 2).mean()
        >>> step = gamfunc.make_step(gamfunc.rwp(0.01), gamfunc.sgd(lr=0.1), loss_fn)
        >>> params = {"w": torch.ones(3)}
        >>> state = step.init(params)
        >>> params, state, metrics = step(params, state, (torch.randn(8, 3), torch.randn(8)))

    References:
        Li et al., "Efficient Generalization Improvement Guided by Random Weight Perturbation",
        2022, https://arxiv.org/abs/2211.11489.
        Li et al., "Revisiting Random Weight Perturbation for Efficiently Improving
        Generalization", 2024, https://arxiv.org/abs/2404.00357.
    """
    sigma = check_nonnegative("sigma", sigma, schedule=True)
    check_unit("mix", mix, below_one=True)
    check_int("seed", seed, at_least=0)
    if seed >= 2**32:
        raise ValueError(f"seed must be an integer in [0, 2**32); got {seed!r}")
    lam = float(mix)

    def init(params):
        device = next(iter(params.values())).device
        return RWPState(torch.full((), seed, dtype=torch.int64, device=device))

    def run(params, batch, loss_fn, clean, step, state):
        t = step if step is not None else torch.zeros((), dtype=torch.int64)
        eps = noise(params, value(sigma, step), state.key, t)
        adv = gradient_pass(loss_fn, tree.add(params, eps), batch)
        if lam == 0.0:
            seen = adv if clean is None else clean
            return Estimate(adv.grad, clean_info(seen), seen, state)
        if clean is None:
            clean = gradient_pass(loss_fn, params, batch)
        direction = tree.lincomb((lam, clean.grad), (1.0 - lam, adv.grad))
        info = {**clean_info(clean), "perturbed_loss": adv.loss}
        return Estimate(direction, info, clean, state)

    hparams = {"sigma": sigma, "mix": lam, "seed": seed}
    return Estimator("rwp", run, hparams, init_fn=init, state_type=RWPState)
