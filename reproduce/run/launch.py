"""Processes of a run: one, or many launched by ``torchrun`` on one node or several.

``torchrun`` sets ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK`` (and the rendezvous address) in every
process it starts; `start` reads them, picks the device (``cuda:LOCAL_RANK`` where CUDA is
available and not ruled out by ``--device``, else the CPU) and joins the process group (NCCL on CUDA,
gloo on the CPU). Without ``WORLD_SIZE`` (or with 1) nothing is initialised and the run is one
process, exactly as before. On a GPU the process's work runs on a stream of its own
(`own_stream`), not CUDA's legacy default stream.

The collectives the training loop needs beyond the step's own ([`gamfunc.distributed`][gamfunc.wrappers.distributed]) are here:
`sum_over_ranks` for the epoch's counts and the evaluation, `from_main` to hand a Python
object (a checkpoint, a decision) from rank 0 to every rank, so that nodes need no shared disk.

A rank that dies makes the others fail at their next collective (gloo reports the closed
connection; NCCL's watchdog aborts the communicator after ``timeout``), and ``torchrun`` stops the
remaining workers of the job with SIGTERM: every process exits non-zero, and a checkpoint written
before stays whole (checkpoints are written atomically, by rank 0 only).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = [
    "Processes",
    "finish",
    "first_on_node",
    "from_main",
    "own_stream",
    "start",
    "sum_over_ranks",
    "wait_for",
]


@dataclass(frozen=True)
class Processes:
    """Where this process stands in the job."""

    rank: int  # 0 .. world-1, over all nodes
    world: int  # number of processes of the job
    local_rank: int  # index on this node (the GPU it drives)
    device: torch.device  # where this process trains
    backend: str  # "nccl", "gloo", or "" for a single process

    @property
    def main(self) -> bool:
        """Rank 0: the one process that writes logs, checkpoints and summaries."""
        return self.rank == 0


def first_on_node() -> bool:
    """Whether this process is the first of its node (``LOCAL_RANK`` 0, which torchrun sets; the
    one process without torchrun), known before the process group is joined. It prints the
    refusals and errors, which every process of a node meets alike: once per node, so once on one
    node (rank 0) and once in each node's log of a job of several nodes."""
    return os.environ.get("LOCAL_RANK", "0").strip() in ("", "0")


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name, "")
    try:
        return int(text) if text else default
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer; got {text!r}") from None


def _device(requested: str, local_rank: int, world: int) -> torch.device:
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError(f"--device={requested}: this machine has no CUDA device; use --device=cpu")
    if world > 1:  # one GPU per process: the process's local rank picks it
        if requested.startswith("cuda:"):
            raise ValueError(
                f"--device={requested} under torchrun: each process takes cuda:LOCAL_RANK; "
                "use --device=cuda (or auto) and CUDA_VISIBLE_DEVICES to choose the GPUs"
            )
        # the node's process count, alike on its every rank (LOCAL_RANK is not): all refuse alike
        per_node = max(_env_int("LOCAL_WORLD_SIZE", 1), local_rank + 1)
        if per_node > torch.cuda.device_count():
            raise ValueError(
                f"{per_node} processes on this node but it has {torch.cuda.device_count()} GPUs: "
                "start at most that many processes per node (--nproc_per_node)"
            )
        return torch.device("cuda", local_rank)
    device = torch.device(requested if requested != "auto" else "cuda")
    return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())


def wait_for(device: torch.device) -> None:
    """Wait until ``device`` has run the work queued on it: a CUDA device synchronised; nothing
    on the CPU, which runs as the host issues."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def own_stream(device: torch.device) -> torch.cuda.Stream:
    """Make a stream of this thread's own the current one on ``device``, and return it.

    PyTorch otherwise runs on CUDA's legacy default stream, which waits for the work queued on
    every blocking stream and makes them wait for its own, so that a library's work on streams of
    its own (a decoder's) is ordered with the step's. ``torch.cuda.Stream`` streams are
    non-blocking: they wait only for what they are told to. (DALI's decoding beside a step was not
    the legacy stream's doing: it takes turns with the step on either: ``python -m
    benchmarks.input_pipeline`` measures it.)"""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))  # work already queued comes first
    torch.cuda.set_stream(stream)
    return stream


def start(requested_device: str = "auto", timeout_s: float = 1800.0) -> Processes:
    """This process's place in the job, with the process group joined when ``WORLD_SIZE > 1``.

    Args:
        requested_device: ``--device``: auto | cpu | cuda | cuda:N (cuda:N for one process only).
        timeout_s: how long a collective may wait for the other ranks before it fails.

    Raises:
        ValueError: the environment or the device request cannot be honoured (the message says why).
    """
    world = _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", 0)
    device = _device(requested_device, local_rank, world)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        own_stream(device)
    if world <= 1:
        return Processes(0, 1, 0, device, "")
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return Processes(dist.get_rank(), dist.get_world_size(), local_rank, device, backend)


def finish(procs: Processes, completed: bool = False) -> None:
    """Leave the process group (a no-op for a single process).

    With ``completed`` (this rank's run ended normally), wait at a barrier for every rank first: a
    rank that tears down its connections while another still writes its outputs makes that other
    rank's gloo teardown abort the process. A rank that stops on an error leaves at once."""
    if procs.world > 1 and dist.is_initialized():
        if completed:
            cuda = procs.backend == "nccl"
            dist.barrier(device_ids=[procs.device.index] if cuda else None)
        dist.destroy_process_group()


def exit_process(code: int) -> None:
    """End the process of a script (``reproduce/train.py``, a benchmark's worker) with ``code``.

    One process of a job of several (torchrun, ``WORLD_SIZE`` > 1) whose run succeeded (``code`` 0)
    ends without the interpreter's finalisation (``os._exit``, after flushing its output): call it once
    the script has closed every file it wrote and left the process group (`finish`, whose barrier every
    rank of a successful run passes), so that nothing is lost, and no destruction of the collective
    library's objects or a library's daemon threads runs after it. A rank of a ``train.py`` job whose
    run had succeeded was seen to abort at its very end ("terminate called without an active
    exception", status -6, rarely), which fails the whole job. A process that failed exits as usual:
    where only the first process of a node prints the error (a refused option), the others must not
    end the job before it has. So does a single process, or one whose ``WORLD_SIZE`` is not a number
    (which `start` refuses)."""
    try:
        several = _env_int("WORLD_SIZE", 1) > 1
    except ValueError:
        several = False
    if several and code == 0:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    # The status is decided: a SIGINT or SIGTERM from here on must not replace it. The interpreter's
    # finalisation puts the default action back for signals with a Python handler (which kills the
    # process by the signal, status -2 or -15, while its modules are torn down), but leaves an
    # ignored signal ignored.
    with contextlib.suppress(ValueError):  # not the main thread: signals are not ours
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_IGN)
    sys.exit(code)


def sum_over_ranks(procs: Processes, tensors: list[Tensor]) -> list[Tensor]:
    """The element-wise sums over ranks of ``tensors`` (new tensors; the inputs for one process).

    Integer and floating-point tensors are summed in int64 and float64 respectively, so that counts
    stay exact; the results have the inputs' dtypes back."""
    if procs.world == 1:
        return [t.clone() for t in tensors]
    out = []
    for t in tensors:
        wide = torch.float64 if t.is_floating_point() else torch.int64
        total = t.to(procs.device, wide, copy=True)
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        out.append(total.to(t.device, t.dtype))
    return out


def from_main(procs: Processes, obj):
    """``obj`` as rank 0 has it, on every rank (pickled; tensors arrive on the CPU)."""
    if procs.world == 1:
        return obj
    box = [obj if procs.main else None]
    dist.broadcast_object_list(box, src=0, device=procs.device if procs.backend == "nccl" else None)
    return box[0]
