"""`setup`: a `Config` made into a `Training`, the model (fresh, or from ``--weights``) on the
process's device, its loss, and ``make_step`` of the estimator and base optimiser, data parallel
over several processes, compiled and replayed as the step mode says."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Protocol

import torch
from torch import Tensor, nn

import gamfunc
from reproduce.build.estimator import (
    build_estimator,
    build_optimizer,
    exact_hvp_backend,
    uses_exact_hvp,
)
from reproduce.build.loss import CORRECT, classification_loss, training_loss
from reproduce.build.mode import StepMode, compile_scope, step_mode
from reproduce.build.model import (
    IMAGENET_CLASSES,
    SetupError,
    channels_last,
    load_weights,
    model_of,
)
from reproduce.build.schedule import lr_schedule, when_policy
from reproduce.config import Config
from reproduce.models import MODELS, VECTOR_MODELS, new_head

__all__ = ["Place", "Training", "setup"]

_BatchNorm = nn.modules.batchnorm._BatchNorm


class Training(NamedTuple):
    """What `setup` builds: the model, its loss, the step and the state before the first step."""

    model: nn.Module
    loss_fn: Callable  # the loss of this process's examples (evaluation, flatness)
    step: gamfunc.Step
    params: dict[str, Tensor]
    state: gamfunc.StepState
    steps_per_epoch: int
    notes: list[str]  # what was chosen for this run that a reader should know (one line each)


def _check_batch(cfg: Config, n_train: int, world: int) -> int:
    if cfg.batch_size % world:
        raise SetupError(
            f"--batch_size={cfg.batch_size} is the global batch and must divide evenly over the "
            f"{world} processes"
        )
    steps = n_train // cfg.batch_size
    if steps < 1:
        raise SetupError(f"batch_size {cfg.batch_size} exceeds the {n_train} training examples")
    return steps


class Place(Protocol):
    """Where this process trains within its job (`reproduce.run.launch.Processes` is one)."""

    device: torch.device
    world: int  # the number of processes of the job


def setup(
    cfg: Config,
    name: str,
    data,
    procs: Place | torch.device,
    weights: dict[str, Tensor] | None = None,
) -> Training:
    """The model of ``cfg`` (fresh, or from ``--weights``), its loss, and ``make_step`` of the estimator
    ``name`` with the base optimiser and schedule of ``cfg``, initialised on ``procs.device``.

    With several processes every rank starts from rank 0's parameters and buffers, and the estimator
    is made data parallel with ``cfg.perturbation`` ([`gamfunc.distributed.data_parallel`][gamfunc.wrappers.distributed.data_parallel]).
    With ``cfg.channels_last`` the model's 4-d parameters and buffers take the ``torch.channels_last``
    layout before they are copied out into ``params`` and ``buffers``; the step keeps that layout.

    Args:
        cfg: the run's configuration.
        name: the estimator (`build_estimator`).
        data: the data set (its classes, image size and training examples size the model and batch).
        procs: the job's processes (a `Place`), or a device for a single process.
        weights: the state dict read from ``cfg.weights`` (`reproduce.run.checkpoint.state_dict`),
            where it names a file.

    Returns:
        The `Training`: model, loss, step, parameters and state before the first step.

    Raises:
        SetupError: the run cannot start as configured (the message says why).
    """
    device, world = _where(procs)
    model = _network(cfg, data, weights)
    steps_per_epoch = _check_batch(cfg, len(data.train), world)
    hvp = exact_hvp_backend(cfg, model)  # before elementary_norms, of the network as built
    lr = lr_schedule(cfg, steps_per_epoch)
    estimator, base = build_estimator(cfg, name, lr, hvp)
    mode = step_mode(device.type, cfg, estimator)
    notes = _prepared(model, cfg, name, hvp, mode, device)
    loss_fn = training_loss(classification_loss(model, cfg.label_smoothing), cfg)
    params, buffers = _starting_point(model, world, device)
    optimizer = build_optimizer(cfg, lr, params)
    notes += mode.notes
    scope = compile_scope(cfg, world) if mode.compile else ""
    step_loss = gamfunc.regional.compile_passes(loss_fn) if scope == "pass" else loss_fn
    if world > 1:
        estimator, step_loss = gamfunc.distributed.data_parallel(
            estimator, step_loss, cfg.perturbation
        )
        base, _ = gamfunc.distributed.data_parallel(base, loss_fn, cfg.perturbation)
    if estimator.every > 1:  # a cycle (LookSAM) brings its own base
        base = None
    when = None if estimator.every > 1 else when_policy(cfg, steps_per_epoch)
    base = base if when is not None else None  # the steps a policy leaves plain: none without
    step = gamfunc.make_step(estimator, optimizer, step_loss, when=when, base=base)
    state = step.init(params, buffers)
    step = _run_as(step, cfg, mode, scope, device, notes)
    return Training(model, loss_fn, step, params, state, steps_per_epoch, notes)


def _where(procs: Place | torch.device) -> tuple[torch.device, int]:
    """This process's device and the number of processes of its job."""
    if isinstance(procs, torch.device | str):  # one process
        return torch.device(procs), 1
    return procs.device, procs.world


def _network(cfg: Config, data, weights: dict[str, Tensor] | None) -> nn.Module:
    """The model of ``cfg`` for ``data``: fresh, or from ``--weights`` (a pretrained one with a new
    head for the data's classes); a `SetupError` where the model cannot take the data's inputs or
    the weights are missing."""
    if cfg.pretrained and not cfg.weights:
        raise SetupError(
            f"--preset={cfg.preset} fine-tunes a pretrained {cfg.model}: pass --weights=FILE, a local "
            f"state dict of its ImageNet weights (torchvision's {cfg.model} layout); it never "
            "trains from scratch in their place and downloads nothing"
        )
    classes = IMAGENET_CLASSES if cfg.pretrained else data.num_classes
    vectors = data.name in ("mnist1d", "digits")
    if cfg.model in MODELS and vectors != (cfg.model in VECTOR_MODELS):
        takes = "vectors" if cfg.model in VECTOR_MODELS else "images (C × H × W)"
        fits = ", ".join(sorted(VECTOR_MODELS if vectors else set(MODELS) - VECTOR_MODELS))
        raise SetupError(
            f"--model={cfg.model} takes {takes}; {data.name} has "
            f"{'vectors of ' + str(data.image_size) if vectors else 'images'}: use one of {fits}"
        )
    model = model_of(cfg, classes, data)
    if cfg.weights:
        if weights is None:
            raise SetupError(f"--weights={cfg.weights}: give setup the state dict read from it")
        load_weights(model, weights, cfg.weights)
    if cfg.pretrained:
        new_head(model, data.num_classes, seed=cfg.seed)
    return model


def _prepared(
    model: nn.Module, cfg: Config, name: str, hvp: str, mode: StepMode, device: torch.device
) -> list[str]:
    """Make ``model`` ready for the step's H·v and mode, on ``device`` (in place); the notes of what
    was chosen."""
    notes = []
    exact = uses_exact_hvp(cfg, name)
    if exact and hvp != "exact":
        notes.append(f"{name}: H·v by reverse-over-reverse AD (--bf16_hvp=reverse)")
    if exact and hvp == "exact" and mode.compile and _has(model, _BatchNorm, nn.LayerNorm):
        gamfunc.nn.elementary_norms(model)
        notes.append(
            f"{name}: BatchNorm and LayerNorm in elementary operations, so that the compiled step "
            "computes each point's gradient once (gamfunc.graph_sharing)"
        )
    gamfunc.nn.autocast_batchnorm(model)  # forward-mode AD through BatchNorm under autocast
    model.to(device)
    if cfg.channels_last:
        channels_last(model)
    return notes


def _starting_point(
    model: nn.Module, world: int, device: torch.device
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Copies of the model's parameters and buffers (rank 0's on every rank of a job), the buffers
    with the count of correct predictions (`CORRECT`)."""
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    buffers = {k: v.detach().clone() for k, v in model.named_buffers()}
    if world > 1:
        params, buffers = gamfunc.distributed.broadcast((params, buffers))
    buffers[CORRECT] = torch.zeros((), dtype=torch.int64, device=device)
    return params, buffers


def _run_as(
    step: gamfunc.Step,
    cfg: Config,
    mode: StepMode,
    scope: str,
    device: torch.device,
    notes: list[str],
) -> gamfunc.Step:
    """``step`` compiled whole where ``scope`` says so and replayed as a CUDA graph where ``mode``
    says so, each choice noted in ``notes``."""
    if scope == "step":
        step = step.compile()
    if scope:
        what = "each gradient and H·v pass" if scope == "pass" else "the whole step"
        notes.append(f"compile: {what} (scope={scope}), on the first step")
    if mode.graph:
        if device.type != "cuda":
            raise SetupError(
                f"--cuda_graph (--mode={cfg.mode}) replays CUDA graphs and needs a GPU; the device "
                f"is {device}"
            )
        step = gamfunc.cuda_graph(step)
        what = "each step" if mode.compile else "the eager step"
        notes.append(f"cuda_graph: {what} replayed as one CUDA graph from the fourth step on")
    return step


def _has(model: nn.Module, *kinds: type) -> bool:
    return any(isinstance(m, kinds) for m in model.modules())
