"""Appendix C.2's claim: the test accuracy of the four optimisers under label noise."""

from __future__ import annotations

from reproduce.evidence.common import FOUR, pm, table, write
from reproduce.evidence.grid import run_grid


def cmd_noise(opt) -> None:
    """Test accuracy under 20/40/60/80% label noise (Appendix C.2)."""
    levels = [float(x) for x in opt.levels.split(",")]
    runs = {f"{p:.0%}": run_grid(opt, list(FOUR), spectra=False, label_noise=p) for p in levels}
    header = ["label noise"] + [f"{m} test %" for m in FOUR]
    rows = [[lvl] + [pm([r["test_acc"] for r in by[m]]) for m in FOUR] for lvl, by in runs.items()]
    write(opt.out, "noise", table(header, rows), {"runs": runs}, opt)
