"""Appendix C.2's claim: the test accuracy of the four optimisers under label noise."""

from __future__ import annotations

from typing import Any

from reproduce.evidence.common import FOUR, pm, table, write
from reproduce.evidence.grid import run_grid


def cmd_noise(opt) -> None:
    """Test accuracy under 20/40/60/80% label noise (Appendix C.2)."""
    levels = [float(x) for x in opt.levels.split(",")]
    runs = {f"{p:.0%}": run_grid(opt, list(FOUR), spectra=False, label_noise=p) for p in levels}
    write(opt.out, "noise", noise_table({"runs": runs}), {"runs": runs}, opt)


def noise_table(record: dict[str, Any]) -> str:
    """The markdown table of ``noise``'s JSON: test accuracy per label-noise level and method."""
    header = ["label noise"] + [f"{m} test %" for m in FOUR]
    rows = [
        [lvl] + [pm([r["test_acc"] for r in by[m]]) for m in FOUR]
        for lvl, by in record["runs"].items()
    ]
    return table(header, rows)
