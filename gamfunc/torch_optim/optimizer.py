"""[`FlatnessOptimizer`][gamfunc.torch_optim.FlatnessOptimizer]: a ``torch.optim.Optimizer``
whose ``step`` runs the pure step of [`gamfunc.make_step`][gamfunc.make_step] on a module's tensors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gamfunc import tree
from gamfunc.estimators import Estimator
from gamfunc.nn import places
from gamfunc.optim.transforms import chain, clip_by_global_norm
from gamfunc.torch_optim import sharded
from gamfunc.torch_optim.base import held, torch_state_dict
from gamfunc.torch_optim.bridge import TorchState, map_torch
from gamfunc.torch_optim.checks import check_model, step_arguments
from gamfunc.torch_optim.copies import copy_into
from gamfunc.torch_optim.groups import Groups
from gamfunc.torch_optim.habits import CaughtHabits, HandSetGrad, check_lrs, filled_before
from gamfunc.torch_optim.last_direction import LastDirection
from gamfunc.torch_optim.losses import PassBuffers
from gamfunc.torch_optim.module_grads import backward_refusal
from gamfunc.torch_optim.options import Options, check_estimator
from gamfunc.torch_optim.parts import base_of, losses_of, steps_of
from gamfunc.torch_optim.saved_state import restore
from gamfunc.training.cuda_graphs import release
from gamfunc.training.state import StepState, as_dict, from_dict

__all__ = ["FlatnessOptimizer"]


def _lr_metric(lr) -> Tensor:
    """A param group's lr as a 0-d float64 tensor; a tensor lr (``capturable=True``) is copied on
    its device rather than read on the host."""
    if isinstance(lr, Tensor):
        return lr.detach().to(torch.float64, copy=True)
    return torch.tensor(float(lr), dtype=torch.float64)


class FlatnessOptimizer(CaughtHabits, torch.optim.Optimizer):
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
            factory built here with its keyword arguments (``torch.optim.SGD, lr=0.1``).
        criterion: ``criterion(outputs, targets) -> scalar`` for ``step((inputs, targets))``;
            ``F.cross_entropy`` by default.
        **options: the facade's options, each documented in
            [`Options`][gamfunc.torch_optim.Options] (``loss``, ``base_optimizer``, ``when``,
            ``every``, ``base``, ``on_nonfinite``, ``compile``, ``compile_options``,
            ``accumulate``, ``precision``, ``max_grad_norm``, ``cuda_graph``), and the keyword
            arguments of an optimiser class or factory given as ``optimizer``;
            for a ``torch.optim`` class, ``params=`` gives the param groups it is built on (as
            ``torch.optim`` takes them: ``[{"params": [...], "weight_decay": 0.0}, ...]``), all the
            trainable parameters in one group otherwise.

    Attributes:
        param_groups: a ``torch.optim`` base optimiser's own groups. For a gamfunc one, one group per
            injected lr (one per [`gamfunc.param_groups`][gamfunc.optim.groups.param_groups] group), holding its parameters and
            its injected hyperparameters (``lr``, ``weight_decay``...), written into the step
            state before every step, so ``torch.optim.lr_scheduler`` drives them (compiled or not).
        metrics: the scalar tensors of the last step (``loss``, ``grad_norm``, ``lr``, ``rho``,
            ``skipped``...).

    ``step`` returns the loss at θ before the update (a 0-d tensor).

    Raises:
        TypeError: a model that is not an ``nn.Module``, or is ``torch.compile(module)``
            (give ``model._orig_mod`` with ``compile=True``), a base optimiser of no known kind, a
            ``torch.optim`` optimiser whose ``step`` needs a closure, an argument of the wrong type,
            ``params=`` with a gamfunc factory (its groups are
            [`gamfunc.param_groups`][gamfunc.optim.groups.param_groups]); and
            ``torch.amp.GradScaler``, on its first ``scaler.step``.
        ValueError: a base optimiser over tensors that are not the model's parameters, an invalid
            option (naming it), or ``cuda_graph=True`` with a model off the GPU or a base optimiser
            built with ``capturable=False``.
        AttributeError: davda54/sam's ``first_step``, ``second_step`` and ``base_optimizer``,
            in one line pointing to the torch.optim guide's "Coming from davda54/sam".

    Warning:
        With a gamfunc base optimiser whose ``lr`` is a gamfunc schedule, the schedule sets the
        learning rate; its group's ``"lr"`` reports the last lr used, and changing it raises
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
        **options: Any,
    ):
        check_model(model, type(self).__name__)
        facade, base_kwargs = Options.split(options)
        opts = Options(criterion, **facade)
        check_estimator(estimator)
        base = base_of(model, estimator, optimizer, base_kwargs, opts)
        self._model = model
        self.metrics: dict[str, Tensor] = {}
        where = places(model)  # a buffer the module replaces later is read at its place
        self._buffer_at = [(k, *where[k]) for k, _ in model.named_buffers()]
        self._views: dict[str, tuple[Tensor, Tensor]] = {}  # buffer name -> (buffer, detached)
        self._state: StepState | None = None
        self._torch, self._bridge, self._ids = base.torch, base.bridge, base.ids
        self._trainable = base.trainable
        # what the base optimiser moves by, left in .grad after each step (last_direction)
        self._last = LastDirection()
        transform = self._last.recording(sharded.placed(base.transform, model))
        if opts.max_grad_norm is not None:
            transform = chain(clip_by_global_norm(opts.max_grad_norm), transform)
        self._pass_buffers = PassBuffers()
        self._any_batch = opts.loss is not None
        losses = losses_of(model, estimator, opts, self._pass_buffers)
        self._module_grads = losses.module_grads
        steps = steps_of(estimator, transform, losses, opts, base)
        self._batch_step, self._closure_step = steps.batch, steps.closure
        self._precision, self._accumulate = opts.precision, opts.accumulate
        self._habits = HandSetGrad()
        self._graphed = opts.cuda_graph
        self._captured: list | None = None  # the torch base's groups the graphs were made with
        self._groups: Groups | None = None
        self._param_groups(transform)
        self._ready = True

    def _param_groups(self, transform) -> None:
        """The facade's param groups: a ``torch.optim`` base optimiser's own (shared, so that a
        scheduler of either moves both), or a gamfunc one's injected hyperparameters."""
        if self._torch is not None:
            super().__init__(list(self._trainable.values()), dict(self._torch.defaults))
            self.param_groups, self.state = self._torch.param_groups, self._torch.state
            return
        self._groups = Groups(transform, self._trainable)
        first, *others = self._groups.param_groups
        super().__init__(first["params"], {k: v for k, v in first.items() if k != "params"})
        for g in others:
            super().add_param_group(g)
        self._groups.remember(self.param_groups)

    # ---- torch.optim.Optimizer interface ----------------------------------------------------------

    # the loss comes back as a tensor (torch.optim types it float | None), and batch= is the facade's
    def step(self, closure=None, *, batch=None) -> Tensor:  # type: ignore[override]
        """One step; returns the loss at θ before the update (a 0-d tensor).

        A closure is evaluated at every point the estimator needs (θ, θ + ε̂, ...), eagerly (never
        compiled nor captured). For an estimator built on gradients alone (SAM, ASAM, GSAM, WSAM,
        LookSAM, F-SAM, accelerated GAM, GAM and GNP with ``hvp=gamfunc.hvps.fd()``) and
        ``precision="fp32"``, it is ``torch.optim``'s closure: it may zero the gradients and call
        ``backward()`` (Lightning's automatic optimisation), and it runs on the module itself,
        the point copied into its parameters, the gradient read from ``.grad`` (or, where it
        called no ``backward()``, taken of the loss it returned; a parameter left without a
        gradient counts as a zero gradient, where ``torch.optim`` would skip it), the parameters
        put back at θ before the base optimiser's update. Autocast inside the closure is the
        caller's. Otherwise (exact or reverse H·v, ``precision="bf16"``/``"fp16"``) the closure
        must return the loss without calling ``backward()``: it runs with the step's tensors
        swapped into the module, differentiated by ``torch.func``.

        Args:
            closure: a callable ``closure() -> loss`` that calls the model, or the batch itself,
                ``step((inputs, targets))``.
            batch: ``(inputs, targets)`` for ``criterion(model(inputs), targets)``, or a batch of
                any form for the optimiser's ``loss(model, batch)``. Given together with
                a closure, the closure is called once first, as ``torch.optim`` does (Lightning's hooks),
                and the batch drives the step.

        After the step each parameter's ``.grad`` holds what the base optimiser moved it by, as
        ``torch.optim``'s step leaves the gradient it read: the estimator's direction at θ (GAM's,
        SAM's...), clipped by ``max_grad_norm=`` where given, in a tensor of the facade's (a copy,
        written again at the next step); after a closure that called ``backward()``, the
        gradient of its last call. The next step does not read it: a clip or scale of it is
        warned about. With ``cuda_graph=True``, a replayed ``step((inputs, targets))`` leaves
        ``.grad`` as it was.

        Returns:
            The loss at θ before the update.

        Raises:
            TypeError: neither a batch nor a closure, or a closure that does not return the loss.
            ValueError: a batch that is not a pair without ``loss=``, a closure with ``accumulate > 1``, a param
                group's lr below 0 or not finite, a closure that calls ``backward()`` where the
                estimator needs exact H·v (naming ``hvp=gamfunc.hvps.fd()``), or ``.grad`` filled
                outside a closure step (gradients accumulated before it).
            RuntimeError: a closure that calls ``backward()`` with ``precision`` other than fp32.

        Warns:
            UserWarning: once per optimiser, a ``.grad`` set or changed by hand since the last step
                (``clip_grad_norm_``, a manual scale), which the step does not read.
        """
        check_lrs(self.param_groups)
        held = list(self._trainable.values())
        on_module = self._module_grads is not None and batch is None and callable(closure)
        if on_module and self._habits.watch.changed(held):
            raise ValueError(filled_before(closure))
        self._habits.check(held)
        try:
            return self._dispatch(closure, batch)
        finally:
            self._habits.watch.record(held)

    def _dispatch(self, closure, batch) -> Tensor:
        closure, batch = step_arguments(closure, batch, any_batch=self._any_batch)
        if batch is not None and isinstance(self._module_grads, sharded.ShardedGradients):
            return self._advance(self._closure_step, self._module_grads.closure(self._model, batch))
        if batch is not None:
            return self._advance(self._batch_step, batch)
        if self._accumulate > 1:
            raise ValueError(
                f"step(closure) with accumulate={self._accumulate}: accumulate= cuts one batch into "
                "micro-batches, which needs the batch: call step((inputs, targets)), not "
                "step(closure)"
            )
        try:
            return self._advance(self._closure_step, closure)
        except RuntimeError as e:
            step = self._closure_step
            refusal = backward_refusal(e, self._precision, step.estimator, step.base)
            if refusal is None:
                raise
            raise refusal from None

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
        """Restore what [`state_dict`][gamfunc.torch_optim.optimizer.FlatnessOptimizer.state_dict] returned; tensors move to the parameters' device.

        With a ``torch.optim`` base optimiser it also takes that optimiser's own ``state_dict()``
        (``torch.optim.SGD(...).state_dict()`` of a loop before the switch): its state (momentum
        buffers, Adam's moments) and hyperparameters load into the base optimiser, and the step's
        own state (its counters, an estimator's state) stays as it is.

        Args:
            state_dict: what ``state_dict()`` returned, or a ``torch.optim`` base optimiser's.

        Raises:
            ValueError: a dict of another form, saved for other parameters, a count of the step's
                state (``step``, ``skipped``) that is no integer tensor, or a ``torch.optim``
                optimiser's with a gamfunc base optimiser.
        """
        if torch_state_dict(state_dict):
            if self._torch is None:
                raise ValueError(
                    "state_dict is a torch.optim optimiser's (integer params), which loads into a "
                    "facade over a torch.optim base optimiser, not a gamfunc one"
                )
            self._torch.load_state_dict(state_dict)
            self.param_groups, self.state = self._torch.param_groups, self._torch.state
            return
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
            self._state = restore(restored, reference)
        else:
            self._state = None
        if self._groups is not None:
            self._groups.remember(self.param_groups)

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
        self._trainable = held(self._torch, dict(self._model.named_parameters()))
        assert self._ids is not None  # a torch.optim base optimiser's
        self._ids.clear()  # the dict the transform reads the names from
        self._ids.update({id(p): k for k, p in self._trainable.items()})
        # the .grad the last step left, now among other parameters: not set by hand
        self._habits.watch.record(list(self._trainable.values()))

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients of the parameters. The step does not read them; it leaves its
        direction there (`step`), in new tensors after a ``zero_grad()`` that set them to None.

        Args:
            set_to_none: as ``torch.optim.Optimizer.zero_grad``.
        """
        if self._torch is not None:
            self._torch.zero_grad(set_to_none=set_to_none)
        else:
            super().zero_grad(set_to_none=set_to_none)
        self._habits.watch.record(list(self._trainable.values()))  # zeros are not set by hand

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
        tensors: list[Tensor] = []
        self._pass_buffers.new_step()  # the last step's buffers are in the module
        if self._graphed and bridge is not None and run is self._batch_step:
            self._recapture_on_change()
        on_module = run is self._closure_step and self._module_grads is not None
        if bridge is None:  # copies where the passes move the module's own parameters
            params = self._params()
            if on_module:
                params = dict(zip(params, tree.copies(list(params.values())), strict=True))
        else:  # copies, which the step reads while the base optimiser moves its own tensors
            params, tensors = bridge.snapshot()
        named_buffers = [(k, b) for k, d, key in self._buffer_at if (b := d.get(key)) is not None]
        buffers = self._detached(named_buffers)
        if on_module:
            assert self._module_grads is not None
            self._module_grads.begin(params, self._trainable, dict(named_buffers))
        self._last.forget()
        try:
            loss = self._run(run, params, tensors, buffers, named_buffers, data)
        finally:
            if on_module:
                assert self._module_grads is not None
                self._module_grads.end()
        # .grad holds the direction the base optimiser moved by; after a closure that called
        # backward(), its last gradient; a replayed graph runs no Python to record one
        if on_module or (self._graphed and run is self._batch_step):
            self._last.forget()
        else:
            self._last.leave(self._trainable)
        return loss

    def _run(self, run, params, tensors, buffers, named_buffers, data) -> Tensor:
        bridge = self._bridge
        if self._state is None:
            self._state = run.init(params, None)
        state = self._state._replace(buffers=buffers)
        if bridge is None:
            assert self._groups is not None  # a gamfunc base optimiser's
            state = state._replace(opt=self._groups.written(state.opt, self.param_groups))
            new_params, new_state, metrics = run(params, state, data)
        else:
            state = state._replace(
                opt=map_torch(state.opt, lambda s: TorchState(s.finite, tensors, s.lrs))
            )
            try:
                new_params, new_state, metrics = run(params, state, data)
            except BaseException:
                bridge.rollback(params, tensors)
                raise
            formed: list[TorchState] = []

            def between_steps(s: TorchState) -> TorchState:  # the tensors live in the optimiser
                formed.append(s)
                return TorchState(s.finite, (), s.lrs)

            opt = map_torch(new_state.opt, between_steps)
            bridge.commit(formed[0].tensors, metrics.get("skipped"))
            new_state = new_state._replace(opt=opt)
            metrics.setdefault("lr", _lr_metric(self.param_groups[0]["lr"]))
        with torch.no_grad():  # where the step moved the parameters themselves, nothing to copy
            moved = [
                (p, new_params[k]) for k, p in self._trainable.items() if new_params[k] is not p
            ]
            copy_into([p for p, _ in moved], [n for _, n in moved])
            copy_into(
                [b for _, b in named_buffers], [new_state.buffers[k] for k, _ in named_buffers]
            )
        self._state = new_state._replace(buffers=())  # the buffers live in the module
        self.metrics = sharded.plain(metrics)
        if self._groups is not None:
            self._groups.read(new_state.opt, self.param_groups)
        return self.metrics["loss"]

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
