"""Every estimator of `reproduce.methods` side by side on MNIST-1D: test accuracy, λ_max, the
Hessian trace and the cost of a step as a multiple of the plain gradient step.

The cost is timed apart from training, all methods in one loop: each round times ``STEPS`` steps of
every method in turn on one fixed batch (a whole number of LookSAM and LookGAM cycles), so that
what else runs on the machine weighs on all of them alike; a method's cost is its median time per
step over the rounds divided by SGD's. It is CPU time on a tiny MLP, where Python's overhead is a
large share of a step: a ratio for this setting, not a GPU figure.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any

import torch

from reproduce.build import setup
from reproduce.data import sets as data_mod
from reproduce.evidence.common import (
    GAM,
    SAM_RHO,
    base_config,
    flatness,
    pm,
    probe_batch,
    table,
    train,
    write,
)

# label -> (the name of reproduce.methods, the config fields it sets on the mnist1d preset, whose
# ρ = 0.5, α = 1 are GAM's and whose SAM ρ = 0.2 is the radius of every SAM-like method and oracle;
# every other hyperparameter is the Config default, named in the table's text). ASAM runs with its
# authors' settings (ρ = 0.5, η = 0.01, T on the parameters named weight), GSAM's adaptive ascent
# with ASAM's ρ; WSAM decoupled is the atorch code's default form.
FAMILY: dict[str, tuple[str, dict[str, Any]]] = {
    "SGD": ("sgd", {}),
    "SAM": ("sam", {}),
    "SAM, 2 ascent steps": ("sam", dict(ascent_steps=2)),
    "ASAM": ("asam", dict(asam_mask="weights", sam_rho=0.5)),
    "GSAM": ("gsam", {}),
    "GSAM, adaptive": ("gsam", dict(gsam_adaptive=True, sam_rho=0.5)),
    "WSAM": ("wsam", {}),
    "WSAM, decoupled": ("wsam", dict(wsam_decouple=True)),
    "LookSAM": ("looksam", {}),
    "Friendly-SAM": ("friendly_sam", {}),
    "GNP": ("gnp", dict(alpha=0.1)),
    "GAM": ("gam", {}),
    "GAM, finite difference": ("gam_fd", dict(fd_radius=0.01)),
    "GAM, accelerated": ("gam_accelerated", {}),
    "LookGAM": ("look_gam", {}),
    "SAM+GAM": ("sam+gam", {}),
    "GSAM+GAM": ("gsam+gam", {}),
}
STEPS = 10  # steps per timed round: two cycles of k = 5
ROUNDS = (20, 3)  # timed rounds (full, --quick)


def family_config(base, label: str, seed: int):
    """``(estimator name, Config)`` of ``label`` (a key of `FAMILY`) with ``seed``."""
    name, fields = FAMILY[label]
    return name, dataclasses.replace(base, seed=seed, **{**GAM, "sam_rho": SAM_RHO, **fields})


def step_costs(configs: dict[str, tuple[str, Any]], rounds: int) -> dict[str, dict[str, float]]:
    """The median time of a step of each method over ``rounds`` rounds, the methods interleaved.

    Args:
        configs: label -> ``(estimator name, Config)``; ``"SGD"`` among them.
        rounds: the timed rounds (each of `STEPS` steps per method, after as many untimed).

    Returns:
        label -> ``{"ms_per_step": median, "x_gradient": median / SGD's median}``.
    """
    device = torch.device("cpu")
    live = {}
    for label, (name, cfg) in configs.items():
        data = data_mod.load(cfg)
        t = setup(cfg, name, data, device)
        x, y = data.train.tensors()
        live[label] = [t.step, t.params, t.state, (x[: cfg.batch_size], y[: cfg.batch_size])]
    times: dict[str, list[float]] = {label: [] for label in live}
    for r in range(rounds + 1):  # round 0 warms up and is not kept
        for label, entry in live.items():
            step, params, state, batch = entry
            start = time.perf_counter()
            for _ in range(STEPS):
                params, state, _ = step(params, state, batch)
            if r:
                times[label].append((time.perf_counter() - start) / STEPS)
            entry[1], entry[2] = params, state
    median = {label: statistics.median(ts) for label, ts in times.items()}
    return {
        label: {"ms_per_step": 1000 * m, "x_gradient": m / median["SGD"]}
        for label, m in median.items()
    }


def cmd_family(opt) -> None:
    """Every estimator: test accuracy, λ_max, Hessian trace, cost per step (× a gradient step)."""
    base = base_config(opt)
    runs: dict[str, list[dict[str, Any]]] = {}
    for label in FAMILY:
        runs[label] = []
        for seed in range(opt.seeds):
            name, cfg = family_config(base, label, seed)
            r = train(cfg, name)
            batch = probe_batch(r["data"].probe, opt.probe)
            flat = flatness(r["params"], r["buffers"], r["loss_fn"], batch, opt, seed)
            keep = ("train_acc", "test_acc", "gap", "step_ms")
            runs[label].append(
                dict({k: r[k] for k in keep}, seed=seed, lambda_max=flat["eigenvalues"][0],
                     trace=flat["trace"])
            )  # fmt: skip
            print(f"{label} seed {seed}: test {r['test_acc']:.1f}%", flush=True)
    configs = {label: family_config(base, label, 0) for label in FAMILY}
    cost = step_costs(configs, ROUNDS[1] if opt.quick else ROUNDS[0])
    estimators = {label: name for label, (name, _) in FAMILY.items()}
    hyper = {label: fields for label, (_, fields) in FAMILY.items()}
    record = {"runs": runs, "cost": cost, "estimators": estimators, "fields": hyper}
    write(opt.out, "family", family_table(record), record, opt)


def family_table(record: dict[str, Any]) -> str:
    """The markdown table of ``family``'s JSON: per method its estimator name, test accuracy, gap,
    λ_max and trace at the end (mean ± std over seeds) and its cost per step as a multiple of
    SGD's, timed on the CPU."""
    rows = []
    for label, rs in record["runs"].items():
        rows.append(
            [label, f"`{record['estimators'][label]}`", pm([r["test_acc"] for r in rs]),
             pm([r["gap"] for r in rs]), pm([r["lambda_max"] for r in rs]),
             pm([r["trace"] for r in rs], 1), f"{record['cost'][label]['x_gradient']:.1f}"]
        )  # fmt: skip
    header = [
        "method",
        "--estimator",
        "test acc %",
        "gap",
        "λ_max",
        "trace",
        "cost (× SGD step, CPU)",
    ]
    return table(header, rows)
