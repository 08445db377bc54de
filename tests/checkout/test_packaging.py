"""The test suite with ``[dev]`` alone: tests that need an optional package skip, naming it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import OPTIONAL

ROOT = Path(__file__).resolve().parents[2]
# -n 0: the suite's -n auto would start workers that each import torch and collect it all again
PYTEST = (sys.executable, "-m", "pytest", "-q", "-n", "0")
PYTEST += ("-p", "no_extras", "-p", "no:cacheprovider")


@pytest.mark.slow
def test_collection_with_dev_alone_skips_instead_of_failing(tmp_path):
    """Collect the suite with the optional packages made unimportable (``sys.modules[name] = None``
    is what an absent package looks like to ``import`` and to ``importlib.util.find_spec``)."""
    (tmp_path / "no_extras.py").write_text(
        textwrap.dedent(f"""
            import sys
            for name in {OPTIONAL!r}:
                for loaded in [m for m in sys.modules if m.split(".")[0] == name]:
                    del sys.modules[loaded]
                sys.modules[name] = None
        """)
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run(
        [*PYTEST, "--collect-only", "-rs", str(ROOT / "tests")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "error" not in out.stdout.splitlines()[-1].lower()


@pytest.mark.slow
def test_readme_blocks_with_dev_alone_skip_instead_of_failing(tmp_path):
    """The README blocks that use reproduce/ or scikit-learn skip where those are not installed."""
    (tmp_path / "no_extras.py").write_text(
        f"import sys\nfor name in {OPTIONAL!r}:\n    sys.modules[name] = None\n"
    )
    out = subprocess.run(
        [*PYTEST, str(ROOT / "tests" / "checkout" / "test_readme.py")],
        cwd=ROOT,
        # one thread: the blocks' small trainings otherwise contend for the cores with the
        # suite's other worker and take several times as long
        env={**os.environ, "PYTHONPATH": str(tmp_path), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]


def test_importing_gamfunc_leaves_the_compiler_unloaded():
    # torch's compiler (dynamo, inductor) costs about 1.5 s to import: a process that never compiles
    # (a worker, a data loader, a metrics script) must not pay for it.
    code = "import sys, gamfunc; print([m for m in ('torch._dynamo', 'torch._inductor') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def project() -> dict:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from 3.11")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_metadata_names_licence_python_versions_topic_and_typing():
    """PEP 639's licence (an SPDX expression and its file, no deprecated table), the classifiers
    an index filters by, keywords and an author."""
    meta = project()
    assert meta["license"] == "Apache-2.0" and meta["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").is_file()
    classifiers = meta["classifiers"]
    assert "Typing :: Typed" in classifiers and (ROOT / "gamfunc" / "py.typed").is_file()
    assert any(c.startswith("Topic :: ") for c in classifiers)
    floor = re.fullmatch(r">=3\.(\d+)", meta["requires-python"]).group(1)
    assert f"Programming Language :: Python :: 3.{floor}" in classifiers
    # setuptools refuses a licence classifier beside a licence expression
    assert not any(c.startswith("License :: ") for c in classifiers)
    assert meta["keywords"] and meta["authors"] == [{"name": "gamfunc developers"}]


def test_the_version_is_written_once():
    """pyproject.toml reads the version from gamfunc.__version__, the one place it is written."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from 3.11")
    whole = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in whole["project"] and "version" in whole["project"]["dynamic"]
    assert whole["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "gamfunc.__version__"}
    # setuptools reads a literal assignment without importing gamfunc (and torch)
    written = re.findall(
        r'^__version__ = "([^"]+)"$', (ROOT / "gamfunc" / "__init__.py").read_text(), re.M
    )
    assert len(written) == 1 and re.fullmatch(r"\d+\.\d+\.\d+", written[0]), written


def test_the_index_description_has_no_link_an_index_page_cannot_follow():
    """The long description is shown on an index page, where a link relative to the repository
    leads nowhere: each of its links is absolute."""
    readme = ROOT / project()["readme"]
    links = re.findall(r"\]\(([^)\s]+)\)", readme.read_text())
    assert all(re.match(r"https?://", link) for link in links), links
    assert "reproduce" in readme.read_text()  # it says what the checkout's extras are
