"""reproduce/evidence.py: every subcommand's --quick mode writes its table, JSON and figures, all finite."""

from __future__ import annotations

import json
import math
import re

import pytest

from reproduce import evidence

# subcommand -> the PNG files it must write in --quick mode
FIGURES = {
    "spectra": [
        f"spectra_{evidence.png(m)}_{p}.png" for m in evidence.METHODS for p in ("mid", "end")
    ],
    "accuracy": [],
    "noise": [],
    "minima": ["minima_sgd.png", "minima_sgd_gam.png"],
    "landscape": [f"landscape_{evidence.png(m)}.png" for m in evidence.FOUR],
    "ablation": [],
    "variants": [],
}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def numbers(obj):
    """Every int or float inside a JSON value."""
    if isinstance(obj, bool):
        return
    if isinstance(obj, int | float):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from numbers(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from numbers(v)


def table_cells(md: str) -> list[str]:
    """The body cells of every markdown table in ``md`` (not the header or the rule)."""
    cells = []
    for block in re.split(r"\n\s*\n", md):
        rows = [r for r in block.splitlines() if r.startswith("|")]
        for row in rows[2:]:
            cells += [c.strip() for c in row.strip("|").split("|")][1:]
    return cells


@pytest.mark.parametrize("command", list(evidence.SUBCOMMANDS))
def test_quick_writes_finite_table_json_and_figures(command, tmp_path):
    assert evidence.main([command, "--quick", "--threads=1", f"--out={tmp_path}"]) == 0
    md = (tmp_path / f"{command}.md").read_text()
    record = json.loads((tmp_path / f"{command}.json").read_text())

    values = list(numbers(record))
    assert values, "the JSON holds no numbers"
    assert all(math.isfinite(v) for v in values)
    assert record["seconds"] > 0 and record["settings"]["quick"] is True

    cells = table_cells(md)
    assert cells, "the markdown holds no table"
    for cell in cells:
        for text in re.findall(r"-?\d+(?:\.\d+)?|nan|inf", cell):
            assert math.isfinite(float(text)), (command, cell)

    for name in FIGURES[command]:
        data = (tmp_path / name).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 1000, name


def test_accuracy_reuses_the_runs_of_spectra(tmp_path):
    spectra = {"runs": {"SGD": [dict(train_acc=100.0, test_acc=60.0, gap=40.0, step_ms=1.0)]}}
    (tmp_path / "spectra.json").write_text(json.dumps(spectra))
    out = tmp_path / "acc"
    evidence.main(["accuracy", f"--reuse={tmp_path / 'spectra.json'}", f"--out={out}"])
    md = (out / "accuracy.md").read_text()
    assert "| SGD | 100.00 ± 0.00 | 60.00 ± 0.00 | 40.00 ± 0.00 | 1.0 |" in md


def test_unknown_subcommand_is_refused():
    with pytest.raises(SystemExit):
        evidence.main(["nonsense"])
