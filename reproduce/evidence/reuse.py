"""LookGAM measured: GAM's correction reused for k steps (``look_gam``) against GAM every k-th step
with plain gradient steps between (``make_step(every=k)``) and full GAM, at equal cost.

Cost is counted in passes, each a gradient or a forward-mode H·v: exact GAM's step takes four (two
gradients and two H·v, `gamfunc.gam`'s docstring), a gradient step one. LookGAM and GAM with
``every=k`` take the same passes, (4 + (k − 1))/k per step, so they are compared over the same
epochs; full GAM is given the same passes by training ``epochs·(4 + k − 1)/(4k)`` epochs (rounded),
and is shown at the full epochs too, at its own, higher cost. The training seconds of each row show
what that count means on the clock here.
"""

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

K = 5  # LookSAM's period (Liu et al. 2022) and the look_k default
GAM_PASSES = 4  # exact GAM with the plain oracle: two gradients and two H·v


def passes_per_step(k: int) -> float:
    """The passes of a step of LookGAM (or GAM with ``every=k``), averaged over its cycle."""
    return (GAM_PASSES + k - 1) / k


def rows(epochs: int, k: int) -> dict[str, tuple[str, dict[str, Any], float]]:
    """label -> ``(estimator name, config fields, passes per step)`` of each compared run."""
    equal = max(1, round(epochs * passes_per_step(k) / GAM_PASSES))
    cycle = passes_per_step(k)
    return {
        f"LookGAM, k = {k}": ("look_gam", dict(look_k=k), cycle),
        f"GAM every {k}th step, gradient between": ("gam", dict(every=k), cycle),
        f"GAM, {equal} epochs (equal passes)": ("gam", dict(epochs=equal), GAM_PASSES),
        f"GAM, {epochs} epochs": ("gam", {}, GAM_PASSES),
        "SGD": ("sgd", {}, 1.0),
    }


def cmd_reuse(opt) -> None:
    """LookGAM against GAM every k-th step and full GAM at equal passes: accuracy, λ_max."""
    base = dataclasses.replace(base_config(opt), **GAM)
    out: dict[str, list[dict[str, Any]]] = {}
    passes = {}
    for label, (name, fields, per_step) in rows(opt.epochs, K).items():
        out[label] = []
        for seed in range(opt.seeds):
            cfg = dataclasses.replace(base, seed=seed, **fields)
            r = train(cfg, name)
            batch = probe_batch(r["data"].probe, opt.probe)
            lam = metrics.top_eigenvalues(
                r["params"], batch, eval_loss(r["loss_fn"], r["buffers"]), k=1,
                iters=opt.iters, generator=data_mod.generator(seed, 14),
            )  # fmt: skip
            keep = ("train_acc", "test_acc", "gap", "seconds")
            out[label].append(dict({k: r[k] for k in keep}, seed=seed, lambda_max=float(lam[0])))
            print(f"{label} seed {seed}: test {r['test_acc']:.1f}%", flush=True)
        passes[label] = per_step * cfg.epochs * (len(r["data"].train) // cfg.batch_size)
    record = {"runs": out, "passes": passes, "k": K}
    write(opt.out, "reuse", reuse_table(record), record, opt)


def reuse_table(record: dict[str, Any]) -> str:
    """The markdown table of ``reuse``'s JSON: per run its passes in all (gradients and H·v), test
    accuracy, gap, λ_max and training seconds, mean ± std over seeds."""
    out = []
    for label, rs in record["runs"].items():
        out.append(
            [label, f"{record['passes'][label]:,.0f}", pm([r["test_acc"] for r in rs]),
             pm([r["gap"] for r in rs]), pm([r["lambda_max"] for r in rs]),
             pm([r["seconds"] for r in rs], 1)]
        )  # fmt: skip
    header = ["run", "passes", "test acc %", "gap", "λ_max", "train s (CPU)"]
    return table(header, out)
