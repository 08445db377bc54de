"""Section 5.1's claim: the local minima and maxima within ρ along random directions of SGD, SAM and
GAM's solutions, as a table and one figure per method."""

from __future__ import annotations

from typing import Any

from gamfunc import metrics
from reproduce.data import sets as data_mod
from reproduce.evidence.common import (
    base_config,
    check_finite,
    eval_loss,
    method_config,
    pm,
    png,
    probe_batch,
    table,
    train,
    write,
)

MINIMA_METHODS = ("SGD", "SAM", "SGD+GAM")


def minima_table(record: dict[str, Any]) -> str:
    """The markdown table of ``minima``'s JSON: extrema per direction, mean ± std over seeds."""

    def share(r, k: int) -> float:  # % of directions with at least k minima
        return 100 * sum(x >= k for x in r["minima"]) / len(r["minima"])

    rows = []
    for m, rs in record["runs"].items():
        rows.append(
            [m, pm([sum(r["minima"]) / len(r["minima"]) for r in rs], 3),
             pm([share(r, 1) for r in rs], 1), pm([share(r, 2) for r in rs], 1),
             pm([sum(r["maxima"]) / len(r["maxima"]) for r in rs], 3),
             ", ".join(f"{r['test_acc']:.1f}" for r in rs)]
        )  # fmt: skip
    header = [
        "method",
        "minima per direction",
        "directions with ≥ 1 minimum %",
        "directions with ≥ 2 minima %",
        "maxima per direction",
        "test acc % (per seed)",
    ]
    return table(header, rows)


def cmd_minima(opt) -> None:
    """Local minima and maxima within ρ along random directions, SGD, SAM and GAM (Section 5.1)."""
    base = base_config(opt)
    out: dict[str, list[dict[str, Any]]] = {}
    for method in MINIMA_METHODS:
        out[method] = []
        for seed in range(opt.seeds):
            name, cfg = method_config(base, method, seed, opt.gnp_alpha, opt.sam_gam, opt.gam)
            r = train(cfg, name)
            batch = probe_batch(r["data"].probe, opt.probe)
            d = metrics.minima_density(
                r["params"], batch, eval_loss(r["loss_fn"], r["buffers"]), opt.radius,
                directions=opt.directions, steps=10, generator=data_mod.generator(seed, 12),
            )  # fmt: skip
            # a non-finite loss is no extremum: counted, the direction would read as flat
            check_finite(
                d.losses,
                f"the extrema within ρ = {opt.radius:g}",
                f"{method} (seed {seed})",
                "give a smaller --radius",
            )
            out[method].append(
                dict(seed=seed, minima=d.minima.tolist(), maxima=d.maxima.tolist(),
                     test_acc=r["test_acc"])
            )  # fmt: skip
            if seed == 0:
                title = f"{method}: extrema within ρ = {opt.radius}"
                metrics.plot.plot_minima_density(
                    d, opt.out / f"minima_{png(method)}.png", title=title, dpi=80
                )
    record = {"runs": out}
    write(opt.out, "minima", minima_table(record), record, opt)
