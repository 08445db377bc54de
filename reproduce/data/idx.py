"""Fashion-MNIST's four IDX files, read and checked: ``read_fashion_mnist(folder)``.

Fashion-MNIST (Xiao, Rasul and Vollgraf 2017; MIT licence) is 60,000 training and 10,000 test
images of 28×28 grey pixels in 10 classes, stored as in LeCun's MNIST: one IDX file of images and one
of labels per split, each gzipped or not:

    train-images-idx3-ubyte[.gz]   train-labels-idx1-ubyte[.gz]
    t10k-images-idx3-ubyte[.gz]    t10k-labels-idx1-ubyte[.gz]

An IDX file is a big-endian header (two zero bytes, the element type 0x08 for unsigned bytes, the
number of dimensions, then each dimension as a 4-byte integer) followed by the elements. Every file is
checked before anything trains: its header, its dimensions (28×28 images, as many labels as images,
the split's count), its length (a truncated file is refused) and the labels' range, and each error
names the file. ``bash reproduce/data/fashion_mnist.sh DIR`` fetches the files offline;
torchvision's ``FashionMNIST`` reads the same files from ``ROOT/FashionMNIST/raw/``, which this
reader also accepts as the folder.

References:
    Xiao, Rasul, Vollgraf, "Fashion-MNIST: a Novel Image Dataset for Benchmarking Machine Learning
    Algorithms", 2017, https://arxiv.org/abs/1708.07747.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

import torch
from torch import Tensor

from reproduce.data.examples import DataError, DataNotFound

__all__ = ["FILES", "SPLITS", "read_fashion_mnist", "read_idx"]

SPLITS = {"train": 60_000, "t10k": 10_000}  # the file prefix of each split, its examples
FILES = tuple(f"{s}-{k}-ubyte" for s in SPLITS for k in ("images-idx3", "labels-idx1"))
_UBYTE = 0x08  # IDX's element type of unsigned bytes


def _locate(folder: Path, name: str) -> Path:
    for candidate in (folder / f"{name}.gz", folder / name):
        if candidate.is_file():
            return candidate
    raise DataNotFound(
        f"Fashion-MNIST: {str(folder / name)!r}(.gz) is missing; --data must hold the four IDX "
        f"files {', '.join(FILES)} (gzipped or not); bash reproduce/data/fashion_mnist.sh DIR "
        "fetches them"
    )


def read_idx(path: Path) -> Tensor:
    """The unsigned-byte array of one IDX file (gzipped when its name ends in ``.gz``).

    Args:
        path: the file.

    Returns:
        A ``uint8`` tensor of the file's dimensions.

    Raises:
        DataError: the file cannot be read, is not an IDX file of unsigned bytes, or is shorter or
            longer than its header says (the message names the file).
    """
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise DataError(f"Fashion-MNIST: cannot read {str(path)!r}: {e}") from None
    if len(raw) < 4 or raw[:2] != b"\0\0" or raw[2] != _UBYTE or raw[3] == 0:
        raise DataError(f"Fashion-MNIST: {str(path)!r} is not an IDX file of unsigned bytes")
    ndim = raw[3]
    head = 4 + 4 * ndim
    if len(raw) < head:
        raise DataError(f"Fashion-MNIST: {str(path)!r} ends inside its header (truncated)")
    dims = struct.unpack(f">{ndim}I", raw[4:head])
    count = 1
    for d in dims:
        count *= d
    if len(raw) != head + count:
        what = "truncated" if len(raw) < head + count else "longer than its header says"
        raise DataError(
            f"Fashion-MNIST: {str(path)!r} holds {len(raw) - head} bytes of data for dimensions "
            f"{'×'.join(map(str, dims))} ({count} bytes): {what}"
        )
    return torch.frombuffer(bytearray(raw[head:]), dtype=torch.uint8).reshape(dims)


def read_fashion_mnist(folder: str | Path) -> dict[str, tuple[Tensor, Tensor]]:
    """The training and test splits of Fashion-MNIST in ``folder``, checked.

    Args:
        folder: the folder of the four IDX files (or torchvision's ``ROOT/FashionMNIST/raw``).

    Returns:
        ``{"train": (images, labels), "t10k": (images, labels)}``: images ``uint8`` of shape
        ``(n, 28, 28)``, labels ``int64`` in 0..9.

    Raises:
        DataNotFound: ``folder`` or one of the files is missing (the message names it).
        DataError: a file is damaged or does not fit the others (the message names it).
    """
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise DataNotFound(
            f"Fashion-MNIST: --data={str(folder)!r} is not a folder; it must hold the four IDX "
            f"files {', '.join(FILES)} (gzipped or not)"
        )
    out = {}
    for split, n in SPLITS.items():
        images_path = _locate(root, f"{split}-images-idx3-ubyte")
        labels_path = _locate(root, f"{split}-labels-idx1-ubyte")
        images, labels = read_idx(images_path), read_idx(labels_path)
        if images.shape != (n, 28, 28):
            raise DataError(
                f"Fashion-MNIST: {str(images_path)!r} holds images of shape "
                f"{tuple(images.shape)}; its split has {n} images of 28×28"
            )
        if labels.shape != (n,):
            raise DataError(
                f"Fashion-MNIST: {str(labels_path)!r} holds labels of shape {tuple(labels.shape)}; "
                f"its split has {n} labels"
            )
        if int(labels.max()) > 9:
            raise DataError(
                f"Fashion-MNIST: {str(labels_path)!r} has a label {int(labels.max())}; classes are 0..9"
            )
        out[split] = images, labels.long()
    return out
