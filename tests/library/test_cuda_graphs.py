"""``gamfunc.cuda_graph``: a whole step replayed as a CUDA graph computes what the step computes, stays
pure, and refuses what a graph cannot do with a clear error."""

from __future__ import annotations

import pytest
import torch
from models import tiny_conv_bn

import gamfunc
from gamfunc import schedules

ESTIMATORS = {
    "gradient": lambda: gamfunc.gradient(),
    "sam": lambda: gamfunc.sam(schedules.cosine(0.05, 10)),
    "gam_exact": lambda: gamfunc.gam(0.05, 0.5),
    "gam_fd": lambda: gamfunc.gam(0.05, 0.5, hvp="fd"),
    "gam_accelerated": lambda: gamfunc.gam_accelerated(0.05, 0.02, 0.5, 0.5, 0.2),
    "looksam": lambda: gamfunc.looksam(0.05, 3, 0.7),
    "friendly_sam": lambda: gamfunc.friendly_sam(0.05, 1.0, 0.6),
}


def loss_on(device, dtype=torch.float32):
    torch.manual_seed(0)
    model = tiny_conv_bn().to(device, dtype)
    loss_fn, params, buffers = gamfunc.nn.functionalize(model)
    gen = torch.Generator().manual_seed(1)
    batches = [
        (
            torch.randn(8, 3, 6, 6, generator=gen, dtype=dtype).to(device),
            torch.randint(0, 5, (8,), generator=gen).to(device),
        )
        for _ in range(7)
    ]
    return loss_fn, params, buffers, batches


def trajectory(step, params, buffers, batches):
    state = step.init(params, buffers)
    out = []
    for batch in batches:
        params, state, metrics = step(params, state, batch)
        out.append((params, state, metrics))
    return out


def assert_same_trajectory(step, graphed, params, buffers, batches):
    for want, got in zip(
        trajectory(step, params, buffers, batches),
        trajectory(graphed, params, buffers, batches),
        strict=True,
    ):
        assert_same(want, got)


def assert_same(a, b):
    flat_a, spec_a = torch.utils._pytree.tree_flatten(a)
    flat_b, spec_b = torch.utils._pytree.tree_flatten(b)
    assert spec_a == spec_b
    for x, y in zip(flat_a, flat_b, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6, equal_nan=True)


# ---------------------------------------------------------------- refusals (any machine)


def test_refuses_what_a_graph_cannot_do():
    loss_fn, params, buffers, batches = loss_on("cpu")
    step = gamfunc.make_step(gamfunc.gradient(), gamfunc.sgd(0.1), loss_fn)
    with pytest.raises(ValueError, match="warmup"):
        gamfunc.cuda_graph(step, warmup=0)
    with pytest.raises(TypeError, match="make_step"):
        gamfunc.cuda_graph(lambda p, s, b: None)
    raising = gamfunc.make_step(gamfunc.gradient(), gamfunc.sgd(0.1), loss_fn, on_nonfinite="raise")
    with pytest.raises(ValueError, match="on_nonfinite"):
        gamfunc.cuda_graph(raising)
    with pytest.raises(TypeError, match="cuda_graph"):
        gamfunc.cuda_graphs.release(step)
    graphed = gamfunc.cuda_graph(step)
    state = graphed.init(params, buffers)
    before = {k: v.clone() for k, v in params.items()}
    with pytest.raises(ValueError, match="CUDA device"):
        graphed(params, state, batches[0])
    assert all(torch.equal(params[k], before[k]) for k in params)  # nothing lost


# ---------------------------------------------------------------- on a GPU

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("name", ESTIMATORS)
@pytest.mark.parametrize("scope", ["", "pass"])
def test_graphed_step_equals_the_step(name, scope):
    loss_fn, params, buffers, batches = loss_on("cuda")
    opt = gamfunc.sgd(schedules.cosine(0.1, 10), momentum=0.9, weight_decay=5e-4)
    step = gamfunc.make_step(ESTIMATORS[name](), opt, loss_fn)
    if scope:
        step = step.compile(scope=scope)
    graphed = gamfunc.cuda_graph(step, warmup=2)
    assert_same_trajectory(step, graphed, params, buffers, batches)


@pytest.mark.gpu
@gpu
def test_every_k_replays_each_branch_and_keeps_the_schema():
    loss_fn, params, buffers, batches = loss_on("cuda")
    step = gamfunc.make_step(gamfunc.gam(0.05, 0.5, hvp="fd"), gamfunc.sgd(0.1), loss_fn, every=3)
    graphed = gamfunc.cuda_graph(step, warmup=1)
    assert_same_trajectory(step, graphed, params, buffers, batches)
    assert len(graphed.branches[0].captures) == len(graphed.branches[1].captures) == 1


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("scope", ["", "pass"])
def test_the_adaptive_policy_is_a_graph_for_its_probe_and_one_per_branch(scope):
    """AE-SAM's trigger (on this model's CPU run: flat, base, base, flat, flat, base, flat): the
    graphed step chooses and steps as the step does, each function captured once it repeats."""
    loss_fn, params, buffers, batches = loss_on("cuda")
    policy = gamfunc.when.adaptive(len(batches), lambda1=1.0, lambda2=3.0)
    opt = gamfunc.sgd(0.1, momentum=0.9)
    step = gamfunc.make_step(gamfunc.gam(0.05, 0.5, hvp="fd"), opt, loss_fn, when=policy)
    if scope:
        step = step.compile(scope=scope)
    graphed = gamfunc.cuda_graph(step, warmup=1)
    want = trajectory(step, params, buffers, batches)
    got = trajectory(graphed, params, buffers, batches)
    for a, b in zip(want, got, strict=True):
        assert_same(a, b)
    flags = [int(m["full_step"]) for _, _, m in got]
    assert 2 <= sum(flags) <= len(flags) - 2  # each branch replayed after its capture
    assert len(graphed.probe.captures) == 1
    assert [len(b.captures) for b in graphed.branches] == [1, 1]
    gamfunc.cuda_graphs.release(graphed)
    assert not graphed.probe.captures and all(not b.captures for b in graphed.branches)


@pytest.mark.gpu
@gpu
def test_graphed_step_is_pure():
    """The caller's tensors are never written; returned tensors are the caller's own (a later replay
    leaves them); a returned tensor changed in place is copied in again; a new batch shape is a
    capture of its own."""
    loss_fn, params, buffers, batches = loss_on("cuda")
    step = gamfunc.make_step(gamfunc.gam(0.05, 0.5, hvp="fd"), gamfunc.sgd(0.1), loss_fn)
    graphed = gamfunc.cuda_graph(step, warmup=1)
    state = graphed.init(params, buffers)
    ref_state = step.init(params, buffers)
    p0 = {k: v.clone() for k, v in params.items()}
    p, s, _ = graphed(params, state, batches[0])  # warm-up
    p, s, _ = graphed(p, s, batches[1])  # capture and replay
    kept = {k: v.clone() for k, v in p.items()}
    p2, s2, _ = graphed(p, s, batches[2])  # replay: p is not copied in, and not written
    assert all(torch.equal(params[k], p0[k]) for k in params)
    assert all(torch.equal(p[k], kept[k]) for k in p)
    rp, rs, _ = step(params, ref_state, batches[0])
    rp, rs, _ = step(rp, rs, batches[1])
    rp, rs, _ = step(rp, rs, batches[2])
    assert_same(p2, rp)
    # the caller changes a returned tensor in place: the next step must see the change
    name = next(iter(p2))
    p2[name].mul_(0.5)
    rp[name].mul_(0.5)
    assert_same(step(rp, rs, batches[3])[0], graphed(p2, s2, batches[3])[0])
    # other params than the last returned ones are copied in
    assert_same(step(params, ref_state, batches[4])[0], graphed(params, state, batches[4])[0])
    # a smaller batch: a capture of its own after its warm-up
    small = tuple(t[:4] for t in batches[5])
    for _ in range(2):
        assert_same(step(params, ref_state, small)[0], graphed(params, state, small)[0])
    assert len(graphed.branches[0].captures) == 2
    gamfunc.cuda_graphs.release(graphed)  # every graph dropped; the next calls capture anew
    assert not graphed.branches[0].captures
    for _ in range(2):
        assert_same(step(params, ref_state, small)[0], graphed(params, state, small)[0])
