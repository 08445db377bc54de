"""One process of a row of :mod:`benchmarks.data_parallel`, started by ``torchrun -m``: a step (DDP's or
gamfunc's, ``reproduce.build.setup``'s) timed on a batch already on the device, or the NCCL bus
bandwidth; it prints one ``RESULT {json}`` line, and its progress on the way (the first step's time,
each window's), so that a run stopped from outside says how far it got.
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import os
import signal
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from reproduce.run.report import dumps

__all__ = ["NCCL_ENV", "PRESETS", "main"]

# digits: a small preset for the driver's own test on the CPU
PRESETS = {"r50": "hp2.imagenet.resnet50", "vit": "hp2.imagenet.vit_s32", "digits": "digits"}
NCCL_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def _config(model: str, kind: str, per_gpu: int, world: int, perturbation: str, cuda: bool):
    from reproduce.config import resolve

    args = [f"--preset={PRESETS.get(model, model)}", f"--estimator={kind}", "--synthetic"]
    args += [f"--batch_size={per_gpu * world}", f"--perturbation={perturbation}"]
    args += ["--bf16", "--compile"] if cuda else []  # the CPU runs only the driver's own test
    return resolve(args + (["--channels_last"] if model == "r50" else []))


def _data(cfg):
    """The preset's shapes without its data: ``(data with an ImageNet-sized epoch, input shape)``."""
    from reproduce.data import sets as data_mod

    small = data_mod.load(
        dataclasses.replace(cfg, synthetic_size=4, label_noise=0.0, val_fraction=0.0)
    )
    shape = tuple(small.train.tensors()[0].shape[1:])
    return dataclasses.replace(small, train=range(1_281_167)), shape


def _gamfunc_step(cfg, kind, procs, data, graphed=False):
    """train.py's step for ``cfg`` (reproduce.build.setup), as a function of one batch; ``graphed``:
    replayed as a CUDA graph (:func:`gamfunc.cuda_graph`)."""
    import gamfunc
    from reproduce.build import setup

    t = setup(cfg, kind, data, procs)
    box = {"params": t.params, "state": t.state}
    run = gamfunc.cuda_graph(t.step) if graphed else t.step

    def step(batch):
        box["params"], box["state"], box["metrics"] = run(box["params"], box["state"], batch)

    # NCCL's communicators cannot be destroyed while a graph holds them (gamfunc.cuda_graphs)
    step.release = (lambda: gamfunc.cuda_graphs.release(run)) if graphed else (lambda: None)
    # the last step's loss and the steps skipped so far (read on the host: outside the timing)
    step.loss = lambda: round(float(box["metrics"]["loss"]), 4)
    step.skipped = lambda: int(box["state"].skipped)

    return step


def _ddp_step(cfg, procs, data):
    """The anchor: the module compiled, DDP on several processes, eager torch.optim."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from reproduce.build import channels_last
    from reproduce.models import build_model

    model = build_model(cfg.model, data.num_classes, data.image_size, seed=cfg.seed)
    model = model.to(procs.device)
    if cfg.channels_last:
        channels_last(model)
    if cfg.base == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    else:
        opt = torch.optim.SGD(
            model.parameters(), lr=cfg.lr, momentum=0.9, weight_decay=cfg.weight_decay
        )
    cuda = procs.device.type == "cuda"
    ids = [procs.device.index] if cuda else None
    net = DDP(model, device_ids=ids) if procs.world > 1 else model
    net = torch.compile(net) if cfg.compile else net

    def step(batch):
        x, y = batch
        with torch.autocast(procs.device.type, torch.bfloat16, enabled=cfg.bf16):
            loss = F.cross_entropy(net(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _say(procs, text: str) -> None:
    if (
        procs.main
    ):  # progress in the run's log, so that a run stopped from outside says how far it got
        print(text, flush=True)


def _sync(procs) -> None:
    if procs.device.type == "cuda":
        torch.cuda.synchronize(procs.device)


def _bus_bandwidth(procs, sizes_mb=(25, 100), iters=20) -> dict:
    """NCCL all-reduce bus bandwidth, GB/s: size × 2(n−1)/n ÷ time (nccl-tests' definition)."""
    out = {}
    n = procs.world
    for mb in sizes_mb:
        x = torch.ones(int(mb * 2**20) // 4, device=procs.device)
        for _ in range(5):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dist.all_reduce(x)
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3 / iters
        out[f"{mb}MB"] = round(x.numel() * 4 * 2 * (n - 1) / n / seconds / 1e9, 1)
    return out


def _profile(step, batch, device, path: Path | None) -> dict:
    """One profiled step: GPU time by kind and the host's waits for the device
    (:func:`reproduce.run.profiling.summarise`), and the collectives called; its tables written to
    ``path`` (rank 0's only: every rank profiles, since the step's collectives need them all, and an
    NCCL kernel's time on a rank includes its wait for slower ranks)."""
    from torch.profiler import ProfilerActivity, profile

    from reproduce.run.profiling import summarise

    torch.cuda.synchronize(device)
    began = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step(batch)
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - began
    events = prof.key_averages()
    by_device = events.table(sort_by="self_cuda_time_total", row_limit=30)
    by_host = events.table(sort_by="self_cpu_time_total", row_limit=40)
    if path is not None:
        path.write_text(f"By GPU time\n{by_device}\n\nBy host time\n{by_host}\n")
    collectives = ("c10d::allreduce_", "nccl:all_reduce", "aten::_local_scalar_dense")
    calls = {e.key: e.count for e in events if e.key in collectives}
    return {**summarise(events, 1, seconds), "calls": calls}


def _stack_later(seconds: float) -> threading.Timer:
    """After ``seconds`` (unless cancelled), the main thread's stack into the log: where a first
    step that hangs or compiles long is. The main thread is interrupted by a signal and prints its
    own stack (faulthandler); walking the frames of threads that run on, as
    ``faulthandler.dump_traceback_later`` does, crashed compiling processes (SIGSEGV)."""
    faulthandler.register(signal.SIGUSR1, all_threads=False)
    main = threading.main_thread().ident
    timer = threading.Timer(seconds, signal.pthread_kill, (main, signal.SIGUSR1))
    timer.daemon = True
    timer.start()
    return timer


def worker(a) -> None:
    os.environ.update(NCCL_ENV)
    from reproduce.run import launch

    procs = launch.start("auto")
    cuda = procs.device.type == "cuda"
    if a.guard == "sync":  # the guard of before: read `finite` on the host, branch eagerly
        import gamfunc.training.guard

        gamfunc.training.guard.Guard.reads = lambda self, finite, passes=None: (
            not torch.compiler.is_compiling()
        )
    result: dict = {"world": procs.world}
    if a.kind == "busbw":
        result["busbw_GBps"] = _bus_bandwidth(procs)
    else:
        kind = a.kind if a.kind != "ddp" else "sgd"
        cfg = _config(a.model, kind, a.batch, procs.world, a.pert, cuda)
        data, shape = _data(cfg)
        if a.kind == "ddp":
            step = _ddp_step(cfg, procs, data)
        else:
            step = _gamfunc_step(cfg, a.kind, procs, data, graphed=a.guard == "graph")
        g = torch.Generator().manual_seed(procs.rank)
        x = torch.randn(a.batch, *shape, generator=g).to(procs.device)
        if cfg.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        batch = (x, torch.randint(data.num_classes, (a.batch,), generator=g).to(procs.device))
        began = time.perf_counter()
        late = _stack_later(a.stacks_after) if a.stacks_after else None
        step(batch)
        _sync(procs)
        if late is not None:
            late.cancel()
        result["first_step_s"] = round(time.perf_counter() - began, 1)
        print(f"rank {procs.rank}: first step {result['first_step_s']} s", flush=True)
        if hasattr(step, "loss"):
            result["first_loss"] = step.loss()
        _say(procs, f"first step (building, compiling, capturing) {result['first_step_s']} s")
        for _ in range(a.warmup):
            step(batch)
        if a.steps:
            windows, host = [], 0.0
            for _ in range(a.windows):
                if procs.world > 1:
                    dist.barrier(device_ids=[procs.device.index] if cuda else None)
                _sync(procs)
                began = time.perf_counter()
                for _ in range(a.steps):
                    t = time.perf_counter()
                    step(batch)
                    host += time.perf_counter() - t
                _sync(procs)
                windows.append((time.perf_counter() - began) * 1e3 / a.steps)
                _say(procs, f"window {len(windows)}: {windows[-1]:.2f} ms per step")
            ms = torch.tensor(windows, device=procs.device)
            # the host's time to issue a step: near ms_per_step, the step is bound by the host
            result["host_ms_per_step"] = round(host * 1e3 / (a.steps * a.windows), 2)
            if procs.world > 1:  # the slowest rank sets the pace, window by window
                dist.all_reduce(ms, op=dist.ReduceOp.MAX)
            result["window_ms"] = [round(float(w), 2) for w in ms]
            ms = ms.median()
            result["ms_per_step"] = round(float(ms), 2)
            result["images_per_s"] = round(a.batch * procs.world / float(ms) * 1e3, 1)
            if cuda:
                result["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
            if hasattr(step, "loss"):  # the steps taken, and that they trained
                result["steps_taken"] = 1 + a.warmup + a.windows * a.steps
                result["last_loss"], result["skipped"] = step.loss(), step.skipped()
            if a.profile and procs.world > 1 and cuda:
                prof = _profile(step, batch, procs.device, Path(a.profile) if procs.main else None)
                if procs.main:
                    result["profile"] = prof
    if procs.main:
        print("RESULT " + dumps(result, indent=None), flush=True)
    if a.kind != "busbw":
        getattr(step, "release", lambda: None)()
    launch.finish(procs, completed=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="r50", choices=sorted(PRESETS))
    ap.add_argument("--kind", default="sgd", help="ddp, sgd, gam_fd, gam or busbw")
    ap.add_argument("--pert", default="global", choices=["global", "local"])
    ap.add_argument("--guard", default="", choices=["", "graph", "sync"])
    ap.add_argument("--batch", type=int, default=128, help="images per GPU")
    ap.add_argument("--steps", type=int, default=20, help="steps per timed window (0: none)")
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--profile", default="", help="where the profile of one step goes")
    ap.add_argument(
        "--stacks_after",
        type=float,
        default=0,
        help="seconds into the first step after which each rank prints its main thread's stack (0: never)",
    )
    worker(ap.parse_args(argv))
    return 0


if __name__ == "__main__":
    from reproduce.run import launch

    launch.exit_process(main())
