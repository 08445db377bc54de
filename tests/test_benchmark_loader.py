"""benchmarks/loader_throughput.py on the CPU: DALI's pipeline alone and feeding a stand-in step."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

pytest.importorskip("nvidia.dali")

from benchmarks import loader_throughput as bench
from tests.test_gpu_data import jpeg_folder


def test_a_stand_in_step_reads_its_batch_and_lasts_about_as_asked():
    cpu = torch.device("cpu")
    run, k = bench.stand_in(20, (2, 3, 8, 8), cpu)
    assert k >= 1
    seconds = bench._seconds(lambda: [run(torch.ones(2, 3, 8, 8)) for _ in range(10)], cpu)
    assert 0.25 < seconds / 10 / 0.020 < 4  # a CPU shared with others: the order of magnitude


def test_each_pipeline_feeds_the_stand_in_and_its_steps_are_profiled(tmp_path):
    root = jpeg_folder(tmp_path / "data", per_class=8)
    out, trace = tmp_path / "loader.json", tmp_path / "traces"
    argv = ["--data", str(root), "--batch", "2", "--batches", "8", "--warmup", "2"]
    argv += ["--pipelines", "dali:1.0", "dali_roi:1.0", "--threads", "2"]
    argv += ["--load_ms", "5", "--trace", str(trace), "--out", str(out)]
    bench.main(argv)
    got = json.loads(out.read_text())
    assert got["load_ms"] > 0 and got["load_products"] >= 1
    assert got["stream"] == "own"
    for name in ("dali_hw_1.0", "dali_roi_hw_1.0"):
        assert got[f"{name}_images_per_s"] > 0
        assert got[f"{name}_loaded_ms"] > 0 and got[f"{name}_next_ms"] >= 0
        cost = got[f"{name}_loaded_ms"] / got["load_ms"] - 1
        assert got[f"{name}_loaded_cost"] == pytest.approx(cost, abs=1e-3)
        table = (trace / name / "profile.txt").read_text()
        assert table.startswith("5 steps after step 0:")
        assert (trace / name / "profile_trace.json.gz").stat().st_size > 0
