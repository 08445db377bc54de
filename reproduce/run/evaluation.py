"""Evaluation of a run: loss, top-1 and top-5 accuracy over a split, and the flatness metrics.

With several processes each rank evaluates its own share of the split (`reproduce.data.sets.shard`)
and the sums are added over ranks (`reproduce.run.launch.sum_over_ranks`), so the numbers are those
of the whole split, as one process would report them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import torch
from torch import Tensor

from reproduce.build import CORRECT, TOP5
from reproduce.config import Config
from reproduce.data import sets as data_mod
from reproduce.run.launch import Processes, sum_over_ranks

__all__ = ["Scores", "evaluate", "flatness", "flatness_plan", "inputs", "to"]


def to(obj, device):
    """Every tensor in a nested dict/list/tuple moved to ``device`` (to the CPU synchronously); a
    NamedTuple (a [`gamfunc.StepState`][gamfunc.StepState] and the states in it) keeps its type."""
    if isinstance(obj, Tensor):
        return obj.to(device, non_blocking=torch.device(device).type != "cpu")
    if isinstance(obj, dict):
        return {k: to(v, device) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(type(obj), "_fields"):
        return type(obj)(*(to(v, device) for v in obj))
    if isinstance(obj, list | tuple):
        return type(obj)(to(v, device) for v in obj)
    return obj


def inputs(x: Tensor, device, channels_last: bool = False) -> Tensor:
    """An input batch on ``device``; with ``channels_last``, a 4-d batch (N, C, H, W) is given the
    ``torch.channels_last`` layout. Inputs of other ranks (MLP vectors, 1-d signals) are left as they are."""
    x = x.to(device, non_blocking=True)
    if channels_last and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    return x


Scores = dict[str, float]  # {"loss", "acc" (top-1, %), "top5" (%)}


@torch.no_grad()
def evaluate(
    loss_fn,
    params,
    buffers,
    batches: Iterable,
    device,
    check=None,
    *,
    channels_last: bool = False,
    procs: Processes | None = None,
) -> Scores:
    """Mean loss, top-1 and top-5 accuracy (%) of the model in eval mode over ``batches`` (this
    rank's share of a split), summed over the ranks of ``procs``.

    ``check()``, if given, is called before every batch (it raises to stop the evaluation)."""
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros(2, dtype=torch.int64, device=device)  # top-1, top-5
    seen = 0
    for x, y in batches:
        if check is not None:
            check()
        x, y = inputs(x, device, channels_last), y.to(device, non_blocking=True)
        loss, aux = loss_fn(params, (x, y), buffers, train=False)
        loss_sum += loss.double() * len(y)
        correct += torch.stack([aux[CORRECT], aux[TOP5]])
        seen += len(y)
    if check is not None:
        check()
    counts = torch.cat([correct, torch.tensor([seen], device=device)])
    if procs is not None:
        loss_sum, counts = sum_over_ranks(procs, [loss_sum, counts])
    n = max(int(counts[2]), 1)
    return {
        "loss": float(loss_sum) / n,
        "acc": 100.0 * int(counts[0]) / n,
        "top5": 100.0 * int(counts[1]) / n,
    }


def flatness_plan(cfg: Config, n: int) -> tuple[list[str], str]:
    """What `flatness` computes for ``cfg`` on ``n`` examples: one phrase per metric and their
    rough size (H·v products and loss evaluations, each over ``n`` examples)."""
    parts, hvps, losses = [], 0, 0
    if cfg.eig_iters:
        parts.append(f"λ_max (Lanczos, at most {cfg.eig_iters} H·v products)")
        hvps += cfg.eig_iters
    if cfg.trace_samples:
        parts.append(f"trace (Hutchinson, {cfg.trace_samples} probes, one H·v product each)")
        hvps += cfg.trace_samples
    if cfg.r1_steps:
        parts.append(f"R1 ({cfg.r1_steps} ascent steps, {cfg.r1_steps + 1} H·v products)")
        hvps += cfg.r1_steps + 1
    if cfg.landscape:
        parts.append(f"a 1-d landscape ({LANDSCAPE_POINTS} points)")
        losses += LANDSCAPE_POINTS
    size = [f"{hvps} H·v products" if hvps else "", f"{losses} loss evaluations" if losses else ""]
    return parts, " and ".join(s for s in size if s)


LANDSCAPE_POINTS = 51  # the points of the 1-d landscape along its direction


def flatness(
    cfg: Config,
    loss_fn,
    params,
    buffers,
    probe,
    device,
    step: int = 0,
    check=None,
    say=None,
) -> tuple[dict[str, float], object]:
    """λ_max, Hessian trace and R1 on the fixed probe batch, in eval mode, and a landscape figure.

    With ``flatness_batch`` smaller than the probe set, the metrics are those of the whole probe set
    (up to the whole training set) taken over batches: each H·v and gradient is averaged over them.

    λ_max: Lanczos (``eig_iters`` products at most); trace: Hutchinson with ``trace_samples`` probes;
    R1_ρ = ρ·max‖∇L(θ')‖ over ‖θ' − θ‖ ≤ ρ (paper Definition 3.1), ρ = ``flatness_rho`` or ``rho``,
    from ``r1_steps`` projected ascent steps started at GAM's θ_adv; the landscape is L along a
    filter-normalised random direction (Li et al. 2018), a matplotlib figure (None when off).
    Each draws from its own generator seeded by ``cfg.seed``, so resumed runs log the same values.

    ``check()``, if given, is called after every H·v product of λ_max, chunk of trace probes, and
    before every evaluation of the loss (ascent steps of R1, landscape points): it raises to stop
    the metrics (a signal). ``say``,
    if given, is called with one line per metric as it is done (its value and time).
    """
    from gamfunc import metrics
    from gamfunc.metrics.guard import why_unmeasurable

    x, y = to(probe, device)
    batch = (inputs(x, device, cfg.channels_last), y)

    def loss(p, b):
        if check is not None:
            check()
        return loss_fn(p, b, buffers, train=False)[0]

    n = len(y)
    if cfg.flatness_batch and n > cfg.flatness_batch:
        # PyHessian's "full dataset" mode: every H·v and gradient the metrics form is the
        # size-weighted mean over batches of at most flatness_batch examples
        from gamfunc.wrappers.accumulate import accumulate

        loss = accumulate(loss, -(-n // cfg.flatness_batch))

    def timed(key: str, label: str, compute) -> None:
        began = time.perf_counter()
        out[key] = float(compute())
        if say is not None:
            say(f"{label} = {out[key]:.6g} ({time.perf_counter() - began:.1f} s)")

    progress = None if check is None else (lambda done: check())
    out: dict[str, float] = {}
    rho = cfg.flatness_rho or cfg.rho or 0.05
    gen = lambda k: data_mod.generator(cfg.seed, 7, k)  # noqa: E731
    if cfg.eig_iters:
        timed(
            "lambda_max",
            "λ_max",
            lambda: metrics.top_eigenvalues(
                params, batch, loss, k=1, iters=cfg.eig_iters, generator=gen(1), callback=progress
            )[0],
        )
    if cfg.trace_samples:
        timed(
            "trace",
            "trace",
            lambda: metrics.hessian_trace(
                params, batch, loss, samples=cfg.trace_samples, generator=gen(2), callback=progress
            ),
        )
    if cfg.r1_steps:
        timed(
            "r1",
            f"R1 (ρ = {rho:g})",
            lambda: metrics.first_order_flatness(
                params, batch, loss, rho, steps=cfg.r1_steps, init="gradient", generator=gen(3)
            ),
        )
    figure = None
    if cfg.landscape and why_unmeasurable(params, batch, loss) is None:
        began = time.perf_counter()
        curve = metrics.landscape_1d(params, batch, loss, points=LANDSCAPE_POINTS, generator=gen(4))
        figure = metrics.plot.plot_landscape(curve, title=f"{cfg.estimator}, step {step}")
        if say is not None:
            say(f"1-d landscape ({time.perf_counter() - began:.1f} s)")
    return out, figure
