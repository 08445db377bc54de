"""What a [`FlatnessOptimizer`][gamfunc.torch_optim.FlatnessOptimizer] is built of, each part
made by one function from the facade's arguments: its base optimiser (`base_of`), the loss of
its passes (`losses_of`) and its two steps (`steps_of`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from gamfunc.estimators import Estimator
from gamfunc.nn import module_loss
from gamfunc.optim import Transform
from gamfunc.torch_optim import sharded
from gamfunc.torch_optim.base import built, held
from gamfunc.torch_optim.bridge import TorchBridge
from gamfunc.torch_optim.checks import check_capturable
from gamfunc.torch_optim.losses import ClosureHolder, PassBuffers, as_is, closure_loss
from gamfunc.torch_optim.module_grads import ModuleGradients, gradients_only
from gamfunc.torch_optim.options import Options
from gamfunc.training.cuda_graphs import cuda_graph as graphed
from gamfunc.training.step import Step, make_step
from gamfunc.wrappers.accumulate import accumulate as accumulated
from gamfunc.wrappers.precision import mixed

__all__ = ["Base", "Losses", "Steps", "base_of", "losses_of", "steps_of"]


class Base(NamedTuple):
    """The facade's base optimiser (`base_of`)."""

    transform: Transform  # what make_step moves by: a gamfunc optimiser, or the bridge's transform
    trainable: dict[str, Tensor]  # the parameters it moves, by name
    requires_grad: dict[str, Tensor]  # every parameter of the model with requires_grad=True
    torch: torch.optim.Optimizer | None = (
        None  # a torch.optim base optimiser, None for a gamfunc one
    )
    bridge: TorchBridge | None = None  # the torch.optim optimiser as make_step's transform
    ids: dict[int, str] | None = None  # id(parameter) -> name, which the bridge reads


def base_of(
    model: nn.Module, estimator: Estimator, optimizer, base_kwargs: dict, options: Options
) -> Base:
    """The base optimiser as given (built here from a class or factory with ``base_kwargs``) over
    ``model``'s trainable parameters; a ``torch.optim`` one joined to the step by a
    `TorchBridge`.

    Raises:
        TypeError: the base optimiser given twice, or of no known kind.
        ValueError: a model with no trainable parameter, or ``compile="step"`` with a
            ``torch.optim`` base optimiser.
    """
    if optimizer is not None and options.base_optimizer is not None:
        raise TypeError(
            "pass the base optimiser once: as the second argument or as base_optimizer="
        )
    named: dict[str, Tensor] = dict(model.named_parameters())
    trainable: dict[str, Tensor] = {k: p for k, p in named.items() if p.requires_grad}
    if not trainable:
        raise ValueError("model has no parameter with requires_grad=True to optimise")
    given = optimizer if optimizer is not None else options.base_optimizer
    opt = built(given, trainable, base_kwargs)
    if not isinstance(opt, torch.optim.Optimizer):
        return Base(opt, trainable, trainable)
    if options.compile == "step":
        raise ValueError(
            "compile='step' compiles the whole step, which needs a gamfunc base "
            "optimiser; with a torch.optim one write compile=True (its passes)"
        )
    mine = held(opt, named)
    ids = {id(p): k for k, p in mine.items()}
    # the parameters' copies rewritten at each step, unless an estimator keeps a state
    base = options.base
    keeps = any(e is not None and e.stateful for e in (estimator, base, estimator.base))
    reports = any(e is not None and e.decoupled for e in (estimator, base))
    bridge = TorchBridge(opt, ids, keeps_inputs=keeps, reports_lr=reports)
    return Base(bridge.transform, mine, trainable, opt, bridge, ids)


class Losses(NamedTuple):
    """The losses of the facade's two steps (`losses_of`)."""

    batch: Any  # loss_fn of step(batch), or sharded.ShardedGradients
    closure: Callable  # loss_fn of step(closure)
    module_grads: ModuleGradients | None  # step(closure) on the module itself, where it runs so


def losses_of(
    model: nn.Module, estimator: Estimator, options: Options, pass_buffers: PassBuffers
) -> Losses:
    """The loss of ``step(batch)`` (the module's, in the run's precision, accumulated) and of
    ``step(closure)``.

    ``step(closure)`` runs on the module itself, the ``torch.optim`` protocol, for an estimator
    built on gradients alone (fp32: autocast inside the closure is the caller's); otherwise with
    the module's tensors swapped, differentiated by ``torch.func`` (no ``backward()`` inside).
    """
    o = options
    batch_loss: Any = sharded.passes(
        model, estimator, o.base, o.criterion, o.loss, o.compile, o.precision, o.accumulate,
        o.cuda_graph,
    )  # fmt: skip
    if batch_loss is None:  # else a model under fully_shard or DDP: sharded.passes
        on_batch = module_loss(model, o.criterion, loss=o.loss, copy_buffers=pass_buffers)
        batch_loss = mixed(functools.partial(as_is, on_batch, model), o.precision)
    if o.accumulate > 1:
        batch_loss = accumulated(batch_loss, o.accumulate)
    if isinstance(batch_loss, sharded.ShardedGradients):
        return Losses(batch_loss, batch_loss, batch_loss)
    if o.precision == "fp32" and gradients_only(estimator, o.base):
        grads = ModuleGradients()
        return Losses(batch_loss, grads, grads)
    on_closure = functools.partial(closure_loss, ClosureHolder(model), pass_buffers)
    return Losses(batch_loss, mixed(on_closure, o.precision), None)


class Steps(NamedTuple):
    """The facade's two steps (`steps_of`)."""

    batch: Step  # of step(batch): compiled and CUDA-graphed as asked
    closure: Step  # of step(closure): eager


def steps_of(
    estimator: Estimator, transform: Transform, losses: Losses, options: Options, base: Base
) -> Steps:
    """``make_step`` of the estimator and ``transform`` over each loss; the batch's compiled with
    ``compile=`` and replayed as a CUDA graph with ``cuda_graph=True``.

    Raises:
        ValueError: ``cuda_graph=True`` where the step cannot be captured (`check_capturable`).
    """
    step_options = options.step_options()
    batch_step = make_step(estimator, transform, losses.batch, **step_options)
    closure_step = make_step(estimator, transform, losses.closure, **step_options)
    if options.compile:
        scope = "step" if options.compile == "step" else "pass"
        batch_step = batch_step.compile(scope=scope, **(options.compile_options or {}))
    if options.cuda_graph:
        check_capturable(base.torch, base.requires_grad)
        batch_step = graphed(batch_step)
    return Steps(batch_step, closure_step)
