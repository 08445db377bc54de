"""SIGINT and SIGTERM: what a run does when one arrives, phase by phase (`StopFlag`).

During start-up (data, model, the first step and its compilation) a signal stops the run at once,
nothing being saved yet; in training at the next step boundary (with several processes, at the next
logging step, where the ranks agree to stop together), after writing a checkpoint; in an evaluation
at the next batch and in the flatness metrics at the next H·v product, probe chunk or loss
evaluation. A second signal ends the process at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterable

import torch
import torch.distributed as dist

from reproduce.run.launch import Processes, first_on_node

__all__ = ["Interrupted", "StopFlag", "until_stopped"]


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived and the run stopped: ``where`` is the phase it stopped in, ``kept``
    what it left on disk (the loop fills it in).

    A ``BaseException``, as ``KeyboardInterrupt`` is, so that no ``except Exception`` on its way (a
    compiler's, a data loader's) swallows or wraps it."""

    def __init__(self, signum: int, where: str = ""):
        name = signal.Signals(signum).name
        super().__init__(f"stopped by {name}" + (f" during {where}" if where else ""))
        self.signum, self.where, self.kept = signum, where, ""

    @property
    def code(self) -> int:
        """The exit status: 128 + the signal's number (130 for SIGINT, 143 for SIGTERM)."""
        return 128 + self.signum


class StopFlag:
    """Records SIGINT/SIGTERM, so that a run stops where what it has done can be kept.

    In a phase entered with `during` and ``at_once`` (start-up: loading data, building the
    model, the first step and its compilation, where nothing is saved yet) the signal raises
    `Interrupted` at once. Elsewhere it is recorded and the loop stops at the next step
    boundary, evaluation batch or loss evaluation of the metrics (`check`), after writing
    what it keeps. A second signal ends the process at once with 128 + its number (checkpoints are
    written atomically, so the last one written stays whole)."""

    def __init__(self):
        self.signum: int | None = None  # the signal that stops the run (another rank's, too)
        self.received = 0  # signals this process received
        self.phase, self.at_once = "", False

    def __call__(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        self.received += 1
        if self.received > 1:
            _say_once(f"{name} again: stopping now; the last checkpoint written stays", sys.stderr)
            sys.stdout.flush()
            os._exit(128 + signum)
        self.signum = self.signum or signum
        where = f" during {self.phase}" if self.phase else ""
        _say_once(f"\n{name}{where}: stopping (once more to stop at once)")
        if self.at_once:
            self.check()

    def check(self) -> None:
        """Raise `Interrupted` if a signal arrived."""
        if self.signum is not None:
            raise Interrupted(self.signum, self.phase)

    def now(self, phase: str, at_once: bool = False) -> None:
        """The run is in ``phase`` from here (named when it stops); with ``at_once``, a signal stops
        it at once, and one that arrived before stops it here."""
        self.phase, self.at_once = phase, at_once
        if at_once:
            self.check()

    @contextlib.contextmanager
    def during(self, phase: str, at_once: bool = False):
        """`now` within the block; the phase before it comes back after it."""
        before = self.phase, self.at_once
        try:
            self.now(phase, at_once)
            yield self
        finally:
            self.phase, self.at_once = before

    def agreed(self, procs: Processes) -> int | None:
        """The signal that stops the job at this step boundary, the same on every rank: any rank's
        (a collective: every rank calls it at the same steps)."""
        if procs.world == 1:
            return self.signum
        flag = torch.tensor([self.signum or 0], dtype=torch.int64, device=procs.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        signum = int(flag)
        if signum and self.signum is None:
            self.signum = signum
        return signum or None

    @contextlib.contextmanager
    def installed(self):
        signals = (signal.SIGINT, signal.SIGTERM)
        try:
            old = {s: signal.signal(s, self) for s in signals}
        except ValueError:  # not the main thread: leave signals alone
            yield self
            return
        try:
            yield self
        finally:
            for s, h in old.items():
                signal.signal(s, h)


def _say_once(text: str, file=None) -> None:
    """Print ``text`` from the first process of each node (`reproduce.run.launch.first_on_node`)."""
    if first_on_node():
        print(text, file=file or sys.stdout, flush=True)


def until_stopped(batches: Iterable, stop: StopFlag):
    """``batches``, ending early without an error if loading fails after a signal arrived (the same
    SIGINT/SIGTERM may have stopped the DataLoader's worker processes)."""
    it = iter(batches)
    while True:
        try:
            item = next(it)
        except StopIteration:
            return
        except Exception:
            if stop.signum is None:
                raise
            return
        yield item
