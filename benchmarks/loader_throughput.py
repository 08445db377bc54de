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


def rate(loader, keys, batch: int, warmup: int, device) -> float:
    it = iter(loader.batches(keys))
    for _ in range(warmup):
        next(it)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start, n = time.perf_counter(), 0
    for x, _ in it:
        n += len(x)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return n / (time.perf_counter() - start)


def epoch_start(loader, keys, device) -> float:
    """Seconds from a new epoch's ``batches()`` to its first batch; the epoch is then left."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    it = iter(loader.batches(keys))
    next(it)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    it.close()
    return seconds


def main() -> None:
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
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    cfg = resolve(["--preset=hp2.imagenet.resnet50", f"--data={args.data}"])
    data = data_mod.load(cfg)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    order = data_mod.epoch_order(len(data.train), 0, 0)
    need = (args.batches + args.warmup) * args.batch
    keys = data_mod.epoch_keys(order[:need], 0, args.batch, seed=0, epoch=0)
    out = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu"}
    out["batch"], out["torch"], out["cpus"] = args.batch, torch.__version__, os.cpu_count()
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
    from reproduce.run.report import dumps, write_json  # after the path is set

    print(dumps(out))
    if args.out:
        write_json(args.out, out)


if __name__ == "__main__":
    main()
