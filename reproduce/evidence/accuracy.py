"""Table cifar2's claim: train and test accuracy and the generalisation gap of each method (or
those of a spectra run's JSON, reused)."""

from __future__ import annotations

import json
from pathlib import Path

from reproduce.evidence.common import write
from reproduce.evidence.grid import accuracy_table, run_grid


def cmd_accuracy(opt) -> None:
    """Train/test accuracy and generalisation gap of the five methods (Table cifar2)."""
    source = Path(opt.reuse) if opt.reuse else None
    if source is not None and source.is_file():
        runs = json.loads(source.read_text())["runs"]
    else:
        runs = run_grid(opt, opt.methods, spectra=False)
    write(opt.out, "accuracy", accuracy_table({"runs": runs}), {"runs": runs}, opt)
