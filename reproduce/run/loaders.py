"""Which loader feeds a run its batches: in memory, DataLoader workers, torchvision's nvJPEG or DALI."""

from __future__ import annotations

import functools
import os

from reproduce.build import SetupError
from reproduce.config import Config
from reproduce.data import dali, nvjpeg
from reproduce.data import sets as data_mod
from reproduce.run.launch import Processes

__all__ = ["QUEUES", "auto_loader", "choose_loader", "hardware_queues", "loaders"]


def choose_loader(jpeg: bool, device, *, dali: bool, nvjpeg: bool) -> tuple[str, str]:
    """What ``--loader=auto`` runs, from the facts alone, and the line that says why.

    DALI (``dali``) where the process has a CUDA device and DALI is installed; else torchvision's
    nvJPEG decoder (``gpu``) where that device decodes JPEG; else the DataLoader (``folder``). The
    GPU loaders need ImageNet JPEGs under the basic augmentation. As in NVIDIA's ImageNet examples,
    decoding goes to each process's own GPU, where the DataLoader's CPU decoding is bounded by the
    host's cores, whatever the number of GPUs (``python -m benchmarks.input_pipeline`` measures
    each loader).

    Args:
        jpeg: the data are ImageNet JPEG folders under ``--augment=basic``.
        device: the process's device.
        dali: NVIDIA DALI is importable.
        nvjpeg: torchvision decodes JPEG on ``device`` (`reproduce.data.nvjpeg.available`).

    Returns:
        ``(loader, line)``: a name of ``--loader`` and one line such as
            ``"loader: folder (DataLoader): no CUDA device"``.
    """
    if not jpeg:
        why = "not ImageNet JPEGs under --augment=basic, which the GPU loaders need"
        return "folder", f"loader: folder (DataLoader): {why}"
    if device.type != "cuda":
        return "folder", "loader: folder (DataLoader): no CUDA device"
    if dali:
        return "dali", "loader: dali (DALI): a CUDA device and NVIDIA DALI"
    if nvjpeg:
        why = "a CUDA device whose torchvision decodes JPEG; NVIDIA DALI is not installed"
        return "gpu", f"loader: gpu (torchvision nvJPEG): {why}"
    why = "NVIDIA DALI is not installed and torchvision does not decode JPEG on this CUDA device"
    return "folder", f"loader: folder (DataLoader): {why}"


def auto_loader(jpeg: bool, device) -> tuple[str, str]:
    """`choose_loader` on what this process has: DALI importable, nvJPEG working on ``device``
    (probed with one small decode, only where DALI is absent).

    Args:
        jpeg: the data are ImageNet JPEG folders under ``--augment=basic``.
        device: the process's device.

    Returns:
        ``(loader, line)`` of `choose_loader`.
    """
    gpu = jpeg and device.type == "cuda"
    has_dali = gpu and dali.available()
    has_nvjpeg = gpu and not has_dali and nvjpeg.available(device)
    return choose_loader(jpeg, device, dali=has_dali, nvjpeg=has_nvjpeg)


def _decoders(hw_load: float) -> str:
    """Which of the GPU's JPEG decoders DALI's mixed decoder uses, in words."""
    if hw_load == 0:
        return "nvJPEG's CUDA decoder"
    if hw_load == 1:
        return "the hardware JPEG decoder"
    return f"{hw_load:.0%} on the hardware JPEG decoder, the rest on nvJPEG's CUDA decoder"


QUEUES = 32  # CUDA's hardware work queues a process that DALI's decoding needs beside the step


def hardware_queues() -> int:
    """CUDA's hardware work queues a process: ``CUDA_DEVICE_MAX_CONNECTIONS``, or CUDA's 8 where it
    is unset or not a number (CUDA reads it when it starts; ``reproduce/train.py`` sets `QUEUES`)."""
    text = os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS", "").strip()
    return int(text) if text.isdigit() else 8


def loaders(cfg: Config, data: data_mod.Data, procs: Processes, say=print):
    """``(train loader, eval batches of a split, its name)`` for folder data sets.

    ``--loader=dali``: DALI reads, decodes (nvJPEG's CUDA decoder; ``--dali_hw_load`` sends a share
    to the hardware JPEG decoder, ``--dali_cpu`` decodes on the CPU) and augments on the GPU, its
    crops computed from each example's seed in the pipeline; ``dali_exact``: DALI decodes
    and resizes the crops that torchvision draws under each example's seed, which DataLoader workers
    read and draw; ``gpu``: torchvision's nvJPEG decoder and our own GPU augmentation; ``folder``:
    DataLoader workers on the CPU; ``auto``: `auto_loader`, whose line goes to ``say``. In-memory
    data needs none. DALI on the GPU with fewer than `QUEUES` hardware work queues
    (`hardware_queues`) says in one line to ``say`` that its decoding can wait behind the step.

    Args:
        cfg: the run's configuration (``loader``, ``augment``, batch sizes, DALI's options).
        data: the data sets.
        procs: the processes (device, world size).
        say: receives ``--loader=auto``'s line of what it chose and why, and the queues' line.

    Returns:
        ``(train, eval_batches, name)``; ``train`` is None for in-memory data.

    Raises:
        SetupError: a loader named by ``--loader`` cannot run here.
    """
    if data.train.tensors() is not None:
        return None, lambda ds: data_mod.eval_batches(ds, cfg.eval_batch_size), "in memory"
    per_rank = cfg.batch_size // procs.world
    jpeg = data.name == "imagenet" and cfg.augment == "basic"
    kind = cfg.loader
    if kind == "auto":
        kind, line = auto_loader(jpeg, procs.device)
        say(line)
    if kind.startswith("dali") and not (jpeg and dali.available()):
        raise SetupError(
            f"--loader={kind} needs ImageNet folder data, --augment=basic and NVIDIA DALI "
            "(pip install '.[imagenet]'); use --loader=folder"
        )
    if kind == "gpu" and not (jpeg and nvjpeg.available(procs.device)):
        raise SetupError(
            "--loader=gpu needs ImageNet folder data, --augment=basic and a CUDA device whose "
            "torchvision decodes JPEG (nvJPEG); use --loader=folder"
        )
    if kind != "folder":
        size = data.image_size
        if kind == "gpu":
            make = functools.partial(nvjpeg.GpuJpegLoader, size=size, read_ahead=cfg.read_ahead)
            how = "torchvision nvJPEG decoding, augmentation on the GPU"
        else:
            crops = "dali" if kind == "dali" else "exact"
            gpu = procs.device.type == "cuda" and not cfg.dali_cpu
            threads = cfg.workers or dali.THREADS
            make = functools.partial(
                dali.DaliJpegLoader,
                size=size,
                threads=threads,
                workers=cfg.workers,
                decoder="mixed" if gpu else "cpu",
                crops=crops,
                hw_decoder_load=cfg.dali_hw_load,
                roi_decode=cfg.dali_roi,
                read_ahead=cfg.read_ahead,
            )
            where = "the GPU" if gpu else f"{threads} CPU threads"
            how = f"DALI, decoding on {where}, " + (
                "crops computed in DALI" if crops == "dali" else "torchvision's crops"
            )
            if gpu:
                how += ", " + _decoders(cfg.dali_hw_load)
                if (queues := hardware_queues()) < QUEUES:
                    say(
                        f"CUDA_DEVICE_MAX_CONNECTIONS is {queues}: DALI's decoding can wait behind "
                        f"the step's kernels; {QUEUES} (train.py's default where unset) runs it "
                        "beside them"
                    )
            how += ", each crop's window decoded alone" if cfg.dali_roi and crops == "dali" else ""

        evaluators = {}  # a loader per split, its pipeline kept from one evaluation to the next

        def gpu_eval(ds):
            if id(ds) not in evaluators:
                evaluators[id(ds)] = ds, make(ds, cfg.eval_batch_size, procs.device, train=False)
            return evaluators[id(ds)][1].eval_batches()

        train = make(data.train, per_rank, procs.device)
        return train, gpu_eval, f"{train.name} ({how})"
    pin = procs.device.type == "cuda"
    train = data_mod.FolderLoader(data.train, per_rank, cfg.workers, pin)

    def folder_eval(ds):
        return data_mod.eval_batches(ds, cfg.eval_batch_size, cfg.workers, pin)

    return (
        train,
        folder_eval,
        f"folder (DataLoader, {cfg.workers} persistent workers, CPU decoding)",
    )
