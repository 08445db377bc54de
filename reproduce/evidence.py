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
    python reproduce/evidence.py spectra --quick   # any of them in seconds (what the tests run)

Methods and hyperparameters: SGD (lr 0.05, momentum 0.9, weight decay 5e-4, cosine, batch 100),
GAM ρ = 0.5, α = 1 (the ``mnist1d`` preset of :mod:`reproduce.config`, chosen on a validation split),
SAM ρ = 0.2, SAM+GAM (GAM's ρ, α around a SAM ρ = 0.2 oracle) and GNP (Zhao et al. 2022: gradient
norm penalty with a finite-difference H·v, r = 0.01) with α = ``--gnp-alpha`` = 0.1, the best
validation accuracy of ``ablation --rhos=0 --alphas=0.05,0.1,0.2,0.5,1 --epochs=30 --seeds=2``.
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

from gamfunc import metrics
from reproduce import data as data_mod
from reproduce.config import resolve
from reproduce.train import evaluate, setup

__all__ = ["METHODS", "SUBCOMMANDS", "main", "method_config", "train"]

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


def method_config(base, method: str, seed: int, gnp_alpha: float, **extra):
    """``(estimator name, Config)`` of ``method`` (a key of METHODS) with ``seed`` and ``extra``."""
    name, fields = METHODS[method]
    fields = dict(fields)
    if method == "GNP":
        fields["alpha"] = gnp_alpha
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
            on_epoch(epoch, params, state["buffers"], t.loss_fn)
    buffers = state["buffers"]

    def acc(examples):
        if examples is None:
            return None
        batches = data_mod.eval_batches(examples, cfg.eval_batch_size)
        return evaluate(t.loss_fn, params, buffers, batches, device)[1]

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
        skipped=int(state["skipped"]),
    )


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
    (out / f"{name}.json").write_text(json.dumps(record, indent=1))
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
        for seed in range(opt.seeds):
            name, cfg = method_config(base, method, seed, opt.gnp_alpha)
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
    runs = run_grid(opt, list(METHODS), spectra=True)
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


def cmd_accuracy(opt) -> None:
    """Train/test accuracy and generalisation gap of the five methods (Table cifar2)."""
    source = Path(opt.reuse) if opt.reuse else None
    if source is not None and source.is_file():
        runs = json.loads(source.read_text())["runs"]
    else:
        runs = run_grid(opt, list(METHODS), spectra=False)
    write(opt.out, "accuracy", table(ACC_HEADER, accuracy_rows(runs)), {"runs": runs}, opt)


def cmd_noise(opt) -> None:
    """Test accuracy under 20/40/60/80% label noise (Appendix C.2)."""
    levels = [float(x) for x in opt.levels.split(",")]
    runs = {f"{p:.0%}": run_grid(opt, list(FOUR), spectra=False, label_noise=p) for p in levels}
    header = ["label noise"] + [f"{m} test %" for m in FOUR]
    rows = [[lvl] + [pm([r["test_acc"] for r in by[m]]) for m in FOUR] for lvl, by in runs.items()]
    write(opt.out, "noise", table(header, rows), {"runs": runs}, opt)


def cmd_minima(opt) -> None:
    """Local minima and maxima within ρ along random directions, SGD vs GAM (Section 5.1)."""
    base = base_config(opt)
    out: dict[str, list[dict[str, Any]]] = {}
    for method in ("SGD", "SGD+GAM"):
        out[method] = []
        for seed in range(opt.seeds):
            name, cfg = method_config(base, method, seed, opt.gnp_alpha)
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
    rows = []
    for m, rs in out.items():
        mins = [sum(r["minima"]) / len(r["minima"]) for r in rs]
        some = [100 * sum(x > 0 for x in r["minima"]) / len(r["minima"]) for r in rs]
        maxs = [sum(r["maxima"]) / len(r["maxima"]) for r in rs]
        rows.append([m, pm(mins, 3), pm(some, 1), pm(maxs, 3)])
    header = [
        "method",
        "minima per direction",
        "directions with a minimum %",
        "maxima per direction",
    ]
    write(opt.out, "minima", table(header, rows), {"runs": out}, opt)


def cmd_landscape(opt) -> None:
    """2-D filter-normalised loss landscapes of the four optimisers (Figure vis)."""
    base = base_config(opt)
    rows, rec = [], {}
    for method in FOUR:
        name, cfg = method_config(base, method, 0, opt.gnp_alpha)
        r = train(cfg, name)
        batch = probe_batch(r["data"].probe, opt.probe)
        land = metrics.landscape_2d(
            r["params"], batch, eval_loss(r["loss_fn"], r["buffers"]),
            span=(-1.0, 1.0), points=opt.points, generator=data_mod.generator(0, 13),
        )  # fmt: skip
        z = land.losses
        c, h = opt.points // 2, opt.points // 4
        inner = z[c - h : c + h + 1, c - h : c + h + 1].amax()  # (α, β) in [-0.5, 0.5]²
        rows.append(
            [method, f"{float(z[c, c]):.4f}", f"{float(inner):.3f}", f"{float(z.mean()):.3f}"]
        )
        rec[method] = dict(losses=z.tolist(), alphas=land.alphas.tolist())
        metrics.plot.plot_landscape(
            land, opt.out / f"landscape_{png(method)}.png", title=method, log=True, dpi=80
        )
    header = ["method", "loss at θ", "max loss on [-0.5, 0.5]²", "mean loss on [-1, 1]²"]
    write(opt.out, "landscape", table(header, rows), {"landscapes": rec}, opt)


def cmd_ablation(opt) -> None:
    """Validation accuracy over a ρ × α grid; ρ = 0 is GNP (Figure ablation-hyperparameter)."""
    rhos = [float(x) for x in opt.rhos.split(",")]
    alphas = [float(x) for x in opt.alphas.split(",")]
    base = base_config(opt, val_fraction=0.1)
    grid: dict[str, dict[str, Any]] = {}
    for rho in rhos:
        for alpha in alphas:
            vals, tests = [], []
            for seed in range(opt.seeds):
                if rho == 0:  # no ascent: the gradient norm penalty, GNP's own α scale
                    cfg = dataclasses.replace(base, seed=seed, alpha=alpha)
                    name = "gnp"
                else:
                    cfg = dataclasses.replace(base, seed=seed, rho=rho, alpha=alpha)
                    name = "gam"
                r = train(cfg, name)
                vals.append(r["val_acc"])
                tests.append(r["test_acc"])
            grid[f"{rho},{alpha}"] = dict(rho=rho, alpha=alpha, val=vals, test=tests)
    header = ["ρ \\ α"] + [f"α = {a:g}" for a in alphas]
    rows = [
        [f"ρ = {rho:g}" + (" (GNP)" if rho == 0 else "")]
        + [pm(grid[f"{rho},{a}"]["val"], 1) for a in alphas]
        for rho in rhos
    ]
    best = max(grid.values(), key=lambda g: mean_std(g["val"])[0])
    md = (
        "Validation accuracy % (10% of the training set held out):\n\n"
        + table(header, rows)
        + f"\nBest on validation: ρ = {best['rho']:g}, α = {best['alpha']:g} "
        f"(test {pm(best['test'], 1)}%).\n"
    )
    write(opt.out, "ablation", md, {"grid": grid}, opt)


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
    rows = [
        [label, pm([r["test_acc"] for r in rs]), pm([r["gap"] for r in rs]),
         pm([r["lambda_max"] for r in rs]), pm([r["step_ms"] for r in rs], 1)]
        for label, rs in out.items()
    ]  # fmt: skip
    header = ["GAM variant", "test acc %", "gap", "λ_max", "ms/step"]
    write(opt.out, "variants", table(header, rows), {"runs": out}, opt)


SUBCOMMANDS = {
    "spectra": cmd_spectra,
    "accuracy": cmd_accuracy,
    "noise": cmd_noise,
    "minima": cmd_minima,
    "landscape": cmd_landscape,
    "ablation": cmd_ablation,
    "variants": cmd_variants,
}

REUSE = "runs/evidence/spectra/spectra.json"

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
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name, func in SUBCOMMANDS.items():
        s = sub.add_parser(name, help=(func.__doc__ or name).split("\n")[0])
        s.set_defaults(func=func)
        s.add_argument("--quick", action="store_true", help="seconds, not minutes (for tests)")
        s.add_argument("--out", default=None, help="output folder (runs/evidence/<subcommand>)")
        s.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
        s.add_argument(
            "--gnp-alpha", type=float, default=0.1, help="α of GNP (0.1: best on validation)"
        )
        s.add_argument("--radius", type=float, default=0.1, help="ρ of minima density")
        s.add_argument("--reuse", default=REUSE,
                       help="accuracy: take the runs of this spectra JSON if it exists")  # fmt: skip
        for key, (full, _) in DEFAULTS.items():
            s.add_argument(f"--{key.replace('_', '-')}", type=type(full), default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    opt = parser().parse_args(argv)
    opt.started = time.perf_counter()
    for key, (full, quick) in DEFAULTS.items():
        if getattr(opt, key) is None:
            setattr(opt, key, quick if opt.quick else full)
    if opt.threads:
        torch.set_num_threads(opt.threads)
    opt.out = Path(opt.out or f"runs/evidence/{opt.command}")
    opt.out.mkdir(parents=True, exist_ok=True)
    if opt.quick and opt.reuse == REUSE:
        opt.reuse = ""  # --quick never reads a full run's results
    opt.func(opt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
