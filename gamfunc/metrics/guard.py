"""Metrics on weights that cannot be measured: NaN with one logged line, never a traceback.

A diverged run ends with non-finite parameters, or finite ones at which the loss overflows; a
Lanczos or Hutchinson run on them fails deep inside ``torch.linalg.eigh`` or returns garbage. Each
metric decorated with `measurable` checks its input first (every parameter finite, the loss at
θ finite) and catches a failed eigendecomposition; in each case it returns NaN of the metric's shape
and logs one line on the ``gamfunc.metrics`` logger saying why.
"""

from __future__ import annotations

import functools
import logging

import torch

from gamfunc._compat import in_transform
from gamfunc.loss import loss_and_aux
from gamfunc.metrics._common import bound_loss

__all__ = ["measurable", "why_unmeasurable"]

log = logging.getLogger("gamfunc.metrics")


def why_unmeasurable(params, batch, loss_fn, buffers=None, mode: str = "eval") -> str | None:
    """Why no metric can be taken at ``params`` (non-finite parameters or loss), or None."""
    bad = [k for k, v in params.items() if not bool(torch.isfinite(v).all())]
    if bad:
        return f"{len(bad)} parameter tensors are not finite (first: {bad[0]!r})"
    loss, _ = loss_and_aux(bound_loss(loss_fn, buffers, mode), params, batch)
    if not bool(torch.isfinite(loss)):
        return f"the loss at these parameters is {float(loss)}"
    return None


def measurable(shape=(), pair: str = ""):
    """Decorate a metric ``f(params, batch, loss_fn, ..., buffers=None, mode="eval")`` so that it
    returns NaN of ``shape`` (a tuple, or a function of the call's other arguments) with one logged
    line where `why_unmeasurable` says the input cannot be measured, or where an
    eigendecomposition inside fails. Where the keyword ``pair`` is true the metric returns a pair
    (value, extra), and then returns (NaN, None). Inside a ``torch.func`` transform or a compiled
    region, where no value can be read, the metric runs unchecked."""

    def wrap(f):
        @functools.wraps(f)
        def metric(params, batch, loss_fn, *args, **kwargs):
            def nan(why: str):
                log.warning("%s: NaN, %s", f.__name__, why)
                first = next(iter(params.values()))
                size = shape(*args, **kwargs) if callable(shape) else shape
                out = torch.full(size, float("nan"), dtype=first.dtype, device=first.device)
                return (out, None) if pair and kwargs.get(pair) else out

            if torch.compiler.is_compiling() or in_transform():
                return f(params, batch, loss_fn, *args, **kwargs)
            why = why_unmeasurable(
                params, batch, loss_fn, kwargs.get("buffers"), kwargs.get("mode", "eval")
            )
            if why is not None:
                return nan(why)
            try:
                return f(params, batch, loss_fn, *args, **kwargs)
            except torch.linalg.LinAlgError as e:
                return nan(f"the eigendecomposition failed ({str(e).splitlines()[0][:120]})")

        return metric

    return wrap
