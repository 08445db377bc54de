"""The facade on a model sharded by ``fully_shard`` (FSDP2), on 2 and 4 CPU processes (gloo), in
float64: one process group per world size, spawned once, runs every case; the references are
computed in the pytest process on one device, without torch.distributed.

Each sharded step must equal the single-process step on the concatenated batch (1e-12); with
BatchNorm, the single-process step over the ranks' shards as micro-batches (``accumulate=N``: each
rank's batch statistics, the running statistics averaged). The batch holds 8 examples per rank
on 4 ranks: with 4, BatchNorm's statistics and the finite difference's 1/r (GAM's fd, r = 1e-3)
amplify rounding so much that permuting the examples within each micro-batch moves the
single-process reference itself by 5e-13."""

from __future__ import annotations

import io
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import gamfunc
from gamfunc.torch_optim import FlatnessOptimizer, sharded_checkpoint
from gamfunc.torch_optim.sharded import FULLY_SHARD_TORCH, TORCH, per_rank_bytes

try:
    from torch.distributed.fsdp import fully_shard  # torch 2.6
except ImportError:
    try:
        from torch.distributed._composable.fsdp import fully_shard  # torch 2.4, 2.5
    except ImportError:
        fully_shard = None

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        fully_shard is None or not dist.is_available() or not dist.is_gloo_available(),
        reason="needs torch.distributed with gloo and fully_shard (torch >= 2.4)",
    ),
    pytest.mark.skipif(
        TORCH < FULLY_SHARD_TORCH,
        reason="the facade trains fully_shard models from torch 2.14 on (older: refused, "
        "tests/library/test_sharded_refusal.py)",
    ),
]

WORLDS = (2, 4)
STEPS = 5
BATCH = 32
F64 = torch.float64
TOL = 1e-12

ESTIMATORS = {
    "sam": lambda: gamfunc.sam(0.1),
    "asam": lambda: gamfunc.asam(0.5),
    "gsam": lambda: gamfunc.gsam(0.1, 0.3),
    "wsam": lambda: gamfunc.wsam(0.1, 0.9),
    "looksam": lambda: gamfunc.looksam(0.1, k=2, alpha=0.7),
    "friendly_sam": lambda: gamfunc.friendly_sam(0.1, 0.6, 0.9),
    "gnp": lambda: gamfunc.gnp(0.2, hvp=gamfunc.hvps.fd(radius=1e-2)),
    "gam_fd": lambda: gamfunc.gam(0.1, 0.5, hvp=gamfunc.hvps.fd(radius=1e-3)),
    "gam_accelerated": lambda: gamfunc.gam_accelerated(0.1, 0.02, 0.6, 0.4, 0.3),
}
BASES = {
    "sgd": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-3}),
    "adamw": (torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 1e-2}),
}
# gamfunc's own base optimisers: their state, a tuple of the transforms' states, holds DTensors
GAMFUNC_BASES = {
    "sgd": lambda: gamfunc.sgd(0.1, momentum=0.9, weight_decay=1e-3),
    "adamw": lambda: gamfunc.adamw(1e-2, weight_decay=1e-2),
}
# (estimator, base, form). On 2 ranks every estimator with each base, and both forms with each base
# for SAM and GAM; on 4 ranks (where the test's time goes) every estimator with one base in turn.
PAIRS = (("sgd", "batch"), ("adamw", "closure"))
CASES = {
    2: [(e, b, f) for e in ESTIMATORS for b, f in PAIRS]
    + [(e, b, f) for e in ("sam", "gam_fd") for b, f in (("sgd", "closure"), ("adamw", "batch"))],
    4: [(e, *PAIRS[i % 2]) for i, e in enumerate(ESTIMATORS)],
}


def mlp(width=6):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, width), nn.Tanh(), nn.Linear(width, 3)).to(F64)


def bn_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 3)).to(F64)


def blocks_model(n=4, width=32):
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(width, width) for _ in range(n)]).to(F64)


def full_batch(step, n=BATCH):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(n, 4, generator=g, dtype=F64), torch.randint(0, 3, (n,), generator=g)


def shard(batch, rank, world):
    n = batch[0].shape[0] // world
    return tuple(t[rank * n : (rank + 1) * n] for t in batch)


def sharded(model):
    """``model`` with each Linear sharded as a block, then the root (the rest: BatchNorm)."""
    for m in model:
        if isinstance(m, nn.Linear):
            fully_shard(m)
    fully_shard(model)
    return model


def optimiser(model, estimator, base, groups=False):
    cls, kwargs = BASES[base]
    if groups:  # the first layer in a group of its own, another lr and no decay
        first = [p for n, p in model.named_parameters() if n.startswith("0.")]
        rest = [p for n, p in model.named_parameters() if not n.startswith("0.")]
        kwargs = kwargs | {
            "params": [{"params": first, "lr": 0.03, "weight_decay": 0.0}, {"params": rest}]
        }
    return FlatnessOptimizer(model, ESTIMATORS[estimator](), cls, **kwargs)


def train(model, opt, batches, form):
    losses = []
    for xy in batches:
        if form == "batch":
            losses.append(opt.step(xy))
        else:
            x, y = xy

            def closure(x=x, y=y):
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                return loss

            losses.append(opt.step(closure))
    return losses


def full(model) -> dict[str, torch.Tensor]:
    """The whole parameters and buffers (gathered, for the comparison only)."""
    out = {}
    for k, v in model.state_dict().items():
        out[k] = v.full_tensor() if hasattr(v, "full_tensor") else v.detach().clone()
    return out


# ---- the spawned ranks -------------------------------------------------------------------------


def _worker(rank, world, port, outdir):
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        out = _scenarios(rank, world)
    finally:
        dist.destroy_process_group()
    torch.save(out, os.path.join(outdir, f"rank{rank}.pt"))


def _scenarios(rank, world):
    out = {}
    batches = [shard(full_batch(s), rank, world) for s in range(STEPS)]
    for est, base, form in CASES[world]:
        model = sharded(mlp())
        opt = optimiser(model, est, base)
        losses = train(model, opt, batches, form)
        out[f"{est}/{base}/{form}"] = (full(model), losses, {k: v for k, v in opt.metrics.items()})
    for name, make, groups in (("bn", bn_model, False), ("groups", mlp, True)):
        model = sharded(make())
        opt = optimiser(model, "gam_fd", "sgd", groups=groups)
        losses = train(model, opt, batches, "batch")
        out[name] = (full(model), losses, None)
    model = DistributedDataParallel(mlp())  # DDP's hooks: the same route, all-reduced gradients
    opt = optimiser(model, "gam_fd", "sgd")
    losses = train(model, opt, batches, "closure")
    out["ddp"] = (full(model.module), losses, None)
    out["checkpoint"] = _checkpoint(batches, rank)
    out["gamfunc_checkpoint"] = {b: _gamfunc_checkpoint(batches, b) for b in GAMFUNC_BASES}
    out["refusals"] = _refusals(batches[0])
    # the memory of one rank: its shards of the parameters, the gradients and the state
    model = sharded(blocks_model())
    opt = optimiser(model, "sam", "adamw")
    x = torch.randn(BATCH // world, 32, dtype=F64)
    opt.step(lambda: model(x).square().mean())
    out["bytes"] = per_rank_bytes(model, opt)
    return out


def _checkpoint(batches, rank):
    """5 steps at once, and 3 steps, a sharded save, a new model and optimiser, a load and 2 steps:
    F-SAM's running mean (in the step state) and AdamW's moments (in the base) included."""
    model = sharded(mlp())
    opt = optimiser(model, "friendly_sam", "adamw")
    train(model, opt, batches, "batch")
    straight = full(model)
    model = sharded(mlp())
    opt = optimiser(model, "friendly_sam", "adamw")
    train(model, opt, batches[:3], "batch")
    path = Path(os.environ["SHARDED_TMP"]) / "ckpt"
    sharded_checkpoint.save({"model": model.state_dict(), "optim": opt.state_dict()}, path)
    sharded_checkpoint.save({"model": model.state_dict(), "optim": opt.state_dict()}, path)
    files = sorted(p.name for p in path.parent.iterdir())
    model = sharded(mlp())
    opt = optimiser(model, "friendly_sam", "adamw")
    state = {"model": model.state_dict(), "optim": sharded_checkpoint.template(opt)}
    sharded_checkpoint.load(state, path)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    train(model, opt, batches[3:], "batch")
    return straight, full(model), files


def _gamfunc_checkpoint(batches, base):
    """The same with a gamfunc base optimiser (momentum, or AdamW's moments) on shards of uneven
    sizes (mlp's 3 output rows: 2 and 1 on 2 ranks, 1, 1, 1 and none on 4; its 6 hidden rows on 4:
    2, 2, 2 and none): the sharded checkpoint and, each rank's own, the facade's plain state_dict
    through torch.save."""

    def make():
        model = sharded(mlp())
        return model, FlatnessOptimizer(model, ESTIMATORS["friendly_sam"](), GAMFUNC_BASES[base]())

    model, opt = make()
    train(model, opt, batches, "batch")
    straight = full(model)
    model, opt = make()
    train(model, opt, batches[:3], "batch")
    path = Path(os.environ["SHARDED_TMP"]) / f"ckpt_{base}"
    sharded_checkpoint.save({"model": model.state_dict(), "optim": opt.state_dict()}, path)
    plain = io.BytesIO()
    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, plain)
    model, opt = make()
    state = {"model": model.state_dict(), "optim": sharded_checkpoint.template(opt)}
    sharded_checkpoint.load(state, path)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    train(model, opt, batches[3:], "batch")
    resumed = full(model)
    model, opt = make()
    plain.seek(0)
    state = torch.load(plain, weights_only=False)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    train(model, opt, batches[3:], "batch")
    return straight, resumed, full(model)


def _refusals(batch):
    """What a sharded (or DDP) model refuses, each message; and torch.func's silent error."""
    model = sharded(mlp())
    x, y = batch
    F.cross_entropy(model(x), y).backward()
    by_module = {k: p.grad.full_tensor() for k, p in model.named_parameters()}
    params = {k: p.detach() for k, p in model.named_parameters()}
    by_func = torch.func.grad(
        lambda p: F.cross_entropy(torch.func.functional_call(model, p, (x,)), y)
    )(params)
    silent = max(float((by_func[k].full_tensor() - g).abs().max()) for k, g in by_module.items())
    messages = {}
    calls = {
        "functionalize": lambda: gamfunc.nn.functionalize(model),
        "metrics": lambda: gamfunc.metrics.top_eigenvalues(model, [batch], F.cross_entropy),
        "exact": lambda: FlatnessOptimizer(model, gamfunc.gam(0.1, 0.5), torch.optim.SGD, lr=0.1),
        "reverse": lambda: gamfunc.torch_optim.GAM(
            model, torch.optim.SGD, lr=0.1, rho=0.1, alpha=0.5, hvp="reverse"
        ),
        "compile": lambda: FlatnessOptimizer(
            model, gamfunc.sam(0.1), torch.optim.SGD, lr=0.1, compile=True
        ),
        "ddp": lambda: gamfunc.nn.functionalize(DistributedDataParallel(mlp())),
    }
    for name, call in calls.items():
        try:
            call()
        except (TypeError, ValueError) as e:
            messages[name] = (type(e).__name__, str(e))
    return silent, messages


def spawn(world, outdir):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ["SHARDED_TMP"] = str(outdir)
    mp.spawn(_worker, args=(world, port, str(outdir)), nprocs=world, join=True)
    return [torch.load(outdir / f"rank{r}.pt", weights_only=False) for r in range(world)]


# ---- the references ----------------------------------------------------------------------------


def reference(make, est, base, groups=False, accumulate=1):
    model = make()
    if accumulate > 1:
        cls, kwargs = BASES[base]
        opt = FlatnessOptimizer(model, ESTIMATORS[est](), cls, accumulate=accumulate, **kwargs)
    else:
        opt = optimiser(model, est, base, groups=groups)
    losses = [opt.step(full_batch(s)) for s in range(STEPS)]
    return full(model), torch.stack(losses)


def max_error(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


# ---- the checks, each over every rank's results --------------------------------------------------


def check_estimators(ranks, world):
    """Each estimator, base and form: the parameters and losses of the single-process step."""
    wrong = {}
    for est, base, form in CASES[world]:
        ref, ref_losses = reference(mlp, est, base)
        for r, out in enumerate(ranks):
            params, losses, metrics = out[f"{est}/{base}/{form}"]
            err = max_error(params, ref), float((torch.stack(losses) - ref_losses).abs().max())
            if max(err) > TOL or any(hasattr(v, "placements") for v in metrics.values()):
                wrong[(est, base, form, r)] = err
    assert not wrong, wrong


def check_batchnorm(ranks, world):
    """Running statistics: the mean of the ranks', as micro-batches of one process give them."""
    ref, ref_losses = reference(bn_model, "gam_fd", "sgd", accumulate=world)
    assert "1.running_mean" in ref
    for out in ranks:
        params, losses, _ = out["bn"]
        assert max_error(params, ref) < TOL
        assert float((torch.stack(losses) - ref_losses).abs().max()) < TOL


def check_groups(ranks):
    """torch.optim's param groups, each with its lr and weight decay."""
    ref, _ = reference(mlp, "gam_fd", "sgd", groups=True)
    assert max_error(ref, reference(mlp, "gam_fd", "sgd")[0]) > 1e-6  # the groups matter
    for out in ranks:
        assert max_error(out["groups"][0], ref) < TOL


def check_memory(ranks, world):
    """Each rank holds 1/N of the parameters, the gradients and AdamW's moments, ± one block."""
    model = blocks_model()
    whole = sum(p.numel() * p.element_size() for p in model.parameters())
    block = sum(p.numel() * p.element_size() for p in model[0].parameters())
    for out in ranks:
        got = out["bytes"]
        assert abs(got["params"] - whole / world) <= block, got
        assert abs(got["grads"] - whole / world) <= block, got
        # two moments per parameter, and one step count per tensor
        assert abs(got["state"] - 2 * whole / world) <= 2 * block, got


def check_ddp(ranks):
    """A model under DistributedDataParallel: each pass's gradient all-reduced by its hooks."""
    ref, ref_losses = reference(mlp, "gam_fd", "sgd")
    for out in ranks:
        params, losses, _ = out["ddp"]
        assert max_error(params, ref) < TOL
        assert float((torch.stack(losses) - ref_losses).abs().max()) < TOL


def check_checkpoint(ranks):
    """A sharded save and a resume on the same ranks: the uninterrupted run, bit for bit."""
    for out in ranks:
        straight, resumed, files = out["checkpoint"]
        assert files == ["ckpt"]  # the first checkpoint replaced, nothing left beside it
        for k in straight:
            assert torch.equal(straight[k], resumed[k]), k


def check_gamfunc_checkpoint(ranks):
    """With a gamfunc base optimiser on uneven shards: each rank resumes its own shards of the state,
    from the sharded checkpoint and from its plain state_dict, bit for bit."""
    for out in ranks:
        for base, (straight, resumed, plain) in out["gamfunc_checkpoint"].items():
            for k in straight:
                assert torch.equal(straight[k], resumed[k]), (base, "sharded", k)
                assert torch.equal(straight[k], plain[k]), (base, "plain", k)


def check_refusals(ranks):
    """torch.func on a sharded module is wrong without a word; gamfunc refuses it in one line."""
    for out in ranks:
        silent, messages = out["refusals"]
        assert silent > 1e-3  # the error gamfunc refuses to make
        assert set(messages) == {"functionalize", "metrics", "exact", "reverse", "compile", "ddp"}
        for _, msg in messages.values():
            assert "\n" not in msg
        assert messages["functionalize"][0] == "TypeError"
        assert "fully_shard (FSDP2)" in messages["functionalize"][1]
        assert "gamfunc.torch_optim" in messages["functionalize"][1]
        assert messages["metrics"][1].startswith(
            "top_eigenvalues(model, ...): model carries fully_shard"
        )
        assert "DistributedDataParallel" in messages["ddp"][1]
        for name in ("exact", "reverse"):
            assert messages[name][0] == "ValueError"
            assert "hvp=gamfunc.hvps.fd()" in messages[name][1]
        assert messages["compile"][1].startswith("compile=True")


# ---- tests -------------------------------------------------------------------------------------


@pytest.mark.parametrize("world", WORLDS)
def test_sharded_training_on_n_ranks_equals_one_process(world, tmp_path):
    """One process group of ``world`` ranks (spawned once: the test's cost is its start-up) runs
    every case; each check compares every rank's results with one process."""
    ranks = spawn(world, tmp_path)
    check_estimators(ranks, world)
    check_batchnorm(ranks, world)
    check_groups(ranks)
    check_memory(ranks, world)
    check_ddp(ranks)
    check_checkpoint(ranks)
    check_gamfunc_checkpoint(ranks)
    check_refusals(ranks)
