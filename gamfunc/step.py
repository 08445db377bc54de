"""The training step: an estimator and a base optimiser joined into one pure function.

``step(params, state, batch) -> (new_params, new_state, metrics)`` is the only thing a user wraps in
``torch.compile``. ``state`` is a dict::

    {"step": 0-d int64,            # steps taken (skipped ones not counted): the one step counter,
                                   # read by the estimator's and the optimiser's schedules
     "opt": optimiser state,       # see gamfunc.optim
     "skipped": 0-d int64,         # steps skipped because the loss or direction was not finite
     "buffers": dict (optional),   # BatchNorm running statistics, for a buffered loss_fn
     "cycle": 0-d int64 on the CPU # (every > 1 only) host copy of the step count, picks the branch
     ...}                          # entries of a stateful Objective, e.g. "loss_scale" (fp16)

A ``loss_fn`` that is an :class:`~gamfunc.loss.Objective` may carry step state of its own through the
protocol declared there (``bind``, ``init_state``, ``next_state``, forwarded by every wrapper):
:func:`gamfunc.precision.fp16`'s dynamic loss scale is such state. The step calls that protocol and
nothing else of a wrapper; compilation (:meth:`Step.compile`) calls down to :mod:`gamfunc.compile`
and :mod:`gamfunc.regional`; :func:`gamfunc.gam_step` lives in :mod:`gamfunc.convenience`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from gamfunc import tree
from gamfunc.compile import compile_with, fresh
from gamfunc.estimators import Estimator, gradient
from gamfunc.loss import bind, check_params, init_state, next_state
from gamfunc.optim import Optimizer
from gamfunc.optim.schedules import value
from gamfunc.regional import compile_passes

__all__ = ["NONFINITE", "SCOPES", "STATE_KEYS", "Step", "check_state", "make_step"]

NONFINITE = ("skip", "raise", "ignore")
SCOPES = ("step", "pass")


@runtime_checkable
class Step(Protocol):
    """What :func:`make_step` returns: ``step(params, state, batch) -> (new_params, new_state,
    metrics)``, with ``step.init(params, buffers=None)`` for the first state, ``step.compile(...)``
    for a compiled copy and its configuration as attributes.

    A step is a plain function carrying these attributes, not an instance of a class:
    ``torch.compile`` of a function traces its own code (:func:`gamfunc.compile.fresh`), so every
    step keeps a compile cache of its own. ``isinstance(step, gamfunc.Step)`` holds.
    """

    estimator: Estimator
    optimizer: Optimizer
    loss_fn: Callable
    every: int
    base: Estimator
    on_nonfinite: str

    def __call__(self, params, state, batch) -> tuple[dict, dict, dict]: ...

    def init(self, params, buffers=None) -> dict[str, Any]: ...

    def compile(
        self, *, fullgraph: bool = True, mode: str | None = None, scope: str = "step", **kwargs
    ) -> Step: ...


class _StepImpl:
    """The configuration and methods behind a :class:`Step` function."""

    def __init__(self, estimator, optimizer, loss_fn, every, base, on_nonfinite, branches=None):
        self.estimator, self.optimizer, self.loss_fn = estimator, optimizer, loss_fn
        self.every, self.base, self.on_nonfinite = every, base, on_nonfinite
        self.full, self.plain = branches or (
            _branch(estimator, optimizer, loss_fn, on_nonfinite),
            _branch(base, optimizer, loss_fn, on_nonfinite),
        )

    def init(self, params, buffers=None) -> dict[str, Any]:
        """The state before the first step; ``buffers`` for a loss_fn of the buffered form."""
        check_params(params)
        device = next(iter(params.values())).device if params else torch.device("cpu")
        state = {
            "step": torch.zeros((), dtype=torch.int64, device=device),
            "opt": self.optimizer.init(params),
            "skipped": torch.zeros((), dtype=torch.int64, device=device),
        }
        if self.every > 1:
            state["cycle"] = torch.zeros((), dtype=torch.int64)  # host copy of the step count
        if buffers is not None:
            state["buffers"] = dict(buffers)
        entries = init_state(self.loss_fn, params)
        if entries and self.on_nonfinite != "skip":
            raise ValueError(
                f"on_nonfinite must be 'skip' for a loss_fn with step state {sorted(entries)} "
                f"(a dynamic loss scale changes when a step is skipped); got {self.on_nonfinite!r}"
            )
        state.update(entries)
        return state

    def __call__(self, params, state, batch):
        check_state(state, params)
        if self.every == 1:
            return self.full(params, state, batch)
        # The choice reads a host-side copy of the step count, so it costs no device
        # synchronisation, and the compiled branches see only device tensors (CUDA graphs work).
        state = dict(state)
        cycle = state.pop("cycle")
        branch = self.full if int(cycle) % self.every == 0 else self.plain
        new_params, new_state, metrics = branch(params, state, batch)
        return new_params, {**new_state, "cycle": cycle + 1}, metrics

    def compile(
        self, *, fullgraph: bool = True, mode: str | None = None, scope: str = "step", **kwargs
    ) -> Step:
        """This step under ``torch.compile``: no recompilation as lr, ρ or the step count change.

        ``scope="step"`` (default) compiles each branch whole: two graphs at most, however often
        ``every`` switches between them. ``scope="pass"`` compiles each differentiation pass instead
        and runs the step around the passes eagerly (:func:`gamfunc.regional.compile_passes`): one
        graph for every estimator built on gradients (two for exact GAM), so a cold compile takes
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
                self.estimator, self.optimizer, loss_fn, self.every, self.base, self.on_nonfinite
            )
        compile_fn = compile_with(fullgraph, mode, kwargs)
        compiled = tuple(compile_fn(fn) for fn in (self.full, self.plain))
        args = (self.estimator, self.optimizer, self.loss_fn, self.every, self.base)
        return _new_step(*args, self.on_nonfinite, branches=compiled)


def _step(estimator, optimizer, loss_fn, on_nonfinite, params, state, batch):
    with torch.no_grad():  # gradients come from torch.func transforms only
        return _step_impl(estimator, optimizer, loss_fn, on_nonfinite, params, state, batch)


def _step_impl(estimator, optimizer, loss_fn, on_nonfinite, params, state, batch):
    buffers = state.get("buffers")
    loss = bind(loss_fn, state)
    # One step counter, the steps taken: the estimator's schedules (ρ) and the optimiser's (lr, bias
    # corrections) read the same t, so a skipped step moves neither.
    step = state["step"]
    est = estimator.run(params, batch, loss, step=step)
    opt_state = state["opt"]
    if "step" in opt_state:
        opt_state = {**opt_state, "step": step}
    new_params, new_opt = optimizer.update(est.direction, opt_state, params)
    metrics = dict(est.info)
    metrics["lr"] = new_opt["lr"]
    if "rho" in estimator.hparams:
        rho = value(estimator.hparams["rho"], step)
        metrics["rho"] = torch.as_tensor(rho, dtype=torch.float64, device=step.device)
    new_state = {"step": step + 1, "opt": new_opt, "skipped": state["skipped"]}
    if buffers is not None:
        new_state["buffers"] = est.clean.aux
    if on_nonfinite == "ignore":
        return new_params, new_state, metrics
    finite = (
        torch.isfinite(est.info["loss"])
        & torch.isfinite(_norm(est))
        & _all_finite(new_params, new_opt).to(step.device)
    )
    if on_nonfinite == "raise":
        if not bool(finite):
            raise FloatingPointError(
                f"non-finite loss, direction or update at step {int(step)}: "
                f"loss={float(est.info['loss'])}"
            )
        return new_params, new_state, metrics
    skipped = (~finite).to(torch.int64)
    if torch.compiler.is_compiling() or tree.vmapped([finite]):  # no Python branch on a value
        new_params = tree.where(finite, new_params, params)
        new_state["opt"] = _select(finite, new_opt, state["opt"])
        new_state["step"] = step + finite.to(step.dtype)
        if buffers is not None:
            new_state["buffers"] = _select(finite, new_state["buffers"], buffers)
    elif not bool(finite):  # eager: one host sync is cheaper than a select per tensor
        new_params, new_state["opt"], new_state["step"] = params, state["opt"], step
        if buffers is not None:
            new_state["buffers"] = buffers
    new_state["skipped"] = state["skipped"] + skipped
    metrics["skipped"] = skipped
    entries, extra = next_state(loss_fn, state, finite)
    new_state.update(entries)
    metrics.update(extra)
    return new_params, new_state, metrics


STATE_KEYS = ("step", "opt", "skipped")


def check_state(state, params) -> None:
    """Raise a one-line error, naming the key, unless ``state`` is a step state made for ``params``.

    Checked: the entries every state has; the names of every per-parameter dict of the optimiser
    state (momentum, moments: a dict of tensors sharing a name with ``params``) against those of
    ``params``, and the shapes of the first such dict (a state made for other parameters has them
    all wrong), so that a state made for other shapes is not broadcast against them. Python only,
    on names and shapes, a few microseconds a step; a compiled step traces it once.
    """
    if not isinstance(state, dict):
        raise TypeError(
            f"state must be the dict that step.init(params) returns; got {type(state).__name__}"
        )
    if not isinstance(params, dict) or not params:
        check_params(params)
    for key in STATE_KEYS:
        if key not in state:
            raise ValueError(f"state has no entry {key!r}; make it with step.init(params)")
    _check_like(state["opt"], params, [], "state['opt']")


def _check_like(node, params, checked: list, where: str) -> None:
    """``checked`` is non-empty once one per-parameter dict has had its shapes compared."""
    if not isinstance(node, dict) or not node:
        return
    if node.keys() == params.keys():  # a per-parameter dict
        if not checked:
            checked.append(where)
            for k, v in params.items():
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
        _check_like(v, params, checked, f"{where}[{k!r}]")


def _all_finite(*trees) -> Tensor:
    """Whether every floating-point entry of ``trees`` (the new params and optimiser state) is
    finite: the largest magnitude of each tensor (one ``_foreach`` kernel; a nan stays nan), then
    one ``isfinite`` over those."""
    leaves = [
        t
        for t in torch.utils._pytree.tree_leaves(trees)
        if isinstance(t, Tensor) and t.is_floating_point() and t.numel() > 0
    ]
    if not leaves:
        return torch.ones((), dtype=torch.bool)
    device = leaves[0].device
    if tree.vmapped(leaves):  # foreach kernels have no batching rule
        maxima = [torch.linalg.vector_norm(t, float("inf")) for t in leaves]
    else:
        maxima = [m.to(device) for m in torch._foreach_norm(leaves, float("inf"))]
    return torch.isfinite(torch.stack(_common(maxima))).all()


def _common(parts: list[Tensor]) -> list[Tensor]:
    dtype = parts[0].dtype
    for p in parts[1:]:
        dtype = torch.promote_types(dtype, p.dtype)
    return [p.to(dtype) for p in parts]


def _norm(est) -> Tensor:
    """‖direction‖, for the finiteness check: eager, the clean pass's norm where the direction is its
    gradient (the plain gradient step) and the pass carries it, else computed. (Dynamo cannot trace
    ``is`` between dicts on every torch; compiled, the graph's common-subexpression pass can merge
    the two norms instead.)"""
    clean = est.clean
    if (
        not torch.compiler.is_compiling()
        and est.direction is clean.grad
        and isinstance(clean.grad_norm, Tensor)
    ):
        return clean.grad_norm
    return tree.norm(est.direction)


def _select(cond: Tensor, new, old):
    """``torch.where(cond, new, old)`` over matching nested dicts of tensors."""
    if isinstance(new, dict):
        return {k: _select(cond, v, old[k]) for k, v in new.items()}
    return torch.where(cond.to(new.device), new, old)


def make_step(
    estimator: Estimator,
    optimizer: Optimizer,
    loss_fn: Callable,
    *,
    every: int = 1,
    base: Estimator | None = None,
    on_nonfinite: str = "skip",
) -> Step:
    """Join an estimator and a base optimiser into ``step(params, state, batch)``.

    ``step`` computes ``direction, info = estimator(params, batch, loss_fn)`` and moves with
    ``optimizer.update(direction, ...)``. ``metrics`` holds the estimator's info (``loss``,
    ``grad_norm``, ``f_norm``...), ``lr``, ``rho`` where the estimator has one, and ``skipped``.

    Args:
        estimator: e.g. ``gamfunc.gam(rho=0.05, alpha=0.1)``.
        optimizer: e.g. ``gamfunc.sgd(lr=0.1, momentum=0.9)``.
        loss_fn: ``loss_fn(params, batch)`` returning the loss; or, for models with BatchNorm,
            ``loss_fn(params, batch, buffers) -> (loss, new_buffers)`` (see :func:`gamfunc.nn.functional`)
            with the buffers given to ``step.init(params, buffers)``. Running statistics are then
            updated once per step, from the pass at θ; passes at perturbed points use batch statistics
            and their statistics are dropped.
        every: use ``estimator`` on every ``every``-th step (the first included) and ``base`` on the
            others (paper Appendix C.3). Compile such a step with ``step.compile()``.
        base: the estimator of the other steps, ``gradient()`` by default.
        on_nonfinite: "skip" (default) leaves params, optimiser state and buffers unchanged when the
            loss or the direction is not finite and counts it in ``metrics["skipped"]`` and
            ``state["skipped"]``, with no Python branch; "raise" raises FloatingPointError (eager
            only); "ignore" applies the step regardless.

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
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"optimizer must be a gamfunc optimizer; got {type(optimizer).__name__}")
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"every must be an integer >= 1; got {every!r}")
    if on_nonfinite not in NONFINITE:
        raise ValueError(f"on_nonfinite must be one of {NONFINITE}; got {on_nonfinite!r}")
    if not callable(loss_fn):
        raise TypeError(
            f"loss_fn must be a callable loss_fn(params, batch); got {type(loss_fn).__name__}"
        )
    return _new_step(estimator, optimizer, loss_fn, every, base or gradient(), on_nonfinite)


def _branch(estimator, optimizer, loss_fn, on_nonfinite):
    """``_step`` for one estimator, as a function with its own code object (a partial would not do:
    torch.compile traces a partial from a wrapper shared by every callable object)."""

    def branch(params, state, batch):
        return _step(estimator, optimizer, loss_fn, on_nonfinite, params, state, batch)

    return fresh(branch)


def _new_step(*args, **kwargs) -> Step:
    """A Step as a plain function with its own code object (:func:`gamfunc.compile.fresh`), carrying
    ``init``, ``compile`` and the configuration as attributes.

    ``torch.compile`` of a callable object starts tracing in a wrapper shared by every such object;
    a function is traced from its own code, so each step keeps a cache of its own.
    """
    impl = _StepImpl(*args, **kwargs)

    def step(params, state, batch):
        return impl(params, state, batch)

    step = fresh(step)
    for name in ("init", "compile", "estimator", "optimizer", "loss_fn", "every", "base"):
        setattr(step, name, getattr(impl, name))
    step.on_nonfinite, step.impl = impl.on_nonfinite, impl
    step.__doc__ = Step.__doc__
    return step
