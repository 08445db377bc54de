"""Images/s of the ImageNet input pipelines alone (no model): DALI, the nvJPEG loader, the DataLoader.

Reads a JPEG ImageFolder (``benchmarks/jpeg_folder.py`` makes one), builds the training examples as
``reproduce/train.py`` does (RandomResizedCrop 224, flip, normalise) and times ``--batches`` batches
of ``--batch`` images per pipeline after ``--warmup`` batches, the device synchronised at both ends;
and the seconds from an epoch's ``batches()`` to its first batch: the first epoch's
(``*_first_epoch_start_s``: a DALI pipeline built and filled, DataLoader workers started) and a
later one's (``*_epoch_start_s``: what each next epoch start costs a run).
A pipeline is ``dali:HW_LOAD`` (DALI reading and drawing the crops, that share of each batch to
the hardware JPEG decoder; ``dali_roi:HW_LOAD`` the same decoding only each crop's window), ``dali_exact:HW_LOAD`` (DALI decoding the crops torchvision draws; a
``:fancy`` suffix adds libjpeg-turbo's chroma upsampling),
``nvjpeg:DECODE_THREADS`` (torchvision's nvJPEG) or ``folder:WORKERS`` (DataLoader workers).

With ``--load_ms``, each pipeline also feeds a stand-in for a training step: a CUDA graph of matrix
products about that long, each batch copied into its input first (as ``--cuda_graph`` runs a step).
``load_ms`` is that step alone on one batch again and again, ``*_loaded_ms`` the step fed by the
pipeline, ``*_loaded_cost`` the share the pipeline adds, ``*_next_ms`` the host's time in the
pipeline per batch; ``--trace DIR`` profiles 5 fed steps per pipeline (:mod:`reproduce.run.profiling`:
``DIR/<pipeline>/profile.txt`` and the timeline beside it). Everything runs on a stream of its own,
as ``train.py`` does (:func:`reproduce.run.launch.own_stream`); ``--default_stream`` keeps CUDA's
legacy default stream instead (``benchmarks/RESULTS.md``, run 10: DALI costs a step the same on either).

    python benchmarks/loader_throughput.py --data /tmp/imagenet-synth --out benchmarks/results/loader.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reproduce.config import resolve
from reproduce.data import dali, nvjpeg
from reproduce.data import sets as data_mod
from reproduce.run import launch
from reproduce.run.profiling import StepProfiler


def _clock(device) -> float:
    """The host's clock once ``device`` has finished the work queued on it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def rate(loader, keys, batch: int, warmup: int, device) -> float:
    it = iter(loader.batches(keys))
    for _ in range(warmup):
        next(it)
    start, n = _clock(device), 0
    for x, _ in it:
        n += len(x)
    return n / (_clock(device) - start)


def epoch_start(loader, keys, device) -> float:
    """Seconds from a new epoch's ``batches()`` to its first batch; the epoch is then left."""
    start = _clock(device)
    it = iter(loader.batches(keys))
    next(it)
    seconds = _clock(device) - start
    it.close()
    return seconds


def stand_in(ms: float, shape: tuple[int, ...], device: torch.device):
    """A training step's stand-in of about ``ms`` on ``device``, called with a batch: the batch
    copied into a static input that the step reads, then matrix products (on a GPU one CUDA graph,
    replayed); and the number of products."""
    cuda = device.type == "cuda"
    n = 2048 if cuda else 96
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16 if cuda else torch.float32)
    out, x = torch.empty_like(a), torch.zeros(shape, device=device)

    def body(k: int) -> None:
        for _ in range(k):
            torch.mm(a, a, out=out)
        out.add_(x.mean().to(out.dtype))  # the step reads its batch

    body(5)
    per = _seconds(lambda: body(40), device) / 40
    k = max(1, round(ms / 1e3 / per))
    step = lambda: body(k)  # noqa: E731
    if cuda:
        warm = torch.cuda.Stream(device)
        warm.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(warm):
            body(k)
        torch.cuda.current_stream(device).wait_stream(warm)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            body(k)
        step = graph.replay

    def run(batch: torch.Tensor) -> None:
        x.copy_(batch)
        step()

    return run, k


def _seconds(fn, device) -> float:
    start = _clock(device)
    fn()
    return _clock(device) - start


def loaded(loader, keys, run, warmup: int, device, profiler=None) -> tuple[float, float]:
    """The stand-in step fed by ``loader``: ms per step after ``warmup`` batches, and the host's ms
    per batch inside the loader; with ``profiler`` (a :class:`StepProfiler`) the steps after the
    timed ones are profiled."""
    it = iter(loader.batches(keys))
    for _ in range(warmup):
        run(next(it)[0])
    timed, wait, count = len(keys) // loader.batch_size - warmup, 0.0, 0
    if profiler is not None:
        timed -= profiler.n
    start = _clock(device)
    while count < timed:
        began = time.perf_counter()
        x, _ = next(it)
        wait += time.perf_counter() - began
        run(x)
        count += 1
    seconds = _clock(device) - start
    if profiler is not None:
        for step, (x, _) in enumerate(it):
            profiler.before(step)
            run(x)
            profiler.after()
        profiler.close()
    it.close()
    return seconds * 1e3 / count, wait * 1e3 / count


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument(
        "--pipelines", nargs="+", default=["dali:0.65", "dali_exact:0.65", "nvjpeg:4", "folder:16"]
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=16,
        help="nvJPEG: file-reading threads; DALI: its CPU threads",
    )
    ap.add_argument("--workers", type=int, default=8, help="worker processes of dali_exact")
    ap.add_argument("--load_ms", type=float, default=0, help="also feed a stand-in step this long")
    ap.add_argument(
        "--trace", default="", help="with --load_ms: profile 5 fed steps into this folder"
    )
    ap.add_argument(
        "--default_stream",
        action="store_true",
        help="run on CUDA's legacy default stream, not a stream of its own",
    )
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    cfg = resolve(["--preset=hp2.imagenet.resnet50", f"--data={args.data}"])
    data = data_mod.load(cfg)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda" and not args.default_stream:
        launch.own_stream(device)
    order = data_mod.epoch_order(len(data.train), 0, 0)
    need = (args.batches + args.warmup) * args.batch
    keys = data_mod.epoch_keys(order[:need], 0, args.batch, seed=0, epoch=0)
    out = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu"}
    out["batch"], out["torch"], out["cpus"] = args.batch, torch.__version__, os.cpu_count()
    out["stream"] = "default" if args.default_stream else "own"
    if args.load_ms:
        shape = (args.batch, 3, 224, 224)
        run, out["load_products"] = stand_in(args.load_ms, shape, device)
        first = torch.randn(shape, device=device)
        steps = args.batches
        out["load_ms"] = round(
            _seconds(lambda: [run(first) for _ in range(steps)], device) * 1e3 / steps, 3
        )
    for spec in args.pipelines:
        kind, arg, *extra = spec.split(":")
        if kind.startswith("dali"):
            loader = dali.DaliJpegLoader(
                data.train,
                args.batch,
                device,
                threads=args.threads,
                hw_decoder_load=float(arg),
                fancy_upsampling="fancy" in extra,
                crops="exact" if kind == "dali_exact" else "dali",
                workers=args.workers,
                roi_decode=kind == "dali_roi",
            )
            name = f"{kind}_hw_{arg}" + ("_fancy_upsampling" if extra else "")
        elif kind == "nvjpeg":
            loader = nvjpeg.GpuJpegLoader(
                data.train, args.batch, device, threads=args.threads, decode_threads=int(arg)
            )
            name = f"gpu_nvjpeg_{arg}_decode_threads"
        else:
            loader = data_mod.FolderLoader(data.train, args.batch, int(arg), device.type == "cuda")
            name = f"folder_{arg}_workers"
        first = out[f"{name}_first_epoch_start_s"] = round(epoch_start(loader, keys, device), 3)
        out[f"{name}_images_per_s"] = round(rate(loader, keys, args.batch, args.warmup, device))
        out[f"{name}_epoch_start_s"] = round(epoch_start(loader, keys, device), 3)
        print(name, out[f"{name}_images_per_s"], first, out[f"{name}_epoch_start_s"], flush=True)
        if args.load_ms:
            prof = None
            if args.trace:
                (Path(args.trace) / name).mkdir(parents=True, exist_ok=True)
                prof = StepProfiler(5, 0, device, Path(args.trace) / name / "profile.txt")
            step_ms, wait_ms = loaded(loader, keys, run, args.warmup, device, prof)
            out[f"{name}_loaded_ms"], out[f"{name}_next_ms"] = round(step_ms, 3), round(wait_ms, 3)
            out[f"{name}_loaded_cost"] = round(step_ms / out["load_ms"] - 1, 4)
            print(name, "fed", out[f"{name}_loaded_ms"], "ms a step", flush=True)
    from reproduce.run.report import dumps, write_json  # after the path is set

    print(dumps(out))
    if args.out:
        write_json(args.out, out)


if __name__ == "__main__":
    main()
