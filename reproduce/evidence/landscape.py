"""Figure vis's claim: the 2-D filter-normalised loss landscapes of the four optimisers, as figures
and a table of the loss at θ, near it and over the grid."""

from __future__ import annotations

from typing import Any

import torch

from gamfunc import metrics
from reproduce.data import sets as data_mod
from reproduce.evidence.common import (
    FOUR,
    base_config,
    check_finite,
    eval_loss,
    method_config,
    png,
    probe_batch,
    table,
    train,
    write,
)


def landscape_table(record: dict[str, Any]) -> str:
    """The markdown table of ``landscape``'s JSON: the loss at θ, the largest loss on the inner
    half of the grid ((α, β) in [-0.5, 0.5]²) and the mean over the whole grid."""
    rows = []
    for method, land in record["landscapes"].items():
        z = torch.tensor(land["losses"], dtype=torch.float64)
        points = len(z)
        c, h = points // 2, points // 4
        inner = z[c - h : c + h + 1, c - h : c + h + 1].amax()
        rows.append(
            [method, f"{float(z[c, c]):.4f}", f"{float(inner):.3f}", f"{float(z.mean()):.3f}"]
        )
    header = ["method", "loss at θ", "max loss on [-0.5, 0.5]²", "mean loss on [-1, 1]²"]
    return table(header, rows)


def cmd_landscape(opt) -> None:
    """2-D filter-normalised loss landscapes of the four optimisers (Figure vis)."""
    base = base_config(opt)
    rec = {}
    for method in FOUR:
        name, cfg = method_config(base, method, 0, opt.gnp_alpha, opt.sam_gam, opt.gam)
        r = train(cfg, name)
        batch = probe_batch(r["data"].probe, opt.probe)
        land = metrics.landscape_2d(
            r["params"], batch, eval_loss(r["loss_fn"], r["buffers"]),
            span=(-1.0, 1.0), points=opt.points, generator=data_mod.generator(0, 13),
        )  # fmt: skip
        check_finite(land.losses, "the landscape", method, "its loss overflows within the grid")
        rec[method] = dict(losses=land.losses.tolist(), alphas=land.alphas.tolist())
        metrics.plot.plot_landscape(
            land, opt.out / f"landscape_{png(method)}.png", title=method, log=True, dpi=80
        )
    record = {"landscapes": rec}
    write(opt.out, "landscape", landscape_table(record), record, opt)
