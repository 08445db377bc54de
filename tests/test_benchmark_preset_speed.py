"""benchmarks/preset_speed.py times train.py's step of a preset on the CPU and writes a complete JSON;
benchmarks/preset_markdown.py turns it into the README's hours. No timing is asserted."""

from __future__ import annotations

import json
import math

import pytest
import torch

from benchmarks import preset_markdown, preset_speed
from reproduce.config import DATASETS, resolve
from reproduce.data import sets as data_mod

ROW_FIELDS = {
    "preset",
    "estimator",
    "compile",
    "model",
    "dataset",
    "image_size",
    "num_classes",
    "input_shape",
    "batch_size",
    "base",
    "steps_timed",
    "warmup",
    "setup_s",
    "first_step_s",
    "ms_per_step",
    "images_per_s",
    "peak_memory_gib",
    "train_examples",
    "train_examples_source",
    "run_steps",
    "run_batch_size",
    "run_images",
    "hours_1gpu",
    "baseline",
    "x_grad_step",
    "error",
}


@pytest.fixture(scope="module")
def digits_result(tmp_path_factory):
    out = tmp_path_factory.mktemp("speed") / "speed.json"
    argv = ["--presets", "digits:gam", "--steps", "2", "--warmup", "1", "--device", "cpu"]
    assert preset_speed.main([*argv, "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_digits_rows_carry_every_field_and_the_hours_follow_from_images_per_s(digits_result):
    res = digits_result
    assert {
        "device",
        "device_type",
        "torch",
        "commit",
        "date",
        "flags",
        "rows",
        "wall_s",
    } <= res.keys()
    assert res["device_type"] == "cpu"
    assert res["flags"] | {"steps": 2, "compile": False, "bf16": False} == res["flags"]
    rows = {r["estimator"]: r for r in res["rows"]}
    assert list(rows) == ["sgd", "gam"]  # the gradient step of the model first, in the same process
    cfg = resolve(["--preset=digits"])
    for r in rows.values():
        assert r["error"] is None, r["error"]
        assert r.keys() >= ROW_FIELDS, ROW_FIELDS - r.keys()
        assert r["input_shape"] == [cfg.batch_size, 64] and r["num_classes"] == 10
        assert r["peak_memory_gib"] is None  # CPU
        for k in ("ms_per_step", "images_per_s", "hours_1gpu", "x_grad_step"):
            assert math.isfinite(r[k]) and r[k] > 0, k
        assert r["images_per_s"] == pytest.approx(r["batch_size"] / r["ms_per_step"] * 1e3)
        assert len(r["ms_samples"]) == 2 and r["ms_per_step"] == pytest.approx(r["ms_mean"])
        assert (r["compile"], r["bf16"], r["channels_last"]) == ("eager", False, False)
        # 60 epochs of ⌊1,437 / 100⌋ steps of 100 images
        assert r["run_images"] == cfg.epochs * (1437 // cfg.batch_size) * cfg.batch_size
        assert r["hours_1gpu"] == pytest.approx(r["run_images"] / (r["images_per_s"] * 3600))
        assert r["baseline"] == "digits:sgd"
    assert rows["sgd"]["x_grad_step"] == 1.0
    assert rows["gam"]["x_grad_step"] == pytest.approx(
        rows["gam"]["ms_per_step"] / rows["sgd"]["ms_per_step"]
    )


def test_markdown_rows_give_one_and_eight_gpu_hours(digits_result):
    text = preset_markdown.rows_markdown([digits_result])
    gam = next(r for r in digits_result["rows"] if r["estimator"] == "gam")
    hours = preset_markdown.fmt_hours(gam["hours_1gpu"])
    assert "| `digits` | GAM | eager |" in text
    assert f"| {hours} | 8 runs at once, {hours} each |" in text
    assert "- `digits`: SGD " in text and f"GAM {hours} | 8 runs at once" in text
    # an ImageNet run spreads over the GPUs at the per-GPU rate given
    row = {**gam, "preset": "hp2.imagenet.vit_b32", "dataset": "imagenet", "run_images": 8 * 3600}
    assert preset_markdown.gpu_hours(row, 8, {"hp2.imagenet.vit_b32:gam": 2.0}, 0) == "0.5 h"
    assert preset_markdown.gpu_hours(row, 8, {}, 0).startswith("–")


def test_fmt_hours_keeps_two_significant_digits():
    assert [preset_markdown.fmt_hours(h) for h in (0.1612, 1.06, 11.4, 329.6, None)] == [
        "0.16 h",
        "1.1 h",
        "11 h",
        "330 h",
        "–",
    ]


def test_parse_presets_expands_globs_and_default_estimators():
    items = preset_speed.parse_presets(
        "noise.cifar10.resnet32.p*:gam,gnp.cifar100.wrn28_10,mnist1d"
    )
    assert items[:5] == [(f"noise.cifar10.resnet32.p{p}", "gam") for p in (0, 20, 40, 60, 80)]
    assert items[5:] == [("gnp.cifar100.wrn28_10", "gnp"), ("mnist1d", "sgd"), ("mnist1d", "gam")]
    assert len(preset_speed.parse_presets("transfer.*:gam")) == 10
    for bad in ("hp1.cifar10.nothing:gam", "digits:adam"):
        with pytest.raises(ValueError):
            preset_speed.parse_presets(bad)


def test_training_set_sizes_cover_every_data_set_and_the_run_lengths():
    assert set(preset_speed.TRAIN_EXAMPLES) == set(DATASETS)
    digits = len(data_mod.load(resolve(["--preset=digits"])).train)  # built in: counted, not quoted
    assert preset_speed.TRAIN_EXAMPLES["digits"][0] == digits
    transfer = preset_speed.run_images(resolve(["--preset=transfer.cars.swin_t"]))
    assert transfer["run_images"] == 40_000 * 128
    cifar = preset_speed.run_images(resolve(["--preset=hp1.cifar10.resnet18"]))
    assert cifar["run_images"] == 200 * (50_000 // 128) * 128
    imagenet = preset_speed.run_images(resolve(["--preset=hp2.imagenet.vit_b32"]))
    assert imagenet["run_images"] == 300 * (1_281_167 // 256) * 256


def test_unknown_preset_exits_2(capsys):
    assert preset_speed.main(["--presets", "hp1.cifar10.nothing", "--device", "cpu"]) == 2
    assert "no preset matches" in capsys.readouterr().err


def test_compile_phases_rank_the_compilers_own_timings():
    timed = preset_speed._compile_timings()
    timed.clear()
    torch._dynamo.reset()
    f = torch.compile(lambda x: (x.sin() * 2).sum(), backend="eager")
    f(torch.randn(8))
    phases = preset_speed.compile_phases(timed)
    assert phases, "a compile records its phases"
    seconds = [p["s"] for p in phases.values()]
    assert seconds == sorted(seconds, reverse=True)
    assert all(p["calls"] >= 1 for p in phases.values())
    assert preset_speed.compile_phases({"a": [1.0, 2.0], "b": [0.5]}, top=1) == {
        "a": {"s": 3.0, "calls": 2}
    }
