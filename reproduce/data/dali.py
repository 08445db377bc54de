"""ImageNet JPEG folders decoded and augmented by NVIDIA DALI (the ``[imagenet]`` extra).

`DaliJpegLoader` serves the batches of an epoch's (example, augmentation seed) keys, this
rank's part of the global order as `reproduce.data.batches.FolderLoader` serves them, through a DALI
pipeline. DALI's ``mixed`` decoder decodes on the GPU: nvJPEG's CUDA decoder (Huffman decoding
on DALI's CPU threads, the rest in CUDA kernels) and, for a share ``hw_decoder_load`` of each batch,
the GPU's hardware JPEG engines (A100, H100 and H200 have them; none by default, below).
The augmentation (RandomResizedCrop 224 with scale (0.08, 1) and ratio (3/4, 4/3), a horizontal
flip with probability 1/2, the ImageNet normalisation; for evaluation the shorter side resized to
256 and the centre 224×224 kept) runs on the GPU. Two ways to draw the crops:

* ``crops="dali"`` (``--loader=dali``): in training, DALI reads the files in the keys' order on
  threads of its own and computes each crop window and flip in the pipeline, from the image's size and
  numbers hashed from the example's seed (`uniforms`): no Python per image, and an example's
  crop does not depend on the batch, the rank or the resume point, so a resumed run is bit-exact.
  The window is RandomResizedCrop's (area fraction, log aspect ratio and corner uniform), clamped to
  the image where torchvision would draw again: the same transform, not torchvision's draws.
  Evaluation, which draws nothing, is the exact pipeline's.
* ``crops="exact"`` (``--loader=dali_exact``): DataLoader worker processes (`Encoded`) read
  each file, read its size from the JPEG header and draw its crop window and flip under the
  example's seed exactly as torchvision's CPU transforms draw them
  (`reproduce.data.nvjpeg.crop_and_flip`), and hand each batch's files over as one shared tensor
  (`collate`); DALI decodes and resizes each window (linear, antialiased, one resampling). The
  batches are the CPU pipeline's to the decoders' rounding, and a resumed run is bit-exact; the
  Python work per image, about 0.1-0.2 ms in a worker, bounds the rate.

On the GPU a batch is handed over on the consumer's current stream (``train.py``'s is a stream of
its own, `reproduce.run.launch.own_stream`): the copy waits on the GPU for DALI's work, the
host does not. DALI decodes on streams of its own, and CUDA carries a process's streams on a fixed
number of hardware work queues, 8 unless ``CUDA_DEVICE_MAX_CONNECTIONS`` sets another: a decoding
stream that shares a queue with the training stream can wait behind the step's kernels queued there.
With 8, DALI's decoding thread waited in ``cudaEventSynchronize`` from early in a step until its
kernels ended, so each batch's decoding latency was added to the step, most of all on the hardware
decoder. ``reproduce/train.py`` sets 32 unless the variable is set, and decoding runs beside the
step; a script of its own that trains beside this loader should set it before CUDA starts. Either way
nvJPEG's CUDA decoder costs the step less than the hardware decoder, and a share split between the
two costs about what the hardware decoder does (``python -m benchmarks.data_parallel --data``; the
measured data-path costs are in benchmarks/RESULTS.md and docs/guides/imagenet.md).

With ``decoder="cpu"`` the files are decoded (DALI's CPU decoder, libjpeg-turbo as in PIL) and
resized on DALI's CPU threads: on a CUDA device the resized uint8 images then go to the GPU, where
they are normalised and handed over as above (``--dali_cpu``, as in NVIDIA's ImageNet examples: the
host's cores decode, the GPU's engines and kernels are left to the step); without one the whole
pipeline runs on the CPU, which is how its tests run.
"""

from __future__ import annotations

import io
from collections.abc import Iterator

import numpy as np
import torch
from torch import Tensor

from reproduce.data.nvjpeg import _LOG_RATIO, MEAN, SCALE, STD, _resize_shorter, crop_and_flip

__all__ = ["THREADS", "DaliJpegLoader", "available"]

THREADS = 8  # DALI's CPU threads unless told


def available() -> bool:
    """Whether DALI is installed (on a CUDA device it decodes on the GPU, else on the CPU)."""
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return False
    return True


def jpeg_size(data: bytes) -> tuple[int, int]:
    """``(height, width)`` from an image file's header (PIL reads the header only)."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        width, height = img.size
    return height, width


class DaliJpegLoader:
    """Batches ``(images, labels)`` of an ImageFolder-based `reproduce.data.examples.Examples`, decoded
    and augmented by DALI.

    Args:
        ds: the examples (``ds.base`` an ImageFolder; ``ds.indices`` and ``ds.labels`` as usual).
        batch_size: examples per batch (this process's share of the global batch).
        device: where the batches go: a CUDA device, or the CPU (``decoder="cpu"`` only).
        train: training transforms (random crop and flip) or evaluation ones (resize, centre crop).
        size: the side of the output images.
        threads: DALI's CPU threads.
        workers: DataLoader worker processes that read the files and draw the crops of
            ``crops="exact"`` (0: the calling process does).
        read_ahead: batches prepared ahead of the one being consumed (by DALI, and by each worker).
        decoder: DALI's decoder backend: ``"mixed"`` (the GPU's; the default on a CUDA device) or
            ``"cpu"`` (decoding and resizing on ``threads`` CPU threads).
        hw_decoder_load: the share of each batch that the hardware JPEG decoder takes (none by
            default: nvJPEG's CUDA decoder costs a training step least; see above).
        fancy_upsampling: libjpeg-turbo's chroma upsampling in the GPU decoder too (as PIL decodes).
        crops: ``"dali"`` (DALI reads and draws) or ``"exact"`` (torchvision's draws; see above).
        roi_decode: with ``crops="dali"`` in training, decode only each crop's window (its corner and
            sides rounded to whole pixels) rather than the whole image, then resize the window: less
            decoding and resampling per image on the training GPU, slightly different pixels
            (``False``: the whole image decoded, the window resized from it).
    """

    def __init__(
        self,
        ds,
        batch_size: int,
        device: torch.device,
        *,
        train: bool = True,
        size: int = 224,
        threads: int = THREADS,
        workers: int = 0,
        read_ahead: int = 3,
        decoder: str | None = None,
        hw_decoder_load: float = 0.0,
        fancy_upsampling: bool = False,
        crops: str = "dali",
        roi_decode: bool = True,
    ):
        self.device = torch.device(device)
        self.decoder = decoder or ("mixed" if self.device.type == "cuda" else "cpu")
        if self.decoder not in ("mixed", "cpu"):
            raise ValueError(f"decoder must be 'mixed' or 'cpu', got {decoder!r}")
        if self.decoder == "mixed" and self.device.type != "cuda":
            raise ValueError("decoder='mixed' needs a CUDA device")
        if crops not in ("dali", "exact"):
            raise ValueError(f"crops must be 'dali' or 'exact', got {crops!r}")
        self.crops, self.name = crops, "dali" if crops == "dali" else "dali_exact"
        self.ds, self.batch_size, self.train, self.size = ds, batch_size, train, size
        self.threads, self.read_ahead, self.hw_decoder_load = threads, read_ahead, hw_decoder_load
        self.fancy_upsampling, self.roi_decode = fancy_upsampling, roi_decode
        self._cuda = self.device.type == "cuda"
        self.paths = [p for p, _ in ds.base.samples]
        self.workers = workers
        self._reader = None  # crops="exact": the DataLoader of encoded examples, made on first use
        self._pipe = None  # the pipeline, built on first use and kept from one epoch to the next
        self._feed = Feed()  # the batches its external source reads in this epoch
        self._epoch = 0  # the calls of batches() so far: only the newest may run the pipeline
        self._open = False  # an epoch of the pipeline not yet brought to its end

    # ------------------------------------------------------------ the pipelines
    def _decode(self, jpegs, **window):
        """The images decoded; with ``window`` (``fn.decoders.image_crop``'s arguments) only that
        window of each."""
        from nvidia.dali import fn, types

        extra = {}
        if self.decoder == "mixed":  # the paddings of NVIDIA's ImageNet example: no buffer regrows
            extra = dict(
                hw_decoder_load=self.hw_decoder_load,
                device_memory_padding=211_025_920,
                host_memory_padding=140_544_512,
            )
        decode = fn.decoders.image_crop if window else fn.decoders.image
        return decode(
            jpegs,
            device=self.decoder,
            output_type=types.RGB,
            adjust_orientation=False,
            jpeg_fancy_upsampling=self.fancy_upsampling,
            **window,
            **extra,
        )

    def _normalise(self, images, **kwargs):
        from nvidia.dali import fn, types

        if self._cuda and self.decoder == "cpu":  # resized on the CPU: uint8 to the GPU
            images = images.gpu()
        mean = [m * 255 for m in MEAN]
        std = [s * 255 for s in STD]
        return fn.crop_mirror_normalize(
            images, dtype=types.FLOAT, output_layout="CHW", mean=mean, std=std, **kwargs
        )

    def _labels(self, labels):
        """The labels as the pipeline returns them: on the GPU for a CUDA device, so that no batch
        waits for a copy from pageable host memory (which synchronises the training stream)."""
        return labels.gpu() if self._cuda else labels

    def _pipeline(self, graph):
        from nvidia.dali import pipeline_def

        return pipeline_def(
            graph,
            batch_size=self.batch_size,
            num_threads=self.threads,
            device_id=(self.device.index or 0) if self._cuda else None,
            prefetch_queue_depth=self.read_ahead,
            exec_dynamic=True,
        )()

    def _exact_pipeline(self):
        """External windows: the window (top, left, bottom, right) resized to size² in one
        resampling; for evaluation the same sampling positions and filter as resizing the whole
        image and cropping its centre."""
        from nvidia.dali import fn, types

        def graph():
            jpegs, labels, window, flip = fn.external_source(
                source=self._feed, num_outputs=4, batch=True
            )
            images = fn.resize(
                self._decode(jpegs),
                size=[self.size, self.size],
                roi_start=window[0:2],
                roi_end=window[2:4],
                roi_relative=False,
                interp_type=types.INTERP_LINEAR,
                antialias=True,
            )
            return self._normalise(images, mirror=flip[0]), self._labels(labels)

        return self._pipeline(graph)

    def _dali_pipeline(self):
        """The keys' files read in order on DALI's threads; each crop window and flip computed in
        the pipeline from the image's size and five uniform numbers hashed from the example's seed
        (`uniforms`, fed with the paths by `_dali_feed`): RandomResizedCrop's area
        fraction in (0.08, 1) and log aspect ratio in (log 3/4, log 4/3), the window clamped to the
        image (torchvision draws again, up to ten times, where this clamps), its corner uniform over
        the positions left, a flip with probability 1/2."""
        from nvidia.dali import fn, types
        from nvidia.dali import math as dmath

        (log_lo, log_hi), (a_lo, a_hi) = _LOG_RATIO, SCALE

        def graph():
            paths, y, u = fn.external_source(source=self._feed, num_outputs=3, batch=True)
            jpegs = fn.io.file.read(paths)
            shape = fn.cast(fn.peek_image_shape(jpegs), dtype=types.FLOAT)
            height, width = shape[0], shape[1]
            area = height * width * (a_lo + (a_hi - a_lo) * u[0])
            ratio = dmath.exp(log_lo + (log_hi - log_lo) * u[1])
            w = dmath.min(dmath.sqrt(area * ratio), width)
            h = dmath.min(dmath.sqrt(area / ratio), height)
            top, left = (height - h) * u[2], (width - w) * u[3]
            if self.roi_decode:  # the window's corner at u[3], u[2] of the free space, as above
                window = dict(crop_w=w, crop_h=h, crop_pos_x=u[3], crop_pos_y=u[2])
                roi = {}
            else:
                window = {}
                roi = dict(roi_start=fn.stack(top, left), roi_end=fn.stack(top + h, left + w))
            images = fn.resize(
                self._decode(jpegs, **window),
                size=[self.size, self.size],
                roi_relative=False,
                interp_type=types.INTERP_LINEAR,
                antialias=True,
                **roi,
            )
            flip = fn.cast(u[4] < 0.5, dtype=types.INT32)
            return self._normalise(images, mirror=flip), self._labels(y)

        return self._pipeline(graph)

    def _dali_feed(self, keys) -> Iterator[list]:
        """The batches of ``keys`` as `_dali_pipeline` reads them: each file's path (UTF-8
        bytes), its label, the example's five uniform numbers."""
        rows = torch.tensor([j for j, _ in keys])
        files = [self.paths[i] for i in self.ds.indices.cpu()[rows].tolist()]
        labels = self.ds.labels.cpu()[rows].numpy().astype(np.int64)
        draws = uniforms(np.array([seed for _, seed in keys], dtype=np.uint64), 5)
        for start in range(0, len(keys), self.batch_size):
            part = slice(start, start + self.batch_size)
            paths = [np.frombuffer(f.encode(), np.uint8) for f in files[part]]
            yield [paths, labels[part, None], draws[part]]

    def _exact_feed(self, keys) -> Iterator[list]:
        """The batches of ``keys`` as `_exact_pipeline` reads them, from a DataLoader whose
        workers read the files and draw the crops (`Encoded`) ``read_ahead`` batches ahead,
        each batch's files in one shared tensor; the workers persist from one epoch to the next."""
        from reproduce.data.batches import FolderLoader

        if self._reader is None:
            encoded = Encoded(self.ds, self.train, self.size)
            self._reader = FolderLoader(
                encoded,
                self.batch_size,
                self.workers,
                prefetch=self.read_ahead,
                collate_fn=collate,
                drop_last=self.train,
            )
        return (columns(batch) for batch in self._reader.batches(keys))

    # ------------------------------------------------------------ the stream of batches
    def batches(self, keys: list[tuple[int, int | None]]) -> Iterator[tuple[Tensor, Tensor]]:
        """The batches of ``keys`` ((index into ``ds``, augmentation seed) pairs), ``batch_size``
        each, the last partial one dropped in training and kept in evaluation.

        One pipeline serves every epoch: built at the first, it is reset at each next one (its
        decoders, buffers and threads kept), so that an epoch starts as fast as a batch is made."""
        n = len(keys) // self.batch_size if self.train else -(-len(keys) // self.batch_size)
        if n == 0:
            return
        keys = keys[: n * self.batch_size]
        dali = self.crops == "dali" and self.train  # evaluation draws nothing: always exact
        if self._open:  # an earlier epoch's batches, left unfinished, still held
            self._end_epoch()
        self._epoch += 1
        epoch = self._epoch
        self._feed.batches = self._dali_feed(keys) if dali else self._exact_feed(keys)
        if self._pipe is None:
            self._pipe = self._dali_pipeline() if dali else self._exact_pipeline()
            self._pipe.build()
        else:
            self._pipe.reset()
        pipe, self._open = self._pipe, True
        # The GPU outputs are bound to the training stream, not synchronised with the host: a
        # batch's copy waits on the GPU for DALI's work, and the host runs on to the next step.
        stream = torch.cuda.current_stream(self.device) if self._cuda else None
        try:
            for b in range(n):
                if self._epoch != epoch:
                    raise RuntimeError("a later epoch of this loader has started")
                images, labels = pipe.run(stream)
                count = min(self.batch_size, len(keys) - b * self.batch_size)
                x = self._to_torch(images, stream)[:count]
                y = self._to_torch(labels, stream).reshape(-1)[:count]
                yield x, y.to(torch.int64)
        except GeneratorExit:  # the epoch left early
            if self._epoch == epoch:
                self._end_epoch()
            raise
        except BaseException:  # a pipeline that failed is not used again
            if self._epoch == epoch:
                self._pipe, self._open = None, False
            raise
        self._end_epoch()

    def _end_epoch(self) -> None:
        """Bring the pipeline to its epoch's end, ready for a reset: the feed emptied, the batches
        it had read ahead (when the epoch was left early) run and dropped. A pipeline that fails
        here is dropped, and the next epoch builds a new one."""
        self._feed.batches, self._open = iter(()), False
        try:
            while True:
                self._pipe.run()
        except StopIteration:
            pass
        except Exception:
            self._pipe = None

    def _to_torch(self, outputs, stream) -> Tensor:
        """A batch of DALI's outputs as one tensor on ``self.device``; from the GPU, copied on
        ``stream`` after DALI's work there."""
        tensor = outputs.as_tensor()
        if self._cuda:
            from nvidia.dali.plugin.pytorch import feed_ndarray, to_torch_type

            dtype = to_torch_type[tensor.dtype]
            out = torch.empty(tensor.shape(), dtype=dtype, device=self.device)
            feed_ndarray(tensor, out, cuda_stream=stream)
            return out
        return torch.from_numpy(np.array(outputs.as_array())).to(self.device)

    def eval_batches(self) -> Iterator[tuple[Tensor, Tensor]]:
        """All of ``ds`` in order, with the evaluation transform."""
        return self.batches([(j, None) for j in range(len(self.ds))])


class Feed:
    """What a pipeline's external source reads: the next of this epoch's ``batches``;
    ``StopIteration`` ends DALI's epoch. The pipeline holds this, not its loader, so that no cycle
    keeps a dropped loader's pipeline (and its threads) alive until a garbage collection, which a
    forked DataLoader worker could run on the pipeline it inherited."""

    def __init__(self):
        self.batches: Iterator[list] = iter(())

    def __call__(self) -> list:
        return next(self.batches)


class Encoded(torch.utils.data.Dataset):
    """The per-image work of exact crops, for DataLoader workers: key ``(j, seed)`` of ``ds`` ->
    the file's bytes, its label, the window of the source image that becomes the output image (top,
    left, bottom, right) and the flip. Training windows are torchvision's RandomResizedCrop drawn
    under ``seed``; evaluation windows are the preimage of the centre ``size``² of the image whose
    shorter side is resized to ``size / 0.875`` (256), the longer truncated as torchvision does."""

    def __init__(self, ds, train: bool, size: int):
        self.ds, self.train, self.size = ds, train, size
        self.paths = [p for p, _ in ds.base.samples]

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, key: tuple[int, int | None]):
        j, seed = key
        with open(self.paths[int(self.ds.indices[j])], "rb") as f:
            data = f.read()
        height, width = jpeg_size(data)
        if self.train:
            i, k, h, w, flip = crop_and_flip(seed, height, width)
            window = [i, k, i + h, k + w]
        else:
            rh, rw = _resize_shorter(height, width, round(self.size / 0.875))
            top, left = round((rh - self.size) / 2.0), round((rw - self.size) / 2.0)
            sy, sx = height / rh, width / rw
            window = [top * sy, left * sx, (top + self.size) * sy, (left + self.size) * sx]
            flip = False
        return np.frombuffer(data, np.uint8), int(self.ds.labels[j]), window, int(flip)


def collate(examples) -> tuple[Tensor, ...]:
    """A batch of `Encoded` examples as five tensors (one shared-memory transfer each from a
    worker): the files' bytes end to end, where each file ends, the labels, the windows, the flips."""
    data, labels, windows, flips = zip(*examples, strict=True)
    ends = np.cumsum([len(d) for d in data])
    return (
        torch.from_numpy(np.concatenate(data)),
        torch.from_numpy(ends),
        torch.tensor(labels, dtype=torch.int64).view(-1, 1),
        torch.tensor(windows, dtype=torch.float32),
        torch.tensor(flips, dtype=torch.int32).view(-1, 1),
    )


def columns(batch: tuple[Tensor, ...]) -> list:
    """A collated batch as DALI's external source takes it: one array per file, and dense arrays."""
    data, ends, labels, windows, flips = (t.numpy() for t in batch)
    return [np.split(data, ends[:-1]), labels, windows, flips]


def uniforms(seeds: np.ndarray, k: int) -> np.ndarray:
    """``(len(seeds), k)`` numbers uniform in [0, 1), number i of row j a function of ``seeds[j]``
    and i only (splitmix64's output function, 53 bits): an example's draws do not depend on the
    batch, the rank or the resume point that it comes in."""
    x = seeds.astype(np.uint64)[:, None] + np.arange(1, k + 1, dtype=np.uint64) * np.uint64(
        0x9E3779B97F4A7C15
    )
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x = x ^ (x >> np.uint64(31))
    return ((x >> np.uint64(11)).astype(np.float64) * 2.0**-53).astype(np.float32)
