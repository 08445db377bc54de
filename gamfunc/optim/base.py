"""The one contract of optimisers and transforms: ``init`` and ``update`` returning updates,
[`apply_updates`][gamfunc.optim.base.apply_updates], and [`call_update`][gamfunc.optim.base.call_update], which gives the step count to an update that reads
it."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor

from gamfunc import tree
from gamfunc.checks import Mask, masked_keys
from gamfunc.tree import Tree

__all__ = [
    "Mask",
    "Moved",
    "Transform",
    "apply_updates",
    "call_update",
    "check_like",
    "check_state_type",
    "masked_keys",
    "need_step",
    "takes_step",
]


class Transform(NamedTuple):
    """The one contract of everything that turns a direction into a move: optimisers and transforms.

    ``init(params) -> state``; ``update(direction, state, params) -> (updates, new_state)``, and the
    new parameters are ``apply_updates(params, updates)``, θ ← θ + u (optax's
    ``GradientTransformation``). An optimiser ([`gamfunc.sgd`][gamfunc.optim.sgd.sgd], [`gamfunc.adamw`][gamfunc.optim.adamw.adamw], ...) is a
    transform whose updates are its whole signed step, u = −η·(its update rule); a transform such as
    [`gamfunc.clip_by_global_norm`][gamfunc.clip_by_global_norm] changes the direction it is given. So [`gamfunc.chain`][gamfunc.chain]
    puts any of them before, between or after an optimiser, and the result is again a Transform.

    ``state`` is a NamedTuple of tensors ([`TraceState`][gamfunc.optim.moments.TraceState],
    [`ClipState`][gamfunc.optim.transforms.ClipState], ``()`` for a stateless transform), a pytree for
    ``torch.compile`` and ``torch.func.vmap``. Neither function mutates its arguments, and ``update``
    branches on no tensor value. A state holds the transform's own statistics only: the step count
    is the step's ([`gamfunc.StepState`][gamfunc.StepState] ``.step``). An ``update`` that reads it (bias
    corrections, schedules) takes it as a keyword, ``update(direction, state, params, *,
    step=None)``, and [`call_update`][gamfunc.optim.base.call_update] gives it to those that take it, so a user's own
    three-argument ``update`` works wherever a gamfunc one does (optax's extra arguments).

    The learning rate and other hyperparameters a step logs or a caller sets between steps live in
    the state of [`gamfunc.inject_hyperparams`][gamfunc.inject_hyperparams], which [`gamfunc.sgd`][gamfunc.optim.sgd.sgd] and the other
    optimisers use.

    Attributes:
        init: ``init(params) -> state``.
        update: ``update(direction, state, params, *, step=None) -> (updates, new_state)``.

    Example:
        >>> import torch, gamfunc
        >>> opt = gamfunc.sgd(lr=0.1)
        >>> params = {"w": torch.ones(2)}
        >>> updates, state = opt.update({"w": torch.ones(2)}, opt.init(params), params)
        >>> updates["w"], gamfunc.apply_updates(params, updates)["w"]
        (tensor([-0.1000, -0.1000]), tensor([0.9000, 0.9000]))
    """

    init: Callable[[Tree], Any]
    update: Callable[..., tuple[Tree, Any]]  # (direction, state, params, *, step=...)


class Moved(dict):
    """Updates already applied: the new parameters θ + u themselves, by name, from a transform
    that moves its parameters in place rather than returning u. [`apply_updates`][gamfunc.optim.base.apply_updates]
    returns them as they are. Only the last transform of a [`chain`][gamfunc.chain] may return
    them: nothing can transform a step that is already taken.

    Why the contract keeps it: a ``torch.optim`` optimiser, the base optimiser of the
    ``torch.optim`` facade (``gamfunc.torch_optim.bridge.TorchBridge``), moves its own
    tensors in place and never forms u. Returning u = θ_new − θ instead would cost two kernels per
    parameter each step, and θ + (θ_new − θ) is not θ_new in floating point: the facade would no
    longer take ``torch.optim``'s steps bit for bit. No other transform of gamfunc returns it."""


def apply_updates(params: Tree, updates: Tree) -> Tree:
    """θ + u for every parameter: the new parameters from a [`Transform`][gamfunc.optim.base.Transform]'s updates.

    Each sum is cast back to the parameter's dtype (an update of another dtype does not promote the
    parameter). ``params`` is not modified.

    Args:
        params: the parameters θ, a flat dict of tensors.
        updates: the updates u, a flat dict with the names and shapes of ``params``, or the new
            parameters themselves ([`Moved`][gamfunc.optim.base.Moved]).

    Returns:
        The flat dict θ + u, each tensor in its parameter's dtype (for ``Moved``, a dict of its
        tensors, not copied).

    Raises:
        TypeError: ``params`` or ``updates`` is not a dict of tensors.
        ValueError: ``updates`` has other names than ``params``, or an update's shape is not its
            parameter's (named with both shapes): an update is never broadcast onto a parameter.

    Example:
        >>> import torch, gamfunc
        >>> gamfunc.apply_updates({"w": torch.ones(2)}, {"w": torch.tensor([0.5, -1.0])})
        {'w': tensor([1.5000, 0.0000])}
    """
    for name, t in (("params", params), ("updates", updates)):
        if not isinstance(t, Mapping) or not all(isinstance(v, Tensor) for v in t.values()):
            raise TypeError(f"{name} must be a flat dict name -> tensor; got {type(t).__name__}")
    moved = isinstance(updates, Moved)
    check_like(params, updates, "updates", shapes=not moved)
    if moved:
        return {k: updates[k] for k in params}
    keys = list(params)
    p, u = [params[k] for k in keys], [updates[k] for k in keys]
    if all(a.dtype == b.dtype for a, b in zip(p, u, strict=True)) and not tree.vmapped([*p, *u]):
        return dict(zip(keys, torch._foreach_add(p, u), strict=True))
    return {k: (params[k] + updates[k]).to(params[k].dtype) for k in keys}


def check_like(params: Tree, other: Tree, name: str = "direction", shapes: bool = True) -> None:
    """A one-line ValueError unless ``other`` has the names of ``params`` and (``shapes``) their
    shapes: the check of every update against its parameters, shared by
    [`apply_updates`][gamfunc.optim.base.apply_updates] (the updates), the optimisers'
    ``update`` (the direction: [`gamfunc.inject_hyperparams`][gamfunc.inject_hyperparams], which
    every gamfunc optimiser is, and [`gamfunc.chain`][gamfunc.chain]) and so
    [`gamfunc.make_step`][gamfunc.make_step]. A direction of other shapes would be broadcast
    against the parameters and leave updates and momentum of its shape.

    Metadata only (names and shapes, no tensor read): a compiled update checks it once, when it
    traces.

    Args:
        params: the parameters θ, a flat dict of tensors.
        other: a flat dict that must match them (a direction, updates).
        name: what ``other`` is, for the message.
        shapes: whether the shapes must match too (not only the names).

    Raises:
        TypeError: ``other`` is not a dict of tensors.
        ValueError: ``other`` has other names than ``params``, or an entry of another shape
            (named with both shapes).

    Example:
        >>> import torch
        >>> check_like({"w": torch.ones(3)}, {"w": torch.ones(3, 3)})
        Traceback (most recent call last):
        ...
        ValueError: direction['w'] has shape (3, 3) but params['w'] has (3,)
    """
    if not isinstance(other, Mapping):
        raise TypeError(f"{name} must be a flat dict name -> tensor; got {type(other).__name__}")
    if other.keys() != params.keys():
        missing = sorted(params.keys() - other.keys())
        extra = sorted(other.keys() - params.keys())
        raise ValueError(f"{name} must have the names of params: missing {missing}, extra {extra}")
    if not shapes:
        return
    # one comparison of two lists where the names come in one order (the usual case)
    if [a.shape for a in params.values()] == [getattr(b, "shape", None) for b in other.values()]:
        return
    for k, a in params.items():
        b = other[k]
        if not isinstance(b, Tensor):
            raise TypeError(f"{name}[{k!r}] must be a tensor; got {type(b).__name__}")
        if a.shape != b.shape:
            raise ValueError(
                f"{name}[{k!r}] has shape {tuple(b.shape)} but params[{k!r}] has {tuple(a.shape)}"
            )


def takes_step(update: Callable) -> bool:
    """Whether ``update`` takes the step count: a parameter named ``step``, or ``**kwargs``.

    Read from the code object (the common case, a plain function, costs no ``inspect`` call).
    """
    code = getattr(update, "__code__", None)
    if code is not None and not inspect.ismethod(update):
        if code.co_flags & inspect.CO_VARKEYWORDS:
            return True
        return "step" in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    try:
        parameters = inspect.signature(update).parameters
    except (TypeError, ValueError):
        return False
    return "step" in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())


def call_update(
    transform: Transform, direction: Tree, state, params: Tree, step: Tensor | None = None
) -> tuple[Tree, Any]:
    """``transform.update(direction, state, params)``, with ``step=step`` where it takes one.

    Args:
        transform: any [`Transform`][gamfunc.optim.base.Transform], a user's own included.
        direction: the direction (or the updates of the transforms before it).
        state: its state.
        params: the parameters θ.
        step: the step count t (updates taken so far), a 0-d int64 tensor, or None.

    Returns:
        ``(updates, new_state)``.
    """
    if step is not None and takes_step(transform.update):
        return transform.update(direction, state, params, step=step)
    return transform.update(direction, state, params)


def need_step(step: Tensor | None, who: str) -> Tensor:
    """``step``, or a ValueError saying that ``who`` reads the step count and none was given."""
    if step is None:
        raise ValueError(
            f"{who} reads the step count: call update(direction, state, params, step=t) with t the "
            f"updates taken so far (a 0-d int64 tensor); gamfunc.make_step passes it"
        )
    return step


def check_state_type(state, cls: type, who: str, detail: str = "") -> None:
    """A one-line TypeError unless ``state`` is a ``cls``: the state of another optimiser (an AdamW
    state given to an SGD step) fails here, naming both, rather than deep inside an update."""
    if not isinstance(state, cls) or detail:
        got = type(state).__name__
        raise TypeError(
            f"the state given to {who} is a {got}{detail}, not the {cls.__name__} it makes: make "
            f"the state with this optimiser's init (step.init(params))"
        )
