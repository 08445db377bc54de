"""Data-parallel scaling of gamfunc steps: images/s per GPU in global and local mode against one GPU.

ResNet-18 of the CIFAR experiments (``reproduce.models.build_model("resnet18", 10, 32)``), synthetic
32×32 images, ``--batch`` images per GPU, SGD-momentum updates. For each estimator the script times

* ``1gpu``: rank 0 alone, the plain step (the other ranks wait);
* ``global``: ``gamfunc.distributed.data_parallel(..., perturbation="global")`` on every rank;
* ``local``:  ``gamfunc.distributed.data_parallel(..., perturbation="local")`` on every rank;

and prints a table and a JSON record: step time (slowest rank), images/s per GPU, scaling efficiency
(images/s per GPU over the 1-GPU figure) and the cost relative to SGD in the same mode.

On 2 GPUs (NCCL)::

    torchrun --standalone --nproc_per_node 2 benchmarks/distributed_scaling.py \
        --out benchmarks/distributed_scaling.json

Smoke test on CPU (gloo, a tiny network, seconds)::

    torchrun --standalone --nproc_per_node 2 benchmarks/distributed_scaling.py --tiny
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gamfunc
from gamfunc.distributed import broadcast, data_parallel
from gamfunc.precision import mixed

ESTIMATORS = {
    "sgd": lambda: gamfunc.gradient(),
    "sam": lambda: gamfunc.sam(0.05),
    "gam_fd": lambda: gamfunc.gam(0.05, 0.1, hvp="fd", fd_radius=1e-3),
    "gam_exact": lambda: gamfunc.gam(0.05, 0.1, hvp="exact"),
}


def tiny_net():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(8, 10),
    )  # fmt: skip


def build(tiny: bool):
    if tiny:
        return tiny_net(), 8
    from reproduce.models import build_model

    return build_model("resnet18", 10, 32), 32


def time_steps(step, params, state, batch, warmup, steps, device):
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(warmup):
        params, state, _ = step(params, state, batch)
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        params, state, metrics = step(params, state, batch)
    sync()
    assert int(metrics["skipped"]) == 0, "a timed step was skipped"
    return (time.perf_counter() - start) / steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--estimators", default="sgd,sam,gam_fd,gam_exact")
    ap.add_argument("--batch", type=int, default=128, help="images per GPU")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    ap.add_argument("--tiny", action="store_true", help="CPU, gloo, a tiny network: a smoke test")
    ap.add_argument("--out", default=None, help="write the JSON record here (rank 0)")
    args = ap.parse_args()
    if args.tiny:
        args.batch, args.steps, args.warmup = 8, 2, 1

    cuda = torch.cuda.is_available() and not args.tiny
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
    if "RANK" not in os.environ:  # plain `python ...`: a group of one
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1")
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    model, size = build(args.tiny)
    loss_fn, params, buffers = gamfunc.nn.functionalize(model.to(device))
    params, buffers = broadcast((params, buffers))
    loss_fn = mixed(loss_fn, args.precision)
    g = torch.Generator(device=device).manual_seed(1000 + rank)
    batch = (
        torch.randn(args.batch, 3, size, size, device=device, generator=g),
        torch.randint(0, 10, (args.batch,), device=device, generator=g),
    )
    opt = gamfunc.sgd(lr=0.01, momentum=0.9, weight_decay=5e-4)

    rows = []
    for name in args.estimators.split(","):
        for mode in ("1gpu", "global", "local"):
            if mode == "1gpu":
                seconds = 0.0
                if rank == 0:
                    step = gamfunc.make_step(ESTIMATORS[name](), opt, loss_fn)
                    seconds = time_steps(
                        step,
                        params,
                        step.init(params, buffers),
                        batch,
                        args.warmup,
                        args.steps,
                        device,
                    )
                dist.barrier()
                t = torch.tensor([seconds], dtype=torch.float64, device=device)
                dist.broadcast(t, 0)
            else:
                est, loss = data_parallel(ESTIMATORS[name](), loss_fn, mode)
                step = gamfunc.make_step(est, opt, loss)
                seconds = time_steps(
                    step, params, step.init(params, buffers), batch, args.warmup, args.steps, device
                )
                t = torch.tensor([seconds], dtype=torch.float64, device=device)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
            rows.append({"estimator": name, "mode": mode, "step_ms": 1e3 * float(t)})

    by_key = {(r["estimator"], r["mode"]): r for r in rows}
    for r in rows:
        r["images_per_s_per_gpu"] = args.batch / (r["step_ms"] / 1e3)
        r["efficiency"] = (
            r["images_per_s_per_gpu"] / by_key[(r["estimator"], "1gpu")]["images_per_s_per_gpu"]
        )
        sgd = by_key.get(("sgd", r["mode"]))
        r["cost_vs_sgd"] = r["step_ms"] / sgd["step_ms"] if sgd else None
    record = {
        "benchmark": "distributed_scaling",
        "model": "tiny_net" if args.tiny else "resnet18 (CIFAR, 32x32)",
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "backend": dist.get_backend(),
        "world_size": world,
        "batch_per_gpu": args.batch,
        "precision": args.precision,
        "steps": args.steps,
        "warmup": args.warmup,
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "results": rows,
    }
    if rank == 0:
        print(f"{record['model']} on {world} x {record['device']} ({record['backend']}), "
              f"batch {args.batch}/GPU, {args.precision}")  # fmt: skip
        print(
            f"{'estimator':<10} {'mode':<7} {'step ms':>9} {'img/s/GPU':>10} {'efficiency':>10} {'x SGD':>6}"
        )
        for r in rows:
            cost = f"{r['cost_vs_sgd']:.2f}" if r["cost_vs_sgd"] else "-"
            print(f"{r['estimator']:<10} {r['mode']:<7} {r['step_ms']:>9.1f} "
                  f"{r['images_per_s_per_gpu']:>10.0f} {r['efficiency']:>10.2f} {cost:>6}")  # fmt: skip
        from reproduce.run.report import dumps, write_json  # after the path is set

        print(dumps(record, indent=None))
        if args.out:
            write_json(args.out, record)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
