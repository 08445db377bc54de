"""`validate`: a `Config`'s values in range, checked topic by topic (the choices, how the step
runs, the estimators, the numbers, the counts, ``--when``, the machine), the first field out of
range named in one line: ``--name must be ...; got value``."""

from __future__ import annotations

import math
import os
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import gamfunc
from reproduce.config.fields import (
    ASAM_MASKS,
    AUGMENTS,
    BASES,
    BF16_HVPS,
    BOUNDS,
    COMPILE_SCOPES,
    CYCLES,
    DATASETS,
    ESTIMATORS,
    FSAM_CONVENTIONS,
    HVPS,
    LOADERS,
    LR_SCHEDULE_UNITS,
    MODES,
    PERTURBATIONS,
    RHO_SCHEDULES,
    SCHEDULES,
    Config,
    estimators_of,
    worker_limit,
)

__all__ = ["validate"]


def validate(cfg: Config) -> None:
    """Raise ValueError naming the first field whose value is out of range.

    Args:
        cfg: the configuration.

    Raises:
        ValueError: ``--name must be ...; got value``.
    """
    _choices(cfg)
    _how_it_runs(cfg)
    names = _estimators(cfg)
    _finite(cfg)
    _hyperparameters(cfg, names)
    _training(cfg)
    _counts(cfg)
    _when(cfg, names)
    _one_pass(cfg)
    _cycles(cfg, names)
    _machine(cfg)


def _check(ok: bool, name: str, msg: str, value: Any) -> None:
    if not ok:
        raise ValueError(f"--{name} must be {msg}; got {value!r}")


def _choices(cfg: Config) -> None:
    """Every field that names one of a few choices names one of them."""
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


def _how_it_runs(cfg: Config) -> None:
    """The step's mode agrees with ``--compile`` and ``--cuda_graph``; the compile cache, the
    clip, the loader's settings and the collectives' timeout are in range."""
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


def _estimators(cfg: Config) -> list[str]:
    """The estimators of ``--estimator``: one or more known names, none twice."""
    names = estimators_of(cfg)
    _check(bool(names), "estimator", f"one or more of {ESTIMATORS}", cfg.estimator)
    for e in names:
        _check(e in ESTIMATORS, "estimator", f"one of {ESTIMATORS} (or a comma list)", e)
    _check(len(set(names)) == len(names), "estimator", "a list without repeats", cfg.estimator)
    return names


def _finite(cfg: Config) -> None:
    """Every number finite: a NaN or inf would pass the range checks below or fail late."""
    for f in fields(Config):
        v = getattr(cfg, f.name)
        if isinstance(v, float) and f.name != "max_param_rms":
            _check(math.isfinite(v), f.name, "a finite number", v)


def _hyperparameters(cfg: Config, names: list[str]) -> None:
    """The estimators' and the base optimiser's hyperparameters in their ranges."""
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


def _training(cfg: Config) -> None:
    """The data's noise and split, the run's length, its name and its divergence guards."""
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


def _counts(cfg: Config) -> None:
    """Every count at least its least, and at most its bound (`BOUNDS`)."""
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


def _when(cfg: Config, names: list[str]) -> None:
    """``--when`` a policy it knows, given neither with ``--every`` nor with a method that cycles;
    ``late`` starting at a step of the run where ``--total_steps`` gives its length (with
    ``--epochs`` the policy checks it once the data gives the steps of an epoch); ``adaptive`` not
    beside ``--perturbation=local``."""
    kind, _, arg = cfg.when.partition(":")
    ok = (
        cfg.when == ""
        or (kind == "every" and arg.isdigit() and int(arg) >= 1)
        or (kind == "late" and re.fullmatch(r"\d+|0?\.\d+|0\.?", arg) is not None)
        or cfg.when == "adaptive"
    )
    _check(ok, "when", '"", every:k, late:F (F in [0, 1)), late:N or adaptive', cfg.when)
    _check(not (cfg.when and cfg.every > 1), "when", f"empty with --every={cfg.every}", cfg.when)
    if ok and kind == "late" and cfg.total_steps:
        try:  # the policy's own check: its first flat step a step of the run
            gamfunc.when.late(late_start(arg), total_steps=cfg.total_steps)
        except ValueError as e:
            why = str(e).removeprefix("start: ")
            _check(
                False,
                "when",
                f"late:N or late:F over --total_steps={cfg.total_steps} ({why})",
                cfg.when,
            )
    _check(
        not (cfg.when == "adaptive" and cfg.perturbation == "local"),
        "when",
        "other than adaptive with --perturbation=local (each rank would choose from its own "
        "gradient, take its own branch, and the ranks' collectives would part); use "
        "--perturbation=global, under which every rank chooses from the mean gradient",
        cfg.when,
    )
    if cfg.when:
        for e in names:
            cycles = e in CYCLES and cfg.look_k > 1
            _check(not cycles, "when", f"empty with {e} (it cycles every --look_k steps)", cfg.when)


def late_start(arg: str) -> int | float:
    """The start of ``--when=late:ARG`` for `gamfunc.when.late`: a step (``late:N``) or a fraction of
    the run's steps (``late:F``, written with a point)."""
    return float(arg) if "." in arg else int(arg)


def _one_pass(cfg: Config) -> None:
    """The one-pass estimators' settings (RWP, MSAM)."""
    _check(cfg.rwp_sigma >= 0, "rwp_sigma", "a finite number >= 0", cfg.rwp_sigma)
    _check(0 <= cfg.rwp_mix < 1, "rwp_mix", "in [0, 1)", cfg.rwp_mix)
    _check(0 <= cfg.rwp_seed < 2**32, "rwp_seed", "an integer in [0, 2**32)", cfg.rwp_seed)
    _check(0 <= cfg.msam_momentum < 1, "msam_momentum", "in [0, 1)", cfg.msam_momentum)


def _cycles(cfg: Config, names: list[str]) -> None:
    """No ``--every`` beside a method that cycles by itself: it takes its full step every
    ``--look_k`` steps."""
    if cfg.every > 1:
        for e in names:
            cycles = e in CYCLES and cfg.look_k > 1
            _check(not cycles, "every", f"1 with {e} (it cycles every --look_k steps)", cfg.every)


def _machine(cfg: Config) -> None:
    """What this machine and the data can give: classes, threads, workers, the device."""
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
