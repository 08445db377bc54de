"""Grid search over any configuration fields × seeds: one table of mean ± std, selected on validation.

The paper picks ρ and α by a grid search on a validation split (10% of the training set) and reports
mean ± std over seeds. This script runs such a sweep with ``reproduce/train.py``::

    python reproduce/sweep.py --grid=rho=0.05,0.1 --grid=alpha=0.1,1 --seeds=0,1 -- \\
        --preset=digits --estimator=gam --val_fraction=0.2 --epochs=1 \\
        --eig_iters=0 --trace_samples=0 --r1_steps=0 --landscape=false --progress=false

trains the 2 × 2 cells with seeds 0 and 1 (8 runs of one epoch, about 10 seconds on 2 CPU cores),
then prints the table it writes to ``runs/sweep.digits/sweep.md`` (and ``sweep.json``) and the cell
it selects. With torch 2.14.1 on the CPU it ends with (after a line per run and the table's caption;
other torch versions round differently)::

    | rho | alpha | seeds | val_acc (%) | test_acc (%) | note |
    |---:|---:|---:|---:|---:|:--|
    | 0.05 | 0.1 | 2 | 37.46 ± 11.09 | 36.81 ± 10.80 |  |
    | 0.05 | 1 | 2 | 37.80 ± 10.10 | 37.36 ± 10.41 | selected |
    | 0.1 | 0.1 | 2 | 37.11 ± 10.59 | 36.81 ± 10.80 |  |
    | 0.1 | 1 | 2 | 37.80 ± 9.61 | 38.47 ± 7.66 |  |

    selected rho=0.05 alpha=1: val_acc 37.80 ± 10.10 (2 seeds); test_acc beside it 37.36 ± 10.41

(one epoch is a smoke test: the two best cells tie on validation, the first in grid order is taken,
and the last cell's higher test accuracy plays no part).

Arguments before ``--`` are the sweep's; those after it go to every ``reproduce/train.py`` run:

* ``--grid=KEY=V1,V2,...`` (repeatable): a field of :class:`reproduce.config.Config` and its values;
  the cells are every combination, in the order given.
* ``--seeds=0,1,2``: the seeds of every cell (default ``0``); ``--seed`` itself is the sweep's.
* ``--metric=val_acc`` (the last epoch's validation accuracy, with the test accuracy of that epoch
  beside it) or ``--metric=best_val_acc`` (the best epoch's validation accuracy, with the test accuracy
  of that same epoch).
* ``--jobs=N``: runs at once. ``1`` (the default) trains in this process, one run after another;
  ``N > 1`` starts ``reproduce/train.py`` subprocesses (add ``--threads=K`` after ``--`` so that
  ``N × K`` stays within the CPU cores). A subprocess's output goes to ``train.log`` in its run folder.
* ``--gpus=0,1,2,3``: one subprocess per listed GPU at a time (``CUDA_VISIBLE_DEVICES`` and
  ``--device=cuda``); list a GPU twice to run two runs on it. ``--jobs`` is then the number of entries.
* ``--name=BASE``: the sweep's folder under ``--logdir`` (default ``sweep.<preset>``); ``--out=DIR``:
  where the tables go (default that folder).
* ``--vmap``: every cell × seed as a member of one vmapped step, trained together in this process
  on one device, for models small enough that one run leaves the device idle (MNIST-1D, digits):
  a table of the same form (other numbers: the members share one seed's data), from
  ``reproduce/vmap_sweep.py``, whose docstring says what the grid may vary
  there (lr, rho, alpha, sam_rho, rho_prime), which batches the members share (those of
  ``--data_seed=S``, default the first seed) and what a rerun reuses.

Every run is ``<logdir>/<BASE>/<k1=v1,k2=v2>/seed=<s>/<estimator>/`` (a whole ``train.py`` run folder:
TensorBoard events, checkpoints, ``summary.json``), so ``tensorboard --logdir <logdir>/<BASE>`` shows
the whole sweep. Rerunning the same command reuses each finished run whose saved configuration matches
(its ``summary.json``; nothing is retrained) and continues unfinished ones from their checkpoints
(``train.py --resume``, given only to runs that have one), so a sweep stopped by Ctrl-C, a crash or a
time limit goes on where it was. A signal stops the runs that train (each writes its checkpoint),
starts no other, and writes the tables.

Selection reads the validation metric only: the cell with the highest mean over its seeds, among the
cells whose every seed finished (ties, to 1e-9 points: the first in grid order). The test metric is carried beside it
for the report and never compared. Without a validation split (``--val_fraction`` > 0) the sweep
refuses to start. A run that diverges (``train.py`` exit 3) marks its cell ``diverged``; such a cell is
never selected. The std is the sample standard deviation over seeds (n − 1; none for one seed).

Exit status: 0 when every run finished or diverged, 2 for bad arguments or a run that could not run
(one line on stderr each), 128 + signal number when stopped by SIGINT/SIGTERM (running runs write a
checkpoint first; rerun the command to continue).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `reproduce` and `gamfunc` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reproduce import report, train
from reproduce.config import Config, differences, estimators_of, parse_overrides, resolve, run_name

__all__ = [
    "METRICS",
    "Cell",
    "Run",
    "aggregate",
    "main",
    "markdown",
    "parse",
    "plan",
    "select",
    "write_tables",
]

TRAIN = Path(__file__).resolve().parent / "train.py"

# metric -> (where in summary.json, the validation key, the test key read beside it, its description)
METRICS = {
    "val_acc": ("final", "val_acc", "test_acc", "the last epoch's validation accuracy"),
    "best_val_acc": ("best_val", "val_acc", "test_acc", "the best epoch's validation accuracy"),
}
# fields the sweep sets itself, per run
OWN = ("seed", "name", "resume", "overwrite")


class SweepError(ValueError):
    """The sweep cannot run as asked; the message says why."""


@dataclasses.dataclass(frozen=True)
class Cell:
    """One combination of the grid's values: ``((key, text), ...)`` in grid order."""

    values: tuple[tuple[str, str], ...]

    @property
    def label(self) -> str:
        """``rho=0.05,alpha=0.1``: the cell's folder under the sweep's and its name in the tables."""
        return ",".join(f"{k}={v}" for k, v in self.values) or "base"


@dataclasses.dataclass(frozen=True)
class Run:
    """One ``train.py`` run of a sweep: a cell and a seed."""

    cell: Cell
    seed: int
    argv: tuple[str, ...]  # train.py's command line (without a device)
    config: Config  # its resolved configuration
    run_dir: Path  # <logdir>/<name>/<estimator>: where summary.json is written


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """The sweep's arguments and ``train.py``'s: before and after the first ``--``."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def _ints(text: str) -> list[int]:
    """``"0,1,2"`` → ``[0, 1, 2]``: distinct integers >= 0 (seeds, GPU indices)."""
    try:
        out = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected integers separated by commas; got {text!r}"
        ) from None
    if not out or len(set(out)) != len(out) or min(out) < 0:
        raise argparse.ArgumentTypeError(f"expected distinct integers >= 0; got {text!r}")
    return out


def _parser() -> argparse.ArgumentParser:
    """The sweep's own options (those before ``--``); ``--help`` shows this module's docstring."""
    p = argparse.ArgumentParser(
        prog="reproduce/sweep.py",
        usage="python reproduce/sweep.py --grid=KEY=V1,V2 [--grid=...] [--seeds=0,1,2] "
        "[--metric=val_acc|best_val_acc] [--jobs=N] [--gpus=0,1] [--name=BASE] [--out=DIR] "
        "[--vmap [--data_seed=S]] -- TRAIN_ARGS...",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2")
    p.add_argument("--seeds", type=_ints, default=[0], metavar="S1,S2")
    p.add_argument("--metric", choices=sorted(METRICS), default="val_acc")
    p.add_argument("--jobs", type=int, default=0, metavar="N")
    p.add_argument("--gpus", type=_ints, default=None, metavar="G1,G2")
    p.add_argument("--name", default="", metavar="BASE")
    p.add_argument("--out", default="", metavar="DIR")
    p.add_argument("--vmap", action="store_true")
    p.add_argument("--data_seed", "--data-seed", type=int, default=None, metavar="S")
    return p


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str], list[tuple[str, list[str]]]]:
    """``(sweep options, train.py arguments, grid)``, the grid as ``[(field, [value texts]), ...]``.

    Raises:
        SweepError: a grid entry is malformed, names a field twice or one the sweep sets itself, or
            ``--jobs`` contradicts ``--gpus``.
        SystemExit: argparse's own errors and ``--help``.
    """
    own, rest = _split(argv)
    opts = _parser().parse_args(own)
    grid: list[tuple[str, list[str]]] = []
    for entry in opts.grid:
        key, eq, text = entry.partition("=")
        key = key.strip().lstrip("-").replace("-", "_")
        values = [v.strip() for v in text.split(",") if v.strip()]
        if not eq or not values:
            raise SweepError(f"--grid takes KEY=V1,V2,...; got {entry!r}")
        if key in OWN:
            raise SweepError(f"--grid={entry}: {key} is set by the sweep (use --seeds for seeds)")
        if any(k == key for k, _ in grid):
            raise SweepError(f"--grid names {key} twice")
        if len(set(values)) != len(values) or any("/" in v for v in values):
            raise SweepError(f"--grid={entry}: values must be distinct and hold no '/'")
        grid.append((key, values))
    try:
        given = {k for k, _ in parse_overrides(rest)}
    except ValueError as e:
        raise SweepError(f"train.py arguments: {e}") from None
    for key in sorted(given & (set(OWN) | {k for k, _ in grid})):
        why = "is in --grid" if key not in OWN else "is set by the sweep"
        raise SweepError(f"--{key} after -- {why}; leave it out of train.py's arguments")
    if opts.gpus is not None:
        if opts.jobs and opts.jobs != len(opts.gpus):
            raise SweepError(
                f"--jobs={opts.jobs} but --gpus lists {len(opts.gpus)} slot(s): one run per entry "
                "(list a GPU twice to run two runs on it)"
            )
        opts.jobs = len(opts.gpus)
    if opts.vmap and (opts.jobs or opts.gpus is not None):
        raise SweepError("--vmap trains every run in this process: leave out --jobs and --gpus")
    if opts.data_seed is not None and not opts.vmap:
        raise SweepError("--data_seed goes with --vmap (without it every run draws its own data)")
    if opts.data_seed is not None and opts.data_seed < 0:
        raise SweepError(f"--data_seed must be >= 0; got {opts.data_seed}")
    opts.jobs = opts.jobs or 1
    if opts.jobs < 1:
        raise SweepError(f"--jobs must be >= 1; got {opts.jobs}")
    return opts, rest, grid


def plan(
    rest: list[str], grid: list[tuple[str, list[str]]], seeds: list[int], name: str = ""
) -> tuple[str, Path, list[Run]]:
    """``(sweep name, sweep folder, runs)``: every cell × seed resolved and checked before any trains.

    Runs are ordered seed by seed (every cell of the first seed, then the next), so a partial sweep
    already compares every cell.

    Raises:
        SweepError: a value is invalid for its field, a cell trains other than one estimator, or there
            is no validation split to select on.
    """
    try:
        base_cfg = resolve(rest)
    except ValueError as e:
        raise SweepError(f"train.py arguments: {e}") from None
    name = name or f"sweep.{run_name(base_cfg)}"
    root = Path(base_cfg.logdir).expanduser() / name
    cells = [
        Cell(tuple(zip([k for k, _ in grid], combo, strict=True)))
        for combo in itertools.product(*(vs for _, vs in grid))
    ]
    runs = []
    for seed, cell in itertools.product(seeds, cells):
        argv = (
            *rest,
            *(f"--{k}={v}" for k, v in cell.values),
            f"--seed={seed}",
            f"--name={name}/{cell.label}/seed={seed}",
            "--resume",
        )
        try:
            cfg = resolve(list(argv))
        except ValueError as e:
            raise SweepError(f"cell {cell.label}: {e}") from None
        estimators = estimators_of(cfg)
        if len(estimators) != 1:
            raise SweepError(
                f"a sweep trains one estimator per cell; got --estimator={cfg.estimator}: pass "
                f"one after -- or compare them with --grid=estimator={','.join(estimators)}"
            )
        if cfg.val_fraction <= 0:
            raise SweepError(
                "the sweep selects on a validation split and this configuration has none: add "
                "--val_fraction=0.1 after -- (the paper holds out 10% of the training set); the "
                "test split is never used for selection"
            )
        run_dir = Path(cfg.logdir).expanduser() / run_name(cfg) / estimators[0]
        runs.append(Run(cell, seed, argv, cfg, run_dir))
    return name, root, runs


def finished_summary(run: Run) -> dict | None:
    """The run's ``summary.json`` if the run finished, else None.

    Raises:
        SweepError: the folder holds a finished run of another configuration (never reused silently).
    """
    path = run.run_dir / "summary.json"
    if not path.exists():
        return None
    summary = json.loads(path.read_text())
    if summary.get("status") != "finished":
        return None
    diff = differences(summary.get("config", {}), run.config)
    if diff:
        shown = ", ".join(f"{k}: {a!r} there, {b!r} here" for k, (a, b) in diff.items())
        raise SweepError(
            f"{str(run.run_dir)!r} holds a finished run of other settings ({shown}); give the "
            "sweep another --name or remove that folder"
        )
    return summary


def train_argv(run: Run) -> list[str]:
    """``train.py``'s command line for ``run``: with ``--resume`` only where the run has a
    checkpoint (it was stopped, or diverged), so that a run started afresh says nothing of resuming."""
    argv = list(run.argv)
    if not (run.run_dir / "checkpoint.pt").exists():
        argv.remove("--resume")
    return argv


def _last_error(log: Path) -> str:
    """The line of a run's log that says why it failed: its last ``error:`` line, else its last line."""
    try:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        lines = []
    errors = [ln for ln in lines if ln.startswith("error:")]
    return (errors or lines or ["(no output)"])[-1]


class _Runner:
    """Starts runs in this process (one slot, no GPU) or as subprocesses (one per slot) and forwards
    SIGINT/SIGTERM to running subprocesses, which then checkpoint and stop."""

    def __init__(self, slots: list[int | None], in_process: bool):
        self.in_process = in_process
        self.slots: queue.Queue = queue.Queue()
        for s in slots:
            self.slots.put(s)
        self.children: set[subprocess.Popen] = set()
        self.lock = threading.Lock()
        self.signum: int | None = None

    def stop(self, signum, frame) -> None:
        """Signal handler: no new runs start; running subprocesses get the signal."""
        self.signum = self.signum or signum
        with self.lock:
            for p in self.children:
                with contextlib.suppress(OSError):
                    p.send_signal(signum)

    def __call__(self, run: Run) -> tuple[int | None, str]:
        """Train ``run``; its exit status (None: not started, the sweep is stopping) and, if it
        failed, the line saying why."""
        if self.signum is not None:
            return None, "not started (stopped)"
        if self.in_process:
            return train.main(train_argv(run)), ""
        gpu = self.slots.get()
        try:
            env = dict(os.environ)
            argv = train_argv(run)
            if gpu is not None:
                env["CUDA_VISIBLE_DEVICES"] = str(gpu)
                argv.append("--device=cuda")
            log = run.run_dir.parent / "train.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "a") as f:
                with self.lock:
                    if self.signum is not None:
                        return None, "not started (stopped)"
                    p = subprocess.Popen(
                        [sys.executable, str(TRAIN), *argv],
                        stdout=f,
                        stderr=subprocess.STDOUT,
                        env=env,
                    )
                    self.children.add(p)
                code = p.wait()
                with self.lock:
                    self.children.discard(p)
            if code < 0:  # killed by a signal before train.py handled it (while importing)
                code = 128 - code
            return code, (_last_error(log) + f" (log: {log})" if code else "")
        finally:
            self.slots.put(gpu)


def _execute(runs: list[Run], jobs: int, gpus: list[int] | None) -> tuple[dict, int | None]:
    """Train every run not finished yet; ``({run index: (exit status, why)}, stopping signal)``."""
    in_process = jobs == 1 and gpus is None
    runner = _Runner(gpus if gpus is not None else [None] * jobs, in_process)
    done: dict[int, tuple[int, str]] = {}
    total = len(runs)

    def one(i: int) -> None:
        run = runs[i]
        began = time.perf_counter()
        code, why = runner(run)
        done[i] = (code, why)
        if code is not None:
            what = {0: "finished", 3: "diverged"}.get(code, f"failed (exit {code}): {why}")
            if code > 128:
                what = f"stopped by signal {code - 128}; rerun the sweep to continue"
            print(
                f"[sweep {len(done)}/{total}] {run.cell.label} seed={run.seed}: {what} "
                f"({time.perf_counter() - began:.0f} s)",
                flush=True,
            )
        if code is not None and code > 128:
            runner.signum = runner.signum or code - 128

    # In process, train.main installs its own handlers while it trains; these take a signal between
    # runs, so that no new run starts and the tables are written.
    handlers = {s: signal.signal(s, runner.stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if in_process:
            for i in range(total):
                one(i)
                if runner.signum is not None:
                    break
        else:
            with ThreadPoolExecutor(max_workers=jobs) as pool:
                futures = [pool.submit(one, i) for i in range(total)]
                while not all(f.done() for f in futures):
                    time.sleep(0.2)  # the main thread stays free to take signals
                for f in futures:
                    f.result()
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    return done, runner.signum


def _mean_std(xs: list[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (n − 1; None for fewer than two values)."""
    if not xs:
        return None, None
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, None
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def aggregate(runs: list[Run], outcomes: dict[int, dict[str, Any]], seeds: list[int]) -> list[dict]:
    """One row per cell: ``{"cell", "values", "seeds" {seed: outcome}, "n", "val_mean", "val_std",
    "test_mean", "test_std", "status"}``.

    ``outcomes[i]`` is run i's ``{"status", "val", "test", ...}``; status is ``complete`` when every
    seed finished, else ``diverged``, ``failed`` or ``incomplete``.
    """
    rows: dict[Cell, dict] = {}
    for i, run in enumerate(runs):
        row = rows.setdefault(
            run.cell, {"cell": run.cell.label, "values": dict(run.cell.values), "seeds": {}}
        )
        row["seeds"][str(run.seed)] = outcomes.get(i, {"status": "not run"})
    for row in rows.values():
        ok = [o for o in row["seeds"].values() if o["status"] == "finished"]
        row["n"] = len(ok)
        row["val_mean"], row["val_std"] = _mean_std([o["val"] for o in ok])
        row["test_mean"], row["test_std"] = _mean_std(
            [o["test"] for o in ok if o["test"] is not None]
        )
        statuses = {o["status"] for o in row["seeds"].values()}
        row["status"] = (
            "complete"
            if len(ok) == len(seeds)
            else next((s for s in ("diverged", "failed") if s in statuses), "incomplete")
        )
    return list(rows.values())


def select(rows: list[dict]) -> dict | None:
    """The cell of highest mean validation metric among complete cells (first in grid order on a
    tie), or None. Reads ``val_mean`` only: the test metric plays no part."""
    best = None
    for row in rows:
        # means equal up to float rounding (1e-9 points) count as a tie: the first cell stays
        if row["status"] == "complete" and (
            best is None or row["val_mean"] > best["val_mean"] + 1e-9
        ):
            best = row
    return best


def _pm(mean: float | None, std: float | None) -> str:
    """``mean ± std`` to two decimals, ``–`` for a missing value."""
    if mean is None:
        return "–"
    return f"{mean:.2f} ± {std:.2f}" if std is not None else f"{mean:.2f} ± –"


def _test_name(metric: str) -> str:
    """The name of the test value reported beside ``metric``."""
    return "test_acc" if metric == "val_acc" else "test_acc at best val"


def markdown(
    rows: list[dict], keys: list[str], metric: str, chosen: dict | None, caption: str
) -> str:
    """The sweep's table in Markdown: one row per cell, mean ± std over seeds of ``metric`` and of the
    test accuracy beside it, the selected cell marked."""
    head = [*keys, "seeds", f"{metric} (%)", f"{_test_name(metric)} (%)", "note"]
    lines = [
        caption,
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---:|" * (len(head) - 1) + ":--|",
    ]
    for row in rows:
        mark = (
            "selected" if row is chosen else ("" if row["status"] == "complete" else row["status"])
        )
        cells = [
            *(row["values"][k] for k in keys),
            str(row["n"]),
            _pm(row["val_mean"], row["val_std"]),
            _pm(row["test_mean"], row["test_std"]),
            mark,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _outcome(run: Run, summary: dict | None, code: int | None, why: str, metric: str) -> dict:
    """What the table needs of one run: status, the validation and test values, its folder."""
    out: dict[str, Any] = {"run_dir": str(run.run_dir)}
    if summary is None:
        # exit 0 without a finished summary: stopped early by --max_steps
        status = {0: "unfinished", 3: "diverged", None: "not run"}.get(code, "failed")
        if code is not None and code > 128:
            status = "stopped"
        return out | {"status": status, "exit": code, "why": why or None}
    where, val_key, test_key, _ = METRICS[metric]
    record = summary.get(where) or {}
    if record.get(val_key) is None:
        raise SweepError(f"{run.run_dir}/summary.json has no {where}.{val_key}")
    return out | {
        "status": "finished",
        "val": record[val_key],
        "test": record.get(test_key),
        "epoch": record.get("epoch"),
    }


def write_tables(
    opts: argparse.Namespace,
    rest: list[str],
    grid: list[tuple[str, list[str]]],
    name: str,
    root: Path,
    runs: list[Run],
    outcomes: dict[int, dict[str, Any]],
    counts: dict[str, int],
    how: str = "",
    extra: dict[str, Any] | None = None,
) -> None:
    """Aggregate ``outcomes`` (run index -> :func:`_outcome`), select on validation, write
    ``sweep.md`` and ``sweep.json`` (to ``--out`` or ``root``) and print the table and the selection.

    ``how`` ends the table's caption (how the runs were trained); ``extra`` joins the JSON."""
    rows = aggregate(runs, outcomes, opts.seeds)
    chosen = select(rows)
    keys = [k for k, _ in grid]
    est = runs[0].config.estimator if len({r.config.estimator for r in runs}) == 1 else "estimators"
    caption = (
        f"Sweep `{name}`: {est} on {runs[0].config.dataset}, seeds {', '.join(map(str, opts.seeds))}; "
        f"mean ± sample std over seeds of {METRICS[opts.metric][3]} ({opts.metric}, selects) and "
        f"of the test accuracy beside it (reported only).{how}"
    )
    table = markdown(rows, keys, opts.metric, chosen, caption)
    out_dir = Path(opts.out).expanduser() if opts.out else root
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "sweep.md").write_text(table + "\n")
    report.write_json(
        out_dir / "sweep.json",
        {
            "name": name,
            "metric": opts.metric,
            "test_metric": _test_name(opts.metric),
            "grid": dict(grid),
            "seeds": opts.seeds,
            "train_args": rest,
            "runs": counts,
            **(extra or {}),
            "cells": rows,
            "selected": chosen
            and {
                k: chosen[k]
                for k in ("cell", "values", "val_mean", "val_std", "test_mean", "test_std")
            },
        },
    )
    print()
    print(table)
    print()
    if chosen is not None:
        print(
            f"selected {' '.join(f'{k}={v}' for k, v in chosen['values'].items())}: {opts.metric} "
            f"{_pm(chosen['val_mean'], chosen['val_std'])} ({chosen['n']} seeds); "
            f"{_test_name(opts.metric)} beside it {_pm(chosen['test_mean'], chosen['test_std'])}"
        )
    else:
        print("no cell finished every seed: nothing selected")
    print(f"tables in {out_dir / 'sweep.md'} and {out_dir / 'sweep.json'}")


def main(argv: list[str] | None = None) -> int:
    """Run the sweep's command line ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        opts, rest, grid = parse(argv)
    except SystemExit as e:  # argparse: --help (0) or a malformed option (2), already printed
        return e.code if isinstance(e.code, int) else 2
    except SweepError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if opts.vmap:
        from reproduce import vmap_sweep

        return vmap_sweep.run(opts, rest, grid)
    try:
        name, root, runs = plan(rest, grid, opts.seeds, opts.name)
        reused = {i: s for i, r in enumerate(runs) if (s := finished_summary(r)) is not None}
    except SweepError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    todo = [i for i in range(len(runs)) if i not in reused]
    cells = len(runs) // len(opts.seeds)
    print(
        f"sweep {name}: {cells} cell(s) × {len(opts.seeds)} seed(s) = {len(runs)} runs in {root}; "
        f"{len(reused)} finished (reused), {len(todo)} to train, {opts.jobs} at a time",
        flush=True,
    )
    done, signum = _execute([runs[i] for i in todo], opts.jobs, opts.gpus)
    results = {todo[j]: r for j, r in done.items()}
    outcomes = {}
    failed = False
    try:
        for i, run in enumerate(runs):
            code, why = results.get(i, (None, ""))
            summary = reused.get(i)
            if summary is None and code == 0:
                summary = finished_summary(run)
            failed |= code is not None and code not in (0, 3) and code < 128
            outcomes[i] = _outcome(run, summary, code, why, opts.metric) | {"reused": i in reused}
    except SweepError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    counts = {
        "total": len(runs),
        "reused": len(reused),
        "trained": sum(1 for c, _ in results.values() if c == 0),
    }
    write_tables(opts, rest, grid, name, root, runs, outcomes, counts)
    if signum is not None:
        print(f"stopped by signal {signum}; rerun the same command to continue", file=sys.stderr)
        return 128 + signum
    return 2 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
