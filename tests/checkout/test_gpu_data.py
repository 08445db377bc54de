"""The ImageNet input pipelines: the rank shards of the DataLoader fallback (CPU), and the nvJPEG GPU
loader against the CPU pipeline it replaces (GPU only)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from reproduce.config import resolve
from reproduce.data import nvjpeg
from reproduce.data import sets as D


def jpeg_folder(root: Path, per_class: int = 6, classes: int = 3) -> Path:
    """A small ImageFolder of JPEGs of ImageNet-like sizes (smooth content, sides 300-500)."""
    from PIL import Image

    from benchmarks.input_pipeline.jpeg_folder import image

    gen = torch.Generator().manual_seed(0)
    for split in ("train", "val"):
        for c in range(classes):
            folder = root / split / f"n{c:08d}"
            folder.mkdir(parents=True)
            for i in range(per_class):
                pixels = image(gen, "cpu").permute(1, 2, 0).numpy()
                Image.fromarray(pixels).save(folder / f"{i}.JPEG", format="JPEG", quality=90)
    return root


def imagenet(root: Path):
    return D.load(resolve(["--preset=hp2.imagenet.resnet50", f"--data={root}", "--seed=3"]))


@pytest.mark.parametrize("world", [2, 3])
def test_each_rank_gets_its_part_of_every_global_batch_with_the_global_augmentation(
    tmp_path, world
):
    """The fallback DataLoader's batches on rank r are rows r·B/W .. (r+1)·B/W of the batches of one
    process, bit for bit: the same examples, augmented under the seeds of their global positions."""
    data = imagenet(jpeg_folder(tmp_path, per_class=4))
    order = D.epoch_order(len(data.train), 3, 1)
    full = list(D.train_batches(data.train, order, 1, 6, seed=3, epoch=1))
    assert len(full) == 1  # 12 images, batch 6: batch 1 of 2 (a resumed start)
    per = 6 // world
    for rank in range(world):
        (part,) = D.train_batches(data.train, order, 1, 6, seed=3, epoch=1, rank=rank, world=world)
        x, y = part
        torch.testing.assert_close(x, full[0][0][rank * per : (rank + 1) * per], rtol=0, atol=0)
        assert torch.equal(y, full[0][1][rank * per : (rank + 1) * per])


def test_evaluation_shards_cover_the_split_once(tmp_path):
    data = imagenet(jpeg_folder(tmp_path, per_class=3))
    parts = [D.shard(data.test, r, 4) for r in range(4)]
    seen = torch.cat([p.indices for p in parts]).sort().values
    assert torch.equal(seen, data.test.indices.sort().values)
    assert sum(len(p) for p in parts) == len(data.test)


def test_crop_and_flip_draws_what_torchvision_draws_under_the_seed():
    """RandomResizedCrop's window and RandomHorizontalFlip's coin, drawn from a generator of our own,
    equal torchvision's draws from the global generator under ``torch.manual_seed(seed)``: wide, tall
    (torchvision's fallback crop) and tiny images."""
    import torchvision.transforms as T

    sizes = [(375, 500), (500, 333), (8, 900), (900, 8), (1, 1), (224, 224), (3000, 4000)]
    for seed in range(300):
        height, width = sizes[seed % len(sizes)]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            shape = torch.empty(1, 1, 1).expand(3, height, width)
            want = T.RandomResizedCrop.get_params(shape, [0.08, 1.0], [3 / 4, 4 / 3])
            flip = bool(torch.rand(1) < 0.5)
        assert nvjpeg.crop_and_flip(seed, height, width) == (*want, flip)


@pytest.mark.gpu
@pytest.mark.parametrize("train", [True, False])
def test_gpu_loader_makes_the_batches_of_the_cpu_pipeline(tmp_path, train):
    """The same examples, crops and flips as torchvision's CPU transforms (parameters drawn under the
    same per-example seeds), to the rounding of two JPEG decoders and two resampling filters."""
    device = torch.device("cuda")
    assert nvjpeg.available(device)
    data = imagenet(jpeg_folder(tmp_path))
    ds = data.train if train else data.test
    order = torch.arange(len(ds)) if not train else D.epoch_order(len(ds), 3, 0)
    keys = D.epoch_keys(order, 0, 6, seed=3, epoch=0) if train else [(j, None) for j in range(12)]
    gpu = nvjpeg.GpuJpegLoader(ds, 6, device, train=train)
    got = list(gpu.batches(keys))
    cpu = D.FolderLoader(ds, 6).batches(keys) if train else D.eval_batches(ds, 6)
    want = list(cpu)[: len(got)]
    assert len(got) == len(want) == (len(keys) // 6)
    for (gx, gy), (wx, wy) in zip(got, want, strict=True):
        assert gx.shape == wx.shape == (6, 3, 224, 224) and gx.device.type == "cuda"
        assert torch.equal(gy.cpu(), wy)
        for g, w in zip(gx.cpu(), wx, strict=True):  # the same crop and flip: nearly collinear
            assert float(torch.corrcoef(torch.stack([g.flatten(), w.flatten()]))[0, 1]) > 0.98
        # normalised units: one grey level is about 1/255/0.226 = 0.017; the two decoders and
        # resampling filters differ by about 3 levels on average (0.053 measured on an H200)
        assert (gx.cpu() - wx).abs().mean() < 0.1


def test_loader_choice_on_a_machine_without_a_gpu(tmp_path, monkeypatch):
    """``auto`` takes the DataLoader and says so; the nvJPEG loader, and DALI where it is not
    installed, asked for by name, are refused in one line that names the fallback."""
    from types import SimpleNamespace

    from reproduce.build import SetupError
    from reproduce.data import dali
    from reproduce.run.loaders import loaders

    root = jpeg_folder(tmp_path, per_class=2)
    cpu = SimpleNamespace(device=torch.device("cpu"), world=1)
    monkeypatch.setattr(dali, "available", lambda: False)
    for loader in ("dali", "dali_exact", "gpu"):
        cfg = resolve(["--preset=hp2.imagenet.resnet50", f"--data={root}", f"--loader={loader}"])
        with pytest.raises(SetupError, match=f"--loader={loader} needs .*use --loader=folder"):
            loaders(cfg, D.load(cfg), cpu)
    cfg = resolve(["--preset=hp2.imagenet.resnet50", f"--data={root}", "--workers=0"])
    train, _, name = loaders(cfg, D.load(cfg), cpu)
    assert isinstance(train, D.FolderLoader) and name.startswith("folder")


AUTO_CASES = [  # (jpeg, device, dali, nvjpeg) -> loader, the reason its line gives
    ((True, "cuda", True, True), "dali", "loader: dali (DALI): a CUDA device and NVIDIA DALI"),
    ((True, "cuda", True, False), "dali", "loader: dali (DALI): a CUDA device and NVIDIA DALI"),
    ((True, "cuda", False, True), "gpu", "loader: gpu (torchvision nvJPEG): a CUDA device whose"),
    ((True, "cuda", False, False), "folder", "loader: folder (DataLoader): NVIDIA DALI is not"),
    ((True, "cpu", True, True), "folder", "loader: folder (DataLoader): no CUDA device"),
    ((True, "cpu", False, False), "folder", "loader: folder (DataLoader): no CUDA device"),
    ((False, "cuda", True, True), "folder", "loader: folder (DataLoader): not ImageNet JPEGs"),
]


@pytest.mark.parametrize(("facts", "kind", "line"), AUTO_CASES)
def test_auto_prefers_dali_then_nvjpeg_then_the_dataloader(facts, kind, line):
    from reproduce.config import LOADERS
    from reproduce.run.loaders import choose_loader

    jpeg, device, has_dali, has_nvjpeg = facts
    chosen, said = choose_loader(jpeg, torch.device(device), dali=has_dali, nvjpeg=has_nvjpeg)
    assert chosen == kind and chosen in LOADERS
    assert said.startswith(line) and "\n" not in said


def test_auto_probes_this_process_and_says_its_choice_once(tmp_path, capsys):
    """Here (no CUDA device) ``auto`` runs the DataLoader and prints one line that says so."""
    from types import SimpleNamespace

    from reproduce.run.loaders import auto_loader, loaders

    assert auto_loader(True, torch.device("cpu")) == (
        "folder",
        "loader: folder (DataLoader): no CUDA device",
    )
    root = jpeg_folder(tmp_path, per_class=2)
    cpu = SimpleNamespace(device=torch.device("cpu"), world=1)
    cfg = resolve(["--preset=hp2.imagenet.resnet50", f"--data={root}", "--workers=0"])
    capsys.readouterr()
    train, _, name = loaders(cfg, D.load(cfg), cpu)
    assert isinstance(train, D.FolderLoader) and name.startswith("folder")
    assert capsys.readouterr().out == "loader: folder (DataLoader): no CUDA device\n"
    lines = []
    cfg = resolve(
        ["--preset=hp2.imagenet.resnet50", f"--data={root}", "--workers=0", "--loader=folder"]
    )
    loaders(cfg, D.load(cfg), cpu, say=lines.append)
    assert lines == []  # a loader named by --loader needs no notice


@pytest.mark.gpu
def test_a_run_works_on_a_stream_of_its_own_after_the_work_queued_before():
    """launch.start leaves CUDA's legacy default stream (which waits for every blocking stream's
    work) for a stream of the process's own, ordered after what was already queued."""
    from reproduce.run import launch

    device = torch.device("cuda", torch.cuda.current_device())
    default = torch.cuda.default_stream(device)
    x = torch.zeros(1 << 20, device=device)
    torch.cuda._sleep(100_000_000)  # the default stream busy
    x.fill_(1.0)
    try:
        procs = launch.start("cuda")
        own = torch.cuda.current_stream(procs.device)
        assert own != default and own.cuda_stream != 0
        assert float(x.sum()) == x.numel()  # read on the new stream, after the fill
    finally:
        torch.cuda.set_stream(default)
