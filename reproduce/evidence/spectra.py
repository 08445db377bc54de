"""Section 5.4's claim: the top-k Hessian eigenvalues and trace of each method, at mid-training
and at the end, as a table and one eigenvalue figure per method and phase."""

from __future__ import annotations

import torch

from gamfunc import metrics
from reproduce.evidence.common import pm, png, table, write
from reproduce.evidence.grid import ACC_HEADER, accuracy_rows, run_grid


def cmd_spectra(opt) -> None:
    """Top-k Hessian eigenvalues and trace at mid-training and the end, five methods (Section 5.4)."""
    runs = run_grid(opt, opt.methods, spectra=True)
    rows = []
    for m, rs in runs.items():
        cells = [m]
        for phase in ("mid", "end"):
            cells += [
                pm([r[phase]["eigenvalues"][0] for r in rs]),
                pm([sum(r[phase]["eigenvalues"]) / len(r[phase]["eigenvalues"]) for r in rs]),
                pm([r[phase]["trace"] for r in rs], 1),
            ]
        rows.append(cells)
        for phase in ("mid", "end"):
            values = torch.tensor([v for r in rs for v in r[phase]["eigenvalues"]])
            path = opt.out / f"spectra_{png(m)}_{phase}.png"
            title = f"{m}, top-{opt.k} eigenvalues, {'mid-training' if phase == 'mid' else 'end'}"
            metrics.plot.plot_eigenvalues(values, path, title=title, dpi=80)
    header = ["method"] + [
        f"{c} ({p})" for p in ("mid", "end") for c in ("λ_max", f"mean top-{opt.k}", "trace")
    ]
    md = table(header, rows) + "\n" + table(ACC_HEADER, accuracy_rows(runs))
    write(opt.out, "spectra", md, {"runs": runs}, opt)
