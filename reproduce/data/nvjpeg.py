"""ImageNet JPEG folders decoded and augmented on the GPU (nvJPEG through torchvision).

`GpuJpegLoader` serves the same batches as `reproduce.data.batches.FolderLoader`, from the same
(example, augmentation seed) keys, with the decoding and the transforms moved to the GPU:

* a pool of threads reads the files' bytes (``read_ahead`` batches ahead of the step);
* ``torchvision.io.decode_jpeg(..., device="cuda")`` decodes a whole batch with nvJPEG; a file it
  cannot take (CMYK JPEGs, PNGs named .JPEG: a few in ImageNet) is decoded on the CPU instead;
* training: RandomResizedCrop 224 (scale (0.08, 1), ratio (3/4, 4/3)) and a horizontal flip with
  probability 1/2, their parameters drawn exactly as torchvision draws them for the CPU pipeline
  (the same seed per example, hence the same crops and flips), the crop resized with antialiased
  bilinear interpolation; evaluation: the shorter side resized to 256, the centre 224×224 kept;
* then the ImageNet mean and standard deviation normalise the batch, in float32.

Decoding and augmenting run on a CUDA stream of their own in a background thread, so that the next
batches are made while the step computes. The images differ from the CPU pipeline's by the JPEG
decoder's and the resampling filter's rounding only (PIL's and nvJPEG's IDCTs differ slightly).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import queue
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["GpuJpegLoader", "available"]

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
SCALE, RATIO = (0.08, 1.0), (3.0 / 4.0, 4.0 / 3.0)
# torchvision draws the log ratio between float32 logs: the same bounds, to the bit
_LOG_RATIO = tuple(torch.log(torch.tensor(RATIO)).tolist())


def available(device: torch.device) -> bool:
    """Whether batched nvJPEG decoding works here (a CUDA device and a torchvision built with it)."""
    if device.type != "cuda":
        return False
    try:
        from torchvision.io import decode_jpeg, encode_jpeg

        probe = encode_jpeg(torch.zeros(3, 8, 8, dtype=torch.uint8))
        decode_jpeg([probe], device=device)
        return True
    except Exception:
        return False


def crop_and_flip(seed: int, height: int, width: int) -> tuple[int, int, int, int, bool]:
    """``(top, left, h, w, flip)`` of RandomResizedCrop and RandomHorizontalFlip for an image of that
    size, drawn as torchvision's CPU transforms draw them under ``torch.manual_seed(seed)``.

    torchvision's ``RandomResizedCrop.get_params`` and ``RandomHorizontalFlip`` draw from the global
    generator; here the same draws come from a generator of our own seeded with ``seed`` (the same
    Mersenne Twister stream), which costs about 1/20 of forking and reseeding the global one."""
    g = torch.Generator().manual_seed(seed)
    area = height * width
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(*SCALE, generator=g).item()
        aspect_ratio = math.exp(torch.empty(1).uniform_(*_LOG_RATIO, generator=g).item())
        w = round(math.sqrt(target_area * aspect_ratio))
        h = round(math.sqrt(target_area / aspect_ratio))
        if 0 < w <= width and 0 < h <= height:
            i = int(torch.randint(0, height - h + 1, size=(1,), generator=g))
            j = int(torch.randint(0, width - w + 1, size=(1,), generator=g))
            break
    else:  # torchvision's fallback: the central crop of the nearest allowed ratio
        in_ratio = width / height
        if in_ratio < min(RATIO):
            w, h = width, round(width / min(RATIO))
        elif in_ratio > max(RATIO):
            w, h = round(height * max(RATIO)), height
        else:
            w, h = width, height
        i, j = (height - h) // 2, (width - w) // 2
    flip = bool(torch.rand(1, generator=g) < 0.5)
    return i, j, h, w, flip


def _resize_shorter(height: int, width: int, size: int) -> tuple[int, int]:
    """torchvision's ``Resize(size)`` output size for an int ``size``: the shorter side becomes
    ``size``, the longer keeps the aspect ratio (truncated)."""
    short, long = (height, width) if height <= width else (width, height)
    new_long = int(size * long / short)
    return (size, new_long) if height <= width else (new_long, size)


def _read(path: str) -> Tensor:
    with open(path, "rb") as f:
        return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)


class GpuJpegLoader:
    """Batches ``(images, labels)`` of an ImageFolder-based `reproduce.data.examples.Examples`, decoded
    and augmented on ``device``.

    Args:
        ds: the examples (``ds.base`` an ImageFolder; ``ds.indices`` and ``ds.labels`` as usual).
        batch_size: examples per batch (this process's share of the global batch).
        device: the CUDA device.
        train: training transforms (random crop and flip) or evaluation ones (resize, centre crop).
        size: the side of the output images.
        threads: file-reading threads.
        read_ahead: batches prepared ahead of the one being consumed.
        decode_threads: threads that decode parts of a batch at once.
    """

    name = "gpu-nvjpeg"

    def __init__(
        self,
        ds,
        batch_size: int,
        device: torch.device,
        *,
        train: bool = True,
        size: int = 224,
        threads: int = 16,
        read_ahead: int = 3,
        decode_threads: int = 4,
    ):
        self.ds, self.batch_size, self.device = ds, batch_size, torch.device(device)
        self.train, self.size, self.read_ahead = train, size, read_ahead
        self.paths = [p for p, _ in ds.base.samples]
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="jpeg-read")
        self.decode_threads = decode_threads
        self.decoders = ThreadPoolExecutor(decode_threads, thread_name_prefix="jpeg-decode")
        self.mean = torch.tensor(MEAN, device=self.device).view(1, 3, 1, 1) * 255
        self.std = torch.tensor(STD, device=self.device).view(1, 3, 1, 1) * 255

    # ------------------------------------------------------------ one batch
    def _decode(self, data: list[Tensor]) -> list[Tensor]:
        """The batch decoded by ``decode_threads`` threads, each taking a consecutive part (nvJPEG's
        Huffman stage runs on the CPU of the calling thread)."""
        k = min(self.decode_threads, len(data))
        if k <= 1:
            return self._decode_part(data)
        cuts = [round(i * len(data) / k) for i in range(k + 1)]
        parts = [data[a:b] for a, b in itertools.pairwise(cuts)]
        stream = torch.cuda.current_stream(self.device)

        def decode(part):
            with torch.cuda.stream(stream):
                return self._decode_part(part)

        return [img for imgs in self.decoders.map(decode, parts) for img in imgs]

    def _decode_part(self, data: list[Tensor]) -> list[Tensor]:
        from torchvision.io import ImageReadMode, decode_image, decode_jpeg

        try:
            return decode_jpeg(data, mode=ImageReadMode.RGB, device=self.device)
        except RuntimeError:  # a file nvJPEG refuses: decode one by one, those on the CPU
            out = []
            for d in data:
                try:
                    out.append(decode_jpeg(d, mode=ImageReadMode.RGB, device=self.device))
                except RuntimeError:
                    img = decode_image(d, mode=ImageReadMode.RGB)
                    out.append(img.to(self.device, non_blocking=True))
            return out

    def _augment(self, img: Tensor, seed: int | None) -> Tensor:
        _, height, width = img.shape
        x = img.unsqueeze(0).float()
        if self.train:
            i, j, h, w, flip = crop_and_flip(seed, height, width)
            x = F.interpolate(
                x[..., i : i + h, j : j + w],
                size=(self.size, self.size),
                mode="bilinear",
                antialias=True,
                align_corners=False,
            )
            return x.flip(-1) if flip else x
        rh, rw = _resize_shorter(height, width, round(self.size / 0.875))
        x = F.interpolate(x, size=(rh, rw), mode="bilinear", antialias=True, align_corners=False)
        top, left = round((rh - self.size) / 2.0), round((rw - self.size) / 2.0)
        return x[..., top : top + self.size, left : left + self.size]

    def _batch(
        self, keys: list[tuple[int, int | None]], data: list[Tensor]
    ) -> tuple[Tensor, Tensor]:
        images = self._decode(data)
        x = torch.cat(
            [self._augment(img, seed) for img, (_, seed) in zip(images, keys, strict=True)]
        )
        x = (x.clamp_(0, 255) - self.mean) / self.std
        y = torch.stack([self.ds.labels[j] for j, _ in keys]).to(self.device, non_blocking=True)
        return x, y

    # ------------------------------------------------------------ the stream of batches
    def batches(self, keys: list[tuple[int, int | None]]) -> Iterator[tuple[Tensor, Tensor]]:
        """The batches of ``keys`` ((index into ``ds``, augmentation seed) pairs), ``batch_size``
        each, the last partial one dropped in training and kept in evaluation."""
        n = len(keys) // self.batch_size if self.train else -(-len(keys) // self.batch_size)
        parts = [keys[b * self.batch_size : (b + 1) * self.batch_size] for b in range(n)]
        ready: queue.Queue = queue.Queue(maxsize=self.read_ahead)
        stop = threading.Event()
        stream = torch.cuda.Stream(self.device)

        def produce():
            try:
                reads = [self._reads(p) for p in parts[: self.read_ahead]]
                for b, part in enumerate(parts):
                    if stop.is_set():
                        return
                    if b + self.read_ahead < len(parts):
                        reads.append(self._reads(parts[b + self.read_ahead]))
                    data = [f.result() for f in reads[b]]
                    reads[b] = None
                    with torch.cuda.stream(stream):
                        x, y = self._batch(part, data)
                        done = torch.cuda.Event()
                        done.record(stream)
                    ready.put((x, y, done))
                ready.put(None)
            except BaseException as e:  # hand the error to the consumer
                ready.put(e)

        worker = threading.Thread(target=produce, name="jpeg-decode", daemon=True)
        worker.start()
        try:
            while True:
                item = ready.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                x, y, done = item
                torch.cuda.current_stream(self.device).wait_event(done)
                x.record_stream(torch.cuda.current_stream(self.device))
                y.record_stream(torch.cuda.current_stream(self.device))
                yield x, y
        finally:
            stop.set()
            while worker.is_alive():  # unblock a producer waiting on a full queue
                with contextlib.suppress(queue.Empty):
                    ready.get(timeout=0.1)

    def _reads(self, part):
        return [self.pool.submit(_read, self.paths[int(self.ds.indices[j])]) for j, _ in part]

    def eval_batches(self) -> Iterator[tuple[Tensor, Tensor]]:
        """All of ``ds`` in order, with the evaluation transform."""
        return self.batches([(j, None) for j in range(len(self.ds))])
