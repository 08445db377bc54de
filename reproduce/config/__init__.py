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
from typing import Any

from reproduce.config.checks import validate
from reproduce.config.fields import (
    BASES,
    BOUNDS,
    CYCLES,
    DATASETS,
    ESTIMATORS,
    LOADERS,
    MODES,
    RESUME_FREE,
    Config,
    estimators_of,
    worker_limit,
)
from reproduce.config.overrides import apply, field_help, parse_overrides
from reproduce.presets import AUTHORS_ACCELERATED, PRESETS, authors_smoothing, closest_presets

__all__ = [
    "AUTHORS_ACCELERATED",
    "BASES",
    "BOUNDS",
    "CYCLES",
    "DATASETS",
    "ESTIMATORS",
    "LOADERS",
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


def resolve(argv: list[str]) -> Config:
    """The validated configuration of a command line: defaults, then ``--preset`` (``mnist1d`` if
    none is given), then the other overrides in order."""
    overrides = parse_overrides(argv)
    presets = [kv for kv in overrides if kv[0] == "preset"]
    rest = [kv for kv in overrides if kv[0] != "preset"]
    cfg = apply(Config(), (presets[-1:] or [("preset", Config.preset)]) + rest)
    validate(cfg)
    return cfg


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
