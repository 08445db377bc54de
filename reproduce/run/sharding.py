"""The parts of ``train.py --fsdp`` (`reproduce.run.fsdp`): what it refuses, how a model is
sharded, its base optimiser, the bytes a rank holds, and evaluation of a sharded model.

A model is sharded per block (`shard_model`): each residual block of a ResNet and each transformer
block of a ViT (`BLOCKS`) its own ``fully_shard`` unit, then the root; a network without such
blocks, each module that holds parameters of its own. Every pass all-gathers one unit at a time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gamfunc.torch_optim import FlatnessOptimizer
from reproduce.config import Config, estimators_of
from reproduce.data import sets as data_mod
from reproduce.run.evaluation import inputs
from reproduce.run.launch import Processes, sum_over_ranks

__all__ = [
    "BLOCKS",
    "ESTIMATORS",
    "INSTEAD",
    "base_optimizer",
    "evaluate",
    "refusal",
    "shard_model",
    "state_bytes",
]

ESTIMATORS = (
    *("sgd", "sam", "asam", "gsam", "wsam", "looksam", "friendly_sam", "gnp", "gam_fd"),
    *("gam_accelerated", "gam_accelerated_official"),
)
# Each estimator that needs exact or reverse H·v, and what --fsdp trains in its place.
INSTEAD = {
    "gam": "--estimator=gam_fd",
    "gam_reverse": "--estimator=gam_fd",
    "look_gam": "--estimator=gam_fd",
    "sam+gam": "--estimator=sam or --estimator=gam_fd",
    "gsam+gam": "--estimator=gsam or --estimator=gam_fd",
}
# The classes of the residual and transformer blocks of reproduce.models (and of torchvision's
# networks), each sharded as one unit.
BLOCKS = frozenset(
    {
        *("_Basic", "_Bottleneck", "_ResNet32Block", "_Residual", "_WideBlock", "_NeXtBlock"),
        *("_PyramidBlock", "_PyramidBottleneck", "_ViTBlock"),
        *("BasicBlock", "Bottleneck", "EncoderBlock", "_DenseBlock", "_Transition"),
    }
)


def refusal(cfg: Config) -> str | None:
    """What ``--fsdp`` cannot run in ``cfg``, in one line naming the flag; None where it runs."""
    if not cfg.fsdp:
        return None
    for e in estimators_of(cfg):
        if e == "gnp" and cfg.gnp_hvp != "fd":
            return (
                f"--fsdp with --gnp_hvp={cfg.gnp_hvp}: a sharded model runs gradients only, and "
                "exact or reverse H·v differentiates a gradient's graph that FSDP2's hooks free: "
                "use --gnp_hvp=fd"
            )
        if e not in ESTIMATORS:
            instead = INSTEAD.get(e, f"one of {', '.join(ESTIMATORS)}")
            return (
                f"--fsdp with --estimator={e}: a sharded model runs the estimators built on "
                "gradients alone, and exact or reverse H·v differentiates a gradient's graph "
                f"that FSDP2's hooks free: use {instead} (finite-difference H·v)"
                if e in INSTEAD
                else f"--fsdp with --estimator={e}: not run on a sharded model; use {instead}"
            )
    if cfg.compile or cfg.mode.startswith("compile"):
        return "--fsdp runs the step eagerly: drop --compile (and --mode=compile*)"
    if cfg.cuda_graph or cfg.mode == "graph":
        return "--fsdp runs the step eagerly: drop --cuda_graph (and --mode=graph)"
    rules = (
        (cfg.bf16, "--bf16", "the step runs in the model's precision; drop --bf16"),
        (cfg.channels_last, "--channels_last", "drop --channels_last"),
        (cfg.perturbation == "local", "--perturbation=local", "its step is global; drop it"),
        (cfg.flatness_every > 0, "--flatness_every", "no flatness metrics; set it to 0"),
        (cfg.histogram_every > 0, "--histogram_every", "no histograms; set it to 0"),
        (cfg.profile_steps > 0, "--profile_steps", "no profiles; set it to 0"),
    )
    for bad, flag, what in rules:
        if bad:
            return f"--fsdp with {flag}: {what}"
    return None


def _outermost(units: list[nn.Module]) -> list[nn.Module]:
    inner = {id(m) for u in units for m in u.modules() if m is not u}
    return [u for u in units if id(u) not in inner]


def shard_model(model: nn.Module, mesh) -> int:
    """``fully_shard`` each block of ``model`` (`BLOCKS`; without any, each module holding
    parameters of its own), then the root; the number of units before the root."""
    from torch.distributed.fsdp import fully_shard

    units = [m for m in model.modules() if type(m).__name__ in BLOCKS]
    if not units:
        units = [
            m
            for m in model.modules()
            if m is not model and next(m.parameters(False), None) is not None
        ]
    units = _outermost(units)
    for u in units:
        fully_shard(u, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return len(units)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def state_bytes(opt: FlatnessOptimizer) -> int:
    """This rank's bytes of the facade's step state (its counters, an estimator's own state: F-SAM's
    running mean), its shards of each DTensor; the base optimiser's is `per_rank_bytes`'s."""
    total, todo = 0, [opt.state_dict()["state"]]
    while todo:
        obj = todo.pop()
        if isinstance(obj, torch.Tensor):
            t = _local(obj)
            total += t.numel() * t.element_size()
        elif isinstance(obj, dict):
            todo.extend(obj.values())
        elif isinstance(obj, list | tuple):
            todo.extend(obj)
    return total


def base_optimizer(cfg: Config, model: nn.Module) -> tuple[type, dict]:
    """The ``torch.optim`` class and keyword arguments of the base optimiser of ``cfg`` over
    ``model``'s parameters: SGD (momentum, coupled weight decay) or AdamW, the same updates as
    train.py's `reproduce.build.build_optimizer`; with ``no_decay_1d``, 1-d tensors in a group
    without weight decay. (A ``torch.optim`` base keeps its state as the shards of the parameters,
    which `gamfunc.torch_optim.sharded_checkpoint` saves and resumes bit for bit.)"""
    named = [(k, p) for k, p in model.named_parameters() if p.requires_grad]
    if cfg.no_decay_1d:
        params = [
            {"params": [p for _, p in named if p.dim() > 1]},
            {"params": [p for _, p in named if p.dim() <= 1], "weight_decay": 0.0},
        ]
    else:
        params = [{"params": [p for _, p in named]}]
    params = [g for g in params if g["params"]]
    kwargs = {"params": params, "lr": cfg.lr, "weight_decay": cfg.weight_decay}
    if cfg.base == "adamw":
        return torch.optim.AdamW, kwargs | {"betas": (cfg.beta1, cfg.beta2)}
    return torch.optim.SGD, kwargs | {"momentum": cfg.momentum, "nesterov": cfg.nesterov}


@torch.no_grad()
def evaluate(model: nn.Module, ds, batches, procs: Processes, batch_size: int) -> dict:
    """Loss, top-1 and top-5 accuracy (%) over ``ds`` in eval mode, each rank over its share; every
    rank runs as many forward passes (one with no example where its share has run out), since each
    all-gathers the shards."""
    part = data_mod.shard(ds, procs.rank, procs.world)
    share = -(-len(ds) // procs.world)  # the largest rank's share
    rounds = -(-share // batch_size)
    empty = data_mod.stack(ds, torch.zeros(1, dtype=torch.int64))[0][:0]
    sums = torch.zeros(4, dtype=torch.float64, device=procs.device)  # loss, top-1, top-5, seen
    it = iter(batches(part))
    was = model.training
    model.eval()
    try:
        for _ in range(rounds):
            x, y = next(it, (empty, torch.zeros(0, dtype=torch.int64)))
            x, y = inputs(x, procs.device), y.to(procs.device)
            logits = model(x).float()
            top = logits.topk(min(5, logits.shape[-1]), dim=-1).indices
            sums += torch.stack(
                [
                    F.cross_entropy(logits, y, reduction="sum").double(),
                    (top[:, 0] == y).sum().double(),
                    (top == y[:, None]).any(-1).sum().double(),
                    torch.tensor(float(len(y)), dtype=torch.float64, device=procs.device),
                ]
            )
    finally:
        model.train(was)
    (sums,) = sum_over_ranks(procs, [sums])
    n = max(float(sums[3]), 1.0)
    return {
        "loss": float(sums[0]) / n,
        "acc": 100 * float(sums[1]) / n,
        "top5": 100 * float(sums[2]) / n,
    }
