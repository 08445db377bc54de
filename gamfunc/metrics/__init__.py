"""Flatness metrics: Hessian spectrum and trace, R0/R1 flatness, minima density, loss landscapes.

Every metric is a pure function of ``(params, batch, loss_fn)``, the contract of the estimators,
and never modifies its inputs. ``hvp=`` picks the Hessian-vector product ("exact", "reverse",
"fd"); ``buffers=`` with ``mode="eval" | "train"`` handles BatchNorm (see
:mod:`gamfunc.metrics.hessian`); randomness comes from a ``generator`` (None: seeded with 0).
Pictures are in :mod:`gamfunc.metrics.plot` (needs matplotlib).
"""

from gamfunc.metrics import plot
from gamfunc.metrics.flatness import first_order_flatness, zeroth_order_flatness
from gamfunc.metrics.hessian import hessian_trace, top_eigenvalues
from gamfunc.metrics.landscape import (
    Landscape1D,
    Landscape2D,
    landscape_1d,
    landscape_2d,
    random_direction,
)
from gamfunc.metrics.minima import MinimaDensity, minima_density

__all__ = [
    "Landscape1D",
    "Landscape2D",
    "MinimaDensity",
    "first_order_flatness",
    "hessian_trace",
    "landscape_1d",
    "landscape_2d",
    "minima_density",
    "plot",
    "random_direction",
    "top_eigenvalues",
    "zeroth_order_flatness",
]
