"""A GradScaler fp16 loop, switched to GAM with the facade's own loss scale.

Run (seconds on a CPU; on CUDA when one is available):

    python examples/mixed_precision_loop.py                     # fp16, dynamic loss scale
    python examples/mixed_precision_loop.py --precision bf16    # no loss scale needed

The loop it started from, and the switch::

    - scaler = torch.amp.GradScaler(device)
    - optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    + optimizer = GAM(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
    +                 rho=0.05, alpha=0.1, precision="fp16", max_grad_norm=1.0)

    - with torch.autocast(device, dtype=torch.float16):
    -     loss = criterion(model(x), y)
    - optimizer.zero_grad()
    - scaler.scale(loss).backward()
    - scaler.unscale_(optimizer)
    - torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    - scaler.step(optimizer)
    - scaler.update()
    + loss = optimizer.step((x, y))

Every pass of the GAM step (at θ, at the perturbed point, the H·v) runs under fp16 autocast with its
gradient formed as ∇(S·L)/S; S is GradScaler's dynamic loss scale (2¹⁶ to start, halved after an
overflow, doubled after 2000 clean steps), kept in the step's state and reported in
``optimizer.metrics["loss_scale"]``. A step that overflows is skipped, the model and SGD's momentum left
as they were, and counted in ``optimizer.metrics["skipped"]``. Parameters, momentum and clipping stay in
fp32. ``torch.autocast`` runs fp16 on the CPU too, which keeps this runnable anywhere; on a CPU bf16 is
the faster choice. The last line printed is
``final: first_loss=... train_loss=... test_acc=... skipped=... [loss_scale=...]``.
"""

from __future__ import annotations

import argparse
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from gamfunc.torch_optim import GAM

# torch's forward-mode AD (used by hvp="exact") emits this deprecation note on first use.
warnings.filterwarnings("ignore", message=".*torch.jit.script")

# Handed to a GradScaler, the facade refuses in one line, from scaler.step(optimizer):
#   TypeError: torch.amp.GradScaler cannot drive a flatness step (it scales .grad, which the step
#   does not read, and skips step() on overflow): drop the scaler and build the optimiser with
#   precision='fp16' (its loss scale is in the step's state)


def make_data(n_train: int, n_test: int, seed: int):
    """Three classes labelled by a random two-layer teacher network, 10 input features."""
    g = torch.Generator().manual_seed(seed)
    w1, w2 = torch.randn(10, 16, generator=g), torch.randn(16, 3, generator=g)
    x = torch.randn(n_train + n_test, 10, generator=g)
    y = (torch.tanh(x @ w1) @ w2).argmax(dim=1)
    return (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(10, 64), nn.BatchNorm1d(64), nn.Tanh(), nn.Linear(64, 3))


def evaluate(model: nn.Module, x, y) -> tuple[float, float]:
    """(loss, top-1 accuracy in percent) in fp32, in eval mode."""
    model.eval()
    with torch.no_grad():
        out = model(x)
        loss, acc = F.cross_entropy(out, y).item(), 100.0 * (out.argmax(1) == y).double().mean()
    model.train()
    return loss, float(acc)


def counters(optimizer: GAM, skipped) -> str:
    """`` skipped=...`` and, with fp16, `` loss_scale=...`` (bf16 and fp32 have no loss scale)."""
    scale = optimizer.metrics.get("loss_scale")
    return f" skipped={skipped.item()}" + ("" if scale is None else f" loss_scale={scale.item():g}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", choices=("fp16", "bf16", "fp32"), default="fp16")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    (x_train, y_train), (x_test, y_test) = [
        (x.to(device), y.to(device)) for x, y in make_data(1024, 512, args.seed)
    ]
    g = torch.Generator().manual_seed(args.seed)
    torch.manual_seed(args.seed)
    model = make_model().to(device)
    optimizer = GAM(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        rho=0.05,
        alpha=0.1,
        criterion=F.cross_entropy,
        precision=args.precision,
        max_grad_norm=1.0,
    )
    steps = args.epochs * (len(x_train) // args.batch_size)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)

    first, _ = evaluate(model, x_train, y_train)
    print(f"{device} {args.precision}: loss={first:.4f} before training")
    skipped = torch.zeros((), dtype=torch.long, device=device)
    for epoch in range(args.epochs):
        order = torch.randperm(len(x_train), generator=g).to(device)
        total = torch.zeros((), device=device)
        for i in range(0, len(order) - args.batch_size + 1, args.batch_size):
            idx = order[i : i + args.batch_size]
            total += optimizer.step((x_train[idx], y_train[idx])).detach()
            skipped += optimizer.metrics["skipped"]  # a tensor: no synchronisation per step
            scheduler.step()
        n = len(order) // args.batch_size
        print(f"epoch {epoch}: train_loss={total.item() / n:.4f}" + counters(optimizer, skipped))
    loss, _ = evaluate(model, x_train, y_train)
    _, test_acc = evaluate(model, x_test, y_test)
    print(
        f"final: first_loss={first:.4f} train_loss={loss:.4f} test_acc={test_acc:.2f}"
        + counters(optimizer, skipped)
    )


if __name__ == "__main__":
    main()
