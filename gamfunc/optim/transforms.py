"""Transforms of a direction, the primitives the optimisers are built from, and [`chain`][gamfunc.optim.transforms.chain].

Everything here has the one contract of [`Transform`][gamfunc.optim.base.Transform] (optax's):
``init(params) -> state`` and ``update(direction, state, params) -> (updates, new_state)``, the new
parameters being ``gamfunc.apply_updates(params, updates)``. An optimiser is a chain of them (its
updates are its signed step, −η·…), so a chain can hold transforms before, between and after one:

```text
estimator ─ d ─▶ clip_by_global_norm ─▶ sgd(lr=1, momentum) ─▶ scale(0.1) ─▶ u;  θ ← θ + u
```

The primitives: [`trace`][gamfunc.optim.moments.trace] (momentum, as ``torch.optim.SGD``), [`scale_by_adam`][gamfunc.optim.moments.scale_by_adam],
[`scale_by_lion`][gamfunc.optim.moments.scale_by_lion], [`add_decayed_weights`][gamfunc.optim.transforms.add_decayed_weights] (weight decay, masked),
[`scale_by_learning_rate`][gamfunc.optim.transforms.scale_by_learning_rate]; [`gamfunc.sgd`][gamfunc.optim.sgd.sgd] is ``chain(add_decayed_weights, trace,
scale_by_learning_rate)`` with its lr and weight decay injected ([`gamfunc.inject_hyperparams`][gamfunc.inject_hyperparams]).
The three with running statistics (and their states) are defined in
``gamfunc.optim.moments`` and re-exported here.
An update that reads the step count (bias corrections, schedules) takes it as ``step=``, which
[`gamfunc.make_step`][gamfunc.make_step] and [`chain`][gamfunc.optim.transforms.chain] pass on ([`call_update`][gamfunc.optim.base.call_update]).

Example:
    >>> import torch, gamfunc
    >>> opt = gamfunc.chain(gamfunc.clip_by_global_norm(1.0), gamfunc.sgd(lr=0.1))
    >>> p = {"w": torch.zeros(2)}
    >>> u, state = opt.update({"w": torch.tensor([3.0, 4.0])}, opt.init(p), p)
    >>> gamfunc.apply_updates(p, u)["w"], state.states[0].norm
    (tensor([-0.0600, -0.0800]), tensor(5.))
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

import torch
from torch import Tensor

from gamfunc import tree
from gamfunc.checks import (
    check_mask,
    check_nonnegative,
    check_number,
    check_positive,
)
from gamfunc.optim.base import (
    Mask,
    Moved,
    Transform,
    call_update,
    check_like,
    check_state_type,
    masked_keys,
    need_step,
)

# the primitives with running statistics, re-exported: gamfunc.optim.transforms.trace, ...
from gamfunc.optim.moments import (
    ScaleByAdamState,
    ScaleByLionState,
    TraceState,
    scale_by_adam,
    scale_by_lion,
    trace,
)
from gamfunc.schedules import value

__all__ = [
    "ChainState",
    "ClipState",
    "ScaleByAdamState",
    "ScaleByLionState",
    "TraceState",
    "Transform",
    "add_decayed_weights",
    "chain",
    "clip_by_global_norm",
    "decay_mask",
    "scale",
    "scale_by_adam",
    "scale_by_learning_rate",
    "scale_by_lion",
    "trace",
]


class ClipState(NamedTuple):
    """The state of [`clip_by_global_norm`][gamfunc.optim.transforms.clip_by_global_norm].

    Attributes:
        norm: 0-d, ‖d‖₂ of the last direction before clipping (0 before the first update), in
            float32 or wider.
    """

    norm: Tensor


class ChainState(NamedTuple):
    """The state of [`chain`][gamfunc.optim.transforms.chain]: one state per element, in the chain's order.

    Attributes:
        states: the elements' states (a tuple), e.g. ``(ClipState(...), InjectState(...))``.
    """

    states: tuple


def clip_by_global_norm(max_norm: float, eps: float = 1e-6) -> Transform:
    r"""Scale the direction down to a global L2 norm of at most ``max_norm``, as ``clip_grad_norm_``.

    With d the direction over all parameters, c = ``max_norm``, ξ = ``eps``:

    $$
    d \leftarrow d \cdot \min(1, c / (\| d\| _{2} + \xi )), \qquad \| d\| _{2}^{2} = \sum _k \sum _i d[k]_i^{2}
    $$

    which is ``torch.nn.utils.clip_grad_norm_(params, max_norm)`` (ξ = 1e-6 there too): the same
    operations in the same order, so the results are equal. The factor is a clamp, not a branch, and
    the direction is multiplied by it even when it is 1.

    Args:
        max_norm: c > 0, the largest global norm the direction keeps.
        eps: ξ >= 0, added to the norm before dividing.

    Returns:
        A [`Transform`][gamfunc.optim.transforms.Transform] whose state is a [`ClipState`][gamfunc.optim.transforms.ClipState]: ‖d‖₂ of the last direction
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
    max_norm = check_positive("max_norm", max_norm)
    eps = check_nonnegative("eps", eps)

    def init(params):
        dev = next(iter(params.values())).device if params else torch.device("cpu")
        return ClipState(torch.zeros((), dtype=_norm_dtype(params.values()), device=dev))

    def update(direction, state, params):
        clipped, n = tree.clip_norm(direction, max_norm, eps)
        return clipped, ClipState(n)

    return Transform(init, update)


def _norm_dtype(leaves: Iterable[Tensor]) -> torch.dtype:
    dtype = torch.float32
    for v in leaves:
        dtype = torch.promote_types(dtype, v.dtype)
    return dtype


def chain(*elements: Transform) -> Transform:
    """Transforms applied in order, each to the updates of the one before: one Transform.

    With d the direction and e₁ … eₙ the elements:

    ```text
    u₀ = d,   uᵢ = eᵢ.update(uᵢ₋₁, sᵢ, θ),   updates = uₙ
    ```

    as ``optax.chain``. An optimiser may stand anywhere: transforms before it see the direction
    ([`clip_by_global_norm`][gamfunc.optim.transforms.clip_by_global_norm], [`add_decayed_weights`][gamfunc.optim.transforms.add_decayed_weights] = coupled weight decay), those after
    it see its signed step ([`scale`][gamfunc.optim.transforms.scale], a clip of the step). A chain is a Transform, so chains
    nest; its state is a [`ChainState`][gamfunc.optim.transforms.ChainState]. The step count given to its update goes to every
    element that takes it ([`call_update`][gamfunc.optim.base.call_update]).

    Args:
        *elements: one or more [`Transform`][gamfunc.optim.base.Transform] (optimisers included).

    Returns:
        A [`Transform`][gamfunc.optim.base.Transform].

    Raises:
        ValueError: no element, or an element that is not a Transform (naming its index).

    Example:
        >>> import torch, gamfunc
        >>> loss_fn = lambda p, b: ((b[0] @ p["w"] - b[1]) ** 2).mean()
        >>> opt = gamfunc.chain(gamfunc.clip_by_global_norm(1.0), gamfunc.adamw(1e-3))
        >>> step = gamfunc.make_step(gamfunc.sam(0.05), opt, loss_fn)
        >>> params = {"w": torch.zeros(3)}
        >>> params, state, metrics = step(params, step.init(params), (torch.randn(8, 3), torch.randn(8)))
        >>> type(state.opt).__name__, int(state.step), round(float(metrics["lr"]), 6)
        ('ChainState', 1, 0.001)
    """
    if not elements:
        raise ValueError("chain needs at least one element (a transform or an optimizer)")
    for i, t in enumerate(elements):
        if not isinstance(t, Transform):
            raise ValueError(
                f"chain's elements must be gamfunc Transforms (optimisers included); "
                f"elements[{i}] is a {type(t).__name__}"
            )

    def init(params):
        return ChainState(tuple(t.init(params) for t in elements))

    def update(direction, state, params, *, step=None):
        check_like(params, direction)
        check_state_type(state, ChainState, "chain")
        if len(state.states) != len(elements):
            n = len(state.states)
            check_state_type(state, ChainState, "chain", f" of {n} states for {len(elements)}")
        new_states = []
        for i, (t, s) in enumerate(zip(elements, state.states, strict=True)):
            direction, s = call_update(t, direction, s, params, step)
            if isinstance(direction, Moved) and i < len(elements) - 1:
                raise ValueError(
                    f"chain's elements[{i}] moves the parameters itself (a torch.optim "
                    f"optimiser): it must be the chain's last element"
                )
            new_states.append(s)
        return direction, ChainState(tuple(new_states))

    return Transform(init, update)


def scale(factor: float) -> Transform:
    """Multiply the updates by a constant: u ← c·u, c = ``factor`` (stateless).

    After an optimiser it scales its step, e.g. an lr multiplier for some parameters
    ([`gamfunc.param_groups`][gamfunc.param_groups] does that with a separate optimiser per group instead).

    Args:
        factor: c, a finite number.

    Returns:
        A stateless [`Transform`][gamfunc.optim.base.Transform].

    Raises:
        ValueError: ``factor`` is not a finite number.

    Example:
        >>> import torch, gamfunc
        >>> s = gamfunc.optim.transforms.scale(0.5)
        >>> s.update({"w": torch.ones(2)}, s.init({}), {})[0]
        {'w': tensor([0.5000, 0.5000])}
    """
    factor = check_number("factor", factor)

    def init(params):
        return ()

    def update(direction, state, params):
        return tree.scale(direction, factor), state

    return Transform(init, update)


def _nonzero(v) -> bool:
    """Whether ``v`` may be other than 0: a schedule or a tensor may; a number is read here."""
    return callable(v) or isinstance(v, Tensor) or v != 0


def add_decayed_weights(
    weight_decay=0.0, mask: Mask = None, *, mask_name: str = "mask"
) -> Transform:
    """Weight decay as a transform: u ← u + λ·θ where the mask is true (stateless).

    Before a scaling of the direction ([`trace`][gamfunc.optim.moments.trace], [`scale_by_adam`][gamfunc.optim.moments.scale_by_adam]) it is coupled (L2)
    decay, ``torch.optim.SGD``'s and ``Adam``'s ``weight_decay``; after it and before
    [`scale_by_learning_rate`][gamfunc.optim.transforms.scale_by_learning_rate] it is decoupled decay, ``AdamW``'s. λ is ``weight_decay``. Every
    gamfunc optimiser decays through this one transform.

    Args:
        weight_decay: λ >= 0, a tensor of one element, or a schedule of the step count (then
            ``update`` needs ``step=``). A tensor's value is not read (this factory runs at every
            update of an injected optimiser): a negative or non-finite λ makes the updates NaN,
            which the step's guard skips ([`gamfunc.checks`][gamfunc.checks]).
        mask: which parameters decay: None (all, as torch.optim), a dict name -> bool naming every
            parameter, or a callable ``(name, tensor) -> bool`` that decides from the name or shape
            ([`decay_mask`][gamfunc.optim.transforms.decay_mask] gives the usual choice). Equal to torch.optim with two param groups,
            the masked-out one with ``weight_decay=0``.
        mask_name: the name errors give the mask (the optimisers' ``weight_decay_mask``).

    Returns:
        A stateless [`Transform`][gamfunc.optim.base.Transform].

    Raises:
        ValueError: ``weight_decay`` or ``mask`` is invalid (naming it), or a schedule whose
            ``bounds`` reach below 0.

    Example:
        >>> import torch, gamfunc
        >>> wd = gamfunc.add_decayed_weights(0.1)
        >>> p = {"w": torch.ones(2)}
        >>> wd.update({"w": torch.zeros(2)}, wd.init(p), p)[0]
        {'w': tensor([0.1000, 0.1000])}
    """
    weight_decay = check_nonnegative("weight_decay", weight_decay, schedule=True, read=False)
    check_mask(mask_name, mask)
    decays = _nonzero(weight_decay)

    def init(params):
        masked_keys(mask, params, mask_name)
        return ()

    def update(direction, state, params, *, step=None):
        keys = masked_keys(mask, params, mask_name)
        if not decays or not keys:
            return direction, state
        if callable(weight_decay):
            step = need_step(step, "a weight_decay schedule")
        lam = value(weight_decay, step)
        if len(keys) == len(params):
            return tree.axpy(lam, params, direction), state
        some = tree.axpy(lam, {k: params[k] for k in keys}, {k: direction[k] for k in keys})
        return direction | some, state

    return Transform(init, update)


def scale_by_learning_rate(lr) -> Transform:
    """The learning rate, at the end of a chain: u ← −η_t·u, η_t = ``lr`` at the step t (stateless).

    ``chain(clip, add_decayed_weights(λ), scale_by_learning_rate(η))`` is ``torch.optim.SGD(lr=η,
    weight_decay=λ)`` after clipping. Its η is not in its state: a step logs it, and a caller sets
    it between steps, where the chain is built by [`gamfunc.inject_hyperparams`][gamfunc.inject_hyperparams], as
    ``gamfunc.inject_hyperparams(scale_by_learning_rate)(lr=η)`` or as [`gamfunc.sgd`][gamfunc.optim.sgd.sgd] does.

    Args:
        lr: η, a float >= 0, a tensor of one element or a schedule (then ``update`` needs
            ``step=``). A tensor's value is not read (this factory runs at every update of an
            injected optimiser, with the lr of its state): a negative or non-finite η makes the
            updates NaN, which the step's guard skips. That is the per-step check of every
            gamfunc optimiser's lr, on the device ([`gamfunc.checks`][gamfunc.checks]).

    Returns:
        A stateless [`Transform`][gamfunc.optim.base.Transform].

    Raises:
        ValueError: ``lr`` is not a finite number >= 0, a tensor of one element or a schedule, or
            is a schedule whose ``bounds`` reach below 0.

    Example:
        >>> import torch, gamfunc
        >>> opt = gamfunc.scale_by_learning_rate(0.1)
        >>> p = {"w": torch.ones(2)}
        >>> opt.update({"w": torch.ones(2)}, opt.init(p), p)[0]
        {'w': tensor([-0.1000, -0.1000])}
    """
    lr = check_nonnegative("lr", lr, schedule=True, read=False)

    def init(params):
        return ()

    def update(direction, state, params, *, step=None):
        eta = value(lr, need_step(step, "an lr schedule") if callable(lr) else None)
        # −(η·d), so that θ + u is θ − η·d to the last bit, as torch.optim.SGD
        return tree.scale(direction, -eta), state

    return Transform(init, update)


def decay_mask(params: Mapping[str, Tensor] | Iterable[tuple[str, Tensor]]) -> dict[str, bool]:
    """The usual ``weight_decay_mask``: decay the tensors with two or more dimensions only.

    Weights of linear and convolution layers (and embeddings) decay; biases and the scales and shifts
    of normalisation layers, all one-dimensional, do not. This is the split of timm's
    ``param_groups_weight_decay`` (no decay where ``ndim <= 1``, the one timm uses for ViT), without
    its per-model ``no_weight_decay()`` list: edit the dict to exempt a 3-d ``pos_embed`` or
    ``cls_token`` as well. Give the result to [`gamfunc.sgd`][gamfunc.optim.sgd.sgd] or [`gamfunc.adamw`][gamfunc.optim.adamw.adamw]:

    ```python
    mask[k] = (params[k].ndim >= 2)
    ```

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
