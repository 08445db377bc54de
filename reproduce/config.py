"""The configuration of a training run: one frozen dataclass, presets named after the paper's tables,
and ``--key=value`` overrides.

``resolve(argv)`` starts from `Config`'s defaults (the built-in MNIST-1D comparison), applies
``--preset=NAME`` if given, then every other ``--key=value`` in order. Keys may use ``-`` or ``_``
(``--val-fraction=0.1`` is ``--val_fraction=0.1``); a bare ``--flag`` sets a boolean to true.

Presets (``PRESETS``, built in `reproduce.presets`, whose comments say where each value comes
from) are named after the paper's tables (Zhang et al., CVPR 2023, arXiv:2303.03108). The list of them, one row
per family with its settings, is `reproduce.preset_table.markdown`
(``python -m reproduce.preset_table``; docs/guides/reproduce.md's preset table is its output).

Example:
    >>> from reproduce.config import resolve
    >>> cfg = resolve(["--preset=hp1.cifar100.resnet18", "--estimator=sam+gam", "--seed=1"])
    >>> cfg.model, cfg.rho, cfg.alpha, cfg.estimator
    ('resnet18', 0.1, 0.3, 'sam+gam')
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import math
import os
import re
import typing
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from reproduce.methods import METHODS, Flags
from reproduce.presets import AUTHORS_ACCELERATED, PRESETS, authors_smoothing, closest_presets

__all__ = [
    "AUTHORS_ACCELERATED",
    "BASES",
    "BOUNDS",
    "CYCLES",
    "DATASETS",
    "ESTIMATORS",
    "MODES",
    "PRESETS",
    "RESUME_FREE",
    "Config",
    "apply",
    "as_dict",
    "authors_smoothing",
    "closest_presets",
    "differences",
    "estimators_of",
    "field_help",
    "parse_overrides",
    "resolve",
    "run_name",
    "validate",
    "worker_limit",
]

# --estimator takes the names of reproduce.methods.METHODS, the one table of the estimators
ESTIMATORS = tuple(METHODS)
BASES = ("sgd", "adamw")
DATASETS = (
    "mnist1d",
    "digits",
    "fmnist",
    "cifar10",
    "cifar100",
    "imagenet",
    "cars",
    "pets",
    "food101",
)
AUGMENTS = ("none", "basic", "cutout", "randaugment", "autoaugment")
SCHEDULES = ("cosine", "constant")
RHO_SCHEDULES = ("constant", "proportional")
LR_SCHEDULE_UNITS = ("step", "epoch")
HVPS = ("exact", "reverse", "fd")
COMPILE_SCOPES = ("auto", "step", "pass")
# how the step runs: eager, the eager step replayed as one CUDA graph, compiled, or both
MODES = ("auto", "eager", "graph", "compile", "compile-graph")
BF16_HVPS = ("exact", "reverse")
LOADERS = ("auto", "dali", "dali_exact", "gpu", "folder")
PERTURBATIONS = ("global", "local")
ASAM_MASKS = ("all", "weights")
FSAM_CONVENTIONS = ("paper", "authors")


@dataclass(frozen=True)
class Config(Flags):
    """A run's configuration: the methods' hyperparameters (the fields of
    `reproduce.methods.Flags`, one table with `reproduce.methods.Hyper`) and the fields below, one
    ``--key=value`` each."""

    # --- what to train
    preset: str = "mnist1d"  # the preset these values started from (see PRESETS)
    dataset: str = "mnist1d"  # mnist1d | digits | fmnist | cifar10 | cifar100 | imagenet
    data: str = ""  # folder of fmnist, cifar10/100, imagenet (layouts: reproduce/data/sets.py)
    download: bool = False  # let torchvision download CIFAR into --data (else nothing downloads)
    synthetic: bool = False  # random inputs of the data's shape (smoke tests only)
    synthetic_size: int = 256  # training examples of --synthetic data (test set: a quarter of it)
    model: str = "mlp"  # a name of reproduce.models.MODELS
    num_classes: int = 0  # classifier outputs; 0: the data set's number of classes
    image_size: int = 0  # input side (vector length for mnist1d/digits); 0: the data set's own
    weights: str = ""  # local state dict (or checkpoint) to start from instead of a fresh init
    pretrained: bool = False  # fine-tune: --weights required, then a new classifier layer
    augment: str = "basic"  # none | basic | cutout | randaugment | autoaugment (image data sets)
    cutout_size: int = 16  # side of the Cutout square in pixels (DeVries and Taylor 2017)
    label_noise: float = 0.0  # fraction of training labels replaced by another class (App. C.2)
    val_fraction: float = 0.0  # share of the training set held out for validation (model selection)
    workers: int = 0  # DataLoader workers of image folders, DALI's CPU threads (0: 8); ≤ 4 × cores
    # --- the gradient estimator (its hyperparameters: the fields of reproduce.methods.Flags, first)
    estimator: str = "sgd,gam"  # one of ESTIMATORS, or a comma list trained one after the other
    rho_schedule: str = "constant"  # constant | proportional (ρ_t = ρ_min + (ρ − ρ_min)·lr_t/lr_0)
    rho_min: float = 0.0  # ρ_min: the floor of --rho_schedule=proportional (in [0, rho])
    every: int = 1  # estimator on every k-th step, the base one otherwise (App. C.3); the shorthand of --when=every:k
    when: str = ""  # when a step is flat: "" (every step) | every:k | late:F (from F of the run's steps on, F in [0, 1)) | late:N (from step N) | adaptive (AE-SAM's trigger, the paper's defaults)
    # --- the base optimiser and schedule
    base: str = "sgd"  # sgd | adamw
    lr: float = 0.05  # peak learning rate
    momentum: float = 0.9  # SGD momentum
    nesterov: bool = False  # SGD Nesterov momentum
    weight_decay: float = 5e-4  # L2 weight decay (SGD) or decoupled weight decay (AdamW)
    beta1: float = 0.9  # AdamW β₁
    beta2: float = 0.999  # AdamW β₂
    schedule: str = "cosine"  # cosine | constant learning rate
    lr_schedule_unit: str = "step"  # step | epoch: the lr changes every step or once per epoch
    warmup_epochs: float = 0.0  # linear warm-up before the cosine decay
    epochs: int = 100  # training epochs
    total_steps: int = 0  # train this many steps (the schedule's length; overrides epochs; 0: off)
    batch_size: int = 100  # global batch: the sum over all processes of a torchrun job
    clip_norm: float = 0.0  # clip the direction to this global L2 norm before the update (0: never)
    label_smoothing: float = 0.0  # F.cross_entropy's, in training (0: none; the paper says none)
    no_decay_1d: bool = False  # no weight decay on 1-d tensors (biases, normalisation weights)
    eval_batch_size: int = 500  # evaluation batch size
    max_steps: int = 0  # stop after this many steps in all (smoke runs; 0: no limit); resumable
    max_skipped: int = 50  # stop (exit 3) after this many skipped steps in a row (0: never)
    max_skipped_fraction: float = 0.5  # diverged (exit 3) if more of the run's steps were skipped
    max_param_rms: float = 1e3  # diverged (exit 3) if the parameters' root mean square ends above
    # --- how it runs
    seed: int = 0  # seeds the initialisation, data order, augmentation and metric probes
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    threads: int = 0  # torch CPU threads; 0: torch's default
    bf16: bool = False  # bfloat16 autocast inside the loss
    bf16_hvp: str = "exact"  # exact GAM's H·v in bf16 on conv/BatchNorm nets: exact | reverse
    compile: bool = False  # torch.compile the training step
    channels_last: bool = False  # NHWC layout for 4-d parameters and 4-d input batches (GPU speed)
    compile_scope: str = "auto"  # step | pass | auto (pass for ImageNet and torchrun)
    cuda_graph: bool = False  # replay each step, update and all-reduces included, as one CUDA graph
    mode: str = "auto"  # how the step runs: eager | graph (the eager step as one CUDA graph: a first step within seconds) | compile | compile-graph | auto (graph on a GPU, eager on the CPU; --compile and --cuda_graph choose for it)
    compile_cache: str = "auto"  # where --compile keeps its compiled artifacts for later runs and --resume: a folder | off | auto (logdir/.compile_cache)
    loader: str = "auto"  # image folders: dali | dali_exact | gpu | folder | auto (dali with a GPU and DALI, else gpu where torchvision decodes JPEG on it, else folder; one line says which and why)
    dali_hw_load: float = 0.0  # --loader=dali*: the share of each batch on the hardware JPEG decoder (0: nvJPEG's CUDA decoder, which costs the step least)
    dali_roi: bool = True  # --loader=dali: decode each crop's window alone (false: whole images)
    dali_cpu: bool = False  # --loader=dali*: decode and resize on --workers CPU threads (0: 8), normalise on the GPU
    read_ahead: int = 3  # --loader=dali*|gpu: batches prepared ahead of the one the step takes (DALI's prefetch_queue_depth)
    fsdp: bool = False  # torchrun: shard the model per block with FSDP2 (fully_shard), trained through gamfunc.torch_optim; estimators built on gradients, eager (reproduce/run/fsdp.py)
    perturbation: str = "global"  # torchrun: global (one-process step) | local (per rank)
    dist_timeout: int = 1800  # seconds a collective waits for the other processes before failing
    # --- logging and evaluation
    logdir: str = "runs"  # TensorBoard logs, checkpoints and summaries go to logdir/name/estimator
    name: str = ""  # run name; empty: the preset's name
    log_every: int = 10  # steps between TensorBoard scalar writes
    profile_steps: int = 0  # steps profiled after the first log_every (into profile.txt)
    eval_every: int = 1  # epochs between test (and validation) evaluations
    eval_train: bool = False  # also evaluate on the whole training set at every evaluation
    flatness_every: int = 0  # epochs between λ_max/trace/R1/landscape logs (0: only at the end)
    flatness_samples: int = 4000  # training examples (fixed, un-augmented) the flatness metrics use
    full_metrics: bool = False  # a smoke run's end-of-run metrics at their configured size too
    flatness_batch: int = 0  # batches of this size, H·v averaged over them (0: one batch)
    flatness_rho: float = 0.0  # radius of R1 and of the landscape plots; 0: rho
    eig_iters: int = 100  # Lanczos iterations for λ_max (0: skip λ_max)
    trace_samples: int = 100  # Hutchinson probes for the Hessian trace (0: skip the trace)
    r1_steps: int = 10  # projected ascent steps for R1, started at GAM's θ_adv (0: skip R1)
    landscape: bool = True  # log a loss-landscape figure with the flatness metrics (if available)
    histogram_every: int = 0  # epochs between parameter histograms (0: never)
    progress: bool = True  # tqdm progress bars (shown only on a terminal)
    # --- checkpoints
    checkpoint_every: int = 0  # steps between checkpoints within an epoch (0: at epoch ends only)
    resume: bool = False  # continue from the run's checkpoint
    overwrite: bool = False  # start afresh even if an unfinished run's checkpoint exists


# Fields that may differ between a checkpoint and the run resuming it: they change where output goes,
# how much is logged or how fast it runs, never the trajectory (device, compile and
# channels_last change rounding only; so do the loader and its decoders, except that --loader=dali
# computes crops of its own and --dali_roi decodes their windows alone).
RESUME_FREE = frozenset(
    {
        "data",
        "download",
        "workers",
        "threads",
        "max_steps",
        "max_skipped",
        "max_skipped_fraction",
        "max_param_rms",
        "full_metrics",
        "device",
        "compile",
        "channels_last",
        "logdir",
        "name",
        "log_every",
        "profile_steps",
        "eval_every",
        "eval_train",
        "flatness_every",
        "flatness_samples",
        "flatness_batch",
        "flatness_rho",
        "eig_iters",
        "trace_samples",
        "r1_steps",
        "landscape",
        "histogram_every",
        "progress",
        "checkpoint_every",
        "compile_scope",
        "cuda_graph",
        "mode",
        "compile_cache",
        "loader",
        "dali_hw_load",
        "dali_roi",
        "dali_cpu",
        "read_ahead",
        "dist_timeout",
        "resume",
        "overwrite",
        "eval_batch_size",
        "preset",
    }
)


def field_help() -> dict[str, str]:
    """Each field's comment in the source of `Config` (and of `reproduce.methods.Flags`, whose
    fields it takes), in the order of the fields: the ``--help`` text."""
    pattern = re.compile(r"^\s+(\w+): [^=]+ = .*?  # (.*)$")
    found = {}
    for cls in (Flags, Config):
        for line in inspect.getsource(cls).splitlines():
            m = pattern.match(line)
            if m:
                found[m.group(1)] = m.group(2)
    return {f.name: found[f.name] for f in fields(Config) if f.name in found}


def _field_types() -> dict[str, type]:
    hints = typing.get_type_hints(Config)
    return {f.name: hints[f.name] for f in fields(Config)}


def _convert(key: str, text: str, kind: type) -> Any:
    if kind is bool:
        low = text.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"--{key} takes true or false; got {text!r}")
    try:
        return kind(text)
    except ValueError:
        what = "an integer" if kind is int else f"a {kind.__name__}"
        raise ValueError(f"--{key} takes {what}; got {text!r}") from None


def parse_overrides(argv: list[str]) -> list[tuple[str, Any]]:
    """``["--lr=0.1", "--bf16", "--val-fraction", "0.1"]`` → ``[("lr", 0.1), ("bf16", True), ...]``.

    Raises ValueError naming an unknown key (with the closest known ones) or a value of the wrong type.
    """
    types = _field_types()
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            raise ValueError(f"arguments are --key=value; got {arg!r}")
        key, eq, text = arg[2:].partition("=")
        key = key.replace("-", "_")
        if key not in types:
            near = difflib.get_close_matches(key, list(types), n=3)
            hint = f"; did you mean {', '.join('--' + n for n in near)}?" if near else ""
            raise ValueError(f"unknown option --{key}{hint}")
        if not eq:
            if types[key] is bool:
                text = "true"
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                i += 1
                text = argv[i]
            else:
                raise ValueError(f"--{key} needs a value")
        out.append((key, _convert(key, text, types[key])))
        i += 1
    return out


def apply(cfg: Config, overrides: list[tuple[str, Any]] | dict[str, Any]) -> Config:
    """``cfg`` with the overrides applied in order; ``preset`` first sets the preset's values."""
    items = list(overrides.items()) if isinstance(overrides, dict) else list(overrides)
    for key, value in items:
        if key == "preset":
            if value not in PRESETS:
                near = closest_presets(value)
                hint = f"did you mean {', '.join(near)}? " if near else ""
                raise ValueError(f"unknown preset {value!r}; {hint}--help lists all {len(PRESETS)}")
            cfg = replace(cfg, **PRESETS[value], preset=value)
        else:
            cfg = replace(cfg, **{key: value})
    return cfg


def resolve(argv: list[str]) -> Config:
    """The validated configuration of a command line: defaults, then ``--preset`` (``mnist1d`` if
    none is given), then the other overrides in order."""
    overrides = parse_overrides(argv)
    presets = [kv for kv in overrides if kv[0] == "preset"]
    rest = [kv for kv in overrides if kv[0] != "preset"]
    cfg = apply(Config(), (presets[-1:] or [("preset", Config.preset)]) + rest)
    validate(cfg)
    return cfg


def _check(ok: bool, name: str, msg: str, value: Any) -> None:
    if not ok:
        raise ValueError(f"--{name} must be {msg}; got {value!r}")


def estimators_of(cfg: Config) -> list[str]:
    """The estimators a run trains: ``cfg.estimator`` split at commas."""
    return [e.strip() for e in cfg.estimator.split(",") if e.strip()]


def validate(cfg: Config) -> None:
    """Raise ValueError naming the first field whose value is out of range."""
    from reproduce.models import MODELS

    _check(cfg.dataset in DATASETS, "dataset", f"one of {DATASETS}", cfg.dataset)
    _check(cfg.model in MODELS, "model", f"one of {sorted(MODELS)}", cfg.model)
    _check(cfg.augment in AUGMENTS, "augment", f"one of {AUGMENTS}", cfg.augment)
    _check(cfg.base in BASES, "base", f"one of {BASES}", cfg.base)
    _check(cfg.schedule in SCHEDULES, "schedule", f"one of {SCHEDULES}", cfg.schedule)
    _check(
        cfg.rho_schedule in RHO_SCHEDULES,
        "rho_schedule",
        f"one of {RHO_SCHEDULES}",
        cfg.rho_schedule,
    )
    unit = cfg.lr_schedule_unit
    _check(unit in LR_SCHEDULE_UNITS, "lr_schedule_unit", f"one of {LR_SCHEDULE_UNITS}", unit)
    if unit == "epoch":
        _check(
            float(cfg.warmup_epochs).is_integer(),
            "warmup_epochs",
            "a whole number of epochs with --lr_schedule_unit=epoch",
            cfg.warmup_epochs,
        )
    _check(cfg.gnp_hvp in HVPS, "gnp_hvp", f"one of {HVPS}", cfg.gnp_hvp)
    _check(cfg.bf16_hvp in BF16_HVPS, "bf16_hvp", f"one of {BF16_HVPS}", cfg.bf16_hvp)
    for name, allowed in (
        ("compile_scope", COMPILE_SCOPES),
        ("mode", MODES),
        ("loader", LOADERS),
        ("perturbation", PERTURBATIONS),
        ("asam_mask", ASAM_MASKS),
        ("fsam_convention", FSAM_CONVENTIONS),
    ):
        _check(getattr(cfg, name) in allowed, name, f"one of {allowed}", getattr(cfg, name))
    if cfg.mode != "auto":  # a mode other than auto says what --compile and --cuda_graph say
        compiled, graphed = cfg.mode.startswith("compile"), cfg.mode.endswith("graph")
        want = "compile or compile-graph with --compile"
        _check(compiled or not cfg.compile, "mode", want, cfg.mode)
        want = "graph or compile-graph with --cuda_graph"
        _check(graphed or not cfg.cuda_graph, "mode", want, cfg.mode)
    cache = cfg.compile_cache.strip()
    _check(bool(cache), "compile_cache", "a folder, off or auto", cfg.compile_cache)
    _check(
        cfg.clip_norm >= 0 and cfg.clip_norm != float("inf"),
        "clip_norm",
        "a finite number >= 0",
        cfg.clip_norm,
    )
    hw = cfg.dali_hw_load
    _check(0 <= hw <= 1, "dali_hw_load", "a share in [0, 1]", hw)
    _check(cfg.read_ahead >= 1, "read_ahead", "an integer >= 1 (batches)", cfg.read_ahead)
    _check(cfg.dist_timeout >= 1, "dist_timeout", "an integer >= 1 (seconds)", cfg.dist_timeout)
    names = estimators_of(cfg)
    _check(bool(names), "estimator", f"one or more of {ESTIMATORS}", cfg.estimator)
    for e in names:
        _check(e in ESTIMATORS, "estimator", f"one of {ESTIMATORS} (or a comma list)", e)
    _check(len(set(names)) == len(names), "estimator", "a list without repeats", cfg.estimator)
    # every number finite: a NaN or inf would pass the range checks below or fail late
    for f in fields(Config):
        v = getattr(cfg, f.name)
        if isinstance(v, float) and f.name != "max_param_rms":
            _check(math.isfinite(v), f.name, "a finite number", v)
    for name in (
        *("rho", "alpha", "sam_rho", "rho_prime", "gamma", "lr", "momentum", "weight_decay"),
        *("eta", "gsam_alpha", "looksam_alpha", "fsam_sigma", "wsam_max_norm"),
    ):
        v = getattr(cfg, name)
        _check(v >= 0 and v != float("inf"), name, "a finite number >= 0", v)
    for name in ("wsam_gamma", "fsam_lmbda"):
        _check(0 <= getattr(cfg, name) < 1, name, "in [0, 1)", getattr(cfg, name))
    _check(0 <= cfg.rho_min <= cfg.rho, "rho_min", f"in [0, rho={cfg.rho}]", cfg.rho_min)
    if any(e.startswith("gam_accelerated") for e in names):
        _check(0 <= cfg.alpha <= 1, "alpha", "in [0, 1] for gam_accelerated", cfg.alpha)
    _check(0 <= cfg.beta <= 1, "beta", "in [0, 1]", cfg.beta)
    _check(cfg.fd_radius > 0, "fd_radius", "> 0", cfg.fd_radius)
    _check(cfg.gnp_radius > 0, "gnp_radius", "> 0", cfg.gnp_radius)
    for name in ("beta1", "beta2"):
        _check(0 <= getattr(cfg, name) < 1, name, "in [0, 1)", getattr(cfg, name))
    _check(0 <= cfg.label_noise <= 1, "label_noise", "in [0, 1]", cfg.label_noise)
    _check(0 <= cfg.val_fraction < 1, "val_fraction", "in [0, 1)", cfg.val_fraction)
    _check(cfg.warmup_epochs >= 0, "warmup_epochs", ">= 0", cfg.warmup_epochs)
    _check(cfg.epochs >= 1, "epochs", "an integer >= 1", cfg.epochs)
    _check(cfg.warmup_epochs <= cfg.epochs, "warmup_epochs", "<= epochs", cfg.warmup_epochs)
    leaves = Path(cfg.name).is_absolute() or ".." in Path(cfg.name).parts
    _check(not leaves, "name", "a name inside --logdir (no absolute path, no ..)", cfg.name)
    _check(cfg.total_steps >= 0, "total_steps", "an integer >= 0", cfg.total_steps)
    _check(cfg.flatness_batch >= 0, "flatness_batch", "an integer >= 0", cfg.flatness_batch)
    ls = cfg.label_smoothing
    _check(0 <= ls < 1, "label_smoothing", "a number in [0, 1)", ls)
    frac = cfg.max_skipped_fraction
    _check(0 <= frac <= 1, "max_skipped_fraction", "a number in [0, 1]", frac)
    _check(cfg.max_param_rms > 0, "max_param_rms", "a number > 0", cfg.max_param_rms)
    for name in (
        *("every", "epochs", "batch_size", "eval_batch_size", "log_every", "eval_every"),
        *("ascent_steps", "look_k"),
    ):
        _check(getattr(cfg, name) >= 1, name, "an integer >= 1", getattr(cfg, name))
    for name in (
        "num_classes",
        "image_size",
        "max_steps",
        "max_skipped",
        "workers",
        "threads",
        "flatness_every",
        "profile_steps",
        "histogram_every",
        "checkpoint_every",
        "eig_iters",
        "trace_samples",
        "r1_steps",
        "cutout_size",
    ):
        _check(getattr(cfg, name) >= 0, name, "an integer >= 0", getattr(cfg, name))
    _check(cfg.flatness_samples >= 1, "flatness_samples", "an integer >= 1", cfg.flatness_samples)
    _check(cfg.synthetic_size >= 4, "synthetic_size", "an integer >= 4", cfg.synthetic_size)
    _check(cfg.flatness_rho >= 0, "flatness_rho", ">= 0", cfg.flatness_rho)
    _check(0 <= cfg.seed < 2**63, "seed", "an integer in [0, 2**63)", cfg.seed)
    # every count fits the int64 a checkpoint and a tensor hold it in; a count that sizes work
    # within one step, one evaluation or one process has a bound of its own (`BOUNDS`)
    for f in fields(Config):
        v = getattr(cfg, f.name)
        if isinstance(v, int) and not isinstance(v, bool):
            most, why = BOUNDS.get(f.name, (2**63 - 1, ""))
            _check(v <= most, f.name, f"at most {most:,}{why}", v)
    kind, _, arg = cfg.when.partition(":")
    ok = (
        cfg.when == ""
        or (kind == "every" and arg.isdigit() and int(arg) >= 1)
        or (kind == "late" and re.fullmatch(r"\d+|0?\.\d+|0\.?", arg) is not None)
        or cfg.when == "adaptive"
    )
    _check(ok, "when", '"", every:k, late:F (F in [0, 1)), late:N or adaptive', cfg.when)
    _check(not (cfg.when and cfg.every > 1), "when", f"empty with --every={cfg.every}", cfg.when)
    if cfg.when:
        for e in names:
            cycles = e in CYCLES and cfg.look_k > 1
            _check(not cycles, "when", f"empty with {e} (it cycles every --look_k steps)", cfg.when)
    _check(cfg.rwp_sigma >= 0, "rwp_sigma", "a finite number >= 0", cfg.rwp_sigma)
    _check(0 <= cfg.rwp_mix <= 1, "rwp_mix", "in [0, 1]", cfg.rwp_mix)
    _check(0 <= cfg.rwp_seed < 2**32, "rwp_seed", "an integer in [0, 2**32)", cfg.rwp_seed)
    _check(0 <= cfg.msam_momentum < 1, "msam_momentum", "in [0, 1)", cfg.msam_momentum)
    if cfg.every > 1:  # a method that cycles by itself takes its full step every --look_k steps
        for e in names:
            cycles = e in CYCLES and cfg.look_k > 1
            _check(not cycles, "every", f"1 with {e} (it cycles every --look_k steps)", cfg.every)
    _check(cfg.num_classes != 1, "num_classes", "0 (the data set's) or at least 2", cfg.num_classes)
    cores = os.cpu_count() or 1
    _check(cfg.threads <= cores, "threads", f"at most this machine's {cores} cores", cfg.threads)
    most = worker_limit()
    _check(
        cfg.workers <= most, "workers", f"at most {most} (4 × this machine's cores)", cfg.workers
    )
    _check(
        cfg.max_param_rms == cfg.max_param_rms, "max_param_rms", "a number > 0", cfg.max_param_rms
    )
    dev = cfg.device
    _check(
        dev in ("auto", "cpu", "cuda") or bool(re.fullmatch(r"cuda:\d+", dev)),
        "device",
        "auto, cpu, cuda or cuda:N",
        dev,
    )


# The upper bounds of counts that size the work of one step, evaluation or process, so that a typo
# is refused rather than run for days (the rest: at most 2**63 - 1); --workers: `worker_limit`.
BOUNDS = {
    "ascent_steps": (100, " ascent steps in a step"),
    "num_classes": (1_000_000, " classes"),
    "eig_iters": (10_000, " Lanczos iterations"),
    "trace_samples": (1_000_000, " probes"),
    "r1_steps": (10_000, " ascent steps"),
    "read_ahead": (64, " batches"),
    "dist_timeout": (7 * 86_400, " seconds (a week)"),
}
# Methods that take their full step every --look_k steps by themselves (no --every beside it).
CYCLES = ("looksam", "look_gam")


def worker_limit() -> int:
    """The most ``--workers`` a run may ask for: 4 × this machine's cores (a loader's workers
    wait on reads and decode in turn; more processes than that only take memory)."""
    return 4 * (os.cpu_count() or 1)


def run_name(cfg: Config) -> str:
    """The folder of a run under ``logdir``: ``name``, else the preset (with the data set appended
    when ``--dataset`` overrides the preset's)."""
    if cfg.name:
        return cfg.name
    own = PRESETS.get(cfg.preset, {}).get("dataset", Config.dataset)
    return cfg.preset if cfg.dataset == own else f"{cfg.preset}.{cfg.dataset}"


def as_dict(cfg: Config) -> dict[str, Any]:
    """The configuration as a plain dict (what checkpoints and summaries store)."""
    return dataclasses.asdict(cfg)


def differences(saved: dict[str, Any], cfg: Config, ignore=RESUME_FREE) -> dict[str, tuple]:
    """``{field: (saved value, current value)}`` for fields outside ``ignore`` that differ.

    A field that ``saved`` lacks (a checkpoint written before the field existed) counts as its
    default in `Config`, the behaviour such a run had."""
    now, default = as_dict(cfg), as_dict(Config())
    keys = (set(saved) | set(now)) - set(ignore)
    old = {k: saved.get(k, default.get(k)) for k in keys}
    return {k: (old[k], now.get(k)) for k in sorted(keys) if old[k] != now.get(k)}
