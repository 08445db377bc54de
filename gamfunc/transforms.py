"""Transforms of the direction between an estimator and an optimiser: clipping, chained in optax's style.

A :class:`Transform` is a pair of pure functions like an optimiser's, ``init(params) -> state`` and
``update(direction, state, params) -> (new_direction, new_state)``; a stateless one carries ``{}``.
:func:`chain` puts any number of them in front of an :class:`~gamfunc.optim.base.Optimizer` and is
itself an Optimizer, so :func:`gamfunc.make_step` and :mod:`gamfunc.torch_optim` take it unchanged::

    estimator ─ direction ─▶ transform₁ ─▶ … ─▶ transformₙ ─▶ optimizer.update ─▶ params

:func:`decay_mask` is the usual ``weight_decay_mask`` of :func:`gamfunc.sgd` and :func:`gamfunc.adamw`.

Example:
    >>> import torch, gamfunc
    >>> opt = gamfunc.chain(gamfunc.clip_by_global_norm(1.0), gamfunc.sgd(lr=0.1))
    >>> p = {"w": torch.zeros(2)}
    >>> p, state = opt.update({"w": torch.tensor([3.0, 4.0])}, opt.init(p), p)
    >>> p["w"], state["transforms"]["0"]["norm"]
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

__all__ = ["KEY", "Transform", "chain", "clip_by_global_norm", "decay_mask"]

KEY = "transforms"
"""The entry of a chained optimiser's state that holds its transforms' states, ``{"0": ..., "1": ...}``."""


class Transform(NamedTuple):
    """``init(params) -> state``; ``update(direction, state, params) -> (new_direction, new_state)``.

    ``state`` is a dict of tensors (``{}`` for a stateless transform). Neither function mutates its
    arguments, and ``update`` branches on no tensor value, so a chain traces under
    ``torch.compile(fullgraph=True)``.
    """

    init: Callable[[Tree], dict[str, Any]]
    update: Callable[[Tree, dict[str, Any], Tree], tuple[Tree, dict[str, Any]]]


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
        A :class:`Transform` whose state is ``{"norm": ‖d‖₂}``, the norm of the last direction before
        clipping (0 before the first update), in float32 or wider.

    Example:
        >>> import torch, gamfunc
        >>> clip = gamfunc.clip_by_global_norm(1.0)
        >>> d = {"w": torch.tensor([3.0, 4.0])}
        >>> d, state = clip.update(d, clip.init(d), d)
        >>> d["w"], state["norm"]
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
        return {"norm": torch.zeros((), dtype=_norm_dtype(params.values()), device=dev)}

    def update(direction, state, params):
        n = tree.norm(direction)  # in float32 or wider
        coef = torch.clamp(max_norm / (n + eps), max=1.0)  # clip_grad_norm_'s expression
        return tree.scale(direction, coef), {"norm": n}

    return Transform(init, update)


def _norm_dtype(leaves: Iterable[Tensor]) -> torch.dtype:
    dtype = torch.float32
    for v in leaves:
        dtype = torch.promote_types(dtype, v.dtype)
    return dtype


def chain(*transforms_and_optimizer: Transform | Optimizer) -> Optimizer:
    """Transforms of the direction, applied in order, then an optimiser: one new optimiser.

    ``chain(t₁, …, tₙ, opt)`` moves by ``opt.update(tₙ(…t₁(d)…), …)``, as ``optax.chain`` does
    with the optimiser as its last element. Its state is the optimiser's own dict (``step``, ``lr``
    and the buffers stay where code reads them, ``state["opt"]["lr"]`` in a step) with one more
    entry, ``state["transforms"] = {"0": state of t₁, "1": state of t₂, ...}``. A chain given as the
    optimiser of another chain is flattened into it.

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
        >>> sorted(state["opt"])
        ['exp_avg', 'exp_avg_sq', 'lr', 'step', 'transforms']
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
    names = [str(i) for i in range(len(transforms))]

    def init(params):
        state = optimizer.init(params)
        if KEY in state:
            raise ValueError(f"the optimizer's state already has an entry {KEY!r}")
        return state | {KEY: {n: t.init(params) for n, t in zip(names, transforms, strict=True)}}

    def update(direction, state, params):
        inner_state = {k: v for k, v in state.items() if k != KEY}
        new_states = {}
        for n, t in zip(names, transforms, strict=True):
            direction, new_states[n] = t.update(direction, state[KEY][n], params)
        new_params, new_state = optimizer.update(direction, inner_state, params)
        return new_params, new_state | {KEY: new_states}

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
