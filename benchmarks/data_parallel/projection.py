"""Data-parallel efficiency and wall-clock projected to more GPUs than were measured.

From the reports of :mod:`benchmarks.data_parallel`: a projection, not a measurement (:func:`project`).

    python -m benchmarks.data_parallel.projection benchmarks/results/data_parallel_4xh200.json \\
        benchmarks/results/data_parallel_2xh200.json --to 8
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from reproduce.run.report import dumps

__all__ = ["IMAGENET_TRAIN", "hours", "main", "project", "projections"]

IMAGENET_TRAIN = 1_281_167


def project(points: dict[int, float], n: int) -> float:
    """A projection, not a measurement: the efficiency at ``n`` GPUs from measured ``{gpus:
    efficiency}``. The step's time beyond the 1-GPU step, t₁(1/e − 1) at the largest measured count
    m, is taken as exposed all-reduce time, which a ring all-reduce at the same bus bandwidth scales
    by 2(n−1)/n ÷ 2(m−1)/m (×1.17 from 4 GPUs to 8, ×1.75 from 2 to 8); the compute per GPU is the
    same at any count."""
    m = max(points)
    exposed = (1 / points[m] - 1) * ((n - 1) / n) / ((m - 1) / m)
    return 1 / (1 + exposed)


def hours(rate_1: float, eff: float, n: int, epochs: int, examples: int = IMAGENET_TRAIN) -> float:
    """Wall-clock hours of ``epochs`` passes over ``examples`` on ``n`` GPUs, each GPU alone at
    ``rate_1`` images/s and together at efficiency ``eff`` (evaluation and compilation left out)."""
    return epochs * examples / (n * rate_1 * eff) / 3600


def projections(paths: list[str], n: int = 8) -> list[dict]:
    """For each row (run, perturbation) of the reports at ``paths``: its measured efficiencies by
    GPU count, the 1-GPU rate of the report with the most GPUs, the efficiency projected (:func:`project`)
    to ``n`` GPUs, and the hours of 90 epochs (ResNet-50's recipe) and 300 (ViT's) at that rate."""
    rows: dict[tuple, dict] = {}
    for path in paths:
        for r in json.loads(Path(path).read_text())["rows"]:
            if "efficiency" not in r:
                continue
            gpus = r.get("gpus", r["many"].get("world"))
            row = rows.setdefault((r["run"], r["perturbation"]), {"efficiency": {}})
            row["efficiency"][gpus] = r["efficiency"]
            if gpus >= max(row["efficiency"]):
                row["rate_1"] = r["one"]["images_per_s"]
    out = []
    for (run, pert), row in rows.items():
        eff = project(row["efficiency"], n)
        out.append(
            {
                "run": run,
                "perturbation": pert,
                **row,
                f"projected_efficiency_{n}": round(eff, 3),
                f"projected_images_per_s_{n}": round(n * row["rate_1"] * eff),
                "hours_90_epochs": round(hours(row["rate_1"], eff, n, 90), 2),
                "hours_300_epochs": round(hours(row["rate_1"], eff, n, 300), 2),
            }
        )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reports", nargs="+", help="JSON reports of python -m benchmarks.data_parallel")
    ap.add_argument("--to", type=int, default=8, help="GPUs")
    a = ap.parse_args(argv)
    for row in projections(a.reports, a.to):
        print(dumps(row, indent=None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
