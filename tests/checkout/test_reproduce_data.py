"""reproduce/data/sets.py and folders.py: data sets, label noise, splits, resumable order, augmentation, clear errors."""

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from reproduce.config import resolve
from reproduce.data import sets as D


def make_image_folder(
    root: Path, splits=("train", "val"), classes=("ant", "bee"), per_class=4, size=40
):
    """A tiny ImageFolder tree of random PNGs: root/<split>/<class>/<i>.png."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in splits:
        for c in classes:
            (root / split / c).mkdir(parents=True)
            for i in range(per_class):
                pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / c / f"{i}.png")
    return root


def test_mnist1d_is_the_standard_split_and_leaves_global_rngs_alone():
    py, npy = random.getstate(), np.random.get_state()
    d = D.load(resolve([]))
    assert (len(d.train), len(d.test), d.val) == (4000, 1000, None)
    x, y = d.train.tensors()
    assert x.shape == (4000, 40) and x.dtype == torch.float32
    counts = torch.bincount(y) + torch.bincount(d.test.labels)
    assert counts.tolist() == [500] * 10  # 5,000 vectors, balanced over the ten digits
    assert random.getstate() == py
    assert all(np.array_equal(a, b) for a, b in zip(np.random.get_state(), npy, strict=True))


def test_digits_split_and_validation_fraction():
    d = D.load(resolve(["--preset=digits", "--val-fraction=0.25"]))
    n = 1797 - 360
    assert (len(d.test), len(d.train) + len(d.val)) == (360, n)
    assert len(d.val) == round(0.25 * n)
    assert not set(d.train.indices.tolist()) & set(d.val.indices.tolist())


def test_flip_labels_changes_exactly_the_fraction_to_other_classes():
    labels = torch.arange(1000) % 10
    noisy = D.flip_labels(labels, 0.4, 10, torch.Generator().manual_seed(0))
    changed = noisy != labels
    assert int(changed.sum()) == 400
    assert noisy.min() >= 0 and noisy.max() < 10
    assert torch.equal(labels, torch.arange(1000) % 10)  # input untouched
    # the new classes are spread over the nine others
    shifts = ((noisy - labels) % 10)[changed]
    assert set(shifts.tolist()) == set(range(1, 10))


def test_label_noise_reaches_the_training_labels_only():
    clean = D.load(resolve(["--preset=digits"]))
    noisy = D.load(resolve(["--preset=digits", "--label_noise=0.2"]))
    assert int((clean.train.labels != noisy.train.labels).sum()) == round(0.2 * len(clean.train))
    assert torch.equal(clean.test.labels, noisy.test.labels)


def test_split_indices_partition():
    tr, va = D.split_indices(10, 0.3, torch.Generator().manual_seed(1))
    assert len(va) == 3 and sorted(tr.tolist() + va.tolist()) == list(range(10))


def test_epoch_order_depends_on_seed_and_epoch_only():
    a = D.epoch_order(100, seed=0, epoch=3)
    torch.manual_seed(999)  # the global RNG plays no part
    assert torch.equal(a, D.epoch_order(100, seed=0, epoch=3))
    assert not torch.equal(a, D.epoch_order(100, seed=0, epoch=4))
    assert not torch.equal(a, D.epoch_order(100, seed=1, epoch=3))
    assert sorted(a.tolist()) == list(range(100))


def test_train_batches_resume_at_any_batch():
    x, y = torch.arange(20.0).unsqueeze(1), torch.arange(20)
    ds = D.Examples(D.TensorData(x, y), torch.arange(20), y)
    order = D.epoch_order(20, 0, 0)
    full = list(D.train_batches(ds, order, 0, 6, seed=0, epoch=0))
    assert len(full) == 3  # the partial batch is dropped
    later = list(D.train_batches(ds, order, 2, 6, seed=0, epoch=0))
    assert torch.equal(later[0][0], full[2][0])


def test_augmentation_depends_on_the_example_seed_not_on_the_loading_order(tmp_path):
    make_image_folder(tmp_path, splits=("train", "test"))
    cfg = resolve(["--preset=hp1.cifar10.resnet18", f"--data={tmp_path}", "--augment=autoaugment"])
    d = D.load(cfg)
    assert d.num_classes == 2 and len(d.train) == 8
    first = d.train[(3, 1234)][0]
    d.train[(5, 1)]
    torch.rand(10)
    assert torch.equal(d.train[(3, 1234)][0], first)
    assert not torch.equal(d.train[(3, 4321)][0], first)
    assert first.shape == (3, 32, 32)
    # evaluation data is not augmented
    assert torch.equal(d.test[0][0], d.test[0][0])


def test_cutout_zeroes_one_square():
    torch.manual_seed(0)
    img = torch.ones(3, 32, 32)
    out = D.Cutout(8)(img)
    zeros = (out == 0).all(0)
    assert 16 <= int(zeros.sum()) <= 64  # a full 8×8 square, or a border-clipped one
    rows, cols = zeros.any(1).nonzero(), zeros.any(0).nonzero()
    assert int(zeros.sum()) == len(rows) * len(cols)  # a rectangle
    assert torch.equal(img, torch.ones(3, 32, 32))


@pytest.mark.parametrize(
    ("preset", "layout"),
    [
        ("hp1.cifar10.resnet18", ["cifar-10-batches-py", "train/<class>", "--download"]),
        ("hp1.cifar100.resnet18", ["cifar-100-python", "test/<class>"]),
        ("hp2.imagenet.resnet50", ["train/<wnid>", "val/<wnid>", "never downloaded"]),
    ],
)
def test_missing_data_names_the_path_and_the_layout(tmp_path, preset, layout):
    missing = tmp_path / "no_such_folder"
    with pytest.raises(D.DataNotFound) as err:
        D.load(resolve([f"--preset={preset}", f"--data={missing}"]))
    assert str(missing) in str(err.value)
    for part in layout:
        assert part in str(err.value)


def test_data_must_be_given_for_folder_datasets():
    with pytest.raises(D.DataNotFound, match="needs --data"):
        D.load(resolve(["--preset=hp2.imagenet.resnet50"]))


def test_imagenet_folder_and_num_classes_check(tmp_path):
    make_image_folder(tmp_path)
    d = D.load(resolve(["--preset=hp2.imagenet.resnet50", f"--data={tmp_path}", "--image_size=32"]))
    assert (d.num_classes, len(d.train), len(d.test)) == (2, 8, 8)
    assert d.train[(0, 7)][0].shape == (3, 32, 32)
    with pytest.raises(D.DataError, match="num_classes is 1000"):
        D.load(
            resolve(["--preset=hp2.imagenet.resnet50", f"--data={tmp_path}", "--num_classes=1000"])
        )


def test_synthetic_data_has_the_dataset_shape():
    d = D.load(resolve(["--preset=hp2.imagenet.resnet50", "--synthetic", "--synthetic_size=8"]))
    x, _ = d.train.tensors()
    assert x.shape == (8, 3, 224, 224) and d.num_classes == 1000 and len(d.test) == 2


def test_held_out_labels_follow_the_training_classes(tmp_path):
    """ImageFolder numbers each split's classes on its own: a validation split without "bee" would
    call "cat" class 1 ("bee" in training). Labels follow the training split's names instead, and a
    class that training lacks is refused in one line."""
    make_image_folder(tmp_path, splits=("train",), classes=("ant", "bee", "cat"), per_class=2)
    make_image_folder(tmp_path, splits=("val",), classes=("ant", "cat"), per_class=2)
    args = ["--preset=hp2.imagenet.resnet50", f"--data={tmp_path}", "--image_size=32"]
    d = D.load(resolve([*args, "--num_classes=3"]))
    labels = sorted(int(d.test[(i, 0)][1]) for i in range(len(d.test)))
    assert labels == [0, 0, 2, 2]
    make_image_folder(tmp_path / "more", splits=("train",), classes=("ant",), per_class=2)
    make_image_folder(tmp_path / "more", splits=("val",), classes=("ant", "dog"), per_class=2)
    with pytest.raises(D.DataError, match=r"classes that .* lacks \(dog\)"):
        D.load(resolve(["--preset=hp2.imagenet.resnet50", f"--data={tmp_path / 'more'}"]))


def test_images_smaller_than_the_crop_or_not_square_are_resized_then_cropped(tmp_path):
    """A CIFAR ImageFolder of 32×32, 20×20 and 40×24 images: every example, training (random crop
    with padding) and evaluation (centre), comes out 3×32×32, the short side resized first; a
    32×32 image is left as the plain pipeline leaves it."""
    from PIL import Image

    rng = np.random.default_rng(0)
    sizes = [(32, 32), (20, 20), (40, 24)]
    for split in ("train", "test"):
        for c in ("ant", "bee"):
            (tmp_path / split / c).mkdir(parents=True)
            for i, (h, w) in enumerate(sizes):
                pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(tmp_path / split / c / f"{i}.png")
    d = D.load(resolve(["--preset=hp1.cifar10.resnet18", f"--data={tmp_path}"]))
    for ds in (d.train, d.test, d.probe):
        assert all(ds[(j, 7)][0].shape == (3, 32, 32) for j in range(len(ds)))
    x, _ = next(iter(D.eval_batches(d.test, 6)))
    assert x.shape == (6, 3, 32, 32)
    import torchvision.transforms.functional as TF

    first = d.test.base.samples[0][0]
    plain = TF.normalize(TF.to_tensor(Image.open(first).convert("RGB")), *D.MEAN_STD["cifar10"])
    assert torch.equal(d.test[0][0], plain)


def test_in_memory_batches_take_their_positions_on_the_datas_device(monkeypatch):
    """Each batch of data held on a device is gathered there from positions made there: no index
    crosses from the host (on CUDA such a copy waits for the device, so the host could not queue
    the next step while one runs)."""
    from reproduce.data import batches

    assert batches.shard_positions(3, 8, 1, 2, device="meta").device.type == "meta"
    assert batches.shard_positions(3, 8, 1, 2).tolist() == [28, 29, 30, 31]
    made = []
    real = batches.shard_positions

    def spy(*args):
        made.append(args[4] if len(args) > 4 else None)
        return real(*args)

    monkeypatch.setattr(batches, "shard_positions", spy)
    data = D.load(resolve(["--preset=digits"]))
    order = D.epoch_order(len(data.train), 0, 0)
    got = list(D.train_batches(data.train, order, 0, 32, seed=0, epoch=0, rank=1, world=2))
    assert len(got) == len(made) == len(order) // 32 and set(made) == {order.device}
    x, _ = data.train.tensors()
    assert torch.equal(got[2][0], x[order[2 * 32 + 16 : 3 * 32]])
