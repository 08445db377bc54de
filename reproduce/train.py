"""Train any setting of the GAM paper with any estimator; TensorBoard-logged, resumable, comparable.

The main job (no arguments, no download, about one minute on 2 CPU cores)::

    python reproduce/train.py

trains the MNIST-1D MLP (Greydanus 2020; 4,000 training and 1,000 test vectors generated offline) with
SGD and with SGD + GAM (ρ = 0.5, α = 1, chosen on a validation split), one after the other, and prints
train and test accuracy, the generalisation gap, the top Hessian eigenvalue λ_max, the Hessian trace
and R1 at the end. It should print (torch 2.14, CPU)::

    estimator                  train acc  test acc     gap     λ_max     trace        R1    img/s    time
    sgd                           100.00     66.00   34.00      3.54      93.0    4.4224    68590      7s
    gam ρ=0.5,α=1                  90.30     71.70   18.60      0.88      45.9    0.2956    11604     35s

(the last two columns, speed and training time, vary with the machine).

A paper setting, an estimator, overrides (``--key=value``; ``--help`` lists every field)::

    python reproduce/train.py --preset=hp1.cifar100.resnet18 --data=~/data/cifar100 --estimator=sam+gam
    python reproduce/train.py --preset=hp2.imagenet.resnet50 --data=/datasets/imagenet --compile --bf16
    python reproduce/train.py --preset=hp1.cifar10.resnet18 --data=~/data/cifar10 --compile --channels-last
    python reproduce/train.py --preset=noise.cifar10.resnet32.p40 --data=~/data/cifar10 --val-fraction=0.1
    python reproduce/train.py --preset=time.cifar10.resnet18.gam10pct --data=~/data/cifar10
    python reproduce/train.py --preset=hp2.imagenet.resnet50 --synthetic --max-steps=20   # smoke test

Output goes to ``<logdir>/<name>/<estimator>/``: TensorBoard events, ``config.json`` (the resolved
configuration), ``checkpoint.pt`` (every epoch, every ``checkpoint_every`` steps, and on SIGINT/SIGTERM),
``best.pt`` (best validation accuracy, with ``--val-fraction``) and ``summary.json``; a comparison of
several estimators also writes ``<logdir>/<name>/comparison.json``. ``--resume`` continues a run
exactly where its checkpoint left it (bit-exact on CPU).

Exit status: 0 when done, 2 for bad arguments, missing data or an unusable checkpoint (one line on
stderr, no traceback), 128 + signal number after SIGINT/SIGTERM (a final checkpoint is written first).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import signal
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

if __package__ in (None, ""):  # run as a script: make `reproduce` and `gamfunc` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

import gamfunc
from gamfunc.optim import schedules
from reproduce import checkpoint as ckpt
from reproduce import data as data_mod
from reproduce.config import (
    PRESETS,
    Config,
    as_dict,
    estimators_of,
    field_help,
    resolve,
    run_name,
)
from reproduce.models import build_model, count_parameters

__all__ = [
    "CORRECT",
    "Interrupted",
    "SetupError",
    "Training",
    "build_estimator",
    "build_optimizer",
    "classification_loss",
    "evaluate",
    "main",
    "run",
    "setup",
]

# The extra entry of the loss aux that counts correct predictions at θ (the running train accuracy).
CORRECT = "__correct__"


class SetupError(Exception):
    """The run cannot start as configured (model, weights, processes); the message says why."""


class Interrupted(Exception):
    """SIGINT or SIGTERM arrived; a checkpoint has been written."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by signal {signal.Signals(signum).name}")
        self.signum = signum


class StopFlag:
    """Records SIGINT/SIGTERM instead of raising, so that the loop stops at a step boundary and saves."""

    def __init__(self):
        self.signum: int | None = None

    def __call__(self, signum, frame) -> None:
        if self.signum is None:
            print(
                f"\n{signal.Signals(signum).name}: finishing the step, writing a checkpoint",
                file=sys.stderr,
            )
        self.signum = signum

    def check(self) -> None:
        if self.signum is not None:
            raise Interrupted(self.signum)

    @contextlib.contextmanager
    def installed(self):
        signals = (signal.SIGINT, signal.SIGTERM)
        try:
            old = {s: signal.signal(s, self) for s in signals}
        except ValueError:  # not the main thread: leave signals alone
            yield self
            return
        try:
            yield self
        finally:
            for s, h in old.items():
                signal.signal(s, h)


# ---------------------------------------------------------------- model, loss, estimator, optimiser


def classification_loss(model: nn.Module, bf16: bool = False, device_type: str = "cpu"):
    """``loss_fn(params, batch, buffers, *, train=True) -> (loss, new_buffers)``: cross-entropy of
    ``model`` through ``torch.func.functional_call`` (the buffered form of :func:`gamfunc.nn.functional`).

    The buffers are cloned inside (BatchNorm's running statistics update the clones), the logits are
    computed under bfloat16 autocast when ``bf16`` and the loss in float32. ``new_buffers`` carries one
    extra entry, ``CORRECT``: the number of correct predictions at θ, so that the running training
    accuracy costs nothing (``make_step`` keeps the aux of the pass at θ only).
    """

    def loss_fn(params, batch, buffers, *, train: bool = True):
        inputs, targets = batch
        state = {k: v.clone() for k, v in buffers.items() if k != CORRECT}
        with (
            gamfunc.nn.mode(model, train),
            torch.autocast(device_type, torch.bfloat16, enabled=bf16),
        ):
            logits = functional_call(model, (params, state), (inputs,))
        logits = logits.float()
        correct = (logits.argmax(-1) == targets).sum()
        return F.cross_entropy(logits, targets), {**state, CORRECT: correct}

    return loss_fn


def lr_schedule(cfg: Config, steps_per_epoch: int):
    """The learning rate: cosine decay to 0 over the run after ``warmup_epochs``, or constant."""
    if cfg.schedule == "constant" and cfg.warmup_epochs == 0:
        return cfg.lr
    total = cfg.epochs * steps_per_epoch
    warm = round(cfg.warmup_epochs * steps_per_epoch)
    if cfg.schedule == "constant":
        return lambda t: torch.clamp((t.to(torch.float64) + 1) / max(warm, 1), max=1.0) * cfg.lr
    return schedules.cosine(cfg.lr, total, warm)


def build_estimator(cfg: Config, name: str, lr) -> tuple[gamfunc.Estimator, gamfunc.Estimator]:
    """``(estimator, base)``: the estimator called ``name`` and the one of the steps it skips (``every``)."""
    rho = cfg.rho
    if cfg.rho_schedule == "proportional" and callable(lr):
        rho = schedules.proportional(cfg.rho, lr, cfg.lr)
    sam_rho = cfg.sam_rho or rho
    plain = gamfunc.gradient()
    table: dict[str, Callable[[], gamfunc.Estimator]] = {
        "sgd": lambda: plain,
        "sam": lambda: gamfunc.sam(rho),
        "gnp": lambda: gamfunc.gnp(cfg.alpha, hvp=cfg.gnp_hvp, fd_radius=cfg.gnp_radius),
        "gam": lambda: gamfunc.gam(rho, cfg.alpha, hvp="exact"),
        "gam_fd": lambda: gamfunc.gam(rho, cfg.alpha, hvp="fd", fd_radius=cfg.fd_radius),
        "gam_reverse": lambda: gamfunc.gam(rho, cfg.alpha, hvp="reverse"),
        "gam_accelerated": lambda: gamfunc.gam_accelerated(
            rho, cfg.rho_prime, cfg.alpha, cfg.beta, cfg.gamma, convention="paper"
        ),
        "gam_accelerated_official": lambda: gamfunc.gam_accelerated(
            rho, cfg.rho_prime, cfg.alpha, cfg.beta, cfg.gamma, convention="official"
        ),
        "sam+gam": lambda: gamfunc.gam(rho, cfg.alpha, oracle=gamfunc.sam(sam_rho)),
    }
    base = gamfunc.sam(sam_rho) if name == "sam+gam" else plain
    return table[name](), base


def build_optimizer(cfg: Config, lr) -> gamfunc.Optimizer:
    """SGD with momentum (coupled weight decay) or AdamW (decoupled), with ``lr`` a float or schedule."""
    if cfg.base == "adamw":
        return gamfunc.adamw(lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay)
    return gamfunc.sgd(
        lr, momentum=cfg.momentum, nesterov=cfg.nesterov, weight_decay=cfg.weight_decay
    )


def distributed(loss_fn):
    """The single place where data parallelism enters: ``(loss_fn, rank, world_size)``.

    Under ``torchrun`` (WORLD_SIZE > 1) the loss would be wrapped here in the data-parallel
    :class:`gamfunc.loss.Objective` of ``gamfunc.distributed``, so that every gradient and
    Hessian-vector product of every estimator is all-reduced; each rank already trains on its own
    shard of every epoch's order (``run``). Until that module exists, WORLD_SIZE > 1 is refused.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return loss_fn, 0, 1
    raise SetupError(
        f"WORLD_SIZE={world}: multi-process training needs gamfunc.distributed's data-parallel "
        "Objective, which is not available in this version; run one process per job"
    )


def _weights(model: nn.Module, path: str) -> None:
    """Load a local state dict, or the params and buffers of one of our checkpoints, into ``model``."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise SetupError(f"--weights: no file at {str(p)!r}")
    obj = torch.load(p, map_location="cpu", weights_only=True)
    if isinstance(obj, dict) and obj.get("format") == ckpt.FORMAT:
        body = ckpt.load(p)
        obj = {**body["params"], **body["state"].get("buffers", {})}
    elif isinstance(obj, dict) and isinstance(obj.get("state_dict") or obj.get("model"), dict):
        obj = obj.get("state_dict") or obj["model"]
    obj = {k: v for k, v in obj.items() if k != CORRECT}
    missing, unexpected = model.load_state_dict(obj, strict=False)
    if missing or unexpected:
        raise SetupError(
            f"--weights {str(p)!r} does not fit the model: missing {missing}, unexpected {unexpected}"
        )


# ---------------------------------------------------------------- evaluation and flatness


def _to(obj, device):
    """Every tensor in a nested dict/list moved to ``device`` (to the CPU synchronously)."""
    if isinstance(obj, Tensor):
        return obj.to(device, non_blocking=torch.device(device).type != "cpu")
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_to(v, device) for v in obj)
    return obj


def _inputs(x: Tensor, device, channels_last: bool = False) -> Tensor:
    """An input batch on ``device``; with ``channels_last``, a 4-d batch (N, C, H, W) is given the
    ``torch.channels_last`` layout. Inputs of other ranks (MLP vectors, 1-D signals) are left as they are."""
    x = x.to(device, non_blocking=True)
    if channels_last and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    return x


def _channels_last(model: nn.Module) -> None:
    """Give every 4-d parameter and buffer of ``model`` (convolution kernels) the ``torch.channels_last``
    layout, in place; tensors of other ranks keep theirs. The values are unchanged."""
    for t in (*model.parameters(), *model.buffers()):
        if t.dim() == 4:
            t.data = t.data.contiguous(memory_format=torch.channels_last)


def _like(loaded, template, where: str = "state"):
    """``loaded`` with each tensor on the device and in the memory layout (strides) of its counterpart
    in ``template`` (same structure): a checkpoint resumes in the layout of the resuming run, whether
    or not the run that wrote it used ``channels_last``. The values are copied bit for bit."""
    if isinstance(template, Tensor):
        if not isinstance(loaded, Tensor) or loaded.shape != template.shape:
            raise ckpt.CheckpointError(
                f"checkpoint {where} does not match the model: shape differs"
            )
        t = loaded.to(template.device)
        if t.stride() != template.stride():
            t = torch.empty_like(template, dtype=t.dtype).copy_(t)
        return t
    if isinstance(template, dict):
        if not isinstance(loaded, dict) or loaded.keys() != template.keys():
            raise ckpt.CheckpointError(f"checkpoint {where} does not match the model: keys differ")
        return {k: _like(loaded[k], v, f"{where}.{k}") for k, v in template.items()}
    return loaded


@torch.no_grad()
def evaluate(
    loss_fn,
    params,
    buffers,
    batches: Iterable,
    device,
    stop: StopFlag | None = None,
    *,
    channels_last: bool = False,
):
    """Mean loss and accuracy (%) of the model in eval mode over ``batches`` (4-d inputs in the
    ``torch.channels_last`` layout when ``channels_last``)."""
    total, loss_sum = 0, torch.zeros((), dtype=torch.float64, device=device)
    correct_t = torch.zeros((), dtype=torch.int64, device=device)
    for x, y in batches if stop is None else _until_stopped(batches, stop):
        if stop is not None:
            stop.check()
        x, y = _inputs(x, device, channels_last), y.to(device, non_blocking=True)
        loss, aux = loss_fn(params, (x, y), buffers, train=False)
        loss_sum += loss.double() * len(y)
        correct_t += aux[CORRECT]
        total += len(y)
    if stop is not None:
        stop.check()
    return float(loss_sum) / max(total, 1), 100.0 * int(correct_t) / max(total, 1)


def flatness(
    cfg: Config, loss_fn, params, buffers, probe, device, writer, step: int
) -> dict[str, float]:
    """λ_max, Hessian trace and R1 on the fixed probe batch, in eval mode, and a landscape figure.

    λ_max: Lanczos (``eig_iters`` products at most); trace: Hutchinson with ``trace_samples`` probes;
    R1_ρ = ρ·max‖∇L(θ')‖ over ‖θ' − θ‖ ≤ ρ (paper Definition 3.1), ρ = ``flatness_rho`` or ``rho``,
    from ``r1_steps`` projected ascent steps started at GAM's θ_adv; the landscape is L along a filter-normalised
    random direction (Li et al. 2018). From :mod:`gamfunc.metrics`; a metric missing there is skipped.
    Each draws from its own generator seeded by ``cfg.seed``, so resumed runs log the same values.
    """
    from gamfunc import metrics

    x, y = _to(probe, device)
    batch = (_inputs(x, device, cfg.channels_last), y)

    def loss(p, b):
        return loss_fn(p, b, buffers, train=False)[0]

    out: dict[str, float] = {}
    rho = cfg.flatness_rho or cfg.rho or 0.05
    gen = lambda k: data_mod.generator(cfg.seed, 7, k)  # noqa: E731
    if hasattr(metrics, "top_eigenvalues") and cfg.eig_iters:
        lam = metrics.top_eigenvalues(
            params, batch, loss, k=1, iters=cfg.eig_iters, generator=gen(1)
        )
        out["lambda_max"] = float(lam[0])
    if hasattr(metrics, "hessian_trace") and cfg.trace_samples:
        out["trace"] = float(
            metrics.hessian_trace(params, batch, loss, samples=cfg.trace_samples, generator=gen(2))
        )
    if hasattr(metrics, "first_order_flatness") and cfg.r1_steps:
        r1 = metrics.first_order_flatness(
            params, batch, loss, rho, steps=cfg.r1_steps, init="gradient", generator=gen(3)
        )
        out["r1"] = float(r1)
    if (
        cfg.landscape
        and writer is not None
        and hasattr(metrics, "landscape_1d")
        and hasattr(metrics, "plot")
    ):
        import gamfunc.logging as tblog

        curve = metrics.landscape_1d(params, batch, loss, generator=gen(4))
        fig = metrics.plot.plot_landscape(curve, title=f"{cfg.estimator}, step {step}")
        tblog.figure(writer, "flatness/landscape_1d", fig, step)
    return out


# ---------------------------------------------------------------- one run


def _device(cfg: Config) -> torch.device:
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.device)


def _progress(iterable=None, **kw):
    from tqdm.auto import tqdm

    return tqdm(iterable, disable=not (kw.pop("enabled", True) and sys.stderr.isatty()), **kw)


def _summary_path(run_dir: Path) -> Path:
    return run_dir / "summary.json"


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(tmp, path)


class Training(NamedTuple):
    """What :func:`setup` builds: the model, its loss, the step and the state before the first step."""

    model: nn.Module
    loss_fn: Callable
    step: gamfunc.Step
    params: dict[str, Tensor]
    state: dict[str, Any]
    steps_per_epoch: int
    rank: int
    world: int


def setup(cfg: Config, name: str, data: data_mod.Data, device: torch.device) -> Training:
    """The model of ``cfg`` (fresh, or from ``--weights``), its loss, and ``make_step`` of the estimator
    ``name`` with the base optimiser and schedule of ``cfg``, initialised on ``device``.

    With ``cfg.channels_last`` the model's 4-d parameters and buffers take the ``torch.channels_last``
    layout before they are copied out into ``params`` and ``buffers``; the step keeps that layout.
    """
    try:
        model = build_model(cfg.model, data.num_classes, data.image_size, seed=cfg.seed)
    except ValueError as e:
        raise SetupError(str(e)) from None
    if cfg.weights:
        _weights(model, cfg.weights)
    forward_mode = name in ("gam", "sam+gam") or (name == "gnp" and cfg.gnp_hvp == "exact")
    has_conv = any(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules())
    if cfg.bf16 and forward_mode and has_conv:
        # torch's forward-mode derivative of convolution meets a bfloat16 weight and a float32
        # tangent under autocast and fails ("Input type ... and weight type ... should be the same").
        raise SetupError(
            f"--bf16 with --estimator={name}: exact Hessian-vector products use forward-mode AD, which "
            "torch does not support through convolutions under bfloat16 autocast; use "
            "--estimator=gam_reverse (reverse-over-reverse, the same GAM) or gam_fd, or drop --bf16"
        )
    model.to(device)
    if cfg.channels_last:
        _channels_last(model)
    loss_fn, rank, world = distributed(classification_loss(model, cfg.bf16, device.type))
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    buffers = {k: v.detach().clone() for k, v in model.named_buffers()}
    buffers[CORRECT] = torch.zeros((), dtype=torch.int64, device=device)
    steps_per_epoch = len(data.train) // (cfg.batch_size * world)
    if steps_per_epoch < 1:
        raise SetupError(
            f"batch_size {cfg.batch_size} (x{world}) exceeds the {len(data.train)} training examples"
        )
    lr = lr_schedule(cfg, steps_per_epoch)
    estimator, base = build_estimator(cfg, name, lr)
    optimizer = build_optimizer(cfg, lr)
    step = gamfunc.make_step(estimator, optimizer, loss_fn, every=cfg.every, base=base)
    state = step.init(params, buffers)
    if cfg.compile:
        step = step.compile()
    return Training(model, loss_fn, step, params, state, steps_per_epoch, rank, world)


def _prepare(cfg: Config, name: str, path: Path) -> dict | None:
    """The checkpoint body to resume from, or None to start afresh; refuses to clobber an unfinished run."""
    if path.exists() and cfg.resume:
        saved = ckpt.load(path)
        ckpt.check_config(saved["config"], cfg, path)
        return saved
    if cfg.resume:
        print(f"[{name}] --resume: no checkpoint at {path} yet, starting afresh", flush=True)
    elif path.exists() and not cfg.overwrite:
        try:
            unfinished = not ckpt.load(path).get("finished", False)
        except ckpt.CheckpointError:
            unfinished = True
        if unfinished:
            raise ckpt.CheckpointError(
                f"{str(path)!r} holds an unfinished run: pass --resume to continue it or --overwrite to start over"
            )
    return None


def run(
    cfg: Config, stop: StopFlag, data: data_mod.Data | None = None, run_dir: Path | None = None
) -> dict:
    """Train one estimator (``cfg.estimator`` names exactly one) and return its summary.

    Raises:
        Interrupted: SIGINT/SIGTERM arrived (through ``stop``); a checkpoint was written first.
        CheckpointError, DataError, SetupError: the run cannot start as configured.
    """
    (name,) = estimators_of(cfg)
    run_dir = run_dir or Path(cfg.logdir).expanduser() / run_name(cfg) / name
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "checkpoint.pt"
    saved = _prepare(cfg, name, path)
    if saved is not None and saved["finished"] and _summary_path(run_dir).exists():
        print(f"[{name}] already finished; summary from {run_dir}", flush=True)
        return json.loads(_summary_path(run_dir).read_text())

    device = _device(cfg)
    data = data_mod.to_device(data or data_mod.load(cfg), device)
    t = setup(cfg, name, data, device)
    model, loss_fn, step, params, state = t.model, t.loss_fn, t.step, t.params, t.state
    rank, world, steps_per_epoch = t.rank, t.world, t.steps_per_epoch
    per_step = cfg.batch_size * world

    probe_idx = torch.randperm(len(data.probe), generator=data_mod.generator(cfg.seed, 6))
    probe = data_mod.stack(data.probe, probe_idx[: cfg.flatness_samples])
    pos = {"epoch": 0, "batch": 0, "global_step": 0, "train_seconds": 0.0}
    pos |= {"timed_images": 0, "timed_seconds": 0.0}
    accum = _zero_accum(device)
    history: list[dict[str, Any]] = []
    best: dict[str, Any] = {"val_acc": -1.0, "epoch": -1, "test_acc": None}
    order = None
    if saved is not None:
        params = _like(saved["params"], params, "params")
        state = _like(saved["state"], state, "state")
        accum = _to(saved["accum"], device)
        pos, history, best = {**pos, **saved["position"]}, saved["history"], saved["best"]
        order = saved["data_order"]
        ckpt.set_rng_state(saved["rng"])
        print(
            f"[{name}] resumed from {path} at epoch {pos['epoch']}, batch {pos['batch']} (step {pos['global_step']})"
        )
    else:
        torch.manual_seed(cfg.seed)
        _write_json(run_dir / "config.json", as_dict(cfg))

    def save(finished: bool = False, status: str = "running") -> None:
        ckpt.save(
            path,
            {
                "config": as_dict(cfg),
                "params": _to(params, "cpu"),
                "state": _to(state, "cpu"),
                "accum": _to(accum, "cpu"),
                "position": dict(pos),
                "data_order": order,
                "history": history,
                "best": best,
                "rng": ckpt.rng_state(),
                "finished": finished,
                "status": status,
            },
        )

    from torch.utils.tensorboard import SummaryWriter

    import gamfunc.logging as tblog

    writer = SummaryWriter(str(run_dir), purge_step=pos["global_step"] if saved else None)
    if saved is None:
        tblog.config(writer, as_dict(cfg))
        tblog.text(
            writer, "model", f"{cfg.model}: {count_parameters(model):,} parameters on {device}"
        )
    stopped = None
    meter = _Meter(device, pos)
    epochs_bar = _progress(
        total=cfg.epochs, initial=pos["epoch"], desc=name, enabled=cfg.progress, unit="ep"
    )
    try:
        while pos["epoch"] < cfg.epochs:
            epoch = pos["epoch"]
            if order is None:
                order = data_mod.epoch_order(len(data.train), cfg.seed, epoch)
                order = order[: steps_per_epoch * per_step][rank::world]
            batches = data_mod.train_batches(
                data.train,
                order,
                pos["batch"],
                cfg.batch_size,
                seed=cfg.seed,
                epoch=epoch,
                workers=cfg.workers,
                pin_memory=device.type == "cuda",
            )
            show = cfg.progress and steps_per_epoch > 20
            bar = _progress(total=steps_per_epoch, initial=pos["batch"], leave=False, enabled=show)
            clock = time.perf_counter()
            meter.mark()
            for x, y in _until_stopped(batches, stop):
                x, y = _inputs(x, device, cfg.channels_last), y.to(device, non_blocking=True)
                params, state, metrics = step(params, state, (x, y))
                _accumulate(accum, metrics, state, len(y))
                pos["batch"] += 1
                pos["global_step"] += 1
                meter.count(len(y) * world)
                bar.update()
                if pos["global_step"] % cfg.log_every == 0:
                    rate = meter.lap()
                    _log_step(tblog, writer, metrics, state, pos["global_step"], rate)
                if cfg.max_steps and pos["global_step"] >= cfg.max_steps:
                    stopped = "max_steps"
                if stopped or stop.signum is not None:
                    break
                if cfg.checkpoint_every and pos["global_step"] % cfg.checkpoint_every == 0:
                    pos["train_seconds"] += time.perf_counter() - clock
                    save()
                    clock = time.perf_counter()
                    meter.mark()
            bar.close()
            pos["train_seconds"] += time.perf_counter() - clock
            if stop.signum is not None:
                save(status="interrupted")
                stop.check()
            if stopped:
                break
            # The epoch's steps are done. If a signal stops what follows, the checkpoint says so
            # (batch == steps_per_epoch) and a resumed run redoes the end-of-epoch work.
            try:
                record = _end_of_epoch(
                    cfg,
                    epoch,
                    loss_fn,
                    params,
                    state,
                    accum,
                    data,
                    probe,
                    device,
                    writer,
                    stop,
                    pos,
                )
            except Interrupted:
                save(status="interrupted")
                raise
            history.append(record)
            if data.val is not None and record.get("val_acc", -1) > best["val_acc"]:
                best = {
                    "val_acc": record["val_acc"],
                    "epoch": epoch + 1,
                    "test_acc": record.get("test_acc"),
                }
                ckpt.save(
                    run_dir / "best.pt",
                    {
                        "config": as_dict(cfg),
                        "params": _to(params, "cpu"),
                        "state": _to(state, "cpu"),
                        "best": best,
                    },
                )
            pos.update(epoch=epoch + 1, batch=0)
            accum, order = _zero_accum(device), None
            epochs_bar.update()
            epochs_bar.set_postfix(test_acc=record.get("test_acc"), loss=record["train_loss"])
            _print_epoch(name, cfg, record)
            if pos["epoch"] < cfg.epochs:  # the last epoch's checkpoint is written below
                save()
                if stop.signum is not None:  # arrived during the end-of-epoch work or the save
                    save(status="interrupted")
                    stop.check()

        status = stopped or "finished"
        save(finished=status == "finished", status=status)
        last = history[-1] if history and history[-1]["step"] == pos["global_step"] else None
        final = _final_metrics(
            cfg, loss_fn, params, state, data, probe, device, writer, pos["global_step"], last
        )
    finally:
        epochs_bar.close()
        writer.close()
    overall = pos["global_step"] * per_step / max(pos["train_seconds"], 1e-9)
    out = {
        "estimator": name,
        "status": status,
        "epochs_done": pos["epoch"],
        "steps": pos["global_step"],
        "skipped_steps": int(state["skipped"]),
        "train_seconds": round(pos["train_seconds"], 2),
        # steady state: the first logging interval of every (re)start (compilation) is left out
        "images_per_s": round(meter.rate() or overall, 1),
        "images_per_s_overall": round(overall, 1),
        "final": final,
        "best_val": best,
        # Appendix C.2 reports the best test accuracy seen during training; it is never used for selection.
        "best_test_acc_reported_only": max(
            (h.get("test_acc", -1.0) for h in history), default=None
        ),
        "history": history,
        "config": as_dict(cfg),
    }
    _write_json(_summary_path(run_dir), out)
    return out


class _Meter:
    """Images per second between synchronisation points (logging steps), for TensorBoard and the summary.

    The first interval after construction (compilation, warm-up) is not added to the totals
    ``pos["timed_images"]`` and ``pos["timed_seconds"]``; ``mark`` restarts an interval after work that
    is not training (evaluation, checkpoints).
    """

    def __init__(self, device: torch.device, pos: dict):
        self.device, self.pos, self.warm = device, pos, False
        self.mark()

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def mark(self) -> None:
        self.start, self.images = self._now(), 0

    def count(self, images: int) -> None:
        self.images += images

    def lap(self) -> float:
        now = self._now()
        rate = self.images / max(now - self.start, 1e-9)
        if self.warm:
            self.pos["timed_images"] += self.images
            self.pos["timed_seconds"] += now - self.start
        self.warm = True
        self.start, self.images = now, 0
        return rate

    def rate(self) -> float | None:
        return (
            self.pos["timed_images"] / self.pos["timed_seconds"]
            if self.pos["timed_seconds"]
            else None
        )


def _until_stopped(batches: Iterable, stop: StopFlag):
    """``batches``, ending early without an error if loading fails after a signal arrived (the same
    SIGINT/SIGTERM may have stopped the DataLoader's worker processes)."""
    it = iter(batches)
    while True:
        try:
            item = next(it)
        except StopIteration:
            return
        except Exception:
            if stop.signum is None:
                raise
            return
        yield item


def _zero_accum(device) -> dict[str, Tensor]:
    z = lambda dt: torch.zeros((), dtype=dt, device=device)  # noqa: E731
    return {"loss": z(torch.float64), "correct": z(torch.int64), "seen": z(torch.int64)}


def _accumulate(accum: dict[str, Tensor], metrics: dict[str, Tensor], state: dict, n: int) -> None:
    """Add a step's loss and correct count to the epoch's sums, unless the step was skipped (no sync)."""
    loss = metrics["loss"]
    ok = (
        (metrics["skipped"] == 0).to(loss.device)
        if "skipped" in metrics
        else torch.ones((), dtype=torch.bool)
    )
    accum["loss"] += torch.where(ok, loss.double() * n, 0.0)
    accum["correct"] += torch.where(ok, state["buffers"][CORRECT], 0)
    accum["seen"] += ok.to(torch.int64) * n


def _log_step(tblog, writer, metrics, state, step: int, images_per_s: float) -> None:
    groups = {
        "step/": ("loss",),
        "opt/": ("lr", "rho"),
        "grad/": ("grad_norm", "f_norm", "adv_grad_norm", "adv_loss", "perturbed_loss"),
    }
    for prefix, keys in groups.items():
        tblog.scalars(writer, {k: metrics[k] for k in keys if k in metrics}, step, prefix)
    tblog.scalars(writer, {"images_per_s": images_per_s}, step, "perf/")
    tblog.scalars(writer, {"skipped_total": state["skipped"]}, step, "train/")


def _end_of_epoch(
    cfg, epoch, loss_fn, params, state, accum, data, probe, device, writer, stop, pos
) -> dict:
    """The epoch's record: mean training loss and running accuracy, test/val (/train) evaluation, and
    flatness every ``flatness_every`` epochs; all written to TensorBoard at the epoch's last step."""
    import gamfunc.logging as tblog

    step = pos["global_step"]
    seen = max(int(accum["seen"]), 1)
    record: dict[str, Any] = {
        "epoch": epoch + 1,
        "step": step,
        "train_loss": float(accum["loss"]) / seen,
        "train_acc": 100.0 * int(accum["correct"]) / seen,
    }
    buffers = state["buffers"]
    last = epoch + 1 == cfg.epochs
    if (epoch + 1) % cfg.eval_every == 0 or last:
        evals = {
            "test": data.test,
            "val": data.val,
            "train_eval": data.probe if cfg.eval_train else None,
        }
        for split, ds in evals.items():
            if ds is None:
                continue
            batches = _eval_batches(cfg, ds, split, device)
            record[f"{split}_loss"], record[f"{split}_acc"] = evaluate(
                loss_fn, params, buffers, batches, device, stop, channels_last=cfg.channels_last
            )
    if cfg.flatness_every and (epoch + 1) % cfg.flatness_every == 0 and not last:
        stop.check()
        record.update(flatness(cfg, loss_fn, params, buffers, probe, device, writer, step))
    if cfg.histogram_every and (epoch + 1) % cfg.histogram_every == 0:
        tblog.histograms(writer, params, step)
    tblog.scalars(
        writer, {_tag(k): v for k, v in record.items() if k not in ("epoch", "step")}, step
    )
    tblog.scalars(writer, {"epoch": epoch + 1}, step, "train/")
    return record


def _tag(key: str) -> str:
    """``test_acc`` → ``test/acc``; ``lambda_max`` → ``flatness/lambda_max``."""
    if key in ("lambda_max", "trace", "r1"):
        return f"flatness/{key}"
    split, _, what = key.rpartition("_")
    return f"{split}/{what}" if split else key


def _eval_batches(cfg: Config, ds, split: str, device: torch.device):
    """The batches of an evaluation, behind a progress bar when there are many."""
    n = math.ceil(len(ds) / cfg.eval_batch_size)
    batches = data_mod.eval_batches(ds, cfg.eval_batch_size, cfg.workers, device.type == "cuda")
    return _progress(batches, total=n, desc=split, leave=False, enabled=cfg.progress and n > 20)


def _final_metrics(cfg, loss_fn, params, state, data, probe, device, writer, step, last) -> dict:
    """The final record: ``last`` (the epoch record at this step) or, for a run stopped mid-epoch, a
    fresh test/validation evaluation; plus accuracy over the whole training set in eval mode
    (in-memory data, or with ``eval_train``) and the flatness metrics."""
    import gamfunc.logging as tblog

    out: dict[str, Any] = dict(last) if last is not None else {"step": step}
    buffers = state["buffers"]
    splits = {
        "train_eval": data.probe if data.probe.tensors() is not None or cfg.eval_train else None
    }
    if last is None:
        splits |= {"test": data.test, "val": data.val}
    for split, ds in splits.items():
        if ds is not None and f"{split}_acc" not in out:
            batches = _eval_batches(cfg, ds, split, device)
            out[f"{split}_loss"], out[f"{split}_acc"] = evaluate(
                loss_fn, params, buffers, batches, device, channels_last=cfg.channels_last
            )
    metrics = flatness(cfg, loss_fn, params, buffers, probe, device, writer, step)
    out.update(metrics)
    new = {k: v for k, v in out.items() if k not in (last or {}) and k not in ("epoch", "step")}
    tblog.scalars(writer, {_tag(k): v for k, v in new.items()}, step)
    return out


def _print_epoch(name: str, cfg: Config, record: dict) -> None:
    every = max(cfg.epochs // 5, 1)
    if record["epoch"] % every and record["epoch"] != cfg.epochs:
        return
    parts = [
        f"[{name}] epoch {record['epoch']}/{cfg.epochs}",
        f"train loss {record['train_loss']:.4f}",
    ]
    for split in ("val", "test"):
        if f"{split}_acc" in record:
            parts.append(f"{split} acc {record[f'{split}_acc']:.2f}%")
    print(", ".join(parts), flush=True)


# ---------------------------------------------------------------- many runs, the table, the CLI


def _fmt(v, spec: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return format("-", f">{spec.split('.')[0]}")
    return format(v, spec)


def table(summaries: list[dict]) -> str:
    """The comparison table printed at the end of a run."""
    has_val = any(s["best_val"]["epoch"] >= 0 for s in summaries)
    head = f"{'estimator':<26}{'train acc':>10}{'test acc':>10}{'gap':>8}"
    head += f"{'val acc':>9}" if has_val else ""
    head += f"{'λ_max':>10}{'trace':>10}{'R1':>10}{'img/s':>9}{'time':>8}"
    rows = [head, "-" * len(head)]
    for s in summaries:
        f = s["final"]
        train = f.get("train_eval_acc", f.get("train_acc"))
        test = f.get("test_acc")
        gap = None if train is None or test is None else train - test
        label = s["estimator"] + _label_hparams(s)
        row = f"{label:<26}{_fmt(train, '10.2f')}{_fmt(test, '10.2f')}{_fmt(gap, '8.2f')}"
        if has_val:
            row += _fmt(f.get("val_acc"), "9.2f")
        row += f"{_fmt(f.get('lambda_max'), '10.2f')}{_fmt(f.get('trace'), '10.1f')}{_fmt(f.get('r1'), '10.4f')}"
        row += f"{s['images_per_s']:>9.0f}{s['train_seconds']:>7.0f}s"
        rows.append(row)
    return "\n".join(rows)


def _label_hparams(s: dict) -> str:
    c, e = s["config"], s["estimator"]
    if e in ("sgd",):
        return ""
    if e == "sam":
        return f" ρ={c['rho']:g}"
    if e == "gnp":
        return f" α={c['alpha']:g}"
    extra = f", 1/{c['every']}" if c["every"] > 1 else ""
    return f" ρ={c['rho']:g},α={c['alpha']:g}{extra}"


def _help() -> str:
    lines = [__doc__.strip(), "", "Options (--key=value):"]
    defaults = as_dict(resolve([]))  # the mnist1d preset applied to Config()
    for k, text in field_help().items():
        lines.append(f"  --{k:<18} {text} [default: {defaults[k]!r}]")
    lines += ["", "Presets (--preset=NAME):", *(f"  {p}" for p in PRESETS)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(_help())
        return 0
    try:
        cfg = resolve(argv)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    threads = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        return _main(cfg)
    finally:
        torch.set_num_threads(threads)


def _main(cfg: Config) -> int:
    # torch.func's forward-mode decompositions warn once that torch.jit.script is deprecated; harmless.
    warnings.filterwarnings("ignore", message=".*torch.jit.script.*", category=FutureWarning)
    stop = StopFlag()
    summaries = []
    names = estimators_of(cfg)
    root = Path(cfg.logdir).expanduser() / run_name(cfg)
    with stop.installed():
        try:
            data = data_mod.load(cfg)
            print(
                f"{cfg.preset}: {cfg.dataset}{' (synthetic)' if cfg.synthetic else ''}, {len(data.train)} train / "
                f"{len(data.val) if data.val else 0} val / {len(data.test)} test, model {cfg.model}, "
                f"{cfg.epochs} epochs, logs in {root}",
                flush=True,
            )
            for name in names:
                stop.check()
                summaries.append(
                    run(dataclasses.replace(cfg, estimator=name), stop, data, root / name)
                )
        except Interrupted as e:
            print(f"{e}; checkpoint written, resume with --resume", file=sys.stderr)
            return 128 + e.signum
        except (data_mod.DataError, ckpt.CheckpointError, SetupError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    print()
    print(table(summaries))
    if len(summaries) > 1:
        _write_json(
            root / "comparison.json",
            [{k: v for k, v in s.items() if k != "history"} for s in summaries],
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
