"""Table cifar2's claim: train and test accuracy and the generalisation gap of each method (or
those of a spectra run's JSON, reused)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from reproduce.evidence.common import write
from reproduce.evidence.grid import accuracy_table, run_grid

# what the accuracy table reads of each run: finite numbers
KEYS = ("train_acc", "test_acc", "gap", "step_ms")


def reused_runs(path: Path) -> dict[str, list[dict[str, Any]]]:
    """The runs of the spectra (or accuracy) JSON at ``path``: ``{method: [run, ...]}``, each run a
    record with the finite numbers of `KEYS`.

    Raises:
        ValueError: the file cannot be read or parsed, or holds no such runs; one line naming
            ``--reuse`` and what is wrong.
    """
    where = f"--reuse={path}"
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{where}: cannot read it ({e})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not JSON ({e})") from None
    runs = record.get("runs") if isinstance(record, dict) else None
    if not isinstance(runs, dict) or not runs:
        raise ValueError(f"{where}: no runs (a JSON object whose 'runs' maps methods to lists)")
    for method, rs in runs.items():
        if not isinstance(rs, list) or not rs or not all(isinstance(r, dict) for r in rs):
            raise ValueError(f"{where}: the runs of {method} are not a list of records")
        for i, r in enumerate(rs):
            for key in KEYS:
                v = r.get(key)
                if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                    raise ValueError(
                        f"{where}: run {i} of {method} has {key}={v!r}, not a finite number"
                    )
    return runs


def cmd_accuracy(opt) -> None:
    """Train/test accuracy and generalisation gap of the five methods (Table cifar2)."""
    source = Path(opt.reuse) if opt.reuse else None
    if source is not None and source.is_file():
        runs = reused_runs(source)
    else:
        runs = run_grid(opt, opt.methods, spectra=False)
    write(opt.out, "accuracy", accuracy_table({"runs": runs}), {"runs": runs}, opt)
