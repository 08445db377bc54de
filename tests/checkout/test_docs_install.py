"""The README's CPU route installs torch and torchvision as one pinned pair from the CPU wheels, the
pair its test route installs, and the extras never ask for a newer torchvision than that pair holds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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


def readme_ci_block() -> list[str] | None:
    """The lines of the README's fenced ``bash`` block right after the line that says "What CI
    runs" (blank lines left out), or None where the README has no such block."""
    lines = (ROOT / "README.md").read_text().splitlines()
    for i, line in enumerate(lines):
        if "What CI runs" not in line:
            continue
        rest = [text for text in lines[i + 1 :] if text.strip()]
        if not rest or rest[0].strip() != "```bash" or "```" not in rest[1:]:
            return None
        return rest[1 : rest.index("```", 1)]
    return None


def test_ci_runs_the_readme_commands_verbatim():
    """.ci/run holds the README's set-up and test block as it is, its lines in a row."""
    block = readme_ci_block()
    if block is None:
        pytest.xfail('README.md has no ```bash block after a line saying "What CI runs"')
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    runs = [ci[i : i + len(block)] for i in range(len(ci) - len(block) + 1)]
    assert block in runs, "\n".join(["the README's block, not in .ci/run:", *block])


def test_the_readme_says_what_to_do_where_the_cpu_index_is_unreachable():
    """Before the CI block: the default build of the same pair from the index at hand, a line of
    its own, and the quick tests of the tests guide."""
    setup = README[: README.index("What CI runs")]
    fallback = re.findall(
        r"^pip install torch==\S+ torchvision==\S+(?=\s|$)(?! --index-url)", setup, flags=re.M
    )
    assert fallback, "no line installing the default build where the CPU index is unreachable"
    assert setup.index(CPU) < setup.index(fallback[0] + "  #")
    guide = (ROOT / "docs" / "guides" / "testing.md").read_text()
    assert 'python -m pytest -m "not slow"' in guide
    assert '-m "not slow"' in " ".join(setup.split())
    assert "docs/guides/testing.md#running-the-tests" in setup
