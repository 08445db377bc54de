"""Flatness metrics: Hessian spectrum, trace and eigenvalue density, R0/R1 flatness, minima density, loss landscapes.

Every metric is a pure function of ``(params, batch, loss_fn)``, the contract of the estimators,
and never modifies its inputs. ``hvp=`` picks the Hessian-vector product ("exact", "reverse",
"fd"); ``buffers=`` with ``mode="eval" | "train"`` handles BatchNorm (see
`gamfunc.metrics._common`); randomness comes from a ``generator`` (None: seeded with 0).
Pictures are in [`gamfunc.metrics.plot`][gamfunc.metrics.plot] (needs matplotlib). λ_max, the trace and R0/R1 check their
input first: on non-finite parameters, a non-finite loss, or a failed eigendecomposition they return
NaN and log one line on the ``gamfunc.metrics`` logger (`gamfunc.metrics.guard`).
"""

from gamfunc.metrics import flatness, hessian, plot
from gamfunc.metrics.density import lanczos_quadrature, spectral_density
from gamfunc.metrics.guard import measurable
from gamfunc.metrics.landscape import (
    Landscape1D,
    Landscape2D,
    landscape_1d,
    landscape_2d,
    random_direction,
)
from gamfunc.metrics.minima import MinimaDensity, minima_density

# Each of these gives NaN with one logged line on weights it cannot measure (gamfunc.metrics.guard).
top_eigenvalues = measurable(hessian._k, pair="return_eigenvectors")(hessian.top_eigenvalues)
hessian_trace = measurable()(hessian.hessian_trace)
first_order_flatness = measurable(pair="return_point")(flatness.first_order_flatness)
zeroth_order_flatness = measurable()(flatness.zeroth_order_flatness)

__all__ = [
    "Landscape1D",
    "Landscape2D",
    "MinimaDensity",
    "first_order_flatness",
    "hessian_trace",
    "lanczos_quadrature",
    "landscape_1d",
    "landscape_2d",
    "minima_density",
    "plot",
    "random_direction",
    "spectral_density",
    "top_eigenvalues",
    "zeroth_order_flatness",
]
