"""The state of a training step, its checks and its plain-dict form.

``StepState`` is what ``step(params, state, batch)`` carries from one call to the next (the fields:
`gamfunc.step`). `check_state` refuses a state that was not made for the parameters, in
one line naming the field; `as_dict` and `from_dict` turn a state into plain dicts and
back, for ``torch.save`` and ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from gamfunc import tree
from gamfunc.loss import check_params
from gamfunc.optim.groups import GroupsState

__all__ = [
    "StepState",
    "as_dict",
    "check_count",
    "check_counts",
    "check_cycle",
    "check_est",
    "check_state",
    "from_dict",
]


class StepState(NamedTuple):
    """The state a step carries from one call to the next; made by ``step.init(params)``.

    A NamedTuple, hence a pytree of tensors: ``torch.compile`` guards on its fields' shapes and
    dtypes, not their values (a new lr or step count never recompiles), ``torch.func.vmap`` batches
    it ([`gamfunc.ensemble`][gamfunc.training.ensemble]), ``torch.utils._pytree.tree_map`` maps it. ``()`` marks an absent
    field (an empty pytree node). Change a field with ``state._replace(...)``; save one with
    `as_dict`.

    Attributes:
        step: 0-d int64, the steps taken (skipped ones not counted): the one step counter, read by
            the estimator's schedules (ρ) and given to the optimiser's update as ``step=`` (lr
            schedules, bias corrections).
        opt: the optimiser's state, its own statistics only (an
            [`InjectState`][gamfunc.optim.inject.InjectState] around a chain's
            [`ChainState`][gamfunc.optim.transforms.ChainState] for [`gamfunc.sgd`][gamfunc.optim.sgd.sgd], or whatever a user's
            ``init`` returns); [`gamfunc.set_hyperparams`][gamfunc.set_hyperparams] sets a constant lr in it.
        skipped: 0-d int64, steps skipped because the loss, the direction or the update was not
            finite.
        buffers: a dict name -> tensor of BatchNorm running statistics, for a loss_fn of the
            buffered form (``step.init(params, buffers)``); ``()`` otherwise.
        cycle: with a ``when`` policy only (``every > 1`` included), a 0-d int64 on the CPU: the
            count of calls, skipped steps included, kept on the host so that it picks the estimator
            without a device synchronisation; ``()`` otherwise.
        loss: the loss wrapper's own state (`gamfunc.loss.Objective.init_state`), e.g.
            [`gamfunc.precision.LossScale`][gamfunc.wrappers.precision.LossScale] for fp16; ``()`` for a loss without state.
        est: the estimator's own state (``estimator.init(params)``, e.g. the running mean of
            [`friendly_sam`][gamfunc.estimators.friendly_sam.friendly_sam]); ``()`` for an
            estimator without state.
        policy: the ``when`` policy's own state (``policy.init(device)``, e.g.
            [`gamfunc.when.AdaptiveState`][gamfunc.training.when.AdaptiveState], AE-SAM's running
            statistics); ``()`` for a policy without state or no policy.
    """

    step: Tensor
    opt: Any
    skipped: Tensor
    buffers: dict[str, Tensor] | tuple = ()
    cycle: Tensor | tuple = ()
    loss: Any = ()
    est: Any = ()
    policy: Any = ()


def check_state(state, params) -> None:
    """Raise a one-line error, naming the field, unless ``state`` is a step state made for ``params``.

    Checked: that ``state`` is a [`StepState`][gamfunc.training.state.StepState] whose counters are 0-d tensors and whose
    ``buffers`` are a dict or ``()``; the names of every per-parameter dict of the optimiser state
    (momentum, moments: a dict of tensors sharing a name with ``params``) against those of
    ``params``, and the shapes of the first such dict (a state made for other parameters has them
    all wrong), so that a state made for other shapes is not broadcast against them. Python
    only, on types, names and shapes, a few microseconds a step and no read of a tensor's value; a
    compiled step traces it once. (Negative counts are refused on load, `from_dict`, and at each
    eager step on the CPU, `check_counts`; the schedules of [`gamfunc.schedules`][gamfunc.schedules]
    read a count below 0 as 0.)

    Raises:
        TypeError: ``state`` is no StepState, or a count is no int64 tensor.
        ValueError: a field that does not fit ``params`` (naming it).
    """
    if not isinstance(state, StepState):
        hint = (
            " (a StepState is a NamedTuple; as_dict gives its plain-dict form)"
            if isinstance(state, dict)
            else ""
        )
        raise TypeError(
            f"state must be the StepState that step.init(params) returns; got "
            f"{type(state).__name__}{hint}"
        )
    if not isinstance(params, dict) or not params:
        check_params(params)
    for name, v in (("step", state.step), ("skipped", state.skipped)):
        if not isinstance(v, Tensor) or v.dtype != torch.int64:
            got = f"a {v.dtype} tensor" if isinstance(v, Tensor) else type(v).__name__
            raise TypeError(
                f"state.{name} must be an int64 tensor; got {got}; make the state with "
                f"step.init(params)"
            )
    if not (isinstance(state.buffers, dict) or _empty(state.buffers)):
        raise TypeError(
            f"state.buffers must be a dict name -> tensor or () (no buffers); got "
            f"{type(state.buffers).__name__}"
        )
    _check_like(state.opt, params, [], "state.opt")


def check_count(name: str, v: Tensor) -> None:
    """A one-line ValueError naming ``name`` unless the count ``v`` (a 0-d integer tensor, read
    here) is >= 0. A state's counts only grow from 0; a negative one (``state.step = -5``) would
    read schedules before their start (a warm-up lr of −0.08), so it is refused on load
    (`from_dict`), in a step's host cycle count and, where a step can read them without waiting
    (eager, on the CPU), in its ``step`` and ``skipped`` (`check_counts`); elsewhere the schedules
    of [`gamfunc.schedules`][gamfunc.schedules] read a count below 0 as 0.

    Raises:
        ValueError: ``v`` is negative.
    """
    n = int(v)
    if n < 0:
        raise ValueError(
            f"{name} is {n}, but a count of steps is >= 0; make the state with step.init(params), "
            f"or load one that a step wrote"
        )


def _readable(v: Tensor) -> bool:
    """Whether reading ``v`` waits for nothing and stops no trace: eager, on the CPU, not vmapped."""
    return v.device.type == "cpu" and not torch.compiler.is_compiling() and not tree.vmapped([v])


def check_counts(state: StepState) -> None:
    """`check_count` of ``state.step`` and ``state.skipped`` where reading them waits for nothing
    (eager, on the CPU, not vmapped): a negative count is refused at each such step, not read as
    0 by the schedules while it counts up from below 0.

    Raises:
        ValueError: a count is negative (naming it).
    """
    for name in ("step", "skipped"):
        v = getattr(state, name)
        if v.ndim == 0 and _readable(v):
            check_count(f"state.{name}", v)


def check_cycle(cycle, policy: str | None) -> None:
    """A one-line ValueError unless ``cycle`` (``state.cycle``) fits a step whose ``when`` policy
    is described by ``policy`` (``"every=2"``; None: a step without one)."""
    if policy is not None and not isinstance(cycle, Tensor):
        raise ValueError(
            f"state.cycle is {cycle!r}, but a step with {policy} needs the host step count "
            f"there; make the state with this step's init(params)"
        )
    if policy is not None and cycle.ndim == 0 and _readable(cycle):
        check_count("state.cycle", cycle)
    if policy is None and not _empty(cycle):
        raise ValueError(
            "state.cycle is set, but this step has every=1 and no when policy: the state was made "
            "by a step with one; make it with this step's init(params)"
        )


def check_est(est, estimator) -> None:
    """Raise a one-line ValueError unless ``est`` (``state.est``) fits ``estimator``: a state for a
    stateful estimator, of its ``state_type`` where it declares one (a LookGAM state is not
    LookSAM's), ``()`` for one without."""
    if estimator.stateful and _empty(est):
        raise ValueError(
            f"state.est is (), but estimator {estimator.name!r} carries state between steps; make "
            f"the state with this step's init(params)"
        )
    if not estimator.stateful and not _empty(est):
        raise ValueError(
            f"state.est is set, but estimator {estimator.name!r} has no state: the state was made "
            f"by another step; make it with this step's init(params)"
        )
    kind = estimator.state_type
    if kind is not None and not isinstance(est, kind):
        raise ValueError(
            f"state.est is a {type(est).__name__}, but estimator {estimator.name!r} keeps a "
            f"{kind.__name__}: the state was made by another step; make it with this step's "
            f"init(params)"
        )


def _check_like(node, params, checked: list, where: str, group: bool = False) -> None:
    """``checked`` is non-empty once one per-parameter dict has had its shapes compared; inside a
    [`GroupsState`][gamfunc.optim.groups.GroupsState] (``group``), a per-parameter dict may hold a part of
    ``params``, a group's."""
    if isinstance(node, GroupsState):
        for i, s in enumerate(node.states):
            _check_like(s, params, checked, f"{where}.states[{i}]", group=True)
        return
    if isinstance(node, tuple):  # an optimiser's or a transform's state, a chain's transforms
        if _is_record(node):
            fields = getattr(node, "_fields")  # noqa: B009 (a NamedTuple's, read as any tuple's)
            parts = [(f"{where}.{n}", v) for n, v in zip(fields, node, strict=True)]
        else:
            parts = [(f"{where}[{i}]", v) for i, v in enumerate(node)]
        for name, v in parts:
            _check_like(v, params, checked, name, group)
        return
    if not isinstance(node, dict) or not node:
        return
    part = group and node.keys() < params.keys()
    if node.keys() == params.keys() or part:  # a per-parameter dict
        if not checked or part:
            checked.append(where)
            for k, v in ((k, params[k]) for k in node):
                if node[k].shape != v.shape:
                    raise ValueError(
                        f"{where}[{k!r}] has shape {tuple(node[k].shape)} but params[{k!r}] has "
                        f"{tuple(v.shape)}; make the state with step.init(params)"
                    )
        return
    if node.keys() & params.keys() and all(isinstance(v, Tensor) for v in node.values()):
        missing = sorted(params.keys() - node.keys())
        extra = sorted(node.keys() - params.keys())
        raise ValueError(
            f"{where} was made for other parameters: no entry for {missing}, "
            f"entries {extra} not in params; make the state with step.init(params)"
        )
    for k, v in node.items():
        _check_like(v, params, checked, f"{where}[{k!r}]", group)


def _is_record(x) -> bool:
    """Whether ``x`` is a NamedTuple (a typed state)."""
    return isinstance(x, tuple) and isinstance(getattr(x, "_fields", None), tuple)


def as_dict(state) -> Any:
    """``state`` in plain containers: every NamedTuple in it (a [`StepState`][gamfunc.training.state.StepState], an optimiser's or
    a transform's state, a loss scale) a dict of its fields, fields holding ``()`` (nothing) left out.

    For ``torch.save``: the result loads with ``torch.load(weights_only=True)`` and without gamfunc.
    A step state of plain SGD becomes ``{"step": ..., "opt": {"hyperparams": {"lr": ...},
    "scheduled": {}, "inner": {"states": [()]}}, "skipped": ...}`` (``"buffers"`` for BatchNorm).
    `from_dict` is the inverse.

    Example:
        >>> import torch, gamfunc
        >>> loss_fn = lambda p, b: (p["w"] ** 2).sum()
        >>> step = gamfunc.make_step(gamfunc.sam(0.05), gamfunc.sgd(lr=0.1), loss_fn)
        >>> state = step.init({"w": torch.zeros(3)})
        >>> sorted(as_dict(state)), sorted(as_dict(state)["opt"])
        (['opt', 'skipped', 'step'], ['hyperparams', 'inner', 'scheduled'])
        >>> type(from_dict(as_dict(state), like=state)).__name__
        'StepState'
    """
    if _is_record(state):
        return {k: as_dict(v) for k, v in zip(state._fields, state, strict=True) if not _empty(v)}
    if isinstance(state, dict):
        return {k: as_dict(v) for k, v in state.items()}
    if isinstance(state, tuple | list):
        return type(state)(as_dict(v) for v in state)
    return state


def _empty(v) -> bool:
    return isinstance(v, tuple) and not _is_record(v) and not v


def from_dict(saved, like, where: str = "state") -> Any:
    """What `as_dict` made, with the types of ``like`` again: a fresh state of the same step,
    ``step.init(params)``, gives them.

    The names and shapes must be those of ``like`` (a field absent from ``saved`` is ``()``); the
    tensors are ``saved``'s, where they are (move them with ``torch.utils._pytree.tree_map``).

    Raises:
        ValueError: in one line naming the field, where ``saved`` has other names, another
            structure or other shapes than ``like``, or a step state's count (``step``,
            ``skipped``, ``cycle``) is negative (`check_count`).
    """
    if _is_record(like):
        kind = type(like).__name__
        if not isinstance(saved, dict):
            raise ValueError(
                f"{where} must be a dict of the fields of {kind} {list(like._fields)}; got "
                f"{type(saved).__name__}"
            )
        extra = sorted(str(k) for k in saved if k not in like._fields)
        if extra:
            raise ValueError(
                f"{where} has entries {extra} that {kind} has not {list(like._fields)}"
            )
        values = []
        for name, ref in zip(like._fields, like, strict=True):
            if name not in saved and not _empty(ref):
                raise ValueError(f"{where} has no entry {name!r}, which {kind} needs")
            values.append(from_dict(saved.get(name, ()), ref, f"{where}.{name}"))
        out = type(like)(*values)
        if isinstance(out, StepState):
            for name in ("step", "skipped", "cycle"):
                v = getattr(out, name)
                if isinstance(v, Tensor) and v.ndim == 0 and not v.is_floating_point():
                    check_count(f"{where}.{name}", v)
        return out
    if isinstance(like, dict):
        if not isinstance(saved, dict) or saved.keys() != like.keys():
            got = sorted(saved) if isinstance(saved, dict) else type(saved).__name__
            raise ValueError(f"{where} has keys {got}; expected {sorted(like)}")
        return {k: from_dict(saved[k], v, f"{where}[{k!r}]") for k, v in like.items()}
    if isinstance(like, tuple | list):
        if not isinstance(saved, tuple | list) or len(saved) != len(like):
            got = (
                f"{len(saved)} entries" if isinstance(saved, tuple | list) else type(saved).__name__
            )
            raise ValueError(f"{where} has {got}; expected {len(like)}")
        return type(like)(
            from_dict(s, r, f"{where}[{i}]")
            for i, (s, r) in enumerate(zip(saved, like, strict=True))
        )
    if isinstance(like, Tensor) and not (isinstance(saved, Tensor) and saved.shape == like.shape):
        got = f"shape {tuple(saved.shape)}" if isinstance(saved, Tensor) else type(saved).__name__
        raise ValueError(f"{where} has {got}; expected shape {tuple(like.shape)}")
    return saved
