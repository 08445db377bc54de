"""Every ```python block of README.md and of the guides under docs/ runs.

A block is collected from its opening fence to the closing one and executed on its own, in a fresh
namespace, from an empty temporary folder (so nothing is written into the checkout). A block that cannot
run in CI says so on its first line, with the reason: a comment that starts ``# not run in tests``
(for example ``# not run in tests: needs torchrun``); it is skipped and reported with that reason.
"""

import re
from pathlib import Path

import pytest
from helpers import OPTIONAL

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MARKER = "# not run in tests"


def blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), flags=re.S | re.M)


CASES = [(p, i) for p in DOCS for i in range(len(blocks(p)))]


def test_the_readme_and_the_guides_have_blocks_to_run():
    names = {p.relative_to(ROOT).as_posix() for p, _ in CASES}
    assert {"README.md", "docs/guides/concepts.md", "docs/migration.md"} <= names


@pytest.mark.parametrize(
    ("doc", "index"), CASES, ids=[f"{p.relative_to(ROOT).as_posix()}-{i}" for p, i in CASES]
)
def test_doc_example_runs(doc, index, tmp_path, monkeypatch):
    code = blocks(doc)[index]
    if code.startswith(MARKER):
        pytest.skip(code.splitlines()[0].removeprefix("# "))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs").mkdir()  # where the examples write their pictures
    name = f"{doc.relative_to(ROOT).as_posix()} block {index}"
    try:
        exec(compile(code, name, "exec"), {"__name__": "__readme__"})
    except ModuleNotFoundError as e:
        package = (e.name or "").split(".")[0]
        if package not in OPTIONAL:
            raise
        pytest.skip(f'needs {package}: pip install -e ".[reproduce]"')
