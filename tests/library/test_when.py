"""gamfunc.when: the base estimator before a late start and the flat one after; AE-SAM's choices
against a naive float64 loop of the paper's Algorithm 1; the policy's state through a checkpoint
and a skipped step; no recompilation as a compiled step switches."""

import math

import pytest
import torch
from helpers import flatten, mlp_batch, mlp_loss, mlp_params, rel_err

import gamfunc
from gamfunc.training.state import as_dict, from_dict

RHO, LR = 0.2, 0.3


def run(step, params, state, n, start=0):
    flags = []
    for t in range(start, start + n):
        params, state, metrics = step(params, state, mlp_batch(seed=t))
        flags.append(int(metrics["full_step"]))
    return params, state, flags


def grad(params, batch):
    p = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    loss = mlp_loss(p, batch)
    g = torch.autograd.grad(loss, list(p.values()))
    return dict(zip(p, g, strict=True))


def sam_direction(params, batch):
    g = grad(params, batch)
    n = math.sqrt(sum(float((v * v).sum()) for v in g.values()))
    return grad({k: params[k] + RHO * g[k] / (n + 1e-12) for k in params}, batch)


def test_late_steps_with_the_base_before_the_start_and_the_estimator_after():
    policy = gamfunc.when.late(0.5, total_steps=6)
    assert policy.start == 3
    step = gamfunc.make_step(gamfunc.sam(RHO), gamfunc.sgd(lr=LR), mlp_loss, when=policy)
    params = mlp_params()
    got, _, flags = run(step, params, step.init(params), 6)
    assert flags == [0, 0, 0, 1, 1, 1]
    ref = dict(params)
    for t in range(6):
        b = mlp_batch(seed=t)
        d = sam_direction(ref, b) if t >= 3 else grad(ref, b)
        ref = {k: ref[k] - LR * d[k] for k in ref}
    assert rel_err(flatten(got), flatten(ref)) < 1e-12


def test_every_is_the_shorthand_of_when_every():
    a = gamfunc.make_step(gamfunc.sam(RHO), gamfunc.sgd(lr=LR), mlp_loss, every=3)
    b = gamfunc.make_step(
        gamfunc.sam(RHO), gamfunc.sgd(lr=LR), mlp_loss, when=gamfunc.when.every(3)
    )
    assert a.when == b.when == gamfunc.when.every(3) and a.every == b.every == 3
    params = mlp_params()
    pa, _, fa = run(a, params, a.init(params), 5)
    pb, _, fb = run(b, params, b.init(params), 5)
    assert fa == fb == [1, 0, 0, 1, 0] and rel_err(flatten(pa), flatten(pb)) == 0


def naive_ae_sam(params, n, total, delta=0.9, lambda1=-1.0, lambda2=1.0):
    """AE-SAM, Algorithm 1 of Jiang et al. (2023), in float64 with Python floats for μ and σ²."""
    mu, var = 0.0, math.exp(-10.0)
    flags = []
    for t in range(n):
        b = mlp_batch(seed=t)
        g = grad(params, b)
        s = sum(float((v * v).sum()) for v in g.values())
        mu = delta * mu + (1 - delta) * s
        var = delta * var + (1 - delta) * (s - mu) ** 2
        c = (t / total) * lambda1 + (1 - t / total) * lambda2
        flat = s >= mu + c * math.sqrt(var)
        d = sam_direction(params, b) if flat else g
        params = {k: params[k] - LR * d[k] for k in params}
        flags.append(int(flat))
    return params, flags, (mu, var)


def test_adaptive_choices_and_trajectory_match_the_papers_algorithm():
    n, total = 12, 12
    policy = gamfunc.when.adaptive(total, lambda1=0.5, lambda2=1.5)
    step = gamfunc.make_step(gamfunc.sam(RHO), gamfunc.sgd(lr=LR), mlp_loss, when=policy)
    params = mlp_params()
    got, state, flags = run(step, params, step.init(params), n)
    ref, ref_flags, (mu, var) = naive_ae_sam(params, n, total, lambda1=0.5, lambda2=1.5)
    assert flags == ref_flags and 0 < sum(flags) < n  # both kinds of step were taken
    assert rel_err(flatten(got), flatten(ref)) < 1e-12
    assert float(state.policy.mean) == pytest.approx(mu, rel=1e-12)
    assert float(state.policy.var) == pytest.approx(var, rel=1e-12)


def test_adaptive_flat_steps_reuse_the_probes_pass():
    calls = []

    def counted(p, b):
        calls.append(1)
        return mlp_loss(p, b)

    policy = gamfunc.when.adaptive(8)
    step = gamfunc.make_step(gamfunc.sam(RHO), gamfunc.sgd(lr=LR), counted, when=policy)
    params, state = mlp_params(), step.init(mlp_params())
    for t in range(8):
        n = len(calls)
        params, state, metrics = step(params, state, mlp_batch(seed=t))
        assert len(calls) - n == 1 + int(metrics["full_step"])  # SAM: 2, the gradient: 1


def test_policy_state_round_trips_through_a_checkpoint_and_survives_a_skipped_step():
    step = gamfunc.make_step(
        gamfunc.sam(RHO), gamfunc.sgd(lr=LR), mlp_loss, when=gamfunc.when.adaptive(10)
    )
    params = mlp_params()
    params, state, _ = run(step, params, step.init(params), 4)
    saved = as_dict(state)
    assert set(saved["policy"]) == {"mean", "var"} and int(saved["cycle"]) == 4
    back = from_dict(saved, like=step.init(params))
    p1, s1, f1 = run(step, params, state, 4, start=4)
    p2, s2, f2 = run(step, params, back, 4, start=4)
    assert f1 == f2 and rel_err(flatten(p1), flatten(p2)) == 0
    assert torch.equal(s1.policy.mean, s2.policy.mean)

    x, y = mlp_batch(seed=9)
    _, skipped, metrics = step(params, state, (torch.full_like(x, float("nan")), y))
    assert int(metrics["skipped"]) == 1
    assert torch.equal(skipped.policy.mean, state.policy.mean)
    assert torch.equal(skipped.policy.var, state.policy.var)


def test_bad_policies_and_both_every_and_when_are_refused():
    with pytest.raises(ValueError, match="total_steps"):
        gamfunc.when.late(0.5)
    with pytest.raises(ValueError, match="start"):
        gamfunc.when.late(-1)
    with pytest.raises(ValueError, match="delta"):
        gamfunc.when.adaptive(10, delta=1.0)
    with pytest.raises(ValueError, match="lambda1"):
        gamfunc.when.adaptive(10, lambda1=float("nan"))
    with pytest.raises(ValueError, match="k"):
        gamfunc.when.every(0)
    with pytest.raises(ValueError, match="every"):
        gamfunc.make_step(
            gamfunc.sam(RHO), gamfunc.sgd(lr=LR), mlp_loss, every=2, when=gamfunc.when.late(3)
        )
    with pytest.raises(TypeError, match="when"):
        gamfunc.make_step(gamfunc.sam(RHO), gamfunc.sgd(lr=LR), mlp_loss, when=3)
    with pytest.raises(ValueError, match="brings its own"):
        gamfunc.make_step(
            gamfunc.looksam(RHO, 3, 0.7), gamfunc.sgd(lr=LR), mlp_loss, when=gamfunc.when.late(2)
        )


@pytest.mark.slow
@pytest.mark.parametrize(
    "policy",
    [gamfunc.when.late(2), gamfunc.when.adaptive(6, lambda1=1.0, lambda2=2.0)],
    ids=["late", "adaptive"],
)
def test_compiled_step_never_recompiles_as_the_policy_switches(policy):
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    step = gamfunc.make_step(
        gamfunc.sam(RHO), gamfunc.sgd(lr=LR, momentum=0.9), mlp_loss, when=policy
    )
    compiled = step.compile(fullgraph=True, backend=counter)
    params = mlp_params()
    p_c, _, f_c = run(compiled, params, step.init(params), 6)
    p_e, _, f_e = run(step, params, step.init(params), 6)
    assert f_c == f_e and 0 < sum(f_c) < 6
    graphs = 2 if not policy.on_device else 3  # the adaptive policy's probe is a third
    assert counter.frame_count == graphs
    assert rel_err(flatten(p_c), flatten(p_e)) < 1e-12


def test_the_facade_takes_when_and_saves_the_policys_state():
    model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    policy = gamfunc.when.adaptive(10, lambda1=1.0, lambda2=2.0)
    opt = gamfunc.torch_optim.SAM(model, gamfunc.sgd(lr=LR), rho=RHO, when=policy)
    flags = []
    for t in range(6):
        opt.step(mlp_batch(seed=t, dtype=torch.float32))
        flags.append(int(opt.metrics["full_step"]))
    assert 0 < sum(flags) < 6
    saved = opt.state_dict()
    assert set(saved["state"]["policy"]) == {"mean", "var"}
    model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    late = gamfunc.torch_optim.SAM(model, gamfunc.sgd(lr=LR), rho=RHO, when=gamfunc.when.late(2))
    flags = []
    for t in range(4):
        late.step(mlp_batch(seed=t, dtype=torch.float32))
        flags.append(int(late.metrics["full_step"]))
    assert flags == [0, 0, 1, 1]


def test_a_cuda_graph_takes_a_policy_that_chooses_on_the_device_and_refuses_host_tensors():
    """The adaptive step is graphed (probe and branches; their equality with the eager step is a GPU
    test of tests/library/test_cuda_graphs.py); on the CPU its call refuses and writes nothing."""
    step = gamfunc.make_step(
        gamfunc.sam(RHO), gamfunc.sgd(lr=LR), mlp_loss, when=gamfunc.when.adaptive(5)
    )
    graphed = gamfunc.cuda_graph(step)
    params = mlp_params()
    state = graphed.init(params)
    before = {k: v.clone() for k, v in params.items()}
    with pytest.raises(ValueError, match="CUDA device"):
        graphed(params, state, mlp_batch(seed=0))
    assert all(torch.equal(params[k], before[k]) for k in params)
    assert not graphed.probe.captures and all(not b.captures for b in graphed.branches)


def test_a_fractional_start_is_the_exact_ceiling_of_the_decimal_fraction():
    """⌈F·T⌉ of F as written: 0.55·100 is 55.00000000000001 in floats, and its ceiling 56."""
    cases = [(0.55, 100, 55), (0.07, 100, 7), (0.75, 400, 300), (0.333, 10, 4), (0.5, 7, 4)]
    for start, total, first in cases:
        assert gamfunc.when.late(start, total_steps=total).start == first, (start, total)
    for hundredths in range(1, 100):  # every two-decimal fraction of 100 steps
        assert gamfunc.when.late(hundredths / 100, total_steps=100).start == hundredths


def test_a_start_that_no_step_of_the_run_reaches_is_refused_naming_start():
    with pytest.raises(ValueError, match="start"):
        gamfunc.when.late(50, total_steps=10)
    with pytest.raises(ValueError, match="start"):
        gamfunc.when.late(10, total_steps=10)  # the steps are 0 to 9: none flat
    with pytest.raises(ValueError, match="start"):
        gamfunc.when.late(0.999, total_steps=100)  # ⌈99.9⌉ = 100
    assert gamfunc.when.late(9, total_steps=10).start == 9
    assert gamfunc.when.late(50).start == 50  # without total_steps nothing to hold it to


def test_a_non_finite_gradient_leaves_the_adaptive_statistics_as_they_were():
    """Under on_nonfinite="ignore" the step is not skipped, so the policy keeps its statistics
    itself where ‖g‖² is not finite: later steps are flat again."""
    policy = gamfunc.when.adaptive(20, lambda1=-10.0, lambda2=-10.0)  # nearly every step flat
    step = gamfunc.make_step(
        gamfunc.sam(RHO), gamfunc.sgd(lr=LR), mlp_loss, when=policy, on_nonfinite="ignore"
    )
    params = mlp_params()
    params, state, flags = run(step, params, step.init(params), 3)
    assert flags == [1, 1, 1]
    x, y = mlp_batch(seed=9)
    _, after, _ = step(params, state, (torch.full_like(x, float("inf")), y))
    assert torch.equal(after.policy.mean, state.policy.mean)
    assert torch.equal(after.policy.var, state.policy.var)
    # the old parameters with the new state: the policy's statistics are what is under test
    _, _, flags = run(step, params, after, 3, start=4)
    assert flags == [1, 1, 1]


def test_adaptive_is_refused_beside_local_perturbations_naming_when():
    """Each rank's probe would take its own ‖g_r‖², so the ranks would choose apart."""
    est, loss = gamfunc.distributed.data_parallel(gamfunc.sam(RHO), mlp_loss, "local")
    with pytest.raises(ValueError, match=r"^when: .*perturbation='global'"):
        gamfunc.make_step(est, gamfunc.sgd(lr=LR), loss, when=gamfunc.when.adaptive(10))
    est, loss = gamfunc.distributed.data_parallel(gamfunc.sam(RHO), mlp_loss, "global")
    gamfunc.make_step(est, gamfunc.sgd(lr=LR), loss, when=gamfunc.when.adaptive(10))


def test_the_base_of_a_local_estimator_is_local_too():
    """The steps between average their gradients over the ranks as the flat ones do: the default
    base is local(gradient()) with the estimator's group and buckets; another base is refused."""
    est = gamfunc.distributed.local(gamfunc.sam(RHO), bucket_cap_mb=3.0)
    step = gamfunc.make_step(est, gamfunc.sgd(lr=LR), mlp_loss, when=gamfunc.when.every(2))
    assert step.base.name == "local(gradient)"
    assert step.base.hparams["perturbation"] == "local"
    assert step.base.hparams["bucket_cap_mb"] == 3.0 and step.base.hparams["group"] is None
    with pytest.raises(ValueError, match=r"^base: "):
        gamfunc.make_step(
            est, gamfunc.sgd(lr=LR), mlp_loss, when=gamfunc.when.every(2), base=gamfunc.gradient()
        )
    local_base = gamfunc.distributed.local(gamfunc.gradient())
    step = gamfunc.make_step(est, gamfunc.sgd(lr=LR), mlp_loss, every=2, base=local_base)
    assert step.base is local_base


@pytest.mark.parametrize("when", [None, gamfunc.when.every(1)])
def test_a_base_without_a_policy_is_refused_naming_base(when):
    """Without a policy every step is the estimator's: a base given would never run."""
    with pytest.raises(ValueError, match=r"^base: .*would never run"):
        gamfunc.make_step(
            gamfunc.sam(0.05), gamfunc.sgd(lr=0.1), mlp_loss, when=when, base=gamfunc.asam(0.5)
        )
    gamfunc.make_step(
        gamfunc.sam(0.05),
        gamfunc.sgd(lr=0.1),
        mlp_loss,
        when=gamfunc.when.late(2),
        base=gamfunc.asam(0.5),
    )


def test_a_numpy_fraction_starts_where_its_float_does():
    np = pytest.importorskip("numpy")
    assert gamfunc.when.late(np.float64(0.55), total_steps=100) == gamfunc.when.late(55)
