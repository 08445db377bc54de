"""Grid search over any configuration fields × seeds: one table of mean ± std, selected on validation.

The paper picks ρ and α by a grid search on a validation split (10% of the training set) and reports
mean ± std over seeds. This script runs such a sweep with ``reproduce/train.py``:

```bash
python reproduce/sweep.py --grid=rho=0.05,0.1 --grid=alpha=0.1,1 --seeds=0,1 -- \\
    --preset=digits --estimator=gam --val_fraction=0.2 --epochs=1 \\
    --eig_iters=0 --trace_samples=0 --r1_steps=0 --landscape=false --progress=false
```

trains the 2 × 2 cells with seeds 0 and 1 (8 runs of one epoch, about 10 seconds on 2 CPU cores),
then prints the table it writes to ``runs/sweep.digits/sweep.md`` (and ``sweep.json``) and the cell
it selects. With torch 2.14.1 on the CPU it ends with (after a line per run and the table's caption;
other torch versions round differently):

```text
| rho | alpha | seeds | val_acc (%) | test_acc (%) | note |
|---:|---:|---:|---:|---:|:--|
| 0.05 | 0.1 | 2 | 37.46 ± 11.09 | 36.81 ± 10.80 |  |
| 0.05 | 1 | 2 | 37.80 ± 10.10 | 37.36 ± 10.41 | selected |
| 0.1 | 0.1 | 2 | 37.11 ± 10.59 | 36.81 ± 10.80 |  |
| 0.1 | 1 | 2 | 37.80 ± 9.61 | 38.47 ± 7.66 |  |

selected rho=0.05 alpha=1: val_acc 37.80 ± 10.10 (2 seeds); test_acc beside it 37.36 ± 10.41
```

(one epoch is a smoke test: the two best cells tie on validation, the first in grid order is taken,
and the last cell's higher test accuracy plays no part).

Arguments before ``--`` are the sweep's; those after it go to every ``reproduce/train.py`` run:

* ``--grid=KEY=V1,V2,...`` (repeatable): a field of `reproduce.config.Config` and its values;
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
  ``reproduce/sweeps/vmap_grid.py``, whose docstring says what the grid may vary there (lr, rho,
  alpha, sam_rho, rho_prime, beta, gamma, weight_decay), which batches the members share (those
  of ``--data_seed=S``, default the first seed) and what a rerun reuses.

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

Exit status: 0 when no run failed (a cell with a run that diverged is marked and never selected), 3
when every cell has a run that diverged, so that nothing can be selected (as ``train.py`` exits 3 for a
run that did not train), 2 for bad arguments or a run that could not run (one line on stderr each), 128 + signal number
when stopped by SIGINT/SIGTERM (running runs write a checkpoint first; rerun the command to continue).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if not __package__:  # run as a file: the checkout's root on sys.path (reproduce/__init__.py)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reproduce.config import parse_overrides
from reproduce.sweeps.grid import diverged_reason, execute, finished_summary
from reproduce.sweeps.plan import SweepError, check_writable, plan
from reproduce.sweeps.table import METRICS, every_cell_diverged, outcome, write_tables

__all__ = ["main", "parse"]

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
        from reproduce.sweeps import vmap_grid

        return vmap_grid.run(opts, rest, grid)
    try:
        name, root, runs = plan(rest, grid, opts.seeds, opts.name)
        check_writable(opts, root)
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
    done, signum = execute([runs[i] for i in todo], opts.jobs, opts.gpus)
    results = {todo[j]: r for j, r in done.items()}
    outcomes = {}
    failed = False
    try:
        for i, run in enumerate(runs):
            code, why = results.get(i, (None, ""))
            summary = reused.get(i)
            if summary is None and code == 0:
                summary = finished_summary(run)
            if code == 3 and not why:  # trained in this process: its summary says why
                why = diverged_reason(run)
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
    rows = write_tables(opts, rest, grid, name, root, runs, outcomes, counts)
    if signum is not None:
        print(f"stopped by signal {signum}; rerun the same command to continue", file=sys.stderr)
        return 128 + signum
    if failed:
        return 2
    return 3 if every_cell_diverged(rows) else 0


if __name__ == "__main__":
    sys.exit(main())
