"""Train an ``nn.Module`` with GAM, SAM or any estimator from ``torch.optim``-style code.

[`FlatnessOptimizer`][gamfunc.torch_optim.FlatnessOptimizer] is a ``torch.optim.Optimizer`` whose ``step`` runs the pure step of
[`gamfunc.make_step`][gamfunc.make_step] on the module's tensors and writes the result back into the module. It is a
shell, not a second implementation: every gradient, Hessian-vector product and update comes from
the estimator and base optimiser it is given. [`GAM`][gamfunc.torch_optim.GAM] and [`SAM`][gamfunc.torch_optim.SAM] only choose the estimator.

Switching a ``torch.optim`` loop:

```python
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)   # before
optimizer = GAM(model, gamfunc.sgd(lr=0.1, momentum=0.9), rho=0.05, alpha=0.1)   # after

for inputs, targets in loader:
    loss = optimizer.step((inputs, targets))   # replaces zero_grad / forward / backward / step
    scheduler.step()                            # any torch.optim.lr_scheduler drives the lr
```

How the loss reaches the pure step:

* ``step(batch)`` with ``batch = (inputs, targets)``: the loss is ``criterion(model(inputs), targets)``,
  evaluated through ``torch.func.functional_call`` ([`gamfunc.nn.functionalize`][gamfunc.nn.functionalize]). This form can be
  compiled (``compile=True``).
* ``step(closure)``: ``closure()`` takes no argument and returns the loss, computed by calling the
  model as usual (``lambda: criterion(model(x), y)``). It is re-evaluated at every point the estimator
  needs (θ, θ + ε, ...) with the module's tensors swapped by ``torch.func.functional_call``, like the
  closure of davda54/sam, but it must not call ``backward()``: gamfunc differentiates it. This form
  always runs eagerly.
* ``step(closure, batch=batch)``: what trainers such as Lightning pass (their closure runs hooks). The
  closure is called once under ``torch.enable_grad()``, as ``torch.optim`` does, its result is ignored,
  and the step is computed from ``batch``.

The module is kept whole, although long: its two shells, [`FlatnessOptimizer`][gamfunc.torch_optim.FlatnessOptimizer] (a gamfunc base
optimiser) and [`TorchBase`][gamfunc.torch_optim.TorchBase] (a ``torch.optim`` one), share how ``step`` reads its arguments,
the loss over the module and the argument checks. Given ``base_optimizer=``, a
[`FlatnessOptimizer`][gamfunc.torch_optim.FlatnessOptimizer] (and so [`GAM`][gamfunc.torch_optim.GAM] and [`SAM`][gamfunc.torch_optim.SAM]) runs its steps through a
[`TorchBase`][gamfunc.torch_optim.TorchBase] it holds; most of the module's length is their documentation.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call
from torch.utils import _pytree as pytree

from gamfunc import tree
from gamfunc.estimators import Estimator, gam, sam
from gamfunc.nn import functionalize
from gamfunc.optim import InjectState, Transform, injected, learning_rate, map_injected
from gamfunc.state import StepState, as_dict, from_dict
from gamfunc.step import is_finite, make_step

__all__ = ["GAM", "SAM", "FlatnessOptimizer", "TorchBase"]

# What torch raises when the closure calls backward() itself: inside a torch.func transform (compiled
# or nested steps), or before gamfunc's own backward pass of an eager step.
_BACKWARD_INSIDE = (
    "backward() called inside a functorch transform",
    "backward through the graph a second time",
)


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
    ``model.state_dict()``, EMA, checkpoints).

    Args:
        model: the module to train. Its parameters with ``requires_grad=False`` are left alone; its
            buffers (BatchNorm running statistics) are updated once per step from the pass at θ; passes
            at perturbed points use batch statistics and leave them alone. The module is evaluated
            in whatever mode it is in (``model.train()`` / ``model.eval()``), as in a ``torch.optim`` loop.
        estimator: a gamfunc estimator, e.g. ``gamfunc.gam(rho=0.05, alpha=0.1)``.
        optimizer: a gamfunc base optimiser, e.g. ``gamfunc.sgd(lr=0.1, momentum=0.9)``.
        base_optimizer: instead of ``optimizer``, a ``torch.optim.Optimizer`` over the model's
            trainable parameters: each step then runs through a [`TorchBase`][gamfunc.torch_optim.TorchBase] held inside,
            whose ``param_groups`` and ``state`` this optimiser shares.
        criterion: ``criterion(outputs, targets) -> scalar`` for ``step((inputs, targets))``;
            ``F.cross_entropy`` by default.
        every: run ``estimator`` on every ``every``-th step and ``base`` on the others (see
            [`gamfunc.make_step`][gamfunc.make_step]).
        base: the estimator of the other steps, ``gradient()`` by default.
        on_nonfinite: "skip" (default), "raise" or "ignore" (see [`gamfunc.make_step`][gamfunc.make_step]).
        compile: compile ``step(batch)`` with ``torch.compile`` (one graph per branch; lr changes and
            schedulers never recompile).
        compile_options: keyword arguments of ``torch.compile``, e.g. ``{"fullgraph": True}``.

    Attributes:
        param_groups: one group holding the trainable parameters and ``lr``. Before every step its
            ``lr`` is written into the base optimiser's state as a 0-d tensor, so
            ``torch.optim.lr_scheduler`` drives the learning rate (compiled or not).
        metrics: the scalar tensors of the last step (``loss``, ``grad_norm``, ``lr``, ``rho``...).

    ``step`` returns the loss at θ before the update (a 0-d tensor). ``state_dict()`` holds the step
    state in plain dicts (`gamfunc.state.as_dict`: the step counters, the optimiser state with
    momentum or Adam moments keyed by parameter name) and the param group; the parameters and buffers live in the module, so a checkpoint is ``model.state_dict()``
    plus ``optimizer.state_dict()``, as with ``torch.optim``.

    Warning:
        With a base optimiser whose ``lr`` is a gamfunc schedule, the schedule sets the learning rate;
        ``param_groups[0]["lr"]`` then reports the last lr used (one device synchronisation per step),
        and changing it (e.g. with a ``torch.optim.lr_scheduler``) raises ``RuntimeError``.
        Only ``lr`` is read from the param group: weight decay, momentum and betas are those of the
        gamfunc optimiser. ``add_param_group`` is not supported (one group: the model).

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
        optimizer: Transform | None = None,
        criterion: Callable = F.cross_entropy,
        *,
        base_optimizer: torch.optim.Optimizer | None = None,
        every: int = 1,
        base: Estimator | None = None,
        on_nonfinite: str = "skip",
        compile: bool = False,
        compile_options: dict[str, Any] | None = None,
    ):
        self._torch: TorchBase | None = None
        if base_optimizer is not None:
            if optimizer is not None:
                raise TypeError("pass either a gamfunc optimizer or base_optimizer=, not both")
            if (every, base, on_nonfinite, compile, compile_options) != (
                1,
                None,
                "skip",
                False,
                None,
            ):
                raise TypeError(
                    "every, base, on_nonfinite, compile and compile_options apply to a gamfunc "
                    "base optimiser; a torch.optim base_optimizer takes none of them"
                )
            self._torch = TorchBase(model, estimator, base_optimizer, criterion)
            self._model = model
            self.metrics = {}
            trainable = list(self._torch._trainable.values())
            super().__init__(trainable, dict(base_optimizer.defaults))
            # the base optimiser's groups and state, shared: a scheduler of either moves both
            self.param_groups, self.state = base_optimizer.param_groups, base_optimizer.state
            self._groups_fixed = True
            return
        _check_arguments(model, optimizer, criterion, compile, compile_options)
        trainable = {k: p for k, p in model.named_parameters() if p.requires_grad}
        if not trainable:
            raise ValueError("model has no parameter with requires_grad=True to optimise")
        # The first lr and whether a schedule sets it, from the state the optimiser starts with, on
        # one element per parameter (the names and numbers of dimensions a weight_decay_mask reads).
        first = optimizer.init(
            {k: torch.zeros((1,) * p.ndim, dtype=torch.float64) for k, p in trainable.items()}
        )
        with_lr = [s for s in injected(first) if "lr" in s.hyperparams or "lr" in s.scheduled]
        self._own_schedule = any("lr" in s.scheduled for s in with_lr)
        lr0 = None if not with_lr else float(learning_rate(first))
        # each injected lr (a param group's) follows the group's lr in proportion, as
        # torch.optim.lr_scheduler scales every param group
        self._lr_scales = [
            1.0 if not lr0 else float(s.hyperparams.get("lr", s.scheduled.get("lr"))) / lr0
            for s in with_lr
        ]
        module_loss, _, _ = functionalize(model, criterion)
        options = {"every": every, "base": base, "on_nonfinite": on_nonfinite}
        batch_step = make_step(
            estimator, optimizer, functools.partial(_as_is, module_loss, model), **options
        )
        self._closure_step = make_step(
            estimator, optimizer, functools.partial(_closure_loss, _Holder(model)), **options
        )
        self._batch_step = batch_step.compile(**(compile_options or {})) if compile else batch_step
        self._model, self._trainable = model, trainable
        self._state: StepState | None = None
        self.metrics: dict[str, Tensor] = {}
        super().__init__(list(trainable.values()), {"lr": lr0})
        self._lr_set = lr0
        self._groups_fixed = True

    # ---- torch.optim.Optimizer interface ----------------------------------------------------------

    def step(self, closure=None, *, batch=None) -> Tensor:
        """One step; returns the loss at θ before the update (a 0-d tensor).

        Args:
            closure: a callable ``closure() -> loss`` that calls the model (it must not call
                ``backward()``), or the batch itself, ``step((inputs, targets))``.
            batch: ``(inputs, targets)`` for ``criterion(model(inputs), targets)``. Given together with
                a closure, the closure is called once first, as ``torch.optim`` does (Lightning's hooks),
                and the batch drives the step.
        """
        if self._torch is not None:
            loss = self._torch.step(closure, batch=batch)
            self.metrics = self._torch.metrics
            return loss
        closure, batch = _step_arguments(closure, batch)
        if batch is not None:
            return self._advance(self._batch_step, batch)
        try:
            return self._advance(self._closure_step, closure)
        except RuntimeError as e:
            if not any(m in str(e) for m in _BACKWARD_INSIDE):
                raise
            raise RuntimeError(
                "the closure given to step() must return the loss without calling backward(): "
                "gamfunc differentiates it with torch.func"
            ) from e

    def state_dict(self) -> dict[str, Any]:
        """``{"state": {step, skipped, opt}, "param_groups": [group]}``: the step state as plain dicts
        (`gamfunc.state.as_dict`, so ``torch.load(weights_only=True)`` reads it), tensors keyed
        by parameter name; ``{}`` before the first step. With a ``torch.optim`` base optimiser,
        [`TorchBase.state_dict`][gamfunc.torch_optim.TorchBase.state_dict]."""
        if self._torch is not None:
            return self._torch.state_dict()
        group = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        state = {} if self._state is None else as_dict(self._state)
        return {"state": state, "param_groups": [group | {"params": list(self._trainable)}]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what [`state_dict`][gamfunc.torch_optim.FlatnessOptimizer.state_dict] returned; tensors move to the parameters' device."""
        if self._torch is not None:
            self._torch.load_state_dict(state_dict)
            self.param_groups, self.state = self._torch.param_groups, self._torch.state
            return
        if not isinstance(state_dict, dict) or set(state_dict) != {"state", "param_groups"}:
            raise ValueError("state_dict must be a dict with keys 'state' and 'param_groups'")
        groups = state_dict["param_groups"]
        if len(groups) != 1 or list(groups[0].get("params", ())) != list(self._trainable):
            raise ValueError(
                "state_dict was saved for other parameters; expected one group with "
                f"params {list(self._trainable)}"
            )
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
        self.param_groups[0].update({k: v for k, v in groups[0].items() if k != "params"})
        self._lr_set = self.param_groups[0]["lr"]

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if getattr(self, "_groups_fixed", False):
            raise TypeError(
                f"{type(self).__name__} optimises one group, the model's trainable parameters; "
                "add_param_group is not supported"
            )
        super().add_param_group(param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._torch is not None:
            self._torch.zero_grad(set_to_none=set_to_none)
        else:
            super().zero_grad(set_to_none=set_to_none)

    def __repr__(self) -> str:
        if self._torch is not None:
            return f"{type(self).__name__}({self._torch!r})"
        est = self._batch_step.estimator
        hp = ", ".join(f"{k}={v!r}" for k, v in est.hparams.items())
        return f"{type(self).__name__}(estimator={est.name}({hp}), lr={self.param_groups[0]['lr']})"

    # ---- the step ---------------------------------------------------------------------------------

    def _params(self) -> dict[str, Tensor]:
        return {k: p.detach() for k, p in self._trainable.items()}

    def _advance(self, run, data) -> Tensor:
        params = self._params()
        buffers = {k: b.detach() for k, b in self._model.named_buffers()}
        if self._state is None:
            self._state = run.init(params, None)
        state = self._state._replace(buffers=buffers, opt=self._with_group_lr(self._state.opt))
        new_params, new_state, metrics = run(params, state, data)
        with torch.no_grad():
            for k, p in self._trainable.items():
                p.copy_(new_params[k])
            for k, b in self._model.named_buffers():
                b.copy_(new_state.buffers[k])
        self._state = new_state._replace(buffers=())  # the buffers live in the module
        self.metrics = metrics
        if self._own_schedule:
            self.param_groups[0]["lr"] = self._lr_set = float(learning_rate(new_state.opt))
        return metrics["loss"]

    def _with_group_lr(self, opt_state):
        """``opt_state`` with ``param_groups[0]["lr"]`` as the lr of the next update (each injected
        lr in proportion); a scheduled lr is the schedule's, and the group then only reports the
        lr of the last update."""
        lr = self.param_groups[0]["lr"]
        if self._own_schedule or not self._lr_scales:
            if lr != self._lr_set:
                raise RuntimeError(
                    "param_groups[0]['lr'] was changed, but the base optimiser's lr is a gamfunc "
                    "schedule, which sets it (or it keeps no lr: see gamfunc.inject_hyperparams); "
                    "give the optimiser a constant lr to drive it with torch.optim.lr_scheduler"
                )
            return opt_state
        scales = iter(self._lr_scales)

        def set_lr(s: InjectState) -> InjectState:
            if "lr" not in s.hyperparams:
                return s
            old = s.hyperparams["lr"]
            # a new 0-d tensor, never an in-place write: earlier metrics and states share the old
            new = torch.full((), float(lr) * next(scales), dtype=torch.float64, device=old.device)
            return InjectState({**s.hyperparams, "lr": new}, s.scheduled, s.inner)

        return map_injected(opt_state, set_lr)


class GAM(FlatnessOptimizer):
    """[`FlatnessOptimizer`][gamfunc.torch_optim.FlatnessOptimizer] with ``gamfunc.gam(rho, alpha, hvp, ...)``: paper Algorithm 1.

    ρ is ``rho``, α is ``alpha``; ``hvp``, ``fd_radius``, ``oracle`` and ``eps`` go to
    [`gamfunc.gam`][gamfunc.estimators.gam.gam], the other keywords to [`FlatnessOptimizer`][gamfunc.torch_optim.FlatnessOptimizer]. The base optimiser is a
    gamfunc one (``optimizer``) or a ``torch.optim`` one (``base_optimizer=``).

    Raises:
        TypeError: neither or both of ``optimizer`` and ``base_optimizer``, or an argument that
            belongs to the base optimiser (``lr``, ``momentum``...).

    Example:
        >>> import torch, gamfunc
        >>> from gamfunc.torch_optim import GAM
        >>> model = torch.nn.Linear(4, 3)
        >>> opt = GAM(model, gamfunc.sgd(lr=0.1, momentum=0.9), rho=0.05, alpha=0.1)
        >>> loss = opt.step((torch.randn(8, 4), torch.randint(0, 3, (8,))))
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: Transform | None = None,
        *,
        rho,
        alpha: float,
        base_optimizer: torch.optim.Optimizer | None = None,
        criterion: Callable = F.cross_entropy,
        hvp: str = "exact",
        fd_radius: float = 1e-3,
        oracle: Estimator | None = None,
        eps: float = 1e-12,
        **options,
    ):
        _check_options(type(self).__name__, optimizer, base_optimizer, options)
        estimator = gam(rho, alpha, hvp=hvp, fd_radius=fd_radius, oracle=oracle, eps=eps)
        super().__init__(
            model, estimator, optimizer, criterion, base_optimizer=base_optimizer, **options
        )


class SAM(FlatnessOptimizer):
    """[`FlatnessOptimizer`][gamfunc.torch_optim.FlatnessOptimizer] with ``gamfunc.sam(rho)``: direction ∇L(θ + ρ·g/‖g‖), g = ∇L(θ).

    The base optimiser is a gamfunc one (``optimizer``) or a ``torch.optim`` one
    (``base_optimizer=``), as for [`GAM`][gamfunc.torch_optim.GAM].

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
        optimizer: Transform | None = None,
        *,
        rho,
        base_optimizer: torch.optim.Optimizer | None = None,
        criterion: Callable = F.cross_entropy,
        eps: float = 1e-12,
        **options,
    ):
        _check_options(type(self).__name__, optimizer, base_optimizer, options)
        super().__init__(
            model, sam(rho, eps=eps), optimizer, criterion, base_optimizer=base_optimizer, **options
        )


class TorchBase(torch.optim.Optimizer):
    """Any ``torch.optim`` optimiser as the base of a flatness-aware step, as davda54/sam is used.

    One step: the estimator's direction at θ (GAM, SAM, ...) goes into each parameter's ``.grad``
    and the base optimiser's own ``step()`` runs, with its parameter groups, its state and whatever
    ``torch.optim.lr_scheduler`` drives it; BatchNorm buffers take the pass at θ's statistics. The
    non-finite guard is [`gamfunc.make_step`][gamfunc.make_step]'s (`gamfunc.step.is_finite`): a step whose
    loss or direction is not finite is skipped (the parameters, the base optimiser's state and the
    buffers stay; ``metrics["skipped"]`` is 1); one whose update makes a parameter non-finite is
    undone on the parameters and skipped too.

    Warning:
        A ``torch.optim`` optimiser changes its own state (momentum, moments) in place as it steps,
        so after an undone update that state keeps the step's statistics; gamfunc's own optimisers
        ([`FlatnessOptimizer`][gamfunc.torch_optim.FlatnessOptimizer]) keep the state as it was. Made by ``GAM(model, base_optimizer=..., rho=,
    alpha=)`` or ``SAM(model, base_optimizer=..., rho=)``, or directly.

    Args:
        model: the module; the base optimiser must hold its trainable parameters, all of them.
        estimator: a gamfunc estimator.
        base_optimizer: a ``torch.optim.Optimizer`` over ``model.parameters()`` (any subclass).
        criterion: ``criterion(outputs, targets)`` for ``step((inputs, targets))``.

    ``param_groups`` and ``state`` are the base optimiser's own; ``state_dict()`` is its state dict
    with the step count beside it.

    Example:
        >>> import torch
        >>> from gamfunc.torch_optim import GAM
        >>> model = torch.nn.Linear(4, 3)
        >>> base = torch.optim.Adam(model.parameters(), lr=1e-3)
        >>> opt = GAM(model, base_optimizer=base, rho=0.05, alpha=0.1)
        >>> sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10)
        >>> loss = opt.step((torch.randn(8, 4), torch.randint(0, 3, (8,))))
        >>> sched.step()
    """

    def __init__(
        self,
        model: nn.Module,
        estimator: Estimator,
        base_optimizer: torch.optim.Optimizer,
        criterion: Callable = F.cross_entropy,
    ):
        if not isinstance(base_optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"base_optimizer must be a torch.optim.Optimizer instance over model.parameters(); "
                f"got {type(base_optimizer).__name__}"
            )
        if not isinstance(estimator, Estimator):
            raise TypeError(
                f"estimator must be a gamfunc estimator; got {type(estimator).__name__}"
            )
        trainable = {k: p for k, p in model.named_parameters() if p.requires_grad}
        held = {id(p) for g in base_optimizer.param_groups for p in g["params"]}
        missing = [k for k, p in trainable.items() if id(p) not in held]
        if missing or len(held) != len(trainable):
            raise ValueError(
                "base_optimizer must hold exactly the model's trainable parameters; "
                f"it lacks {missing[:3]}"
                if missing
                else "base_optimizer holds tensors that are not the model's trainable parameters"
            )
        module_loss, _, _ = functionalize(model, criterion)
        self._batch_loss = functools.partial(_as_is, module_loss, model)
        self._closure_loss = functools.partial(_closure_loss, _Holder(model))
        self._model, self._trainable, self._estimator = model, trainable, estimator
        self.base_optimizer, self._count = base_optimizer, 0
        self.metrics: dict[str, Tensor] = {}
        super().__init__(list(trainable.values()), dict(base_optimizer.defaults))
        # the base optimiser's groups and state, shared: a scheduler of either moves both
        self.param_groups, self.state = base_optimizer.param_groups, base_optimizer.state

    def step(self, closure=None, *, batch=None) -> Tensor:
        """One step (``step((inputs, targets))`` or ``step(closure)``, as
        [`FlatnessOptimizer.step`][gamfunc.torch_optim.FlatnessOptimizer.step]); returns the loss at θ before the update."""
        closure, batch = _step_arguments(closure, batch)
        params = {k: p.detach() for k, p in self._trainable.items()}
        buffers = {k: b.detach() for k, b in self._model.named_buffers()}
        loss = self._batch_loss if batch is not None else self._closure_loss
        data = batch if batch is not None else closure

        def bound(p, b):
            return loss(p, b, buffers)

        step = torch.tensor(self._count)
        est = self._estimator.run(params, data, bound, step=step)
        # the guard of gamfunc.make_step, before the base step on the loss and the direction, after
        # it on the new parameters (undone where not finite)
        finite = bool(is_finite(est))
        if finite:
            before = tree.clone(params)
            for k, p in self._trainable.items():
                p.grad = est.direction[k].to(p.dtype).detach().clone()
            self.base_optimizer.step()
            finite = bool(is_finite(est, {k: p.detach() for k, p in self._trainable.items()}))
            with torch.no_grad():
                if not finite:
                    for k, p in self._trainable.items():
                        p.copy_(before[k])
                else:
                    for k, b in self._model.named_buffers():
                        b.copy_(est.clean.aux[k])
            self._count += int(finite)
        skipped = torch.tensor(0 if finite else 1)
        self.metrics = {**est.info, "skipped": skipped}
        return est.info["loss"]

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.base_optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """The base optimiser's ``state_dict()`` and the count of steps taken."""
        return {"base": self.base_optimizer.state_dict(), "steps": self._count}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not isinstance(state_dict, dict) or set(state_dict) != {"base", "steps"}:
            raise ValueError("state_dict must be what TorchBase.state_dict() returned")
        self.base_optimizer.load_state_dict(state_dict["base"])
        self.param_groups, self.state = self.base_optimizer.param_groups, self.base_optimizer.state
        self._count = int(state_dict["steps"])

    def __repr__(self) -> str:
        return f"TorchBase({self._estimator.name}, base={type(self.base_optimizer).__name__})"


def _step_arguments(closure, batch):
    """``(closure, batch)`` of a facade's ``step``: a non-callable first argument is the batch; a
    closure given with a batch is called once first (as ``torch.optim`` does)."""
    if batch is None and closure is not None and not callable(closure):
        closure, batch = None, closure
    if batch is None and closure is None:
        raise TypeError(
            "step() needs a batch, step((inputs, targets)), or a closure returning the loss"
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
    """Holds the model as a submodule, so that functional_call swaps its tensors around ``closure()``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, closure):
        return closure()


def _closure_loss(holder: _Holder, params, closure, buffers):
    """``closure()`` evaluated at (params, buffers): the loss and the new buffers, for make_step."""
    new_buffers = {k: v.clone() for k, v in buffers.items()}
    tensors = (
        {f"model.{k}": v for k, v in params.items()},
        {f"model.{k}": v for k, v in new_buffers.items()},
    )
    loss = functional_call(holder, tensors, (closure,))
    if not isinstance(loss, Tensor):
        raise TypeError(f"the closure must return the loss tensor; it returned {type(loss)}")
    return loss, new_buffers


# ---- checks -----------------------------------------------------------------------------------------


_OPTIONS = ("every", "base", "on_nonfinite", "compile", "compile_options")
_BASE_SETTINGS = ("lr", "momentum", "weight_decay", "nesterov", "dampening", "betas")


def _check_options(cls: str, optimizer, base_optimizer, options: dict) -> None:
    """One clear error, naming ``cls``, for a missing base optimiser or an argument it does not take
    (a learning rate given to the facade rather than to the base optimiser, say)."""
    example = f"{cls}(model, gamfunc.sgd(lr=0.1, momentum=0.9), ...)"
    for key in options:
        if key in _BASE_SETTINGS:
            raise TypeError(
                f"{cls}() takes no {key}=: it belongs to the base optimiser, e.g. {example}"
            )
        if key not in _OPTIONS:
            raise TypeError(
                f"{cls}() got an unexpected argument {key!r}; it takes {', '.join(_OPTIONS)}"
            )
    if optimizer is None and base_optimizer is None:
        raise TypeError(
            f"{cls}() needs a base optimiser as its second argument, e.g. {example}, or a "
            f"torch.optim one as base_optimizer="
        )


def _check_arguments(model, optimizer, criterion, compile, compile_options) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    if not isinstance(optimizer, Transform):
        hint = ""
        if isinstance(optimizer, torch.optim.Optimizer) or (
            isinstance(optimizer, type) and issubclass(optimizer, torch.optim.Optimizer)
        ):
            hint = " (not a torch.optim one: e.g. gamfunc.sgd(lr=0.1, momentum=0.9), gamfunc.adamw(lr=1e-3))"
        raise TypeError(
            f"optimizer must be a gamfunc optimizer{hint}; got {getattr(optimizer, '__name__', type(optimizer).__name__)}"
        )
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
