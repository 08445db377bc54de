"""Flatness metrics: Hessian spectrum, trace and eigenvalue density, R0/R1 flatness, minima density, loss landscapes.

Every metric is a pure function of ``(params, batch, loss_fn)``, the contract of the estimators,
and never modifies its inputs; each also takes ``(model, data, criterion)``, a model with one batch
or a ``DataLoader`` (the mean over all of it, [`from_model`][gamfunc.metrics.model.from_model]). ``hvp=`` picks the Hessian-vector product: a backend of
[`gamfunc.hvps`][gamfunc.hvps] or its shorthand "exact", "reverse", "fd" (``hvps.fd()``, r = 1e-3;
another radius is ``hvps.fd(radius=r)``); ``buffers=`` with ``mode="eval" | "train"`` handles BatchNorm (see
`gamfunc.metrics._common`); randomness comes from a ``generator`` (None: seeded with 0).
Pictures are in [`gamfunc.metrics.plot`][gamfunc.metrics.plot] (needs matplotlib). λ_max, the trace and R0/R1 check their
input first: on non-finite parameters, a non-finite loss, or a failed eigendecomposition they return
NaN and log one line on the ``gamfunc.metrics`` logger (`gamfunc.metrics.guard`); each has one
name, the same function here and in its module.
"""

from gamfunc.metrics import plot
from gamfunc.metrics.density import lanczos_quadrature, spectral_density
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
from gamfunc.metrics.model import Batches, DataMean, Problem, from_model

__all__ = [
    "Batches",
    "DataMean",
    "Landscape1D",
    "Landscape2D",
    "MinimaDensity",
    "Problem",
    "first_order_flatness",
    "from_model",
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
