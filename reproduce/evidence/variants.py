"""Exact, finite-difference and accelerated GAM side by side: test accuracy, gap, λ_max and time
per step."""

from __future__ import annotations

import dataclasses
from typing import Any

from gamfunc import metrics
from reproduce.data import sets as data_mod
from reproduce.evidence.common import (
    GAM,
    base_config,
    eval_loss,
    pm,
    probe_batch,
    table,
    train,
    write,
)

VARIANTS = {
    "exact (jvp of grad)": ("gam", {}),
    "finite difference": ("gam_fd", {}),
    "accelerated, paper": ("gam_accelerated", {}),
    "accelerated, official": ("gam_accelerated_official", {}),
}


def cmd_variants(opt) -> None:
    """Exact, finite-difference and accelerated GAM: accuracy, λ_max, time per step."""
    base = dataclasses.replace(base_config(opt), **GAM)
    out: dict[str, list[dict[str, Any]]] = {}
    for label, (name, extra) in VARIANTS.items():
        out[label] = []
        for seed in range(opt.seeds):
            r = train(dataclasses.replace(base, seed=seed, **extra), name)
            batch = probe_batch(r["data"].probe, opt.probe)
            lam = metrics.top_eigenvalues(
                r["params"], batch, eval_loss(r["loss_fn"], r["buffers"]), k=1,
                iters=opt.iters, generator=data_mod.generator(seed, 14),
            )  # fmt: skip
            keys = ("train_acc", "test_acc", "gap", "step_ms")
            out[label].append(dict({k: r[k] for k in keys}, seed=seed, lambda_max=float(lam[0])))
    record = {"runs": out, "fd_radius": base.fd_radius}
    write(opt.out, "variants", variants_table(record), record, opt)


def variants_table(record: dict[str, Any]) -> str:
    """The markdown table of ``variants``' JSON: test accuracy, gap, λ_max and ms/step per GAM
    variant, mean ± std over seeds; the finite-difference row names its r."""
    rows = []
    for label, rs in record["runs"].items():
        if label == "finite difference" and "fd_radius" in record:
            label = f"{label} (r = {record['fd_radius']:g})"
        rows.append(
            [label, pm([r["test_acc"] for r in rs]), pm([r["gap"] for r in rs]),
             pm([r["lambda_max"] for r in rs]), pm([r["step_ms"] for r in rs], 1)]
        )  # fmt: skip
    header = ["GAM variant", "test acc %", "gap", "λ_max", "ms/step"]
    return table(header, rows)
