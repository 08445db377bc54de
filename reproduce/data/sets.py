"""The data sets and augmentations of ``reproduce/train.py``, label noise and the validation split.

``load(cfg) -> Data`` gives the training, validation (held out from the training set when
``val_fraction > 0``), test and probe (training examples with the evaluation transform, for the
flatness metrics and train-set evaluation) sets. Nothing is downloaded unless ``download=True``.

Layouts expected under ``--data``:

* ``cifar10`` / ``cifar100``: torchvision's extracted archive ``<data>/cifar-10-batches-py/`` (or
  ``cifar-100-python/``), or an ImageFolder tree ``<data>/train/<class>/*.png`` and
  ``<data>/test/<class>/*.png``. Images of another size than ``image_size`` (smaller, larger, not
  square) have their short side resized to it, then are cropped: at random in training, in the
  centre for evaluation; ImageNet's and the transfer sets' pipelines resize and crop likewise.
* ``imagenet``: ``<data>/train/<wnid>/*.JPEG`` and ``<data>/val/<wnid>/*.JPEG`` (validation images
  sorted into class folders); any ImageFolder tree of that shape works (the number of classes is read
  from the folders).
* ``fmnist``: Fashion-MNIST's four IDX files in ``<data>/`` (gzipped or not; `reproduce.data.idx`
  reads and checks them), 60,000 training and 10,000 test images of 28×28 grey pixels, held in memory
  (on the GPU with a GPU run) as one tensor of one channel.
* ``mnist1d`` (Greydanus 2020, generated offline by the ``mnist1d`` package: 4,000 training and 1,000
  test vectors of length 40) and ``digits`` (scikit-learn's 8×8 digits, a stratified 80/20 split) need
  no ``--data``.

Augmentations (``augment``): ``basic`` is random crop with 4-pixel padding and horizontal flip for CIFAR
(and for Fashion-MNIST, whole batches at once on their device: `reproduce.data.augment.CropFlip`),
random-resized crop and flip for ImageNet; ``cutout`` adds a ``cutout_size`` square of zeros (DeVries
and Taylor 2017); ``randaugment`` (Cubuk et al. 2020) and ``autoaugment`` (Cubuk et al. 2019, the
CIFAR-10 or ImageNet policy) are torchvision's, added to ``basic``.

Determinism: the order of epoch e is ``randperm`` under a generator seeded by (seed, e), and example k
of that epoch is augmented under its own seed (seed, e, k), whatever the worker that loads it. A run
resumed at any batch therefore sees exactly the batches an uninterrupted run sees.

The containers (``TensorData``, ``Examples``, ``Data``, the errors) are in
`reproduce.data.examples`, the batch order and the loaders in `reproduce.data.batches`, the image
folders on disk in `reproduce.data.folders`; this module re-exports their names, so
``from reproduce.data import sets`` reaches all of them.
"""

from __future__ import annotations

import functools
import os
import random
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

from reproduce.data.augment import CropFlip
from reproduce.data.batches import (
    FolderLoader,
    epoch_keys,
    epoch_order,
    eval_batches,
    generator,
    sample_seed,
    shard,
    shard_positions,
    stack,
    train_batches,
)
from reproduce.data.examples import Data, DataError, DataNotFound, Examples, TensorData, to_device
from reproduce.data.folders import image_folder, is_image_folder, read_image

__all__ = [
    "CHANNELS",
    "CropFlip",
    "Cutout",
    "Data",
    "DataError",
    "DataNotFound",
    "Examples",
    "FolderLoader",
    "TensorData",
    "epoch_keys",
    "epoch_order",
    "eval_batches",
    "flip_labels",
    "image_folder",
    "load",
    "read_image",
    "sample_seed",
    "shard",
    "shard_positions",
    "split_indices",
    "stack",
    "to_device",
    "train_batches",
]

MEAN_STD = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "fmnist": ((0.2860,), (0.3530,)),  # of the 60,000 training images' pixels in [0, 1]
}
# The fine-tuning sets of the paper's transfer table: ImageNet statistics (pretrained models).
TRANSFER = ("cars", "pets", "food101")
for _name in TRANSFER:
    MEAN_STD[_name] = MEAN_STD["imagenet"]
CHANNELS = {"fmnist": 1}  # the image sets of other than 3 channels
NATIVE = {  # (input side or length, classes) of each data set
    "mnist1d": (40, 10),
    "digits": (64, 10),
    "fmnist": (28, 10),
    "cifar10": (32, 10),
    "cifar100": (32, 100),
    "imagenet": (224, 1000),
    "cars": (224, 196),
    "pets": (224, 37),
    "food101": (224, 101),
}


class Cutout:
    """Zero a ``size``×``size`` square at a uniformly random centre (clipped at the border) of a CHW tensor.

    References:
        DeVries and Taylor, "Improved Regularization of Convolutional Neural Networks with Cutout",
        2017, https://arxiv.org/abs/1708.04552.
    """

    def __init__(self, size: int):
        self.size = size

    def __call__(self, img: Tensor) -> Tensor:
        h, w = img.shape[-2:]
        cy, cx = int(torch.randint(h, ())), int(torch.randint(w, ()))
        y0, y1 = max(cy - self.size // 2, 0), min(cy + self.size - self.size // 2, h)
        x0, x1 = max(cx - self.size // 2, 0), min(cx + self.size - self.size // 2, w)
        out = img.clone()
        out[..., y0:y1, x0:x1] = 0
        return out

    def __repr__(self) -> str:
        return f"Cutout(size={self.size})"


def flip_labels(labels: Tensor, fraction: float, num_classes: int, gen: torch.Generator) -> Tensor:
    """Symmetric label noise: round(fraction·n) labels, chosen at random, each replaced by a uniformly
    drawn *other* class (Appendix C.2; Jiang et al. 2020). Returns a new tensor."""
    n = len(labels)
    m = round(fraction * n)
    which = torch.randperm(n, generator=gen)[:m]
    shift = torch.randint(1, num_classes, (m,), generator=gen)
    out = labels.clone()
    out[which] = (labels[which] + shift) % num_classes
    return out


def split_indices(n: int, fraction: float, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """A random split of range(n) into (train, held-out) with round(fraction·n) held out; both sorted."""
    perm = torch.randperm(n, generator=gen)
    k = round(fraction * n)
    return perm[k:].sort().values, perm[:k].sort().values


# ---------------------------------------------------------------- data sets


@functools.lru_cache(maxsize=1)
def _mnist1d() -> tuple[TensorData, TensorData]:
    # make_dataset seeds Python's and NumPy's global RNGs; leave them as they were.
    import numpy as np
    from mnist1d.data import get_dataset_args, make_dataset

    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        d = make_dataset(get_dataset_args())
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
    f32 = lambda a: torch.as_tensor(a, dtype=torch.float32)  # noqa: E731
    i64 = lambda a: torch.as_tensor(a, dtype=torch.int64)  # noqa: E731
    return TensorData(f32(d["x"]), i64(d["y"])), TensorData(f32(d["x_test"]), i64(d["y_test"]))


@functools.lru_cache(maxsize=1)
def _digits() -> tuple[TensorData, TensorData]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    mean, std = xtr.mean(), xtr.std()
    f32 = lambda a: torch.as_tensor((a - mean) / std, dtype=torch.float32)  # noqa: E731
    i64 = lambda a: torch.as_tensor(a, dtype=torch.int64)  # noqa: E731
    return TensorData(f32(xtr), i64(ytr)), TensorData(f32(xte), i64(yte))


def _fmnist(root: str) -> tuple[TensorData, TensorData]:
    """Fashion-MNIST from the IDX files in ``root``, normalised, ``(n, 1, 28, 28)`` float32."""
    from reproduce.data.idx import read_fashion_mnist

    if not root:
        raise DataNotFound(
            "fmnist needs --data=FOLDER holding Fashion-MNIST's four IDX files "
            "(bash reproduce/data/fashion_mnist.sh FOLDER fetches them)"
        )
    splits = read_fashion_mnist(root)
    (mean,), (std,) = MEAN_STD["fmnist"]

    def tensors(split: str) -> TensorData:
        images, labels = splits[split]
        return TensorData(((images.float() / 255 - mean) / std)[:, None], labels)

    return tensors("train"), tensors("t10k")


def _cifar(root: str, name: str, download: bool):
    import torchvision

    label = {"cifar10": "CIFAR-10", "cifar100": "CIFAR-100"}[name]
    archive = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}[name]
    cls = {"cifar10": torchvision.datasets.CIFAR10, "cifar100": torchvision.datasets.CIFAR100}[name]
    layout = (
        f"Expected one of these layouts:\n"
        f"  {root or '<data>'}/{archive}/   (the extracted 'python version' archive)\n"
        f"  {root or '<data>'}/train/<class>/<image>.png and {root or '<data>'}/test/<class>/<image>.png   (ImageFolder)\n"
        f"or pass --download to let torchvision fetch {label} into --data."
    )
    if not root:
        raise DataNotFound(f"{label} needs --data=FOLDER. {layout}")
    path = Path(root).expanduser()
    if download or (path / archive).is_dir():
        try:
            return cls(str(path), train=True, download=download), cls(str(path), train=False)
        except RuntimeError as e:  # torchvision: "Dataset not found or corrupted"
            raise DataNotFound(
                f"{label} at {path / archive} is incomplete ({e}). {layout}"
            ) from None
    if is_image_folder(path / "train") and is_image_folder(path / "test"):
        return _on_train_classes(image_folder(path / "train"), image_folder(path / "test"))
    raise DataNotFound(f"{label} not found at {str(path.resolve())!r}. {layout}")


def _imagenet(root: str):
    layout = (
        "Expected the ImageFolder layout\n"
        "  <data>/train/<wnid>/<image>.JPEG   (one folder per class)\n"
        "  <data>/val/<wnid>/<image>.JPEG     (validation images sorted into the same class folders)\n"
        "ImageNet is never downloaded: get it from https://image-net.org and point --data at it."
    )
    if not root:
        raise DataNotFound(f"imagenet needs --data=FOLDER. {layout}")
    path = Path(root).expanduser()
    for split in ("train", "val"):
        if not is_image_folder(path / split):
            raise DataNotFound(
                f"ImageNet not found: {str((path / split).resolve())!r} is missing or has no class folders. {layout}"
            )
    return _on_train_classes(image_folder(path / "train"), image_folder(path / "val"))


def _on_train_classes(train, held_out):
    """``(train, held_out)`` with ``held_out``'s labels in the training split's numbering.

    ``ImageFolder`` numbers each folder's classes on its own, so a test split that lacks a class
    would shift every label after it; its samples are renumbered by class name instead. A class that
    the training split does not have cannot be scored, and is refused.
    """
    extra = sorted(set(held_out.classes) - set(train.classes))
    if extra:
        raise DataError(
            f"{held_out.root} has classes that {train.root} lacks ({', '.join(extra[:5])}"
            f"{', ...' if len(extra) > 5 else ''}): every evaluated class must be trained"
        )
    to_train = [train.class_to_idx[c] for c in held_out.classes]
    held_out.samples = [(path, to_train[i]) for path, i in held_out.samples]
    held_out.imgs = held_out.samples
    held_out.targets = [i for _, i in held_out.samples]
    held_out.classes, held_out.class_to_idx = train.classes, train.class_to_idx
    return train, held_out


def _synthetic(name: str, size: int, image_size: int, num_classes: int, seed: int):
    gen = generator(seed, 3)
    channels = CHANNELS.get(name, 3)
    shape = (image_size,) if name in ("mnist1d", "digits") else (channels, image_size, image_size)

    def make(n: int) -> TensorData:
        return TensorData(
            torch.randn(n, *shape, generator=gen), torch.randint(num_classes, (n,), generator=gen)
        )

    return make(size), make(max(size // 4, 1))


def _transforms(name: str, augment: str, size: int, cutout: int):
    import torchvision.transforms as T

    mean, std = MEAN_STD[name]
    tail = [T.ToTensor(), T.Normalize(mean, std)]
    if name in TRANSFER:  # no augmentation in the paper's transfer runs: the centre square
        evaluate = T.Compose([T.Resize(size), T.CenterCrop(size), *tail])
        crop = [T.RandomResizedCrop(size), T.RandomHorizontalFlip()]
        policy = T.AutoAugmentPolicy.IMAGENET
    elif name == "imagenet":
        evaluate = T.Compose([T.Resize(round(size / 0.875)), T.CenterCrop(size), *tail])
        crop = [T.RandomResizedCrop(size), T.RandomHorizontalFlip()]
        policy = T.AutoAugmentPolicy.IMAGENET
    else:
        # An image of another size (a folder of odd images, smaller than the crop or not square)
        # has its short side resized to `size` first, as ImageNet pipelines do, never padded with
        # black borders; a size×size image is left as it is (Resize and CenterCrop return it).
        evaluate = T.Compose([T.Resize(size), T.CenterCrop(size), *tail])
        crop = [T.Resize(size), T.RandomCrop(size, padding=4), T.RandomHorizontalFlip()]
        policy = T.AutoAugmentPolicy.CIFAR10
    extra = {"randaugment": [T.RandAugment()], "autoaugment": [T.AutoAugment(policy)]}
    if augment == "none":
        return evaluate, evaluate
    train = [*crop, *extra.get(augment, []), *tail]
    if augment == "cutout":
        train.append(Cutout(cutout))
    return T.Compose(train), evaluate


def _targets(ds: Dataset) -> Tensor:
    """The labels of a torchvision data set (``targets``, or the private lists of the fine-grained
    sets: StanfordCars' ``_samples``, OxfordIIITPet's and Food101's ``_labels``)."""
    if hasattr(ds, "targets"):
        labels = ds.targets
    elif hasattr(ds, "_samples"):
        labels = [c for _, c in ds._samples]
    else:
        labels = ds._labels
    return torch.as_tensor(labels, dtype=torch.int64)


def _transfer(root: str, name: str, download: bool):
    """Stanford Cars, Oxford-IIIT Pets or Food-101 through torchvision, from ``root``."""
    import torchvision.datasets as tvd

    label = {"cars": "Stanford Cars", "pets": "Oxford-IIIT Pets", "food101": "Food-101"}[name]
    if not root:
        raise DataNotFound(
            f"{label} needs --data=FOLDER (torchvision's layout; --download fetches it)"
        )
    path = str(Path(root).expanduser())
    try:
        if name == "cars":
            return tvd.StanfordCars(path, "train", download=download), tvd.StanfordCars(
                path, "test"
            )
        if name == "pets":
            make = lambda split, dl=False: tvd.OxfordIIITPet(path, split, download=dl)  # noqa: E731
            return make("trainval", download), make("test")
        return tvd.Food101(path, "train", download=download), tvd.Food101(path, "test")
    except RuntimeError as e:  # torchvision: "Dataset not found or corrupted"
        raise DataNotFound(
            f"{label} not found or incomplete under {path!r} ({e}). Put torchvision's layout there, "
            "or pass --download to let torchvision fetch it."
        ) from None


def _memory() -> int:
    """This machine's memory in bytes (0: unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _check_fits(cfg: Any, size: int, vector: bool) -> None:
    """A DataError unless the synthetic data set, or one batch of images, takes at most half this
    machine's memory (as float32), checked before anything is allocated."""
    per_example = size if vector else CHANNELS.get(cfg.dataset, 3) * size * size
    examples = (
        cfg.synthetic_size + max(cfg.synthetic_size // 4, 1) if cfg.synthetic else cfg.batch_size
    )
    need, have = 4 * per_example * examples, _memory()
    if have and need > have // 2:
        what = (
            f"--synthetic_size={cfg.synthetic_size} examples"
            if cfg.synthetic
            else f"a batch of {cfg.batch_size}"
        )
        raise DataError(
            f"{what} at --image_size={size} take {need / 2**30:.3g} GiB, more than half this "
            f"machine's {have / 2**30:.3g} GiB; lower --image_size"
            + (" or --synthetic_size" if cfg.synthetic else " or --batch_size")
        )


def load(cfg: Any) -> Data:
    """The data of a run: ``cfg`` is a `reproduce.config.Config` (fields dataset, data, download,
    synthetic, synthetic_size, num_classes, image_size, augment, cutout_size, label_noise,
    val_fraction, seed).

    Raises:
        DataNotFound: the data set is not at ``cfg.data``; the message gives the expected layout.
        DataError: ``num_classes`` or ``image_size`` contradict the data set.
    """
    name = cfg.dataset
    native_size, native_classes = NATIVE[name]
    size = cfg.image_size or native_size
    vector = name in ("mnist1d", "digits")
    if vector and size != native_size and not cfg.synthetic:
        raise DataError(f"image_size of {name} is its input length {native_size}; got {size}")
    _check_fits(cfg, size, vector)
    train_tf = eval_tf = None
    if cfg.synthetic:
        classes = cfg.num_classes or native_classes
        train_base, test_base = _synthetic(name, cfg.synthetic_size, size, classes, cfg.seed)
    elif name == "mnist1d":
        train_base, test_base = _mnist1d()
    elif name == "digits":
        train_base, test_base = _digits()
    elif name == "fmnist":
        if size != native_size:
            raise DataError(f"image_size of fmnist is its images' side {native_size}; got {size}")
        if cfg.augment not in ("basic", "none"):
            raise DataError(
                f"--augment={cfg.augment}: fmnist takes basic (crop and flip on the device) or none"
            )
        train_base, test_base = _fmnist(cfg.data)
        (mean,), (std,) = MEAN_STD["fmnist"]
        train_tf = CropFlip(pad=4, fill=-mean / std) if cfg.augment == "basic" else None
    else:
        if name == "imagenet":
            train_base, test_base = _imagenet(cfg.data)
        elif name in TRANSFER:
            train_base, test_base = _transfer(cfg.data, name, cfg.download)
        else:
            train_base, test_base = _cifar(cfg.data, name, cfg.download)
        train_tf, eval_tf = _transforms(name, cfg.augment, size, cfg.cutout_size)
    if not cfg.synthetic:
        classes = len(train_base.classes) if hasattr(train_base, "classes") else native_classes
        if classes < 2:  # as --num_classes=1 is: every prediction would be right
            raise DataError(
                f"{name} at {cfg.data!r} has {classes} class folder(s) "
                f"({', '.join(getattr(train_base, 'classes', []))}); a classifier needs at least 2"
            )
        if cfg.num_classes and cfg.num_classes != classes:
            raise DataError(
                f"num_classes is {cfg.num_classes} but {name} at {cfg.data!r} has {classes} classes"
            )
    labels = _targets(train_base)
    if cfg.label_noise > 0:
        labels = flip_labels(labels, cfg.label_noise, classes, generator(cfg.seed, 4))
    train_idx, val_idx = split_indices(len(labels), cfg.val_fraction, generator(cfg.seed, 5))
    test_idx = torch.arange(len(test_base))

    def part(base, idx, lab, tf) -> Examples:
        return Examples(base, idx, lab[idx], tf)

    return Data(
        name=name,
        train=part(train_base, train_idx, labels, train_tf),
        val=part(train_base, val_idx, labels, eval_tf) if len(val_idx) else None,
        test=part(test_base, test_idx, _targets(test_base), eval_tf),
        probe=part(train_base, train_idx, labels, eval_tf),
        num_classes=classes,
        image_size=size,
        channels=CHANNELS.get(name, 3),
    )
