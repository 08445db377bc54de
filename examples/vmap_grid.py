"""A ρ × α grid of GAM, 5 seeds each, trained as one model: 45 MLPs in one vmapped step.

MNIST-1D (Greydanus 2020, generated offline by the ``mnist1d`` package), the MLP 40-100-100-10, SGD
with momentum 0.9 under GAM, ρ ∈ {0.1, 0.5, 1} × α ∈ {0.1, 0.3, 1} × seeds 0-4: 45 members whose
parameters, momentum buffers and hyperparameters are stacked along a leading axis, so one call of
``gamfunc.ensemble.vmap_step`` trains all of them on the same batch. It prints the test accuracy of
each cell (mean ± std over seeds), its training accuracy, marked "(chance)" where it ended at chance
(at most 1.5 × 1/10: ``reproduce.run.report.at_chance``; ρ = 1, α = 1 ends there after one epoch as after
five, past the cliff at ρ·α ≥ 1 of reproduce/RESULTS.md's ablation), and the time of a vmapped step
against a loop over the 45 members.

    python examples/vmap_grid.py              # 5 epochs: 2.4 minutes on 2 busy CPU cores
    python examples/vmap_grid.py --epochs 1 --seeds 2   # quicker

The last line printed is ``final: cells=... chance_cells=... best_test_acc=... speedup=...``.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gamfunc
from gamfunc.ensemble import stack, vmap_step

RHOS, ALPHAS = (0.1, 0.5, 1.0), (0.1, 0.3, 1.0)


def mlp_params(seed: int) -> dict[str, torch.Tensor]:
    """The MLP 40-100-100-10 with PyTorch's default (Kaiming-uniform) initialisation."""
    g = torch.Generator().manual_seed(seed)
    params = {}
    for i, (n_in, n_out) in enumerate(((40, 100), (100, 100), (100, 10))):
        bound = 1 / n_in**0.5
        params[f"w{i}"] = (torch.rand(n_out, n_in, generator=g) * 2 - 1) * bound
        params[f"b{i}"] = (torch.rand(n_out, generator=g) * 2 - 1) * bound
    return params


def logits(p, x):
    h = torch.relu(x @ p["w0"].T + p["b0"])
    h = torch.relu(h @ p["w1"].T + p["b1"])
    return h @ p["w2"].T + p["b2"]


def loss_fn(p, batch):
    x, y = batch
    return F.cross_entropy(logits(p, x), y)


def constant(value: float):
    """A constant schedule: what vmap_step hands ``build``, for one member alone."""
    v = torch.tensor(value)
    return lambda t: v


def build(lr, rho, alpha):
    """One member's step; each argument is a constant schedule of that member's value."""
    return gamfunc.make_step(
        gamfunc.gam(rho, alpha), gamfunc.sgd(lr, momentum=0.9, weight_decay=5e-4), loss_fn
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument(
        "--repeats", type=int, default=3, help="timed steps of the vmap/loop comparison"
    )
    args = ap.parse_args(argv)
    from reproduce.data.sets import _mnist1d
    from reproduce.run.report import at_chance

    train, test = _mnist1d()
    cells = list(itertools.product(RHOS, ALPHAS))
    members = [(r, a, s) for r, a in cells for s in range(args.seeds)]
    hparams = {
        "lr": torch.full((len(members),), args.lr),
        "rho": torch.tensor([r for r, _, _ in members]),
        "alpha": torch.tensor([a for _, a, _ in members]),
    }
    ens = vmap_step(build, hparams)
    params = stack([mlp_params(s) for _, _, s in members])
    state = ens.init(params)
    n = len(train)
    for epoch in range(args.epochs):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(epoch))
        for i in range(0, n - args.batch + 1, args.batch):
            idx = order[i : i + args.batch]
            params, state, metrics = ens(params, state, (train.x[idx], train.y[idx]))
        print(
            f"epoch {epoch + 1}: loss={metrics['loss'].mean():.4f} (mean of {len(members)} members)"
        )
    with torch.no_grad():

        def accuracy(split):
            hits = lambda p: (logits(p, split.x).argmax(-1) == split.y).float().mean()  # noqa: E731
            return 100 * torch.func.vmap(hits)(params).reshape(len(cells), args.seeds)

        test_acc, train_acc = accuracy(test), accuracy(train)
    chance_cells = 0
    for (rho, alpha), row, fit in zip(cells, test_acc, train_acc, strict=True):
        std = row.std().item() if args.seeds > 1 else 0.0
        chance = at_chance(fit.mean().item(), 10)  # the cell did not learn
        chance_cells += chance
        print(
            f"rho={rho:<4} alpha={alpha:<4} test acc {row.mean():.2f} ± {std:.2f}, "
            f"train acc {fit.mean():.2f}{' (chance)' if chance else ''}"
        )

    # one vmapped step against a loop over the members' own steps, on the same batch
    batch = (train.x[: args.batch], train.y[: args.batch])
    singles = [build(*(constant(h) for h in (args.lr, r, a))) for r, a, _ in members]
    one = [{k: v[j] for k, v in params.items()} for j in range(len(members))]
    states = [s.init(p) for s, p in zip(singles, one, strict=True)]

    repeats = max(args.repeats, 1)

    def timed(fn):
        fn()
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        return (time.perf_counter() - start) / repeats

    t_vmap = timed(lambda: ens(params, state, batch))
    t_loop = timed(lambda: [s(p, st, batch) for s, p, st in zip(singles, one, states, strict=True)])
    print(
        f"one step of {len(members)} members: vmapped {t_vmap * 1e3:.1f} ms, looped {t_loop * 1e3:.1f} ms"
    )
    best = test_acc.mean(1).max().item()
    print(
        f"final: cells={len(cells)} chance_cells={chance_cells} best_test_acc={best:.2f} "
        f"speedup={t_loop / t_vmap:.2f}"
    )


if __name__ == "__main__":
    main()
