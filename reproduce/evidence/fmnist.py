"""GAM's claims on real images: Fashion-MNIST on one GPU, clean and 40% label noise, seeds, an honest table.

```bash
python -m reproduce.evidence.fmnist --data=DIR                 # the sweep, then the table (one GPU)
python -m reproduce.evidence.fmnist --data=DIR --deadline=1100 # start no run that would end later
```

Every run is ``reproduce/train.py`` on a preset of `reproduce.presets` (``fmnist.clean``,
``fmnist.noise40``: the fast ResNet-9, SGD with Nesterov momentum, batch 256, crop and flip on the
GPU), with the width and epochs of the recipe, in a process of its own, one at a time, so that its
wall-clock is its own. Three stages: the recipe (stage 0, `recipe`: width and epochs of `RECIPES` by
SGD's validation accuracy), then

1. **The validation sweep.** Seed 0, 10% of the training set held out (``--val_fraction=0.1``), the
   clean preset: SGD, SAM over `SAM_RHOS`, exact GAM over `GAM_GRID` (ρ, α). The cell of the best
   final validation accuracy is selected, SAM's ρ and GAM's (ρ, α) separately; the test set plays no
   part (its accuracy is kept beside, never compared). SAM+GAM takes both, untuned as a pair; fd GAM
   takes GAM's.
2. **The table.** Each seed of `SEEDS` and setting of `SETTINGS`: one ``train.py`` process training
   `ESTIMATORS` one after the other on the whole training set with the selected values; each
   estimator's training seconds (``train_seconds``: the steps alone, evaluation and metrics left
   out), its steady-state images per second (``images_per_s``: timed between synchronisations of
   the device, its first interval, of compilation and warm-up, left out) and its cost as a multiple
   of SGD's (``x_sgd``: SGD's images per second in the same process over its own); test accuracy,
   the generalisation gap (train accuracy over the training set in eval mode, minus test), λ_max
   and R1 at the end (the preset's metrics: 20 Lanczos products and 10 ascent steps on 1,000
   training examples). Seed 0's runs also log λ_max every two epochs, for the curves.

``--settings=noise40`` runs the table of one setting only (with ``--sweep``: without the sweep).
``--into=JSON`` continues the table of a record (its recipe, its sweep's values): it trains only the
settings and seeds that the record lacks and writes the record with them added to ``--out``, the
command, device and seconds of each continuation kept beside the first. A table too long for one
sitting is made so, a deadline at a time. ``--add=SETTING:SEED:FOLDER`` (repeatable) adds to an
existing ``fmnist.json`` the runs of a ``train.py`` folder made by the table's own command for that
setting and seed, and trains nothing.

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
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

if not __package__:  # run as a file: the checkout's root on sys.path (reproduce/__init__.py)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from reproduce.evidence.fmnist_figure import figure
from reproduce.evidence.fmnist_report import (
    SEEDS,
    curves_table,
    fmnist_prose,
    fmnist_section,
    fmnist_table,
    in_short,
    welch,
    write_section,
)
from reproduce.run.report import write_json

__all__ = [
    "ESTIMATORS",
    "GAM_GRID",
    "SAM_RHOS",
    "SEEDS",
    "SETTINGS",
    "curves_table",
    "figure",
    "fmnist_prose",
    "fmnist_section",
    "fmnist_table",
    "in_short",
    "main",
    "welch",
]

ROOT = Path(__file__).resolve().parents[2]
EVIDENCE = ROOT / "reproduce" / "results" / "fmnist" / "fmnist.json"  # the committed record
ESTIMATORS = ("sgd", "sam", "gam", "gam_fd", "sam+gam")
SETTINGS = {"clean": "fmnist.clean", "noise40": "fmnist.noise40"}
# the recipes the SGD baseline is chosen from (stage 0): width and epochs, in order of cost; all fit
# the whole table (2 settings × 3 seeds × 5 estimators, and the sweep) in an hour of one GPU
RECIPES = {
    "w32-10": ("--model=resnet9_w32", "--epochs=10"),
    "w32-15": ("--model=resnet9_w32", "--epochs=15"),
    "w64-10": ("--model=resnet9", "--epochs=10"),
}
RECIPE_SEEDS = (0, 1)
SAM_RHOS = (0.05, 0.1)
GAM_GRID = ((0.05, 0.1), (0.05, 0.3))
# the multiple of SGD's time each estimator takes, before one is measured (deadline predictions):
# the table of 2026-12-07 (H100, width 32, 10 epochs) rounded up
GUESS = {"sgd": 1.0, "sam": 1.9, "gam": 9.1, "gam_fd": 3.6, "sam+gam": 9.9}
OVERHEAD = 8.0  # seconds of a train.py process besides its steps (start-up, evaluation, metrics)
# and, an estimator, of the λ_max curves of seed 0 (every two epochs): 463 s against 413 s for the
# other seed of the table of 2026-12-07, five estimators
CURVES = 10.0


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

    def predict_process(self, estimators: tuple[str, ...], args: list[str]) -> float:
        """`predict`, and `CURVES` an estimator when ``args`` ask for λ_max curves."""
        curves = any(a.startswith("--flatness_every") for a in args)
        return self.predict(estimators) + (CURVES * len(estimators) if curves else 0.0)

    def remember(self, runs: dict[str, dict[str, list]]) -> None:
        """Take each estimator's seconds from the mean of ``runs``' rows (a record's table, of this
        device), for the predictions before this process has measured it."""
        for e in ESTIMATORS:
            rows = [r["train_seconds"] for by in runs.values() for r in by.get(e, [])]
            if rows:
                self.seconds.setdefault(e, statistics.mean(rows))

    def __call__(self, name: str, preset: str, estimators: tuple[str, ...], args: list[str]):
        """Train ``estimators`` on ``preset`` in one process; their summaries (with history), or
        None when the deadline leaves no room."""
        left = self.deadline - (time.perf_counter() - self.start)
        need = self.predict_process(estimators, args)
        if self.deadline and need > left:
            print(
                f"skip {name}: about {need:.0f} s, {left:.0f} s left",
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


def _row(s: dict, sgd_rate: float | None) -> dict:
    """One estimator's row of the table from its summary.json ``s``; ``sgd_rate``: the steady-state
    images per second of SGD in the same process (None: no SGD there, no ``x_sgd``)."""
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
        "x_sgd": None if not sgd_rate else sgd_rate / s["images_per_s"],
        "images_per_s": s["images_per_s"],
        "peak_memory_gib": s["peak_memory_gib"],
        "history": history,
        "config": {
            k: s["config"][k]
            for k in (
                "rho",
                "alpha",
                "sam_rho",
                "fd_radius",
                "seed",
                "model",
                "epochs",
                "batch_size",
                "lr",
            )
        },
    }


def recipe(run: Runner) -> dict:
    """Stage 0: the SGD baseline's recipe, of `RECIPES`, by the mean final validation accuracy of
    SGD over `RECIPE_SEEDS` on 10% of the training set (clean); the test set plays no part."""
    cells = []
    for name, args in RECIPES.items():
        for seed in RECIPE_SEEDS:
            extra = [*args, "--val_fraction=0.1", f"--seed={seed}", "--eig_iters=0", "--r1_steps=0"]
            got = run(f"recipe/{name}/seed={seed}", SETTINGS["clean"], ("sgd",), extra)
            row = {"recipe": name, "seed": seed, "run": False}
            if got and got["summaries"]:
                r = _row(got["summaries"][0], None)
                row |= {"run": True, "val_acc": r["val_acc"], "test_acc": r["test_acc"],
                        "status": r["status"], "train_seconds": r["train_seconds"]}  # fmt: skip
            cells.append(row)

    def val(name: str) -> float | None:
        got = [c["val_acc"] for c in cells if c["recipe"] == name and c["run"]]
        ok = len(got) == len(RECIPE_SEEDS) and all(
            c["status"] == "finished" for c in cells if c["recipe"] == name
        )
        return statistics.mean(got) if ok else None

    means = {name: val(name) for name in RECIPES}
    done = [name for name, v in means.items() if v is not None]
    best = max(done, key=lambda n: means[n]) if done else None  # first of a tie: cost order
    return {
        "setting": "clean, SGD, seeds "
        + ", ".join(map(str, RECIPE_SEEDS))
        + ", 10% of the training set held out, mean final validation accuracy",
        "platform": _device(),
        "recipes": {name: list(args) for name, args in RECIPES.items()},
        "cells": cells,
        "selected": best,
    }


def sweep(run: Runner, args_: tuple[str, ...] = ()) -> dict:
    """Stage 1: SAM's ρ and GAM's (ρ, α) on 10% of the training set, seed 0, clean, with the
    recipe's arguments ``args_``."""
    cells = [("sgd", {})] + [("sam", {"sam_rho": r}) for r in SAM_RHOS]
    cells += [("gam", {"rho": r, "alpha": a}) for r, a in GAM_GRID]
    out = []
    for estimator, values in cells:
        args = [*args_, "--val_fraction=0.1", "--seed=0", "--eig_iters=0", "--r1_steps=0"]
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


def table(
    run: Runner,
    selected: dict,
    save=lambda runs: None,
    settings=tuple(SETTINGS),
    args_: tuple[str, ...] = (),
    runs: dict[str, dict[str, list]] | None = None,
    made: list | None = None,
) -> dict:
    """Stage 2: every estimator × setting (of ``settings``) × seed with the recipe's arguments
    ``args_`` and the selected values, the clean setting's seeds first; ``save(runs)`` after each
    process. Given ``runs`` (a record's), the settings and seeds it holds are not trained again
    and the new ones are added to it; ``made`` gets ``[setting, seed]`` of each process run."""
    values = [*args_, *(f"--{k}={v:g}" for k, v in selected.items() if v is not None)]
    if runs is None:
        runs = {s: {e: [] for e in ESTIMATORS} for s in SETTINGS}
    for setting in settings:
        preset = SETTINGS[setting]
        held = {r["seed"] for rows in runs[setting].values() for r in rows}
        for seed in SEEDS:
            if seed in held:
                continue
            curves = ["--flatness_every=2"] if seed == 0 else []
            name = f"table/{preset}/seed={seed}"
            got = run(name, preset, ESTIMATORS, [f"--seed={seed}", *values, *curves])
            if not got:
                continue
            add(runs[setting], seed, got["summaries"])
            if made is not None:
                made.append([setting, seed])
            save(runs)
    return runs


def add(by: dict[str, list], seed: int, summaries: list[dict]) -> None:
    """Append one process's summaries (of one seed) to ``by`` (estimator -> rows), each with its
    cost as a multiple of that process's SGD's (steady-state images per second)."""
    sgd = next((s["images_per_s"] for s in summaries if s["estimator"] == "sgd"), None)
    for s in summaries:
        by[s["estimator"]].append({"seed": seed, **_row(s, sgd)})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m reproduce.evidence.fmnist", description=__doc__)
    ap.add_argument("--data", default="", help="Fashion-MNIST's four IDX files")
    ap.add_argument(
        "--docs",
        action="store_true",
        help="write reproduce/RESULTS.md's section and the figure from the committed JSON; no run",
    )
    ap.add_argument("--out", default="runs/evidence/fmnist", help="folder of fmnist.json")
    ap.add_argument(
        "--logdir", default="runs/fmnist", help="train.py's runs (TensorBoard, summaries)"
    )
    ap.add_argument("--deadline", type=float, default=0.0, help="seconds; 0: no deadline")
    ap.add_argument(
        "--stages", default="recipe,sweep,table", help="of recipe,sweep,table: the stages to run"
    )
    ap.add_argument("--recipe", default="", help="a fmnist.json whose recipe to reuse (no stage 0)")
    ap.add_argument("--sweep", default="", help="a fmnist.json whose sweep to reuse (no sweep run)")
    ap.add_argument(
        "--settings", default=",".join(SETTINGS), help="the table's settings: clean,noise40"
    )
    ap.add_argument(
        "--add", action="append", default=[], help="SETTING:SEED:FOLDER of train.py runs"
    )
    ap.add_argument("--into", default="", help="a fmnist.json whose table to continue")
    args, extra = ap.parse_known_args(argv)
    if args.docs:
        record = json.loads(EVIDENCE.read_text())
        write_section(record, ROOT / "reproduce" / "RESULTS.md")
        figure(record, EVIDENCE.with_suffix(".png"))
        return 0
    if not args.data:
        ap.error("--data: the folder of Fashion-MNIST's four IDX files")
    settings = tuple(args.settings.split(","))
    if not set(settings) <= set(SETTINGS):
        ap.error(f"--settings: each of {', '.join(SETTINGS)}; got {args.settings!r}")
    stages = set(args.stages.split(","))
    if not stages <= {"recipe", "sweep", "table"}:
        ap.error(f"--stages: each of recipe, sweep, table; got {args.stages!r}")
    if args.into and (stages != {"table"} or args.recipe or args.sweep):
        ap.error("--into: the record's recipe and sweep are used; give --stages=table alone")
    if "table" in stages and "sweep" not in stages and not (args.sweep or args.into):
        ap.error("--stages: the table needs the sweep's values: add sweep, or give --sweep=JSON")
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
    given = sys.argv[1:] if argv is None else argv
    shown = [a for a in given if not a.startswith(("--data=", "--out=", "--logdir="))]
    meta = {"command": "fmnist", "extra": extra, "argv": ["--data=DIR", *shown]}
    if args.into:
        record = json.loads(Path(args.into).read_text())
        sitting = {"argv": meta["argv"], "platform": _device(), "seconds": 0.0, "ran": []}
        if sitting["platform"]["device"] == record["platform"]["device"]:
            run.remember(record["runs"])  # its times predict this sitting's before it measures
        record.setdefault("continued", []).append(sitting)
        chosen = record.get("table_recipe") or (record.get("recipe") or {}).get("selected")

        def save_into(runs=None) -> None:
            sitting["seconds"] = round(time.perf_counter() - run.start, 1)
            write_json(out / "fmnist.json", record)

        runs = table(
            run,
            record["sweep"]["selected"],
            save_into,
            settings,
            RECIPES[chosen] if chosen else (),
            record["runs"],
            sitting["ran"],
        )
        save_into(runs)
        print(f"{sitting['seconds']} s; {out / 'fmnist.json'}")
        return 0
    record = {"settings": meta, "platform": _device()}

    def save(runs=None) -> None:
        if runs is not None:
            record["runs"] = runs
        record["seconds"] = round(time.perf_counter() - run.start, 1)
        write_json(out / "fmnist.json", record)

    if args.recipe:  # a record made before the recipe stage existed has none: the preset's recipe
        record["recipe"] = json.loads(Path(args.recipe).read_text()).get("recipe")
    elif "recipe" in stages:
        record["recipe"] = recipe(run)
        save()
    chosen = (record.get("recipe") or {}).get("selected")
    recipe_args = RECIPES[chosen] if chosen else ()
    if args.sweep:
        record["sweep"] = json.loads(Path(args.sweep).read_text())["sweep"]
    elif "sweep" in stages:
        began = time.perf_counter()
        record["sweep"] = {"recipe": chosen, **sweep(run, recipe_args)}
        made = {"argv": meta["argv"], "platform": record["platform"]}
        record["sweep"]["made"] = made | {"seconds": round(time.perf_counter() - began, 1)}
        save()
    if "table" in stages:
        record["table_recipe"] = chosen or record["sweep"].get("recipe")
        save(table(run, record["sweep"]["selected"], save, settings, recipe_args))
    save()
    print(f"{record['seconds']} s; {out / 'fmnist.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
