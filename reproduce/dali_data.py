"""ImageNet JPEG folders decoded and augmented by NVIDIA DALI (the ``[imagenet]`` extra).

:class:`DaliJpegLoader` serves the batches of :class:`reproduce.data.FolderLoader` and
:class:`reproduce.gpu_data.GpuJpegLoader`, from the same (example, augmentation seed) keys, through a
DALI pipeline:

* a pool of threads reads each file's bytes, reads its size from the JPEG header and draws its
  RandomResizedCrop window and flip under the example's seed exactly as torchvision's CPU transforms
  draw them (:func:`reproduce.gpu_data.crop_and_flip`), ``read_ahead`` batches ahead of the step;
* DALI's ``mixed`` decoder decodes the batch: the GPU's hardware JPEG engines take a share
  (``hw_decoder_load``; A100, H100 and H200 have them) and nvJPEG's CUDA decoder the rest, with
  libjpeg-turbo's chroma upsampling (``jpeg_fancy_upsampling``) and no EXIF rotation, as PIL decodes;
* training: the crop window resized to 224×224 (linear, antialiased) in one resampling, the flip and
  the ImageNet normalisation in one kernel; evaluation: the shorter side resized to 256 with the
  longer side truncated as torchvision's ``Resize`` does, the centre 224×224 kept;
* the batch is copied into a float32 ``torch`` tensor on the training stream.

With ``decoder="cpu"`` the same pipeline runs on the CPU (DALI's CPU decoder): no GPU needed, which
is how its tests run without one. DALI runs the decoding and the resampling ahead of the step on
threads and a CUDA stream of its own. The images differ from the CPU pipeline's by the decoders' and
the resampling filters' rounding only.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from torch import Tensor

from reproduce.gpu_data import MEAN, STD, _resize_shorter, crop_and_flip

__all__ = ["DaliJpegLoader", "available"]


def available(device: torch.device | None = None) -> bool:
    """Whether DALI is installed (and, for a CUDA ``device``, sees that GPU)."""
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return False
    return device is None or device.type == "cuda"


def jpeg_size(data: bytes) -> tuple[int, int]:
    """``(height, width)`` from an image file's header (PIL reads the header only)."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        width, height = img.size
    return height, width


class DaliJpegLoader:
    """Batches ``(images, labels)`` of an ImageFolder-based :class:`reproduce.data.Examples`, decoded
    and augmented by DALI.

    Args:
        ds: the examples (``ds.base`` an ImageFolder; ``ds.indices`` and ``ds.labels`` as usual).
        batch_size: examples per batch (this process's share of the global batch).
        device: the CUDA device (``decoder="mixed"``) or the CPU (``decoder="cpu"``).
        train: training transforms (random crop and flip) or evaluation ones (resize, centre crop).
        size: the side of the output images.
        threads: file-reading threads, and DALI's CPU threads.
        read_ahead: batches prepared ahead of the one being consumed.
        decoder: DALI's decoder backend: ``"mixed"`` (GPU) or ``"cpu"``.
        hw_decoder_load: the share of each batch that the hardware JPEG decoder takes.
        fancy_upsampling: libjpeg-turbo's chroma upsampling in the GPU decoder too (as PIL decodes).
    """

    name = "dali"

    def __init__(
        self,
        ds,
        batch_size: int,
        device: torch.device,
        *,
        train: bool = True,
        size: int = 224,
        threads: int = 8,
        read_ahead: int = 3,
        decoder: str | None = None,
        hw_decoder_load: float = 0.65,
        fancy_upsampling: bool = False,
    ):
        self.device = torch.device(device)
        self.decoder = decoder or ("mixed" if self.device.type == "cuda" else "cpu")
        if self.decoder not in ("mixed", "cpu"):
            raise ValueError(f"decoder must be 'mixed' or 'cpu', got {decoder!r}")
        if self.decoder == "mixed" and self.device.type != "cuda":
            raise ValueError("decoder='mixed' needs a CUDA device")
        self.ds, self.batch_size, self.train, self.size = ds, batch_size, train, size
        self.threads, self.read_ahead, self.hw_decoder_load = threads, read_ahead, hw_decoder_load
        self.fancy_upsampling = fancy_upsampling
        self.paths = [p for p, _ in ds.base.samples]
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="dali-read")

    # ------------------------------------------------------------ one example, on a reading thread
    def _example(self, key: tuple[int, int | None]):
        """The file's bytes, its label, the window of the source image that becomes the output
        image (top, left, bottom, right) and the flip."""
        j, seed = key
        with open(self.paths[int(self.ds.indices[j])], "rb") as f:
            data = f.read()
        height, width = jpeg_size(data)
        if self.train:
            i, k, h, w, flip = crop_and_flip(seed, height, width)
            window = [i, k, i + h, k + w]
        else:  # the shorter side resized to 256, the centre 224² kept: that square's preimage
            rh, rw = _resize_shorter(height, width, round(self.size / 0.875))
            top, left = round((rh - self.size) / 2.0), round((rw - self.size) / 2.0)
            sy, sx = height / rh, width / rw
            window = [top * sy, left * sx, (top + self.size) * sy, (left + self.size) * sx]
            flip = False
        return (
            np.frombuffer(data, np.uint8),
            np.array([int(self.ds.labels[j])], np.int64),
            np.array(window, np.float32),
            np.array([flip], np.int32),
        )

    # ------------------------------------------------------------ the pipeline
    def _pipeline(self, source):
        from nvidia.dali import fn, pipeline_def, types

        size, mixed = self.size, self.decoder == "mixed"
        mean = [m * 255 for m in MEAN]
        std = [s * 255 for s in STD]

        @pipeline_def(
            batch_size=self.batch_size,
            num_threads=self.threads,
            device_id=(self.device.index or 0) if mixed else None,
            prefetch_queue_depth=self.read_ahead,
            exec_dynamic=True,
        )
        def pipe():
            jpegs, labels, window, flip = fn.external_source(
                source=source, num_outputs=4, batch=True
            )
            extra = (
                dict(hw_decoder_load=self.hw_decoder_load, device_memory_padding=211_025_920)
                if mixed
                else {}
            )
            images = fn.decoders.image(
                jpegs,
                device=self.decoder,
                output_type=types.RGB,
                adjust_orientation=False,
                jpeg_fancy_upsampling=self.fancy_upsampling,
                **extra,
            )
            # the window resized to size² in one resampling: for evaluation the same sampling
            # positions and filter as resizing the whole image and cropping its centre
            images = fn.resize(
                images,
                size=[size, size],
                roi_start=window[0:2],
                roi_end=window[2:4],
                roi_relative=False,
                interp_type=types.INTERP_LINEAR,
                antialias=True,
            )
            images = fn.crop_mirror_normalize(
                images, dtype=types.FLOAT, output_layout="CHW", mean=mean, std=std, mirror=flip[0]
            )
            return images, labels

        return pipe()

    # ------------------------------------------------------------ the stream of batches
    def batches(self, keys: list[tuple[int, int | None]]) -> Iterator[tuple[Tensor, Tensor]]:
        """The batches of ``keys`` ((index into ``ds``, augmentation seed) pairs), ``batch_size``
        each, the last partial one dropped in training and kept in evaluation."""
        n = len(keys) // self.batch_size if self.train else -(-len(keys) // self.batch_size)
        parts = [keys[b * self.batch_size : (b + 1) * self.batch_size] for b in range(n)]
        if n == 0:
            return
        pending = [self._submit(p) for p in parts[: self.read_ahead + 1]]
        fed = iter(range(n))

        def source():
            b = next(fed)  # StopIteration ends DALI's epoch
            if b + len(pending) < n:
                pending.append(self._submit(parts[b + len(pending)]))
            examples = [f.result() for f in pending.pop(0)]
            return [list(column) for column in zip(*examples, strict=True)]

        pipe = self._pipeline(source)
        pipe.build()
        try:
            for _ in range(n):
                images, labels = pipe.run()
                y = torch.from_numpy(labels.as_array().reshape(-1))
                yield self._to_torch(images), y.to(self.device, non_blocking=True)
        finally:
            del pipe

    def _submit(self, part):
        return [self.pool.submit(self._example, key) for key in part]

    def _to_torch(self, images) -> Tensor:
        tensor = images.as_tensor()
        out = torch.empty(tensor.shape(), dtype=torch.float32, device=self.device)
        if self.decoder == "mixed":
            from nvidia.dali.plugin.pytorch import feed_ndarray

            stream = torch.cuda.current_stream(self.device)
            feed_ndarray(tensor, out, cuda_stream=stream)
        else:
            out.copy_(torch.from_numpy(images.as_array()))
        return out

    def eval_batches(self) -> Iterator[tuple[Tensor, Tensor]]:
        """All of ``ds`` in order, with the evaluation transform."""
        return self.batches([(j, None) for j in range(len(self.ds))])
