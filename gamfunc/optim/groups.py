"""Parameter groups: per-group hyperparameters of one base optimiser, chosen by name patterns."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from torch import Tensor

from gamfunc.optim.base import Transform, call_update
from gamfunc.optim.inject import InjectState
from gamfunc.tree import Tree

__all__ = ["GroupsState", "learning_rates", "lr_groups", "param_groups"]


class GroupsState(NamedTuple):
    """The state of [`param_groups`][gamfunc.optim.groups.param_groups]: one optimiser state per
    group, in the order in which the groups' first parameters come in ``params``, and the names of
    each group's parameters.

    Each group's hyperparameters are in its own state ([`gamfunc.inject_hyperparams`][gamfunc.inject_hyperparams]): set a
    group's lr in ``states[g]`` and only that group moves with it. A step logs the first group's lr.

    Attributes:
        states: the groups' optimiser states, each over the parameters of its group.
        names: for each group, the names of its parameters, as the keys of a dict whose values are
            ``()``: they stand in the state's tree structure, not among its leaves, so the state
            stays a pytree of tensors for ``torch.compile``, ``torch.func.vmap`` and CUDA graphs.
            [`members`][gamfunc.optim.groups.GroupsState.members] gives them as lists.
    """

    states: tuple
    names: tuple

    def members(self) -> list[list[str]]:
        """The names of each group's parameters, group by group.

        Returns:
            One list of names per group, in the order of ``states``.
        """
        return [list(group) for group in self.names]


def param_groups(
    groups: Mapping[str, Mapping[str, Any]], optimizer: Callable[..., Transform], **defaults
) -> Transform:
    """One base optimiser with other hyperparameters for the parameters whose names match a pattern.

    Each parameter gets ``optimizer(**(defaults | o₁ | o₂ | …))``, oᵢ the options of every pattern its
    name matches (``fnmatch``: ``*`` any text, ``?`` one character), in the order of ``groups``, a
    later one winning. Parameters with the same matches form one group with one optimiser over
    them, so per group the updates are those of ``optimizer`` alone:

    ```text
    u[k] = optimizer_g(k).update(d[G], s_G, θ[G])[k],   G = the group of parameter k
    ```

    which is ``torch.optim``'s param groups: equal to ``torch.optim.X([{"params": ..., **o}, ...],
    **defaults)`` over 50 steps in float64. ``"*.bias"`` with ``weight_decay=0.0`` reuses the idea of
    [`gamfunc.decay_mask`][gamfunc.decay_mask] through names instead of dimensions.

    Args:
        groups: pattern -> keyword arguments of ``optimizer`` (``lr``, ``weight_decay``,
            ``momentum``, ``betas``... anything ``optimizer`` takes, schedules included).
        optimizer: an optimiser factory, e.g. [`gamfunc.adamw`][gamfunc.optim.adamw.adamw], or any callable returning a
            [`Transform`][gamfunc.optim.base.Transform] (a ``functools.partial``).
        **defaults: the keyword arguments of every group.

    Returns:
        A [`Transform`][gamfunc.optim.base.Transform]; its state is a [`GroupsState`][gamfunc.optim.groups.GroupsState].

    Raises:
        ValueError: ``groups`` is not a dict of pattern -> dict, ``optimizer`` is not callable, or
            it rejects a group's options (naming the argument and the pattern); at ``init``, a
            pattern that matches no parameter's name (naming it).

    Warning:
        ρ per group is not supported: an estimator's perturbation is ρ·g/‖g‖ with one norm over every
        parameter, and GAM's ∇‖∇L‖ is taken through that same perturbation; a per-group ρ changes
        the perturbation's geometry inside every estimator (as ASAM's scaling does), not an
        optimiser option. Use [`gamfunc.asam`][gamfunc.estimators.asam.asam] for a per-parameter scale of the ascent.

    Example:
        >>> import torch, gamfunc
        >>> params = {"body.weight": torch.ones(2, 2), "body.bias": torch.ones(2), "head.weight": torch.ones(2)}
        >>> opt = gamfunc.param_groups(
        ...     {"*.bias": dict(weight_decay=0.0), "head.*": dict(lr=0.01)},
        ...     gamfunc.adamw, lr=1e-3, weight_decay=0.05,
        ... )
        >>> state = opt.init(params)
        >>> lrs = [round(float(gamfunc.optim.learning_rate(s)), 6) for s in state.states]
        >>> lrs
        [0.001, 0.001, 0.01]
        >>> state.members()
        [['body.weight'], ['body.bias'], ['head.weight']]
    """
    if not isinstance(groups, Mapping) or not all(
        isinstance(k, str) and isinstance(v, Mapping) for k, v in groups.items()
    ):
        raise ValueError("groups must be a dict pattern -> dict of the optimiser's options")
    if not callable(optimizer):
        raise ValueError(
            f"optimizer must be an optimiser factory such as gamfunc.adamw; got {optimizer!r}"
        )
    patterns = list(groups)
    built: dict[tuple[int, ...], Transform] = {}

    def built_for(matches: tuple[int, ...]) -> Transform:
        if matches not in built:  # the same options build the same optimiser: made once
            options = dict(defaults)
            for i in matches:
                options.update(groups[patterns[i]])
            try:
                built[matches] = optimizer(**options)
            except ValueError as e:
                where = ", ".join(repr(patterns[i]) for i in matches) or "the defaults"
                raise ValueError(f"{e} (param group {where})") from None
        return built[matches]

    for i in range(len(patterns)):  # bad options fail here, at construction
        built_for((i,))
    built_for(())

    splits: dict[tuple[str, ...], list[tuple[Transform, list[str]]]] = {}

    def split(params: Tree) -> list[tuple[Transform, list[str]]]:
        """The groups of ``params``: (optimiser, names), in the order of their first names; made
        once per set of names (at ``init``), so that an update traced by ``torch.compile`` reads
        them as constants instead of tracing ``fnmatch``."""
        key = tuple(params)
        if key not in splits:
            names: dict[tuple[int, ...], list[str]] = {}
            for k in params:
                matches = tuple(i for i, p in enumerate(patterns) if fnmatch.fnmatchcase(k, p))
                names.setdefault(matches, []).append(k)
            splits[key] = [(built_for(m), ks) for m, ks in names.items()]
        return splits[key]

    def init(params):
        parts = split(params)
        unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(k, p) for k in params)]
        if unmatched:  # a typo ("*.bais") would leave its options off without a word
            shown = ", ".join(list(params)[:8]) + (", ..." if len(params) > 8 else "")
            raise ValueError(
                f"groups: the pattern(s) {', '.join(map(repr, unmatched))} match no parameter "
                f"name (the names: {shown})"
            )
        states = tuple(opt.init({k: params[k] for k in ks}) for opt, ks in parts)
        return GroupsState(states, tuple(dict.fromkeys(ks, ()) for _, ks in parts))

    def update(direction, state, params, *, step=None):
        updates, states = {}, []
        parts = split(params)
        for (opt, ks), s in zip(parts, state.states, strict=True):
            d, p = {k: direction[k] for k in ks}, {k: params[k] for k in ks}
            u, s = call_update(opt, d, s, p, step)
            updates.update(u)
            states.append(s)
        # the names travel as they came: the groups of a set of names do not change
        return {k: updates[k] for k in params}, GroupsState(tuple(states), state.names)

    return Transform(init, update)


def lr_groups(state, names: list[str]) -> list[tuple[list[str], InjectState]]:
    """The hyperparameters that move each parameter: every injected state that keeps an ``lr``,
    with the names of the parameters it moves, in the order of the state.

    A [`GroupsState`][gamfunc.optim.groups.GroupsState] gives each of its groups' states the
    names of that group; any other state moves every parameter in ``names``. Where two injected
    states keep an lr for one parameter (a chain of two optimisers), the outermost, first one
    counts, as for [`learning_rate`][gamfunc.optim.inject.learning_rate].

    Args:
        state: an optimiser's state.
        names: the names of the parameters it moves, in the order of ``params``.

    Returns:
        ``[(names_g, state_g), ...]``, one entry per injected state with an lr; empty where the
        optimiser keeps no lr (a bare chain, a user's own transform).

    Example:
        >>> import torch, gamfunc
        >>> opt = gamfunc.param_groups({"b": {"lr": 0.5}}, gamfunc.sgd, lr=0.1)
        >>> state = opt.init({"w": torch.zeros(2), "b": torch.zeros(1)})
        >>> {tuple(ks): round(float(s.hyperparams["lr"]), 6) for ks, s in lr_groups(state, ["w", "b"])}
        {('w',): 0.1, ('b',): 0.5}
    """
    found: list[tuple[list[str], InjectState]] = []
    taken: set[str] = set()

    def walk(node, members: list[str]) -> None:
        if isinstance(node, InjectState) and ("lr" in node.hyperparams or "lr" in node.scheduled):
            mine = [k for k in members if k not in taken]
            if mine:
                found.append((mine, node))
                taken.update(mine)
            return
        if isinstance(node, GroupsState):
            for s, group in zip(node.states, node.members(), strict=True):
                walk(s, group)
        elif isinstance(node, InjectState):
            walk(node.inner, members)
        elif isinstance(node, tuple | list):
            for v in node:
                if not isinstance(v, Tensor):
                    walk(v, members)

    walk(state, list(names))
    return found


def learning_rates(state, names: list[str]) -> dict[str, Tensor] | None:
    """Each parameter's learning rate in an optimiser's state: the lr of the injected state that
    moves it ([`lr_groups`][gamfunc.optim.groups.lr_groups]); after an update, the one it used.

    Args:
        state: an optimiser's state.
        names: the names of the parameters it moves.

    Returns:
        name -> 0-d tensor, for every name; None where the state keeps no lr for some parameter.

    Example:
        >>> import torch, gamfunc
        >>> opt = gamfunc.param_groups({"b": {"lr": 0.5}}, gamfunc.sgd, lr=0.1)
        >>> rates = learning_rates(opt.init({"w": torch.zeros(2), "b": torch.zeros(1)}), ["w", "b"])
        >>> {k: round(float(v), 6) for k, v in rates.items()}
        {'w': 0.1, 'b': 0.5}
    """
    rates: dict[str, Tensor] = {}
    for members, s in lr_groups(state, names):
        lr = s.hyperparams["lr"] if "lr" in s.hyperparams else s.scheduled["lr"]
        rates.update(dict.fromkeys(members, lr))
    if any(k not in rates for k in names):
        return None
    return {k: rates[k] for k in names}
