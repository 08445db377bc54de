"""The training step: an estimator and a base optimiser joined into one pure function.

``step(params, state, batch) -> (new_params, new_state, metrics)`` is the only thing a user wraps in
``torch.compile``. ``state`` is a [`StepState`][gamfunc.training.step.StepState], a NamedTuple and so a pytree of tensors for
``torch.compile``, ``torch.func.vmap`` and ``torch.utils._pytree``:

```python
StepState(
    step,          # 0-d int64: the steps taken (skipped ones not counted), the one step counter
    opt,           # the optimiser's state: its own statistics (and injected hyperparameters)
    skipped,       # 0-d int64: steps skipped because the loss, direction or update was not finite
    buffers=(),    # BatchNorm running statistics (a dict), for a buffered loss_fn
    cycle=(),      # with a when= policy only: 0-d int64 on the CPU, the calls so far, skipped included
    loss=(),       # the loss wrapper's own state, e.g. precision.LossScale for fp16
    est=(),        # the estimator's own state (estimator.init(params)), e.g. LookSAM's g_v
    policy=(),     # the when= policy's own state, e.g. AE-SAM's running statistics (gamfunc.when)
)
```

The step owns the counter: it gives it to the estimator (ρ schedules) and to the optimiser's update
as ``step=`` where the update takes it ([`gamfunc.optim.call_update`][gamfunc.optim.call_update]), so any
[`Transform`][gamfunc.optim.base.Transform] is an optimiser here, a user's own three-argument update
included. ``metrics["lr"]`` is the lr an [`gamfunc.inject_hyperparams`][gamfunc.inject_hyperparams] transform in the
optimiser keeps (every gamfunc optimiser has one); an optimiser without one logs no lr.

``()`` marks an absent field: an empty pytree node, so that a state stays a pytree of tensors under
``vmap``. `as_dict` and `from_dict` turn a state into plain dicts and back, for
``torch.save`` and ``torch.load(weights_only=True)``; the state, its checks and that form live in
`gamfunc.state`.

A ``loss_fn`` that is an `Objective` may carry step state of its own through the
protocol declared there (``bind``, ``init_state``, ``next_state``, forwarded by every wrapper):
[`gamfunc.precision.fp16`][gamfunc.wrappers.precision.fp16]'s dynamic loss scale is such state, in ``state.loss``. The step calls that protocol and
nothing else of a wrapper; compilation (`Step.compile`) calls down to `gamfunc.compile`
and [`gamfunc.regional`][gamfunc.wrappers.regional]; [`gamfunc.gam_step`][gamfunc.gam_step] lives in `gamfunc.convenience`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, cast, runtime_checkable

import torch
from torch.utils import _pytree as pytree

from gamfunc.checks import check_int
from gamfunc.compiling.compile import compile_with, fresh
from gamfunc.estimators import Estimator, gradient
from gamfunc.loss import check_params, init_state
from gamfunc.optim import (
    Transform,
    learning_rates,
)
from gamfunc.training import when as policies
from gamfunc.training.body import branch, schedules_in_range, with_schema
from gamfunc.training.guard import Guard
from gamfunc.training.state import StepState, check_counts, check_cycle, check_est, check_state
from gamfunc.wrappers.regional import compile_passes

__all__ = [
    "NONFINITE",
    "SCOPES",
    "Step",
    "make_step",
    "schedules_in_range",
]

NONFINITE = ("skip", "raise", "ignore")
SCOPES = ("step", "pass")


@runtime_checkable
class Step(Protocol):
    """What [`make_step`][gamfunc.training.step.make_step] returns: ``step(params, state, batch) -> (new_params, new_state,
    metrics)``, with ``step.init(params, buffers=None)`` for the first state, ``step.compile(...)``
    for a compiled copy and its configuration as attributes.

    A step is a plain function carrying these attributes, not an instance of a class:
    ``torch.compile`` of a function traces its own code (`gamfunc.compile.fresh`), so every
    step keeps a compile cache of its own. ``isinstance(step, gamfunc.Step)`` holds.
    ``branches`` are its two functions (the estimator's, and the base's between, for a ``when``
    policy) and ``map_branches(wrap)`` makes a step of the same configuration whose branches (and
    the adaptive policy's probe) are wrapped, as ``compile`` and
    [`gamfunc.cuda_graph`][gamfunc.training.cuda_graphs.cuda_graph] do; ``probe`` is that function of the
    adaptive policy (``(params, state, batch) -> (clean, policy_state, flat)``), None for the others.
    ``when`` is the policy (None: the estimator on every step) and ``every`` its period for
    ``every(k)`` (1 otherwise).
    """

    estimator: Estimator
    optimizer: Transform
    loss_fn: Callable
    every: int
    when: policies.Policy | None
    base: Estimator
    on_nonfinite: str
    probe: Callable | None

    def __call__(self, params, state, batch) -> tuple[dict, StepState, dict]: ...

    def init(self, params, buffers=None) -> StepState: ...

    def compile(
        self, *, fullgraph: bool = True, mode: str | None = None, scope: str = "step", **kwargs
    ) -> Step: ...

    @property
    def branches(self) -> tuple[Callable, Callable]: ...

    def map_branches(self, wrap: Callable[[Callable], Callable]) -> Step: ...


class _StepImpl:
    """The configuration and methods behind a [`Step`][gamfunc.training.step.Step] function."""

    def __init__(
        self, estimator, optimizer, loss_fn, when, base, on_nonfinite, branches=None, probe=None
    ):
        self.estimator, self.optimizer, self.loss_fn = estimator, optimizer, loss_fn
        self.when, self.base, self.on_nonfinite = when, base, on_nonfinite
        self.every = when.k if isinstance(when, policies.Every) else 1
        switched = when is not None
        guard = Guard()  # one per step function: both branches share its count
        self.full, self.plain = branches or (
            branch(estimator, optimizer, loss_fn, on_nonfinite, guard, switched or None),
            branch(base, optimizer, loss_fn, on_nonfinite, guard, False if switched else None),
        )
        self.probe = probe
        if probe is None and switched and when.on_device:
            self.probe = policies.probe(loss_fn, when)
        # with a policy: the metrics' keys and dtypes, in the order first seen, so that once the
        # full branch has run every step returns its keys whichever branch ran; the steps before
        # (late's, every's resumed mid-cycle, adaptive's plain ones) return the base's only
        self.schema: dict[str, tuple[torch.dtype, torch.device]] = {}

    def init(self, params, buffers=None) -> StepState:
        """The state before the first step; ``buffers`` for a loss_fn of the buffered form."""
        check_params(params)
        if buffers is not None and not isinstance(buffers, dict):
            raise TypeError(
                f"buffers must be a dict name -> tensor (or None); got {type(buffers).__name__}"
            )
        device = next(iter(params.values())).device
        loss_state = init_state(self.loss_fn, params)
        if pytree.tree_leaves(loss_state) and self.on_nonfinite != "skip":
            raise ValueError(
                f"on_nonfinite must be 'skip' for a loss_fn with step state "
                f"({type(loss_state).__name__}; a dynamic loss scale changes when a step is "
                f"skipped); got {self.on_nonfinite!r}"
            )
        opt = self.optimizer.init(params)
        decoupled = [e.name for e in (self.estimator, self.base) if e.decoupled]
        if decoupled and learning_rates(opt, list(params)) is None:
            raise ValueError(
                f"decouple: {decoupled[0]!r} moves each parameter by its learning rate after the "
                f"optimiser's update, and this optimiser keeps none; a gamfunc optimiser keeps its lr"
            )
        return StepState(
            step=torch.zeros((), dtype=torch.int64, device=device),
            opt=opt,
            skipped=torch.zeros((), dtype=torch.int64, device=device),
            buffers=dict(buffers) if buffers is not None else (),
            cycle=torch.zeros((), dtype=torch.int64) if self.when is not None else (),
            loss=loss_state,
            est=self.estimator.init(params),
            policy=self.when.init(device) if self.when is not None else (),
        )

    def __call__(self, params, state, batch):
        check_state(state, params)
        check_counts(state)
        check_cycle(state.cycle, self.when.describe() if self.when is not None else None)
        check_est(state.est, self.estimator)
        if self.when is None:
            return self.full(params, state, batch)
        cycle, policy = state.cycle, state.policy
        inner = state._replace(cycle=(), policy=())
        if self.probe is None:
            # The choice reads a host-side count of the calls, so it costs no device
            # synchronisation, and the compiled branches see only device tensors (CUDA graphs).
            branch = self.full if self.when.flat(int(cycle)) else self.plain
            new_params, new, metrics = branch(params, inner, batch)
        else:
            # The pass at θ first, then one boolean read on the host; the branch reuses the pass.
            clean, chosen, flat = self.probe(params, state._replace(cycle=()), batch)
            branch = self.full if bool(flat) else self.plain
            new_params, new, metrics = branch(params, inner, batch, clean)
            if "skipped" in metrics:  # a skipped step leaves the statistics as they were
                kept = metrics["skipped"].to(torch.bool)
                chosen = pytree.tree_map(lambda n, o: torch.where(kept, o, n), chosen, policy)
            policy = chosen
        new_state = StepState(
            new.step, new.opt, new.skipped, new.buffers, cycle + 1, new.loss, new.est, policy
        )
        self.schema, metrics = with_schema(self.schema, metrics)
        return new_params, new_state, metrics

    def compile(
        self, *, fullgraph: bool = True, mode: str | None = None, scope: str = "step", **kwargs
    ) -> Step:
        """This step under ``torch.compile``: no recompilation as lr, ρ or the step count change.

        ``scope="step"`` (default) compiles each branch whole: two graphs at most (three with
        [`gamfunc.when.adaptive`][gamfunc.training.when.adaptive]'s probe), however often the ``when``
        policy switches between them. ``scope="pass"`` compiles each differentiation pass instead
        and runs the step around the passes eagerly ([`gamfunc.regional.compile_passes`][gamfunc.wrappers.regional.compile_passes]): one
        graph for every estimator built on gradients or on ∇‖∇L‖ (two for SAM + exact GAM), so a cold compile takes
        about one gradient pass's, at some cost per step.

        ``mode`` ("reduce-overhead" for CUDA graphs, "max-autotune", ...) and ``kwargs``
        (``backend``, ``options``, ``dynamic``) are ``torch.compile``'s.

        Warning:
            On torch < 2.14, inductor's loop reordering fails with ``AssertionError`` in
            ``Scheduler.reorder_loops_by_dep_pair`` on graphs that put ``_foreach`` kernels beside
            per-tensor reductions of other shapes (the inner product of accelerated GAM;
            pytorch/pytorch#176591, fixed by #176849). There this method turns that pass off through
            ``options={"loop_ordering_after_fusion": False}``, which applies to these graphs only.
            ``torch.compile(step)`` called directly gets no such option.
        """
        if scope not in SCOPES:
            raise ValueError(f"scope must be one of {SCOPES}; got {scope!r}")
        if scope == "step" and self.on_nonfinite == "raise":
            raise ValueError(
                "on_nonfinite='raise' reads the loss on the host at every step, which a compiled "
                "graph cannot: compile a step made with on_nonfinite='skip' (the default; "
                "metrics['skipped'] tells when one was skipped), or use scope='pass'"
            )
        if scope == "pass":
            loss_fn = compile_passes(self.loss_fn, fullgraph=fullgraph, mode=mode, **kwargs)
            return _new_step(
                self.estimator, self.optimizer, loss_fn, self.when, self.base, self.on_nonfinite
            )
        return self.map_branches(compile_with(fullgraph, mode, kwargs))

    @property
    def branches(self) -> tuple[Callable, Callable]:
        """The step's two functions ``(params, state, batch, clean=None) -> (params, state,
        metrics)``: the estimator's, and the base's that a ``when`` policy runs between (without
        one, only the first runs); ``clean`` is the pass at θ that the adaptive policy's probe
        took."""
        return self.full, self.plain

    def map_branches(self, wrap: Callable[[Callable], Callable]) -> Step:
        """A step of this configuration whose branches are ``wrap(branch)``: how
        ``compile(scope="step")`` and [`gamfunc.cuda_graph`][gamfunc.training.cuda_graphs.cuda_graph]
        transform a step. ``init`` and the choice between the branches are this step's.

        Args:
            wrap: a function of a branch returning a function of the same signature.

        Returns:
            The new [`Step`][gamfunc.training.step.Step].
        """
        branches = (wrap(self.full), wrap(self.plain))
        probe = wrap(self.probe) if self.probe is not None else None
        args = (self.estimator, self.optimizer, self.loss_fn, self.when, self.base)
        return _new_step(*args, self.on_nonfinite, branches=branches, probe=probe)


def make_step(
    estimator: Estimator,
    optimizer: Transform,
    loss_fn: Callable,
    *,
    when: policies.Policy | None = None,
    every: int = 1,
    base: Estimator | None = None,
    on_nonfinite: str = "skip",
) -> Step:
    """Join an estimator and a base optimiser into ``step(params, state, batch)``.

    ``step`` computes ``direction, info = estimator(params, batch, loss_fn)``, then
    ``updates, opt_state = optimizer.update(direction, opt_state, params)`` and moves to
    ``apply_updates(params, updates)``. ``metrics`` holds the estimator's info (``loss``,
    ``grad_norm``, ``f_norm``...), ``lr`` where the optimiser injects one
    ([`gamfunc.inject_hyperparams`][gamfunc.inject_hyperparams]; every gamfunc optimiser does, a bare chain or a user's own
    transform need not), ``rho`` where the estimator has one, and ``skipped``. An estimator with a
    decoupled part (``Estimate.decoupled``, WSAM's ``decouple=True``) moves each parameter k further
    by −lr_k·decoupled_k after the update, lr_k its learning rate in the optimiser's state.

    A step whose optimiser reads a schedule, or whose estimator holds a schedule without
    ``bounds`` ([`gamfunc.checks.GuardedSchedule`][gamfunc.ranges.GuardedSchedule]), reports
    ``metrics["out_of_range"]``: 1 where such a value was out of its range or not finite at this
    step, which is then skipped as a non-finite one is (`schedules_in_range`, on the device). A
    step with a ``when`` policy (or an estimator that brings its own cycle, LookSAM's) reports
    ``metrics["full_step"]``: 1 on the estimator's steps, 0 on the base's, so that
    ``sum(full_step * skipped)`` counts the estimator's skipped steps (all of them skipped: the
    steps between trained on a stored part that never was).

    Args:
        estimator: e.g. ``gamfunc.gam(rho=0.05, alpha=0.1)``.
        optimizer: any [`Transform`][gamfunc.optim.base.Transform]: e.g. ``gamfunc.sgd(lr=0.1,
            momentum=0.9)``, a ``gamfunc.chain(...)``, or a user's own ``Transform(init,
            update)``; its update gets ``step=`` (the step count) where it takes it.
        loss_fn: ``loss_fn(params, batch)`` returning the loss; or, for models with BatchNorm,
            ``loss_fn(params, batch, buffers) -> (loss, new_buffers)`` (see [`gamfunc.nn.functionalize`][gamfunc.nn.functionalize])
            with the buffers given to ``step.init(params, buffers)``. Running statistics are then
            updated once per step, from the pass at θ; passes at perturbed points use batch statistics
            and their statistics are dropped.
        when: which steps run ``estimator`` (the others run ``base``): a policy of
            [`gamfunc.when`][gamfunc.training.when], [`every(k)`][gamfunc.training.when.every] (paper Appendix
            C.3), [`late(start)`][gamfunc.training.when.late] or [`adaptive(T)`][gamfunc.training.when.adaptive];
            None (default): every step. Compile such a step with ``step.compile()``: one graph
            per branch (and one for the adaptive policy's probe), none again as it switches. An
            estimator that is itself a cycle ([`looksam`][gamfunc.estimators.looksam.looksam])
            brings its own ``every(k)`` and ``base``.
        every: the shorthand of ``when=gamfunc.when.every(every)``: ``estimator`` on every
            ``every``-th step (the first included), ``base`` on the others. Give ``every`` or
            ``when``, not both.
        base: the estimator of the steps that are not flat, ``gradient()`` by default; a stateful
            one must share the estimator's state (its ``init_fn``). Without a policy (``when`` or
            ``every`` > 1) no step is plain, and a base given is refused. Beside an estimator of
            ``perturbation="local"`` ([`gamfunc.distributed.local`][gamfunc.wrappers.distributed.local],
            whose loss is each rank's own) the default is the estimator's own ``base``,
            ``local(gradient())`` with its ``group`` and ``bucket_cap_mb``, so that the steps
            between average their gradients over the ranks too, and a base given with a ``when``
            policy must be ``local`` as well.
        on_nonfinite: "skip" (default) leaves params, optimiser state and buffers unchanged when the
            loss or the direction is not finite and counts it in ``metrics["skipped"]`` and
            ``state.skipped``: an eager step reads that one boolean on the host and keeps the old
            tensors, a compiled one (or one captured in a CUDA graph, or one rank of several on a
            GPU) selects them on the device and reads nothing; "raise" raises
            FloatingPointError (eager only); "ignore" applies the step regardless.

    Returns:
        A [`Step`][gamfunc.training.step.Step]: ``step(params, state, batch) -> (new_params, new_state, metrics)``, with
            ``step.init(params, buffers=None)`` giving the first [`StepState`][gamfunc.training.state.StepState].

    Raises:
        TypeError: ``estimator`` or ``base`` is not an estimator, ``optimizer`` not a Transform,
            or ``loss_fn`` not callable.
        ValueError: ``every`` or ``on_nonfinite`` is invalid, ``every`` and ``when`` are both
            given, ``when``, ``every`` or ``base`` is given with an estimator that brings its own, ``base`` is given without a policy, cycles itself or has a state of its own;
            beside an estimator of ``perturbation="local"``, ``when`` is
            [`adaptive`][gamfunc.training.when.adaptive] (each rank's probe would choose from its
            own gradient: use ``perturbation="global"``), or ``base`` is given with a policy and
            is not ``local``; at
            a step, a state whose counts are negative or whose ``est`` is another estimator's; at
            ``step.init``, an estimator with a decoupled part beside an optimiser that keeps no lr.

    Example:
        >>> import torch, gamfunc
        >>> loss_fn = lambda p, b: ((b[0] @ p["w"] - b[1]) ** 2).mean()
        >>> step = gamfunc.make_step(gamfunc.gam(0.05, 0.1), gamfunc.sgd(lr=0.1), loss_fn)
        >>> params = {"w": torch.zeros(3)}
        >>> state = step.init(params)
        >>> batch = (torch.randn(8, 3), torch.randn(8))
        >>> params, state, metrics = step(params, state, batch)
    """
    if not isinstance(estimator, Estimator):
        raise TypeError(f"estimator must be a gamfunc estimator; got {type(estimator).__name__}")
    if not isinstance(optimizer, Transform):
        raise TypeError(f"optimizer must be a gamfunc optimizer; got {type(optimizer).__name__}")
    check_int("every", every)
    if when is not None and not isinstance(when, policies.Policy):
        raise TypeError(
            f"when must be a policy of gamfunc.when (every(k), late(start), adaptive(T)) or None; "
            f"got {type(when).__name__}"
        )
    if when is not None and every != 1:
        raise ValueError(
            f"every: every={every} is the shorthand of when=gamfunc.when.every({every}); give one "
            f"of them, not both"
        )
    if base is not None and not isinstance(base, Estimator):
        raise TypeError(
            f"base must be a gamfunc estimator (e.g. gamfunc.gradient()) or None; got "
            f"{type(base).__name__} {base!r}: the base optimiser is the second argument, optimizer"
        )
    if base is not None and base.every > 1:
        raise ValueError(
            f"base {base.name!r} cycles itself (every={base.every}); the base of the steps "
            f"between must take one step each (gamfunc.gradient(), sam, ...)"
        )
    if estimator.every > 1:
        if every != 1 or base is not None or when is not None:
            raise ValueError(
                f"every and base (or when): estimator {estimator.name!r} brings its own "
                f"(every={estimator.every}); leave them out"
            )
        every, base = estimator.every, estimator.base
    if when is None and every > 1:
        when = policies.every(every)
    if isinstance(when, policies.Every) and when.k == 1:
        when = None
    if when is None and base is not None and base is not estimator.base:
        raise ValueError(
            f"base: {base.name!r} would never run: base takes the steps that a when= policy (or "
            f"every=k > 1) leaves plain, and without one every step is {estimator.name!r}'s; "
            f"give when=, or leave base out"
        )
    if base is not None and base.stateful and base.init_fn is not estimator.init_fn:
        raise ValueError(
            f"base {base.name!r} has a state of its own, which the step cannot keep beside the "
            f"estimator's; a stateful base must share the estimator's init_fn"
        )
    if on_nonfinite not in NONFINITE:
        raise ValueError(f"on_nonfinite must be one of {NONFINITE}; got {on_nonfinite!r}")
    if not callable(loss_fn):
        raise TypeError(
            f"loss_fn must be a callable loss_fn(params, batch); got {type(loss_fn).__name__}"
        )
    if _is_local(estimator):
        base = _local_base(estimator, when, base)
    return _new_step(estimator, optimizer, loss_fn, when, base or gradient(), on_nonfinite)


def _is_local(estimator: Estimator) -> bool:
    """Whether ``estimator`` averages its direction over ranks itself
    ([`gamfunc.distributed.local`][gamfunc.wrappers.distributed.local]): its loss is this rank's."""
    return estimator.hparams.get("perturbation") == "local"


def _local_base(estimator: Estimator, when, base: Estimator | None) -> Estimator | None:
    """The base of a step whose estimator is ``local``: ``base``, or the one ``local`` gave it
    (``estimator.base``, ``local(gradient())`` with its group and buckets); a base that is not
    ``local`` and an adaptive policy refused, both of which would let the ranks part (their
    parameters, or their collectives)."""
    name = estimator.name
    if when is not None and when.on_device:
        raise ValueError(
            f"when: the adaptive policy chooses from the gradient at θ, and under {name!r} "
            f"(perturbation='local') each rank's gradient is its own: the ranks would keep "
            f"statistics of their own and take different branches, and their all-reduces would "
            f"part; use perturbation='global' (gamfunc.distributed.data_parallel(estimator, "
            f"loss_fn, 'global')), under which every rank sees the mean gradient"
        )
    base = base or estimator.base
    if when is not None and (base is None or not _is_local(base)):
        given = f"{base.name!r}" if base is not None else "the gradient of this rank"
        raise ValueError(
            f"base: {given} beside {name!r} (perturbation='local') would step each rank on "
            f"its own gradient between the flat steps, and the ranks' parameters would part; "
            f"wrap it with gamfunc.distributed.local (the group and bucket size of the estimator), "
            f"or leave base out for the estimator's own, local(gradient())"
        )
    return base


def _new_step(*args, **kwargs) -> Step:
    """A Step as a plain function with its own code object (`gamfunc.compile.fresh`), carrying
    ``init``, ``compile`` and the configuration as attributes.

    ``torch.compile`` of a callable object starts tracing in a wrapper shared by every such object;
    a function is traced from its own code, so each step keeps a cache of its own.
    """
    impl = _StepImpl(*args, **kwargs)

    def step(params, state, batch):
        return impl(params, state, batch)

    step = fresh(step)
    for name in (
        "init",
        "compile",
        "map_branches",
        "estimator",
        "optimizer",
        "loss_fn",
        "every",
        "when",
        "base",
        "on_nonfinite",
        "branches",
        "probe",
    ):
        setattr(step, name, getattr(impl, name))
    step.__doc__ = Step.__doc__
    return cast(Step, step)
