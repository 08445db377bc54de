"""The README's CPU route installs torch and torchvision as one pinned pair from the CPU wheels, the
pair its test route installs, and the extras never ask for a newer torchvision than that pair holds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CPU = (
    "pip install torch==2.14.1 torchvision==0.29.1 --index-url https://download.pytorch.org/whl/cpu"
)


def test_the_readme_installs_the_cpu_pair_together():
    """Pinned, from the CPU wheels, before the commands whose resolution it changes."""
    readme = " ".join(README.split())
    assert CPU in readme
    assert readme.index(CPU) < readme.index('pip install -e ".[')
    assert 'pip install --dry-run -e ".[reproduce]"' in readme


def test_the_cpu_route_pins_the_pair_of_the_test_route():
    pairs = re.findall(r"^pip install (torch==\S+ torchvision==\S+)", README, flags=re.M)
    assert len(pairs) >= 2 and len(set(pairs)) == 1, pairs


def test_torchvision_is_asked_for_with_a_floor_only():
    """An upper bound or a pin could make pip replace the installed CPU pair."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from 3.11")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [
        r
        for extra in project["optional-dependencies"].values()
        for r in extra
        if re.match(r"torch(vision)?\b", r)
    ] + [r for r in project["dependencies"] if re.match(r"torch(vision)?\b", r)]
    assert wanted, "torch and torchvision are required somewhere"
    for requirement in wanted:
        assert re.fullmatch(r"torch(vision)?>=[0-9.]+", requirement), requirement
