"""GAM's claims on real images: Fashion-MNIST on one GPU, clean and 40% label noise, seeds, an honest table.

```bash
python -m reproduce.evidence.fmnist --data=DIR                 # the sweep, then the table (one GPU)
python -m reproduce.evidence.fmnist --data=DIR --deadline=1100 # start no run that would end later
```

Every run is ``reproduce/train.py`` on a preset of `reproduce.presets` (``fmnist.clean``,
``fmnist.noise40``: the fast ResNet-9 at width 32, SGD with Nesterov momentum, 10 epochs of batch
256, crop and flip on the GPU), in a process of its own, one at a time, so that its wall-clock is its
own. Two stages:

1. **The validation sweep.** Seed 0, 10% of the training set held out (``--val_fraction=0.1``), the
   clean preset: SGD, SAM over `SAM_RHOS`, exact GAM over `GAM_GRID` (ρ, α). The cell of the best
   final validation accuracy is selected, SAM's ρ and GAM's (ρ, α) separately; the test set plays no
   part (its accuracy is kept beside, never compared). SAM+GAM takes both, untuned as a pair; fd GAM
   takes GAM's.
2. **The table.** Each seed of `SEEDS` and setting of `SETTINGS`: one ``train.py`` process training
   `ESTIMATORS` one after the other on the whole training set with the selected values; each
   estimator's training seconds (``train_seconds``: the steps alone, evaluation and metrics left
   out) and its multiple of SGD's in the same process; test accuracy, the generalisation gap (train
   accuracy over the training set in eval mode, minus test), λ_max and R1 at the end (the preset's
   metrics: 20 Lanczos products and 10 ascent steps on 1,000 training examples). Seed 0's runs also
   log λ_max every two epochs, for the curves.

``--settings=noise40`` runs the table of one setting only (with ``--sweep``: without the sweep).
``--add=SETTING:SEED:FOLDER`` (repeatable) adds to an existing ``fmnist.json`` the runs of a
``train.py`` folder made by the table's own command for that setting and seed (a run the deadline
skipped, made later), and trains nothing.

``--deadline`` (seconds from the start) skips a run whose predicted end (its estimators' last
measured times, or a multiple of SGD's) lies past it, and records it as not run: a partial table says
what it lacks. The JSON (``--out``, default ``runs/evidence/fmnist/fmnist.json``) holds the platform,
the sweep and every run's numbers; `fmnist_table` renders reproduce/RESULTS.md's section from it
(means ± std, Welch's t-tests against SGD and SAM, wall-clock ratios), and `figure` draws test
accuracy against wall-clock.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

if not __package__:  # run as a file: the checkout's root on sys.path (reproduce/__init__.py)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from reproduce.run.report import write_json

__all__ = [
    "ESTIMATORS",
    "GAM_GRID",
    "SAM_RHOS",
    "SEEDS",
    "SETTINGS",
    "curves_table",
    "figure",
    "fmnist_table",
    "main",
    "welch",
]

ROOT = Path(__file__).resolve().parents[2]
ESTIMATORS = ("sgd", "sam", "gam", "gam_fd", "sam+gam")
NAMES = {
    "sgd": "SGD",
    "sam": "SAM",
    "gam": "GAM (exact)",
    "gam_fd": "GAM (fd)",
    "sam+gam": "SAM+GAM",
}
SETTINGS = {"clean": "fmnist.clean", "noise40": "fmnist.noise40"}
SEEDS = (0, 1, 2)
SAM_RHOS = (0.05, 0.1)
GAM_GRID = ((0.05, 0.1), (0.05, 0.3))
# the multiple of SGD's time each estimator takes, before one is measured (deadline predictions)
GUESS = {"sgd": 1.0, "sam": 2.0, "gam": 8.0, "gam_fd": 4.0, "sam+gam": 9.0}
OVERHEAD = 8.0  # seconds of a train.py process besides its steps (start-up, evaluation, metrics)


def _device() -> dict:
    import torch

    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor()
    return {
        "device": name,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
    }


class Runner:
    """Runs ``train.py`` processes one at a time under a deadline, remembering each estimator's time."""

    def __init__(self, data: str, logdir: Path, deadline: float, extra: list[str]):
        self.data, self.logdir, self.extra = data, logdir, extra
        self.start, self.deadline = time.perf_counter(), deadline
        self.seconds: dict[str, float] = {}  # estimator -> the last process's seconds for it

    def predict(self, estimators: tuple[str, ...]) -> float:
        sgd = self.seconds.get("sgd", 15.0)
        return sum(self.seconds.get(e, GUESS.get(e, 8.0) * sgd) + OVERHEAD for e in estimators)

    def __call__(self, name: str, preset: str, estimators: tuple[str, ...], args: list[str]):
        """Train ``estimators`` on ``preset`` in one process; their summaries (with history), or
        None when the deadline leaves no room."""
        left = self.deadline - (time.perf_counter() - self.start)
        if self.deadline and self.predict(estimators) > left:
            print(
                f"skip {name}: about {self.predict(estimators):.0f} s, {left:.0f} s left",
                flush=True,
            )
            return None
        cmd = [
            sys.executable,
            "reproduce/train.py",
            f"--preset={preset}",
            f"--data={self.data}",
            f"--estimator={','.join(estimators)}",
            f"--logdir={self.logdir}",
            f"--name={name}",
            "--progress=false",
            *args,
            *self.extra,
        ]
        began = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - began
        (self.logdir / name).mkdir(parents=True, exist_ok=True)
        (self.logdir / name / "train.log").write_text(proc.stdout + proc.stderr)
        out = []
        for e in estimators:
            path = self.logdir / name / e / "summary.json"
            if not path.is_file():
                continue
            s = json.loads(path.read_text())
            self.seconds[e] = s["train_seconds"]
            out.append(s)
        print(f"{name}: exit {proc.returncode}, {wall:.0f} s, " + ", ".join(
            f"{s['estimator']} {s['final'].get('test_acc') if s['final'] else None}" for s in out
        ), flush=True)  # fmt: skip
        return {"exit": proc.returncode, "wall_seconds": round(wall, 1), "summaries": out}


def _row(s: dict, sgd_seconds: float | None) -> dict:
    f = s["final"] or {}
    train = f.get("train_eval_acc", f.get("train_acc"))
    test = f.get("test_acc")
    history = [
        {k: h.get(k) for k in ("epoch", "test_acc", "val_acc", "lambda_max", "train_loss")}
        for h in s.get("history", [])
    ]
    return {
        "estimator": s["estimator"],
        "status": s["status"],
        "test_acc": test,
        "val_acc": f.get("val_acc"),
        "train_acc": train,
        "gap": None if train is None or test is None else train - test,
        "lambda_max": f.get("lambda_max"),
        "r1": f.get("r1"),
        "train_seconds": s["train_seconds"],
        "x_sgd": None if not sgd_seconds else s["train_seconds"] / sgd_seconds,
        "images_per_s": s["images_per_s"],
        "peak_memory_gib": s["peak_memory_gib"],
        "history": history,
        "config": {k: s["config"][k] for k in ("rho", "alpha", "sam_rho", "fd_radius", "seed")},
    }


def sweep(run: Runner) -> dict:
    """Stage 1: SAM's ρ and GAM's (ρ, α) on 10% of the training set, seed 0, clean."""
    cells = [("sgd", {})] + [("sam", {"sam_rho": r}) for r in SAM_RHOS]
    cells += [("gam", {"rho": r, "alpha": a}) for r, a in GAM_GRID]
    out = []
    for estimator, values in cells:
        args = ["--val_fraction=0.1", "--seed=0", "--eig_iters=0", "--r1_steps=0"]
        args += [f"--{k}={v:g}" for k, v in values.items()]
        label = ",".join(f"{k}={v:g}" for k, v in values.items()) or "-"
        got = run(f"sweep/{estimator}/{label}", SETTINGS["clean"], (estimator,), args)
        row = {"estimator": estimator, **values, "run": False}
        if got and got["summaries"]:
            r = _row(got["summaries"][0], None)
            row |= {"run": True, "val_acc": r["val_acc"], "test_acc": r["test_acc"],
                    "status": r["status"], "train_seconds": r["train_seconds"]}  # fmt: skip
        out.append(row)

    def best(estimator: str):
        done = [
            c for c in out if c["estimator"] == estimator and c["run"] and c["status"] == "finished"
        ]
        return max(done, key=lambda c: c["val_acc"]) if done else None  # first of a tie: grid order

    sam, gam = best("sam"), best("gam")
    return {
        "setting": "clean, seed 0, 10% of the training set held out, final validation accuracy",
        "cells": out,
        "selected": {
            "sam_rho": sam["sam_rho"] if sam else None,
            "rho": gam["rho"] if gam else None,
            "alpha": gam["alpha"] if gam else None,
        },
    }


def table(run: Runner, selected: dict, save=lambda runs: None, settings=tuple(SETTINGS)) -> dict:
    """Stage 2: every estimator × setting (of ``settings``) × seed with the selected values, the
    clean setting's seeds first; ``save(runs)`` after each process."""
    values = [f"--{k}={v:g}" for k, v in selected.items() if v is not None]
    runs: dict[str, dict[str, list]] = {s: {e: [] for e in ESTIMATORS} for s in SETTINGS}
    for setting in settings:
        preset = SETTINGS[setting]
        for seed in SEEDS:
            curves = ["--flatness_every=2"] if seed == 0 else []
            name = f"table/{preset}/seed={seed}"
            got = run(name, preset, ESTIMATORS, [f"--seed={seed}", *values, *curves])
            if not got:
                continue
            add(runs[setting], seed, got["summaries"])
            save(runs)
    return runs


def add(by: dict[str, list], seed: int, summaries: list[dict]) -> None:
    """Append one process's summaries (of one seed) to ``by`` (estimator -> rows), each with its
    multiple of that process's SGD time."""
    sgd = next((s["train_seconds"] for s in summaries if s["estimator"] == "sgd"), None)
    for s in summaries:
        by[s["estimator"]].append({"seed": seed, **_row(s, sgd)})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m reproduce.evidence.fmnist", description=__doc__)
    ap.add_argument("--data", required=True, help="Fashion-MNIST's four IDX files")
    ap.add_argument("--out", default="runs/evidence/fmnist", help="folder of fmnist.json")
    ap.add_argument(
        "--logdir", default="runs/fmnist", help="train.py's runs (TensorBoard, summaries)"
    )
    ap.add_argument("--deadline", type=float, default=0.0, help="seconds; 0: no deadline")
    ap.add_argument("--sweep", default="", help="a fmnist.json whose sweep to reuse (no sweep run)")
    ap.add_argument(
        "--settings", default=",".join(SETTINGS), help="the table's settings: clean,noise40"
    )
    ap.add_argument(
        "--add", action="append", default=[], help="SETTING:SEED:FOLDER of train.py runs"
    )
    args, extra = ap.parse_known_args(argv)
    settings = tuple(args.settings.split(","))
    if not set(settings) <= set(SETTINGS):
        ap.error(f"--settings: each of {', '.join(SETTINGS)}; got {args.settings!r}")
    if args.add:
        path = Path(args.out) / "fmnist.json"
        record = json.loads(path.read_text())
        for item in args.add:
            setting, seed, folder = item.split(":", 2)
            summaries = [
                json.loads((Path(folder) / e / "summary.json").read_text()) for e in ESTIMATORS
            ]
            add(record["runs"][setting], int(seed), summaries)
            record.setdefault("added", []).append({"setting": setting, "seed": int(seed)})
        write_json(path, record)
        return 0
    run = Runner(args.data, Path(args.logdir), args.deadline, extra)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"settings": {"command": "fmnist", "extra": extra}, "platform": _device()}

    def save(runs=None) -> None:
        if runs is not None:
            record["runs"] = runs
        record["seconds"] = round(time.perf_counter() - run.start, 1)
        write_json(out / "fmnist.json", record)

    record["sweep"] = (
        json.loads(Path(args.sweep).read_text())["sweep"] if args.sweep else sweep(run)
    )
    save()
    save(table(run, record["sweep"]["selected"], save, settings))
    print(f"{record['seconds']} s; {out / 'fmnist.json'}")
    return 0


# ---------------------------------------------------------------- the report


def welch(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """Welch's t-test of mean(a) − mean(b): (difference, t, two-sided p), with the
    Welch–Satterthwaite degrees of freedom; NaN where a sample has fewer than 2 values or no spread."""
    if len(a) < 2 or len(b) < 2:
        return (
            (statistics.mean(a) - statistics.mean(b) if a and b else math.nan),
            math.nan,
            math.nan,
        )
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    d = statistics.mean(a) - statistics.mean(b)
    if va + vb == 0:
        return d, math.nan, math.nan
    t = d / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    from scipy import stats

    return d, t, float(2 * stats.t.sf(abs(t), df))


def _pm(values: list[float], spec: str = ".2f") -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return format(values[0], spec)
    return f"{format(statistics.mean(values), spec)} ± {format(statistics.stdev(values), spec)}"


def _test(a: list[float], b: list[float]) -> str:
    d, _, p = welch(a, b)
    if math.isnan(d):
        return "—"
    sign = "+" if d >= 0 else "−"
    verdict = "" if math.isnan(p) else (f", p = {p:.3f}" if p >= 0.001 else ", p < 0.001")
    return f"{sign}{abs(d):.2f}{verdict}"


def fmnist_table(record: dict) -> str:
    """reproduce/RESULTS.md's tables of ``fmnist.json``: the sweep, then one table per setting."""
    lines = ["| cell | val acc % | test acc % (not used) |", "|---|---|---|"]
    for c in record["sweep"]["cells"]:
        label = NAMES[c["estimator"]] + "".join(
            f", {k.replace('sam_rho', 'ρ').replace('rho', 'ρ').replace('alpha', 'α')} {c[k]:g}"
            for k in ("sam_rho", "rho", "alpha")
            if k in c
        )
        val = f"{c['val_acc']:.2f}" if c.get("val_acc") is not None else "not run"
        test = f"{c['test_acc']:.2f}" if c.get("test_acc") is not None else "—"
        lines.append(f"| {label} | {val} | {test} |")
    out = ["\n".join(lines)]
    head = (
        "| estimator | seeds | test acc % | gap (train − test) | λ_max | R1 | train s | × SGD | "
        "vs SGD (Welch) | vs SAM (Welch) |"
    )
    for setting, by in record["runs"].items():
        rows = [head, "|" + "---|" * 10]
        acc = {e: [r["test_acc"] for r in rs] for e, rs in by.items()}
        for e, rs in by.items():
            if not rs:
                rows.append(f"| {NAMES[e]} | 0 | not run | | | | | | | |")
                continue
            rows.append(
                f"| {NAMES[e]} | {len(rs)} | {_pm(acc[e])} | {_pm([r['gap'] for r in rs])} | "
                f"{_pm([r['lambda_max'] for r in rs])} | {_pm([r['r1'] for r in rs], '.3f')} | "
                f"{_pm([r['train_seconds'] for r in rs], '.1f')} | {_pm([r['x_sgd'] for r in rs])} | "
                f"{'—' if e == 'sgd' else _test(acc[e], acc['sgd'])} | "
                f"{'—' if e in ('sgd', 'sam') else _test(acc[e], acc['sam'])} |"
            )
        out.append(f"{setting}:\n\n" + "\n".join(rows))
    out.append(curves_table(record))
    return "\n\n".join(out)


def curves_table(record: dict, setting: str = "clean", seed: int = 0) -> str:
    """The TensorBoard curves of one run per estimator (``test/acc`` every epoch, ``flatness/
    lambda_max`` every two epochs and at the end), from the same records: epoch by epoch, "test %
    / λ_max" per estimator."""
    by = {
        e: next((r for r in rs if r["seed"] == seed), None)
        for e, rs in record["runs"][setting].items()
    }
    by = {e: r for e, r in by.items() if r is not None}
    epochs = max((len(r["history"]) for r in by.values()), default=0)
    rows = ["| epoch | " + " | ".join(NAMES[e] for e in by) + " |", "|---|" + "---|" * len(by)]
    for i in range(epochs):
        cells = []
        for r in by.values():
            h = r["history"][i]
            lam = r["lambda_max"] if i == epochs - 1 else h["lambda_max"]
            cells.append(f"{h['test_acc']:.2f}" + ("" if lam is None else f" / {lam:.1f}"))
        rows.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    return f"{setting}, seed {seed}, test % / λ_max:\n\n" + "\n".join(rows)


def figure(record: dict, path: Path) -> None:
    """Test accuracy (mean ± std over seeds) against training seconds, one point per estimator,
    a panel per setting that has runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = {k: by for k, by in record["runs"].items() if any(by.values())}
    fig, axes = plt.subplots(1, len(done), figsize=(5 * len(done), 3.6), squeeze=False)
    for ax, (setting, by) in zip(axes[0], done.items(), strict=True):
        for e, rs in by.items():
            if not rs:
                continue
            acc = [r["test_acc"] for r in rs]
            sec = [r["train_seconds"] for r in rs]
            ax.errorbar(
                statistics.mean(sec),
                statistics.mean(acc),
                yerr=statistics.stdev(acc) if len(acc) > 1 else 0,
                xerr=statistics.stdev(sec) if len(sec) > 1 else 0,
                fmt="o",
                capsize=3,
                label=NAMES[e],
            )
        ax.set_xscale("log")
        ax.set_xlabel(f"training seconds ({record['platform']['device']})")
        ax.set_ylabel("test accuracy %")
        ax.set_title(f"Fashion-MNIST, {setting}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
