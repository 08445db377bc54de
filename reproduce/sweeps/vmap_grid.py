"""``reproduce/sweep.py --vmap``: every cell × seed of a sweep trained together, as one vmapped step.

    python reproduce/sweep.py --vmap --grid=rho=0.05,0.1 --grid=alpha=0.1,1 --seeds=0,1 -- \\
        --preset=digits --estimator=gam --val_fraction=0.2 --epochs=1 --progress=false

trains the 8 runs of the sweep's own example (2 × 2 cells × seeds 0 and 1) as the 8 members of one
[`gamfunc.ensemble.vmap_step`][gamfunc.training.ensemble.vmap_step], in this process on one device (`reproduce.sweeps.vmapped`), and writes
a table of the same form as the sweep without ``--vmap`` (not the same numbers: see "Data order"
below) to ``runs/sweep.digits.vmap/sweep.md`` and ``sweep.json``: mean ± std over seeds, the cell
selected on the validation split only, the test accuracy beside it and never compared. With torch 2.14.1 on the CPU (about 9 seconds on 2 cores) it
ends with:

```text
| rho | alpha | seeds | val_acc (%) | test_acc (%) | note |
|---:|---:|---:|---:|---:|:--|
| 0.05 | 0.1 | 2 | 30.49 ± 1.23 | 30.14 ± 1.37 | selected |
| 0.05 | 1 | 2 | 30.31 ± 0.49 | 30.28 ± 0.39 |  |
| 0.1 | 0.1 | 2 | 30.14 ± 0.74 | 30.14 ± 1.37 |  |
| 0.1 | 1 | 2 | 30.31 ± 0.99 | 31.39 ± 2.36 |  |

selected rho=0.05 alpha=0.1: val_acc 30.49 ± 1.23 (2 seeds); test_acc beside it 30.14 ± 1.37
```

(one epoch is a smoke test; the looped sweep's numbers differ because its seed 1 runs draw their own
validation split and batches). It pays where the model is small and one run leaves the
device idle: the MNIST-1D and digits MLPs (docs/guides/reproduce.md, "Sweeps and seeds", has the measured speed-up).

How its runs differ from ``reproduce/train.py``'s:

* **Data order.** All members see the same batches: the validation split, label noise and batch order
  of every epoch are those of one seed, ``--data_seed`` (default: the first of ``--seeds``), where
  train.py draws each run's from its own ``--seed``. The members of that seed are the train.py runs of
  their cells (their parameters equal to float rounding; tests/checkout/test_reproduce_vmap_sweep.py); the
  members of the other seeds differ from theirs in data as well as in initialisation.
* **Seeds** differ in the model's initialisation only (nothing else in these runs draws from them).
* **What may vary.** The grid may vary ``lr``, ``rho``, ``alpha``, ``sam_rho``, ``rho_prime``,
  ``beta``, ``gamma`` and ``weight_decay`` (each reaches the step as a per-member schedule). Any other field makes ``--vmap`` refuse in one
  line that names it (``error: --vmap cannot vary batch_size per member: ...``), as do settings it
  does not implement (``--compile``, ``--weights``, ``--total_steps``, ``--max_steps``, ``--every``)
  and models with BatchNorm buffers; sweep those without ``--vmap``.
* **Divergence.** Each member is judged as train.py judges a run: ``--max_skipped`` skipped steps in
  a row during the training; at its end more than ``--max_skipped_fraction`` of its steps skipped,
  non-finite parameters or a root mean square above ``--max_param_rms``, or a non-finite loss at its
  last step. Such a member is ``diverged`` (one line each, with the reason, in ``members.json`` too),
  its cell is marked so in the table and never selected; the other members train on.
* **Output.** No TensorBoard events, per-run folders or flatness metrics (λ_max, trace, R1): the
  sweep's folder holds the tables, ``members.json`` (every member's configuration and epoch records)
  and ``vmap.pt``.

What a rerun reuses: ``vmap.pt`` is one checkpoint of the whole group (every member's parameters and
step state, the position in the epoch, each member's sums and records), written after every epoch and
when SIGINT/SIGTERM stops the training (after the step it was in). Rerunning the same command after a
finished training trains nothing and writes the tables again from it; after a stopped one it continues
from the checkpoint, mid-epoch if it stopped there, bit for bit on the CPU. A checkpoint of other
settings (grid, seeds, ``--data_seed``, or a train.py argument that changes the trajectory) is refused
with the field named: give the sweep another ``--name`` or remove that folder. The group is the unit:
single members are not reused, and neither kind of sweep reuses the other's runs (their folders differ).

Exit status: 0 when the training finished, 3 when every cell has a member that diverged (nothing can
be selected), 2 for bad arguments or a refusal (one line on stderr), 128 + signal number when
stopped by SIGINT/SIGTERM (a checkpoint is written first; rerun the command to continue).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

import torch

from reproduce.config import Config, as_dict, differences, estimators_of, resolve, run_name
from reproduce.data import sets as data_mod
from reproduce.run import checkpoint as ckpt
from reproduce.run import launch, report
from reproduce.run.signals import StopFlag
from reproduce.sweeps import vmapped
from reproduce.sweeps.plan import SweepError, check_writable, other_settings, plan
from reproduce.sweeps.table import every_cell_diverged, outcome, write_tables

__all__ = ["run"]


def _error(e: Exception) -> int:
    print(f"error: {e}", file=sys.stderr)
    return 2


def _saved(path: Path, cfgs: list[Config], data_seed: int) -> dict | None:
    """The checkpoint of this group at ``path``, or None; refuses one of other settings."""
    if not path.exists():
        return None
    saved = ckpt.load(path)
    configs = saved.get("configs") or []
    diff: dict[str, tuple] = {}
    if saved.get("data_seed") != data_seed:
        diff["data_seed"] = (saved.get("data_seed"), data_seed)
    elif len(configs) != len(cfgs):
        diff["members"] = (len(configs), len(cfgs))
    else:
        for old, cfg in zip(configs, cfgs, strict=True):
            diff = differences(old, cfg)
            if diff:
                break
    if diff:
        raise other_settings(path, "a vmapped sweep", diff)
    return saved


def _train(cfgs, name, data_seed, saved, path) -> tuple[dict, int | None]:
    """Train (or continue) the group; ``(last body, the signal that stopped it or None)``."""
    cfg = cfgs[0]
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        raise vmapped.VmapError("--vmap trains in one process: run it without torchrun")
    threads = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    meta = {"configs": [as_dict(c) for c in cfgs], "data_seed": data_seed}
    stop = StopFlag()
    try:
        device = launch.start(cfg.device).device
        data = data_mod.load(dataclasses.replace(cfg, seed=data_seed))
        data = data_mod.to_device(data, device)
        with stop.installed():
            body = vmapped.train(
                cfgs,
                name,
                data,
                device,
                data_seed=data_seed,
                saved=saved,
                save=lambda b: ckpt.save(path, b | meta),
                stop=lambda: stop.signum is not None,
            )
    finally:
        torch.set_num_threads(threads)
    return body, stop.signum


def run(opts: argparse.Namespace, rest: list[str], grid: list[tuple[str, list[str]]]) -> int:
    """The sweep ``opts``/``rest``/``grid`` (`reproduce.sweep.parse`) with ``--vmap``; returns
    the exit status."""
    try:
        base = resolve(rest)
    except ValueError as e:
        return _error(SweepError(f"train.py arguments: {e}"))
    try:
        name, root, runs = plan(rest, grid, opts.seeds, opts.name or f"sweep.{run_name(base)}.vmap")
        cfgs = [r.config for r in runs]
        (estimator,) = estimators_of(cfgs[0])
        vmapped.check(cfgs, estimator)
        data_seed = opts.seeds[0] if opts.data_seed is None else opts.data_seed
        path = root / "vmap.pt"
        saved = _saved(path, cfgs, data_seed)
        check_writable(opts, root)  # last: a refusal above writes nothing
    except (SweepError, vmapped.VmapError, ckpt.CheckpointError) as e:
        return _error(e)
    reused = saved is not None and saved["finished"]
    if reused:
        what = "finished (reused), nothing to train"
    elif saved is not None:
        pos = saved["pos"]
        what = f"continuing at epoch {pos['epoch'] + 1}, batch {pos['batch']}"
    else:
        what = "training"
    print(
        f"sweep {name} (--vmap): {len(runs) // len(opts.seeds)} cell(s) × {len(opts.seeds)} "
        f"seed(s) = {len(runs)} members of one vmapped step in {root}, on the batches of seed "
        f"{data_seed}; {what}",
        flush=True,
    )
    body, signum = saved, None
    if not reused:
        try:
            body, signum = _train(cfgs, estimator, data_seed, saved, path)
        except (vmapped.VmapError, data_mod.DataError, ValueError) as e:
            return _error(e)
    summaries = body["summaries"] if body is not None and body["finished"] else None
    outcomes: dict[int, dict[str, Any]] = {}
    for i, r in enumerate(runs):
        if summaries is None:  # stopped: every member where the checkpoint left it
            out = outcome(r, None, 128 + signum if signum else None, "", opts.metric)
        elif summaries[i]["status"] == "diverged":
            why = summaries[i].get("reason") or ""
            print(f"[sweep] {r.cell.label} seed={r.seed}: diverged: {why}", flush=True)
            out = outcome(r, None, 3, why, opts.metric)
        else:
            out = outcome(r, summaries[i], 0, "", opts.metric)
        outcomes[i] = out | {"run_dir": str(root), "reused": reused}
    if summaries is not None:
        report.write_json(root / "members.json", summaries)
    n = len(runs)
    done = summaries is not None
    counts = {"total": n, "reused": n if reused else 0, "trained": 0 if reused or not done else n}
    how = f" All {n} runs trained as one vmapped step on the batches of seed {data_seed}."
    seconds = body["pos"]["train_seconds"] if body is not None else 0.0
    extra = {"vmap": {"members": n, "data_seed": data_seed, "train_seconds": round(seconds, 2)}}
    rows = write_tables(opts, rest, grid, name, root, runs, outcomes, counts, how, extra)
    if signum is not None:
        print(f"stopped by signal {signum}; rerun the same command to continue", file=sys.stderr)
        return 128 + signum
    return 3 if every_cell_diverged(rows) else 0
