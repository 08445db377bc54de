"""Figure ablation-hyperparameter's claim: validation accuracy over a ρ × α grid of GAM (ρ = 0 is
GNP; with ``--sam-rho``, SAM+GAM around a SAM oracle), looped or vmapped."""

from __future__ import annotations

import dataclasses
from typing import Any

from reproduce.evidence.common import (
    base_config,
    mean_std,
    pm,
    table,
    train,
    train_together,
    write,
)


def cmd_ablation(opt) -> None:
    """Validation accuracy over a ρ × α grid; ρ = 0 is GNP (Figure ablation-hyperparameter)."""
    rhos = [float(x) for x in opt.rhos.split(",")]
    alphas = [float(x) for x in opt.alphas.split(",")]
    if opt.sam_rho < 0:
        raise ValueError(f"--sam-rho must be >= 0; got {opt.sam_rho}")
    if opt.sam_rho > 0 and 0 in rhos:
        raise ValueError(
            "--rhos must not contain 0 with --sam-rho (ρ = 0 is GNP, without an oracle)"
        )
    base = base_config(opt, val_fraction=0.1)
    runs = []  # (cell, estimator, config), cell by cell, seed by seed
    for rho in rhos:
        for alpha in alphas:
            for seed in range(opt.seeds):
                if rho == 0:  # no ascent: the gradient norm penalty, GNP's own α scale
                    cfg = dataclasses.replace(base, seed=seed, alpha=alpha)
                    name = "gnp"
                elif opt.sam_rho > 0:  # SAM+GAM: GAM's ρ, α around a SAM oracle of radius sam_rho
                    cfg = dataclasses.replace(
                        base, seed=seed, rho=rho, alpha=alpha, sam_rho=opt.sam_rho
                    )
                    name = "sam+gam"
                else:
                    cfg = dataclasses.replace(base, seed=seed, rho=rho, alpha=alpha)
                    name = "gam"
                runs.append(((rho, alpha), name, cfg))
    if opt.vmap:  # one vmapped step per estimator: GNP's cells (ρ = 0) and the others
        results: list[dict[str, Any]] = [{}] * len(runs)
        for est in dict.fromkeys(name for _, name, _ in runs):
            mine = [i for i, (_, name, _) in enumerate(runs) if name == est]
            for i, r in zip(mine, train_together([runs[i][2] for i in mine], est), strict=True):
                results[i] = r
    else:
        results = [train(cfg, name) for _, name, cfg in runs]
    grid: dict[str, dict[str, Any]] = {}
    for ((rho, alpha), _, _), r in zip(runs, results, strict=True):
        cell = grid.setdefault(f"{rho},{alpha}", dict(rho=rho, alpha=alpha, val=[], test=[]))
        cell["val"].append(r["val_acc"])
        cell["test"].append(r["test_acc"])
    record = {"grid": grid}
    settings = dict(rhos=opt.rhos, alphas=opt.alphas, sam_rho=opt.sam_rho, vmap=opt.vmap)
    write(opt.out, "ablation", ablation_table(record | {"settings": settings}), record, opt)


def ablation_table(record: dict[str, Any]) -> str:
    """The markdown of ``ablation``'s JSON: validation accuracy per (ρ, α) cell, mean ± std over
    seeds, and the best cell on validation with its test accuracy."""
    settings, grid = record["settings"], record["grid"]
    rhos = [float(x) for x in settings["rhos"].split(",")]
    alphas = [float(x) for x in settings["alphas"].split(",")]
    header = ["ρ \\ α"] + [f"α = {a:g}" for a in alphas]
    rows = [
        [f"ρ = {rho:g}" + (" (GNP)" if rho == 0 else "")]
        + [pm(grid[f"{rho},{a}"]["val"], 1) for a in alphas]
        for rho in rhos
    ]
    best = max(grid.values(), key=lambda g: mean_std(g["val"])[0])
    oracle = ""
    if settings["sam_rho"] > 0:
        oracle = f", SAM+GAM around a SAM ρ = {settings['sam_rho']:g} oracle"
    if settings["vmap"]:
        oracle += "; every seed on seed 0's split and batches, one vmapped step per estimator"
    return (
        f"Validation accuracy % (10% of the training set held out{oracle}):\n\n"
        + table(header, rows)
        + f"\nBest on validation: ρ = {best['rho']:g}, α = {best['alpha']:g} "
        f"(test {pm(best['test'], 1)}%).\n"
    )
