"""Flatness at SGD's price: the cheap forms of flatness on the Fashion-MNIST harness, test accuracy
against wall-clock as a multiple of SGD's.

```bash
python -m reproduce.evidence.cheap --data=DIR --recipe=reproduce/results/fmnist/fmnist.json \\
    --sweep=reproduce/results/fmnist/fmnist.json --deadline=1080      # a 20-minute slot of one GPU
python -m reproduce.evidence.cheap --docs   # reproduce/RESULTS.md's section from the committed JSON
```

The model, recipe, seeds and values are those of `reproduce.evidence.fmnist`: its presets
(``fmnist.clean``, ``fmnist.noise40``), its recipe (``--recipe``: the JSON whose recipe stage, or
whose sweep's recipe, chose width and epochs) and its sweep's SAM ρ and GAM (ρ, α) (``--sweep``). Per
setting and seed, `GROUPS` trains every cheap form in three ``reproduce/train.py`` processes, one at
a time (a process's estimators share its ``--when``):

1. ``every``: SGD, LookGAM (``look_gam``, k = 5, exact H·v), MSAM (SAM's ρ, its own momentum 0.9)
   and RWP (σ = 0.01 of each filter's norm, one gradient a step);
2. ``late``: fd GAM and SAM with ``--when=late:0.75`` (flat in the last quarter of the steps);
3. ``adaptive``: fd GAM with ``--when=adaptive`` (AE-SAM's trigger, the paper's defaults), and SGD
   under the same policy beside it. The policy reads a boolean on the host each step, between the
   graph of its probe (the gradient at θ) and the graph of the chosen branch; its SGD says how much
   of the price is that read rather than the flat steps.

The full-price forms, SAM and GAM (exact and fd) on every step, are not trained again: they are
`BORROWED` from the Fashion-MNIST table of the ``--sweep`` record (fmnist.json), the runs of the
same setting and seed, made by the same recipe and values; each keeps its "× SGD" against the SGD
of its own process there, and its device. That SGD comes with them (the form ``sgd@table``): each
form is compared with the SGD of its own process, since the SGD of one seed differs between
processes by run-to-run variation. "× SGD" of every cheap form is the steady-state images per
second of SGD in the ``every`` process of the same seed over the form's (`fmnist._row`: timed
between synchronisations of the device, the first interval of compilation and warm-up left out, so
that the process's first estimator does not carry the process's warm-up). MSAM's ρ and RWP's σ are not
swept here (SAM's ρ and the default σ).

**Time.** `estimate` predicts the whole run from the table of the committed fmnist.json (its SGD's
seconds a run, with `GUESS`'s multiples and `fmnist.OVERHEAD` a process's estimator besides the
steps); reproduce/RESULTS.md states it while the run is not made.

**Deadline.** ``--deadline=S`` (seconds from the start) starts a seed only when all its processes
are predicted to end before S (`GUESS` until a form has been measured, its last time after), clean
first, seed by seed; a process whose prediction no longer fits is skipped and recorded. A seed is
run whole because its × SGD needs its own SGD on the same machine. ``--settings`` and ``--seeds``
choose what a sitting runs, and ``--merge=JSON`` (repeatable) adds another run's seeds, of the same
device, torch and values, to ``--out``'s cheap.json, its processes in place of the record's skipped
ones of those seeds. ``--add=SETTING:SEED:FOLDER`` adds one seed the record lacks from its
train.py folders (the ``FOLDER/{every,late,adaptive}`` that this command wrote under ``--logdir``;
its ``every`` holds the seed's SGD) and the table's rows of that seed from ``--sweep``, training
nothing.

The JSON (``--out``, default ``runs/evidence/cheap/cheap.json``): device, torch, date, which RWP
code the run imported (`rwp_noise`), argv, the values used, every process (run or skipped) and
every seed's numbers per form: test accuracy, gap, λ_max, R1, train seconds and × SGD.
`reproduce.evidence.cheap_report` renders the tables, the goal verdict and the Pareto figure from
it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from pathlib import Path

if not __package__:  # run as a file: the checkout's root on sys.path (reproduce/__init__.py)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from reproduce.evidence import fmnist
from reproduce.evidence.cheap_report import (
    BORROWED,
    FORMS,
    PER_TENSOR,
    TABLE_SGD,
    cheap_table,
    form,
    write_section,
)
from reproduce.run.report import write_json

__all__ = [
    "BORROWED",
    "GROUPS",
    "GUESS",
    "Runner",
    "add_seed",
    "borrow",
    "cheap_table",
    "estimate",
    "main",
    "merge",
    "run_platform",
    "rwp_noise",
    "table",
    "values",
]

ROOT = fmnist.ROOT
EVIDENCE = (
    ROOT / "reproduce" / "results" / "fmnist" / "cheap.json"
)  # the committed record, once run
# group -> (its --when, its estimators, its other arguments); the first group measures SGD
GROUPS = {
    "every": ("", ("sgd", "look_gam", "msam", "rwp"), ()),
    "late": ("late:0.75", ("gam_fd", "sam"), ()),
    "adaptive": ("adaptive", ("sgd", "gam_fd"), ()),
}
# (group, estimator) -> the multiple of SGD's time (every group) before one is measured: the
# fmnist table's multiples (w32-15, one H100: SAM 1.5, fd GAM 2.9) rounded up, LookGAM a third of
# the way from SGD to exact GAM, the late forms 0.75 + 0.25 × their full multiple, the adaptive
# process a guess (a host read a step; fd GAM flat on about half of the steps)
GUESS = {
    ("every", "sgd"): 1.0,
    ("every", "look_gam"): 3.0,
    ("every", "msam"): 1.2,
    ("every", "rwp"): 1.2,
    ("late", "gam_fd"): 1.5,
    ("late", "sam"): 1.2,
    ("adaptive", "sgd"): 1.3,
    ("adaptive", "gam_fd"): 2.5,
}
CONFIG = ("when", "mode", "look_k", "msam_momentum", "rwp_sigma")  # kept beside fmnist's


class Runner(fmnist.Runner):
    """`fmnist.Runner` whose predictions know the group: a form's last time, by (group, estimator)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.group, self.times = "every", {}

    def predict(self, estimators: tuple[str, ...], group: str | None = None) -> float:
        group = group or self.group
        sgd = self.times.get(("every", "sgd"), 15.0)
        return sum(
            self.times.get((group, e), GUESS[group, e] * sgd) + fmnist.OVERHEAD for e in estimators
        )

    def __call__(self, name, preset, estimators, args, group="every"):
        self.group = group
        got = super().__call__(name, preset, estimators, args)
        for s in (got or {}).get("summaries", []):
            self.times[group, s["estimator"]] = s["train_seconds"]
        return got

    def left(self) -> float:
        """Seconds to the deadline (infinite without one)."""
        if not self.deadline:
            return float("inf")
        return self.deadline - (time.perf_counter() - self.start)

    def predict_seed(self) -> float:
        return sum(self.predict(est, g) for g, (_, est, _) in GROUPS.items())


def values(recipe_json: dict, sweep_json: dict) -> dict:
    """The recipe's name and arguments and the sweep's selected values, from fmnist.json records:
    the recipe stage's choice, else the recipe the sweep ran on. Raises ValueError when either is
    missing."""
    name = (recipe_json.get("recipe") or {}).get("selected")
    name = name or (recipe_json.get("sweep") or {}).get("recipe")
    if name not in fmnist.RECIPES:
        raise ValueError(f"--recipe: no recipe chosen in that JSON (one of {list(fmnist.RECIPES)})")
    selected = (sweep_json.get("sweep") or {}).get("selected") or {}
    missing = [k for k in ("sam_rho", "rho", "alpha") if selected.get(k) is None]
    if missing:
        raise ValueError(f"--sweep: that JSON's sweep selected no {', '.join(missing)}")
    return {"recipe": name, "args": list(fmnist.RECIPES[name]), "selected": selected}


def estimate(fmnist_record: dict) -> float:
    """Minutes of one GPU for the whole run (both settings, every seed), predicted from the clean
    table of ``fmnist_record``: its SGD's mean seconds a run × `GUESS`, and `fmnist.OVERHEAD` an
    estimator."""
    sgd = [r["train_seconds"] for r in fmnist_record["runs"]["clean"]["sgd"]]
    a_seed = sum(m * statistics.mean(sgd) + fmnist.OVERHEAD for m in GUESS.values())
    return a_seed * len(fmnist.SETTINGS) * len(fmnist.SEEDS) / 60


def rwp_noise() -> str:
    """Which RWP code this process imported: "one draw" where `gamfunc.estimators.rwp` has
    ``normals`` (one draw of the noise covers many tensors), else "per tensor" (the earlier code,
    a draw per tensor); a run's × SGD of RWP times that code."""
    module = importlib.import_module("gamfunc.estimators.rwp")
    return "one draw" if hasattr(module, "normals") else PER_TENSOR


def run_platform() -> dict:
    """The record's ``platform``: `fmnist._device`'s device, torch, Python and date, and which RWP
    code the run timed (`rwp_noise`)."""
    return {**fmnist._device(), "rwp_noise": rwp_noise()}


def borrow(by: dict[str, list], table_runs: dict[str, list], seed: int, device: str) -> None:
    """Append to ``by`` (form -> rows) the rows of ``seed`` from the fmnist table's runs of one
    setting (``table_runs``: estimator -> rows), marked with the table and ``device``: the
    `BORROWED` forms' and their process's SGD, as `TABLE_SGD`, the one they are compared with."""
    for f, e in ((TABLE_SGD, "sgd"), *((b, b) for b in BORROWED)):
        for r in table_runs.get(e, []):
            if r["seed"] == seed:
                by.setdefault(f, []).append({**r, "group": "table", "device": device})


def _args(v: dict, seed: int) -> list[str]:
    return [*v["args"], f"--seed={seed}", *(f"--{k}={v['selected'][k]:g}" for k in v["selected"])]


def add_seed(by: dict[str, list], seed: int, groups: dict[str, list[dict]]) -> bool:
    """Append one seed's summaries (group -> summaries) to ``by`` (form -> rows), each with its
    cost as a multiple of SGD's in the ``every`` group (steady-state images per second); nothing
    without that SGD. Whether it was added."""
    sgd = next((s for s in groups.get("every", []) if s["estimator"] == "sgd"), None)
    if sgd is None:
        return False
    for group, summaries in groups.items():
        for s in summaries:
            row = fmnist._row(s, sgd["images_per_s"])
            row["config"] |= {k: s["config"].get(k) for k in CONFIG}
            by[form(group, s["estimator"])].append({"seed": seed, "group": group, **row})
    return True


def table(
    run: Runner, v: dict, settings, seeds, save=lambda runs, processes: None, full=None
) -> tuple:
    """Every group × setting (of ``settings``) × seed (of ``seeds``), clean first, seed by seed; a
    seed starts only when all its processes fit before the deadline; with ``full`` (a fmnist.json
    record), each seed that ran gets its table's rows (`borrow`). ``(runs, processes)``."""
    runs = {s: {f: [] for f in FORMS} for s in fmnist.SETTINGS}
    processes = []
    for setting in settings:
        preset = fmnist.SETTINGS[setting]
        for seed in seeds:
            where = {"setting": setting, "seed": seed}
            if run.predict_seed() > run.left():
                print(f"skip {setting} seed {seed}: about {run.predict_seed():.0f} s", flush=True)
                processes += [{**where, "group": g, "run": False} for g in GROUPS]
                continue
            got = {}
            for group, (when, estimators, extra) in GROUPS.items():
                args = [*_args(v, seed), *([f"--when={when}"] if when else []), *extra]
                name = f"cheap/{preset}/seed={seed}/{group}"
                out = run(name, preset, estimators, args, group=group)
                done = {"exit": out["exit"], "wall_seconds": out["wall_seconds"]} if out else {}
                processes.append({**where, "group": group, "run": out is not None, **done})
                if out is None:
                    break  # the deadline: the seed's later groups would not fit either
                if group == "every" and not any(x["estimator"] == "sgd" for x in out["summaries"]):
                    break  # no SGD of this seed: its other groups would have no × SGD
                got[group] = out["summaries"]
            add_seed(runs[setting], seed, got)
            if full is not None and runs[setting]["sgd"]:
                device = full["platform"]["device"]
                borrow(runs[setting], full["runs"][setting], seed, device)
            save(runs, processes)
    return runs, processes


def _read_folder(folder: Path) -> dict[str, list[dict]]:
    got = {}
    for group, (_, estimators, _) in GROUPS.items():
        paths = [folder / group / e / "summary.json" for e in estimators]
        got[group] = [json.loads(p.read_text()) for p in paths if p.is_file()]
    return got


def _torch(record: dict) -> str:
    return record["platform"]["torch"].split("+")[0]


def merge(record: dict, other: dict) -> list[tuple[str, int]]:
    """Add to ``record`` the seeds of ``other`` (a cheap.json) that it lacks, per setting, with the
    processes of those seeds in place of the record's skipped ones, and name the run that measured
    them in ``record["added"]`` (its argv, date, seconds and `rwp_noise`). Raises ValueError unless
    both are of one device, one torch (its version before "+") and one recipe and values. The
    (setting, seed) pairs added."""
    mine, theirs = record["platform"], other["platform"]
    if theirs["device"] != mine["device"]:
        raise ValueError(
            f"--merge: measured on {theirs['device']}, not {mine['device']}: × SGD compares "
            "times of one device"
        )
    if _torch(other) != _torch(record):
        raise ValueError(
            f"--merge: measured with torch {_torch(other)}, not {_torch(record)}: × SGD compares "
            "the times of one torch's kernels"
        )
    if other.get("values") != record.get("values"):
        raise ValueError(
            f"--merge: its values (recipe, args, selected) {other.get('values')} are not the "
            f"record's {record.get('values')}: its seeds would train another model"
        )
    added = []
    for setting, by in other["runs"].items():
        runs = record["runs"].setdefault(setting, {})
        have = {r["seed"] for rs in runs.values() for r in rs}
        new = sorted({r["seed"] for rs in by.values() for r in rs} - have)
        for f, rs in by.items():
            runs.setdefault(f, []).extend(r for r in rs if r["seed"] in new)
        added += [(setting, s) for s in new]
    record["processes"] = [
        p for p in record.get("processes", []) if p["run"] or (p["setting"], p["seed"]) not in added
    ] + [p for p in other.get("processes", []) if (p["setting"], p["seed"]) in added]
    run = {
        "argv": other["settings"].get("argv", []),
        "date": theirs["date"],
        "seconds": other.get("seconds"),
        "rwp_noise": theirs.get("rwp_noise"),
    }
    record.setdefault("added", []).extend({"setting": s, "seed": n, **run} for s, n in added)
    return added


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m reproduce.evidence.cheap", description=__doc__)
    ap.add_argument("--data", default="", help="Fashion-MNIST's four IDX files")
    ap.add_argument("--docs", action="store_true", help="write RESULTS.md's section; no run")
    ap.add_argument("--recipe", default=str(fmnist.EVIDENCE), help="fmnist.json: its recipe")
    ap.add_argument("--sweep", default=str(fmnist.EVIDENCE), help="fmnist.json: its sweep's values")
    ap.add_argument("--settings", default=",".join(fmnist.SETTINGS), help="of clean,noise40")
    ap.add_argument("--seeds", default=",".join(map(str, fmnist.SEEDS)), help="of 0,1,2")
    ap.add_argument("--deadline", type=float, default=0.0, help="seconds; 0: no deadline")
    ap.add_argument("--out", default="runs/evidence/cheap", help="folder of cheap.json")
    ap.add_argument("--logdir", default="runs/cheap", help="train.py's runs")
    ap.add_argument("--add", action="append", default=[], help="SETTING:SEED:FOLDER")
    ap.add_argument("--merge", action="append", default=[], help="another cheap.json")
    return ap


def _complete(args, ap) -> int:
    """--add and --merge: into --out's cheap.json, training nothing."""
    path = Path(args.out) / "cheap.json"
    if not path.is_file():
        ap.error(f"--add/--merge: no {path} to add to")
    record = json.loads(path.read_text())
    if args.add:  # the table whose rows of each added seed come beside it
        try:
            full = json.loads(Path(args.sweep).read_text())
        except (OSError, ValueError) as e:
            ap.error(f"--sweep: {e}")
    for item in args.add:
        setting, seed, folder = [*item.split(":", 2), "", ""][:3]
        if setting not in fmnist.SETTINGS or not seed.isdigit() or not folder:
            ap.error(
                f"--add: SETTING:SEED:FOLDER with SETTING of {list(fmnist.SETTINGS)}; {item!r}"
            )
        by, n = record["runs"].setdefault(setting, {f: [] for f in FORMS}), int(seed)
        if any(r["seed"] == n for rs in by.values() for r in rs):
            ap.error(f"--add: {setting} seed {n} is in the record already")
        if not add_seed(by, n, _read_folder(Path(folder))):
            ap.error(
                f"--add: no SGD in {Path(folder) / 'every'}: the seed's forms would have no × SGD"
            )
        borrow(by, full.get("runs", {}).get(setting, {}), n, full["platform"]["device"])
        record.setdefault("added", []).append({"setting": setting, "seed": n})
    for other in args.merge:
        try:
            merge(record, json.loads(Path(other).read_text()))
        except (OSError, ValueError) as e:
            ap.error(str(e))
    write_json(path, record)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args, extra = ap.parse_known_args(argv)
    if args.docs:
        record = json.loads(EVIDENCE.read_text()) if EVIDENCE.is_file() else None
        minutes = estimate(json.loads(fmnist.EVIDENCE.read_text()))
        write_section(
            record, ROOT / "reproduce" / "RESULTS.md", EVIDENCE.with_suffix(".png"), minutes
        )
        return 0
    settings = tuple(args.settings.split(","))
    if not set(settings) <= set(fmnist.SETTINGS):
        ap.error(f"--settings: each of {', '.join(fmnist.SETTINGS)}; got {args.settings!r}")
    parts = args.seeds.split(",")
    if not all(p.isdigit() for p in parts) or len(set(parts)) < len(parts):
        ap.error(f"--seeds: distinct integers >= 0, comma-separated; got {args.seeds!r}")
    if args.deadline < 0:
        ap.error(f"--deadline: seconds >= 0; got {args.deadline:g}")
    if args.add or args.merge:
        return _complete(args, ap)
    if not args.data:
        ap.error("--data: the folder of Fashion-MNIST's four IDX files")
    try:
        full = json.loads(Path(args.sweep).read_text())
        v = values(json.loads(Path(args.recipe).read_text()), full)
    except (OSError, ValueError) as e:
        ap.error(str(e))
    run = Runner(args.data, Path(args.logdir), args.deadline, extra)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    given = sys.argv[1:] if argv is None else argv
    shown = [a for a in given if not a.startswith(("--data=", "--out=", "--logdir="))]
    record = {
        "settings": {"command": "cheap", "extra": extra, "argv": ["--data=DIR", *shown]},
        "platform": run_platform(),
        "values": v,
        "groups": {
            g: {"when": w, "estimators": list(e), "args": list(a)}
            for g, (w, e, a) in GROUPS.items()
        },
    }

    def save(runs, processes) -> None:
        record.update(runs=runs, processes=processes)
        record["seconds"] = round(time.perf_counter() - run.start, 1)
        write_json(out / "cheap.json", record)

    seeds = tuple(int(p) for p in parts)
    save(*table(run, v, settings, seeds, save, full if full.get("runs") else None))
    print(f"{record['seconds']} s; {out / 'cheap.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
