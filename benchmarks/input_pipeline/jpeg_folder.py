"""A synthetic ImageNet-shaped JPEG ImageFolder: ``<out>/train/<class>/*.JPEG`` and ``<out>/val/...``.

Images of ImageNet's typical sizes (sides drawn from 300 to 500 pixels, mean about 400×350) and
smooth content (low-frequency noise upsampled, plus fine grain), so that JPEG files come out at about
ImageNet's 110 KB (104 KiB mean at quality 90) and decode at its cost. Encoded on the CPU with
``torchvision.io.encode_jpeg`` (libjpeg, 4:2:0 chroma subsampling as in ImageNet's files; the GPU
encoder keeps full chroma, 4:4:4, which makes files of about 177 KiB that cost more to decode), one
image per task of a thread pool, each drawn from a generator seeded by its split and number, so the
folder is the same whatever the pool. Nothing is downloaded.

    python benchmarks/jpeg_folder.py --out /tmp/imagenet-synth --train 20000 --val 2000 --classes 1000
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.nn.functional as F


def image(gen: torch.Generator, device="cpu") -> torch.Tensor:
    h, w = (int(v) for v in torch.randint(300, 501, (2,), generator=gen))
    coarse = torch.rand(1, 3, h // 16 + 1, w // 16 + 1, generator=gen).to(device)
    x = F.interpolate(coarse, size=(h, w), mode="bicubic", align_corners=False)
    x = x + 0.12 * torch.randn(1, 3, h, w, generator=gen).to(device)
    return (x.clamp(0, 1) * 255).to(torch.uint8)[0]


def write(path: Path, seed: int, quality: int) -> int:
    """Image number ``seed`` encoded as a JPEG at ``path``; its size in bytes."""
    from torchvision.io import encode_jpeg

    raw = encode_jpeg(image(torch.Generator().manual_seed(seed)), quality=quality)
    path.write_bytes(raw.numpy().tobytes())
    return len(raw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--train", type=int, default=20000)
    ap.add_argument("--val", type=int, default=2000)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--quality", type=int, default=90)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    torch.set_num_threads(1)  # one image per thread
    start, jobs = time.perf_counter(), []
    with ThreadPoolExecutor(args.threads) as pool:
        for split, n, base in (("train", args.train, 0), ("val", args.val, args.train)):
            for c in range(args.classes):
                (Path(args.out) / split / f"n{c:08d}").mkdir(parents=True, exist_ok=True)
            for i in range(n):
                path = Path(args.out) / split / f"n{i % args.classes:08d}" / f"{split}_{i}.JPEG"
                jobs.append(pool.submit(write, path, base + i, args.quality))
        total_bytes = sum(j.result() for j in jobs)
    n = args.train + args.val
    print(
        f"{n} images in {time.perf_counter() - start:.1f} s, "
        f"mean {total_bytes / n / 1024:.0f} KiB, at {args.out}"
    )


if __name__ == "__main__":
    main()
