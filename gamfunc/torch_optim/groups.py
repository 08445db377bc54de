"""A gamfunc optimiser's hyperparameters as ``torch.optim`` param groups, and back.

The facade's ``param_groups`` hold, for a gamfunc base optimiser, one group per injected state that
keeps an lr ([`gamfunc.optim.lr_groups`][gamfunc.optim.groups.lr_groups]: one per
[`gamfunc.param_groups`][gamfunc.optim.groups.param_groups] group), with the parameters that state
moves and the values its update uses. A ``torch.optim.lr_scheduler`` or the caller writes a group;
before each step [`Groups.written`][gamfunc.torch_optim.groups.Groups.written] puts the values into
the state, and after it [`Groups.read`][gamfunc.torch_optim.groups.Groups.read] reports a schedule's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from gamfunc.optim import InjectState, Transform, lr_groups, map_injected

__all__ = ["BOOKKEEPING", "Groups"]

# A gamfunc optimiser built with weight_decay=0 injects none (it skips the decay's kernels): its
# group reports the 0 it uses.
_ABSENT = {"weight_decay": 0.0}

# What torch.optim's schedulers (lr_scheduler, swa_utils.SWALR) and Optimizer.add_param_group
# keep in a group for their own use, which no optimiser reads: they may appear and change freely.
BOOKKEEPING = frozenset(
    {"initial_lr", "max_lr", "min_lr", "max_momentum", "base_momentum", "swa_lr", "param_names"}
)


class Groups:
    """The param groups of a gamfunc optimiser over the model's trainable parameters.

    Each group reports every value its parameters' update uses: the injected constants
    (``lr``, ``weight_decay``, ...), a schedule's value at the last update, ``weight_decay=0.0``
    where the optimiser keeps no weight decay, ``lr=None`` where it keeps no lr. Only the injected
    constants can be set; changing any other value of a group, or adding one (``momentum``,
    ``nesterov``, ``dampening``, a misspelt key: a gamfunc optimiser fixes them when it is built),
    raises ``RuntimeError`` at the next step, rather than leaving the change without effect. The
    keys schedulers keep for themselves (`BOOKKEEPING`: ``initial_lr``, ``max_lr``, ...) are free.
    A scheduler that cycles a value the group does not show is refused when it is made:
    ``OneCycleLR(cycle_momentum=True)`` finds no ``momentum`` in the optimiser's ``defaults``.

    Args:
        optimizer: the gamfunc optimiser (a [`Transform`][gamfunc.optim.base.Transform]).
        trainable: the model's trainable parameters by name, in the model's order.

    Attributes:
        names: the parameters' names, in the model's order.
        settable: for each group, the names of the values a step reads from it.
        param_groups: ``[{"params": [...], "lr": ..., **hyperparameters}]``, one group per
            injected state with an lr, in the state's order, then one of the parameters no such
            state moves (where there are any).
    """

    def __init__(self, optimizer: Transform, trainable: dict[str, Tensor]):
        # one element per parameter, of its number of dimensions: the groups come from the names
        probe = {k: torch.ones((1,) * p.ndim, dtype=torch.float64) for k, p in trainable.items()}
        self.names = list(trainable)
        found = lr_groups(optimizer.init(probe), self.names)
        self._scheduled = any(s.scheduled for _, s in found)
        self.param_groups: list[dict[str, Any]] = []
        self.settable: list[set[str]] = []
        for names, s in found:
            constants = {k: float(v) for k, v in s.hyperparams.items() if v.ndim == 0}
            scheduled = {k: float(v) for k, v in s.scheduled.items() if v.ndim == 0}
            group = {"params": [trainable[k] for k in names], **constants, **scheduled}
            self.param_groups.append(group)
            self.settable.append(set(constants))
        placed = {k for names, _ in found for k in names}
        rest = [p for k, p in trainable.items() if k not in placed]
        if rest or not found:
            self.param_groups.append({"params": rest, "lr": None})
            self.settable.append(set())
        keys = {k for g in self.param_groups for k in g if k != "params"}
        for g in self.param_groups:  # torch.optim would fill a missing key with group 0's value
            for k in keys - g.keys():
                g[k] = _ABSENT.get(k)
        self.remember(self.param_groups)

    def written(self, opt_state, groups: list[dict[str, Any]]):
        """``opt_state`` with each group's settable values, as a scheduler or the caller left them
        in ``groups``, in the injected state that moves its parameters: new 0-d tensors, never
        in-place writes (earlier metrics and states share the old ones).

        Args:
            opt_state: the optimiser's state before a step.
            groups: the facade's ``param_groups``.

        Returns:
            The new state.

        Raises:
            RuntimeError: a value was changed that the step does not read from the group (a
                schedule sets it, or the optimiser keeps none), naming the group and the value.
        """
        for i, (group, seen) in enumerate(zip(groups, self._seen, strict=True)):
            keys = (set(seen) | set(group)) - self.settable[i] - BOOKKEEPING - {"params"}
            for k in sorted(keys, key=str):
                if k not in seen:
                    raise RuntimeError(
                        f"param_groups[{i}][{k!r}] was set, but the base optimiser reads no {k} "
                        f"from its groups (they show {', '.join(sorted(seen)) or 'nothing'}): "
                        f"give a gamfunc optimiser its {k} when you build it, or use a "
                        f"torch.optim base optimiser"
                    )
                if group.get(k) != seen[k]:
                    raise RuntimeError(
                        f"param_groups[{i}][{k!r}] was changed, but the base optimiser does not "
                        f"read it from there: a gamfunc schedule sets it, or the optimiser keeps "
                        f"no {k} (built with {k}=0, or not injected: see "
                        f"gamfunc.inject_hyperparams); build the optimiser with a constant {k} to "
                        f"drive it from the param groups"
                    )
        where = {id(s): i for i, (_, s) in enumerate(lr_groups(opt_state, self.names))}

        def write(s: InjectState) -> InjectState:
            i = where.get(id(s))
            if i is None:
                return s
            new = {
                k: torch.full((), float(groups[i][k]), dtype=v.dtype, device=v.device)
                for k, v in s.hyperparams.items()
                if k in self.settable[i]
            }
            return InjectState({**s.hyperparams, **new}, s.scheduled, s.inner)

        return map_injected(opt_state, write)

    def read(self, opt_state, groups: list[dict[str, Any]]) -> None:
        """After a step, each schedule's value into its group (the value of the last update), and
        the groups' values as those the next `written` compares with.

        Args:
            opt_state: the optimiser's state after the step.
            groups: the facade's ``param_groups``, written in place.
        """
        if self._scheduled:  # a read on the host, only where a schedule sets a value
            for i, (_, s) in enumerate(lr_groups(opt_state, self.names)):
                groups[i].update({k: float(v) for k, v in s.scheduled.items() if v.ndim == 0})
        self.remember(groups)

    def remember(self, groups: list[dict[str, Any]]) -> None:
        """Take ``groups``' values as those the next `written` compares with (after a step, or a
        ``load_state_dict``).

        Args:
            groups: the facade's ``param_groups``.
        """
        self._seen = [{k: v for k, v in g.items() if k != "params"} for g in groups]
