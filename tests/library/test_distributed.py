"""gamfunc.distributed on 2 CPU processes (gloo), spawned once for the module; references are computed
in the pytest process on one device, without torch.distributed."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from helpers import HostReads
from torch import nn

import gamfunc
from gamfunc import tree
from gamfunc.wrappers.accumulate import accumulate
from gamfunc.wrappers.distributed import (
    all_reduce_mean,
    broadcast,
    buckets,
    data_parallel,
    global_mean,
)
from gamfunc.wrappers.m_sharpness import m_sharpness
from gamfunc.wrappers.precision import fp16

WORLD = 2
STEPS = 3
F64 = torch.float64

ESTIMATORS = {
    "sgd": lambda: gamfunc.gradient(),
    "sam": lambda: gamfunc.sam(0.1),
    "gam_exact": lambda: gamfunc.gam(0.1, 0.5),
    "gam_reverse": lambda: gamfunc.gam(0.1, 0.5, hvp="reverse"),
    "gam_fd": lambda: gamfunc.gam(0.1, 0.5, hvp=gamfunc.hvps.fd(radius=1e-3)),
    "gam_accelerated": lambda: gamfunc.gam_accelerated(0.1, 0.02, 0.6, 0.4, 0.3),
    "gnp": lambda: gamfunc.gnp(0.2),
    "wsam_decoupled": lambda: gamfunc.wsam(0.1, 0.9, decouple=True, max_norm=1.0),
}


def mlp_params():
    g = torch.Generator().manual_seed(0)
    shapes = {"w1": (6, 4), "b1": (6,), "w2": (3, 6), "b2": (3,)}
    return {k: torch.randn(s, generator=g, dtype=F64) for k, s in shapes.items()}


def mlp_loss(params, batch):
    x, y = batch
    h = torch.tanh(x @ params["w1"].T + params["b1"])
    return F.cross_entropy(h @ params["w2"].T + params["b2"], y)


def full_batch(step, n=12):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(n, 4, generator=g, dtype=F64), torch.randint(0, 3, (n,), generator=g)


def shard(batch, rank, sizes=(6, 6)):
    lo = sum(sizes[:rank])
    return tuple(t[lo : lo + sizes[rank]] for t in batch)


def bn_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 3)).to(F64)


def run_steps(step, params, batches, buffers=None):
    state = step.init(params, buffers)
    for b in batches:
        params, state, metrics = step(params, state, b)
    return params, state, metrics


def reduce_inputs(rank):
    """Per-rank trees for the bucketed all-reduce: mixed dtypes, a 0-d tensor, an integer leaf."""
    g = torch.Generator().manual_seed(rank)
    a = {"x": torch.randn(7, 3, generator=g, dtype=F64), "y": torch.randn(5, generator=g)}
    b = (torch.randn((), generator=g, dtype=F64), torch.tensor([rank + 1, 7]))
    return [a, b, torch.randn(300, generator=g)]


# ---- the spawned ranks -------------------------------------------------------------------------


def _worker(rank, port, outdir):
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD
    )
    try:
        out = _scenarios(rank)
    finally:
        dist.destroy_process_group()
    torch.save(out, os.path.join(outdir, f"rank{rank}.pt"))


def _scenarios(rank):
    out = {}
    params = mlp_params()
    batches = [shard(full_batch(s), rank) for s in range(STEPS)]
    opt = gamfunc.sgd(lr=0.1, momentum=0.9)
    for name, make in ESTIMATORS.items():
        est, loss = data_parallel(make(), mlp_loss, "global")
        p, _, m = run_steps(gamfunc.make_step(est, opt, loss), params, batches)
        out[f"global/{name}"] = (p, m)
        est, loss = data_parallel(make(), mlp_loss, "local")
        out[f"local/{name}"] = est(params, batches[0], loss)
    # A decoupled part (WSAM's) averaged with the direction under local perturbations.
    est, loss = data_parallel(ESTIMATORS["wsam_decoupled"](), mlp_loss, "local")
    out["local_step/wsam_decoupled"] = run_steps(
        gamfunc.make_step(est, opt, loss), params, batches
    )[0]
    # A when= policy under local perturbations: the steps between average their gradients too.
    est, loss = data_parallel(gamfunc.sam(0.1), mlp_loss, "local")
    step = gamfunc.make_step(est, opt, loss, when=gamfunc.when.every(2))
    out["local_step/every2"] = run_steps(step, params, batches)[0]
    # Unequal shards (7 and 5 examples) and 2 micro-batches per rank.
    uneven = shard(full_batch(0), rank, sizes=(7, 5))
    d, info = gamfunc.gam(0.1, 0.5)(params, uneven, global_mean(mlp_loss))
    out["global/uneven"] = (d, info)
    loss = global_mean(accumulate(mlp_loss, 2))
    step = gamfunc.make_step(gamfunc.gam(0.1, 0.5, hvp="reverse"), opt, loss)
    out["global/micro"] = run_steps(step, params, batches)[0]
    # The bucketed all-reduce, with buckets of 64 bytes (so several per dtype).
    out["reduce"] = all_reduce_mean(
        reduce_inputs(rank), weight=rank + 1.0, bucket_cap_mb=64 / 2**20
    )
    # BatchNorm: rank 1 starts from other parameters; broadcast makes them rank 0's.
    model = bn_model()
    loss_fn, p0, b0 = gamfunc.nn.functionalize(model)
    if rank == 1:
        p0 = tree.scale(p0, 3.0)
    p0, b0 = broadcast((p0, b0))
    out["broadcast"] = p0
    for mode in ("global", "local"):
        est, loss = data_parallel(gamfunc.gam(0.05, 0.1, hvp="reverse"), loss_fn, mode)
        step = gamfunc.make_step(est, opt, loss)
        p, state, _ = run_steps(step, p0, batches, b0)
        out[f"bn/{mode}"] = (
            p,
            state.buffers,
            run_steps(step, p0, batches[:1], b0)[1].buffers,
        )
    # fp16: an input that overflows on rank 1 only skips the step on both ranks.
    step = gamfunc.make_step(gamfunc.sam(0.1), opt, global_mean(fp16(mlp_loss_f32)))
    p32 = {k: v.float() for k, v in params.items()}
    x, y = batches[0]
    x = x.float().clone()
    if rank == 1:
        x[0] = 1e5
    state = step.init(p32)
    new, new_state, m = step(p32, state, (x, y))
    out["fp16/overflow"] = (new, new_state, m, p32)
    return out


def mlp_loss_f32(params, batch):
    return mlp_loss(params, batch)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    outdir = tmp_path_factory.mktemp("ranks")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(port, str(outdir)), nprocs=WORLD, join=True)
    return [torch.load(outdir / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


# ---- tests -------------------------------------------------------------------------------------


def rel(a, b):
    a = torch.cat([v.reshape(-1) for v in a.values()])
    b = torch.cat([v.reshape(-1) for v in b.values()])
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_global_mode_equals_single_process_step_on_concatenated_batch(ranks, name):
    step = gamfunc.make_step(ESTIMATORS[name](), gamfunc.sgd(lr=0.1, momentum=0.9), mlp_loss)
    ref, _, ref_m = run_steps(step, mlp_params(), [full_batch(s) for s in range(STEPS)])
    for r in range(WORLD):
        p, m = ranks[r][f"global/{name}"]
        assert rel(p, ref) < 1e-10
        assert torch.allclose(m["loss"], ref_m["loss"], rtol=1e-10, atol=0)
        assert torch.allclose(m["grad_norm"], ref_m["grad_norm"], rtol=1e-10, atol=0)
    assert all(
        torch.equal(ranks[0][f"global/{name}"][0][k], ranks[1][f"global/{name}"][0][k]) for k in ref
    )


def test_global_mode_weights_unequal_shards_by_size(ranks):
    ref, ref_info = gamfunc.gam(0.1, 0.5)(mlp_params(), full_batch(0), mlp_loss)
    for r in range(WORLD):
        d, info = ranks[r]["global/uneven"]
        assert rel(d, ref) < 1e-10
        assert torch.allclose(info["f_norm"], ref_info["f_norm"], rtol=1e-10, atol=0)


def test_global_mode_with_micro_batches_equals_single_process_step(ranks):
    est = gamfunc.gam(0.1, 0.5, hvp="reverse")
    step = gamfunc.make_step(est, gamfunc.sgd(lr=0.1, momentum=0.9), mlp_loss)
    ref, _, _ = run_steps(step, mlp_params(), [full_batch(s) for s in range(STEPS)])
    assert rel(ranks[0]["global/micro"], ref) < 1e-10


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_local_mode_equals_mean_of_per_rank_directions(ranks, name):
    params, batch = mlp_params(), full_batch(0)
    per_rank = [ESTIMATORS[name]()(params, shard(batch, r), mlp_loss) for r in range(WORLD)]
    mean = tree.scale(tree.add(per_rank[0][0], per_rank[1][0]), 0.5)
    mean_loss = (per_rank[0][1]["loss"] + per_rank[1][1]["loss"]) / 2
    on_one_device, _ = m_sharpness(ESTIMATORS[name](), WORLD)(params, batch, mlp_loss)
    for r in range(WORLD):
        d, info = ranks[r][f"local/{name}"]
        assert rel(d, mean) < 1e-12
        assert torch.allclose(info["loss"], mean_loss, rtol=1e-12, atol=0)
        assert rel(d, on_one_device) < 1e-12
    # local perturbations differ from global ones (a decoupled form's direction is the gradient)
    if name != "sgd" and not ESTIMATORS[name]().decoupled:
        glob, _ = ESTIMATORS[name]()(params, batch, mlp_loss)
        assert rel(mean, glob) > 1e-6


def test_local_mode_steps_with_the_mean_of_the_ranks_decoupled_parts(ranks):
    """The decoupled part is averaged over ranks with the direction: the step equals m-sharpness's
    on one device, each rank's shard a sub-batch."""
    est = m_sharpness(ESTIMATORS["wsam_decoupled"](), WORLD)
    step = gamfunc.make_step(est, gamfunc.sgd(lr=0.1, momentum=0.9), mlp_loss)
    ref, _, _ = run_steps(step, mlp_params(), [full_batch(s) for s in range(STEPS)])
    plain = gamfunc.make_step(m_sharpness(gamfunc.gradient(), WORLD), step.optimizer, mlp_loss)
    for r in range(WORLD):
        assert rel(ranks[r]["local_step/wsam_decoupled"], ref) < 1e-12
    assert rel(run_steps(plain, mlp_params(), [full_batch(s) for s in range(STEPS)])[0], ref) > 1e-4


def test_local_mode_with_every_keeps_the_ranks_equal(ranks):
    """every(2): SAM on steps 0 and 2, the gradient on step 1, averaged over the ranks as SAM's
    direction is; the step equals m-sharpness's on one device with the full-batch gradient between."""
    got = [ranks[r]["local_step/every2"] for r in range(WORLD)]
    assert all(torch.equal(got[0][k], got[1][k]) for k in got[0])
    est = m_sharpness(gamfunc.sam(0.1), WORLD)
    step = gamfunc.make_step(est, gamfunc.sgd(lr=0.1, momentum=0.9), mlp_loss, every=2)
    ref, _, _ = run_steps(step, mlp_params(), [full_batch(s) for s in range(STEPS)])
    assert rel(got[0], ref) < 1e-12


def test_bucketed_all_reduce_is_the_weighted_mean(ranks):
    inputs = [reduce_inputs(r) for r in range(WORLD)]
    w = [1.0, 2.0]

    def mean(a, b):
        return (w[0] * a + w[1] * b) / sum(w)

    out = ranks[0]["reduce"]
    for k in ("x", "y"):
        assert torch.allclose(out[0][k], mean(inputs[0][0][k], inputs[1][0][k]), rtol=1e-6, atol=0)
        assert out[0][k].dtype == inputs[0][0][k].dtype
    assert torch.allclose(out[1][0], mean(inputs[0][1][0], inputs[1][1][0]), rtol=1e-12, atol=0)
    assert torch.equal(out[1][1], inputs[0][1][1])  # integers stay this rank's
    assert torch.allclose(out[2], mean(inputs[0][2], inputs[1][2]), rtol=1e-5, atol=1e-7)
    assert torch.equal(ranks[1]["reduce"][2], out[2])


def test_buckets_respect_the_cap_and_the_dtype():
    ts = [
        torch.zeros(10),
        torch.zeros(10),
        torch.zeros(3, dtype=F64),
        torch.zeros(100),
        torch.zeros(1),
    ]
    groups = buckets(ts, cap_bytes=80)
    assert groups == [[0, 1], [2], [3], [4]]
    assert sorted(i for g in groups for i in g) == list(range(len(ts)))


def test_broadcast_gives_every_rank_the_source_parameters(ranks):
    _, p0, _ = gamfunc.nn.functionalize(bn_model())
    for r in range(WORLD):
        assert all(torch.equal(ranks[r]["broadcast"][k], p0[k]) for k in p0)


@pytest.mark.parametrize("mode", ["global", "local"])
def test_batchnorm_ranks_keep_identical_params_and_running_stats(ranks, mode):
    p0, b0, _ = ranks[0][f"bn/{mode}"]
    p1, b1, _ = ranks[1][f"bn/{mode}"]
    assert all(torch.equal(p0[k], p1[k]) for k in p0)
    assert all(torch.equal(b0[k], b1[k]) for k in b0)
    assert int(b0["1.num_batches_tracked"]) == STEPS


@pytest.mark.parametrize("mode", ["global", "local"])
def test_batchnorm_running_stats_are_the_mean_of_the_ranks_updates(ranks, mode):
    loss_fn, params, buffers = gamfunc.nn.functionalize(bn_model())
    per_rank = [loss_fn(params, shard(full_batch(0), r), buffers)[1] for r in range(WORLD)]
    after_one_step = ranks[0][f"bn/{mode}"][2]
    for k in ("1.running_mean", "1.running_var"):
        mean = (per_rank[0][k] + per_rank[1][k]) / 2
        assert torch.allclose(after_one_step[k], mean, rtol=1e-12, atol=1e-15)
        assert not torch.allclose(per_rank[0][k], per_rank[1][k])


def test_fp16_overflow_on_one_rank_skips_the_step_on_every_rank(ranks):
    for r in range(WORLD):
        new, new_state, m, p = ranks[r]["fp16/overflow"]
        assert int(m["skipped"]) == 1
        assert all(torch.equal(new[k], p[k]) for k in p)
        assert float(new_state.loss.scale) == 2.0**15
        (trace, _) = new_state.opt.inner.states
        assert torch.equal(trace.momentum_buffer["w1"], torch.zeros(6, 4))


@pytest.mark.parametrize(
    "estimator",
    [
        gamfunc.gradient(),
        gamfunc.sam(0.05),
        gamfunc.gam(0.05, 0.1),
        gamfunc.gam(0.05, 0.1, hvp="fd"),
        gamfunc.gam_accelerated(0.05, 0.02, 0.6, 0.4, 0.3),
    ],
    ids=["sgd", "sam", "gam", "gam_fd", "accelerated"],
)
def test_the_global_mean_step_reads_no_device_value_on_a_gpu(monkeypatch, estimator):
    """Every gradient of a global-mode step is reduced over ranks; none of it may wait for the
    device. On the CPU the non-finite guard reads one value (no queue to stall); on a GPU it selects
    on the device instead, and the step reads nothing (the guard's rule, forced here)."""
    from gamfunc.wrappers.accumulate import Accumulated

    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.Flatten(),
        torch.nn.Linear(64, 3),
    )
    loss_fn, params, buffers = gamfunc.nn.functionalize(net)
    loss = Accumulated(loss_fn, 1, reduce=lambda trees, weight: trees)  # one rank's reduction
    batch = (torch.randn(6, 3, 6, 6), torch.randint(0, 3, (6,)))
    step = gamfunc.make_step(estimator, gamfunc.sgd(0.1, momentum=0.9), loss)
    state = step.init(params, buffers)
    # the check of the counts reads them where that waits for nothing, on the CPU alone
    # (gamfunc.state.check_counts); on a GPU it reads nothing, as here
    monkeypatch.setattr(gamfunc.state, "_readable", lambda v: False)
    for branch, reads in ((True, 1), (False, 0)):
        monkeypatch.setattr(
            gamfunc.guard.Guard, "reads", lambda self, finite, passes=None, b=branch: b
        )
        with HostReads() as seen:
            new, _, m = step(params, state, batch)
        assert seen.count == reads
        assert int(m["skipped"]) == 0 and not torch.equal(new["0.weight"], params["0.weight"])


def test_the_guard_that_selects_on_the_device_skips_a_non_finite_step(monkeypatch):
    """The GPU's form of the non-finite guard (select, no host read) leaves parameters, optimiser
    state and buffers as they were, as the host branch does."""
    monkeypatch.setattr(gamfunc.guard.Guard, "reads", lambda self, finite, passes=None: False)
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    loss_fn, params, buffers = gamfunc.nn.functionalize(net)
    step = gamfunc.make_step(gamfunc.gam(0.05, 0.1), gamfunc.sgd(0.1, momentum=0.9), loss_fn)
    state = step.init(params, buffers)
    bad = (torch.full((8, 4), float("nan")), torch.randint(0, 2, (8,)))
    new, new_state, m = step(params, state, bad)
    assert int(m["skipped"]) == 1 and int(new_state.step) == 0
    assert all(torch.equal(new[k], params[k]) for k in params)
    assert all(torch.equal(new_state.buffers[k], buffers[k]) for k in buffers)
