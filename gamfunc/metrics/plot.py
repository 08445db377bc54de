"""Pictures of the metrics: landscape lines and contours, eigenvalue histograms and densities,
minima counts.

matplotlib is an optional dependency (``pip install gamfunc[plot]``), imported only when a function
here is called. Every function builds a ``matplotlib.figure.Figure`` without pyplot (no global
state, no display needed), writes it as a PNG when given a ``path``, and returns it;
[`log_figure`][gamfunc.metrics.plot.log_figure] sends one to TensorBoard.

Example:
    >>> import torch
    >>> from gamfunc.metrics import landscape_2d, plot
    >>> loss_fn = lambda p, _: (p["w"] ** 2).sum()
    >>> grid = landscape_2d({"w": torch.ones(3, 3)}, None, loss_fn, points=11)
    >>> fig = plot.plot_landscape(grid)  # plot.plot_landscape(grid, "landscape.png") writes it
"""

from __future__ import annotations

import os
from typing import Any

import torch

from gamfunc.metrics.landscape import Landscape1D, Landscape2D
from gamfunc.metrics.minima import MinimaDensity

__all__ = [
    "log_figure",
    "plot_eigenvalues",
    "plot_landscape",
    "plot_minima_density",
    "plot_spectral_density",
]


def _figure_class():
    try:
        from matplotlib.figure import Figure
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "gamfunc.metrics.plot needs matplotlib: pip install 'gamfunc[plot]' (or matplotlib)"
        ) from e
    return Figure


def _save(fig, path) -> Any:
    """Save ``fig`` to ``path`` (None: not saved); a failed write names ``path``, which the
    image writer's own error (PIL's, on a full disk) does not."""
    if path is not None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        try:
            fig.savefig(path, format="png", dpi=fig.dpi, bbox_inches="tight")
        except OSError as e:
            if e.errno is not None and not e.filename:
                e.filename = os.fspath(path)
            raise
    return fig


def _numpy(t: torch.Tensor):
    return t.detach().to(device="cpu", dtype=torch.float64).numpy()


def plot_landscape(
    landscape: Landscape1D | Landscape2D,
    path: str | os.PathLike | None = None,
    *,
    title: str | None = None,
    levels: int = 30,
    log: bool = False,
    filled: bool = True,
    figsize: tuple[float, float] = (5.0, 4.0),
    dpi: int = 120,
):
    """A line plot of a [`Landscape1D`][gamfunc.metrics.plot.Landscape1D], or a contour plot of a [`Landscape2D`][gamfunc.metrics.plot.Landscape2D].

    Args:
        landscape: from [`gamfunc.metrics.landscape_1d`][gamfunc.metrics.landscape_1d] or [`landscape_2d`][gamfunc.metrics.landscape_2d].
        path: where to write the PNG; None writes nothing.
        title: the figure title.
        levels: the number of contour levels (2-D).
        log: plot log10 of the loss (shows the basin of a trained model better).
        filled: filled contours under the contour lines (2-D).
        figsize, dpi: the figure size in inches and its resolution.

    Returns:
        The ``matplotlib.figure.Figure``.
    """
    fig = _figure_class()(figsize=figsize, dpi=dpi)
    ax = fig.add_subplot()
    losses = _numpy(landscape.losses)
    if log:
        losses = _log10(losses)
    label = "log10 loss" if log else "loss"
    if isinstance(landscape, Landscape1D):
        ax.plot(_numpy(landscape.alphas), losses, color="tab:blue", lw=1.8)
        ax.axvline(0.0, color="0.6", lw=0.8, ls="--")
        ax.set_xlabel("α")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    else:
        a, b = _numpy(landscape.alphas), _numpy(landscape.betas)
        z = losses.T  # matplotlib wants z[y, x]
        if filled:
            shaded = ax.contourf(a, b, z, levels=levels, cmap="viridis")
            fig.colorbar(shaded, ax=ax, label=label)
        lines = ax.contour(
            a, b, z, levels=levels, colors="k" if filled else None, linewidths=0.5,
            linestyles="solid",
        )  # fmt: skip
        if not filled:
            fig.colorbar(lines, ax=ax, label=label)
        ax.plot([0.0], [0.0], marker="*", color="w" if filled else "k", ms=10, mec="k")
        ax.set_xlabel("α (direction 1)")
        ax.set_ylabel("β (direction 2)")
        ax.set_aspect("equal", adjustable="box")
    if title:
        ax.set_title(title)
    return _save(fig, path)


def plot_eigenvalues(
    values: torch.Tensor,
    path: str | os.PathLike | None = None,
    *,
    bins: int = 20,
    title: str | None = None,
    figsize: tuple[float, float] = (5.0, 3.5),
    dpi: int = 120,
):
    """A histogram of Hessian eigenvalues, e.g. the top 50 (paper Figure 5).

    Args:
        values: the eigenvalues, a tensor of any shape.
        path: where to save the figure; None saves nothing.
        bins: the histogram's number of bins.
        title: the figure's title.
        figsize: the figure's size in inches.
        dpi: its resolution.

    Returns:
        The matplotlib Figure.
    """
    fig = _figure_class()(figsize=figsize, dpi=dpi)
    ax = fig.add_subplot()
    ax.hist(_numpy(values.reshape(-1)), bins=bins, color="tab:blue", edgecolor="k", lw=0.5)
    ax.set_xlabel("eigenvalue")
    ax.set_ylabel("count")
    if title:
        ax.set_title(title)
    return _save(fig, path)


def plot_spectral_density(
    grid: torch.Tensor,
    density: torch.Tensor,
    path: str | os.PathLike | None = None,
    *,
    floor: float = 1e-7,
    title: str | None = None,
    figsize: tuple[float, float] = (5.0, 3.5),
    dpi: int = 120,
):
    """The Hessian's eigenvalue density on a log scale, as PyHessian's figure (``density_plot.py``)
    and the density plots of Ghorbani et al. (2019).

    Draws density + ``floor`` against the grid on a logarithmic y axis, which shows the outliers
    far from the bulk; the floor keeps the empty stretches of the grid on the scale (PyHessian adds
    1e-7).

    Args:
        grid: the points, from [`spectral_density`][gamfunc.metrics.density.spectral_density].
        density: the density at those points.
        path: where to save the figure; None saves nothing.
        floor: added to the density before the logarithm.
        title: the figure's title.
        figsize: the figure's size in inches.
        dpi: its resolution.

    Returns:
        The matplotlib Figure.

    Raises:
        ValueError: ``grid`` and ``density`` differ in shape, or ``floor`` is not > 0.

    References:
        Ghorbani, Krishnan, Xiao, "An Investigation into Neural Net Optimization via Hessian
        Eigenvalue Density", ICML 2019, https://arxiv.org/abs/1901.10159.
        Yao, Gholami, Keutzer, Mahoney, "PyHessian: Neural Networks Through the Lens of the
        Hessian", 2020, https://arxiv.org/abs/1912.07145.
    """
    if grid.shape != density.shape:
        raise ValueError(
            f"grid and density must have one shape; got {tuple(grid.shape)} and "
            f"{tuple(density.shape)}"
        )
    if not floor > 0:
        raise ValueError(f"floor must be > 0; got {floor!r}")
    fig = _figure_class()(figsize=figsize, dpi=dpi)
    ax = fig.add_subplot()
    ax.semilogy(_numpy(grid), _numpy(density) + floor, color="tab:blue", lw=1.0)
    ax.set_xlabel("eigenvalue")
    ax.set_ylabel("density (log scale)")
    if title:
        ax.set_title(title)
    return _save(fig, path)


def plot_minima_density(
    density: MinimaDensity,
    path: str | os.PathLike | None = None,
    *,
    title: str | None = None,
    figsize: tuple[float, float] = (5.0, 3.5),
    dpi: int = 120,
):
    """How many directions show 0, 1, 2, … local minima and maxima within ρ (paper Figure 3).

    Args:
        density: from [`minima_density`][gamfunc.metrics.minima.minima_density]; the directions
            whose counts are NaN (probe losses not finite) are left out, and the figure says how
            many.
        path: where to save the figure; None saves nothing.
        title: the figure's title.
        figsize: the figure's size in inches.
        dpi: its resolution.

    Returns:
        The matplotlib Figure.
    """
    fig = _figure_class()(figsize=figsize, dpi=dpi)
    ax = fig.add_subplot()
    # NaN: a direction whose probe losses were not all finite, left out
    counted = (density.minima.isfinite() & density.maxima.isfinite()).cpu()
    minima, maxima = _numpy(density.minima.cpu()[counted]), _numpy(density.maxima.cpu()[counted])
    top = int(max(minima.max(initial=0), maxima.max(initial=0)))
    edges = [x - 0.5 for x in range(top + 2)]
    ax.hist([minima, maxima], bins=edges, label=["minima", "maxima"], edgecolor="k", lw=0.5)
    ax.set_xticks(range(top + 1))
    ax.set_xlabel("number within ρ")
    ax.set_ylabel("directions")
    ax.legend()
    if not counted.all():
        ax.text(0.98, 0.7, f"{int((~counted).sum())} of {counted.numel()} directions not counted\n"
                "(probe losses not finite)", transform=ax.transAxes, ha="right", fontsize=8)  # fmt: skip
    if title:
        ax.set_title(title)
    return _save(fig, path)


def log_figure(writer, tag: str, figure, step: int | None = None, **plot_kwargs) -> None:
    """Add a figure to a ``torch.utils.tensorboard.SummaryWriter`` (``writer.add_figure``).

    Args:
        writer: a ``SummaryWriter``.
        tag: the figure's tag in TensorBoard.
        figure: a matplotlib Figure, or a landscape, drawn by
            [`plot_landscape`][gamfunc.metrics.plot.plot_landscape] with ``plot_kwargs``.
        step: the global step to log it at.
        **plot_kwargs: for [`plot_landscape`][gamfunc.metrics.plot.plot_landscape].
    """
    if isinstance(figure, Landscape1D | Landscape2D):
        figure = plot_landscape(figure, **plot_kwargs)
    writer.add_figure(tag, figure, global_step=step)


def _log10(x):
    import numpy as np

    return np.log10(np.maximum(x, np.finfo(np.float64).tiny))
