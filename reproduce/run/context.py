"""What the parts of the training loop share, passed to each explicitly.

`Run`: the settings, processes and folder of one estimator's run, and what it has on disk.
`Parts`: what start-up built for it (step, data, loaders, writer), fixed from then on.
`Progress`: where training stands, everything a checkpoint holds (with the epoch's sums,
`zero_accum`, `accumulate`, `global_sums`). `Session`: what this process
counts from its (re)start, which no checkpoint holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from gamfunc import Step, StepState
from reproduce.build import CORRECT
from reproduce.config import Config
from reproduce.data import sets as data_mod
from reproduce.run.compile_cache import CompileCache
from reproduce.run.launch import Processes, sum_over_ranks
from reproduce.run.profiling import StepProfiler
from reproduce.run.report import Meter
from reproduce.run.signals import StopFlag

__all__ = ["Parts", "Progress", "Run", "Session", "accumulate", "global_sums", "zero_accum"]


class Run:
    """One estimator's run: its settings, processes and folder, and what it has left on disk."""

    def __init__(self, cfg: Config, name: str, stop: StopFlag, procs: Processes, run_dir: Path):
        self.cfg, self.name, self.stop, self.procs, self.run_dir = cfg, name, stop, procs, run_dir
        self.path = run_dir / "checkpoint.pt"
        self.summary_path = run_dir / "summary.json"
        self.saved_step: int | None = None  # the step of the checkpoint on disk, this run's
        self.trained = False  # the training is done: only the end-of-run metrics remain

    def say(self, text: str) -> None:
        if self.procs.main:
            print(text, flush=True)

    def kept(self) -> str:
        """What a run stopped now leaves on disk, in words."""
        if self.saved_step is None:
            return "nothing was saved yet"
        where = f"kept: the checkpoint of step {self.saved_step} at {self.path}"
        if self.trained:
            return f"{where} (training done) and summary.json; --resume computes the end-of-run metrics"
        return f"{where}; resume with --resume"


class Parts(NamedTuple):
    """What start-up built for the loop, fixed for the rest of the run."""

    model: nn.Module
    loss_fn: Callable  # the loss of this process's examples (evaluation, flatness)
    step: Step
    steps_per_epoch: int
    data: data_mod.Data
    train_loader: Any  # None for in-memory data
    eval_batches: Callable  # a split's share -> its evaluation batches
    loader: str  # the loader, in words
    probe: tuple[Tensor, Tensor] | None  # the flatness metrics' examples, on rank 0
    warnings: list[str]  # settings this run is known to train badly with
    writer: Any  # TensorBoard's SummaryWriter on rank 0, report.NullWriter elsewhere


@dataclasses.dataclass
class Progress:
    """Where training stands: everything a checkpoint holds to continue bit for bit."""

    params: dict[str, Tensor]
    state: StepState
    accum: dict[str, Tensor]  # the epoch's sums so far (this rank's; a resumed one on rank 0)
    pos: dict[str, Any]  # epoch, batch, global_step, timing, world
    history: list[dict[str, Any]]  # a record per epoch
    best: dict[str, Any] | None  # the best validation epoch, with a validation split
    order: Tensor | None  # the epoch's order of examples; None until the epoch starts


@dataclasses.dataclass
class Session:
    """What this process counts from its (re)start, which no checkpoint holds."""

    meter: Meter  # images per second (it adds the timed totals to ``Progress.pos``)
    epochs_bar: Any  # the progress bar of epochs
    run_of_skips: Tensor  # consecutive skipped steps
    profiler: StepProfiler  # --profile_steps (none asked: it profiles nothing)
    first_step: bool = True  # the next step is this process's first (and compiles)
    compile_seconds: float | None = None
    last_loss: Tensor | None = None
    compile_cache: CompileCache | None = None  # --compile: the artifacts kept for later runs
    steps_taken: int = 0  # steps this process has taken


def zero_accum(device) -> dict[str, Tensor]:
    """The sums of an epoch not yet begun."""
    z = lambda dt: torch.zeros((), dtype=dt, device=device)  # noqa: E731
    return {
        "loss": z(torch.float64),
        "correct": z(torch.int64),
        "seen": z(torch.int64),
        "skipped": z(torch.int64),
        "skipped_estimator": z(torch.int64),  # skipped steps that the estimator took (--every)
    }


def accumulate(
    accum: dict[str, Tensor], metrics: dict[str, Tensor], state, n: int, estimator: bool = True
) -> None:
    """Add a step's loss and correct count to the epoch's sums, unless the step was skipped (no sync);
    count a skipped step, and apart a skipped step of the estimator.

    Args:
        accum: the epoch's sums (`zero_accum`), updated in place.
        metrics: the step's metrics (``loss``, and ``skipped`` where the step reports it).
        state: the step state after the step (its ``CORRECT`` buffer).
        n: the step's examples.
        estimator: the estimator took this step (not the base gradient of ``--every``'s others).
    """
    loss = metrics["loss"]
    ok = (
        (metrics["skipped"] == 0).to(loss.device)
        if "skipped" in metrics
        else torch.ones((), dtype=torch.bool)
    )
    accum["loss"] += torch.where(ok, loss.double() * n, 0.0)
    accum["correct"] += torch.where(ok, state.buffers[CORRECT], 0)
    accum["seen"] += ok.to(torch.int64) * n
    accum["skipped"] += (~ok).to(torch.int64)
    if estimator:
        accum["skipped_estimator"] += (~ok).to(torch.int64)


def global_sums(accum: dict[str, Tensor], procs: Processes) -> dict[str, Tensor]:
    """The epoch's sums over all ranks (a collective)."""
    keys = list(accum)
    return dict(zip(keys, sum_over_ranks(procs, [accum[k] for k in keys]), strict=True))
