"""The DALI ImageNet pipeline against the CPU pipeline it replaces: on the CPU (DALI's CPU decoder)
wherever DALI is installed, and with the GPU decoder on a CUDA machine (``gpu`` mark)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("nvidia.dali", reason='needs NVIDIA DALI: pip install -e ".[imagenet]"')

from reproduce.config import resolve
from reproduce.data import sets as D
from reproduce.data.dali import DaliJpegLoader, jpeg_size, uniforms
from tests.checkout.test_gpu_data import imagenet, jpeg_folder

pytestmark = pytest.mark.dali  # .ci/run runs these after installing the imagenet extra


def batches(tmp_path, train: bool, device: torch.device, crops: str = "exact", **options):
    """The DALI loader's batches and the CPU pipeline's, of an epoch's order (training) or of the
    split in order (evaluation), 6 images a batch."""
    data = imagenet(jpeg_folder(tmp_path))
    ds = data.train if train else data.test
    if train:
        keys = D.epoch_keys(D.epoch_order(len(ds), 3, 0), 0, 6, seed=3, epoch=0)
        want = list(D.FolderLoader(ds, 6).batches(keys))
    else:
        keys = [(j, None) for j in range(len(ds))]
        want = list(D.eval_batches(ds, 6))
    got = list(DaliJpegLoader(ds, 6, device, train=train, crops=crops, **options).batches(keys))
    assert len(got) == len(want) == 3
    return got, want


@pytest.mark.parametrize("train", [True, False])
def test_dali_exact_crops_make_the_batches_of_the_cpu_pipeline(tmp_path, train):
    """The same examples, labels, crops and flips as torchvision's CPU transforms (parameters drawn
    under the same per-example seeds), to a fraction of one grey level: both decode with
    libjpeg-turbo, and DALI's antialiased linear resampling of the window is torchvision's."""
    got, want = batches(tmp_path, train, torch.device("cpu"))
    for (gx, gy), (wx, wy) in zip(got, want, strict=True):
        assert gx.shape == wx.shape == (6, 3, 224, 224) and gx.dtype == torch.float32
        assert torch.equal(gy, wy)
        # normalised units: one grey level is 1/255/0.226 = 0.017; measured 0.0036 (train), 0.0029
        assert (gx - wx).abs().mean() < 0.017 / 2
        assert (gx - wx).abs().max() < 0.017 * 30  # no pixel off by a misplaced crop or a flip


def test_dali_crops_read_the_order_and_labels_of_the_cpu_pipeline(tmp_path):
    """``crops="dali"``: DALI reads the same files in the same order (the labels say so) and draws
    crops of its own (other pixels than torchvision's), the same ones for the same keys."""
    got, want = batches(tmp_path, True, torch.device("cpu"), crops="dali")
    for (gx, gy), (wx, wy) in zip(got, want, strict=True):
        assert gx.shape == (6, 3, 224, 224) and torch.equal(gy, wy)
        assert (gx - wx).abs().mean() > 0.1  # its own crops
    again, _ = batches(tmp_path / "again", True, torch.device("cpu"), crops="dali")
    for (gx, _), (ax, _) in zip(got, again, strict=True):
        assert torch.equal(gx, ax)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_roi_decoding_makes_the_crops_of_whole_image_decoding(tmp_path, device):
    """``roi_decode``: each window decoded alone and resized gives the batch of the whole image
    decoded and its window resized, to the rounding of the window to whole pixels."""
    data = imagenet(jpeg_folder(tmp_path))
    keys = D.epoch_keys(D.epoch_order(len(data.train), 3, 0), 0, 6, seed=3, epoch=0)
    device = torch.device(device)
    whole = list(DaliJpegLoader(data.train, 6, device, roi_decode=False).batches(keys))
    roi = list(DaliJpegLoader(data.train, 6, device).batches(keys))
    for (wx, wy), (rx, ry) in zip(whole, roi, strict=True):
        assert torch.equal(wy, ry) and rx.shape == wx.shape
        assert not torch.equal(rx, wx)  # the windows did decode alone
    rx, wx = (torch.cat([x for x, _ in b]).cpu() for b in (roi, whole))

    def far(
        a, b
    ):  # mean distance of 8×8 means, per image: the fine grain's sub-pixel shifts cancel
        return (F.avg_pool2d(a, 8) - F.avg_pool2d(b, 8)).abs().mean((1, 2, 3))

    # normalised units (one grey level: 0.017); measured 0.01-0.07 per image, 0.034 in all
    assert far(rx, wx).max() < 0.1
    # what the test tells apart: another example's window, or the mirrored one (measured 1.06-1.10)
    assert far(rx, wx.roll(1, 0)).mean() > 0.5 and far(rx, wx.flip(-1)).mean() > 0.5


def test_dali_crops_depend_on_the_example_alone(tmp_path):
    """An example's crop and flip come from its seed and its image: a resumed epoch (from batch 1)
    and each rank's share of the global batches give the images of the uninterrupted single run."""
    data = imagenet(jpeg_folder(tmp_path))
    cpu = torch.device("cpu")
    order = D.epoch_order(len(data.train), 3, 0)
    keys = D.epoch_keys(order, 0, 6, seed=3, epoch=0)
    whole = torch.cat([x for x, _ in DaliJpegLoader(data.train, 6, cpu).batches(keys)])
    resumed = D.epoch_keys(order, 1, 6, seed=3, epoch=0)
    tail = torch.cat([x for x, _ in DaliJpegLoader(data.train, 6, cpu).batches(resumed)])
    assert torch.equal(tail, whole[6:])
    for rank in range(2):
        part = D.epoch_keys(order, 0, 6, seed=3, epoch=0, rank=rank, world=2)
        x = torch.cat([x for x, _ in DaliJpegLoader(data.train, 3, cpu).batches(part)])
        rows = [b * 6 + rank * 3 + i for b in range(3) for i in range(3)]
        assert torch.equal(x, whole[rows])


def test_uniforms_are_uniform_and_a_function_of_the_seed_alone():
    seeds = np.arange(200_000, dtype=np.uint64) * np.uint64(7919)
    u = uniforms(seeds, 5)
    assert u.shape == (200_000, 5) and u.dtype == np.float32 and (u >= 0).all() and (u < 1).all()
    assert np.abs(u.mean(0) - 0.5).max() < 0.005 and np.abs(u.var(0) - 1 / 12).max() < 0.002
    assert abs(np.corrcoef(u[:, 0], u[:, 1])[0, 1]) < 0.01
    assert np.array_equal(uniforms(seeds[::-1], 5), u[::-1])


def test_dali_exact_crops_are_the_same_whatever_the_worker_processes(tmp_path):
    """The files read and crops drawn in DataLoader workers give the batches of the calling process."""
    data = imagenet(jpeg_folder(tmp_path, per_class=4))
    keys = D.epoch_keys(D.epoch_order(len(data.train), 3, 1), 0, 4, seed=3, epoch=1)
    cpu = torch.device("cpu")
    alone = list(DaliJpegLoader(data.train, 4, cpu, crops="exact").batches(keys))
    loader = DaliJpegLoader(data.train, 4, cpu, crops="exact", workers=2)
    for _ in range(2):  # the workers persist from one call (epoch) to the next
        pooled = list(loader.batches(keys))
        assert len(pooled) == len(alone) == 3
        for (px, py), (ax, ay) in zip(pooled, alone, strict=True):
            assert torch.equal(px, ax) and torch.equal(py, ay)


def test_dali_evaluation_keeps_the_last_partial_batch(tmp_path):
    data = imagenet(jpeg_folder(tmp_path, per_class=3))  # 9 test images
    for crops in ("dali", "exact"):
        loader = DaliJpegLoader(data.test, 4, torch.device("cpu"), train=False, crops=crops)
        sizes = [len(y) for _, y in loader.eval_batches()]
        assert sizes == [4, 4, 1]


@pytest.mark.slow
def test_train_py_with_the_dali_loader_resumes_bit_exact(tmp_path, capsys):
    """reproduce/train.py on a JPEG folder through --loader=dali (DALI's CPU decoder here): it says
    which loader runs, and 2 steps, a stop, and 2 more give the parameters of 4 steps at once.
    Crops of 32 px and the CIFAR ResNet-32: the resume is the loader's and the run's, not the model's."""
    from reproduce import train
    from reproduce.run import checkpoint as ckpt

    root = jpeg_folder(tmp_path / "data")
    args = ["--preset=hp2.imagenet.resnet50", f"--data={root}", "--model=resnet32", "--loader=dali"]
    args += ["--image_size=32"]
    args += ["--estimator=gam_fd", "--batch_size=4", "--eval_batch_size=5", "--workers=0"]
    args += ["--progress=false", "--landscape=false", "--eig_iters=0", "--trace_samples=0"]
    args += ["--r1_steps=0", "--max_steps=4"]

    def run(logdir, *more):
        assert train.main([f"--logdir={tmp_path / logdir}", *args, *more]) == 0
        (path,) = (tmp_path / logdir).rglob("checkpoint.pt")
        return ckpt.load(path)

    whole = run("whole")
    assert "dali (DALI" in capsys.readouterr().out
    run("parts", "--max_steps=2")
    parts = run("parts", "--resume")
    assert parts["position"]["global_step"] == whole["position"]["global_step"] == 4
    for k, v in whole["params"].items():
        assert torch.equal(v, parts["params"][k]), k


def test_the_decoders_share_and_roi_decoding_reach_the_loader(tmp_path):
    """``--dali_hw_load``, ``--dali_roi``, ``--read_ahead`` (DALI's prefetch queue) and
    ``--dali_cpu`` with ``--workers`` (DALI's CPU decoder on that many threads) reach the training
    loader, and its name says so; a share outside [0, 1] or a queue shorter than one batch is
    refused, naming the argument."""
    from types import SimpleNamespace

    from reproduce.run.loaders import loaders

    root = jpeg_folder(tmp_path, per_class=2)
    cpu = SimpleNamespace(device=torch.device("cpu"), world=1)
    args = ["--preset=hp2.imagenet.resnet50", f"--data={root}", "--loader=dali"]
    cfg = resolve(args)  # by default: nvJPEG's CUDA decoder, each window decoded alone
    train, _, name = loaders(cfg, D.load(cfg), cpu)
    assert train.hw_decoder_load == 0.0 and train.roi_decode and "window decoded alone" in name
    assert train.read_ahead == 3
    cfg = resolve([*args, "--dali_hw_load=0.65", "--dali_roi=false", "--read_ahead=6"])
    train, _, name = loaders(cfg, D.load(cfg), cpu)
    assert train.hw_decoder_load == 0.65 and not train.roi_decode and "window" not in name
    assert train.read_ahead == 6
    cuda = SimpleNamespace(device=torch.device("cuda:0"), world=1)  # nothing runs on it here
    train, _, name = loaders(resolve([*args, "--dali_cpu", "--workers=3"]), D.load(cfg), cuda)
    assert train.decoder == "cpu" and train.threads == 3 and "decoding on 3 CPU threads" in name
    train, _, name = loaders(resolve(args), D.load(cfg), cuda)
    assert train.decoder == "mixed" and train.threads == 8 and "decoding on the GPU" in name
    assert train.hw_decoder_load == 0.0 and "nvJPEG's CUDA decoder" in name
    train, _, name = loaders(resolve([*args, "--dali_hw_load=1"]), D.load(cfg), cuda)
    assert train.hw_decoder_load == 1.0 and "the hardware JPEG decoder" in name
    with pytest.raises(ValueError, match="dali_hw_load"):
        resolve([*args, "--dali_hw_load=1.5"])
    with pytest.raises(ValueError, match="read_ahead"):
        resolve([*args, "--read_ahead=0"])


@pytest.mark.parametrize("queues, says", [(None, True), ("8", True), ("32", False), ("64", False)])
def test_dali_on_the_gpu_says_when_cuda_has_too_few_hardware_queues(
    tmp_path, monkeypatch, queues, says
):
    """Fewer than 32 of CUDA's hardware work queues (CUDA_DEVICE_MAX_CONNECTIONS; 8 where unset)
    left DALI's decoding behind the step's kernels (benchmarks/RESULTS.md): DALI on the GPU says so
    in one line; on the CPU it has nothing to say."""
    from types import SimpleNamespace

    from reproduce.run.loaders import loaders

    if queues is None:
        monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    else:
        monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", queues)
    root = jpeg_folder(tmp_path, per_class=2)
    cfg = resolve(["--preset=hp2.imagenet.resnet50", f"--data={root}", "--loader=dali"])
    lines = []
    cuda = SimpleNamespace(device=torch.device("cuda:0"), world=1)  # nothing runs on it here
    loaders(cfg, D.load(cfg), cuda, say=lines.append)
    assert lines == (
        [
            f"CUDA_DEVICE_MAX_CONNECTIONS is {queues or 8}: DALI's decoding can wait behind the "
            "step's kernels; 32 (train.py's default where unset) runs it beside them"
        ]
        if says
        else []
    )
    cpu = SimpleNamespace(device=torch.device("cpu"), world=1)
    lines.clear()
    loaders(cfg, D.load(cfg), cpu, say=lines.append)
    assert lines == []


def test_jpeg_size_reads_the_header(tmp_path):
    from PIL import Image

    Image.new("RGB", (37, 21)).save(tmp_path / "a.jpg")
    assert jpeg_size((tmp_path / "a.jpg").read_bytes()) == (21, 37)


def test_a_mixed_decoder_needs_a_gpu():
    data = type("Examples", (), {"base": type("F", (), {"samples": []})()})()
    with pytest.raises(ValueError, match="decoder='mixed' needs a CUDA device"):
        DaliJpegLoader(data, 4, torch.device("cpu"), decoder="mixed")
    with pytest.raises(ValueError, match="crops must be 'dali' or 'exact'"):
        DaliJpegLoader(data, 4, torch.device("cpu"), crops="torchvision")


@pytest.mark.gpu
@pytest.mark.parametrize("hw_load", [0.0, 1.0])
@pytest.mark.parametrize("train", [True, False])
def test_dali_gpu_decoder_with_exact_crops_makes_the_batches_of_the_cpu_pipeline(
    tmp_path, train, hw_load
):
    """nvJPEG's CUDA decoder (the default) and the hardware decoder round their IDCT otherwise than
    libjpeg-turbo: the same crops and flips (nearly collinear images), a few grey levels apart on
    average."""
    got, want = batches(tmp_path, train, torch.device("cuda"), hw_decoder_load=hw_load)
    for (gx, gy), (wx, wy) in zip(got, want, strict=True):
        assert gx.device.type == "cuda" and gx.shape == wx.shape == (6, 3, 224, 224)
        assert gy.device.type == "cuda" and gy.dtype == torch.int64
        assert torch.equal(gy.cpu(), wy)
        for g, w in zip(gx.cpu(), wx, strict=True):
            assert float(torch.corrcoef(torch.stack([g.flatten(), w.flatten()]))[0, 1]) > 0.98
        assert (gx.cpu() - wx).abs().mean() < 0.1


@pytest.mark.gpu
def test_the_cpu_decoder_feeding_a_gpu_makes_the_batches_of_the_cpu_pipeline(tmp_path):
    """``decoder="cpu"`` on a CUDA device (``--dali_cpu``): decoded and resized on the CPU,
    normalised on the GPU, the batches are those of the same pipeline run on the CPU alone, to
    float rounding, and they arrive on the GPU."""
    data = imagenet(jpeg_folder(tmp_path))
    keys = D.epoch_keys(D.epoch_order(len(data.train), 3, 0), 0, 6, seed=3, epoch=0)
    host = list(DaliJpegLoader(data.train, 6, torch.device("cpu")).batches(keys))
    fed = DaliJpegLoader(data.train, 6, torch.device("cuda"), decoder="cpu").batches(keys)
    for (gx, gy), (hx, hy) in zip(fed, host, strict=True):
        assert gx.is_cuda and gy.is_cuda and gx.shape == hx.shape
        assert torch.equal(gy.cpu(), hy)
        torch.testing.assert_close(gx.cpu(), hx, rtol=0, atol=1e-5)


@pytest.mark.gpu
def test_dali_gpu_pipeline_reads_the_order_of_the_cpu_pipeline(tmp_path):
    got, want = batches(tmp_path, True, torch.device("cuda"), crops="dali")
    for (gx, gy), (_, wy) in zip(got, want, strict=True):
        assert gx.device.type == "cuda" and gx.shape == (6, 3, 224, 224)
        assert gy.device.type == "cuda" and gy.dtype == torch.int64
        assert torch.equal(gy.cpu(), wy)


@pytest.mark.gpu
def test_a_batch_taken_on_a_stream_of_its_own_is_ready_on_that_stream(tmp_path):
    """train.py takes its batches on a non-blocking stream of its own (``launch.own_stream``): each
    batch, read on that stream at once while CUDA's legacy default stream is kept busy, is the batch
    taken on the default stream. A copy the consumer's stream did not wait for would be read before
    it is made."""
    data = imagenet(jpeg_folder(tmp_path))
    keys = D.epoch_keys(D.epoch_order(len(data.train), 3, 0), 0, 6, seed=3, epoch=0)
    cuda = torch.device("cuda")
    loader = DaliJpegLoader(data.train, 6, cuda, crops="exact")
    want = [(x.cpu(), y.cpu()) for x, y in loader.batches(keys)]
    square = torch.randn(4096, 4096, device=cuda)
    product = torch.empty_like(square)

    def keep_default_stream_busy():  # some tens of milliseconds of matrix products
        with torch.cuda.stream(torch.cuda.default_stream(cuda)):
            for _ in range(20):
                torch.mm(square, square, out=product)

    own, got = torch.cuda.Stream(cuda), []
    with torch.cuda.stream(own):
        epoch = DaliJpegLoader(data.train, 6, cuda, crops="exact").batches(keys)
        while True:
            keep_default_stream_busy()
            batch = next(epoch, None)
            if batch is None:
                break
            got.append((batch[0].clone(), batch[1].clone()))
    torch.cuda.synchronize(cuda)
    assert len(got) == len(want) == 3
    for (gx, gy), (wx, wy) in zip(got, want, strict=True):
        assert torch.equal(gx.cpu(), wx) and torch.equal(gy.cpu(), wy)


@pytest.mark.parametrize(
    "crops,train,device",
    [
        ("dali", True, "cpu"),
        ("exact", True, "cpu"),
        ("exact", False, "cpu"),
        pytest.param("dali", True, "cuda", marks=pytest.mark.gpu),
        pytest.param("exact", False, "cuda", marks=pytest.mark.gpu),
    ],
)
def test_one_pipeline_serves_every_epoch(tmp_path, crops, train, device):
    """A loader builds its pipeline once and resets it at each next epoch: epochs of other orders,
    one left after its first batch, one begun while an earlier one is still held, each give the
    batches of a fresh loader, and the epoch left behind refuses to run on."""
    data = imagenet(jpeg_folder(tmp_path))
    ds, device = (data.train if train else data.test), torch.device(device)

    def keys(epoch):  # evaluation: the split from example `epoch` on (a partial last batch)
        if not train:
            return [(j, None) for j in range(epoch, len(ds))]
        return D.epoch_keys(D.epoch_order(len(ds), 3, epoch), 0, 6, seed=3, epoch=epoch)

    def fresh(epoch):
        return list(DaliJpegLoader(ds, 6, device, train=train, crops=crops).batches(keys(epoch)))

    def same(got, want):
        assert len(got) == len(want) > 0
        for (gx, gy), (wx, wy) in zip(got, want, strict=True):
            assert torch.equal(gx, wx) and torch.equal(gy, wy)

    loader = DaliJpegLoader(ds, 6, device, train=train, crops=crops)
    same(list(loader.batches(keys(0))), fresh(0))
    pipe = loader._pipe
    left = loader.batches(keys(1))
    same([next(left)], fresh(1)[:1])
    left.close()
    held = loader.batches(keys(2))
    same([next(held)], fresh(2)[:1])
    for epoch in (3, 4):
        same(list(loader.batches(keys(epoch))), fresh(epoch))
    with pytest.raises(RuntimeError, match="a later epoch of this loader has started"):
        next(held)
    assert loader._pipe is pipe  # built once


def test_a_dropped_loader_frees_its_pipeline_at_once(tmp_path):
    """No reference cycle keeps a pipeline (and its threads) alive after its loader: a garbage
    collection in a forked DataLoader worker would otherwise destroy the pipeline it inherited."""
    import gc
    import weakref

    data = imagenet(jpeg_folder(tmp_path, per_class=2))
    keys = D.epoch_keys(D.epoch_order(len(data.train), 3, 0), 0, 2, seed=3, epoch=0)
    gc.disable()
    try:
        for crops in ("dali", "exact"):
            loader = DaliJpegLoader(data.train, 2, torch.device("cpu"), crops=crops)
            epoch = loader.batches(keys)
            next(epoch)
            epoch.close()
            pipe = weakref.ref(loader._pipe)
            del loader, epoch
            assert pipe() is None, crops
    finally:
        gc.enable()


def test_each_split_is_evaluated_by_one_loader_again_and_again(tmp_path, monkeypatch):
    """train.py's evaluation through DALI keeps a loader (and its pipeline) per split: one pipeline
    built for each split, and a second evaluation gives the first one's batches."""
    from types import SimpleNamespace

    from reproduce.run.loaders import loaders

    built = []
    build = DaliJpegLoader._exact_pipeline
    monkeypatch.setattr(DaliJpegLoader, "_exact_pipeline", lambda s: built.append(s) or build(s))
    root = jpeg_folder(tmp_path, per_class=3)
    args = ["--preset=hp2.imagenet.resnet50", f"--data={root}", "--loader=dali", "--workers=0"]
    cfg = resolve(args)
    data = D.load(cfg)
    _, evaluate, _ = loaders(cfg, data, SimpleNamespace(device=torch.device("cpu"), world=1))
    first, train = list(evaluate(data.test)), list(evaluate(data.train))
    again = list(evaluate(data.test))
    assert len(first) == len(again) > 0 and sum(len(y) for _, y in train) == len(data.train)
    assert len(built) == 2
    for (fx, fy), (ax, ay) in zip(first, again, strict=True):
        assert torch.equal(fx, ax) and torch.equal(fy, ay)
