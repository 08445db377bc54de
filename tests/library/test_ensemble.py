"""torch.func.vmap over a whole training step (gamfunc.ensemble): N members with their own params,
states and hyperparameters take, in one vmapped call, the steps a Python loop over members takes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gamfunc
from gamfunc.training.ensemble import stack, unstack, vmap_step

F64 = torch.float64
N = 3
HPARAMS = {
    "lr": torch.tensor([0.1, 0.05, 0.2], dtype=F64),
    "rho": torch.tensor([0.05, 0.1, 0.02], dtype=F64),
    "alpha": torch.tensor([0.1, 0.3, 1.0], dtype=F64),
}
ESTIMATORS = {
    "gradient": lambda rho, alpha: gamfunc.gradient(),
    "sam": lambda rho, alpha: gamfunc.sam(rho),
    "asam": lambda rho, alpha: gamfunc.asam(rho),
    "gnp": lambda rho, alpha: gamfunc.gnp(alpha),
    "gam_exact": lambda rho, alpha: gamfunc.gam(rho, alpha),
    "gam_reverse": lambda rho, alpha: gamfunc.gam(rho, alpha, hvp="reverse"),
    "gam_fd": lambda rho, alpha: gamfunc.gam(rho, alpha, hvp="fd"),
    "sam_gam": lambda rho, alpha: gamfunc.gam(rho, alpha, oracle=gamfunc.sam(0.05)),
    "gam_accelerated": lambda rho, alpha: gamfunc.gam_accelerated(rho, 0.02, 0.6, 0.5, 0.03),
    "gsam": lambda rho, alpha: gamfunc.gsam(rho, alpha),
    "wsam": lambda rho, alpha: gamfunc.wsam(rho, 0.9),
    "sam_3_steps": lambda rho, alpha: gamfunc.sam(rho, ascent_steps=3),
    "friendly_sam": lambda rho, alpha: gamfunc.friendly_sam(rho, alpha, 0.9),
    "friendly_sam_authors": lambda rho, alpha: gamfunc.friendly_sam(
        rho, alpha, 0.9, convention="authors"
    ),
    "wsam_decoupled": lambda rho, alpha: gamfunc.wsam(rho, 0.9, decouple=True, max_norm=1.0),
}
OPTIMIZERS = {
    "sgd": lambda lr: gamfunc.sgd(lr, momentum=0.9, weight_decay=1e-3),
    "adamw": lambda lr: gamfunc.adamw(lambda t: 0.1 * lr(t), weight_decay=1e-2),
}


def loss_fn(p, batch):
    x, y = batch
    return F.cross_entropy(torch.tanh(x @ p["w1"].T + p["b1"]) @ p["w2"].T, y)


def members(n=N, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = {"w1": (8, 5), "b1": (8,), "w2": (3, 8)}
    return [
        {k: torch.randn(s, generator=g, dtype=F64) for k, s in shapes.items()} for _ in range(n)
    ]


def batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(16, 5, generator=g, dtype=F64), torch.randint(0, 3, (16,), generator=g)


def constant(value):
    return lambda t: value


def loop(build, hparams, params, steps, batches):
    """The reference: each member alone, its hyperparameters as plain constant schedules."""
    out = []
    for i, p in enumerate(params):
        h = {k: constant(v[i]) for k, v in hparams.items()}
        step = build(**h)
        state = step.init(p)
        for b in batches[:steps]:
            p, state, metrics = step(p, state, b)
        out.append((p, state, metrics))
    return out


@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
@pytest.mark.parametrize("est", sorted(ESTIMATORS))
def test_the_vmapped_step_is_the_loop_over_members(est, opt):
    def build(lr, rho, alpha):
        return gamfunc.make_step(ESTIMATORS[est](rho, alpha), OPTIMIZERS[opt](lr), loss_fn)

    params, batches = members(), [batch(1), batch(2), batch(3)]
    ens = vmap_step(build, HPARAMS)
    p, state = stack(params), ens.init(stack(params))
    for b in batches:
        p, state, metrics = ens(p, state, b)
    want = loop(build, HPARAMS, params, 3, batches)
    for i, (got_p, got_s) in enumerate(zip(unstack(p), unstack(state), strict=True)):
        ref_p, ref_s, ref_m = want[i]
        for k in ref_p:
            torch.testing.assert_close(got_p[k], ref_p[k], rtol=1e-10, atol=1e-12)
        assert int(got_s.step) == 3 and int(ref_s.step) == 3
        torch.testing.assert_close(metrics["loss"][i], ref_m["loss"], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(metrics["lr"][i], ref_m["lr"], rtol=0, atol=0)
    assert not torch.equal(p["w1"][0], p["w1"][1])  # the members differ


GRID = {  # weight decay and accelerated GAM's α, β, γ per member, 0 included
    "lr": torch.tensor([0.1, 0.05, 0.2], dtype=F64),
    "weight_decay": torch.tensor([0.0, 1e-2, 5e-2], dtype=F64),
    "alpha": torch.tensor([0.6, 0.3, 1.0], dtype=F64),
    "beta": torch.tensor([0.5, 0.2, 0.9], dtype=F64),
    "gamma": torch.tensor([0.0, 0.03, 0.1], dtype=F64),
}
BASES = {
    "sgd": lambda lr, wd: gamfunc.sgd(lr, momentum=0.9, weight_decay=wd),
    "adamw": lambda lr, wd: gamfunc.adamw(lr, weight_decay=wd),
}


@pytest.mark.parametrize("convention", ["paper", "official"])
@pytest.mark.parametrize("opt", sorted(BASES))
def test_weight_decay_and_accelerated_gam_weights_per_member(opt, convention):
    """The reference is each member built with plain numbers, not schedules."""

    def build(lr, weight_decay, alpha, beta, gamma):
        est = gamfunc.gam_accelerated(0.05, 0.02, alpha, beta, gamma, convention=convention)
        return gamfunc.make_step(est, BASES[opt](lr, weight_decay), loss_fn)

    params, batches = members(), [batch(1), batch(2)]
    ens = vmap_step(build, GRID)
    p, state = stack(params), ens.init(stack(params))
    for b in batches:
        p, state, _ = ens(p, state, b)
    for i, got in enumerate(unstack(p)):
        step = build(**{k: float(v[i]) for k, v in GRID.items()})
        ref, ref_state = params[i], step.init(params[i])
        for b in batches:
            ref, ref_state, _ = step(ref, ref_state, b)
        for k in ref:
            torch.testing.assert_close(got[k], ref[k], rtol=1e-10, atol=1e-12)


def test_a_non_finite_member_is_skipped_alone():
    hp = {"lr": torch.tensor([0.1, float("inf"), 0.2], dtype=F64)}  # member 1: an inf update

    def build(lr):
        return gamfunc.make_step(gamfunc.sam(0.05), gamfunc.sgd(lr, momentum=0.9), loss_fn)

    params = members()
    ens = vmap_step(build, hp)
    p, state, metrics = ens(stack(params), ens.init(stack(params)), batch())
    assert metrics["skipped"].tolist() == [0, 1, 0]
    after = unstack(p)
    assert all(torch.equal(after[1][k], params[1][k]) for k in params[1])  # untouched
    want = loop(build, hp, params, 1, [batch()])
    for i in (0, 2):
        for k in params[i]:
            torch.testing.assert_close(after[i][k], want[i][0][k], rtol=1e-12, atol=0)
    assert state.step.tolist() == [1, 0, 1]


class BNNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.bn, self.out = nn.Linear(5, 8), nn.BatchNorm1d(8), nn.Linear(8, 3)

    def forward(self, x):
        return self.out(torch.tanh(self.bn(self.lin(x))))


def test_batchnorm_members_keep_their_own_running_statistics():
    nets = []
    for seed in range(N):
        torch.manual_seed(seed)
        nets.append(BNNet().double())
    module_loss, _, _ = gamfunc.nn.functionalize(nets[0])
    params = [{k: v.detach().clone() for k, v in n.named_parameters()} for n in nets]
    buffers = [{k: v.detach().clone() for k, v in n.named_buffers()} for n in nets]

    def build(lr, rho):
        return gamfunc.make_step(gamfunc.sam(rho), gamfunc.sgd(lr), module_loss)

    hp = {k: HPARAMS[k] for k in ("lr", "rho")}
    ens = vmap_step(build, hp)
    p, state = stack(params), ens.init(stack(params), stack(buffers))
    for b in (batch(1), batch(2)):
        p, state, _ = ens(p, state, b)
    for i in range(N):
        h = {k: constant(v[i]) for k, v in hp.items()}
        step = build(**h)
        q, s = params[i], step.init(params[i], buffers[i])
        for b in (batch(1), batch(2)):
            q, s, _ = step(q, s, b)
        for k in q:
            torch.testing.assert_close(p[k][i], q[k], rtol=1e-10, atol=1e-12)
        for k, v in s.buffers.items():
            torch.testing.assert_close(state.buffers[k][i], v, rtol=1e-10, atol=1e-12)
    assert not torch.equal(state.buffers["bn.running_mean"][0], state.buffers["bn.running_mean"][1])


def test_per_member_batches():
    def build(lr):
        return gamfunc.make_step(gamfunc.gradient(), gamfunc.sgd(lr), loss_fn)

    hp = {"lr": HPARAMS["lr"]}
    params = members()
    batches = [batch(10 + i) for i in range(N)]
    ens = vmap_step(build, hp, batch_axis=0)
    p, _, _ = ens(stack(params), ens.init(stack(params)), stack(batches))
    for i in range(N):
        want = loop(build, {"lr": hp["lr"][i : i + 1]}, [params[i]], 1, [batches[i]])[0][0]
        for k in want:
            torch.testing.assert_close(p[k][i], want[k], rtol=1e-12, atol=0)


def test_stack_unstack_and_bad_arguments():
    ts = members()
    assert all(
        torch.equal(a[k], b[k]) for a, b in zip(unstack(stack(ts)), ts, strict=True) for k in a
    )
    with pytest.raises(ValueError, match="one structure"):
        stack([{"a": torch.zeros(1)}, {"b": torch.zeros(1)}])
    with pytest.raises(ValueError, match="hparams must be 1-d tensors of one length"):
        vmap_step(lambda lr, rho: None, {"lr": torch.zeros(3), "rho": torch.zeros(2)})
    with pytest.raises(ValueError, match="hparams must be a non-empty dict"):
        vmap_step(lambda: None, {})
    ens = vmap_step(
        lambda lr: gamfunc.make_step(gamfunc.gradient(), gamfunc.sgd(lr), loss_fn),
        {"lr": torch.ones(2)},
    )
    with pytest.raises(ValueError, match="stacked over the 2 members"):
        ens.init(stack(members()))


@pytest.mark.slow
def test_the_compiled_vmapped_step_equals_the_loop():
    """torch.compile of the vmapped step, SAM: two gradients and a normalisation. Dynamo's vmap and
    AOTAutograd (aot_eager) turn the batched step into plain aten operations, which is what is vmap's
    own here; inductor lowers such graphs in the compile tests of the step."""

    def build(lr, rho, alpha):
        return gamfunc.make_step(gamfunc.sam(rho), gamfunc.sgd(lr, momentum=0.9), loss_fn)

    params = members()
    ens = vmap_step(build, HPARAMS)
    fast = torch.compile(ens.__call__, fullgraph=True, backend="aot_eager")
    p, state = stack(params), ens.init(stack(params))
    for b in (batch(1), batch(2)):
        p, state, _ = fast(p, state, b)
    want = loop(build, HPARAMS, params, 2, [batch(1), batch(2)])
    for i in range(N):
        for k in params[i]:
            torch.testing.assert_close(p[k][i], want[i][0][k], rtol=1e-9, atol=1e-11)
