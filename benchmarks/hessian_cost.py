"""Cost of gamfunc's Hessian metrics next to PyHessian-style double backward, in one run.

On a CIFAR-shape ResNet-18 (3x3 stem, no max-pool, 10 classes), batch 128 of random data, BatchNorm
in eval mode for every method, eager:

* top-5 eigenvalues: gamfunc ``top_eigenvalues(k=5)`` (Lanczos, and power iteration), against
  PyHessian's power iteration with deflation on ``torch.autograd.grad(create_graph=True)`` HVPs
  (gradient graph built once and kept, as PyHessian does; tol 1e-3, 100 iterations per eigenvalue);
* Hessian trace with 50 Rademacher probes: gamfunc ``hessian_trace(samples=50)`` (vmap in chunks),
  against Hutchinson in a Python loop over the same double-backward HVP;
* the cost of one HVP of each kind.

Every row includes its own set-up (the baseline builds its gradient graph inside each call).

Prints a table, writes JSON::

    python -m benchmarks.hessian_cost            # ResNet-18, on the GPU where there is one
    python -m benchmarks.hessian_cost --quick    # tiny CNN, batch 8, few iterations, CPU: seconds
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
import torch.nn.functional as F
from torch import nn

import gamfunc
from benchmarks import _common
from gamfunc.metrics import hessian_trace, top_eigenvalues
from gamfunc.metrics._common import bound_loss, hessian_operator

warnings.filterwarnings("ignore", message=".*torch.jit.script.*")


def resnet18_cifar(classes: int = 10) -> nn.Module:
    """torchvision's ResNet-18 with the CIFAR stem: 3x3 conv, stride 1, no max-pool."""
    import torchvision

    model = torchvision.models.resnet18(weights=None, num_classes=classes)
    model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


def tiny_cnn(classes: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, classes),
    )  # fmt: skip


# ---- PyHessian-style baseline (Yao et al. 2020, pyhessian/hessian.py), on the nn.Module ----------


class DoubleBackward:
    """H·v by ``torch.autograd.grad(grads, params, grad_outputs=v, retain_graph=True)``."""

    def __init__(self, model: nn.Module, inputs, targets):
        model.eval()
        self.params = [p for p in model.parameters() if p.requires_grad]
        loss = F.cross_entropy(model(inputs), targets)
        self.grads = torch.autograd.grad(loss, self.params, create_graph=True)

    def hvp(self, v):
        return torch.autograd.grad(self.grads, self.params, grad_outputs=v, retain_graph=True)


def _dot(a, b) -> float:
    return float(sum(torch.sum(x * y) for x, y in zip(a, b, strict=True)))


def _normalised(v):
    n = sum(torch.sum(x * x) for x in v).sqrt() + 1e-6
    return [x / n for x in v]


def _orthonormalised(v, basis):
    for u in basis:
        c = _dot(v, u)
        v = [x - c * y for x, y in zip(v, u, strict=True)]
    return _normalised(v)


def pyhessian_top_eigenvalues(op: DoubleBackward, k: int, iters: int, tol: float, gen):
    """PyHessian's ``hessian.eigenvalues``: power iteration, deflation by orthogonalisation."""
    values, vectors, products = [], [], 0
    for _ in range(k):
        v = _normalised([torch.randn(p.shape, generator=gen, device=p.device) for p in op.params])
        lam = None
        for _ in range(iters):
            v = _orthonormalised(v, vectors)
            hv = op.hvp(v)
            products += 1
            new = _dot(hv, v)
            v = _normalised(hv)
            if lam is not None and abs(lam - new) / (abs(lam) + 1e-6) < tol:
                lam = new
                break
            lam = new
        values.append(lam)
        vectors.append(v)
    return sorted(values, reverse=True), products


def pyhessian_trace(op: DoubleBackward, samples: int, gen) -> float:
    """PyHessian's ``hessian.trace`` with a fixed number of Rademacher probes (no early stop)."""
    forms = []
    for _ in range(samples):
        v = [
            torch.randint(0, 2, p.shape, generator=gen, device=p.device).to(p.dtype) * 2 - 1
            for p in op.params
        ]
        forms.append(_dot(op.hvp(v), v))
    return sum(forms) / len(forms)


# ---- timing ----------------------------------------------------------------------------------------


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, repeats: int, warmup: int = 0):
    """(median seconds, last result) over ``repeats`` calls, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times, out = [], None
    for _ in range(repeats):
        _sync(device)
        t = time.perf_counter()
        out = fn()
        _sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


class Counting:
    """An :mod:`gamfunc.hvps` backend that counts its calls."""

    def __init__(self, backend):
        self.backend, self.calls = backend, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.backend(*args, **kwargs)


def main(argv=None) -> dict:
    """Time every row, print the table, write the JSON.

    Args:
        argv: the command line (default: ``sys.argv[1:]``).

    Returns:
        The result written.
    """
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _common.add_flags(ap)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--iters", type=int, default=100, help="power: per eigenvalue; Lanczos: total")
    ap.add_argument("--tol", type=float, default=1e-3, help="power iteration tolerance (PyHessian)")
    ap.add_argument("--lanczos-tol", type=float, default=1e-4)
    ap.add_argument("--samples", type=int, default=50)
    ap.add_argument("--chunk-size", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs before each timed row")
    ap.add_argument("--hvp-repeats", type=int, default=10)
    args = ap.parse_args(argv)
    tiny = args.quick
    if tiny:
        args.device, args.batch, args.k, args.iters, args.samples = "cpu", 8, 3, 6, 4
        args.chunk_size, args.hvp_repeats, args.warmup = 2, 2, 0
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = (tiny_cnn() if tiny else resnet18_cifar()).to(device).eval()
    side = 8 if tiny else 32
    gen = torch.Generator(device=device).manual_seed(0)
    inputs = torch.randn(args.batch, 3, side, side, generator=gen, device=device)
    targets = torch.randint(0, 10, (args.batch,), generator=gen, device=device)
    batch = (inputs, targets)
    loss_fn, params, buffers = gamfunc.nn.functionalize(model, train=False)
    n_params = sum(p.numel() for p in params.values())
    rows: list[dict] = []

    def seeded():
        return torch.Generator(device=device).manual_seed(1)

    def measure(method, fn, *, repeats=args.repeats, warmup=args.warmup, hvps=None, base=None,
                counts=False):  # fmt: skip
        """Time ``fn`` into a row; returns its seconds (None if it ran out of memory)."""
        try:
            seconds, value = timed(fn, device, repeats, warmup)
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
            rows.append({"method": method, "seconds": None, "hvps": None, "value": "out of memory"})
            return None
        if counts:  # (value, products) from the baseline's power iteration
            value, hvps = value
        if isinstance(value, torch.Tensor) and value.dim() <= 1:
            value = value.tolist()
        if not isinstance(value, float | list):
            value = None
        row = {"method": method, "seconds": seconds, "hvps": hvps, "value": value}
        if base is not None:
            row["ratio_to_baseline"] = seconds / base if base != "self" else 1.0
        rows.append(row)
        return seconds

    # One HVP of each kind, after one untimed call.
    op = DoubleBackward(model, inputs, targets)
    v_list = [torch.randn(p.shape, generator=gen, device=device) for p in op.params]
    v_dict = dict(zip(params, v_list, strict=True))
    base = measure("HVP: double backward, graph kept (PyHessian)", lambda: op.hvp(v_list),
                   repeats=args.hvp_repeats, warmup=1, hvps=1, base="self")  # fmt: skip
    measure("  building its gradient graph (once per call below)",
            lambda: DoubleBackward(model, inputs, targets), repeats=args.hvp_repeats)  # fmt: skip
    op = None  # free its graph before the metrics run
    loss = bound_loss(loss_fn, buffers, "eval")
    for name in ("exact", "reverse"):
        with torch.no_grad():  # as inside the metrics: no graph is built around the products
            matvec = hessian_operator(loss, params, batch, name)
            suffix = " (linearised once)" if name == "reverse" else ""
            measure(f"HVP: gamfunc hvp='{name}'{suffix}", lambda m=matvec: m(v_dict),
                    repeats=args.hvp_repeats, warmup=1, hvps=1, base=base)  # fmt: skip
        matvec = None

    # Top-k eigenvalues.
    k, iters, kw = args.k, args.iters, {"buffers": buffers, "mode": "eval"}
    base = measure(
        f"top-{k}: PyHessian power iteration, tol {args.tol}",
        lambda: pyhessian_top_eigenvalues(
            DoubleBackward(model, inputs, targets), k, iters, args.tol, seeded()
        ),
        counts=True,
        base="self",
    )
    counter = Counting(gamfunc.hvps.exact())

    def lanczos(hvp, tol=args.lanczos_tol, method="lanczos"):
        return lambda: top_eigenvalues(
            params, batch, loss_fn, k=k, iters=iters, tol=tol, generator=seeded(), hvp=hvp,
            method=method, **kw,
        )  # fmt: skip

    measure(f"top-{k}: gamfunc Lanczos, hvp='exact', tol {args.lanczos_tol}", lanczos(counter),
            base=base)  # fmt: skip
    if rows[-1]["seconds"] is not None:
        rows[-1]["hvps"] = counter.calls // (args.repeats + args.warmup)
    measure(f"top-{k}: gamfunc Lanczos, hvp='reverse', tol {args.lanczos_tol}",
            lanczos("reverse"), base=base)  # fmt: skip
    measure(f"top-{k}: gamfunc power iteration, hvp='reverse', tol {args.tol}",
            lanczos("reverse", args.tol, "power"), base=base)  # fmt: skip

    # Hessian trace.
    s = args.samples
    base = measure(
        f"trace, {s} probes: PyHessian loop",
        lambda: pyhessian_trace(DoubleBackward(model, inputs, targets), s, seeded()),
        hvps=s,
        base="self",
    )
    for name in ("exact", "reverse"):
        for chunk in sorted({1, args.chunk_size}):
            measure(
                f"trace, {s} probes: gamfunc hvp='{name}', vmap chunk {chunk}",
                lambda n=name, c=chunk: hessian_trace(
                    params, batch, loss_fn, samples=s, generator=seeded(), hvp=n, chunk_size=c, **kw
                ),
                hvps=s,
                base=base,
            )

    meta = _common.metadata(
        "hessian_cost",
        device,
        quick=tiny,
        model="tiny CNN" if tiny else "ResNet-18 (CIFAR stem)",
        parameters=n_params,
        batch=args.batch,
        bn_mode="eval",
        eager=True,
        args=vars(args),
    )
    result = {"benchmark": "hessian_cost", "meta": meta, "rows": rows}
    print(
        f"{meta['model']}, {n_params} params, batch {args.batch}, {meta['device_name']}, "
        f"torch {torch.__version__}, BatchNorm in eval mode, eager"
    )
    print(f"{'method':<62} {'seconds':>9} {'ratio':>7} {'HVPs':>5}  value")
    for r in rows:
        seconds = "" if r["seconds"] is None else f"{r['seconds']:.4f}"
        ratio = f"{r['ratio_to_baseline']:.2f}" if "ratio_to_baseline" in r else ""
        hv = "" if r["hvps"] is None else str(r["hvps"])
        print(f"{r['method']:<62} {seconds:>9} {ratio:>7} {hv:>5}  {_shown(r['value'])}")
    print(f"JSON: {_common.save(result, args.out)}")
    return result


def _shown(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return "[" + ", ".join(f"{x:.4g}" for x in value) + "]"
    return "" if value is None else str(value)


if __name__ == "__main__":
    main()
