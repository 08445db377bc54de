"""Transforms of the direction between an estimator and an optimiser: clipping, chained in optax's style.

A :class:`Transform` is a pair of pure functions like an optimiser's, ``init(params) -> state`` and
``update(direction, state, params) -> (new_direction, new_state)``; a stateless one carries ``()``.
:func:`chain` puts any number of them in front of an :class:`~gamfunc.optim.base.Optimizer` and is
itself an Optimizer (its state a :class:`ChainState`), so :func:`gamfunc.make_step` and
:mod:`gamfunc.torch_optim` take it unchanged::

    estimator ─ direction ─▶ transform₁ ─▶ … ─▶ transformₙ ─▶ optimizer.update ─▶ params

:func:`decay_mask` is the usual ``weight_decay_mask`` of :func:`gamfunc.sgd` and :func:`gamfunc.adamw`.

Example:
    >>> import torch, gamfunc
    >>> opt = gamfunc.chain(gamfunc.clip_by_global_norm(1.0), gamfunc.sgd(lr=0.1))
    >>> p = {"w": torch.zeros(2)}
    >>> p, state = opt.update({"w": torch.tensor([3.0, 4.0])}, opt.init(p), p)
    >>> p["w"], state.transforms[0].norm
    (tensor([-0.0600, -0.0800]), tensor(5.))
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor

from gamfunc import tree
from gamfunc.optim.base import Optimizer
from gamfunc.tree import Tree

__all__ = [
    "ChainState",
    "ClipState",
    "Transform",
    "chain",
    "clip_by_global_norm",
    "decay_mask",
]


class Transform(NamedTuple):
    """``init(params) -> state``; ``update(direction, state, params) -> (new_direction, new_state)``.

    ``state`` is a pytree of tensors, a NamedTuple such as :class:`ClipState` (``()`` for a
    stateless transform). Neither function mutates its arguments, and ``update`` branches on no
    tensor value, so a chain traces under ``torch.compile(fullgraph=True)``.
    """

    init: Callable[[Tree], Any]
    update: Callable[[Tree, Any, Tree], tuple[Tree, Any]]


class ClipState(NamedTuple):
    """The state of :func:`clip_by_global_norm`.

    Attributes:
        norm: 0-d, ‖d‖₂ of the last direction before clipping (0 before the first update), in
            float32 or wider.
    """

    norm: Tensor


class ChainState(NamedTuple):
    """The state of :func:`chain`: the optimiser's state and one state per transform.

    ``step`` and ``lr`` read through to the optimiser's, so ``state.lr`` is the learning rate
    whatever the optimiser; :func:`gamfunc.optim.base.with_hyper` replaces them there.

    Attributes:
        opt: the optimiser's state (e.g. :class:`~gamfunc.optim.adamw.AdamWState`).
        transforms: the transforms' states, in the order of the chain (a tuple).
    """

    opt: Any
    transforms: tuple

    @property
    def step(self) -> Tensor:
        """The optimiser's step counter."""
        return self.opt.step

    @property
    def lr(self) -> Tensor:
        """The optimiser's learning rate."""
        return self.opt.lr


def clip_by_global_norm(max_norm: float, eps: float = 1e-6) -> Transform:
    """Scale the direction down to a global L2 norm of at most ``max_norm``, as ``clip_grad_norm_``.

    With d the direction over all parameters, c = ``max_norm``, ξ = ``eps``::

        d ← d · min(1, c / (‖d‖₂ + ξ)),     ‖d‖₂² = Σ_k Σ_i d[k]_i²

    which is ``torch.nn.utils.clip_grad_norm_(params, max_norm)`` (ξ = 1e-6 there too): the same
    operations in the same order, so the results are equal. The factor is a clamp, not a branch, and
    the direction is multiplied by it even when it is 1.

    Args:
        max_norm: c > 0, the largest global norm the direction keeps.
        eps: ξ >= 0, added to the norm before dividing.

    Returns:
        A :class:`Transform` whose state is a :class:`ClipState`: ‖d‖₂ of the last direction
        before clipping.

    Example:
        >>> import torch, gamfunc
        >>> clip = gamfunc.clip_by_global_norm(1.0)
        >>> d = {"w": torch.tensor([3.0, 4.0])}
        >>> d, state = clip.update(d, clip.init(d), d)
        >>> d["w"], state.norm
        (tensor([0.6000, 0.8000]), tensor(5.))

    Warning:
        For bfloat16 and float16 directions the norm is computed in float32 (torch.nn.utils computes
        it in the directions' own dtype); the product with the factor stays in the directions' dtype.

    References:
        Pascanu, Mikolov and Bengio, "On the difficulty of training recurrent neural networks",
        ICML 2013, https://arxiv.org/abs/1211.5063.
    """
    _check_number("max_norm", max_norm, positive=True)
    _check_number("eps", eps, positive=False)

    def init(params):
        dev = next(iter(params.values())).device if params else torch.device("cpu")
        return ClipState(torch.zeros((), dtype=_norm_dtype(params.values()), device=dev))

    def update(direction, state, params):
        n = tree.norm(direction)  # in float32 or wider
        coef = torch.clamp(max_norm / (n + eps), max=1.0)  # clip_grad_norm_'s expression
        return tree.scale(direction, coef), ClipState(n)

    return Transform(init, update)


def _norm_dtype(leaves: Iterable[Tensor]) -> torch.dtype:
    dtype = torch.float32
    for v in leaves:
        dtype = torch.promote_types(dtype, v.dtype)
    return dtype


def chain(*transforms_and_optimizer: Transform | Optimizer) -> Optimizer:
    """Transforms of the direction, applied in order, then an optimiser: one new optimiser.

    ``chain(t₁, …, tₙ, opt)`` moves by ``opt.update(tₙ(…t₁(d)…), …)``, as ``optax.chain`` does
    with the optimiser as its last element. Its state is a :class:`ChainState`: the optimiser's
    own (``.opt``) and the transforms' (``.transforms``, a tuple in the chain's order); ``.step``
    and ``.lr`` read the optimiser's, so ``state.opt.lr`` in a step is the learning rate whatever
    the optimiser. A chain given as the optimiser of another chain is flattened into it.

    Args:
        *transforms_and_optimizer: zero or more :class:`Transform` (e.g.
            :func:`clip_by_global_norm`), then one :class:`~gamfunc.optim.base.Optimizer` (e.g.
            :func:`gamfunc.adamw`).

    Returns:
        An :class:`~gamfunc.optim.base.Optimizer`.

    Example:
        >>> import torch, gamfunc
        >>> loss_fn = lambda p, b: ((b[0] @ p["w"] - b[1]) ** 2).mean()
        >>> opt = gamfunc.chain(gamfunc.clip_by_global_norm(1.0), gamfunc.adamw(1e-3))
        >>> step = gamfunc.make_step(gamfunc.sam(0.05), opt, loss_fn)
        >>> params = {"w": torch.zeros(3)}
        >>> params, state, metrics = step(params, step.init(params), (torch.randn(8, 3), torch.randn(8)))
        >>> type(state.opt).__name__, type(state.opt.opt).__name__, float(state.opt.lr)
        ('ChainState', 'AdamWState', 0.001)
    """
    if not transforms_and_optimizer or not isinstance(transforms_and_optimizer[-1], Optimizer):
        last = (
            type(transforms_and_optimizer[-1]).__name__ if transforms_and_optimizer else "nothing"
        )
        raise ValueError(
            f"chain's last argument (optimizer) must be a gamfunc Optimizer such as "
            f"gamfunc.sgd(...); got {last}"
        )
    *transforms, optimizer = transforms_and_optimizer
    for i, t in enumerate(transforms):
        if not isinstance(t, Transform):
            raise ValueError(
                f"chain's arguments before the optimizer (transforms) must be gamfunc Transforms; "
                f"transforms[{i}] is a {type(t).__name__}"
            )
    inner = getattr(optimizer.update, "chain", None)
    if inner is not None:  # chain(a, chain(b, opt)) is chain(a, b, opt)
        transforms, optimizer = [*transforms, *inner[0]], inner[1]

    def init(params):
        return ChainState(optimizer.init(params), tuple(t.init(params) for t in transforms))

    def update(direction, state, params):
        new_states = []
        for t, s in zip(transforms, state.transforms, strict=True):
            direction, s = t.update(direction, s, params)
            new_states.append(s)
        new_params, new_opt = optimizer.update(direction, state.opt, params)
        return new_params, ChainState(new_opt, tuple(new_states))

    update.chain = (tuple(transforms), optimizer)
    return Optimizer(init, update)


def decay_mask(params: Mapping[str, Tensor] | Iterable[tuple[str, Tensor]]) -> dict[str, bool]:
    """The usual ``weight_decay_mask``: decay the tensors with two or more dimensions only.

    Weights of linear and convolution layers (and embeddings) decay; biases and the scales and shifts
    of normalisation layers, all one-dimensional, do not. This is the split of timm's
    ``param_groups_weight_decay`` (no decay where ``ndim <= 1``, the one timm uses for ViT), without
    its per-model ``no_weight_decay()`` list: edit the dict to exempt a 3-d ``pos_embed`` or
    ``cls_token`` as well. Give the result to :func:`gamfunc.sgd` or :func:`gamfunc.adamw`::

        mask[k] = (params[k].ndim >= 2)

    Args:
        params: a dict name -> tensor, or ``model.named_parameters()``.

    Returns:
        A dict name -> bool, in the order of ``params``.

    Example:
        >>> import torch, gamfunc
        >>> params = dict(torch.nn.Linear(3, 2).named_parameters())
        >>> gamfunc.decay_mask(params)
        {'weight': True, 'bias': False}
        >>> opt = gamfunc.adamw(1e-3, weight_decay=0.05, weight_decay_mask=gamfunc.decay_mask(params))

    References:
        Loshchilov and Hutter, "Decoupled Weight Decay Regularization", ICLR 2019,
        https://arxiv.org/abs/1711.05101.
    """
    items = params.items() if isinstance(params, Mapping) else params
    return {k: v.ndim >= 2 for k, v in items}


def _check_number(name: str, v, *, positive: bool) -> None:
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    if not ok or (v <= 0 if positive else v < 0):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{name} must be a finite number {bound}; got {v!r}")
