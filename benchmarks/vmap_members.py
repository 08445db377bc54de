"""N models in one vmapped step against a loop over their own steps (``gamfunc.ensemble``).

The MNIST-1D MLP (40-100-100-10, batch 100), exact GAM over SGD with momentum, every member with its
own ρ and α; for N = 1, 8, 32, 128 members the time of one vmapped step and of the N single-member
steps one after another, each the median of ``--repeats`` after a warm-up, on the same device.

    python benchmarks/vmap_members.py --out benchmarks/results/vmap_members_cpu.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.vmap_grid import build, constant, mlp_params  # the example's model and step
from gamfunc.ensemble import stack, vmap_step


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
        "vmapped_ms": round(vmapped * 1e3, 2),
        "looped_ms": round(looped * 1e3, 2),
        "looped_over_vmapped": round(looped / vmapped, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    device = torch.device(args.device)
    g = torch.Generator().manual_seed(0)
    batch = (
        torch.randn(100, 40, generator=g).to(device),
        torch.randint(0, 10, (100,), generator=g).to(device),
    )
    rows = []
    for n in args.members:
        rows.append(measure(n, batch, args.repeats, device))
        print(rows[-1], flush=True)
    name = (
        torch.cuda.get_device_name()
        if device.type == "cuda"
        else f"cpu ({torch.get_num_threads()} threads)"
    )
    out = {
        "device": name,
        "torch": torch.__version__,
        "estimator": "gam exact + sgd momentum",
        "rows": rows,
    }
    print(f"{'members':>8}{'vmapped ms':>12}{'looped ms':>12}{'loop/vmap':>10}")
    for r in rows:
        print(
            f"{r['members']:>8}{r['vmapped_ms']:>12}{r['looped_ms']:>12}{r['looped_over_vmapped']:>10}"
        )
    if args.out:
        from reproduce.run.report import write_json  # after the path is set

        write_json(args.out, out)


if __name__ == "__main__":
    main()
