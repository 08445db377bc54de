"""The run's estimator and base optimiser: the method of ``--estimator`` with the hyperparameters
of the configuration (`build_estimator`), its H·v backend (`exact_hvp_backend`), the warning of
finite-difference GAM on a ReLU network (`fd_gam_warning`), and the base optimiser
(`build_optimizer`)."""

from __future__ import annotations

import dataclasses

from torch import Tensor, nn

import gamfunc
from gamfunc import schedules
from reproduce import methods
from reproduce.config import Config
from reproduce.models import RELU_MODELS

__all__ = [
    "CHOSEN",
    "FD_RELU_RADIUS",
    "build_estimator",
    "build_optimizer",
    "exact_hvp_backend",
    "fd_gam_warning",
    "hyperparameters",
    "uses_exact_hvp",
]

_BatchNorm = nn.modules.batchnorm._BatchNorm


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
