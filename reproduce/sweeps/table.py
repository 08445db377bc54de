"""A sweep's table: the runs' outcomes as mean ± std over seeds per cell, the cell selected on validation.

Shared by ``reproduce/sweep.py`` and ``reproduce/sweeps/vmap_grid.py``; it writes ``sweep.md`` and
``sweep.json``.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from reproduce.run import report
from reproduce.sweeps.plan import Cell, Run, SweepError

__all__ = [
    "METRICS",
    "aggregate",
    "every_cell_diverged",
    "markdown",
    "outcome",
    "select",
    "write_tables",
]

# metric -> (where in summary.json, the validation key, the test key read beside it, its description)
METRICS = {
    "val_acc": ("final", "val_acc", "test_acc", "the last epoch's validation accuracy"),
    "best_val_acc": ("best_val", "val_acc", "test_acc", "the best epoch's validation accuracy"),
}


def _mean_std(xs: list[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (n − 1; None for fewer than two values)."""
    if not xs:
        return None, None
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, None
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def aggregate(runs: list[Run], outcomes: dict[int, dict[str, Any]], seeds: list[int]) -> list[dict]:
    """One row per cell: ``{"cell", "values", "seeds" {seed: outcome}, "n", "val_mean", "val_std",
    "test_mean", "test_std", "status"}``.

    ``outcomes[i]`` is run i's ``{"status", "val", "test", ...}``; status is ``complete`` when every
    seed finished, else ``diverged``, ``failed`` or ``incomplete``.
    """
    rows: dict[Cell, dict] = {}
    for i, run in enumerate(runs):
        row = rows.setdefault(
            run.cell, {"cell": run.cell.label, "values": dict(run.cell.values), "seeds": {}}
        )
        row["seeds"][str(run.seed)] = outcomes.get(i, {"status": "not run"})
    for row in rows.values():
        ok = [o for o in row["seeds"].values() if o["status"] == "finished"]
        row["n"] = len(ok)
        row["val_mean"], row["val_std"] = _mean_std([o["val"] for o in ok])
        row["test_mean"], row["test_std"] = _mean_std(
            [o["test"] for o in ok if o["test"] is not None]
        )
        statuses = {o["status"] for o in row["seeds"].values()}
        row["status"] = (
            "complete"
            if len(ok) == len(seeds)
            else next((s for s in ("diverged", "failed") if s in statuses), "incomplete")
        )
    return list(rows.values())


def select(rows: list[dict]) -> dict | None:
    """The cell of highest mean validation metric among complete cells (first in grid order on a
    tie), or None. Reads ``val_mean`` only: the test metric plays no part."""
    best = None
    for row in rows:
        # means equal up to float rounding (1e-9 points) count as a tie: the first cell stays
        if row["status"] == "complete" and (
            best is None or row["val_mean"] > best["val_mean"] + 1e-9
        ):
            best = row
    return best


def every_cell_diverged(rows: list[dict]) -> bool:
    """Whether nothing can be selected because every cell has a run that diverged (a sweep then
    exits 3, as ``train.py`` does for a run that did not train)."""
    return bool(rows) and all(row["status"] == "diverged" for row in rows)


def _pm(mean: float | None, std: float | None) -> str:
    """``mean ± std`` to two decimals, ``–`` for a missing value."""
    if mean is None:
        return "–"
    return f"{mean:.2f} ± {std:.2f}" if std is not None else f"{mean:.2f} ± –"


def _test_name(metric: str) -> str:
    """The name of the test value reported beside ``metric``."""
    return "test_acc" if metric == "val_acc" else "test_acc at best val"


def markdown(
    rows: list[dict], keys: list[str], metric: str, chosen: dict | None, caption: str
) -> str:
    """The sweep's table in Markdown: one row per cell, mean ± std over seeds of ``metric`` and of the
    test accuracy beside it, the selected cell marked."""
    head = [*keys, "seeds", f"{metric} (%)", f"{_test_name(metric)} (%)", "note"]
    lines = [
        caption,
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---:|" * (len(head) - 1) + ":--|",
    ]
    for row in rows:
        mark = (
            "selected" if row is chosen else ("" if row["status"] == "complete" else row["status"])
        )
        cells = [
            *(row["values"][k] for k in keys),
            str(row["n"]),
            _pm(row["val_mean"], row["val_std"]),
            _pm(row["test_mean"], row["test_std"]),
            mark,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def outcome(run: Run, summary: dict | None, code: int | None, why: str, metric: str) -> dict:
    """What the table needs of one run: status, the validation and test values, its folder."""
    out: dict[str, Any] = {"run_dir": str(run.run_dir)}
    if summary is None:
        # exit 0 without a finished summary: stopped early by --max_steps
        status = {0: "unfinished", 3: "diverged", None: "not run"}.get(code, "failed")
        if code is not None and code > 128:
            status = "stopped"
        return out | {"status": status, "exit": code, "why": why or None}
    where, val_key, test_key, _ = METRICS[metric]
    record = summary.get(where) or {}
    if record.get(val_key) is None:
        raise SweepError(f"{run.run_dir}/summary.json has no {where}.{val_key}")
    return out | {
        "status": "finished",
        "val": record[val_key],
        "test": record.get(test_key),
        "epoch": record.get("epoch"),
    }


def write_tables(
    opts: argparse.Namespace,
    rest: list[str],
    grid: list[tuple[str, list[str]]],
    name: str,
    root: Path,
    runs: list[Run],
    outcomes: dict[int, dict[str, Any]],
    counts: dict[str, int],
    how: str = "",
    extra: dict[str, Any] | None = None,
) -> list[dict]:
    """Aggregate ``outcomes`` (run index -> `outcome`), select on validation, write
    ``sweep.md`` and ``sweep.json`` (to ``--out`` or ``root``) and print the table and the selection;
    returns the rows (`aggregate`).

    ``how`` ends the table's caption (how the runs were trained); ``extra`` joins the JSON."""
    rows = aggregate(runs, outcomes, opts.seeds)
    chosen = select(rows)
    keys = [k for k, _ in grid]
    est = runs[0].config.estimator if len({r.config.estimator for r in runs}) == 1 else "estimators"
    caption = (
        f"Sweep `{name}`: {est} on {runs[0].config.dataset}, seeds {', '.join(map(str, opts.seeds))}; "
        f"mean ± sample std over seeds of {METRICS[opts.metric][3]} ({opts.metric}, selects) and "
        f"of the test accuracy beside it (reported only).{how}"
    )
    table = markdown(rows, keys, opts.metric, chosen, caption)
    out_dir = Path(opts.out).expanduser() if opts.out else root
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "sweep.md").write_text(table + "\n")
    report.write_json(
        out_dir / "sweep.json",
        {
            "name": name,
            "metric": opts.metric,
            "test_metric": _test_name(opts.metric),
            "grid": dict(grid),
            "seeds": opts.seeds,
            "train_args": rest,
            "runs": counts,
            **(extra or {}),
            "cells": rows,
            "selected": chosen
            and {
                k: chosen[k]
                for k in ("cell", "values", "val_mean", "val_std", "test_mean", "test_std")
            },
        },
    )
    print()
    print(table)
    print()
    if chosen is not None:
        print(
            f"selected {' '.join(f'{k}={v}' for k, v in chosen['values'].items())}: {opts.metric} "
            f"{_pm(chosen['val_mean'], chosen['val_std'])} ({chosen['n']} seeds); "
            f"{_test_name(opts.metric)} beside it {_pm(chosen['test_mean'], chosen['test_std'])}"
        )
    elif every_cell_diverged(rows):
        print("every cell has a run that diverged: nothing selected")
    else:
        print("no cell finished every seed: nothing selected")
    print(f"tables in {out_dir / 'sweep.md'} and {out_dir / 'sweep.json'}")
    return rows
