"""N models in one vmapped step against a loop over their own steps (``gamfunc.ensemble``).

The MNIST-1D MLP (40-100-100-10, batch 100), exact GAM over SGD with momentum, every member with its
own ρ and α; for N = 1, 8, 32, 128 members the time of one vmapped step and of the N single-member
steps one after another, each the median of ``--repeats`` after a warm-up, on the same device.

    python -m benchmarks.vmap_members            # N = 1, 8, 32, 128
    python -m benchmarks.vmap_members --quick    # N = 1 and 4, one repeat
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks import _common
from benchmarks.report import columns
from examples.vmap_grid import build, constant, mlp_params  # the example's model and step
from gamfunc.training.ensemble import stack, vmap_step


def median_time(fn, repeats: int, device) -> float:
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(n: int, batch, repeats: int, device) -> dict:
    """One vmapped step of ``n`` members against their ``n`` steps one after another."""
    rhos, alphas = torch.linspace(0.05, 1.0, n), torch.linspace(0.1, 1.0, n).flip(0)
    hp = {"lr": torch.full((n,), 0.05), "rho": rhos, "alpha": alphas}
    hp = {k: v.to(device) for k, v in hp.items()}
    ens = vmap_step(build, hp)
    members = [{k: v.to(device) for k, v in mlp_params(s).items()} for s in range(n)]
    params = stack(members)
    state = ens.init(params)
    singles = [
        build(constant(0.05), constant(float(r)), constant(float(a)))
        for r, a in zip(rhos, alphas, strict=True)
    ]
    states = [s.init(p) for s, p in zip(singles, members, strict=True)]
    vmapped = median_time(lambda: ens(params, state, batch), repeats, device)
    looped = median_time(
        lambda: [s(p, st, batch) for s, p, st in zip(singles, members, states, strict=True)],
        repeats,
        device,
    )
    return {
        "members": n,
        "vmapped_ms": vmapped * 1e3,
        "looped_ms": looped * 1e3,
        "looped_over_vmapped": looped / vmapped,
    }


def main(argv=None) -> dict:
    """Time every member count, print the table, write the JSON.

    Args:
        argv: the command line (default: ``sys.argv[1:]``).

    Returns:
        The result written.
    """
    ap = _common.add_flags(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    ap.add_argument("--members", type=int, nargs="+", default=None, help="1 8 32 128 (quick: 1 4)")
    ap.add_argument("--repeats", type=int, default=None, help="3 (quick: 1)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    members = args.members or ([1, 4] if args.quick else [1, 8, 32, 128])
    repeats = args.repeats or (1 if args.quick else 3)
    device = torch.device(args.device)
    g = torch.Generator().manual_seed(0)
    batch = (
        torch.randn(100, 40, generator=g).to(device),
        torch.randint(0, 10, (100,), generator=g).to(device),
    )
    rows = []
    for n in members:
        rows.append(measure(n, batch, repeats, device))
        print(rows[-1], flush=True)
    meta = _common.metadata(
        "vmap_members", device, quick=args.quick, estimator="gam exact + sgd momentum"
    )
    meta["cpu_threads"] = torch.get_num_threads()
    result = {"benchmark": "vmap_members", "meta": meta, "rows": rows}
    path = _common.save(result, args.out)
    print(f"\n{_common.table(COLUMNS, rows)}\n\nJSON: {path}")
    return result


COLUMNS = columns("vmap_members")


if __name__ == "__main__":
    main()
