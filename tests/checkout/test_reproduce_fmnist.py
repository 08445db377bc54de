"""Fashion-MNIST in reproduce/: the IDX reader and its refusals, the batch augmentation on the
device against a per-example reference, the batches it makes (resumable, the same under any number
of processes), the channels of the networks, the presets, and train.py on the real files where
they are present (``bash reproduce/data/fashion_mnist.sh data/fashion-mnist``)."""

from __future__ import annotations

import gzip
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from reproduce.config import PRESETS, resolve
from reproduce.data import sets as D
from reproduce.data.augment import CropFlip
from reproduce.data.idx import FILES, read_fashion_mnist, read_idx
from reproduce.models import build_model

ROOT = Path(__file__).resolve().parents[2]
REAL = Path(os.environ.get("FASHION_MNIST", ROOT / "data" / "fashion-mnist"))
HAS_REAL = all((REAL / f"{n}.gz").is_file() or (REAL / n).is_file() for n in FILES)


def idx_bytes(array: torch.Tensor) -> bytes:
    """An IDX file of unsigned bytes holding ``array``."""
    head = bytes([0, 0, 0x08, array.dim()]) + struct.pack(f">{array.dim()}I", *array.shape)
    return head + array.to(torch.uint8).numpy().tobytes()


def fake_set(folder: Path, gz: bool = True, **override) -> Path:
    """Fashion-MNIST's four files of the right shapes (random pixels), ``override`` replacing one."""
    gen = torch.Generator().manual_seed(0)
    files = {}
    for split, n in (("train", 60_000), ("t10k", 10_000)):
        files[f"{split}-images-idx3-ubyte"] = idx_bytes(
            torch.randint(256, (n, 28, 28), generator=gen)
        )
        files[f"{split}-labels-idx1-ubyte"] = idx_bytes(torch.randint(10, (n,), generator=gen))
    files.update(override)
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        if data is None:
            continue
        if gz:
            (folder / f"{name}.gz").write_bytes(gzip.compress(data, compresslevel=1))
        else:
            (folder / name).write_bytes(data)
    return folder


@pytest.fixture(scope="module")
def fake(tmp_path_factory) -> Path:
    return fake_set(tmp_path_factory.mktemp("fmnist"), gz=False)


def test_read_idx_round_trips(tmp_path):
    a = torch.randint(256, (3, 4, 5), dtype=torch.uint8)
    (tmp_path / "a").write_bytes(idx_bytes(a))
    (tmp_path / "a.gz").write_bytes(gzip.compress(idx_bytes(a)))
    assert torch.equal(read_idx(tmp_path / "a"), a)
    assert torch.equal(read_idx(tmp_path / "a.gz"), a)


@pytest.mark.parametrize(
    "data, says",
    [
        (idx_bytes(torch.zeros(2, 3))[:-1], "truncated"),
        (idx_bytes(torch.zeros(2, 3)) + b"x", "longer than its header says"),
        (idx_bytes(torch.zeros(2, 3))[:6], "ends inside its header"),
        (b"\x00\x00\x0d\x02" + bytes(8), "not an IDX file of unsigned bytes"),  # floats
        (b"PK\x03\x04", "not an IDX file"),
        (b"", "not an IDX file"),
    ],
)
def test_a_damaged_file_is_refused_naming_it(tmp_path, data, says):
    (tmp_path / "f").write_bytes(data)
    with pytest.raises(D.DataError, match=f"{tmp_path / 'f'}.*{says}"):
        read_idx(tmp_path / "f")


def test_a_truncated_gzip_is_refused_naming_it(tmp_path):
    (tmp_path / "f.gz").write_bytes(gzip.compress(idx_bytes(torch.zeros(50, 50)))[:-20])
    with pytest.raises(D.DataError, match=f"cannot read '{tmp_path / 'f.gz'}'"):
        read_idx(tmp_path / "f.gz")


def test_the_reader_gives_both_splits(fake):
    out = read_fashion_mnist(fake)
    assert out["train"][0].shape == (60_000, 28, 28) and out["train"][0].dtype == torch.uint8
    assert out["t10k"][1].shape == (10_000,) and out["t10k"][1].dtype == torch.int64


def test_missing_folder_and_file_are_named(tmp_path, fake):
    with pytest.raises(D.DataNotFound, match="is not a folder"):
        read_fashion_mnist(tmp_path / "nope")
    (tmp_path / "part").mkdir()
    for f in fake.iterdir():
        if "t10k-labels" not in f.name:
            (tmp_path / "part" / f.name).symlink_to(f)
    with pytest.raises(D.DataNotFound, match=r"t10k-labels-idx1-ubyte'.*is missing"):
        read_fashion_mnist(tmp_path / "part")


@pytest.mark.parametrize(
    "name, data, says",
    [
        ("train-labels-idx1-ubyte", idx_bytes(torch.zeros(10_000)), "has 60000 labels"),
        ("t10k-images-idx3-ubyte", idx_bytes(torch.zeros(10_000, 32, 32)), "images of 28×28"),
        ("train-labels-idx1-ubyte", idx_bytes(torch.full((60_000,), 10)), "a label 10"),
    ],
)
def test_a_file_that_does_not_fit_its_split_is_refused(tmp_path, name, data, says):
    folder = fake_set(tmp_path / "d", gz=True, **{name: data})
    with pytest.raises(D.DataError, match=f"{name}.gz'.*{says}"):
        read_fashion_mnist(folder)


@pytest.mark.parametrize("bad", ["missing", "truncated", "empty"])
def test_train_py_says_one_line_and_exits_2(tmp_path, fake, bad):
    folder = tmp_path / "d"
    folder.mkdir()
    for f in fake.iterdir():
        (folder / f.name).symlink_to(f)
    target = folder / "train-images-idx3-ubyte"
    if bad == "missing":
        target.unlink()
    elif bad == "truncated":
        target.unlink()
        target.write_bytes((fake / target.name).read_bytes()[:1000])
    else:
        folder = tmp_path / "empty"
        folder.mkdir()
    proc = subprocess.run(
        [sys.executable, "reproduce/train.py", "--preset=fmnist.clean", f"--data={folder}",
         "--max_steps=1", f"--logdir={tmp_path / 'runs'}"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: Fashion-MNIST:"), proc.stderr
    assert "train-images-idx3-ubyte" in lines[0] and "Traceback" not in proc.stderr


def reference_crop_flip(x: torch.Tensor, params: torch.Tensor, pad: int, fill: float):
    """torchvision's RandomCrop(padding, fill) then RandomHorizontalFlip, one example at a time,
    at the drawn positions."""
    out = []
    h, w = x.shape[-2:]
    for img, (dy, dx, flip) in zip(x, params.tolist(), strict=True):
        padded = F.pad(img, (pad, pad, pad, pad), value=fill)
        crop = padded[..., dy : dy + h, dx : dx + w]
        out.append(crop.flip(-1) if flip else crop)
    return torch.stack(out)


@pytest.mark.parametrize("shape, pad", [((16, 1, 28, 28), 4), ((5, 3, 7, 9), 2), ((3, 2, 5, 5), 0)])
def test_crop_flip_equals_the_per_example_reference(shape, pad):
    aug = CropFlip(pad=pad, fill=-0.81)
    x = torch.randn(shape)
    params = aug.draw(shape[0], torch.Generator().manual_seed(1))
    assert torch.equal(aug(x, params), reference_crop_flip(x, params, pad, -0.81))


def test_crop_flip_draws_every_shift_and_both_flips():
    params = CropFlip(pad=4).draw(4000, torch.Generator().manual_seed(0))
    assert set(params[:, 0].tolist()) == set(range(9)) == set(params[:, 1].tolist())
    assert 0.45 < params[:, 2].float().mean() < 0.55
    with pytest.raises(ValueError, match="pad"):
        CropFlip(pad=-1)


def small_fmnist(label_noise=0.0) -> D.Examples:
    """A Fashion-MNIST-shaped in-memory training set with the batch augmentation."""
    x = torch.randn(64, 1, 28, 28)
    base = D.TensorData(x, torch.arange(64) % 10)
    return D.Examples(base, torch.arange(64), base.y, CropFlip(pad=4, fill=-1.0))


def test_batches_are_augmented_resumably_and_alike_under_any_number_of_processes():
    ds = small_fmnist()
    order = D.epoch_order(len(ds), 3, 2)
    one = list(D.train_batches(ds, order, 0, 16, seed=3, epoch=2))
    assert len(one) == 4 and not torch.equal(one[0][0], ds.base.x[order[:16]])  # augmented
    again = list(D.train_batches(ds, order, 2, 16, seed=3, epoch=2))  # resumed at batch 2
    assert all(torch.equal(a[0], b[0]) for a, b in zip(one[2:], again, strict=True))
    ranks = [
        list(D.train_batches(ds, order, 0, 16, seed=3, epoch=2, rank=r, world=2)) for r in (0, 1)
    ]
    for b, whole in enumerate(one):
        assert torch.equal(torch.cat([ranks[0][b][0], ranks[1][b][0]]), whole[0])
        assert torch.equal(torch.cat([ranks[0][b][1], ranks[1][b][1]]), whole[1])
    other = list(D.train_batches(ds, order, 0, 16, seed=3, epoch=3))
    assert not torch.equal(other[0][0], one[0][0])  # another epoch, other draws


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_moving_to_a_device_keeps_the_batch_augmentation():
    ds = small_fmnist()
    data = D.Data("fmnist", ds, None, ds, ds, 10, 28, channels=1)
    moved = D.to_device(data, "cuda")
    assert isinstance(moved.train.batch_transform, CropFlip)
    assert moved.train.tensors() is not None and moved.train.base.x.is_cuda
    order = D.epoch_order(len(ds), 0, 0)
    pairs = ((moved.train, order.cuda()), (ds, order))
    (x, _), (ref, _) = (next(D.train_batches(d, o, 0, 16, seed=0, epoch=0)) for d, o in pairs)
    assert torch.equal(x.cpu(), ref)


def test_networks_take_one_channel_and_others_refuse_it():
    net = build_model("resnet9_w32", 10, 28, channels=1, seed=0)
    assert net(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    assert build_model("resnet18", 10, 28, channels=1)(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    with pytest.raises(ValueError, match=r"takes images of 3 channels.*resnet9"):
        build_model("vit_s32", 10, 32, channels=1)
    with pytest.raises(ValueError, match="channels must be an integer >= 1"):
        build_model("resnet9", 10, 28, channels=0)


def test_presets_are_clean_and_noisy_fashion_mnist():
    names = [n for n in PRESETS if n.startswith("fmnist")]
    assert "fmnist.clean" in names and "fmnist.noise40" in names
    for name in names:
        cfg = resolve([f"--preset={name}"])
        assert cfg.dataset == "fmnist" and cfg.model.startswith("resnet9")
        assert cfg.label_noise == (0 if name == "fmnist.clean" else int(name[-2:]) / 100)


def test_the_presets_train_the_recipe_and_values_chosen_on_validation():
    """The fmnist presets are what the committed record chose: its recipe's width and epochs, its
    validation sweep's ρ, α and SAM's ρ (reproduce/RESULTS.md, "Fashion-MNIST")."""
    import json

    from reproduce.evidence import fmnist as H

    record = json.loads(H.EVIDENCE.read_text())
    recipe = resolve(["--preset=fmnist.clean", *H.RECIPES[record["recipe"]["selected"]]])
    for name in ("fmnist.clean", "fmnist.noise40"):
        cfg = resolve([f"--preset={name}"])
        assert (cfg.model, cfg.epochs) == (recipe.model, recipe.epochs), name
        chosen = record["sweep"]["selected"]
        assert (cfg.rho, cfg.alpha, cfg.sam_rho) == (
            chosen["rho"],
            chosen["alpha"],
            chosen["sam_rho"],
        )


def test_fashion_mnist_loads_normalised_with_its_labels_and_noise(fake):
    cfg = resolve(["--preset=fmnist.noise40", f"--data={fake}", "--val_fraction=0.1"])
    data = D.load(cfg)
    assert data.channels == 1 and data.image_size == 28 and data.num_classes == 10
    assert (len(data.train), len(data.val), len(data.test)) == (54_000, 6_000, 10_000)
    x, _ = data.test.tensors()
    assert x.shape == (10_000, 1, 28, 28) and x.dtype == torch.float32
    raw = read_fashion_mnist(fake)
    clean = raw["train"][1]
    flipped = (data.train.labels != clean[data.train.indices]).float().mean()
    assert 0.38 < float(flipped) < 0.42  # 40% over the whole set, of which 90% is here
    assert isinstance(data.train.batch_transform, CropFlip) and data.probe.transform is None


@pytest.mark.slow
@pytest.mark.skipif(
    not HAS_REAL,
    reason=f"Fashion-MNIST's files are not in {REAL} (bash reproduce/data/fashion_mnist.sh {REAL})",
)
def test_train_py_trains_on_the_real_files(tmp_path):
    proc = subprocess.run(
        [sys.executable, "reproduce/train.py", "--preset=fmnist.clean", f"--data={REAL}",
         "--estimator=sgd,gam_fd", "--model=resnet9_w16", "--max_steps=3", "--progress=false",
         f"--logdir={tmp_path}"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "fmnist, 60000 train / 0 val / 10000 test, model resnet9_w16" in proc.stdout
