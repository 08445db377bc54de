"""Every JSON file the project writes is strict JSON: null for a missing or non-finite value."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

from reproduce.run import report

ROOT = Path(__file__).resolve().parents[2]


def strict_load(text: str):
    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_values_are_written_as_null(tmp_path):
    obj = {
        "nan": float("nan"),
        "inf": -math.inf,
        "tensor": torch.tensor(float("nan")),
        "ok": torch.tensor(2.5),
        "nested": [1.0, (float("inf"), 3)],
        "path": tmp_path,
    }
    report.write_json(tmp_path / "a" / "x.json", obj)
    got = strict_load((tmp_path / "a" / "x.json").read_text())
    assert got == {
        "nan": None,
        "inf": None,
        "tensor": None,
        "ok": 2.5,
        "nested": [1.0, [None, 3]],
        "path": str(tmp_path),
    }
    assert strict_load(report.dumps({"x": float("nan")})) == {"x": None}
    with pytest.raises(ValueError, match="NaN"):
        strict_load(json.dumps({"x": float("nan")}))  # what a plain json.dumps would have written


def test_every_writer_goes_through_the_one_helper():
    """No module of the project writes JSON but through reproduce.run.report (write_json, dumps)."""
    offenders = []
    for folder in ("gamfunc", "reproduce", "benchmarks", "examples"):
        for path in (ROOT / folder).rglob("*.py"):
            if path == ROOT / "reproduce" / "run" / "report.py":
                continue
            for i, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(r"\bjson\.dumps?\(", line):
                    offenders.append(f"{path.relative_to(ROOT)}:{i}")
    assert offenders == []
