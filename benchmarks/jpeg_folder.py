"""A synthetic ImageNet-shaped JPEG ImageFolder: ``<out>/train/<class>/*.JPEG`` and ``<out>/val/...``.

Images of ImageNet's typical sizes (sides drawn from 300 to 500 pixels, mean about 400×350) and
smooth content (low-frequency noise upsampled, plus fine grain), so that JPEG files come out at about
ImageNet's 110 KB and decode at its cost. Encoded with ``torchvision.io.encode_jpeg`` (on the GPU
where there is one), written by a thread pool. Nothing is downloaded.

    python benchmarks/jpeg_folder.py --out /tmp/imagenet-synth --train 20000 --val 2000 --classes 1000
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.nn.functional as F


def image(gen: torch.Generator, device) -> torch.Tensor:
    h, w = (int(v) for v in torch.randint(300, 501, (2,), generator=gen))
    coarse = torch.rand(1, 3, h // 16 + 1, w // 16 + 1, generator=gen).to(device)
    x = F.interpolate(coarse, size=(h, w), mode="bicubic", align_corners=False)
    x = x + 0.08 * torch.randn(1, 3, h, w, generator=gen).to(device)
    return (x.clamp(0, 1) * 255).to(torch.uint8)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--train", type=int, default=20000)
    ap.add_argument("--val", type=int, default=2000)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--quality", type=int, default=90)
    args = ap.parse_args()
    from torchvision.io import encode_jpeg

    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(0)
    start, total_bytes = time.perf_counter(), 0
    with ThreadPoolExecutor(32) as pool:
        for split, n in (("train", args.train), ("val", args.val)):
            for c in range(args.classes):
                (Path(args.out) / split / f"n{c:08d}").mkdir(parents=True, exist_ok=True)
            for lo in range(0, n, 256):
                idx = range(lo, min(lo + 256, n))
                imgs = [image(gen, device) for _ in idx]
                data = encode_jpeg(imgs, quality=args.quality)
                for i, d in zip(idx, data, strict=True):
                    path = Path(args.out) / split / f"n{i % args.classes:08d}" / f"{split}_{i}.JPEG"
                    raw = d.cpu().numpy().tobytes()
                    total_bytes += len(raw)
                    pool.submit(path.write_bytes, raw)
    n = args.train + args.val
    print(
        f"{n} images in {time.perf_counter() - start:.1f} s, "
        f"mean {total_bytes / n / 1024:.0f} KiB, at {args.out}"
    )


if __name__ == "__main__":
    main()
