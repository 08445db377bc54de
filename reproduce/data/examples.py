"""What a run's data is made of: in-memory tensors (``TensorData``), a view of a base set with its
own labels and transform (``Examples``), the training, validation, test and probe sets of a run
(``Data``), the errors that say why data cannot be used, and moving in-memory sets to a device."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils.data import Dataset

__all__ = ["Data", "DataError", "DataNotFound", "Examples", "TensorData", "to_device"]


class DataError(ValueError):
    """The data cannot be used as configured; the message says why."""


class DataNotFound(DataError, FileNotFoundError):
    """The data set is not where ``--data`` points; the message names the path and the expected layout."""


class TensorData(Dataset):
    """An in-memory data set of inputs ``x`` and integer labels ``y``."""

    def __init__(self, x: Tensor, y: Tensor):
        if len(x) != len(y):
            raise ValueError(f"x and y must have the same length; got {len(x)} and {len(y)}")
        self.x, self.y = x, y

    @property
    def targets(self) -> Tensor:
        """The labels, as torchvision's data sets name them."""
        return self.y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


class Examples(Dataset):
    """``base[indices[j]]`` with label ``labels[j]``, passed through ``transform``.

    An index may be ``(j, seed)``: the transform then draws its randomness from ``torch.manual_seed(seed)``
    inside a forked RNG, so the augmentation of an example depends only on that seed.

    A transform with ``batched = True`` (`reproduce.data.augment.CropFlip`) augments whole batches
    of an in-memory base on their device instead: `tensors` then hands out the base's tensors, and
    `reproduce.data.batches.train_batches` applies it to each batch under that batch's seed.
    """

    def __init__(self, base: Dataset, indices: Tensor, labels: Tensor, transform=None):
        self.base, self.indices, self.labels, self.transform = base, indices, labels, transform
        # all of the base in order: tensors() can hand out the base's own tensors, no copy
        self._whole = len(indices) == len(base) and bool(
            torch.equal(indices.cpu(), torch.arange(len(base)))
        )

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def batch_transform(self):
        """The transform when it augments whole batches (``batched = True``), else None."""
        return self.transform if getattr(self.transform, "batched", False) else None

    def __getitem__(self, key):
        j, seed = key if isinstance(key, tuple) else (key, None)
        x, _ = self.base[int(self.indices[j])]
        if self.batch_transform is not None:
            draw = (
                int(torch.randint(2**62, ())) if seed is None else seed
            )  # as torchvision's: global RNG
            gen = torch.Generator().manual_seed(draw)
            x = self.transform(x[None], self.transform.draw(1, gen))[0]
        elif self.transform is not None:
            if seed is None:
                x = self.transform(x)
            else:
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(seed)
                    x = self.transform(x)
        return x, self.labels[j]

    def tensors(self) -> tuple[Tensor, Tensor] | None:
        """``(inputs, labels)`` as two tensors when the base is in memory and nothing is transformed
        example by example (a `batch_transform` is the caller's to apply)."""
        if isinstance(self.base, TensorData) and (
            self.transform is None or self.batch_transform is not None
        ):
            return (self.base.x if self._whole else self.base.x[self.indices]), self.labels
        return None


@dataclass(frozen=True)
class Data:
    """What a run trains and evaluates on."""

    name: str  # data set name
    train: Examples  # training examples (noisy labels if label_noise > 0), augmented
    val: Examples | None  # held-out part of the training set, evaluation transform
    test: Examples  # the test set, evaluation transform
    probe: Examples  # the training examples with the evaluation transform
    num_classes: int
    image_size: int
    channels: int = 3  # of an image set's inputs (Fashion-MNIST: 1)


def to_device(data: Data, device: torch.device | str) -> Data:
    """``data`` with its in-memory parts (MNIST-1D, digits, Fashion-MNIST, synthetic) moved to
    ``device`` once, so that batches are gathered (and Fashion-MNIST's augmented) there; folder data
    sets are left to the DataLoader."""
    if torch.device(device).type == "cpu":
        return data

    moved: dict[int, TensorData] = {}  # one copy of a base shared by train, val and probe

    def move(ds: Examples | None) -> Examples | None:
        if ds is None or ds.tensors() is None:
            return ds
        if id(ds.base) not in moved:
            moved[id(ds.base)] = TensorData(ds.base.x.to(device), ds.base.y.to(device))
        base = moved[id(ds.base)]
        return Examples(base, ds.indices.to(device), ds.labels.to(device), ds.batch_transform)

    return dataclasses.replace(
        data,
        train=move(data.train),
        val=move(data.val),
        test=move(data.test),
        probe=move(data.probe),
    )
