"""The Fashion-MNIST figure of reproduce/RESULTS.md from ``fmnist.json`` (`reproduce.evidence.fmnist`):
test accuracy against cost as a multiple of SGD's, one point per estimator, a panel per setting."""

from __future__ import annotations

import statistics
from pathlib import Path

from reproduce.evidence.fmnist_report import NAMES, plural

__all__ = ["figure"]


def figure(record: dict, path: Path) -> None:
    """Test accuracy (mean ± std over seeds) against ``x_sgd`` (the cost of a step as a multiple of
    SGD's in the same process, mean ± std), one point per estimator,
    a panel per setting that has runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    done = {k: by for k, by in record["runs"].items() if any(by.values())}
    fig, axes = plt.subplots(1, len(done), figsize=(5 * len(done), 3.6), squeeze=False)
    for ax, (setting, by) in zip(axes[0], done.items(), strict=True):
        for e, rs in by.items():
            if not rs:
                continue
            acc = [r["test_acc"] for r in rs]
            x = [r["x_sgd"] for r in rs]
            ax.errorbar(
                statistics.mean(x),
                statistics.mean(acc),
                yerr=statistics.stdev(acc) if len(acc) > 1 else 0,
                xerr=statistics.stdev(x) if len(x) > 1 else 0,
                fmt="o",
                capsize=3,
                label=NAMES[e],
            )
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 3.0, 5.0)))
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_xlabel(f"cost, × SGD's ({record['platform']['device']})")
        ax.set_ylabel("test accuracy %")
        seeds = max(len(rs) for rs in by.values())
        ax.set_title(f"Fashion-MNIST, {setting} ({seeds} {plural(seeds, 'seed')})")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
