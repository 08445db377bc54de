"""README's table of estimators is the rows that the estimators declare beside their factories
(``SUMMARY``, a `gamfunc.estimators.base.Summary`): a new estimator brings its own row."""

import sys
from pathlib import Path

import gamfunc.estimators as E
from gamfunc.estimators.base import Summary

ROOT = Path(__file__).resolve().parents[2]
HEADER = "| factory | direction | gradients a step |\n|---|---|---|\n"


def factories() -> list:
    """Every estimator factory of `gamfunc.estimators`, in the order of its ``__all__``."""
    return [f for n in E.__all__ if callable(f := getattr(E, n)) and not isinstance(f, type)]


def table() -> str:
    rows = []
    for f in factories():
        s = sys.modules[f.__module__].SUMMARY
        rows.append(f"| `{s.call}` | {s.computes} | {s.passes} |\n")
    return HEADER + "".join(rows)


def test_every_factory_declares_its_row():
    for f in factories():
        summary = getattr(sys.modules[f.__module__], "SUMMARY", None)
        assert isinstance(summary, Summary), (
            f"{f.__module__}: SUMMARY = Summary(call, computes, passes)"
        )
        assert summary.call.startswith(f"gamfunc.{f.__name__}("), summary.call


def test_the_readme_table_is_the_declared_rows():
    assert table() in (ROOT / "README.md").read_text(), (
        "README.md's table of estimators, from each estimator's SUMMARY:\n" + table()
    )
