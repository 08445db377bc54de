"""A synthetic ImageNet-shaped JPEG ImageFolder: ``<out>/train/<class>/*.JPEG`` and ``<out>/val/...``.

Images of ImageNet's typical sizes (sides drawn from 300 to 500 pixels, mean about 400×350) and
smooth content (low-frequency noise upsampled, plus fine grain), so that JPEG files come out at about
ImageNet's 110 KB (104 KiB mean at quality 90) and decode at its cost. Encoded on the CPU with
Pillow (libjpeg, 4:2:0 chroma subsampling as in ImageNet's files; full chroma, 4:4:4, makes files
of about 177 KiB that cost more to decode), one
image per task of a thread pool, each drawn from a generator seeded by its split and number, so the
folder is the same whatever the pool. Nothing is downloaded.

    python -m benchmarks.input_pipeline.jpeg_folder --out /tmp/imagenet-synth --train 20000 --val 2000
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
    from PIL import Image

    pixels = image(torch.Generator().manual_seed(seed)).permute(1, 2, 0).contiguous().numpy()
    Image.fromarray(pixels).save(path, format="JPEG", quality=quality, subsampling=2)  # 4:2:0
    return path.stat().st_size


def build(
    out: str | Path,
    train: int,
    val: int,
    classes: int,
    quality: int = 90,
    threads: int | None = None,
) -> int:
    """Write the folder.

    Args:
        out: its root; ``train/`` and ``val/`` go inside, one subfolder per class.
        train: training images.
        val: validation images.
        classes: classes, images dealt to them in turn.
        quality: JPEG quality.
        threads: encoding threads (default: the cores).

    Returns:
        The bytes written.

    Raises:
        ValueError: if ``classes`` is below 1 or ``train`` or ``val`` below 0.
    """
    if classes < 1:
        raise ValueError(f"classes must be >= 1; got {classes}")
    if train < 0 or val < 0:
        raise ValueError(f"train and val must be >= 0; got {train}, {val}")
    threads_before = torch.get_num_threads()
    torch.set_num_threads(1)  # one image per thread
    jobs = []
    try:
        with ThreadPoolExecutor(threads or os.cpu_count()) as pool:
            for split, n, base in (("train", train, 0), ("val", val, train)):
                for c in range(classes):
                    (Path(out) / split / f"n{c:08d}").mkdir(parents=True, exist_ok=True)
                for i in range(n):
                    path = Path(out) / split / f"n{i % classes:08d}" / f"{split}_{i}.JPEG"
                    jobs.append(pool.submit(write, path, base + i, quality))
            return sum(j.result() for j in jobs)
    finally:
        torch.set_num_threads(threads_before)


def main(argv=None) -> None:
    """The command line: build the folder and say how large its files are."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--train", type=int, default=20000)
    ap.add_argument("--val", type=int, default=2000)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--quality", type=int, default=90)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args(argv)
    start = time.perf_counter()
    total_bytes = build(args.out, args.train, args.val, args.classes, args.quality, args.threads)
    n = args.train + args.val
    print(
        f"{n} images in {time.perf_counter() - start:.1f} s, "
        f"mean {total_bytes / max(n, 1) / 1024:.0f} KiB, at {args.out}"
    )


if __name__ == "__main__":
    main()
