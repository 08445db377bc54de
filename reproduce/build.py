"""What a run trains with: the model, its loss, the estimator, the base optimiser and the step.

`setup` turns a `Config` into a `Training`: the model (fresh, or
from ``--weights``) on the process's device, the cross-entropy loss through
``torch.func.functional_call``, the estimator named by ``--estimator`` made data parallel
([`gamfunc.distributed.data_parallel`][gamfunc.wrappers.distributed.data_parallel]) when the job has several processes, the base optimiser
with its schedule, gradient clipping and weight-decay mask, and ``make_step`` of them, compiled
with ``--compile``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

import gamfunc
from gamfunc import schedules
from reproduce import methods
from reproduce.config import Config
from reproduce.models import MODELS, RELU_MODELS, VECTOR_MODELS, build_model, new_head

__all__ = [
    "CORRECT",
    "TOP5",
    "Place",
    "SetupError",
    "StepMode",
    "Training",
    "build_estimator",
    "build_optimizer",
    "channels_last",
    "classification_loss",
    "compile_scope",
    "exact_hvp_backend",
    "fd_gam_warning",
    "hyperparameters",
    "load_weights",
    "lr_schedule",
    "setup",
    "step_mode",
    "training_loss",
    "uses_exact_hvp",
    "with_step_mode",
]

IMAGENET_CLASSES = 1000  # the classifier of the pretrained weights that --pretrained starts from

# The extra entry of the loss aux that counts correct predictions at θ (the running train accuracy).
CORRECT = "__correct__"
# The extra entry of the aux in eval mode that counts labels among the five largest logits.
TOP5 = "__correct5__"


class SetupError(Exception):
    """The run cannot start as configured (model, weights, processes); the message says why."""


def classification_loss(model: nn.Module, label_smoothing: float = 0.0):
    """``loss_fn(params, batch, buffers, *, train=True) -> (loss, new_buffers)``: cross-entropy of
    ``model`` through ``torch.func.functional_call`` (the buffered form of [`gamfunc.nn.functionalize`][gamfunc.nn.functionalize]).

    The buffers are cloned inside (BatchNorm's running statistics update the clones), and the loss is
    computed on float32 logits. ``new_buffers`` carries one extra entry, ``CORRECT``: the number of
    correct predictions at θ, so that the running training accuracy costs nothing (``make_step``
    keeps the aux of the pass at θ only); in eval mode also ``TOP5``, the number of labels among the
    five largest logits. ``label_smoothing`` is ``F.cross_entropy``'s, in training only (evaluation
    reports the plain cross-entropy). Mixed precision wraps it as any loss (`training_loss`).
    """

    def loss_fn(params, batch, buffers, *, train: bool = True):
        inputs, targets = batch
        state = {k: v.clone() for k, v in buffers.items() if k not in (CORRECT, TOP5)}
        with gamfunc.nn.mode(model, train):
            logits = functional_call(model, (params, state), (inputs,))
        logits = logits.float()
        aux = {**state, CORRECT: (logits.argmax(-1) == targets).sum()}
        if not train:
            top = logits.topk(min(5, logits.shape[-1]), dim=-1).indices
            aux[TOP5] = (top == targets[:, None]).any(-1).sum()
        smoothing = label_smoothing if train else 0.0
        return F.cross_entropy(logits, targets, label_smoothing=smoothing), aux

    return loss_fn


def training_loss(loss_fn, cfg: Config):
    """``loss_fn`` in the run's precision: [`gamfunc.precision.bf16`][gamfunc.wrappers.precision.bf16] with ``--bf16`` (autocast in
    every pass, exact H·v's backward pass included), else as it is."""
    return gamfunc.precision.mixed(loss_fn, "bf16" if cfg.bf16 else "fp32")


def lr_schedule(cfg: Config, steps_per_epoch: int):
    """The learning rate at step t: linear warm-up over ``warmup_epochs``, then cosine decay to 0
    over the rest of the run (or constant).

    ``lr_schedule_unit="step"``: lr(t) = cosine(lr, T, W)(t), T and W counted in steps.
    ``"epoch"``: lr(t) = cosine(lr, E, W_e)(⌊t / steps_per_epoch⌋), E and W_e counted in epochs, so
    that the rate changes once per epoch: with no warm-up, lr·(1 + cos(π·e/E))/2 through epoch e, the
    authors' ``CosineAnnealingLR(T_max=epochs)`` (gam/optimizer_helper.py l.18 of
    github.com/xxgege/GAM) stepped after every epoch (main_cifar.py l.291).
    """
    if cfg.schedule == "constant" and cfg.warmup_epochs == 0:
        return cfg.lr
    if cfg.lr_schedule_unit == "epoch":
        # a --total_steps run ends in the epoch that holds its last step
        total = -(-cfg.total_steps // steps_per_epoch) if cfg.total_steps else cfg.epochs
        per_epoch = _lr_by_count(cfg, total, round(cfg.warmup_epochs))
        return lambda t: per_epoch(torch.div(t, steps_per_epoch, rounding_mode="floor"))
    total = cfg.total_steps or cfg.epochs * steps_per_epoch
    return _lr_by_count(cfg, total, round(cfg.warmup_epochs * steps_per_epoch))


def when_policy(cfg: Config, steps_per_epoch: int):
    """The ``when=`` policy of ``--when`` (and of its shorthand ``--every``), None for every step.

    ``every:k`` is `gamfunc.when.every`; ``late:F`` with F < 1 a fraction of the run's steps (T:
    ``--total_steps``, else ``--epochs`` × steps per epoch; ``late:0.75`` is the last quarter),
    ``late:N`` from step N on (`gamfunc.when.late`); ``adaptive`` is AE-SAM's trigger with the
    paper's defaults over T steps (`gamfunc.when.adaptive`).

    Args:
        cfg: the run's configuration.
        steps_per_epoch: the steps of one epoch.

    Returns:
        A policy of `gamfunc.when`, or None.
    """
    total = cfg.total_steps or cfg.epochs * steps_per_epoch
    kind, _, arg = cfg.when.partition(":")
    if kind == "every":
        return gamfunc.when.every(int(arg))
    if kind == "late":
        start = float(arg) if "." in arg else int(arg)
        return gamfunc.when.late(start, total_steps=total)
    if kind == "adaptive":
        return gamfunc.when.adaptive(total)
    return gamfunc.when.every(cfg.every) if cfg.every > 1 else None


def _lr_by_count(cfg: Config, total: int, warm: int):
    """The schedule of ``cfg`` over ``total`` counts (steps or epochs), ``warm`` of them warm-up."""
    if cfg.schedule == "constant":
        return lambda t: torch.clamp((t.to(torch.float64) + 1) / max(warm, 1), max=1.0) * cfg.lr
    return schedules.cosine(cfg.lr, total, warm)


def exact_hvp_backend(cfg: Config, model: nn.Module) -> str:
    """The H·v backend of the estimators the paper forms with exact Hessian-vector products.

    ``"exact"`` (forward-over-reverse); on a network with BatchNorm or convolutions under bfloat16
    autocast, ``cfg.bf16_hvp``, which may choose ``"reverse"`` (reverse-over-reverse, the same H·v by
    another route). Both run in bf16 ([`gamfunc.precision`][gamfunc.wrappers.precision], [`gamfunc.nn.autocast_batchnorm`][gamfunc.nn.autocast_batchnorm]).
    """
    risky = (nn.modules.conv._ConvNd, _BatchNorm)
    if cfg.bf16 and any(isinstance(m, risky) for m in model.modules()):
        return cfg.bf16_hvp
    return "exact"


def uses_exact_hvp(cfg: Config, name: str) -> bool:
    """Whether the method ``name`` forms its H·v with the run's exact backend (`exact_hvp_backend`),
    asked of its estimator: built with exact H·v, it differentiates by forward-mode AD
    ([`gamfunc.hvps.forward_mode`][gamfunc.hvps.forward_mode]). GAM and the methods built on it do,
    GNP with ``gnp_hvp="exact"`` too; ``gam_fd`` and ``gam_reverse`` choose their own backend."""
    estimator, _ = build_estimator(cfg, name, cfg.lr)
    return gamfunc.hvps.forward_mode(estimator.hparams.get("hvp"))


_BatchNorm = nn.modules.batchnorm._BatchNorm

# The smallest finite-difference radius measured to train GAM on a ReLU network: reproduce/RESULTS.md,
# "Why finite-difference GAM collapses on the ReLU MLP" (MNIST-1D MLP, ρ = 0.5, α = 1, 100 epochs,
# 3 seeds): r = 0.1 and 0.01 trained (test 70.1% and 70.0%, exact H·v 72.7%); r = 1e-3 (the default)
# and 1e-4 ended at chance (train 11.1% and 12.3%). No smaller radius trained a ReLU net there.
FD_RELU_RADIUS = 1e-2


def fd_gam_warning(cfg: Config, name: str) -> str | None:
    """One line when the estimator ``name`` is finite-difference GAM on a ReLU network (``RELU_MODELS``)
    with ρ·α > 0 and ``fd_radius`` below `FD_RELU_RADIUS`, the settings at which it has not
    been measured to train; else None.

    At r ≤ 1e-3 a pre-activation crossing zero within r adds its gradient jump divided by r to
    H·v, 8–30 times the exact product's norm, and GAM adds it with weight α·ρ; on the ReLU MLP it
    turned units off until the network predicted one class (reproduce/RESULTS.md).
    """
    if name != "gam_fd" or cfg.model not in RELU_MODELS:
        return None
    if cfg.rho * cfg.alpha == 0 or cfg.fd_radius >= FD_RELU_RADIUS:
        return None
    return (
        f"gam_fd on {cfg.model}, a ReLU network, with --fd_radius={cfg.fd_radius:g} "
        f"(ρ·α = {cfg.rho * cfg.alpha:g}): finite-difference GAM with r < {FD_RELU_RADIUS:g} ended at "
        "chance on a ReLU MLP at ρ·α = 0.5 (reproduce/RESULTS.md); use --estimator=gam (exact H·v) "
        f"or --fd_radius={FD_RELU_RADIUS:g} or more"
    )


def _has(model: nn.Module, *kinds: type) -> bool:
    return any(isinstance(m, kinds) for m in model.modules())


# Fields of methods.Hyper that no flag sets (those beyond methods.Flags): build_estimator chooses
# them for the run.
CHOSEN = frozenset(
    {f.name for f in dataclasses.fields(methods.Hyper)}
    - {f.name for f in dataclasses.fields(methods.Flags)}
)


def hyperparameters(cfg: Config) -> dict:
    """The fields of `reproduce.methods.Hyper` that ``cfg`` sets: those of
    `reproduce.methods.Flags`, on which `Config` is built.

    Args:
        cfg: the run's configuration.

    Returns:
        ``{field: value}``, as ``cfg`` holds them (ρ unscheduled).
    """
    names = {f.name for f in dataclasses.fields(methods.Flags)}
    return {name: getattr(cfg, name) for name in sorted(names)}


def build_estimator(
    cfg: Config, name: str, lr, hvp: str = "exact"
) -> tuple[gamfunc.Estimator, gamfunc.Estimator]:
    """The estimator called ``name`` (`reproduce.methods.METHODS`) with the hyperparameters of
    ``cfg``, and the one of the steps it skips (``every``).

    Every hyperparameter comes from the `Config` field of its name (`hyperparameters`); ρ takes
    its schedule (``rho_schedule="proportional"``: ρ_t ∝ lr_t down to ``rho_min``, GSAM's
    schedule), and so does SAM's ρ (of sam, gsam, wsam, looksam, friendly_sam, asam and the
    oracles: `reproduce.methods.SAM_LIKE`) where ``sam_rho`` is 0.

    Args:
        cfg: the run's configuration.
        name: the method.
        lr: the learning rate or its schedule (``rho_schedule="proportional"`` scales ρ with it).
        hvp: the backend of the exact H·v (`exact_hvp_backend`).

    Returns:
        ``(estimator, base)``.

    Raises:
        ValueError: ``name`` is no method, or an estimator refuses a value.
    """
    rho = cfg.rho
    if cfg.rho_schedule == "proportional" and callable(lr):
        rho = schedules.proportional(cfg.rho, lr, cfg.lr, floor=cfg.rho_min)
    hparams = hyperparameters(cfg)
    hparams.update(
        rho=rho,  # also SAM's ρ where sam_rho is 0 (methods.Hyper.sam_radius)
        hvp=hvp,
        gnp_hvp=hvp if cfg.gnp_hvp == "exact" else cfg.gnp_hvp,
        theorem_norms=True,  # Theorem 4.3's two squared norms, logged under theory/
    )
    return methods.estimator(name, **hparams), methods.base(name, **hparams)


def build_optimizer(cfg: Config, lr, params: dict[str, Tensor] | None = None) -> gamfunc.Transform:
    """SGD with momentum (coupled weight decay) or AdamW (decoupled), with ``lr`` a float or schedule;
    with ``no_decay_1d``, no weight decay on 1-d tensors (biases, normalisation weights); with
    ``clip_norm > 0``, the direction clipped to that global norm first."""
    mask = gamfunc.decay_mask(params) if cfg.no_decay_1d and params is not None else None
    if cfg.base == "adamw":
        opt = gamfunc.adamw(
            lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay, weight_decay_mask=mask
        )
    else:
        opt = gamfunc.sgd(
            lr,
            momentum=cfg.momentum,
            nesterov=cfg.nesterov,
            weight_decay=cfg.weight_decay,
            weight_decay_mask=mask,
        )
    if cfg.clip_norm > 0:
        opt = gamfunc.chain(gamfunc.clip_by_global_norm(cfg.clip_norm), opt)
    return opt


def load_weights(model: nn.Module, weights: dict[str, Tensor], source: str) -> None:
    """Load ``weights``, a state dict read from the file ``source`` (``--weights``), into ``model``.

    Args:
        model: the network built for the run.
        weights: parameter and buffer names to tensors (`reproduce.run.checkpoint.state_dict`
            reads them from a file).
        source: the file they were read from, named in the errors.

    Raises:
        SetupError: a tensor differs in shape from the model's, or a name is missing or unexpected.
    """
    obj = {k: v for k, v in weights.items() if k not in (CORRECT, TOP5)}
    own = model.state_dict()
    shapes = [k for k, v in obj.items() if k in own and own[k].shape != v.shape]
    if shapes:
        k = shapes[0]
        raise SetupError(
            f"--weights {source!r} does not fit the model {type(model).__name__}: {len(shapes)} "
            f"tensor(s) differ in shape, e.g. {k} {tuple(obj[k].shape)} vs {tuple(own[k].shape)}"
        )
    missing, unexpected = model.load_state_dict(obj, strict=False)
    if missing or unexpected:
        raise SetupError(
            f"--weights {source!r} does not fit the model: missing {missing}, unexpected {unexpected}"
        )


def channels_last(model: nn.Module) -> None:
    """Give every 4-d parameter and buffer of ``model`` (convolution kernels) the ``torch.channels_last``
    layout, in place; tensors of other ranks keep theirs. The values are unchanged."""
    for t in (*model.parameters(), *model.buffers()):
        if t.dim() == 4:
            t.data = t.data.contiguous(memory_format=torch.channels_last)


def compile_scope(cfg: Config, world: int) -> str:
    """``step`` (the whole step, one graph) or ``pass`` (each gradient or H·v pass, the step around
    them eager: [`gamfunc.regional.compile_passes`][gamfunc.wrappers.regional.compile_passes]).

    ``auto`` takes ``pass`` for ImageNet models, whose whole-step compile takes minutes where a pass
    compiles in about one (benchmarks/RESULTS.md), and under several processes, so that the
    all-reduces of [`gamfunc.distributed`][gamfunc.wrappers.distributed] run between compiled passes, not inside a graph."""
    if cfg.compile_scope != "auto":
        return cfg.compile_scope
    return "pass" if world > 1 or cfg.dataset == "imagenet" else "step"


class StepMode(NamedTuple):
    """How a run's step runs (`step_mode`)."""

    compile: bool  # compiled (by pass or whole, as compile_scope says)
    graph: bool  # replayed as one CUDA graph (gamfunc.cuda_graph)
    notes: tuple[str, ...] = ()  # what the run should say about the choice, one line each


def step_mode(
    device_type: str, cfg: Config, estimator: gamfunc.Estimator | None = None
) -> StepMode:
    """How the step runs: ``--mode``, else (``auto``) what ``--compile`` and ``--cuda_graph`` ask,
    else the path whose first step comes within seconds: on a GPU the eager step replayed as one CUDA
    graph (eager under ``--when=adaptive``, whose choice a graph cannot replay), on the CPU the eager
    step. Nothing compiles unless asked.

    An eager step replayed as a graph runs close to the compiled step for the estimators made of
    gradients (benchmarks/RESULTS.md, "The first step"), and its first step needs no compile. An
    estimator whose H·v is forward-mode AD ([`gamfunc.hvps.forward_mode`][gamfunc.hvps.forward_mode]:
    exact GAM) runs several times slower eagerly than compiled, graph or not; it is replayed as a graph
    too (faster than eager, and ready as soon), with a note that ``--mode=compile-graph`` compiles it.

    Args:
        device_type: the device's type (``"cuda"``, ``"cpu"``).
        cfg: the run's configuration (``mode``, ``compile``, ``cuda_graph``).
        estimator: the run's estimator, for the notes (None: no notes about it).

    Returns:
        The `StepMode`.
    """
    if cfg.mode != "auto":
        compiled, graphed = cfg.mode.startswith("compile"), cfg.mode.endswith("graph")
    elif cfg.compile or cfg.cuda_graph:
        compiled, graphed = cfg.compile, cfg.cuda_graph
    else:  # a graph replays one branch: the adaptive policy's host-side choice needs eager steps
        compiled = False
        graphed = device_type == "cuda" and not cfg.when.startswith("adaptive")
    notes = []
    hvp = estimator.hparams.get("hvp") if estimator is not None else None
    if device_type == "cuda" and not compiled and gamfunc.hvps.forward_mode(hvp):
        notes.append(
            f"{estimator.name}: exact H·v (forward-mode AD) runs eagerly, several times slower a "
            "step than compiled: --mode=compile-graph compiles it (once per model and device with "
            "--compile_cache)"
        )
    return StepMode(compiled, graphed, tuple(notes))


def with_step_mode(cfg: Config, device_type: str) -> Config:
    """``cfg`` with its ``mode`` chosen for ``device_type`` (`step_mode`) and ``compile`` and
    ``cuda_graph`` saying the same, so that a run records what ran."""
    m = step_mode(device_type, cfg)
    name = ("compile" if m.compile else "eager") + ("-graph" if m.graph else "")
    name = {"eager-graph": "graph"}.get(name, name)
    return dataclasses.replace(cfg, mode=name, compile=m.compile, cuda_graph=m.graph)


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


def model_of(cfg: Config, classes: int, data) -> nn.Module:
    """``cfg.model`` with ``classes`` outputs for ``data``'s inputs (size, channels), initialised
    from ``cfg.seed``; a model that cannot take them is a `SetupError` in one line."""
    try:
        return build_model(
            cfg.model, classes, data.image_size, channels=data.channels, seed=cfg.seed
        )
    except ValueError as e:
        raise SetupError(str(e)) from None


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
    if isinstance(procs, torch.device | str):  # one process
        device, world = torch.device(procs), 1
    else:
        device, world = procs.device, procs.world
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
    notes = []
    mode = step_mode(device.type, cfg)
    hvp = exact_hvp_backend(cfg, model)
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
    loss_fn = training_loss(classification_loss(model, cfg.label_smoothing), cfg)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    buffers = {k: v.detach().clone() for k, v in model.named_buffers()}
    if world > 1:
        params, buffers = gamfunc.distributed.broadcast((params, buffers))
    buffers[CORRECT] = torch.zeros((), dtype=torch.int64, device=device)
    steps_per_epoch = _check_batch(cfg, len(data.train), world)
    lr = lr_schedule(cfg, steps_per_epoch)
    estimator, base = build_estimator(cfg, name, lr, hvp)
    optimizer = build_optimizer(cfg, lr, params)
    notes += step_mode(device.type, cfg, estimator).notes
    scope = compile_scope(cfg, world) if mode.compile else ""
    step_loss = loss_fn
    if scope == "pass":
        step_loss = gamfunc.regional.compile_passes(loss_fn)
    if world > 1:
        estimator, step_loss = gamfunc.distributed.data_parallel(
            estimator, step_loss, cfg.perturbation
        )
        base, _ = gamfunc.distributed.data_parallel(base, loss_fn, cfg.perturbation)
    if estimator.every > 1:  # a cycle (LookSAM) brings its own base
        base = None
    when = None if estimator.every > 1 else when_policy(cfg, steps_per_epoch)
    step = gamfunc.make_step(estimator, optimizer, step_loss, when=when, base=base)
    state = step.init(params, buffers)
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
    return Training(model, loss_fn, step, params, state, steps_per_epoch, notes)
