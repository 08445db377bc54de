"""The presets of `reproduce.config.PRESETS` as a markdown table, one row per family.

A family is the presets that share their first name component and base optimiser (``hp1`` with SGD,
``hp1`` with AdamW, ...); its names are written as one pattern (``hp1.{cifar10,cifar100}.{resnet18,...}``)
and its settings are what its presets set, each value followed by the name components it holds for
where it differs inside the family. docs/guides/reproduce.md's preset table is this module's output:

```bash
python -m reproduce.preset_table      # prints the table
```
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: the checkout's root on sys.path (reproduce/__init__.py)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reproduce.config import PRESETS, Config

__all__ = ["SOURCES", "families", "markdown", "pattern"]

# Where each family's values come from (the first name component, with the base where it splits).
# reproduce/README.md, "Where each preset's values come from", says it field by field.
SOURCES = {
    "mnist1d": "– (built in, no download; the default)",
    "digits": "– (built in, no download)",
    "fmnist": "– (ours: Fashion-MNIST on one GPU, reproduce/RESULTS.md)",
    "hp1": "Table 1, Table app:tab:hp1",
    "hp1/adamw": "appendix CIFAR table (ViT-S/16)",
    "hp2": "Table 2, Table app:tab:hp2",
    "hp2/adamw": "Table 2, Table app:tab:hp2",
    "noise": "Appendix C.2, Table app:tab:noise",
    "time": "Appendix C.3, Table app:tab:time",
    "accelerated": "Appendix D, Algorithm 2 (the authors' code)",
    "gnp": "GNP table (CIFAR-100)",
    "gsam": "GSAM (Zhuang et al. 2022), Table 4; the recipe of hp2",
    "gsam/adamw": "GSAM (Zhuang et al. 2022), Table 4; the recipe of hp2",
    "transfer": "transfer table (Section 5.3)",
    "transfer/adamw": "transfer table (Section 5.3)",
}

# Fields shown in the settings column, in this order, with the name written there; the rest
# (logging, metric sizes, workers, threads) change no trajectory and are left out.
SHOWN = {
    "estimator": "estimator",
    "base": "base",
    "momentum": "momentum",
    "lr": "lr",
    "weight_decay": "wd",
    "no_decay_1d": "no decay on 1-d tensors",
    "schedule": "schedule",
    "warmup_epochs": "warm-up epochs",
    "epochs": "epochs",
    "total_steps": "steps",
    "batch_size": "batch",
    "clip_norm": "clip",
    "rho": "ρ",
    "rho_schedule": "ρ schedule",
    "rho_min": "ρ_min",
    "alpha": "α",
    "gsam_alpha": "GSAM α",
    "sam_rho": "SAM ρ",
    "rho_prime": "ρ'",
    "beta": "β",
    "gamma": "γ",
    "every": "every",
    "gnp_radius": "GNP r",
    "label_noise": "label noise",
    "label_smoothing": "label smoothing",
    "augment": "augment",
    "image_size": "image size",
    "pretrained": "pretrained",
}
# fields shown only where the family's estimator or base uses them
ONLY_FOR = {
    "momentum": lambda c: c["base"] == "sgd",
    "rho_prime": lambda c: "accelerated" in c["estimator"],
    "beta": lambda c: "accelerated" in c["estimator"],
    "gamma": lambda c: "accelerated" in c["estimator"],
    "gnp_radius": lambda c: "gnp" in c["estimator"],
    "gsam_alpha": lambda c: "gsam" in c["estimator"],
    "sam_rho": lambda c: "sam" in c["estimator"] or c["sam_rho"] > 0,
    "augment": lambda c: c["dataset"] not in ("mnist1d", "digits"),
}
# fields shown even where they keep Config's default
FLAGS = {"no_decay_1d", "pretrained"}
ALWAYS = {
    "estimator",
    "base",
    "lr",
    "weight_decay",
    "schedule",
    "epochs",
    "batch_size",
    "rho",
    "alpha",
}
DEFAULTS = Config()


def family_key(name: str, values: dict[str, Any]) -> str:
    """``hp1``, ``hp1/adamw``, ...: the first name component, and the base where it is not SGD in a
    family whose other presets use SGD."""
    head = name.split(".")[0]
    base = values.get("base", DEFAULTS.base)
    return head if base == "sgd" or head not in SPLIT_BY_BASE else f"{head}/{base}"


SPLIT_BY_BASE = {"hp1", "hp2", "transfer", "gsam"}


def families() -> dict[str, list[str]]:
    """Family key -> its preset names, in the registry's order."""
    out: dict[str, list[str]] = {}
    for name, values in PRESETS.items():
        out.setdefault(family_key(name, values), []).append(name)
    return out


def pattern(names: list[str]) -> str:
    """One name pattern for ``names``: ``hp1.{cifar10,cifar100}.resnet18``; the names themselves,
    comma-separated, where they are not a product of their components."""
    parts = [n.split(".") for n in names]
    if len({len(p) for p in parts}) != 1:
        return ", ".join(f"`{n}`" for n in names)
    columns = [list(dict.fromkeys(col)) for col in zip(*parts, strict=True)]
    size = 1
    for col in columns:
        size *= len(col)
    if size != len(names):
        return ", ".join(f"`{n}`" for n in names)
    text = ".".join(col[0] if len(col) == 1 else "{" + ",".join(col) + "}" for col in columns)
    return f"`{text}`"


def _value(key: str, v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if 0 < abs(v) < 1e-2:  # 5e-4, not 0.0005 or 5e-04
            mantissa, exponent = f"{v:.3e}".split("e")
            return f"{float(mantissa):g}e{int(exponent)}"
        return f"{v:.4g}"
    if isinstance(v, int) and v >= 10_000:
        return f"{v:,}"
    return str(v)


def _where(names: list[str], members: list[str]) -> str:
    """The name components that tell ``members`` apart from the rest of ``names``."""
    parts = [n.split(".") for n in names]
    varying = [i for i in range(len(parts[0])) if len({p[i] for p in parts}) > 1]
    # a single component that determines membership, if there is one
    for i in varying:
        inside = {n.split(".")[i] for n in members}
        outside = {n.split(".")[i] for n in names if n not in members}
        if not inside & outside:
            return ", ".join(dict.fromkeys(n.split(".")[i] for n in members))
    return ", ".join(".".join(n.split(".")[i] for i in varying) for n in members)


def settings(names: list[str]) -> str:
    """What the presets ``names`` set, field by field: one value, or each value with where it holds."""
    configs = [Config().__dict__ | PRESETS[n] for n in names]
    out = []
    for key, label in SHOWN.items():
        values = [c[key] for c in configs]
        if key in ONLY_FOR:
            if not any(ONLY_FOR[key](c) for c in configs):
                continue
        elif key not in ALWAYS and all(v == getattr(DEFAULTS, key) for v in values):
            continue  # Config's default (0, off, 1 for every) throughout: nothing to say
        if key == "epochs" and all(c["total_steps"] for c in configs):
            continue  # steps rule
        counts = Counter(_value(key, v) for v in values)
        common, n = counts.most_common(1)[0]
        if len(counts) == 1:
            text = common
        else:
            by_value: dict[str, list[str]] = {}
            for name, v in zip(names, values, strict=True):
                by_value.setdefault(_value(key, v), []).append(name)
            bare = common if n > len(names) / 2 else None
            text = ", ".join(
                v if v == bare else f"{v} ({_where(names, members)})"
                for v, members in by_value.items()
            )
        if key in FLAGS and text == "yes":  # a true flag is its label alone
            text = ""
        out.append(f"{label} {text}".strip())
    return "; ".join(out)


def markdown() -> str:
    """The table: family pattern, the paper's table or section, the settings."""
    rows = ["| presets | paper | settings |", "|---|---|---|"]
    order = {k: i for i, k in enumerate(SOURCES)}
    for key, names in sorted(families().items(), key=lambda kv: order.get(kv[0], len(order))):
        source = SOURCES.get(key, "–")
        rows.append(f"| {pattern(names)} | {source} | {settings(names)} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
