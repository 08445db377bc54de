"""A pure functional training loop: ``make_step`` on a module, compiled with ``torch.compile``.

Run (the first compiled step takes 10-40 s on a CPU, the rest are fast):

    python examples/functional_compile.py               # compiled
    python examples/functional_compile.py --no-compile  # eager, a few seconds
    python examples/functional_compile.py --estimator sam  # any of gam, sam, gradient

The module is split once into ``(loss_fn, params, buffers)``; after that training is a pure function
``step(params, state, batch) -> (params, state, metrics)`` with no hidden state. The learning rate is a
gamfunc schedule (a function of the step tensor), so nothing recompiles as it changes. At the end the
trained tensors are loaded back into the module for evaluation. The last line printed is
``final: train_loss=... test_acc=...``.
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
import torch.nn.functional as F
from torch import nn

import gamfunc
from gamfunc import schedules

# torch's forward-mode AD (used by hvp="exact") emits this deprecation note on first use.
warnings.filterwarnings("ignore", message=".*torch.jit.script")


ESTIMATORS = {
    "gam": lambda: gamfunc.gam(rho=0.05, alpha=0.1),
    "sam": lambda: gamfunc.sam(rho=0.05),
    "gradient": gamfunc.gradient,
}


def make_data(n_train: int, n_test: int, seed: int):
    """Three classes labelled by a random two-layer teacher network, 10 input features."""
    g = torch.Generator().manual_seed(seed)
    w1, w2 = torch.randn(10, 16, generator=g), torch.randn(16, 3, generator=g)
    x = torch.randn(n_train + n_test, 10, generator=g)
    y = (torch.tanh(x @ w1) @ w2).argmax(dim=1)
    return (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-compile", action="store_true", help="run the step eagerly")
    parser.add_argument("--estimator", choices=tuple(ESTIMATORS), default="gam")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    (x_train, y_train), (x_test, y_test) = make_data(512, 512, args.seed)
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(10, 32), nn.BatchNorm1d(32), nn.Tanh(), nn.Linear(32, 3))

    loss_fn, params, buffers = gamfunc.nn.functionalize(model, F.cross_entropy)
    lr = schedules.cosine(0.1, total_steps=args.steps, warmup_steps=args.steps // 10)
    step = gamfunc.make_step(
        ESTIMATORS[args.estimator](),
        gamfunc.sgd(lr=lr, momentum=0.9, weight_decay=5e-4),
        loss_fn,
    )
    if not args.no_compile:
        step = step.compile(fullgraph=True)
    state = step.init(params, buffers)

    g = torch.Generator().manual_seed(args.seed)
    times = []
    for t in range(args.steps):
        idx = torch.randint(0, len(x_train), (args.batch_size,), generator=g)
        start = time.perf_counter()
        params, state, metrics = step(params, state, (x_train[idx], y_train[idx]))
        times.append(time.perf_counter() - start)
        if t % 20 == 0 or t == args.steps - 1:
            print(
                f"step {t}: loss={float(metrics['loss']):.4f} lr={float(metrics['lr']):.4f} "
                f"grad_norm={float(metrics['grad_norm']):.3f}"
            )
    later = sorted(times[1:])[len(times[1:]) // 2] if len(times) > 1 else float("nan")
    mode = "eager" if args.no_compile else "compiled"
    print(f"{mode}: first step {times[0]:.2f} s, later steps {1e3 * later:.2f} ms (median)")

    gamfunc.nn.load(model, params, state.buffers)
    model.eval()
    with torch.no_grad():
        train_loss = float(F.cross_entropy(model(x_train), y_train))
        test_acc = 100.0 * float((model(x_test).argmax(dim=1) == y_test).double().mean())
    print(f"final: train_loss={train_loss:.4f} test_acc={test_acc:.2f}")  # percent


if __name__ == "__main__":
    main()
