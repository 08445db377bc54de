"""Parameter groups: per-group hyperparameters of one base optimiser, chosen by name patterns."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from gamfunc.optim.base import Transform, call_update
from gamfunc.tree import Tree

__all__ = ["GroupsState", "param_groups"]


class GroupsState(NamedTuple):
    """The state of [`param_groups`][gamfunc.optim.groups.param_groups]: one optimiser state per group, in the order in which the
    groups' first parameters come in ``params``.

    Each group's hyperparameters are in its own state ([`gamfunc.inject_hyperparams`][gamfunc.inject_hyperparams]): set a
    group's lr in ``states[g]`` and only that group moves with it. A step logs the first group's lr.

    Attributes:
        states: the groups' optimiser states, each over the parameters of its group.
    """

    states: tuple


def param_groups(
    groups: Mapping[str, Mapping[str, Any]], base: Callable[..., Transform], **defaults
) -> Transform:
    """One base optimiser with other hyperparameters for the parameters whose names match a pattern.

    Each parameter gets ``base(**(defaults | o₁ | o₂ | …))``, oᵢ the options of every pattern its
    name matches (``fnmatch``: ``*`` any text, ``?`` one character), in the order of ``groups``, a
    later one winning. Parameters with the same matches form one group with one optimiser over
    them, so per group the updates are those of ``base`` alone:

    ```text
    u[k] = base_g(k).update(d[G], s_G, θ[G])[k],   G = the group of parameter k
    ```

    which is ``torch.optim``'s param groups: equal to ``torch.optim.X([{"params": ..., **o}, ...],
    **defaults)`` over 50 steps in float64. ``"*.bias"`` with ``weight_decay=0.0`` reuses the idea of
    [`gamfunc.decay_mask`][gamfunc.decay_mask] through names instead of dimensions.

    Args:
        groups: pattern -> keyword arguments of ``base`` (``lr``, ``weight_decay``, ``momentum``,
            ``betas``... anything ``base`` takes, schedules included).
        base: an optimiser factory, e.g. [`gamfunc.adamw`][gamfunc.optim.adamw.adamw], or any callable returning a
            [`Transform`][gamfunc.optim.base.Transform] (a ``functools.partial``).
        **defaults: the keyword arguments of every group.

    Returns:
        A [`Transform`][gamfunc.optim.base.Transform]; its state is a [`GroupsState`][gamfunc.optim.groups.GroupsState].

    Raises:
        ValueError: ``groups`` is not a dict of pattern -> dict, or ``base`` rejects a group's
            options (naming the argument and the pattern).

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
        >>> len(state.states), [float(gamfunc.optim.learning_rate(s)) for s in state.states]
        (3, [0.001, 0.001, 0.01])
    """
    if not isinstance(groups, Mapping) or not all(
        isinstance(k, str) and isinstance(v, Mapping) for k, v in groups.items()
    ):
        raise ValueError("groups must be a dict pattern -> dict of the base optimiser's options")
    if not callable(base):
        raise ValueError(f"base must be an optimiser factory such as gamfunc.adamw; got {base!r}")
    patterns = list(groups)
    built: dict[tuple[int, ...], Transform] = {}

    def optimizer(matches: tuple[int, ...]) -> Transform:
        if matches not in built:  # the same options build the same optimiser: made once
            options = dict(defaults)
            for i in matches:
                options.update(groups[patterns[i]])
            try:
                built[matches] = base(**options)
            except ValueError as e:
                where = ", ".join(repr(patterns[i]) for i in matches) or "the defaults"
                raise ValueError(f"{e} (param group {where})") from None
        return built[matches]

    for i in range(len(patterns)):  # bad options fail here, at construction
        optimizer((i,))
    optimizer(())

    def split(params: Tree) -> list[tuple[Transform, list[str]]]:
        """The groups of ``params``: (optimiser, names), in the order of their first names."""
        names: dict[tuple[int, ...], list[str]] = {}
        for k in params:
            matches = tuple(i for i, p in enumerate(patterns) if fnmatch.fnmatchcase(k, p))
            names.setdefault(matches, []).append(k)
        return [(optimizer(m), ks) for m, ks in names.items()]

    def init(params):
        return GroupsState(tuple(opt.init({k: params[k] for k in ks}) for opt, ks in split(params)))

    def update(direction, state, params, *, step=None):
        updates, states = {}, []
        for (opt, ks), s in zip(split(params), state.states, strict=True):
            d, p = {k: direction[k] for k in ks}, {k: params[k] for k in ks}
            u, s = call_update(opt, d, s, p, step)
            updates.update(u)
            states.append(s)
        return {k: updates[k] for k in params}, GroupsState(tuple(states))

    return Transform(init, update)
