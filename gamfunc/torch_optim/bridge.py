"""A ``torch.optim`` optimiser as the base optimiser of [`gamfunc.make_step`][gamfunc.make_step].

The facade ([`gamfunc.torch_optim`][gamfunc.torch_optim]) moves a module by make_step's pure step, whose
base optimiser is a [`Transform`][gamfunc.optim.base.Transform] ``update(direction, state, params) ->
(updates, state)``. A ``torch.optim`` optimiser moves its own tensors in place instead: the module's
parameters and the tensors of its ``state``. [`TorchBridge`][gamfunc.torch_optim.bridge.TorchBridge] joins the
two without copying either world into the other one tensor at a time:

```text
params, old = bridge.snapshot()          # copies of the parameters and of the state's tensors
direction   = estimator(params, ...)     # the step's passes read the copies
moved       = base.step() on its own tensors, .grad = direction: its parameters, moved (Moved)
new         = the state's tensors, as base.step() left them
guard       : keeps (moved, new), or drops them for (params, old)
bridge.commit(kept)                      # base's state set to what the guard kept
module      ← params                     # the facade's copy, where the guard dropped the step
```

So ``base.step()`` runs on the optimiser's own parameters and state, as in a ``torch.optim`` loop:
its hooks, and state it keys by its parameters, work as there, and a kept step leaves its result,
bit for bit, with nothing formed after it (the update returns the moved parameters themselves,
[`Moved`][gamfunc.optim.base.Moved], not their difference from the copies). The step's inputs are
the copies, which nothing writes, so make_step's guard can keep or drop the step; a dropped step
puts the copies back ([`commit`][gamfunc.torch_optim.bridge.TorchBridge.commit], and the facade's copy
into the parameters).
A copy of all the parameters and state tensors is one foreach kernel per dtype, and the per-step
work on the host is a few list comprehensions over the parameters, where a swap of each
parameter's ``.data`` and of its state would build a tensor and a dict per parameter.
"""

from __future__ import annotations

import copy
import operator
from typing import Any, NamedTuple, cast

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from gamfunc import tree
from gamfunc.optim import GroupsState, InjectState, Moved, Transform
from gamfunc.torch_optim.copies import copy_into, recopy
from gamfunc.training.guard import all_finite

__all__ = ["TorchBridge", "TorchState", "map_torch"]


class TorchState(NamedTuple):
    """The step state of a [`TorchBridge`][gamfunc.torch_optim.bridge.TorchBridge]'s transform.

    Attributes:
        finite: 0-d float64: 0 when every floating-point tensor the base optimiser formed outside
            ``tensors`` (the entries of its first step) is finite, NaN otherwise, so that
            `gamfunc.guard.is_finite` skips a step that would make them non-finite.
        tensors: the tensors of the optimiser's state, in the order of its parameters and of each
            parameter's entries (`TorchBridge.snapshot`); ``()`` between steps, when they live in
            the optimiser. Carried here, they are kept or dropped by make_step's non-finite guard
            and pass through a CUDA graph like any other state.
        lrs: where the bridge reports its learning rates (``reports_lr``), its param groups' lrs
            as a [`GroupsState`][gamfunc.optim.groups.GroupsState] of injected states, each with
            the names of its group's parameters, so that
            [`gamfunc.optim.learning_rates`][gamfunc.optim.groups.learning_rates] reads each
            parameter's lr as it reads a gamfunc optimiser's (an estimator's decoupled part, WSAM's,
            moves each parameter by its lr after the update); ``()`` otherwise.
    """

    finite: Tensor
    tensors: list[Tensor] | tuple = ()
    lrs: GroupsState | tuple = ()


class _Layout(NamedTuple):
    """Where the optimiser keeps what it moves: its parameters in the order of its groups, their
    names, its state's dict per parameter (None where it has none), the size of each, and its
    entries: (parameter index, key) of each tensor, and of each value that is not a tensor."""

    held: list[Tensor]
    keys: list[str]
    dicts: list[dict | None]
    sizes: list[int]
    pairs: list[tuple[int, str]]
    others: list[tuple[int, str]]


class TorchBridge:
    """A ``torch.optim`` optimiser as a [`Transform`][gamfunc.optim.base.Transform] of
    [`gamfunc.make_step`][gamfunc.make_step] (see the module's docstring).

    One step: `snapshot` gives the step's ``params`` and the state's ``tensors`` (copies); make_step
    calls ``transform.update``, which runs ``base.step()`` on the optimiser's own tensors with the
    direction as each ``.grad`` and returns the updates and the new state tensors; `commit` then
    sets the optimiser's state to what make_step's guard kept. ``base``'s param groups (lr, weight
    decay, momentum, as any ``torch.optim.lr_scheduler`` set them) are read by its own ``step()``,
    so a change takes effect on the next step. What ``base.step()`` formed beyond the tensors it
    had (the state of its first step, new values of entries that are not tensors) is taken out of
    its state and put back by `commit` where the step was kept.

    Args:
        base: the optimiser; each parameter it holds is named in ``names``.
        names: ``id(parameter) -> name`` of the parameters in the step's ``params``; read at each
            step, so a caller that adds a param group adds its names here.
        keeps_inputs: whether the step may keep its ``params`` beyond the step (a stateful
            estimator's state): then each snapshot copies the parameters into new tensors;
            otherwise into those of the last snapshot.
        reports_lr: whether the state reports the param groups' lrs (`TorchState.lrs`), read at
            each update: for an estimator with a decoupled part.

    Attributes:
        transform: the Transform, whose state is a [`TorchState`][gamfunc.torch_optim.bridge.TorchState].
    """

    def __init__(
        self,
        base: torch.optim.Optimizer,
        names: dict[int, str],
        *,
        keeps_inputs: bool = True,
        reports_lr: bool = False,
    ):
        self.base, self.names, self.keeps_inputs = base, names, keeps_inputs
        self.reports_lr = reports_lr
        self.transform = Transform(self._init, self._update)
        self._layout: _Layout | None = None
        self._groups: list | None = None
        self._snapped: _Layout | None = None  # the layout of a snapshot no update has used yet
        self._formed: dict = {}  # what the last update formed beyond the layout, for commit
        self._kept: list[Tensor] = []  # the state tensors' copies, rewritten at each snapshot
        self._sources: list[Tensor] = []  # the state tensors they last copied
        self._copies: list[Tensor] = []  # the parameters' copies, where the step keeps no input
        self._held: list[Tensor] = []  # the parameters they last copied

    def layout(self) -> _Layout:
        """The optimiser's parameters and state entries, rebuilt where its groups or the structure
        of its state changed since the last call."""
        groups = self.base.param_groups
        signature = [(id(g["params"]), len(g["params"])) for g in groups]
        lay = self._layout
        if lay is not None and signature == self._groups:
            dicts = _dicts(self.base.state, lay.held)
            if all(map(operator.is_, dicts, lay.dicts)) and _sizes(dicts) == lay.sizes:
                return lay
        held = [p for g in groups for p in g["params"]]
        dicts = _dicts(self.base.state, held)
        pairs: list[tuple[int, str]] = []
        others: list[tuple[int, str]] = []
        for i, d in enumerate(dicts):
            for k, v in (d or {}).items():
                (pairs if isinstance(v, Tensor) else others).append((i, k))
        keys = [self.names[id(p)] for p in held]
        self._layout = _Layout(held, keys, dicts, _sizes(dicts), pairs, others)
        self._groups = signature
        return self._layout

    def snapshot(self) -> tuple[dict[str, Tensor], list[Tensor]]:
        """Copies of the parameters (by name) and of the state's tensors (`TorchState.tensors`),
        as one foreach kernel per dtype: the ``params`` and the state of the next step, whose
        update then finds the optimiser holding those very values.

        The copies are written into those of the last snapshot where the tensors keep their
        shapes ([`recopy`][gamfunc.torch_optim.copies.recopy]; for SGD with momentum, two tensors
        per parameter fewer to allocate at each step; for AdamW, four): only the step reads the
        state's, and the bridge, which keeps no ``TorchState.tensors`` between steps. The
        parameters' copies are new tensors where the step may keep its inputs (``keeps_inputs``).

        Returns:
            ``(params, tensors)``.
        """
        lay = self.layout()
        state = _tensors(lay)
        with torch.no_grad():
            if self.keeps_inputs:
                params = tree.copies(lay.held)
            else:
                params = self._copies = recopy(self._copies, lay.held, self._held)
                self._held = lay.held
            self._kept = recopy(self._kept, state, self._sources)
            self._sources = state
        self._snapped, self._formed = lay, {}
        return dict(zip(lay.keys, params, strict=True)), list(self._kept)

    def commit(self, tensors, skipped: Tensor | None) -> None:
        """Set the optimiser's state to a step's: ``tensors`` (the new `TorchState`'s, kept or
        dropped by the guard) copied into its own tensors where they are others (a dropped step's,
        or the guard's selection), and what the update formed beyond them installed where the step
        was kept, which reads ``skipped`` on the host once per step that formed such state.

        Args:
            tensors: the new `TorchState`'s ``tensors``.
            skipped: the step's ``metrics["skipped"]``; None when the step has no guard.
        """
        lay = self._layout
        if lay is not None and isinstance(tensors, list) and tensors:
            own = _tensors(lay)
            moved = [(o, t) for o, t in zip(own, tensors, strict=True) if o is not t]
            if moved:
                with torch.no_grad():
                    copy_into([o for o, _ in moved], [t for _, t in moved])
        formed, self._formed = self._formed, {}
        if formed and (skipped is None or not bool(skipped)):
            for p, s in formed.items():
                self.base.state[p].update(s)

    def rollback(self, params: dict[str, Tensor], tensors: list[Tensor]) -> None:
        """Put a snapshot's values back into the optimiser's parameters and state tensors, and
        forget what its update formed: after a step that raised (``on_nonfinite="raise"``, an
        interrupt), whose update may have moved them.

        Args:
            params: the snapshot's params.
            tensors: the snapshot's tensors.
        """
        lay, self._snapped, self._formed = self._layout, None, {}
        if lay is None or len(tensors) != len(lay.pairs):
            return
        with torch.no_grad():
            copy_into(lay.held + _tensors(lay), [params[k] for k in lay.keys] + tensors)

    # ---- the Transform ----------------------------------------------------------------------------

    def _init(self, params):
        device = next(iter(params.values())).device
        return TorchState(
            torch.zeros((), dtype=torch.float64, device=device), (), self._lrs(device)
        )

    def _lrs(self, device: torch.device) -> GroupsState | tuple:
        """The param groups' lrs as `TorchState.lrs` (``()`` unless ``reports_lr``): a tensor lr
        (``capturable=True``) as it is, a number as a 0-d float64 tensor filled on ``device`` (in
        a CUDA graph, a constant of the graph, which the facade captures again when it changes)."""
        if not self.reports_lr:
            return ()
        states, names = [], []
        for g in self.base.param_groups:
            lr = g["lr"]
            lr = (
                lr.detach()
                if isinstance(lr, Tensor)
                else torch.full((), float(lr), device=device, dtype=torch.float64)
            )
            states.append(InjectState({"lr": lr}, {}, ()))
            names.append(dict.fromkeys((self.names[id(p)] for p in g["params"]), ()))
        return GroupsState(tuple(states), tuple(names))

    def _update(self, direction, state, params):
        lay, self._snapped = self._snapped, None
        if lay is None or not isinstance(state.tensors, list):
            raise RuntimeError(
                "a TorchBridge's update runs on the values of its last snapshot(): take the step's "
                "params and its state's tensors from bridge.snapshot() before each step"
            )
        held, keys = lay.held, lay.keys
        kept = {e: copy.deepcopy(lay.dicts[e[0]][e[1]]) for e in lay.others}
        grads = [p.grad for p in held]
        try:
            for p, k in zip(held, keys, strict=True):
                d = direction[k]
                p.grad = d if d.dtype == p.dtype else d.to(p.dtype)
            with torch.no_grad():
                self.base.step()
        finally:
            for p, g in zip(held, grads, strict=True):
                p.grad = g
            self._formed = _restore(self.base.state, lay, _dicts(self.base.state, held), kept)
        moved = _tensors(lay)  # the step's: moved in place, or put in the entries' place
        finite = _finite_flag(self._formed, state.finite)
        device = state.finite.device
        return Moved(zip(keys, held, strict=True)), TorchState(finite, moved, self._lrs(device))


def _dicts(state: dict, held: list[Tensor]) -> list[dict | None]:
    get = state.get
    return [get(p) for p in held]


def _sizes(dicts: list[dict | None]) -> list[int]:
    return [0 if d is None else len(d) for d in dicts]


def _tensors(lay: _Layout) -> list[Tensor]:
    dicts = cast(list[dict], lay.dicts)  # the pairs name only parameters that have a state
    return [dicts[i][k] for i, k in lay.pairs]


def _restore(state: dict, lay: _Layout, after: list[dict | None], kept: dict) -> dict:
    """Put ``state`` back in ``lay``'s structure after ``base.step()``, whose dicts are ``after``:
    each parameter's dict of before, its tensor entries holding the step's (moved in place, or the
    tensors the step put in their place), its other entries their values of before (``kept``).
    Returns what the step formed beyond that, ``parameter -> {key: value}``: the entries it added,
    and the new values of the others."""
    same = all(map(operator.is_, after, lay.dicts)) and _sizes(after) == lay.sizes
    if same and not lay.others:
        return {}
    formed: dict[Any, dict] = {}
    for p, before, now in zip(lay.held, lay.dicts, after, strict=True):
        if now is None:
            continue
        known = before if before is not None else {}
        new = {k: v for k, v in now.items() if k not in known}
        if now is not before:
            for k in known:  # the step's tensors in the entries of before
                if k in now and isinstance(known[k], Tensor):
                    known[k] = now[k]
            if before is None:
                del state[p]
            else:
                state[p] = before
        else:
            for k in new:
                del now[k]
        if new:
            formed[p] = new
    for (i, k), value in kept.items():
        p, d = lay.held[i], lay.dicts[i]
        current = after[i].get(k) if after[i] is not None else None
        formed.setdefault(p, {})[k] = current
        d[k] = value
    return formed


def _finite_flag(state: dict, like: Tensor) -> Tensor:
    """0 when every floating-point tensor of ``state`` (parameter -> dict) is finite, NaN
    otherwise; ``like``'s zero when it holds none."""
    leaves = [t for s in state.values() for t in s.values() if isinstance(t, Tensor)]
    if not any(t.is_floating_point() and t.numel() for t in leaves):
        return torch.zeros_like(like)
    ok = all_finite(leaves, device=like.device)
    return torch.where(ok, torch.zeros_like(like), torch.full_like(like, float("nan")))


def map_torch(opt_state, fn):
    """``opt_state`` with its `TorchState` (alone, or in a chain) replaced by ``fn`` of it."""
    is_torch = lambda x: isinstance(x, TorchState)  # noqa: E731
    return pytree.tree_map(lambda x: fn(x) if is_torch(x) else x, opt_state, is_leaf=is_torch)
