"""Section 5.4's claim: the top-k Hessian eigenvalues and trace of each method, at mid-training
and at the end, as a table and one eigenvalue figure per method and phase."""

from __future__ import annotations

from typing import Any

import torch

from gamfunc import metrics
from reproduce.evidence.common import pm, png, table, write
from reproduce.evidence.grid import accuracy_table, run_grid


def cmd_spectra(opt) -> None:
    """Top-k Hessian eigenvalues and trace at mid-training and the end, five methods (Section 5.4)."""
    runs = run_grid(opt, opt.methods, spectra=True)
    for m, rs in runs.items():
        for phase in ("mid", "end"):
            values = torch.tensor([v for r in rs for v in r[phase]["eigenvalues"]])
            path = opt.out / f"spectra_{png(m)}_{phase}.png"
            title = f"{m}, top-{opt.k} eigenvalues, {'mid-training' if phase == 'mid' else 'end'}"
            metrics.plot.plot_eigenvalues(values, path, title=title, dpi=80)
    md = spectra_table({"runs": runs, "settings": {"k": opt.k}})
    write(opt.out, "spectra", md, {"runs": runs}, opt)


def spectra_table(record: dict[str, Any]) -> str:
    """The markdown tables of ``spectra``'s JSON (the text ``spectra`` prints): λ_max, the mean of
    the top k and the trace at mid-training and at the end per method, mean ± std over seeds, then
    the accuracy table of the same runs."""
    rows = []
    for m, rs in record["runs"].items():
        cells = [m]
        for phase in ("mid", "end"):
            cells += [
                pm([r[phase]["eigenvalues"][0] for r in rs]),
                pm([sum(r[phase]["eigenvalues"]) / len(r[phase]["eigenvalues"]) for r in rs]),
                pm([r[phase]["trace"] for r in rs], 1),
            ]
        rows.append(cells)
    k = record["settings"]["k"]
    header = ["method"] + [
        f"{c} ({p})" for p in ("mid", "end") for c in ("λ_max", f"mean top-{k}", "trace")
    ]
    return table(header, rows) + "\n" + accuracy_table(record)
