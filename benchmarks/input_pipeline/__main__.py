"""Images/s of the ImageNet input pipelines alone (no model): DALI, the nvJPEG loader, the DataLoader.

Reads a JPEG ImageFolder (``--data``; without it, a synthetic one that
:mod:`benchmarks.input_pipeline.jpeg_folder` writes to a temporary folder first), builds the training examples as
``reproduce/train.py`` does (RandomResizedCrop 224, flip, normalise) and times ``--batches`` batches
of ``--batch`` images per pipeline after ``--warmup`` batches, the device synchronised at both ends;
and the seconds from an epoch's ``batches()`` to its first batch: the first epoch's
(``first_epoch_start_s``: a DALI pipeline built and filled, DataLoader workers started) and a
later one's (``epoch_start_s``: what each next epoch start costs a run). One row per pipeline.
A pipeline (``--pipelines``; default: every GPU pipeline and the DataLoader on CUDA, the
DataLoader alone elsewhere) is ``dali:HW_LOAD`` (DALI reading and drawing the crops, that share of each batch to
the hardware JPEG decoder; ``dali_roi:HW_LOAD`` the same decoding only each crop's window), ``dali_exact:HW_LOAD`` (DALI decoding the crops torchvision draws; a
``:fancy`` suffix adds libjpeg-turbo's chroma upsampling),
``nvjpeg:DECODE_THREADS`` (torchvision's nvJPEG) or ``folder:WORKERS`` (DataLoader workers).

With ``--load_ms``, each pipeline also feeds a stand-in for a training step: a CUDA graph of matrix
products about that long, each batch copied into its input first (as ``--cuda_graph`` runs a step).
``load_ms`` is that step alone on one batch again and again, ``loaded_ms`` the step fed by the
pipeline, ``loaded_cost`` the share the pipeline adds (``loaded_ms`` ÷ ``load_ms`` − 1), ``next_ms``
the host's time in the pipeline per batch; ``--trace DIR`` profiles 5 fed steps per pipeline (:mod:`reproduce.run.profiling`:
``DIR/<pipeline>/profile.txt`` and the timeline beside it). Everything runs on a stream of its own,
as ``train.py`` does (:func:`reproduce.run.launch.own_stream`); ``--default_stream`` keeps CUDA's
legacy default stream instead.

    python -m benchmarks.input_pipeline --data /tmp/imagenet-synth --load_ms 25
    python -m benchmarks.input_pipeline --quick          # a small synthetic folder, small batches
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import _common
from benchmarks.input_pipeline import jpeg_folder
from benchmarks.report import columns
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


def _loader(spec: str, data, args, device):
    """``(name, loader)`` of one ``--pipelines`` item."""
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
        return f"{kind}_hw_{arg}" + ("_fancy_upsampling" if extra else ""), loader
    if kind == "nvjpeg":
        loader = nvjpeg.GpuJpegLoader(
            data.train, args.batch, device, threads=args.threads, decode_threads=int(arg)
        )
        return f"gpu_nvjpeg_{arg}_decode_threads", loader
    if kind == "folder":
        loader = data_mod.FolderLoader(data.train, args.batch, int(arg), device.type == "cuda")
        return f"folder_{arg}_workers", loader
    raise ValueError(
        f"--pipelines: unknown pipeline {spec!r} (dali, dali_roi, dali_exact, nvjpeg, folder)"
    )


# train.py's default first (each crop's window decoded, nvJPEG's CUDA decoder), then the hardware
# decoder, DALI decoding torchvision's crops, torchvision's nvJPEG, the DataLoader.
GPU_PIPELINES = ["dali_roi:0", "dali_roi:1", "dali_exact:0", "nvjpeg:4", "folder:16"]
COLUMNS = columns("input_pipeline")


def main(argv=None) -> dict:
    """Time every pipeline, print a table and write the JSON.

    Args:
        argv: the command line (default: ``sys.argv[1:]``).

    Returns:
        The result written.
    """
    ap = _common.add_flags(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    ap.add_argument("--data", default="", help="a JPEG ImageFolder (default: a synthetic one)")
    ap.add_argument("--batch", type=int, default=None, help="images per batch (256; quick 16)")
    ap.add_argument("--batches", type=int, default=None, help="timed batches (40; quick 6)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed batches (5; quick 2)")
    ap.add_argument("--pipelines", nargs="+", default=None)
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
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    args.batch = args.batch or (16 if args.quick else 256)
    args.batches = args.batches or (6 if args.quick else 40)
    args.warmup = args.warmup if args.warmup is not None else (2 if args.quick else 5)
    cuda = device.type == "cuda"
    args.pipelines = args.pipelines or (GPU_PIPELINES if cuda else ["folder:2"])
    need = (args.batches + args.warmup) * args.batch
    if not args.data:
        args.data = tempfile.mkdtemp(prefix="jpeg_folder_")
        jpeg_folder.build(args.data, train=need, val=8, classes=4 if args.quick else 100)
        print(f"a synthetic JPEG folder of {need} training images: {args.data}", flush=True)
    cfg = resolve(["--preset=hp2.imagenet.resnet50", f"--data={args.data}"])
    data = data_mod.load(cfg)
    if cuda and not args.default_stream:
        launch.own_stream(device)
    order = data_mod.epoch_order(len(data.train), 0, 0)
    keys = data_mod.epoch_keys(order[:need], 0, args.batch, seed=0, epoch=0)
    meta = _common.metadata(
        "input_pipeline", device, quick=args.quick, batch=args.batch, cpus=os.cpu_count()
    )
    meta["stream"] = "default" if args.default_stream else "own"
    result = {"benchmark": "input_pipeline", "meta": meta, "rows": []}
    if args.load_ms:
        shape = (args.batch, 3, 224, 224)
        run, meta["load_products"] = stand_in(args.load_ms, shape, device)
        first = torch.randn(shape, device=device)
        steps = args.batches
        meta["load_ms"] = _seconds(lambda: [run(first) for _ in range(steps)], device) * 1e3 / steps
    for spec in args.pipelines:
        name, loader = _loader(spec, data, args, device)
        row = {"pipeline": name, "first_epoch_start_s": epoch_start(loader, keys, device)}
        row["images_per_s"] = rate(loader, keys, args.batch, args.warmup, device)
        row["epoch_start_s"] = epoch_start(loader, keys, device)
        if args.load_ms:
            prof = None
            if args.trace:
                (Path(args.trace) / name).mkdir(parents=True, exist_ok=True)
                prof = StepProfiler(5, 0, device, Path(args.trace) / name / "profile.txt")
            row["loaded_ms"], row["next_ms"] = loaded(loader, keys, run, args.warmup, device, prof)
            row["loaded_cost"] = row["loaded_ms"] / meta["load_ms"] - 1
        result["rows"].append(row)
        print(f"{name}: {row['images_per_s']:.0f} images/s", flush=True)
    path = _common.save(result, args.out)
    print(f"\n{_common.table(COLUMNS, result['rows'])}\n\nJSON: {path}")
    return result


if __name__ == "__main__":
    main()
