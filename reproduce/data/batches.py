"""The resumable batch order: seeds mixed from (seed, epoch, position), each epoch's permutation,
each rank's share of a global batch, and the batches themselves, gathered in memory or decoded by
one persistent DataLoader (``FolderLoader``).

The order of epoch e is ``randperm`` under a generator seeded by (seed, e), and example k of that
epoch is augmented under its own seed (seed, e, k), whatever the worker that loads it: a run resumed
at any batch sees exactly the batches an uninterrupted run sees.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from reproduce.data.examples import Examples

__all__ = [
    "FolderLoader",
    "batch_generator",
    "epoch_keys",
    "epoch_order",
    "eval_batches",
    "generator",
    "sample_seed",
    "shard",
    "shard_positions",
    "stack",
    "train_batches",
]


def _mix(*parts: int) -> int:
    """A 63-bit seed from several integers (splitmix-style), so nearby inputs give unrelated seeds."""
    h = 0x9E3779B97F4A7C15
    for p in parts:
        h = (h ^ (int(p) + 0x9E3779B97F4A7C15 + (h << 6) + (h >> 2))) & 0xFFFFFFFFFFFFFFFF
        h = (h * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 31
    return h & 0x7FFFFFFFFFFFFFFF


def generator(*parts: int) -> torch.Generator:
    """A CPU generator seeded by the given integers."""
    return torch.Generator().manual_seed(_mix(*parts))


def epoch_order(n: int, seed: int, epoch: int) -> Tensor:
    """The order of the n training examples in ``epoch``: a permutation that depends on (seed, epoch) only."""
    return torch.randperm(n, generator=generator(seed, epoch, 1))


def batch_generator(seed: int, epoch: int, batch: int) -> torch.Generator:
    """The generator of global batch ``batch``'s augmentation in ``epoch`` (in-memory data
    augmented by batches, `reproduce.data.augment.CropFlip`)."""
    return generator(seed, epoch, batch, 3)


def sample_seed(seed: int, epoch: int, position: int) -> int:
    """The augmentation seed of the example at ``position`` of ``epoch``."""
    return _mix(seed, epoch, position, 2)


def stack(ds: Examples, indices: Tensor) -> tuple[Tensor, Tensor]:
    """The examples ``ds[j]``, j in ``indices``, as one batch ``(inputs, labels)``."""
    fast = ds.tensors()
    if fast is not None:
        return fast[0][indices], fast[1][indices]
    xs, ys = zip(*(ds[int(j)] for j in indices), strict=True)
    return torch.stack(xs), torch.as_tensor(ys)


def shard_positions(
    batch: int, batch_size: int, rank: int = 0, world: int = 1, device=None
) -> Tensor:
    """The positions in the epoch's order of this rank's part of global batch ``batch``, made on
    ``device`` (no copy from the host, which would wait for the device).

    Global batch b is positions b·B .. (b+1)·B − 1 of the epoch's order (B = ``batch_size``); rank r of
    W takes the r-th of its W equal consecutive parts. The ranks' parts, concatenated in rank order,
    are the batch one process would take."""
    per = batch_size // world
    start = batch * batch_size + rank * per
    return torch.arange(start, start + per, device=device)


def shard(ds: Examples, rank: int, world: int) -> Examples:
    """Rank ``rank``'s share of ``ds`` for evaluation: every ``world``-th example from ``rank`` on
    (the shares of all ranks cover ``ds`` once)."""
    if world == 1:
        return ds
    return Examples(ds.base, ds.indices[rank::world], ds.labels[rank::world], ds.transform)


class _Keys(torch.utils.data.Sampler):
    """The (index, augmentation seed) keys of one epoch's part, replaced before each epoch, so that one
    DataLoader (and its persistent workers) serves every epoch."""

    def __init__(self):
        self.keys: list[tuple[int, int]] = []

    def __iter__(self):
        return iter(self.keys)

    def __len__(self) -> int:
        return len(self.keys)


class FolderLoader:
    """Batches of a folder data set (decoded and augmented on the CPU) through one DataLoader whose
    worker processes persist from epoch to epoch and prefetch ``prefetch`` batches each. ``ds`` may be
    any data set indexed by (index, seed) keys, batched by ``collate_fn``."""

    name = "folder"

    def __init__(
        self,
        ds: Dataset,
        batch_size: int,
        workers: int = 0,
        pin_memory=False,
        prefetch=4,
        *,
        collate_fn=None,
        drop_last: bool = True,
    ):
        self.ds, self.batch_size, self.sampler = ds, batch_size, _Keys()
        extra = dict(persistent_workers=True, prefetch_factor=prefetch) if workers else {}
        self.loader = DataLoader(
            ds,
            batch_size=batch_size,
            sampler=self.sampler,
            num_workers=workers,
            pin_memory=pin_memory,
            drop_last=drop_last,
            collate_fn=collate_fn,
            # worker seeds from a generator of their own: the global RNG stays untouched
            generator=torch.Generator().manual_seed(0),
            **extra,
        )

    def batches(self, keys: list[tuple[int, int]]) -> Iterator[tuple[Tensor, Tensor]]:
        self.sampler.keys = keys
        yield from self.loader


def epoch_keys(
    order: Tensor, start: int, batch_size: int, *, seed: int, epoch: int, rank=0, world=1
) -> list[tuple[int, int]]:
    """This rank's (example index, augmentation seed) keys for batches ``start, start+1, ...`` of an
    epoch visiting the examples in ``order`` (the last partial global batch is dropped)."""
    steps = len(order) // batch_size
    keys = []
    for b in range(start, steps):
        for k in shard_positions(b, batch_size, rank, world).tolist():
            keys.append((int(order[k]), sample_seed(seed, epoch, k)))
    return keys


def train_batches(
    ds: Examples,
    order: Tensor,
    start: int,
    batch_size: int,
    *,
    seed: int,
    epoch: int,
    workers: int = 0,
    pin_memory: bool = False,
    rank: int = 0,
    world: int = 1,
    loader=None,
) -> Iterator[tuple[Tensor, Tensor]]:
    """This rank's batches ``start, start+1, ...`` of an epoch visiting ``ds`` in ``order`` (the last
    partial global batch is dropped): ``batch_size // world`` examples each, the rank's part of the
    global batch (`shard_positions`), each example augmented under the seed of its position (an
    in-memory set with a `batch_transform`: each batch on its device, under the generator of
    `batch_generator`).

    ``loader`` (a `FolderLoader` or a GPU loader of ``ds``) serves folder data sets; without
    one a fresh DataLoader is made."""
    steps = len(order) // batch_size
    fast = ds.tensors()
    if fast is not None:
        x, y = fast
        augment = ds.batch_transform
        for b in range(start, steps):
            idx = order[shard_positions(b, batch_size, rank, world, order.device)]
            if augment is None:
                yield x[idx], y[idx]
                continue
            # the global batch's draws under its own seed, this rank's share of them
            params = augment.draw(batch_size, batch_generator(seed, epoch, b))
            per = batch_size // world
            yield augment(x[idx], params[rank * per : (rank + 1) * per]), y[idx]
        return
    keys = epoch_keys(order, start, batch_size, seed=seed, epoch=epoch, rank=rank, world=world)
    if loader is None:
        loader = FolderLoader(ds, batch_size // world, workers, pin_memory)
    yield from loader.batches(keys)


def eval_batches(
    ds: Examples, batch_size: int, workers: int = 0, pin_memory: bool = False
) -> Iterator[tuple[Tensor, Tensor]]:
    """All of ``ds`` in order, in batches of ``batch_size``."""
    fast = ds.tensors()
    if fast is not None:
        x, y = fast
        for i in range(0, len(y), batch_size):
            yield x[i : i + batch_size], y[i : i + batch_size]
        return
    yield from DataLoader(ds, batch_size=batch_size, num_workers=workers, pin_memory=pin_memory)
