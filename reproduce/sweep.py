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
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `reproduce` and `gamfunc` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reproduce import train
from reproduce.config import differences, parse_overrides
from reproduce.sweep_plan import Cell, Run, SweepError, plan
from reproduce.sweep_table import METRICS, aggregate, markdown, outcome, select, write_tables

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

# fields the sweep sets itself, per run
OWN = ("seed", "name", "resume", "overwrite")


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
            outcomes[i] = outcome(run, summary, code, why, opts.metric) | {"reused": i in reused}
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
