"""Transforms of a direction, and :func:`chain`, which composes them with optimisers in any order.

Everything here has the one contract of :class:`~gamfunc.optim.base.Transform` (optax's):
``init(params) -> state`` and ``update(direction, state, params) -> (updates, new_state)``, the new
parameters being ``gamfunc.apply_updates(params, updates)``. An optimiser is such a transform (its
updates are its signed step, −η·…), so a chain can hold transforms before, between and after it::

    estimator ─ d ─▶ clip_by_global_norm ─▶ sgd(lr=1, momentum) ─▶ scale(0.1) ─▶ u;  θ ← θ + u

:func:`add_decayed_weights` is coupled weight decay as a transform, :func:`scale_by_learning_rate`
the learning rate at the end of a chain (η, or a schedule, with the step counter and lr of an
optimiser), :func:`decay_mask` the usual ``weight_decay_mask``.

Example:
    >>> import torch, gamfunc
    >>> opt = gamfunc.chain(gamfunc.clip_by_global_norm(1.0), gamfunc.sgd(lr=0.1))
    >>> p = {"w": torch.zeros(2)}
    >>> u, state = opt.update({"w": torch.tensor([3.0, 4.0])}, opt.init(p), p)
    >>> gamfunc.apply_updates(p, u)["w"], state.transforms[0].norm
    (tensor([-0.0600, -0.0800]), tensor(5.))
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import NamedTuple

import torch
from torch import Tensor

from gamfunc import tree
from gamfunc.optim.base import (
    Mask,
    ScheduledLR,
    Transform,
    check_lr,
    check_mask,
    hyper_state,
    learning_rate,
    lr_scheduled,
    masked_keys,
    with_hyper,
)

__all__ = [
    "ChainState",
    "ClipState",
    "LRState",
    "ScheduledLRState",
    "Transform",
    "add_decayed_weights",
    "chain",
    "clip_by_global_norm",
    "decay_mask",
    "scale",
    "scale_by_learning_rate",
]


class ClipState(NamedTuple):
    """The state of :func:`clip_by_global_norm`.

    Attributes:
        norm: 0-d, ‖d‖₂ of the last direction before clipping (0 before the first update), in
            float32 or wider.
    """

    norm: Tensor


class ChainState(NamedTuple):
    """The state of :func:`chain`: one state per element, in the chain's order.

    The chain's step counter and learning rate are those of its first element that has them (its
    optimiser, or :func:`scale_by_learning_rate`): ``state.step``, ``state.lr`` and ``state.opt``
    (that element's state) read them, ``state.transforms`` gives the other elements' states in
    order, and :func:`gamfunc.optim.with_hyper` sets ``lr`` there and ``step`` in every element
    that counts steps.

    Attributes:
        states: the elements' states (a tuple), e.g. ``(ClipState(...), SGDState(...))``.
    """

    states: tuple

    def _counting(self) -> list[int]:
        return [i for i, s in enumerate(self.states) if _has_hyper(s)]

    @property
    def opt(self):
        """The state of the first element with a step counter and an lr (the optimiser's)."""
        counting = self._counting()
        if not counting:
            raise AttributeError("this chain has no optimiser: no element keeps step and lr")
        return self.states[counting[0]]

    @property
    def transforms(self) -> tuple:
        """The states of the other elements, in the chain's order."""
        counting = self._counting()
        return tuple(s for i, s in enumerate(self.states) if not counting or i != counting[0])

    @property
    def step(self) -> Tensor:
        """The optimiser's step counter."""
        return self.opt.step

    @property
    def lr(self) -> Tensor:
        """The optimiser's learning rate (of its last update)."""
        return self.opt.lr

    def lr_scheduled(self) -> bool:
        """Whether the optimiser's lr is a schedule's."""
        return lr_scheduled(self.opt)

    def with_hyper(self, **changes: Tensor) -> ChainState:
        """This state with ``lr`` set in the optimiser's state and ``step`` in every counting one."""
        counting = self._counting()
        if not counting:
            raise TypeError("this chain has no element with step and lr (no optimiser) to change")
        states = list(self.states)
        for n, i in enumerate(counting):
            mine = changes if n == 0 else {k: v for k, v in changes.items() if k == "step"}
            if mine:
                states[i] = with_hyper(states[i], **mine)
        return ChainState(tuple(states))


def _has_hyper(state) -> bool:
    return hasattr(state, "step") and hasattr(state, "lr")


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


def chain(*elements: Transform) -> Transform:
    """Transforms and optimisers applied in order, each to the updates of the one before: one Transform.

    With d the direction and e₁ … eₙ the elements::

        u₀ = d,   uᵢ = eᵢ.update(uᵢ₋₁, sᵢ, θ),   updates = uₙ

    as ``optax.chain``. An optimiser may stand anywhere: transforms before it see the direction
    (:func:`clip_by_global_norm`, :func:`add_decayed_weights` = coupled weight decay), those after
    it see its signed step (:func:`scale`, a clip of the step). A chain is a Transform, so chains
    nest; its state is a :class:`ChainState` (``.step``, ``.lr``: the first optimiser's).

    Args:
        *elements: one or more :class:`~gamfunc.optim.base.Transform` (optimisers included).

    Returns:
        A :class:`~gamfunc.optim.base.Transform`.

    Raises:
        ValueError: no element, or an element that is not a Transform (naming its index).

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
    if not elements:
        raise ValueError("chain needs at least one element (a transform or an optimizer)")
    for i, t in enumerate(elements):
        if not isinstance(t, Transform):
            raise ValueError(
                f"chain's elements must be gamfunc Transforms (optimisers included); "
                f"elements[{i}] is a {type(t).__name__}"
            )
    parts = elements

    def init(params):
        return ChainState(tuple(t.init(params) for t in parts))

    def update(direction, state, params):
        new_states = []
        for t, s in zip(parts, state.states, strict=True):
            direction, s = t.update(direction, s, params)
            new_states.append(s)
        return direction, ChainState(tuple(new_states))

    return Transform(init, update)


def scale(factor: float) -> Transform:
    """Multiply the updates by a constant: u ← c·u, c = ``factor`` (stateless).

    After an optimiser it scales its step, e.g. an lr multiplier for some parameters
    (:func:`gamfunc.param_groups` does that with a separate optimiser per group instead).

    Args:
        factor: c, a finite number.

    Example:
        >>> import torch, gamfunc
        >>> s = gamfunc.transforms.scale(0.5)
        >>> s.update({"w": torch.ones(2)}, s.init({}), {})[0]
        {'w': tensor([0.5000, 0.5000])}
    """
    _check_number("factor", factor, positive=False, signed=True)

    def init(params):
        return ()

    def update(direction, state, params):
        return tree.scale(direction, factor), state

    return Transform(init, update)


def add_decayed_weights(weight_decay: float, mask: Mask = None) -> Transform:
    """Coupled (L2) weight decay as a transform: u ← u + λ·θ where the mask is true (stateless).

    Before :func:`gamfunc.sgd` it is ``torch.optim.SGD``'s ``weight_decay``; between a scaling of
    the direction and :func:`scale_by_learning_rate` it is decoupled decay (AdamW's form). λ is
    ``weight_decay``.

    Args:
        weight_decay: λ >= 0.
        mask: which parameters decay, as the ``weight_decay_mask`` of :func:`gamfunc.sgd`: None
            (all), a dict name -> bool naming every parameter, or ``(name, tensor) -> bool``.

    Example:
        >>> import torch, gamfunc
        >>> wd = gamfunc.add_decayed_weights(0.1)
        >>> p = {"w": torch.ones(2)}
        >>> wd.update({"w": torch.zeros(2)}, wd.init(p), p)[0]
        {'w': tensor([0.1000, 0.1000])}
    """
    _check_number("weight_decay", weight_decay, positive=False)
    check_mask(mask, "mask")

    def init(params):
        masked_keys(mask, params, "mask")
        return ()

    def update(direction, state, params):
        keys = masked_keys(mask, params, "mask")
        if weight_decay == 0 or not keys:
            return direction, state
        some = tree.axpy(
            weight_decay, {k: params[k] for k in keys}, {k: direction[k] for k in keys}
        )
        return direction | some, state

    return Transform(init, update)


class LRState(NamedTuple):
    """The state of :func:`scale_by_learning_rate`: a step counter and the lr of the last update,
    as an optimiser's (:class:`~gamfunc.optim.base.Transform` tells how they are used)."""

    step: Tensor
    lr: Tensor


class ScheduledLRState(LRState, ScheduledLR):
    """An :class:`LRState` whose lr a schedule sets."""

    __slots__ = ()


def scale_by_learning_rate(lr) -> Transform:
    """The learning rate at the end of a chain: u ← −η_t·u, η_t = ``lr`` at the step t.

    It keeps a step counter and the lr of its last update, as an optimiser does, so a chain ending
    in it is an optimiser for :func:`gamfunc.make_step` and the facades: ``chain(clip,
    add_decayed_weights(λ), scale_by_learning_rate(η))`` is ``torch.optim.SGD(lr=η,
    weight_decay=λ)`` after clipping, and ``with_hyper(state, lr=...)`` sets a constant η.

    Args:
        lr: η, a float >= 0 or a schedule (:mod:`gamfunc.schedules`).

    Example:
        >>> import torch, gamfunc
        >>> opt = gamfunc.scale_by_learning_rate(0.1)
        >>> p = {"w": torch.ones(2)}
        >>> opt.update({"w": torch.ones(2)}, opt.init(p), p)[0]
        {'w': tensor([-0.1000, -0.1000])}
    """
    check_lr(lr)
    State = ScheduledLRState if callable(lr) else LRState

    def init(params):
        return State(*hyper_state(params, lr))

    def update(direction, state, params):
        eta = learning_rate(lr, state)
        return tree.scale(direction, -eta), State(state.step + 1, eta)

    return Transform(init, update)


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


def _check_number(name: str, v, *, positive: bool, signed: bool = False) -> None:
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    if ok and signed:
        return
    if not ok or (v <= 0 if positive else v < 0):
        bound = "" if signed else " > 0" if positive else " >= 0"
        raise ValueError(f"{name} must be a finite number{bound}; got {v!r}")
