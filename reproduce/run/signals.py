"""SIGINT and SIGTERM: what a run does when one arrives, phase by phase (`StopFlag`).

During start-up (data, model, the first step and its compilation) a signal stops the run at once,
nothing being saved yet; in training at the next step boundary (with several processes, at the next
logging step, where the ranks agree to stop together), after writing a checkpoint; in an evaluation
at the next batch and in the flatness metrics at the next H·v product, probe chunk or loss
evaluation. A second signal ends the process at once.

Whatever the number of signals and however close together, the process prints exactly one line
saying what it stopped and what it kept (`StopFlag.report`), and exits with 128 + the first
signal's number. Where a process owns its signals (``exit_at_once``: train.py) a signal in start-up
ends it from the handler itself: an exception raised there could land in a finaliser or a weakref
callback, where Python prints and drops it, or pass through autograd's anomaly mode, which a
compiler turns on while it traces, and print a stack.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist

from reproduce.run.launch import Processes, first_on_node

__all__ = ["NOTHING", "Interrupted", "StopFlag", "until_stopped"]


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

    def __init__(self, exit_at_once: bool = False):
        self.signum: int | None = None  # the signal that stops the run (another rank's, too)
        self.where = ""  # the phase the first signal arrived in
        self.received = 0  # signals this process received
        self.phase, self.at_once = "", False
        self.exit_at_once = exit_at_once  # start-up: end the process from the handler
        # what a stop now leaves on disk, in words ("" for nothing); it may tidy up first (the
        # training loop sets it: a fresh run's outputs without a checkpoint are removed). A loop of
        # another kind writes its checkpoints atomically: the last one stays.
        self.kept: Callable[[], str] = lambda: "the last checkpoint written stays"
        self.said = False  # the one line of the stop is printed
        self._wrapped: Callable | None = None  # the handler installed out of Dynamo's reach

    def __call__(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        self.received += 1
        if self.received > 1 or self.said:
            if not self.said:  # what stays now: a checkpoint being written is not one yet
                self.said = True
                first = signal.Signals(self.signum or signum).name
                what = f"{name} again" if first == name else f"{first}, then {name}"
                _say_once(f"{what}: stopping now; {self.kept() or NOTHING}", sys.stderr)
            _leave(128 + (self.signum or signum))
        if self.signum is None:
            self.signum, self.where = signum, self.phase
        if self.at_once and self.exit_at_once:
            self.report(Interrupted(signum, self.phase))
            _leave(128 + signum)
        where = f" during {self.phase}" if self.phase else ""
        _say_once(f"\n{name}{where}: stopping (once more to stop at once)")
        if self.at_once:
            self.check()

    def report(self, e: Interrupted) -> int:
        """Print the one line of a stop (``e`` and what it kept, asked of `kept` if ``e``
        does not say), unless printed already; the exit status.

        Args:
            e: the stop.

        Returns:
            ``e.code``: 128 + the signal's number.
        """
        if not self.said:
            self.said = True
            e.kept = e.kept or self.kept() or NOTHING
            _say_once(f"{e}; {e.kept}", sys.stderr)
        return e.code

    def arrived(self) -> int | None:
        """The signal that stops the run, or None. Where a failure may come of a signal (a
        collective that a stopped rank left, a data loader whose workers it stopped), ask this, not
        ``signum``: a signal that came while a call in C blocked the main thread is handed to its
        handler at the next call of a Python function, this one's, so it is recorded by the time
        the answer is read.

        Returns:
            The signal's number, or None.
        """
        return self.signum

    def left_collective(self, world: int) -> Interrupted | None:
        """What a failed collective is in a job of ``world`` processes: after a signal, another rank
        that it stopped may have left the collective (or the signal broke the wait), so the failure
        is the signal's stop, in the current phase; None where no signal arrived or the job is one
        process (the failure is then itself).

        Args:
            world: the job's processes.

        Returns:
            The stop, or None.
        """
        signum = self.arrived()
        return Interrupted(signum, self.phase) if signum is not None and world > 1 else None

    def check(self) -> None:
        """Raise `Interrupted` if a signal arrived."""
        if self.signum is not None:
            raise Interrupted(self.signum, self.phase)

    def now(self, phase: str, at_once: bool = False) -> None:
        """The run is in ``phase`` from here (named when it stops); with ``at_once``, a signal stops
        it at once, and one that arrived before stops it here."""
        self.phase, self.at_once = phase, at_once
        self._out_of_dynamo()
        if at_once:
            self.check()

    def _out_of_dynamo(self) -> None:
        """Once ``torch._dynamo`` is imported (a compiled step is built), install this flag wrapped
        in ``torch.compiler.disable``. A signal is handled at whatever Python frame runs, also in the
        instant a compiled function has installed Dynamo's frame hook: there, unwrapped, Dynamo
        would try to compile the handler's own frames (fullgraph: "Attempt to trace generator").
        Before that import no such hook exists, and an eager run never pays for the import."""
        if self._wrapped is not None or "torch._dynamo" not in sys.modules:
            return
        wrapped = torch.compiler.disable(self.__call__)
        try:
            for s in _SIGNALS:
                if signal.getsignal(s) is self:
                    signal.signal(s, wrapped)
        except ValueError:  # not the main thread: leave signals alone
            return
        self._wrapped = wrapped

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
        """This flag as the handler of SIGINT and SIGTERM within the block. After a signal it stays
        the handler, so that a later signal, however soon, ends the process quietly with the
        first one's status instead of meeting a handler of before."""
        try:
            old = {s: signal.signal(s, self) for s in _SIGNALS}
        except ValueError:  # not the main thread: leave signals alone
            yield self
            return
        self._wrapped = None
        self._out_of_dynamo()
        try:
            yield self
        finally:
            if not self.received:
                for s, h in old.items():
                    signal.signal(s, h)


NOTHING = "nothing was saved yet"
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _leave(code: int) -> None:
    """End the process now with ``code``, its output flushed (no exception: the handler may run
    inside code that would catch, print or wrap it)."""
    for f in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            f.flush()
    os._exit(code)


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
            if stop.arrived() is None:
                raise
            return
        yield item
