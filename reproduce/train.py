"""Train any setting of the GAM paper with any estimator; TensorBoard-logged, resumable, comparable.

The main job, with no arguments and no download, takes about 1 minute on 2 CPU cores (50 s on Intel Xeon Processor, torch 2.14.1+cu130):

```bash
python reproduce/train.py
```

trains the MNIST-1D MLP (Greydanus 2020; 4,000 training and 1,000 test vectors generated offline) with
SGD and with SGD + GAM (ρ = 0.5, α = 1, chosen on a validation split), one after the other, and prints
train and test accuracy, the generalisation gap, the top Hessian eigenvalue λ_max, the Hessian trace
and R1 at the end. On that CPU and torch it printed the table below, the run committed as
reproduce/results/main_job.json (``python -m reproduce.main_job`` makes it and writes these numbers into the
docs; a test reruns it). Another CPU or torch version rounds differently, and 4,000 steps carry a last-bit
difference into the accuracies, which move by a few tenths of a point:

```text
estimator                  train acc  test acc     gap     λ_max     trace        R1    img/s    time
-----------------------------------------------------------------------------------------------------
sgd                           100.00     65.50   34.50      3.40      91.9    4.5145    72414      6s
gam ρ=0.5,α=1                  89.85     71.90   17.95      0.89      46.1    0.3110    12996     31s
```

(the last two columns, speed and training time, vary with the machine).

A paper setting, an estimator, overrides (``--key=value``; ``--help`` lists every field):

```bash
python reproduce/train.py --preset=hp1.cifar100.resnet18 --data=~/data/cifar100 --estimator=sam+gam
python reproduce/train.py --preset=hp2.imagenet.resnet50 --data=/datasets/imagenet --compile --bf16 --channels_last
torchrun --standalone --nproc_per_node=8 reproduce/train.py --preset=hp2.imagenet.resnet50 \
    --data=/datasets/imagenet --compile --bf16 --channels_last     # one node, 8 GPUs
python reproduce/train.py --preset=hp1.cifar10.resnet18 --data=~/data/cifar10 --compile --channels_last
python reproduce/train.py --preset=noise.cifar10.resnet32.p40 --data=~/data/cifar10 --val_fraction=0.1
python reproduce/train.py --preset=time.cifar10.resnet18.gam10pct --data=~/data/cifar10
python reproduce/train.py --preset=hp2.imagenet.resnet50 --synthetic --max_steps=20   # smoke test
```

Output goes to ``<logdir>/<name>/<estimator>/``: TensorBoard events, ``config.json`` (the resolved
configuration), ``checkpoint.pt`` (every epoch, every ``checkpoint_every`` steps, and on SIGINT/SIGTERM),
``best.pt`` (best validation accuracy, with ``--val_fraction``) and ``summary.json``; a comparison of
several estimators also writes ``<logdir>/<name>/comparison.json``. ``--resume`` continues a run
exactly where its checkpoint left it (bit-exact on CPU).

Under ``torchrun`` every process trains on its GPU (``LOCAL_RANK``) through ``gamfunc.distributed``;
``--batch_size`` is the global batch and rank 0 alone writes the output (docs/guides/imagenet.md: "ImageNet on many GPUs
and nodes"). The code: ``build`` (model, loss, estimator, optimiser, step); ``run/``: ``loop``
(start-up, epochs, end) over ``epoch``, ``records``, ``summary``, ``resume``, ``signals``, ``loaders``;
``checkpoint``, ``evaluation``, ``launch`` (processes), ``report`` (logs and tables); ``data/`` (input
pipelines). Run as a script, it gives CUDA 32 hardware work queues a process
(``CUDA_DEVICE_MAX_CONNECTIONS``, unless set), so that a loader's GPU work runs beside the step's.

Exit status: 0 when done, 2 for bad arguments, missing data, an unusable checkpoint or weights file,
a run folder that holds a run's outputs but no checkpoint (``--overwrite`` trains it again; a run that
stopped before its first checkpoint holds no result and is trained again from scratch), a locked
run folder or a disk that cannot be written (one line on stderr, before any training, no traceback),
3 when the run did not train (``--max_skipped`` consecutive steps skipped as non-finite, every step of
its estimator skipped, more than ``--max_skipped_fraction`` of its steps skipped, parameters past
``--max_param_rms``), 128 + the first signal's number after SIGINT/SIGTERM (130, 143), in any phase,
within seconds: a checkpoint is written first where training has begun, and exactly one line says
what was kept, however many signals arrive; a second signal stops at once. ``summary.json`` records the outcome
(``status``, ``reason``, ``exit_code``), also under ``torchrun``, which exits 1 whatever the status.
"""

from __future__ import annotations

import dataclasses
import errno
import sys
from pathlib import Path

if __name__ == "__main__":  # a signal while the modules load: stop at once, nothing is written yet
    import os
    import signal

    # CUDA's hardware work queues, read when CUDA starts: 32 (reproduce.run.loaders.QUEUES) rather
    # than 8 unless set, so that the input pipeline's streams (DALI's decoders) do not queue behind
    # the step's kernels (reproduce/data/dali.py; measured in benchmarks/RESULTS.md)
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")

    def _stop_loading(signum, frame):  # ends the process here: an exception could be swallowed
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second signal adds no second line
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if os.environ.get("LOCAL_RANK", "0") in ("", "0"):
            name = signal.Signals(signum).name
            print(f"stopped by {name} during start-up; nothing was saved yet", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(128 + signum)

    for _s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(_s, _stop_loading)

if not __package__:  # run as a file: the checkout's root on sys.path (reproduce/__init__.py)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from reproduce.build import (
    CORRECT,
    SetupError,
    Training,
    build_estimator,
    build_optimizer,
    classification_loss,
    lr_schedule,
    setup,
)
from reproduce.config import (
    ESTIMATORS,
    PRESETS,
    as_dict,
    estimators_of,
    field_help,
    resolve,
    run_name,
)
from reproduce.data import sets as data_mod
from reproduce.run import checkpoint as ckpt
from reproduce.run import fsdp, launch, report, sharding
from reproduce.run.compile_cache import CacheError
from reproduce.run.evaluation import evaluate
from reproduce.run.loop import Diverged, Interrupted, StopFlag, run

__all__ = [
    "CORRECT",
    "Interrupted",
    "SetupError",
    "StopFlag",
    "Training",
    "build_estimator",
    "build_optimizer",
    "classification_loss",
    "evaluate",
    "lr_schedule",
    "main",
    "run",
    "setup",
]


def _help() -> str:
    lines = [__doc__.strip(), "", "Options (--key=value):"]
    defaults = as_dict(resolve([]))  # the mnist1d preset applied to Config()
    for k, text in field_help().items():
        lines.append(f"  --{k:<18} {text} [default: {defaults[k]!r}]")
    lines += ["", "Estimators (--estimator=NAME, or a comma list):", f"  {', '.join(ESTIMATORS)}"]
    lines += ["", "Presets (--preset=NAME):", *(f"  {p}" for p in PRESETS)]
    return "\n".join(lines)


def _error(text: str) -> None:
    """A one-line error on stderr, printed by one process of each node (under torchrun every
    process meets it alike and exits with the same status, quietly)."""
    if launch.first_on_node():
        line = "; ".join(part.strip() for part in text.strip().splitlines() if part.strip())
        print(f"error: {line}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(_help())
        return 0
    try:
        cfg = resolve(argv)
    except ValueError as e:
        _error(str(e))
        return 2
    if (refused := sharding.refusal(cfg)) is not None:
        _error(refused)
        return 2
    threads = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        return _main(cfg)
    finally:
        torch.set_num_threads(threads)


def _main(cfg) -> int:
    stop = StopFlag(exit_at_once=True)
    stop.kept = lambda: ""  # until a run starts (reproduce.run.loop.run says what it keeps)
    with stop.installed(), stop.during("start-up", at_once=True):
        try:
            procs = launch.start(cfg.device, cfg.dist_timeout)
        except ValueError as e:
            _error(str(e))
            return 2
        except Interrupted as e:
            return _stopped(e, stop)
        code = 1
        try:
            code = _train(cfg, procs, stop)
            return code
        finally:
            launch.finish(procs, completed=code == 0)


def _stopped(e: Interrupted, stop: StopFlag) -> int:
    """Print the one line of a run stopped by a signal (what it kept), once; its exit status."""
    return stop.report(e)


def _train(cfg, procs: launch.Processes, stop: StopFlag) -> int:
    summaries = []
    names = estimators_of(cfg)
    root = Path(cfg.logdir).expanduser() / run_name(cfg)
    try:
        data = data_mod.load(cfg)
        if procs.main:
            print(
                f"{cfg.preset}: {cfg.dataset}{' (synthetic)' if cfg.synthetic else ''}, {len(data.train)} train / "
                f"{len(data.val) if data.val else 0} val / {len(data.test)} test, model {cfg.model}, "
                f"{f'{cfg.total_steps} steps' if cfg.total_steps else f'{cfg.epochs} epochs'}"
                f"{f' (stopping at step {cfg.max_steps}, --max_steps)' if cfg.max_steps else ''}"
                f", logs in {root}",
                flush=True,
            )
        # what a stop between runs keeps: the runs that finished (each run says its own within)
        stop.kept = lambda: (
            f"kept: the finished runs ({', '.join(s['estimator'] for s in summaries)}) in "
            f"{str(root)!r}"
            if summaries
            else ""
        )
        for name in names:
            stop.check()
            cfg_one = dataclasses.replace(cfg, estimator=name)
            train_one = fsdp.run if cfg.fsdp else run
            summaries.append(train_one(cfg_one, stop, data, root / name, procs))
        stop.now("the comparison")  # done: a signal now lets the table be printed, then stops
    except Interrupted as e:
        return _stopped(e, stop)
    except (data_mod.DataError, ckpt.CheckpointError, SetupError, CacheError) as e:
        _error(str(e))
        return 2
    except Diverged as e:
        _error(str(e))
        return 3
    except OSError as e:
        where = f" {e.filename!r}" if e.filename else ""
        if not _write_error(e, root):  # an image that cannot be read: a data error
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            _error(f"cannot read the data{where}: {first}")
            return 2
        # a full or read-only disk: say what stays, the last checkpoint written or none
        target = where or f" {str(root)!r}"
        kept = [n for n in names if (root / n / "checkpoint.pt").is_file()]
        what = (
            f"the last checkpoint written ({', '.join(kept)}) is intact: free space (or fix "
            "permissions) and continue with --resume"
            if kept
            else "no checkpoint was written: free space (or fix permissions) and run again"
        )
        _error(f"cannot write{target}: {e.strerror or e}; {what}")
        return 2
    except RuntimeError:
        stopped = stop.left_collective(procs.world)
        if stopped is None:
            raise
        return _stopped(stopped, stop)
    if procs.main:
        print()
        print(report.table(summaries))
        if len(summaries) > 1:
            report.write_json(
                root / "comparison.json",
                [{k: v for k, v in s.items() if k != "history"} for s in summaries],
            )
        print(f"\noutputs in {root} (per estimator: summary.json, checkpoint.pt, events, pictures)")
        print(f"see them with: tensorboard --logdir {root}")
    if stop.signum is not None:  # acknowledged after the last check: the status says so too
        return _stopped(Interrupted(stop.signum, stop.where), stop)
    return 0


def _write_error(e: OSError, root: Path) -> bool:
    """Whether ``e`` is the run failing to write its outputs (a full, read-only or forbidden disk,
    or a file under the run's folder), rather than a file of the data that cannot be read."""
    if e.errno in (errno.ENOSPC, errno.EROFS, errno.EDQUOT):
        return True
    if e.filename:
        try:
            return Path(str(e.filename)).resolve().is_relative_to(root.resolve())
        except (OSError, RuntimeError):  # a symbolic link loop: not a path the run writes
            return False
    return e.errno is not None and e.errno == errno.EACCES


if __name__ == "__main__":
    launch.exit_process(main())
