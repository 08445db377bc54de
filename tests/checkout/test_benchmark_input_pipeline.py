"""``python -m benchmarks.input_pipeline`` on the CPU: the DataLoader on a synthetic folder it writes
itself, DALI's pipelines (where DALI is installed) alone and feeding a stand-in step, and the
synthetic folder. Nothing here reads a clock for an assertion."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.input_pipeline import __main__ as bench
from benchmarks.input_pipeline import jpeg_folder


def test_the_folder_has_every_class_and_split_and_the_same_images_whatever_the_threads(tmp_path):
    pytest.importorskip("torchvision")
    size = jpeg_folder.build(tmp_path / "a", train=6, val=2, classes=3, threads=1)
    jpeg_folder.build(tmp_path / "b", train=6, val=2, classes=3, threads=3)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.JPEG"))
    assert len(files) == 8 and {f.parts[0] for f in files} == {"train", "val"}
    assert len({f.parts[1] for f in files if f.parts[0] == "train"}) == 3
    assert size == sum((tmp_path / "a" / f).stat().st_size for f in files)
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    with pytest.raises(ValueError, match="classes"):
        jpeg_folder.build(tmp_path / "c", train=1, val=1, classes=0)


def test_a_stand_in_step_reads_its_batch():
    run, k = bench.stand_in(2, (2, 3, 8, 8), torch.device("cpu"))
    assert k >= 1
    run(torch.ones(2, 3, 8, 8))  # copies the batch into its input and runs its products


@pytest.mark.slow
def test_quick_times_the_data_loader_on_a_folder_it_writes(tmp_path):
    pytest.importorskip("torchvision")
    out = tmp_path / "pipeline.json"
    result = bench.main(["--quick", "--batch", "4", "--batches", "2", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert result["benchmark"] == "input_pipeline" and result["meta"]["device"] == "cpu"
    (row,) = result["rows"]
    assert row["pipeline"] == "folder_2_workers"
    assert row["images_per_s"] > 0 and row["first_epoch_start_s"] > 0


@pytest.mark.dali
def test_each_dali_pipeline_feeds_the_stand_in_and_its_steps_are_profiled(tmp_path):
    pytest.importorskip("nvidia.dali", reason='needs NVIDIA DALI: pip install -e ".[imagenet]"')
    from tests.checkout.test_gpu_data import jpeg_folder as small_folder

    root = small_folder(tmp_path / "data", per_class=8)
    out, trace = tmp_path / "loader.json", tmp_path / "traces"
    argv = ["--data", str(root), "--batch", "2", "--batches", "8", "--warmup", "2"]
    argv += ["--pipelines", "dali:1.0", "dali_roi:1.0", "--threads", "2"]
    argv += ["--load_ms", "5", "--trace", str(trace), "--out", str(out)]
    got = bench.main(argv)
    meta = got["meta"]
    assert meta["load_ms"] > 0 and meta["load_products"] >= 1
    assert meta["stream"] == "own"
    rows = {r["pipeline"]: r for r in got["rows"]}
    assert set(rows) == {"dali_hw_1.0", "dali_roi_hw_1.0"}
    for name, r in rows.items():
        assert r["images_per_s"] > 0
        assert r["loaded_ms"] > 0 and r["next_ms"] >= 0
        assert r["loaded_cost"] == r["loaded_ms"] / meta["load_ms"] - 1
        table = (trace / name / "profile.txt").read_text()
        assert table.startswith("5 steps after step 0:")
        assert (trace / name / "profile_trace.json.gz").stat().st_size > 0


def test_the_default_gpu_pipelines_begin_with_train_py_s_dali_loader():
    """On a GPU the benchmark first times the DALI arrangement that ``train.py --loader=dali`` runs
    by default (its crop windows decoded alone, its share on the hardware decoder), then the others."""
    from reproduce.config import Config

    kind, share = bench.GPU_PIPELINES[0].split(":")
    assert (kind == "dali_roi") == Config.dali_roi and float(share) == Config.dali_hw_load
    assert {p.split(":")[0] for p in bench.GPU_PIPELINES} >= {"dali_exact", "nvjpeg", "folder"}
