"""A plain ``nn.Module`` training loop, switched from ``torch.optim.SGD`` to GAM.

Run (a few seconds on a CPU):

    python examples/module_loop.py                  # GAM through gamfunc.torch_optim
    python examples/module_loop.py --optimizer sgd  # the torch.optim.SGD loop it started from

The switch is three lines; everything else (model, data, scheduler, evaluation) stays::

    - optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    + optimizer = GAM(model, gamfunc.sgd(lr=0.1, momentum=0.9, weight_decay=5e-4), rho=0.05, alpha=0.1)

    - optimizer.zero_grad(); loss = criterion(model(x), y); loss.backward(); optimizer.step()
    + loss = optimizer.step((x, y))

The model has BatchNorm: its running statistics are updated once per step, from the pass at θ, and
copied back into the module. The last line printed is ``final: train_loss=... test_acc=...``.
"""

from __future__ import annotations

import argparse
import warnings

import torch
import torch.nn.functional as F
from torch import nn

import gamfunc
from gamfunc.torch_optim import GAM

# torch's forward-mode AD (used by hvp="exact") emits this deprecation note on first use.
warnings.filterwarnings("ignore", message=".*torch.jit.script")


def make_data(n_train: int, n_test: int, seed: int):
    """Three classes labelled by a random two-layer teacher network, 10 input features."""
    g = torch.Generator().manual_seed(seed)
    w1, w2 = torch.randn(10, 16, generator=g), torch.randn(16, 3, generator=g)
    x = torch.randn(n_train + n_test, 10, generator=g)
    y = (torch.tanh(x @ w1) @ w2).argmax(dim=1)
    return (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(10, 32), nn.BatchNorm1d(32), nn.Tanh(), nn.Linear(32, 3))


def accuracy(model: nn.Module, x, y) -> float:
    """Top-1 accuracy in percent, as reproduce/train.py reports it."""
    model.eval()
    with torch.no_grad():
        acc = 100.0 * (model(x).argmax(dim=1) == y).double().mean().item()
    model.train()
    return acc


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--optimizer", choices=("gam", "sgd"), default="gam")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    (x_train, y_train), (x_test, y_test) = make_data(512, 512, args.seed)
    g = torch.Generator().manual_seed(args.seed)
    torch.manual_seed(args.seed)
    model = make_model()
    criterion = F.cross_entropy

    if args.optimizer == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    else:
        optimizer = GAM(
            model, gamfunc.sgd(lr=0.1, momentum=0.9, weight_decay=5e-4), rho=0.05, alpha=0.1
        )
    steps = args.epochs * (len(x_train) // args.batch_size)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)

    model.train()
    for epoch in range(args.epochs):
        order = torch.randperm(len(x_train), generator=g)
        total = 0.0
        for i in range(0, len(order) - args.batch_size + 1, args.batch_size):
            idx = order[i : i + args.batch_size]
            x, y = x_train[idx], y_train[idx]
            if args.optimizer == "sgd":
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            else:
                loss = optimizer.step((x, y))
            scheduler.step()
            total += loss.item()
        n = len(order) // args.batch_size
        print(f"epoch {epoch}: train_loss={total / n:.4f} lr={scheduler.get_last_lr()[0]:.4f}")
    print(f"final: train_loss={total / n:.4f} test_acc={accuracy(model, x_test, y_test):.2f}")


if __name__ == "__main__":
    main()
