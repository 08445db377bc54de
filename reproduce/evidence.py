"""The paper's claims measured in miniature on MNIST-1D: one subcommand per table or figure.

MNIST-1D (Greydanus 2020) is generated offline by the ``mnist1d`` package (4,000 training and 1,000
test vectors), so every number here can be re-made without a download. Each subcommand trains with
:func:`reproduce.train.setup` (the same model, loss, schedule and ``gamfunc.make_step`` as
``reproduce/train.py``), measures with :mod:`gamfunc.metrics`, and writes a markdown table
(``<name>.md``), the raw numbers (``<name>.json``) and PNG figures into ``--out``
(default ``runs/evidence/<name>``)::

    python reproduce/evidence.py spectra     # top-50 Hessian eigenvalues and trace (Section 5.4)
    python reproduce/evidence.py accuracy    # test accuracy and generalisation gap (Table cifar2)
    python reproduce/evidence.py noise       # label noise 20/40/60/80% (Appendix C.2)
    python reproduce/evidence.py minima      # local minima within ρ along 100 directions (Section 5.1)
    python reproduce/evidence.py landscape   # 2-D filter-normalised landscapes (Figure vis)
    python reproduce/evidence.py ablation    # ρ × α grid, ρ = 0 is GNP (Figure ablation-hyperparameter)
    python reproduce/evidence.py variants    # exact vs finite-difference vs accelerated GAM
    python reproduce/evidence.py fd          # why finite-difference GAM collapses on a ReLU MLP
    python reproduce/evidence.py spectra --quick   # any of them in under a minute (what the tests run)
    python reproduce/evidence.py ablation --vmap   # the grid × seeds as one vmapped step per estimator

``--vmap`` (``ablation``, ``accuracy``, ``noise``) trains the runs of one estimator together, as the
members of one vmapped step (:mod:`reproduce.sweeps.vmapped`): the seeds differ in initialisation, and every
run sees the validation split and batches of seed 0 (without ``--vmap`` each seed draws its own), so
the numbers differ from the looped table's by that, not by method. ``ms/step`` is then the vmapped
step's time over its members. reproduce/RESULTS.md has the wall time of both.

Methods and hyperparameters: SGD (lr 0.05, momentum 0.9, weight decay 5e-4, cosine, batch 100),
GAM ρ = 0.5, α = 1 (the ``mnist1d`` preset of :mod:`reproduce.config`, chosen on a validation
split; ``--gam=ρ,α`` replaces them), SAM ρ = 0.2, SAM+GAM (GAM's ρ, α around a SAM ρ = 0.2 oracle;
``--sam-gam=ρ,α`` replaces GAM's 0.5, 1 there, e.g. with 0.2, 0.1, the best validation accuracy of
``ablation --rhos=0.05,0.1,0.2 --alphas=0.1,0.3,1 --sam-rho=0.2 --epochs=30 --seeds=2``) and GNP
(Zhao et al. 2022: gradient norm penalty with a finite-difference H·v, r = 0.01) with α =
``--gnp-alpha`` = 0.1, the best validation accuracy of ``ablation --rhos=0 --alphas=0.05,0.1,0.2,0.5,1
--epochs=30 --seeds=2``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `reproduce` and `gamfunc` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from gamfunc import hvps, metrics, tree
from gamfunc.loss import gradient_pass
from reproduce.build import setup
from reproduce.config import resolve
from reproduce.data import sets as data_mod
from reproduce.run import report
from reproduce.run.evaluation import evaluate
from reproduce.sweeps import vmapped

__all__ = ["METHODS", "SUBCOMMANDS", "TABLES", "main", "method_config", "train"]

# Estimator of reproduce.train.build_estimator and the config fields each method sets.
GAM = dict(rho=0.5, alpha=1.0)
SAM_RHO = 0.2
METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "SGD": ("sgd", {}),
    "SGD+GAM": ("gam", GAM),
    "SAM": ("sam", dict(rho=SAM_RHO)),
    "SAM+GAM": ("sam+gam", dict(**GAM, sam_rho=SAM_RHO)),
    "GNP": ("gnp", {}),  # alpha from --gnp-alpha
}
FOUR = ("SGD", "SGD+GAM", "SAM", "SAM+GAM")


# ---------------------------------------------------------------- training


def method_config(base, method: str, seed: int, gnp_alpha: float, sam_gam=None, gam=None, **extra):
    """``(estimator name, Config)`` of ``method`` (a key of METHODS) with ``seed`` and ``extra``;
    ``gam = (ρ, α)`` replaces GAM's ρ, α in SGD+GAM, ``sam_gam = (ρ, α)`` those of SAM+GAM (whose
    SAM oracle keeps ρ = SAM_RHO)."""
    name, fields = METHODS[method]
    fields = dict(fields)
    if method == "GNP":
        fields["alpha"] = gnp_alpha
    if method == "SAM+GAM" and sam_gam is not None:
        fields["rho"], fields["alpha"] = sam_gam
    if method == "SGD+GAM" and gam is not None:
        fields["rho"], fields["alpha"] = gam
    return name, dataclasses.replace(base, seed=seed, **fields, **extra)


def probe_batch(examples, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``size`` examples of ``examples`` as one batch (the fixed batch of every metric)."""
    x, y = examples.tensors()
    return x[:size], y[:size]


def train(cfg, name: str, *, on_epoch=None) -> dict[str, Any]:
    """Train estimator ``name`` under ``cfg`` on MNIST-1D; ``on_epoch(epoch, params, buffers, loss_fn)``
    runs after each epoch. Returns params, buffers, loss_fn, accuracies, seconds and seconds per step."""
    device = torch.device("cpu")
    data = data_mod.load(cfg)
    t = setup(cfg, name, data, device)
    params, state = t.params, t.state
    steps, seconds = 0, 0.0
    for epoch in range(cfg.epochs):
        order = data_mod.epoch_order(len(data.train), cfg.seed, epoch)
        batches = data_mod.train_batches(
            data.train, order, 0, cfg.batch_size, seed=cfg.seed, epoch=epoch
        )
        clock = time.perf_counter()
        for batch in batches:
            params, state, _ = t.step(params, state, batch)
            steps += 1
        seconds += time.perf_counter() - clock
        if on_epoch is not None:
            on_epoch(epoch, params, state.buffers, t.loss_fn)
    buffers = state.buffers

    def acc(examples):
        if examples is None:
            return None
        batches = data_mod.eval_batches(examples, cfg.eval_batch_size)
        return evaluate(t.loss_fn, params, buffers, batches, device)["acc"]

    train_acc, test_acc, val_acc = acc(data.probe), acc(data.test), acc(data.val)
    return dict(
        params=params,
        buffers=buffers,
        loss_fn=t.loss_fn,
        data=data,
        train_acc=train_acc,
        test_acc=test_acc,
        val_acc=val_acc,
        gap=train_acc - test_acc,
        seconds=seconds,
        step_ms=1000 * seconds / max(steps, 1),
        skipped=int(state.skipped),
    )


def train_together(cfgs, name: str) -> list[dict[str, Any]]:
    """The runs ``cfgs`` of estimator ``name`` (differing in seed, lr, ρ, α) as one vmapped step
    (:func:`reproduce.sweeps.vmapped.train`), every run on the split and batches of ``cfgs[0]``'s seed.
    Returns :func:`train`'s records without params: accuracies, gap, seconds, and ``step_ms``, the
    vmapped step's time over the number of runs."""
    cfgs = [dataclasses.replace(c, eval_train=True) for c in cfgs]
    data = data_mod.load(cfgs[0])
    seed = cfgs[0].seed
    body = vmapped.train(cfgs, name, data, "cpu", data_seed=seed, say=lambda line: None)
    seconds, steps = body["pos"]["seconds"], max(body["pos"]["step"], 1)
    out = []
    for summary in body["summaries"]:
        f = summary["final"]
        out.append(
            dict(
                train_acc=f["train_eval_acc"],
                test_acc=f["test_acc"],
                val_acc=f.get("val_acc"),
                gap=f["train_eval_acc"] - f["test_acc"],
                seconds=seconds,
                step_ms=1000 * seconds / steps / len(cfgs),
                skipped=sum(h["skipped_steps"] for h in summary["history"]),
            )
        )
    return out


def eval_loss(loss_fn, buffers):
    """``L(params, batch)`` in eval mode with the running statistics ``buffers`` (for the metrics)."""
    return lambda p, b: loss_fn(p, b, buffers, train=False)[0]


def flatness(params, buffers, loss_fn, batch, opt, seed: int) -> dict[str, Any]:
    """Top-k Hessian eigenvalues (Lanczos) and Hutchinson trace on ``batch``."""
    loss = eval_loss(loss_fn, buffers)
    gen = lambda k: data_mod.generator(seed, 11, k)  # noqa: E731
    eig = metrics.top_eigenvalues(params, batch, loss, k=opt.k, iters=opt.iters, generator=gen(1))
    tr = metrics.hessian_trace(params, batch, loss, samples=opt.trace_samples, generator=gen(2))
    return dict(eigenvalues=[float(v) for v in eig], trace=float(tr))


# ---------------------------------------------------------------- tables and output


def mean_std(values) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    t = torch.tensor([float(v) for v in values], dtype=torch.float64)
    std = float(t.std()) if len(t) > 1 else 0.0
    return float(t.mean()), std


def pm(values, digits: int = 2) -> str:
    m, s = mean_std(values)
    return f"{m:.{digits}f} ± {s:.{digits}f}"


def table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write(out: Path, name: str, md: str, record: dict[str, Any], opt) -> None:
    """``<out>/<name>.md`` (the table, the command, run time, device) and ``<out>/<name>.json``."""
    record = dict(record, command=" ".join(sys.argv), seconds=time.perf_counter() - opt.started)
    record["settings"] = {k: v for k, v in vars(opt).items() if k not in ("func", "started", "out")}
    record["device"] = f"CPU, torch threads: {torch.get_num_threads()}"
    head = (
        f"# {name}\n\n`{record['command']}` — {record['seconds']:.0f} s on {record['device']}\n\n"
    )
    (out / f"{name}.md").write_text(head + md)
    report.write_json(out / f"{name}.json", record)
    print(head + md, flush=True)


def png(name: str) -> str:
    return name.replace("+", "_").replace(" ", "_").lower()


def base_config(opt, **extra):
    """The ``mnist1d`` preset with the model, epochs and threads of ``opt`` (no TensorBoard, no flatness)."""
    cfg = resolve([f"--model={opt.model}", f"--epochs={opt.epochs}"])
    return dataclasses.replace(cfg, **extra)


# ---------------------------------------------------------------- subcommands


def run_grid(opt, methods, *, spectra: bool, **extra) -> dict[str, list[dict[str, Any]]]:
    """Every method × seed; with ``spectra``, eigenvalues and trace at mid-training and at the end."""
    base = base_config(opt, **extra)
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    for method in methods:
        named = [
            method_config(base, method, seed, opt.gnp_alpha, opt.sam_gam, opt.gam)
            for seed in range(opt.seeds)
        ]
        together = train_together([c for _, c in named], named[0][0]) if opt.vmap else None
        for seed, (name, cfg) in enumerate(named):
            if together is not None:
                rec = {k: together[seed][k] for k in ("train_acc", "test_acc", "val_acc", "gap")}
                runs[method].append(rec | {"step_ms": together[seed]["step_ms"], "seed": seed})
                print(f"{method} seed {seed}: test {rec['test_acc']:.1f}% (vmapped)", flush=True)
                continue
            mid: dict[str, Any] = {}
            half = max(cfg.epochs // 2, 1) - 1

            def on_epoch(epoch, params, buffers, loss_fn, cfg=cfg, mid=mid, half=half):
                if spectra and epoch == half and epoch != cfg.epochs - 1:
                    batch = probe_batch(data_mod.load(cfg).probe, opt.probe)
                    mid.update(flatness(params, buffers, loss_fn, batch, opt, cfg.seed))

            r = train(cfg, name, on_epoch=on_epoch)
            rec = {k: r[k] for k in ("train_acc", "test_acc", "val_acc", "gap", "step_ms")}
            rec["seed"] = seed
            if spectra:
                batch = probe_batch(r["data"].probe, opt.probe)
                end = flatness(r["params"], r["buffers"], r["loss_fn"], batch, opt, seed)
                rec["end"] = end
                rec["mid"] = mid or end
            runs[method].append(rec)
            print(f"{method} seed {seed}: test {rec['test_acc']:.1f}%", flush=True)
    return runs


def accuracy_rows(runs) -> list[list[str]]:
    return [
        [m, pm([r["train_acc"] for r in rs]), pm([r["test_acc"] for r in rs]),
         pm([r["gap"] for r in rs]), f"{mean_std([r['step_ms'] for r in rs])[0]:.1f}"]
        for m, rs in runs.items()
    ]  # fmt: skip


ACC_HEADER = ["method", "train acc %", "test acc %", "gap (train − test)", "ms/step"]


def cmd_spectra(opt) -> None:
    """Top-k Hessian eigenvalues and trace at mid-training and the end, five methods (Section 5.4)."""
    runs = run_grid(opt, opt.methods, spectra=True)
    rows = []
    for m, rs in runs.items():
        cells = [m]
        for phase in ("mid", "end"):
            cells += [
                pm([r[phase]["eigenvalues"][0] for r in rs]),
                pm([sum(r[phase]["eigenvalues"]) / len(r[phase]["eigenvalues"]) for r in rs]),
                pm([r[phase]["trace"] for r in rs], 1),
            ]
        rows.append(cells)
        for phase in ("mid", "end"):
            values = torch.tensor([v for r in rs for v in r[phase]["eigenvalues"]])
            path = opt.out / f"spectra_{png(m)}_{phase}.png"
            title = f"{m}, top-{opt.k} eigenvalues, {'mid-training' if phase == 'mid' else 'end'}"
            metrics.plot.plot_eigenvalues(values, path, title=title, dpi=80)
    header = ["method"] + [
        f"{c} ({p})" for p in ("mid", "end") for c in ("λ_max", f"mean top-{opt.k}", "trace")
    ]
    md = table(header, rows) + "\n" + table(ACC_HEADER, accuracy_rows(runs))
    write(opt.out, "spectra", md, {"runs": runs}, opt)


def spectra_table(record: dict[str, Any]) -> str:
    """The markdown tables of ``spectra``'s JSON (the text ``spectra`` prints): λ_max, the mean of
    the top k and the trace at mid-training and at the end per method, mean ± std over seeds, then
    the accuracy table of the same runs."""
    rows = []
    for m, rs in record["runs"].items():
        cells = [m]
        for phase in ("mid", "end"):
            cells += [
                pm([r[phase]["eigenvalues"][0] for r in rs]),
                pm([sum(r[phase]["eigenvalues"]) / len(r[phase]["eigenvalues"]) for r in rs]),
                pm([r[phase]["trace"] for r in rs], 1),
            ]
        rows.append(cells)
    k = record["settings"]["k"]
    header = ["method"] + [
        f"{c} ({p})" for p in ("mid", "end") for c in ("λ_max", f"mean top-{k}", "trace")
    ]
    return table(header, rows) + "\n" + accuracy_table(record)


def cmd_accuracy(opt) -> None:
    """Train/test accuracy and generalisation gap of the five methods (Table cifar2)."""
    source = Path(opt.reuse) if opt.reuse else None
    if source is not None and source.is_file():
        runs = json.loads(source.read_text())["runs"]
    else:
        runs = run_grid(opt, opt.methods, spectra=False)
    write(opt.out, "accuracy", table(ACC_HEADER, accuracy_rows(runs)), {"runs": runs}, opt)


def accuracy_table(record: dict[str, Any]) -> str:
    """The markdown table of ``accuracy``'s JSON (or of ``spectra``'s runs): train and test
    accuracy, gap and ms/step per method."""
    return table(ACC_HEADER, accuracy_rows(record["runs"]))


def cmd_noise(opt) -> None:
    """Test accuracy under 20/40/60/80% label noise (Appendix C.2)."""
    levels = [float(x) for x in opt.levels.split(",")]
    runs = {f"{p:.0%}": run_grid(opt, list(FOUR), spectra=False, label_noise=p) for p in levels}
    header = ["label noise"] + [f"{m} test %" for m in FOUR]
    rows = [[lvl] + [pm([r["test_acc"] for r in by[m]]) for m in FOUR] for lvl, by in runs.items()]
    write(opt.out, "noise", table(header, rows), {"runs": runs}, opt)


def noise_table(record: dict[str, Any]) -> str:
    """The markdown table of ``noise``'s JSON: test accuracy per label-noise level and method."""
    header = ["label noise"] + [f"{m} test %" for m in FOUR]
    rows = [
        [lvl] + [pm([r["test_acc"] for r in by[m]]) for m in FOUR]
        for lvl, by in record["runs"].items()
    ]
    return table(header, rows)


MINIMA_METHODS = ("SGD", "SAM", "SGD+GAM")


def minima_table(record: dict[str, Any]) -> str:
    """The markdown table of ``minima``'s JSON: extrema per direction, mean ± std over seeds."""

    def share(r, k: int) -> float:  # % of directions with at least k minima
        return 100 * sum(x >= k for x in r["minima"]) / len(r["minima"])

    rows = []
    for m, rs in record["runs"].items():
        rows.append(
            [m, pm([sum(r["minima"]) / len(r["minima"]) for r in rs], 3),
             pm([share(r, 1) for r in rs], 1), pm([share(r, 2) for r in rs], 1),
             pm([sum(r["maxima"]) / len(r["maxima"]) for r in rs], 3),
             ", ".join(f"{r['test_acc']:.1f}" for r in rs)]
        )  # fmt: skip
    header = [
        "method",
        "minima per direction",
        "directions with ≥ 1 minimum %",
        "directions with ≥ 2 minima %",
        "maxima per direction",
        "test acc % (per seed)",
    ]
    return table(header, rows)


def cmd_minima(opt) -> None:
    """Local minima and maxima within ρ along random directions, SGD, SAM and GAM (Section 5.1)."""
    base = base_config(opt)
    out: dict[str, list[dict[str, Any]]] = {}
    for method in MINIMA_METHODS:
        out[method] = []
        for seed in range(opt.seeds):
            name, cfg = method_config(base, method, seed, opt.gnp_alpha, opt.sam_gam, opt.gam)
            r = train(cfg, name)
            batch = probe_batch(r["data"].probe, opt.probe)
            d = metrics.minima_density(
                r["params"], batch, eval_loss(r["loss_fn"], r["buffers"]), opt.radius,
                directions=opt.directions, steps=10, generator=data_mod.generator(seed, 12),
            )  # fmt: skip
            out[method].append(
                dict(seed=seed, minima=d.minima.tolist(), maxima=d.maxima.tolist(),
                     test_acc=r["test_acc"])
            )  # fmt: skip
            if seed == 0:
                title = f"{method}: extrema within ρ = {opt.radius}"
                metrics.plot.plot_minima_density(
                    d, opt.out / f"minima_{png(method)}.png", title=title, dpi=80
                )
    record = {"runs": out}
    write(opt.out, "minima", minima_table(record), record, opt)


def landscape_table(record: dict[str, Any]) -> str:
    """The markdown table of ``landscape``'s JSON: the loss at θ, the largest loss on the inner
    half of the grid ((α, β) in [-0.5, 0.5]²) and the mean over the whole grid."""
    rows = []
    for method, land in record["landscapes"].items():
        z = torch.tensor(land["losses"], dtype=torch.float64)
        points = len(z)
        c, h = points // 2, points // 4
        inner = z[c - h : c + h + 1, c - h : c + h + 1].amax()
        rows.append(
            [method, f"{float(z[c, c]):.4f}", f"{float(inner):.3f}", f"{float(z.mean()):.3f}"]
        )
    header = ["method", "loss at θ", "max loss on [-0.5, 0.5]²", "mean loss on [-1, 1]²"]
    return table(header, rows)


def cmd_landscape(opt) -> None:
    """2-D filter-normalised loss landscapes of the four optimisers (Figure vis)."""
    base = base_config(opt)
    rec = {}
    for method in FOUR:
        name, cfg = method_config(base, method, 0, opt.gnp_alpha, opt.sam_gam, opt.gam)
        r = train(cfg, name)
        batch = probe_batch(r["data"].probe, opt.probe)
        land = metrics.landscape_2d(
            r["params"], batch, eval_loss(r["loss_fn"], r["buffers"]),
            span=(-1.0, 1.0), points=opt.points, generator=data_mod.generator(0, 13),
        )  # fmt: skip
        rec[method] = dict(losses=land.losses.tolist(), alphas=land.alphas.tolist())
        metrics.plot.plot_landscape(
            land, opt.out / f"landscape_{png(method)}.png", title=method, log=True, dpi=80
        )
    record = {"landscapes": rec}
    write(opt.out, "landscape", landscape_table(record), record, opt)


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


# ---------------------------------------------------------------- finite-difference GAM on ReLU

ACTIVATION_OF = {"mlp": torch.relu, "mlp_gelu": torch.nn.functional.gelu}


def hidden_preactivations(model: str, params, x: torch.Tensor) -> list[torch.Tensor]:
    """The pre-activations ``[z1, z2]`` (examples × 100) of the two hidden layers of an MLP."""
    act = ACTIVATION_OF[model]
    z1 = x @ params["net.0.weight"].T + params["net.0.bias"]
    z2 = act(z1) @ params["net.2.weight"].T + params["net.2.bias"]
    return [z1, z2]


def dead_units(model: str, params, x: torch.Tensor) -> list[float]:
    """Per hidden layer, the % of units whose pre-activation is <= 0 on every example of ``x``
    (for ReLU: units with zero output and zero gradient on the whole batch)."""
    return [
        100 * float((z <= 0).all(0).float().mean()) for z in hidden_preactivations(model, params, x)
    ]


def hvp_error(model: str, params, batch, loss, rho: float, radii) -> dict[float, dict[str, float]]:
    """At GAM's θ_adv = θ + ρ·f/‖f‖ (f = H·g/‖g‖ exact) and v = ∇L(θ_adv)/‖∇L(θ_adv)‖, the fd
    H·v ≈ (∇L(θ_adv + r·v) − ∇L(θ_adv))/r (paper Appendix D) against the exact (jvp) H·v, per r:
    cosine, norm ratio ‖fd‖/‖exact‖, the number of (example, unit) pre-activations whose sign flips
    between θ_adv and θ_adv + r·v, and ``push``: the mean over the second layer's biases of fd − exact,
    in units of the rms of exact's (> 0: a descent step lowers those biases, i.e. turns units off)."""
    f, _ = hvps.grad_norm_grad(loss, params, batch, hvps.exact)
    adv = tree.axpy(rho, tree.normalize(f)[0], params)
    v = tree.normalize(gradient_pass(loss, adv, batch).grad)[0]
    exact, _ = hvps.exact(loss, adv, batch, v)
    signs = [z > 0 for z in hidden_preactivations(model, adv, batch[0])]
    out = {}
    for r in radii:
        fd, _ = hvps.fd(r)(loss, adv, batch, v)
        moved = hidden_preactivations(model, tree.axpy(r, v, adv), batch[0])
        bias = fd["net.2.bias"] - exact["net.2.bias"]
        rms = float(exact["net.2.bias"].pow(2).mean().sqrt())
        out[r] = dict(
            cos=float(tree.vdot(fd, exact) / (tree.norm(fd) * tree.norm(exact))),
            ratio=float(tree.norm(fd) / tree.norm(exact)),
            flips=sum(int(((z > 0) != s).sum()) for z, s in zip(moved, signs, strict=True)),
            push=float(bias.mean()) / rms if rms > 0 else 0.0,
        )
    return out


def cmd_fd(opt) -> None:
    """Finite-difference vs exact GAM on ReLU and GELU MLPs: dead units and the error of fd H·v."""
    radii = [float(x) for x in opt.radii.split(",")]
    if not radii or min(radii) <= 0:
        raise ValueError(f"--radii must be numbers > 0; got {opt.radii!r}")
    runs: dict[str, list[dict[str, Any]]] = {}
    errors: dict[str, dict[int, list]] = {}
    last = opt.epochs - 1
    checkpoints = sorted({0, max(opt.epochs // 10, 1) - 1, max(opt.epochs // 2, 1) - 1, last})
    for model in ACTIVATION_OF:
        base = dataclasses.replace(base_config(opt, model=model), **GAM)
        for r in [None, *radii]:
            if model != "mlp" and r not in (None, 1e-3, min(radii)):
                continue  # the smooth net: exact, fd at the variants' r = 1e-3 and the smallest r
            label = f"{model}, " + ("exact" if r is None else f"fd r = {r:g}")
            runs[label] = []
            for seed in range(opt.seeds):
                cfg = dataclasses.replace(base, seed=seed, fd_radius=r or base.fd_radius)
                x, y = probe_batch(data_mod.load(cfg).probe, opt.probe)
                dead: list[list[float]] = []
                probe_err = r is None and seed == 0

                def on_epoch(
                    epoch,
                    params,
                    buffers,
                    loss_fn,
                    x=x,
                    y=y,
                    dead=dead,
                    probe_err=probe_err,
                    model=model,
                ):
                    dead.append(dead_units(model, params, x))
                    if probe_err and epoch in checkpoints:
                        loss = eval_loss(loss_fn, buffers)
                        errors.setdefault(model, {})[epoch + 1] = [
                            hvp_error(model, params, (x[i : i + 100], y[i : i + 100]), loss,
                                      GAM["rho"], radii)
                            for i in range(0, len(x) - 99, 100)
                        ]  # fmt: skip

                res = train(cfg, "gam" if r is None else "gam_fd", on_epoch=on_epoch)
                lam = metrics.top_eigenvalues(
                    res["params"], (x, y), eval_loss(res["loss_fn"], res["buffers"]), k=1,
                    iters=opt.iters, generator=data_mod.generator(seed, 14),
                )  # fmt: skip
                keys = ("train_acc", "test_acc", "step_ms")
                runs[label].append(
                    dict({k: res[k] for k in keys}, seed=seed, dead=dead, lambda_max=float(lam[0]))
                )
                print(f"{label} seed {seed}: test {res['test_acc']:.1f}%", flush=True)
    early = min(max(opt.epochs // 10, 1), opt.epochs) - 1
    rows = [
        [label, pm([r["train_acc"] for r in rs], 1), pm([r["test_acc"] for r in rs], 1),
         pm([r["dead"][early][1] for r in rs], 1), pm([r["dead"][-1][0] for r in rs], 1),
         pm([r["dead"][-1][1] for r in rs], 1), pm([r["lambda_max"] for r in rs])]
        for label, rs in runs.items()
    ]  # fmt: skip
    header = [
        "GAM (ρ = 0.5, α = 1)", "train acc %", "test acc %", f"dead layer 2 % (epoch {early + 1})",
        "dead layer 1 % (end)", "dead layer 2 % (end)", "λ_max",
    ]  # fmt: skip
    md = "Training (dead: pre-activation <= 0 on every probe example):\n\n" + table(header, rows)

    def med(values) -> float:
        return float(torch.tensor(values, dtype=torch.float64).median())

    for model, by_epoch in errors.items():
        rows = []
        for epoch, batches in by_epoch.items():
            cells = [f"{epoch}"]
            for r in radii:
                e = [b[r] for b in batches]
                cells.append(
                    f"{med([x['cos'] for x in e]):.2f} / {med([x['ratio'] for x in e]):.2f} / "
                    f"{max(x['ratio'] for x in e):.1f} / {sum(x['flips'] for x in e) / len(e):.1f}"
                )
            rows.append(cells)
        push = [
            f"{sum(b[r]['push'] for bs in by_epoch.values() for b in bs) / sum(map(len, by_epoch.values())):+.2f}"
            for r in radii
        ]
        rows.append(["push (mean)", *push])
        md += (
            f"\n{model}, along exact GAM (seed 0), at θ_adv on {opt.probe // 100} batches of 100: "
            "median cos / median ‖fd‖/‖exact‖ / max ‖fd‖/‖exact‖ / sign flips per batch:\n\n"
            + table(["epoch"] + [f"r = {r:g}" for r in radii], rows)
        )
    record = {
        "runs": runs,
        "hvp_error": {m: {str(k): v for k, v in e.items()} for m, e in errors.items()},
    }
    write(opt.out, "fd", md, record, opt)


def fd_table(record: dict[str, Any]) -> str:
    """The markdown of ``fd``'s JSON: the training table (accuracy, dead units, λ_max) and, per
    model, the error of fd H·v along exact GAM (the same text ``fd`` prints)."""
    settings = record["settings"]
    radii = [float(x) for x in settings["radii"].split(",")]
    epochs = settings["epochs"]
    early = min(max(epochs // 10, 1), epochs) - 1
    rows = [
        [label, pm([r["train_acc"] for r in rs], 1), pm([r["test_acc"] for r in rs], 1),
         pm([r["dead"][early][1] for r in rs], 1), pm([r["dead"][-1][0] for r in rs], 1),
         pm([r["dead"][-1][1] for r in rs], 1), pm([r["lambda_max"] for r in rs])]
        for label, rs in record["runs"].items()
    ]  # fmt: skip
    header = [
        "GAM (ρ = 0.5, α = 1)", "train acc %", "test acc %", f"dead layer 2 % (epoch {early + 1})",
        "dead layer 1 % (end)", "dead layer 2 % (end)", "λ_max",
    ]  # fmt: skip
    md = "Training (dead: pre-activation <= 0 on every probe example):\n\n" + table(header, rows)
    for model, by_epoch in record["hvp_error"].items():
        rows = []
        for epoch, batches in by_epoch.items():
            cells = [epoch]
            for r in radii:
                e = [b[str(r)] for b in batches]
                cos = float(torch.tensor([x["cos"] for x in e], dtype=torch.float64).median())
                ratio = float(torch.tensor([x["ratio"] for x in e], dtype=torch.float64).median())
                cells.append(
                    f"{cos:.2f} / {ratio:.2f} / {max(x['ratio'] for x in e):.1f} / "
                    f"{sum(x['flips'] for x in e) / len(e):.1f}"
                )
            rows.append(cells)
        points = sum(map(len, by_epoch.values()))
        push = [
            f"{sum(b[str(r)]['push'] for bs in by_epoch.values() for b in bs) / points:+.2f}"
            for r in radii
        ]
        rows.append(["push (mean)", *push])
        md += (
            f"\n{model}, along exact GAM (seed 0), at θ_adv on {settings['probe'] // 100} batches "
            "of 100: median cos / median ‖fd‖/‖exact‖ / max ‖fd‖/‖exact‖ / sign flips per batch:\n\n"
            + table(["epoch"] + [f"r = {r:g}" for r in radii], rows)
        )
    return md


SUBCOMMANDS = {
    "spectra": cmd_spectra,
    "accuracy": cmd_accuracy,
    "noise": cmd_noise,
    "minima": cmd_minima,
    "landscape": cmd_landscape,
    "ablation": cmd_ablation,
    "variants": cmd_variants,
    "fd": cmd_fd,
}

# subcommand -> its markdown table from its JSON record (tests/test_docs.py recomputes the tables
# of reproduce/RESULTS.md from the JSON committed under docs/evidence/ with these)
TABLES = {
    "spectra": spectra_table,
    "accuracy": accuracy_table,
    "noise": noise_table,
    "fd": fd_table,
    "minima": minima_table,
    "landscape": landscape_table,
    "ablation": ablation_table,
    "variants": variants_table,
}

REUSE = "runs/evidence/spectra/spectra.json"
# the subcommands whose runs --vmap can train together (the others measure each run on its own)
VMAP = ("ablation", "accuracy", "noise")

# (full, --quick) values of the shared options.
DEFAULTS = dict(
    model=("mlp", "mlp"),
    epochs=(100, 2),
    seeds=(5, 1),
    k=(50, 5),
    iters=(150, 20),
    trace_samples=(100, 5),
    probe=(1000, 200),
    directions=(100, 10),
    points=(21, 5),
    rhos=("0,0.1,0.5,1", "0,0.5"),
    alphas=("0.3,1,3", "1"),
    levels=("0.2,0.4,0.6,0.8", "0.4"),
    radii=("0.1,0.01,0.001,0.0001", "0.01,0.001"),
)
# Full values that differ per subcommand: each full run stays under 30 minutes on one thread.
FULL = {"ablation": dict(seeds=3), "noise": dict(seeds=3), "fd": dict(seeds=3)}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name, func in SUBCOMMANDS.items():
        summary = (func.__doc__ or name).split("\n")[0]
        # argparse %-formats help strings: a bare % (as in "20/40/60/80%") must be doubled
        s = sub.add_parser(name, help=summary.replace("%", "%%"), description=summary)
        s.set_defaults(func=func)
        s.add_argument(
            "--quick",
            action="store_true",
            help="2 epochs, 1 seed, small metrics: under a minute (for tests)",
        )
        s.add_argument("--out", default=None, help="output folder (runs/evidence/<subcommand>)")
        s.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
        s.add_argument(
            "--gnp-alpha", type=float, default=0.1, help="α of GNP (0.1: best on validation)"
        )
        s.add_argument("--radius", type=float, default=0.1, help="ρ of minima density")
        s.add_argument("--methods", default=",".join(METHODS),
                       help="spectra, accuracy: the methods to train (a comma list)")  # fmt: skip
        s.add_argument("--gam", default=None,
                       help="ρ,α of GAM in SGD+GAM (default: 0.5,1)")  # fmt: skip
        s.add_argument("--sam-gam", default=None,
                       help="ρ,α of GAM in SAM+GAM (default: GAM's 0.5,1)")  # fmt: skip
        s.add_argument("--sam-rho", type=float, default=0.0,
                       help="ablation: SAM+GAM around a SAM oracle of this ρ (0: plain GAM)")  # fmt: skip
        s.add_argument("--reuse", default=REUSE,
                       help="accuracy: take the runs of this spectra JSON if it exists")  # fmt: skip
        for key, (full, _) in DEFAULTS.items():
            s.add_argument(f"--{key.replace('_', '-')}", type=type(full), default=None)
        if name in VMAP:
            s.add_argument("--vmap", action="store_true",
                           help="train each estimator's runs as one vmapped step (seed 0's data)")  # fmt: skip
        else:
            s.set_defaults(vmap=False)
    return p


def main(argv: list[str] | None = None) -> int:
    opt = parser().parse_args(argv)
    opt.started = time.perf_counter()
    for key, (full, quick) in DEFAULTS.items():
        full = FULL.get(opt.command, {}).get(key, full)
        if getattr(opt, key) is None:
            setattr(opt, key, quick if opt.quick else full)
    opt.methods = [m.strip() for m in opt.methods.split(",") if m.strip()]
    unknown = [m for m in opt.methods if m not in METHODS]
    if unknown or not opt.methods:
        raise ValueError(
            f"--methods must name some of {list(METHODS)}; got {unknown or opt.methods}"
        )
    for key in ("gam", "sam_gam"):
        text = getattr(opt, key)
        if text is not None:
            try:
                rho, alpha = (float(x) for x in text.split(","))
            except ValueError:
                raise ValueError(f"--{key.replace('_', '-')} takes ρ,α; got {text!r}") from None
            if not (rho >= 0 and alpha >= 0):
                raise ValueError(f"--{key.replace('_', '-')} takes ρ,α >= 0; got {text!r}")
            setattr(opt, key, (rho, alpha))
    if opt.threads:
        torch.set_num_threads(opt.threads)
    opt.out = Path(opt.out or f"runs/evidence/{opt.command}")
    opt.out.mkdir(parents=True, exist_ok=True)
    if (opt.quick or opt.vmap) and opt.reuse == REUSE:
        opt.reuse = ""  # --quick never reads a full run's results, --vmap trains its own
    opt.func(opt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
