"""Train an ``nn.Module`` with GAM, SAM or any estimator from ``torch.optim``-style code.

[`FlatnessOptimizer`][gamfunc.torch_optim.FlatnessOptimizer] is a ``torch.optim.Optimizer`` whose ``step`` runs the pure step of
[`gamfunc.make_step`][gamfunc.make_step] on the module's tensors and writes the result back into the module. It is a
shell, not a second implementation: the estimator computes the direction as a pure function, the
base optimiser applies it, and [`gamfunc.make_step`][gamfunc.make_step] joins them, with its one non-finite guard.
[`GAM`][gamfunc.torch_optim.GAM] and [`SAM`][gamfunc.torch_optim.SAM] only choose the estimator.

The base optimiser is any of:

* a gamfunc optimiser, ``GAM(model, gamfunc.sgd(lr=0.1, momentum=0.9), rho=0.05, alpha=0.1)``;
* a ``torch.optim.Optimizer`` over the model's parameters (torch's, or a third party's),
  ``GAM(model, torch.optim.AdamW(model.parameters(), lr=1e-3), rho=0.05, alpha=0.1)`` or
  ``base_optimizer=torch.optim.AdamW(...)``;
* davda54/sam's form, the class and its keyword arguments,
  ``GAM(model, torch.optim.SGD, lr=0.1, momentum=0.9, rho=0.05, alpha=0.1)``.

A ``torch.optim`` optimiser becomes a [`Transform`][gamfunc.optim.base.Transform] of the step
(`gamfunc.torch_bridge`): the step runs on copies of the parameters and of
its state, its ``step()`` on its own tensors with the direction as ``.grad``, and its state tensors
travel in the step's state, kept or dropped by make_step's guard. So every option of the step carries over whatever the base optimiser: ``compile=``, ``every=``,
``accumulate=``, ``precision=``, ``max_grad_norm=``, ``cuda_graph=`` and the guard.

Switching a ``torch.optim`` loop:

```python
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)   # before
optimizer = GAM(model, torch.optim.SGD, lr=0.1, momentum=0.9, rho=0.05, alpha=0.1)   # after

for inputs, targets in loader:
    loss = optimizer.step((inputs, targets))   # replaces zero_grad / forward / backward / step
    scheduler.step()                            # any torch.optim.lr_scheduler drives the lr
```

How the loss reaches the pure step:

* ``step(batch)`` with ``batch = (inputs, targets)``: the loss is ``criterion(model(inputs), targets)``,
  evaluated with the step's tensors in the module's place
  ([`gamfunc.nn.functionalize`][gamfunc.nn.functionalize]). This form can be compiled
  (``compile=True``) and accumulated (``accumulate=n``).
* ``step(closure)``: ``closure()`` takes no argument and returns the loss, computed by calling the
  model as usual (``lambda: criterion(model(x), y)``). It is re-evaluated at every point the estimator
  needs (θ, θ + ε, ...) with the module's tensors swapped
  ([`gamfunc.nn.Caller`][gamfunc.nn.Caller]), like the closure of davda54/sam, but it must not call
  ``backward()``: gamfunc differentiates it. This form always runs eagerly.
* ``step(closure, batch=batch)``: what trainers such as Lightning pass (their closure runs hooks). The
  closure is called once under ``torch.enable_grad()``, as ``torch.optim`` does, its result is ignored,
  and the step is computed from ``batch``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils import _pytree as pytree

from gamfunc import tree
from gamfunc.accumulate import accumulate as accumulated
from gamfunc.cuda_graphs import cuda_graph as graphed
from gamfunc.cuda_graphs import release
from gamfunc.estimators import Estimator, gam, sam
from gamfunc.nn import Caller, _module_loss, _places
from gamfunc.optim import (
    InjectState,
    Transform,
    call_update,
    injected,
    learning_rate,
    map_injected,
)
from gamfunc.optim.transforms import chain, clip_by_global_norm
from gamfunc.precision import PRECISIONS, mixed
from gamfunc.state import StepState, as_dict, from_dict
from gamfunc.step import make_step
from gamfunc.torch_bridge import TorchBridge, TorchState

__all__ = ["GAM", "SAM", "FlatnessOptimizer", "TorchBase"]

# What torch raises when the closure calls backward() itself: inside a torch.func transform (compiled
# or nested steps), or before gamfunc's own backward pass of an eager step.
_BACKWARD_INSIDE = (
    "backward() called inside a functorch transform",
    "backward through the graph a second time",
    "element 0 of tensors does not require grad",
)


def _lr_metric(lr) -> Tensor:
    """A param group's lr as a 0-d float64 tensor; a tensor lr (``capturable=True``) is copied on
    its device rather than read on the host."""
    if isinstance(lr, Tensor):
        return lr.detach().to(torch.float64, copy=True)
    return torch.tensor(float(lr), dtype=torch.float64)


def _map_torch(opt_state, fn):
    """``opt_state`` with its `TorchState` (alone, or in a chain) replaced by ``fn`` of it."""
    is_torch = lambda x: isinstance(x, TorchState)  # noqa: E731
    return pytree.tree_map(lambda x: fn(x) if is_torch(x) else x, opt_state, is_leaf=is_torch)


class FlatnessOptimizer(torch.optim.Optimizer):
    """A ``torch.optim.Optimizer`` that moves a module by ``make_step(estimator, optimizer, loss_fn)``.

    One step, with θ the module's trainable parameters and B its buffers:

    ```text
    direction, info = estimator(θ, batch, loss_fn)        # e.g. GAM, paper Algorithm 1
    u, opt_state   = optimizer.update(direction, opt_state, θ)
    θ              = gamfunc.apply_updates(θ, u)
    B              = the buffers of the pass at θ           # BatchNorm: once per step
    ```

    and θ and B are copied back into the module in place, so the model stays usable as it is (eval,
    ``model.state_dict()``, EMA, checkpoints). A step whose loss, direction, new parameters or new
    optimiser state is not finite is skipped by make_step's guard and counted in
    ``metrics["skipped"]``, whatever the base optimiser.

    Args:
        model: the module to train (not its ``parameters()``). Its parameters with
            ``requires_grad=False`` are left alone; its buffers (BatchNorm running statistics) are
            updated once per step from the pass at θ; passes at perturbed points use batch
            statistics and leave them alone. The module is evaluated in whatever mode it is in.
        estimator: a gamfunc estimator, e.g. ``gamfunc.gam(rho=0.05, alpha=0.1)``.
        optimizer: the base optimiser: a gamfunc one (``gamfunc.sgd(lr=0.1, momentum=0.9)``), a
            ``torch.optim.Optimizer`` over the model's parameters, or an optimiser class or gamfunc
            factory built here with ``**base_kwargs`` (``torch.optim.SGD, lr=0.1``).
        criterion: ``criterion(outputs, targets) -> scalar`` for ``step((inputs, targets))``;
            ``F.cross_entropy`` by default.
        base_optimizer: the base optimiser by keyword (davda54/sam's name), instead of ``optimizer``.
        every: run ``estimator`` on every ``every``-th step and ``base`` on the others.
        base: the estimator of the other steps, ``gradient()`` by default.
        on_nonfinite: "skip" (default), "raise" or "ignore" (see [`gamfunc.make_step`][gamfunc.make_step]).
        compile: compile the step with ``torch.compile``: the whole step for a gamfunc base
            optimiser, the estimator's passes (``step.compile(scope="pass")``) for a ``torch.optim``
            one, whose own ``step()`` runs its fused or foreach kernels.
        compile_options: keyword arguments of ``torch.compile``, e.g. ``{"fullgraph": True}``.
        accumulate: micro-batches per ``step((inputs, targets))`` ([`gamfunc.accumulate.accumulate`][gamfunc.accumulate.accumulate]).
        precision: "fp32", "bf16" or "fp16" ([`gamfunc.precision.mixed`][gamfunc.precision.mixed]; fp16 with a dynamic loss
            scale in the step state, in place of ``torch.amp.GradScaler``).
        max_grad_norm: clip the direction to this global norm before the base optimiser
            ([`gamfunc.clip_by_global_norm`][gamfunc.optim.transforms.clip_by_global_norm]).
        cuda_graph: replay each ``step((inputs, targets))`` as one CUDA graph
            ([`gamfunc.cuda_graph`][gamfunc.cuda_graphs.cuda_graph]: three eager steps, then a
            capture, then replays; compiled or not). The model must be on a CUDA device, and a
            ``torch.optim`` base optimiser capturable: built with ``capturable=True`` where it has
            that option. A number it reads from its param groups (a float ``lr``) is fixed in the
            graph, so a change of one (a scheduler's) drops the graphs and captures again; give it
            as a tensor (``lr=torch.tensor(0.1, device="cuda")``, which schedulers change in place)
            to keep them. ``step(closure)`` is not captured.
        **base_kwargs: the keyword arguments of an optimiser class or factory given as ``optimizer``.

    Attributes:
        param_groups: a ``torch.optim`` base optimiser's own groups. For a gamfunc one, one group per
            injected lr (one per [`gamfunc.param_groups`][gamfunc.optim.groups.param_groups] group), holding its parameters and
            its injected hyperparameters (``lr``, ``weight_decay``...), written into the step
            state before every step, so ``torch.optim.lr_scheduler`` drives them (compiled or not).
        metrics: the scalar tensors of the last step (``loss``, ``grad_norm``, ``lr``, ``rho``,
            ``skipped``...).

    ``step`` returns the loss at θ before the update (a 0-d tensor).

    Raises:
        TypeError: a model that is not an ``nn.Module``, a base optimiser of no known kind, a
            ``torch.optim`` optimiser whose ``step`` needs a closure, or an argument of the wrong type.
        ValueError: a base optimiser over tensors that are not the model's parameters, an invalid
            option (naming it), or ``cuda_graph=True`` with a model off the GPU or a base optimiser
            built with ``capturable=False``.

    Warning:
        With a gamfunc base optimiser whose ``lr`` is a gamfunc schedule, the schedule sets the
        learning rate; ``param_groups[0]["lr"]`` reports the last lr used, and changing it raises
        ``RuntimeError``. Hyperparameters a gamfunc optimiser does not inject (``momentum`` of
        ``gamfunc.sgd``) cannot be driven from the param groups: use a ``torch.optim`` base
        optimiser for momentum cycling.

    Example:
        >>> import torch, gamfunc
        >>> from gamfunc.torch_optim import FlatnessOptimizer
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 3))
        >>> opt = FlatnessOptimizer(model, gamfunc.gam(0.05, 0.1), gamfunc.sgd(lr=0.1, momentum=0.9))
        >>> sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
        >>> x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
        >>> loss = opt.step((x, y))
        >>> sched.step()

    References:
        Zhang et al., "Gradient Norm Aware Minimization Seeks First-Order Flatness and Improves
        Generalization", CVPR 2023, https://arxiv.org/abs/2303.03108.
    """

    def __init__(
        self,
        model: nn.Module,
        estimator: Estimator,
        optimizer=None,
        criterion: Callable = F.cross_entropy,
        *,
        base_optimizer=None,
        every: int = 1,
        base: Estimator | None = None,
        on_nonfinite: str = "skip",
        compile: bool = False,
        compile_options: dict[str, Any] | None = None,
        accumulate: int = 1,
        precision: str = "fp32",
        max_grad_norm: float | None = None,
        cuda_graph: bool = False,
        **base_kwargs,
    ):
        _check_model(model)
        _check_arguments(criterion, compile, compile_options, accumulate, precision)
        if not isinstance(cuda_graph, bool):
            raise TypeError(f"cuda_graph must be True or False; got {cuda_graph!r}")
        if not isinstance(estimator, Estimator):
            raise TypeError(
                f"estimator must be a gamfunc estimator; got {getattr(estimator, '__name__', type(estimator).__name__)}"
            )
        if optimizer is not None and base_optimizer is not None:
            raise TypeError(
                "pass the base optimiser once: as the second argument or as base_optimizer="
            )
        named = dict(model.named_parameters())
        trainable = {k: p for k, p in named.items() if p.requires_grad}
        if not trainable:
            raise ValueError("model has no parameter with requires_grad=True to optimise")
        opt = _built(optimizer if optimizer is not None else base_optimizer, trainable, base_kwargs)
        self._model, self.metrics = model, {}
        places = _places(model)  # a buffer the module replaces later is read at its place
        self._buffer_at = [(k, *places[k]) for k, _ in model.named_buffers()]
        self._views: dict[str, tuple[Tensor, Tensor]] = {}  # buffer name -> (buffer, detached)
        self._state: StepState | None = None
        self._torch: torch.optim.Optimizer | None = None
        self._bridge: TorchBridge | None = None
        if isinstance(opt, torch.optim.Optimizer):
            self._torch = opt
            self._trainable = _held(opt, named)
            self._ids = {id(p): k for k, p in self._trainable.items()}
            # the parameters' copies rewritten at each step, unless an estimator keeps a state
            keeps = any(e is not None and e.stateful for e in (estimator, base, estimator.base))
            self._bridge = TorchBridge(opt, self._ids, keeps_inputs=keeps)
            transform = self._bridge.transform
        else:
            self._trainable = trainable
            transform = opt
        if max_grad_norm is not None:
            transform = chain(clip_by_global_norm(max_grad_norm), transform)
        self._pass_buffers = _PassBuffers()
        module_loss = _module_loss(model, criterion, True, self._pass_buffers)
        batch_loss = mixed(functools.partial(_as_is, module_loss, model), precision)
        if accumulate > 1:
            batch_loss = accumulated(batch_loss, accumulate)
        closure_loss = mixed(
            functools.partial(_closure_loss, _Holder(model), self._pass_buffers), precision
        )
        options = {"every": every, "base": base, "on_nonfinite": on_nonfinite}
        batch_step = make_step(estimator, transform, batch_loss, **options)
        self._closure_step = make_step(estimator, transform, closure_loss, **options)
        self._accumulate = accumulate
        if compile:
            scope = "pass" if self._torch is not None else "step"
            batch_step = batch_step.compile(scope=scope, **(compile_options or {}))
        self._graphed = cuda_graph
        if cuda_graph:
            _check_capturable(self._torch, trainable)
            batch_step = graphed(batch_step)
        self._batch_step = batch_step
        self._captured: list | None = None  # the torch base's groups the graphs were made with
        if self._torch is not None:
            super().__init__(list(self._trainable.values()), dict(opt.defaults))
            # the base optimiser's groups and state, shared: a scheduler of either moves both
            self.param_groups, self.state = opt.param_groups, opt.state
            self._hyper = None
        else:
            groups, self._hyper = _gamfunc_groups(transform, self._trainable)
            super().__init__(
                groups[0]["params"], {k: v for k, v in groups[0].items() if k != "params"}
            )
            for g in groups[1:]:
                super().add_param_group(g)
            self._set = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
        self._ready = True

    # ---- torch.optim.Optimizer interface ----------------------------------------------------------

    def step(self, closure=None, *, batch=None) -> Tensor:
        """One step; returns the loss at θ before the update (a 0-d tensor).

        Args:
            closure: a callable ``closure() -> loss`` that calls the model (it must not call
                ``backward()``), or the batch itself, ``step((inputs, targets))``.
            batch: ``(inputs, targets)`` for ``criterion(model(inputs), targets)``. Given together with
                a closure, the closure is called once first, as ``torch.optim`` does (Lightning's hooks),
                and the batch drives the step.

        Returns:
            The loss at θ before the update.

        Raises:
            TypeError: neither a batch nor a closure, or a closure that does not return a tensor.
            ValueError: a batch that is not a pair, or a closure with ``accumulate > 1``.
            RuntimeError: a closure that calls ``backward()``.
        """
        closure, batch = _step_arguments(closure, batch)
        if batch is not None:
            return self._advance(self._batch_step, batch)
        if self._accumulate > 1:
            raise ValueError(
                "accumulate > 1 cuts a batch into micro-batches: call step((inputs, targets)), "
                "not step(closure)"
            )
        try:
            return self._advance(self._closure_step, closure)
        except RuntimeError as e:
            if not any(m in str(e) for m in _BACKWARD_INSIDE):
                raise
            raise RuntimeError(
                "the closure given to step() must return the loss without calling backward() "
                "(write step(lambda: criterion(model(x), y))): gamfunc differentiates it"
            ) from None

    def state_dict(self) -> dict[str, Any]:
        """``{"state": {step, skipped, opt, ...}, "param_groups": [...]}``: the step state as plain
        dicts (`gamfunc.state.as_dict`, so ``torch.load(weights_only=True)`` reads it), tensors
        keyed by parameter name, ``{}`` before the first step; with a ``torch.optim`` base
        optimiser, ``"base"``: its own ``state_dict()``.

        Returns:
            The dict.
        """
        state = {} if self._state is None else as_dict(self._state)
        if self._torch is not None:
            return {"state": state, "base": self._torch.state_dict()}
        groups = [
            {k: v for k, v in g.items() if k != "params"} | {"params": self._names(g)}
            for g in self.param_groups
        ]
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what [`state_dict`][gamfunc.torch_optim.FlatnessOptimizer.state_dict] returned; tensors move to the parameters' device.

        Args:
            state_dict: what ``state_dict()`` returned.

        Raises:
            ValueError: a dict of another form, or saved for other parameters.
        """
        keys = ("state", "base") if self._torch is not None else ("state", "param_groups")
        if not isinstance(state_dict, dict) or set(state_dict) != set(keys):
            raise ValueError(f"state_dict must be a dict with keys {keys[0]!r} and {keys[1]!r}")
        if self._torch is not None:
            self._torch.load_state_dict(state_dict["base"])
            self.param_groups, self.state = self._torch.param_groups, self._torch.state
        else:
            groups = state_dict["param_groups"]
            if [list(g.get("params", ())) for g in groups] != [
                self._names(g) for g in self.param_groups
            ]:
                raise ValueError(
                    "state_dict was saved for other parameters; expected groups with params "
                    f"{[self._names(g) for g in self.param_groups]}"
                )
            for g, saved in zip(self.param_groups, groups, strict=True):
                g.update({k: v for k, v in saved.items() if k != "params"})
        state = state_dict["state"]
        if state:
            reference = self._batch_step.init(self._params(), None)
            try:
                restored = from_dict(state, reference, "state")
            except ValueError as e:
                raise ValueError(f"state_dict {e}") from None
            self._state = pytree.tree_map(_placed, restored, reference)
        else:
            self._state = None
        if self._torch is None:
            self._set = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group, as ``torch.optim`` does: to a ``torch.optim`` base optimiser, whose step then
        moves its parameters too (they must be the model's).

        Args:
            param_group: ``{"params": [...], **options}``.

        Raises:
            TypeError: with a gamfunc base optimiser, whose groups are fixed when it is built.
            ValueError: parameters that are not the model's.
        """
        if not getattr(self, "_ready", False):
            return super().add_param_group(param_group)
        if self._torch is None:
            raise TypeError(
                "add_param_group needs a torch.optim base optimiser; with a gamfunc one, give the "
                "groups when building it: gamfunc.param_groups({'pattern': {'lr': ...}}, gamfunc.sgd, lr=...)"
            )
        self._torch.add_param_group(param_group)
        self.param_groups = self._torch.param_groups
        self._trainable = _held(self._torch, dict(self._model.named_parameters()))
        self._ids.clear()  # the dict the transform reads the names from
        self._ids.update({id(p): k for k, p in self._trainable.items()})

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients of the parameters (the step itself neither reads nor writes them).

        Args:
            set_to_none: as ``torch.optim.Optimizer.zero_grad``.
        """
        if self._torch is not None:
            self._torch.zero_grad(set_to_none=set_to_none)
        else:
            super().zero_grad(set_to_none=set_to_none)

    def __repr__(self) -> str:
        est = self._batch_step.estimator
        hp = ", ".join(f"{k}={v!r}" for k, v in est.hparams.items())
        base = type(self._torch).__name__ if self._torch is not None else "gamfunc"
        return (
            f"{type(self).__name__}(estimator={est.name}({hp}), base={base}, "
            f"lr={self.param_groups[0].get('lr')})"
        )

    # ---- the step ---------------------------------------------------------------------------------

    def _names(self, group) -> list[str]:
        ids = {id(p): k for k, p in self._trainable.items()}
        return [ids[id(p)] for p in group["params"]]

    def _params(self) -> dict[str, Tensor]:
        return {k: p.detach() for k, p in self._trainable.items()}

    def _advance(self, run, data) -> Tensor:
        bridge = self._bridge
        self._pass_buffers.new_step()  # the last step's buffers are in the module
        if self._graphed and bridge is not None and run is self._batch_step:
            self._recapture_on_change()
        if bridge is None:
            params = self._params()
        else:  # copies, which the step reads while the base optimiser moves its own tensors
            params, tensors = bridge.snapshot()
        named_buffers = [(k, b) for k, d, key in self._buffer_at if (b := d.get(key)) is not None]
        buffers = self._detached(named_buffers)
        if self._state is None:
            self._state = run.init(params, None)
        state = self._state._replace(buffers=buffers)
        if bridge is None:
            state = state._replace(opt=self._with_groups(state.opt))
            new_params, new_state, metrics = run(params, state, data)
        else:
            state = state._replace(
                opt=_map_torch(state.opt, lambda s: TorchState(s.finite, tensors))
            )
            try:
                new_params, new_state, metrics = run(params, state, data)
            except BaseException:
                bridge.rollback(params, tensors)
                raise
            formed = []
            opt = _map_torch(new_state.opt, lambda s: formed.append(s) or TorchState(s.finite))
            bridge.commit(formed[0].tensors, metrics.get("skipped"))
            new_state = new_state._replace(opt=opt)
            metrics.setdefault("lr", _lr_metric(self.param_groups[0]["lr"]))
        with torch.no_grad():  # where the step moved the parameters themselves, nothing to copy
            moved = [
                (p, new_params[k]) for k, p in self._trainable.items() if new_params[k] is not p
            ]
            tree.copy_into([p for p, _ in moved], [n for _, n in moved])
            tree.copy_into(
                [b for _, b in named_buffers], [new_state.buffers[k] for k, _ in named_buffers]
            )
        self._state = new_state._replace(buffers=())  # the buffers live in the module
        self.metrics = metrics
        if bridge is None and self._hyper.scheduled:
            self.param_groups[0]["lr"] = float(learning_rate(new_state.opt))
            self._set[0]["lr"] = self.param_groups[0]["lr"]
        return metrics["loss"]

    def _detached(self, named_buffers: list[tuple[str, Tensor]]) -> dict[str, Tensor]:
        """The buffers, detached: the views of the last step where each buffer is the same tensor
        over the same memory (a module that replaces a buffer, or ``.to()``, makes a new view)."""
        views, out = self._views, {}
        for k, b in named_buffers:
            seen = views.get(k)
            if seen is None or seen[0] is not b or seen[1].data_ptr() != b.data_ptr():
                seen = views[k] = (b, b.detach())
            out[k] = seen[1]
        return out

    def _recapture_on_change(self) -> None:
        """Drop the graphs when a number the torch base optimiser reads from its param groups (a
        float lr) changed since they were made: a graph replays the value it was captured with."""
        numbers = [
            {k: v for k, v in g.items() if k != "params" and not isinstance(v, Tensor)}
            for g in self.param_groups
        ]
        if self._captured is not None and numbers != self._captured:
            release(self._batch_step)
        self._captured = numbers

    def _with_groups(self, opt_state):
        """``opt_state`` with each param group's hyperparameters in its injected state (group i, the
        i-th injected state that keeps an lr); a scheduled lr is the schedule's, and its group then
        only reports the lr of the last update."""
        hyper = self._hyper
        if hyper.scheduled or not hyper.names:
            if any(
                g.get("lr") != s.get("lr")
                for g, s in zip(self.param_groups, self._set, strict=True)
            ):
                raise RuntimeError(
                    "param_groups[0]['lr'] was changed, but the base optimiser's lr is a gamfunc "
                    "schedule, which sets it (or it keeps no lr: see gamfunc.inject_hyperparams); "
                    "give the optimiser a constant lr to drive it with torch.optim.lr_scheduler"
                )
            return opt_state
        groups = iter(self.param_groups)

        def set_group(s: InjectState) -> InjectState:
            if "lr" not in s.hyperparams:
                return s
            group = next(groups)
            # new 0-d tensors, never in-place writes: earlier metrics and states share the old ones
            new = {
                k: torch.full((), float(group[k]), dtype=v.dtype, device=v.device)
                for k, v in s.hyperparams.items()
                if k in group
            }
            return InjectState({**s.hyperparams, **new}, s.scheduled, s.inner)

        return map_injected(opt_state, set_group)


class _Hyper(NamedTuple):
    """What a gamfunc optimiser injects: the hyperparameter names of each injected state with an
    lr (one per param group), and whether an lr is a schedule."""

    names: list[list[str]]
    scheduled: bool


def _gamfunc_groups(
    optimizer: Transform, trainable: dict[str, Tensor]
) -> tuple[list[dict], _Hyper]:
    """The torch param groups of a gamfunc optimiser: one per injected state that keeps an lr, with
    its numeric hyperparameters and the parameters that lr moves (found by an update on one
    element per parameter with that lr alone set to 1, every other to 0)."""
    probe = {k: torch.ones((1,) * p.ndim, dtype=torch.float64) for k, p in trainable.items()}
    first = optimizer.init(probe)
    with_lr = [s for s in injected(first) if "lr" in s.hyperparams or "lr" in s.scheduled]
    scheduled = any("lr" in s.scheduled for s in with_lr)
    params = list(trainable.values())
    if scheduled or len(with_lr) <= 1:
        lr = None if not with_lr else float(learning_rate(first))
        extra = {} if scheduled or not with_lr else _numbers(with_lr[0])
        return [{"params": params, "lr": lr, **extra}], _Hyper(
            [list(extra)] if with_lr else [], scheduled
        )
    members: dict[str, int] = {}
    for i in range(len(with_lr)):
        counter = iter(range(len(with_lr)))

        def only(s, i=i, counter=counter):
            if "lr" not in s.hyperparams:
                return s
            lr = torch.tensor(1.0 if next(counter) == i else 0.0, dtype=torch.float64)
            return InjectState({**s.hyperparams, "lr": lr}, s.scheduled, s.inner)

        updates, _ = call_update(
            optimizer,
            {k: torch.ones_like(v) for k, v in probe.items()},
            map_injected(first, only),
            probe,
            torch.zeros((), dtype=torch.int64),
        )
        for k, u in updates.items():
            if k not in members and bool(u.abs().sum() > 0):
                members[k] = i
    groups = []
    for i, s in enumerate(with_lr):
        ps = [p for k, p in trainable.items() if members.get(k, 0) == i]
        groups.append({"params": ps, **_numbers(s)})
    return groups, _Hyper([list(_numbers(s)) for s in with_lr], False)


def _numbers(s: InjectState) -> dict[str, float]:
    return {k: float(v) for k, v in s.hyperparams.items() if v.ndim == 0}


class GAM(FlatnessOptimizer):
    """[`FlatnessOptimizer`][gamfunc.torch_optim.FlatnessOptimizer] with ``gamfunc.gam(rho, alpha, hvp, ...)``: paper Algorithm 1.

    ρ is ``rho``, α is ``alpha``; ``hvp``, ``fd_radius``, ``oracle``, ``eps`` and ``adaptive`` go to
    [`gamfunc.gam`][gamfunc.estimators.gam.gam], the other keywords to [`FlatnessOptimizer`][gamfunc.torch_optim.FlatnessOptimizer] (its options, or the
    keyword arguments of an optimiser class given as the base optimiser).

    Raises:
        TypeError: no base optimiser, or a keyword argument for an optimiser instance.

    Example:
        >>> import torch, gamfunc
        >>> from gamfunc.torch_optim import GAM
        >>> model = torch.nn.Linear(4, 3)
        >>> opt = GAM(model, torch.optim.SGD, lr=0.1, momentum=0.9, rho=0.05, alpha=0.1)
        >>> loss = opt.step((torch.randn(8, 4), torch.randint(0, 3, (8,))))
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer=None,
        *,
        rho,
        alpha: float,
        base_optimizer=None,
        criterion: Callable = F.cross_entropy,
        hvp: str = "exact",
        fd_radius: float = 1e-3,
        oracle: Estimator | None = None,
        eps: float = 1e-12,
        adaptive: bool = False,
        **options,
    ):
        _check_model(model)
        _check_options(type(self).__name__, optimizer, base_optimizer, options)
        estimator = gam(
            rho, alpha, hvp=hvp, fd_radius=fd_radius, oracle=oracle, eps=eps, adaptive=adaptive
        )
        super().__init__(
            model, estimator, optimizer, criterion, base_optimizer=base_optimizer, **options
        )


class SAM(FlatnessOptimizer):
    """[`FlatnessOptimizer`][gamfunc.torch_optim.FlatnessOptimizer] with ``gamfunc.sam(rho)``: direction ∇L(θ + ρ·g/‖g‖), g = ∇L(θ).

    The base optimiser is given as for [`GAM`][gamfunc.torch_optim.GAM].

    Raises:
        TypeError: no base optimiser, or a keyword argument for an optimiser instance.

    Example:
        >>> import torch, gamfunc
        >>> from gamfunc.torch_optim import SAM
        >>> model = torch.nn.Linear(4, 3)
        >>> opt = SAM(model, gamfunc.sgd(lr=0.1, momentum=0.9), rho=0.05)
        >>> loss = opt.step((torch.randn(8, 4), torch.randint(0, 3, (8,))))
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer=None,
        *,
        rho,
        base_optimizer=None,
        criterion: Callable = F.cross_entropy,
        eps: float = 1e-12,
        **options,
    ):
        _check_model(model)
        _check_options(type(self).__name__, optimizer, base_optimizer, options)
        super().__init__(
            model, sam(rho, eps=eps), optimizer, criterion, base_optimizer=base_optimizer, **options
        )


class TorchBase(FlatnessOptimizer):
    """[`FlatnessOptimizer`][gamfunc.torch_optim.FlatnessOptimizer] over a ``torch.optim`` base optimiser, named so.

    It adds nothing to the facade: the step is make_step's, the base optimiser joined to it by a
    `gamfunc.torch_bridge.TorchBridge`. ``param_groups`` and ``state``
    are the base optimiser's own; ``state_dict()`` holds its ``state_dict()`` under ``"base"``.

    Args:
        model: the module.
        estimator: a gamfunc estimator.
        base_optimizer: a ``torch.optim.Optimizer`` over the model's parameters (any subclass), or
            such a class with its keyword arguments in ``**options``.
        criterion: ``criterion(outputs, targets)`` for ``step((inputs, targets))``.
        **options: the options of [`FlatnessOptimizer`][gamfunc.torch_optim.FlatnessOptimizer].

    Raises:
        TypeError: ``base_optimizer`` is not a ``torch.optim`` optimiser or class.

    Example:
        >>> import torch, gamfunc
        >>> from gamfunc.torch_optim import TorchBase
        >>> model = torch.nn.Linear(4, 3)
        >>> base = torch.optim.Adam(model.parameters(), lr=1e-3)
        >>> opt = TorchBase(model, gamfunc.gam(0.05, 0.1), base)
        >>> loss = opt.step((torch.randn(8, 4), torch.randint(0, 3, (8,))))
    """

    def __init__(
        self,
        model: nn.Module,
        estimator: Estimator,
        base_optimizer,
        criterion: Callable = F.cross_entropy,
        **options,
    ):
        if not _is_torch(base_optimizer):
            raise TypeError(
                "base_optimizer must be a torch.optim.Optimizer over model.parameters() or its "
                f"class; got {type(base_optimizer).__name__}"
            )
        super().__init__(model, estimator, base_optimizer, criterion, **options)


def _step_arguments(closure, batch):
    """``(closure, batch)`` of a facade's ``step``: a non-callable first argument is the batch; a
    closure given with a batch is called once first (as ``torch.optim`` does)."""
    if batch is None and closure is not None and not callable(closure):
        closure, batch = None, closure
    if batch is None and closure is None:
        raise TypeError(
            "step() needs a batch, step((inputs, targets)), or a closure returning the loss; "
            "torch.amp.GradScaler cannot drive it: build the optimiser with precision='fp16' instead"
        )
    if batch is not None:
        _check_batch(batch)
        if closure is not None:
            with torch.enable_grad():
                closure()
        return None, batch
    return closure, None


# ---- pure loss functions over the module ------------------------------------------------------------


def _as_is(module_loss, model: nn.Module, params, batch, buffers):
    """The module's loss in the mode the module is in (no train/eval switch)."""
    return module_loss(params, batch, buffers, train=model.training)


class _Holder(nn.Module):
    """Holds the model as a submodule, so that its tensors are swapped around ``closure()``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.call = Caller(self)

    def forward(self, closure):
        return closure()


def _closure_loss(holder: _Holder, copy_buffers, params, closure, buffers):
    """``closure()`` evaluated at (params, buffers): the loss and the new buffers, for make_step."""
    new_buffers = copy_buffers(buffers)
    tensors = (
        {f"model.{k}": v for k, v in params.items()},
        {f"model.{k}": v for k, v in new_buffers.items()},
    )
    loss = holder.call(tensors, (closure,))
    if not isinstance(loss, Tensor):
        raise TypeError(f"the closure must return the loss tensor; it returned {type(loss)}")
    return loss, new_buffers


class _PassBuffers:
    """The buffers that each pass of the facade's step writes (BatchNorm's running statistics):
    copies of the module's, written in place from step to step
    ([`gamfunc.tree.recopy`][gamfunc.tree.recopy]), where a new copy per pass allocates every
    buffer anew (ResNet-50: 159 tensors a pass, a host cost that davda54/sam's in-place BatchNorm
    does not have). The k-th pass of a step writes into the k-th set; `new_step` counts from the
    first again, once the last step's buffers were copied into the module and nothing reads them.
    Traced, inside a ``torch.func`` transform, for buffers that autograd records, or while a CUDA
    graph is captured, each pass gets new copies (`gamfunc.tree.clone`)."""

    def __init__(self):
        self._sets: list[list[Tensor]] = []
        self._sources: list[list[Tensor]] = []
        self._next = 0

    def new_step(self) -> None:
        self._next = 0

    def __call__(self, buffers: dict[str, Tensor]) -> dict[str, Tensor]:
        values = list(buffers.values())
        if not values or not _reusable(values):
            return tree.clone(buffers)
        i = self._next
        self._next += 1
        if i == len(self._sets):
            self._sets.append([])
            self._sources.append([])
        self._sets[i] = tree.recopy(self._sets[i], values, self._sources[i])
        self._sources[i] = values
        return dict(zip(buffers, self._sets[i], strict=True))


def _reusable(buffers: list[Tensor]) -> bool:
    """Whether a pass may write into buffers kept from an earlier step: where `gamfunc.tree.clone`
    takes its foreach kernels (eager, outside torch.func transforms, autograd not recording the
    buffers), and no CUDA graph is being captured."""
    if tree._per_tensor(buffers):
        return False
    return not (buffers[0].is_cuda and torch.cuda.is_current_stream_capturing())


# ---- the base optimiser -----------------------------------------------------------------------------


def _is_torch(opt) -> bool:
    return isinstance(opt, torch.optim.Optimizer) or (
        isinstance(opt, type) and issubclass(opt, torch.optim.Optimizer)
    )


def _built(opt, trainable: dict[str, Tensor], kwargs: dict):
    """The base optimiser: ``opt`` itself, or ``opt(**kwargs)`` built here from a class (over the
    trainable parameters) or a gamfunc factory."""
    if opt is None:
        raise TypeError(
            "a base optimiser is needed, e.g. GAM(model, torch.optim.SGD, lr=0.1, rho=0.05, "
            "alpha=0.1) or GAM(model, gamfunc.sgd(lr=0.1), rho=0.05, alpha=0.1)"
        )
    if isinstance(opt, type) and issubclass(opt, torch.optim.Optimizer):
        opt = opt(list(trainable.values()), **kwargs)
    elif kwargs and callable(opt) and not isinstance(opt, Transform | torch.optim.Optimizer):
        opt = opt(**kwargs)
    elif kwargs:
        raise TypeError(
            f"{', '.join(kwargs)}= belong to the base optimiser: give them to it "
            f"(torch.optim.SGD(model.parameters(), lr=0.1) or gamfunc.sgd(lr=0.1)), or pass its "
            f"class with them: GAM(model, torch.optim.SGD, lr=0.1, ...)"
        )
    if isinstance(opt, torch.optim.Optimizer):
        closure = inspect.signature(type(opt).step).parameters.get("closure")
        if closure is not None and closure.default is inspect.Parameter.empty:
            raise TypeError(
                f"{type(opt).__name__}.step needs a closure that re-evaluates the loss, which a "
                "flatness step cannot give it: use an optimiser whose step takes the gradient "
                "(torch.optim.SGD, AdamW, ...)"
            )
        return opt
    if not isinstance(opt, Transform):
        raise TypeError(
            "the base optimiser must be a torch.optim.Optimizer (or its class) or a gamfunc "
            f"optimizer such as gamfunc.sgd(lr=0.1); got {getattr(opt, '__name__', type(opt).__name__)}"
        )
    return opt


def _held(base: torch.optim.Optimizer, named: dict[str, Tensor]) -> dict[str, Tensor]:
    """The model's parameters that ``base`` holds, by name in the model's order; a ValueError
    when it holds other tensors."""
    held = {id(p) for g in base.param_groups for p in g["params"]}
    mine = {k: p for k, p in named.items() if id(p) in held}
    if len(mine) != len(held):
        raise ValueError(
            f"the base optimiser holds tensors that are not the model's parameters: build it on "
            f"them, {type(base).__name__}(model.parameters(), ...)"
        )
    return mine


# ---- checks -----------------------------------------------------------------------------------------


_OPTIONS = (
    "cuda_graph",
    "every",
    "base",
    "on_nonfinite",
    "compile",
    "compile_options",
    "accumulate",
    "precision",
    "max_grad_norm",
)


def _check_model(model) -> None:
    if isinstance(model, nn.Module):
        return
    if isinstance(model, Iterable) and not isinstance(model, str | bytes | dict):
        raise TypeError(
            "the first argument must be the model itself, not its parameters: write "
            "GAM(model, ...), not GAM(model.parameters(), ...)"
        )
    raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")


def _check_options(cls: str, optimizer, base_optimizer, options: dict) -> None:
    """One clear error, naming ``cls``, for a missing base optimiser, or keyword arguments that
    belong to an optimiser already built."""
    opt = optimizer if optimizer is not None else base_optimizer
    example = f"{cls}(model, torch.optim.SGD, lr=0.1, momentum=0.9, ...)"
    if opt is None:
        raise TypeError(
            f"{cls}() needs a base optimiser as its second argument, e.g. {example}, "
            f"{cls}(model, gamfunc.sgd(lr=0.1), ...) or base_optimizer="
        )
    extra = [k for k in options if k not in _OPTIONS]
    if extra and isinstance(opt, Transform | torch.optim.Optimizer):
        raise TypeError(
            f"{cls}() takes no {extra[0]}=: it belongs to the base optimiser; give it to the "
            f"optimiser, or pass the optimiser's class with it, e.g. {example}"
        )


def _check_arguments(criterion, compile, compile_options, accumulate, precision) -> None:
    if not callable(criterion):
        raise TypeError(
            f"criterion must be callable(outputs, targets); got {type(criterion).__name__}"
        )
    if not isinstance(compile, bool):
        raise TypeError(f"compile must be True or False; got {compile!r}")
    if compile_options is not None and not isinstance(compile_options, dict):
        raise TypeError(f"compile_options must be a dict; got {type(compile_options).__name__}")
    if compile_options and not compile:
        raise ValueError("compile_options were given but compile=False")
    if isinstance(accumulate, bool) or not isinstance(accumulate, int) or accumulate < 1:
        raise ValueError(f"accumulate must be an integer >= 1; got {accumulate!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}; got {precision!r}")


def _check_capturable(base: torch.optim.Optimizer | None, trainable: dict[str, Tensor]) -> None:
    """``cuda_graph=True`` needs the model on a CUDA device and a base optimiser whose step can be
    captured: one line saying what to change."""
    if base is not None and any(g.get("capturable") is False for g in base.param_groups):
        raise ValueError(
            f"cuda_graph=True needs a base optimiser that can be captured: build it with "
            f"capturable=True, {type(base).__name__}(model.parameters(), ..., capturable=True)"
        )
    devices = {p.device.type for p in trainable.values()}
    if devices != {"cuda"}:
        raise ValueError(
            f"cuda_graph=True replays CUDA graphs: move the model to a CUDA device first (its "
            f"parameters are on {sorted(devices)})"
        )


def _check_batch(batch) -> None:
    if not (isinstance(batch, tuple | list) and len(batch) == 2):
        raise ValueError(
            "batch must be a pair (inputs, targets) for criterion(model(inputs), targets); "
            f"got {type(batch).__name__}. For other batches pass a closure returning the loss."
        )


def _placed(saved, reference):
    """A saved tensor as a copy in the dtype and on the device of its ``reference`` (a fresh state's)."""
    if isinstance(reference, Tensor):
        return saved.to(device=reference.device, dtype=reference.dtype, copy=True)
    return saved
