"""The documents say what the registry and the committed result files say.

README.md's preset table is regenerated from ``reproduce.config.PRESETS``; reproduce/README.md names
the source of every preset family; the main job's table and the evidence tables of
reproduce/RESULTS.md are recomputed from their JSON under ``docs/evidence/``; numbers in prose are
checked against the JSON they come from.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest

from reproduce.config import PRESETS
from reproduce.preset_table import SOURCES, families, markdown

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
REPRODUCE_README = (ROOT / "reproduce" / "README.md").read_text()
RESULTS = (ROOT / "reproduce" / "RESULTS.md").read_text()
EVIDENCE = ROOT / "docs" / "evidence"


def between(text: str, start: str, end: str) -> str:
    """The text after the line holding ``start`` and before the line holding ``end``."""
    head = text.index(start)
    body = text.index("\n", head) + 1
    return text[body : text.index(end, body)]


def expand(pattern: str) -> list[str]:
    """``a.{b,c}.d`` -> ``["a.b.d", "a.c.d"]``."""
    parts = [p.split(",") for p in re.split(r"[{}]", pattern)]
    # split on braces alternates literal text and alternatives: literals are one-element lists
    return ["".join(t) for t in itertools.product(*parts)]


def test_readme_preset_table_is_generated_from_the_registry():
    table = between(README, "<!-- preset table:", "<!-- end of preset table -->")
    assert table == markdown(), "run: python -m reproduce.preset_table, paste into README.md"


def test_every_preset_family_names_its_source():
    assert set(families()) <= set(SOURCES)
    names = [n for group in families().values() for n in group]
    assert sorted(names) == sorted(PRESETS)


def test_reproduce_readme_gives_the_provenance_of_every_preset():
    section = REPRODUCE_README.split("## Where each preset's values come from", 1)[1]
    rows = [r for r in section.splitlines() if r.startswith("| `")]
    named = [n for r in rows for n in expand(r.split("`")[1])]
    assert sorted(named) == sorted(PRESETS), "one row per family, every preset once"
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert len(cells) == 4 and any(c != "–" for c in cells[1:]), row


# ---------------------------------------------------------------- results from committed JSON


def test_readme_main_job_table_is_the_committed_run():
    """The table is ``report.table`` of docs/evidence/main_job.json (its 2-decimal rounding), and
    train.py's docstring shows the same rows."""
    report = pytest.importorskip("reproduce.report")
    summaries = json.loads((EVIDENCE / "main_job.json").read_text())
    expected = report.table(summaries)
    section = README.split("### Main job", 1)[1]
    block = re.search(r"\n```\n(estimator .*?)\n```", section, flags=re.S)
    assert block is not None and block.group(1) == expected
    train_doc = (ROOT / "reproduce" / "train.py").read_text()
    for row in expected.splitlines()[2:]:
        assert f"    {row}\n" in train_doc
    assert [s["status"] for s in summaries] == ["finished", "finished"]
    assert [s["config"]["preset"] for s in summaries] == ["mnist1d", "mnist1d"]
