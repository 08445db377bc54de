"""TensorBoard helpers: small pure functions that write gamfunc's metrics through a ``SummaryWriter``.

Each function takes the writer as its first argument and holds no state of its own; tensors are
converted to Python numbers here (one device synchronisation per call), so call them at logging steps,
not inside a compiled step. Nothing here imports TensorBoard: any object with the ``add_scalar`` /
``add_histogram`` / ``add_figure`` / ``add_text`` methods of ``torch.utils.tensorboard.SummaryWriter``
works.

Example:
    >>> import tempfile, torch, gamfunc.logging as tblog
    >>> from torch.utils.tensorboard import SummaryWriter
    >>> with SummaryWriter(tempfile.mkdtemp()) as w:
    ...     logged = tblog.scalars(w, {"loss": torch.tensor(0.5), "lr": 0.1}, step=3, prefix="train/")
    >>> logged
    {'train/loss': 0.5, 'train/lr': 0.1}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

__all__ = ["config", "figure", "histograms", "scalars", "text"]


def _number(v: Any) -> float:
    if isinstance(v, Tensor):
        if v.numel() != 1:
            raise ValueError(f"a scalar must have one element; got shape {tuple(v.shape)}")
        return float(v.detach().float().cpu())
    return float(v)


def scalars(writer, values: Mapping[str, Any], step: int, prefix: str = "") -> dict[str, float]:
    """Write each ``values[name]`` (a number or a one-element tensor) as the scalar ``prefix + name``.

    Returns:
        The written values as ``{tag: float}``; non-finite values are written too, so that a NaN shows.
    """
    out = {}
    for name, v in values.items():
        tag = prefix + name
        out[tag] = _number(v)
        writer.add_scalar(tag, out[tag], step)
    return out


def histograms(writer, tree: Mapping[str, Tensor], step: int, prefix: str = "params/") -> None:
    """Write a histogram of every tensor in a flat dict (e.g. params, or a direction) as ``prefix + key``."""
    for name, t in tree.items():
        if t.numel():
            writer.add_histogram(prefix + name, t.detach().float().cpu(), step)


def figure(writer, tag: str, fig, step: int, close: bool = True) -> None:
    """Write a matplotlib figure as the image ``tag``; ``close`` frees the figure afterwards."""
    writer.add_figure(tag, fig, step, close=close)


def text(writer, tag: str, body: str, step: int = 0) -> None:
    """Write a markdown text."""
    writer.add_text(tag, body, step)


def config(writer, cfg: Mapping[str, Any], tag: str = "config") -> str:
    """Write a run's configuration as a two-column markdown table under ``tag``; returns the markdown."""
    rows = "\n".join(f"| {k} | `{v!r}` |" for k, v in cfg.items())
    body = f"| field | value |\n|---|---|\n{rows}"
    writer.add_text(tag, body, 0)
    return body
