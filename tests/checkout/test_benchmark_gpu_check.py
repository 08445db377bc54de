"""``python -m benchmarks.gpu_check``: the GPU check's cases (tests/gpu_check.py) written as a
benchmark result, with the run's metadata, for benchmarks/report.py."""

from __future__ import annotations

import json

import gpu_check
import pytest

from benchmarks import gpu_check as command


def test_the_command_writes_the_rows_and_a_summary_of_them(tmp_path, monkeypatch, capsys):
    rows = [
        {
            "model": "vit",
            "precision": "fp32",
            "mode": "eager",
            "estimator": "sam",
            "status": "pass",
        },
        {
            "model": "vit",
            "precision": "bf16",
            "mode": "eager",
            "estimator": "sam",
            "status": "fail",
        },
    ]
    asked = {}

    def run_all(device, size, models, names):
        asked.update(device=device, size=size, models=models, names=names)
        return rows

    monkeypatch.setattr(gpu_check, "run_all", run_all)
    out = tmp_path / "check.json"
    argv = ["--device", "cpu", "--models", "vit", "--estimators", "sam", "--size", "8"]
    assert command.main([*argv, "--out", str(out)]) == 1  # a case failed
    assert asked == {"device": "cpu", "size": 8, "models": ("vit",), "names": ["sam"]}
    result = json.loads(out.read_text())
    assert result["benchmark"] == "gpu_check" and result["rows"] == rows
    meta = result["meta"]
    assert (meta["slug"], meta["passed"], meta["failed"]) == ("cpu", 1, 1)
    assert capsys.readouterr().out.startswith("gpu_check: 1 passed, 1 failed in ")


def test_a_model_it_does_not_know_is_refused():
    with pytest.raises(SystemExit) as e:
        command.main(["--device", "cpu", "--models", "resnet,mlp"])
    assert e.value.code == 2
