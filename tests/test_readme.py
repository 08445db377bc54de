"""Every ```python block of README.md runs (a block whose first line is `# not run in tests` is skipped)."""

import re
from pathlib import Path

import pytest
from helpers import OPTIONAL

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index, tmp_path, monkeypatch):
    code = BLOCKS[index]
    if code.startswith("# not run in tests"):
        pytest.skip("marked as not run in tests")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs").mkdir()  # where the examples write their pictures
    try:
        exec(compile(code, f"README.md block {index}", "exec"), {"__name__": "__readme__"})
    except ModuleNotFoundError as e:
        package = (e.name or "").split(".")[0]
        if package not in OPTIONAL:
            raise
        pytest.skip(f'needs {package}: pip install -e ".[reproduce]"')
