"""Metrics on weights that cannot be measured: NaN with one logged line, never a traceback.

A diverged run ends with non-finite parameters, or finite ones at which the loss overflows; a
Lanczos or Hutchinson run on them fails deep inside ``torch.linalg.eigh`` or returns garbage. Each
metric decorated with `measurable` checks its input first (every parameter finite, the loss at
θ finite) and catches a failed eigendecomposition; in each case it returns NaN of the metric's shape
and logs one line on the ``gamfunc.metrics`` logger saying why.

The decorated function is the metric's one public name (``gamfunc.metrics.hessian.top_eigenvalues``
is ``gamfunc.metrics.top_eigenvalues``). A metric measured inside another (the Lanczos start of
[`first_order_flatness`][gamfunc.metrics.flatness.first_order_flatness]) or inside
[`checked`][gamfunc.metrics.guard.checked] runs unchecked: its caller has checked θ and handles the
failure, so that one call logs one line.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging

import torch

from gamfunc._compat import in_transform
from gamfunc.loss import loss_and_aux
from gamfunc.metrics._common import bound_loss

__all__ = ["checked", "measurable", "why_unmeasurable"]

log = logging.getLogger("gamfunc.metrics")

# True inside a measurable metric or a `checked` block of this thread or task: a metric called there
# runs unchecked. Set and reset around each call, so it holds nothing between calls.
_CHECKED = contextvars.ContextVar("gamfunc.metrics.checked", default=False)


@contextlib.contextmanager
def checked():
    """A block in which the measurable metrics run unchecked: its caller has checked θ
    (`why_unmeasurable`) and turns a failed eigendecomposition into its own NaN and log line.

    Every measurable metric runs inside one, so that the metrics it calls are not checked again.

    Example:
        >>> import torch
        >>> from gamfunc.metrics import top_eigenvalues
        >>> from gamfunc.metrics.guard import checked
        >>> loss_fn = lambda p, x: (x @ p["w"]).pow(2).sum()
        >>> with checked():  # a LinAlgError would propagate here
        ...     top_eigenvalues({"w": torch.ones(2)}, torch.eye(2), loss_fn).shape
        torch.Size([1])
    """
    token = _CHECKED.set(True)
    try:
        yield
    finally:
        _CHECKED.reset(token)


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
    region, where no value can be read, and inside another measurable metric or a
    [`checked`][gamfunc.metrics.guard.checked] block, the metric runs unchecked.

    Args:
        shape: the shape of the NaN returned, or a function of the call's arguments after
            ``loss_fn`` that gives it.
        pair: the keyword that makes the metric return a pair, or "" for none.

    Returns:
        The decorator; the metric it returns keeps the name and docstring of the one it wraps.
    """

    def wrap(f):
        @functools.wraps(f)
        def metric(params, batch, loss_fn, *args, **kwargs):
            def nan(why: str):
                log.warning("%s: NaN, %s", f.__name__, why)
                first = next(iter(params.values()))
                size = shape(*args, **kwargs) if callable(shape) else shape
                out = torch.full(size, float("nan"), dtype=first.dtype, device=first.device)
                return (out, None) if pair and kwargs.get(pair) else out

            if torch.compiler.is_compiling() or in_transform() or _CHECKED.get():
                return f(params, batch, loss_fn, *args, **kwargs)
            why = why_unmeasurable(
                params, batch, loss_fn, kwargs.get("buffers"), kwargs.get("mode", "eval")
            )
            if why is not None:
                return nan(why)
            try:
                with checked():
                    return f(params, batch, loss_fn, *args, **kwargs)
            except torch.linalg.LinAlgError as e:
                return nan(f"the eigendecomposition failed ({str(e).splitlines()[0][:120]})")

        return metric

    return wrap
