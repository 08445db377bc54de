"""LookSAM and Friendly-SAM, the estimators with state: against pytorch_optimizer's LookSAM and
FriendlySAM over 20 float64 steps, in each convention; their state through a skipped step, the
plain-dict form and a fullgraph compile."""

import re

import pytest
import torch
import torch.nn.functional as F
from helpers import flatten, mlp_batch, mlp_loss, mlp_params, rel_err
from test_estimators_family import (
    assert_same_trajectory,
    batches,
    gamfunc_trajectory,
    mlp,
    module_params,
)

import gamfunc
from gamfunc.training.state import as_dict, from_dict


def reference_trajectory(opt, model):
    theirs = []
    for x, y in batches():

        def closure(x=x, y=y):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            return loss

        closure()
        opt.step(closure)
        theirs.append(module_params(model))
    return theirs


def paper_looksam_trajectory(rho, k, alpha, lr, model):
    """LookSAM's Algorithm 1 written with torch.autograd over the whole parameter vector."""
    params = list(model.parameters())

    def grad_at(x, y):
        return torch.cat(
            [g.reshape(-1) for g in torch.autograd.grad(F.cross_entropy(model(x), y), params)]
        )

    out, g_v = [], None
    for t, (x, y) in enumerate(batches()):
        g = grad_at(x, y)
        if t % k == 0:
            e = rho * g / (g.norm() + 1e-12)
            with torch.no_grad():
                torch._foreach_add_(params, _split(e, params))
            g_s = grad_at(x, y)
            with torch.no_grad():
                torch._foreach_sub_(params, _split(e, params))
            u = g / (g.norm() + 1e-12)
            g_v = g_s - (u @ g_s) * u
            d = g_s
        else:
            d = g + alpha * g.norm() / (g_v.norm() + 1e-12) * g_v
        with torch.no_grad():
            torch._foreach_sub_(params, [lr * p for p in _split(d, params)])
        out.append(module_params(model))
    return out


def _split(v, params):
    out, i = [], 0
    for p in params:
        out.append(v[i : i + p.numel()].view_as(p))
        i += p.numel()
    return out


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_looksam_equals_pytorch_optimizer(k, momentum):
    po = pytest.importorskip("pytorch_optimizer")
    rho, alpha, lr = 0.2, 0.7, 0.5
    est = gamfunc.looksam(rho, k, alpha, convention="pytorch_optimizer")
    ours = gamfunc_trajectory(est, gamfunc.sgd(lr=lr, momentum=momentum), mlp())
    model = mlp()
    opt = po.LookSAM(
        model.parameters(), torch.optim.SGD, rho=rho, k=k, alpha=alpha, lr=lr, momentum=momentum
    )
    assert_same_trajectory(ours, reference_trajectory(opt, model))


@pytest.mark.parametrize("k", [1, 4])
def test_looksam_paper_convention_equals_the_algorithm(k):
    rho, alpha, lr = 0.2, 0.7, 0.5
    est = gamfunc.looksam(rho, k, alpha)
    ours = gamfunc_trajectory(est, gamfunc.sgd(lr=lr), mlp())
    assert_same_trajectory(ours, paper_looksam_trajectory(rho, k, alpha, lr, mlp()))


def test_looksam_conventions_differ_on_several_tensors():
    a = gamfunc_trajectory(gamfunc.looksam(0.2, 4, 0.7), gamfunc.sgd(lr=0.5), mlp())
    b = gamfunc_trajectory(
        gamfunc.looksam(0.2, 4, 0.7, convention="pytorch_optimizer"), gamfunc.sgd(lr=0.5), mlp()
    )
    assert rel_err(a[-1], b[-1]) > 1e-6


def test_looksam_reuse_steps_take_one_gradient():
    calls = []

    def counted(p, b):
        calls.append(1)
        return mlp_loss(p, b)

    step = gamfunc.make_step(gamfunc.looksam(0.05, 3, 0.7), gamfunc.sgd(lr=0.1), counted)
    params = mlp_params()
    state = step.init(params)
    per_step = []
    for t in range(6):
        n = len(calls)
        params, state, _ = step(params, state, mlp_batch(seed=t))
        per_step.append(len(calls) - n)
    assert per_step == [2, 1, 1, 2, 1, 1]


@pytest.mark.parametrize("lmbda", [0.6, 0.9])
@pytest.mark.parametrize("sigma", [1.0, 0.5])
def test_friendly_sam_authors_convention_equals_pytorch_optimizer(sigma, lmbda):
    """pytorch_optimizer's FriendlySAM takes the authors' order; the authors' algorithm itself is
    the reference of tests/library/test_estimators_family.py."""
    po = pytest.importorskip("pytorch_optimizer")
    rho, lr = 0.2, 0.5
    est = gamfunc.friendly_sam(rho, sigma, lmbda, convention="authors")
    ours = gamfunc_trajectory(est, gamfunc.sgd(lr=lr, momentum=0.9), mlp())
    model = mlp()
    opt = po.FriendlySAM(
        model.parameters(),
        torch.optim.SGD,
        rho=rho,
        sigma=sigma,
        lmbda=lmbda,
        lr=lr,
        momentum=0.9,
    )
    assert_same_trajectory(ours, reference_trajectory(opt, model))


def test_friendly_sam_paper_convention_equals_the_algorithm():
    rho, sigma, lmbda, lr = 0.2, 1.0, 0.8, 0.5
    ours = gamfunc_trajectory(gamfunc.friendly_sam(rho, sigma, lmbda), gamfunc.sgd(lr=lr), mlp())
    model = mlp()
    params = list(model.parameters())
    m = [torch.zeros_like(p) for p in params]
    theirs = []
    for x, y in batches():
        g = torch.autograd.grad(F.cross_entropy(model(x), y), params)
        m = [lmbda * mi + (1 - lmbda) * gi for mi, gi in zip(m, g, strict=True)]
        d = [gi - sigma * mi for gi, mi in zip(g, m, strict=True)]
        n = torch.sqrt(sum((di**2).sum() for di in d))
        e = [rho * di / (n + 1e-12) for di in d]
        with torch.no_grad():
            torch._foreach_add_(params, e)
        g_s = torch.autograd.grad(F.cross_entropy(model(x), y), params)
        with torch.no_grad():
            torch._foreach_sub_(params, e)
            torch._foreach_sub_(params, [lr * gi for gi in g_s])
        theirs.append(module_params(model))
    assert_same_trajectory(ours, theirs)


def test_friendly_sam_at_sigma_zero_is_sam():
    a = gamfunc_trajectory(gamfunc.friendly_sam(0.2, 0.0, 0.9), gamfunc.sgd(lr=0.5), mlp())
    b = gamfunc_trajectory(gamfunc.sam(0.2), gamfunc.sgd(lr=0.5), mlp())
    assert rel_err(a[-1], b[-1]) <= 1e-12


FACTORIES = {
    "looksam": lambda: gamfunc.looksam(0.05, 3, 0.7),
    "looksam_po": lambda: gamfunc.looksam(0.05, 3, 0.7, convention="pytorch_optimizer"),
    "friendly_sam": lambda: gamfunc.friendly_sam(0.05, 1.0, 0.9),
    "look_gam": lambda: gamfunc.look_gam(0.05, 0.1, 3),
    "friendly_sam_authors": lambda: gamfunc.friendly_sam(0.05, 1.0, 0.9, convention="authors"),
}


def run_steps(step, params, state, n, start=0):
    for t in range(start, start + n):
        params, state, _ = step(params, state, mlp_batch(seed=t))
    return params, state


@pytest.mark.parametrize("name", FACTORIES)
def test_state_round_trips_through_as_dict(name):
    step = gamfunc.make_step(FACTORIES[name](), gamfunc.sgd(lr=0.1, momentum=0.9), mlp_loss)
    params = mlp_params()
    params, state = run_steps(step, params, step.init(params), 4)
    assert torch.utils._pytree.tree_leaves(state.est)
    back = from_dict(as_dict(state), like=step.init(params))
    p1, s1 = run_steps(step, params, state, 3, start=4)
    p2, s2 = run_steps(step, params, back, 3, start=4)
    assert rel_err(flatten(p1), flatten(p2)) == 0
    for a, b in zip(
        torch.utils._pytree.tree_leaves(s1.est),
        torch.utils._pytree.tree_leaves(s2.est),
        strict=True,
    ):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", FACTORIES)
def test_a_skipped_step_leaves_the_estimator_state_unchanged(name):
    def loss_fn(p, b):
        x, y = b
        return mlp_loss(p, (x, y)) * torch.where(torch.isfinite(x).all(), 1.0, float("nan"))

    step = gamfunc.make_step(FACTORIES[name](), gamfunc.sgd(lr=0.1), loss_fn)
    params = mlp_params()
    params, state = run_steps(step, params, step.init(params), 2)
    x, y = mlp_batch(seed=9)
    bad = (torch.full_like(x, float("nan")), y)
    new_params, new_state, metrics = step(params, state, bad)
    assert int(metrics["skipped"]) == 1
    for a, b in zip(
        torch.utils._pytree.tree_leaves(state.est),
        torch.utils._pytree.tree_leaves(new_state.est),
        strict=True,
    ):
        assert torch.equal(a, b)
    assert rel_err(flatten(new_params), flatten(params)) == 0


# The other conventions (pytorch_optimizer's LookSAM, the authors' Friendly-SAM): the estimators of
# the contract's registry compile in test_contract, these are the others.
@pytest.mark.slow
@pytest.mark.parametrize("name", ["looksam_po", "friendly_sam_authors"])
def test_fullgraph_compile_on_cpu_equals_eager(name):
    torch._dynamo.reset()
    params = mlp_params()
    step = gamfunc.make_step(FACTORIES[name](), gamfunc.sgd(lr=0.1, momentum=0.9), mlp_loss)
    # a cycle (LookSAM) picks its branch on the host: step.compile compiles each branch whole
    compiled = (
        step.compile(fullgraph=True, backend="aot_eager")
        if step.every > 1
        else torch.compile(step, fullgraph=True, backend="aot_eager")
    )
    p_e, s_e = run_steps(step, params, step.init(params), 4)
    p_c, s_c = run_steps(compiled, params, step.init(params), 4)
    assert rel_err(flatten(p_c), flatten(p_e)) <= 1e-12
    for a, b in zip(
        torch.utils._pytree.tree_leaves(s_c.est),
        torch.utils._pytree.tree_leaves(s_e.est),
        strict=True,
    ):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=0)


def test_stateless_steps_keep_an_empty_estimator_state():
    step = gamfunc.make_step(gamfunc.sam(0.05), gamfunc.sgd(lr=0.1), mlp_loss)
    params = mlp_params()
    _, state = run_steps(step, params, step.init(params), 1)
    assert state.est == ()
    assert "est" not in as_dict(state)


@pytest.mark.parametrize(
    "make, name",
    [
        (lambda: gamfunc.looksam(-0.1, 3, 0.7), "rho"),
        (lambda: gamfunc.looksam(0.1, 0, 0.7), "k"),
        (lambda: gamfunc.looksam(0.1, 2.5, 0.7), "k"),
        (lambda: gamfunc.looksam(0.1, 3, -1.0), "alpha"),
        (lambda: gamfunc.looksam(0.1, 3, 0.7, eps=-1.0), "eps"),
        (lambda: gamfunc.looksam(0.1, 3, 0.7, convention="x"), "convention"),
        (lambda: gamfunc.friendly_sam(-0.1), "rho"),
        (lambda: gamfunc.friendly_sam(0.1, sigma=-1.0), "sigma"),
        (lambda: gamfunc.friendly_sam(0.1, lmbda=1.0), "lmbda"),
        (lambda: gamfunc.friendly_sam(0.1, lmbda=-0.1), "lmbda"),
        (lambda: gamfunc.friendly_sam(0.1, convention="x"), "convention"),
        (lambda: gamfunc.look_gam(0.1, 0.1, 0), "k"),
        (lambda: gamfunc.look_gam(-0.1, 0.1, 3), "rho"),
        (lambda: gamfunc.look_gam(0.1, 0.1, 3, oracle=gamfunc.sam(0.1)), "oracle"),
        (lambda: gamfunc.gam(0.1, 0.1, oracle=gamfunc.friendly_sam(0.1)), "oracle"),
        (lambda: gamfunc.gam(0.1, 0.1, oracle=gamfunc.looksam(0.1, 3, 0.7)), "oracle"),
    ],
)
def test_bad_hyperparameters_raise_naming_the_argument(make, name):
    with pytest.raises(ValueError, match=name):
        make()


def test_a_cycling_estimator_refuses_every_and_base():
    with pytest.raises(ValueError, match="every and base"):
        gamfunc.make_step(gamfunc.looksam(0.1, 3, 0.7), gamfunc.sgd(lr=0.1), mlp_loss, every=2)


def test_a_state_made_for_another_estimator_is_refused():
    params = mlp_params()
    fsam = gamfunc.make_step(gamfunc.friendly_sam(0.05), gamfunc.sgd(lr=0.1), mlp_loss)
    sam = gamfunc.make_step(gamfunc.sam(0.05), gamfunc.sgd(lr=0.1), mlp_loss)
    with pytest.raises(ValueError, match=re.escape("state.est is ()")):
        fsam(params, sam.init(params), mlp_batch())
    with pytest.raises(ValueError, match=r"state\.est is set"):
        sam(params, fsam.init(params), mlp_batch())


# ---- LookGAM -------------------------------------------------------------------------------------


def test_look_gam_with_k_one_is_gam():
    a = gamfunc_trajectory(gamfunc.look_gam(0.1, 0.3, 1), gamfunc.sgd(lr=0.5), mlp())
    b = gamfunc_trajectory(gamfunc.gam(0.1, 0.3), gamfunc.sgd(lr=0.5), mlp())
    assert max(rel_err(x, y) for x, y in zip(a, b, strict=True)) <= 1e-12


def test_look_gam_takes_gam_then_reuses_the_orthogonal_correction():
    from gamfunc import tree

    rho, alpha, lr, k = 0.1, 0.3, 0.5, 3
    step = gamfunc.make_step(gamfunc.look_gam(rho, alpha, k), gamfunc.sgd(lr=lr), mlp_loss)
    params = mlp_params()
    state = step.init(params)
    ours = []
    for t in range(2 * k):
        params, state, _ = step(params, state, mlp_batch(seed=t))
        ours.append(flatten(params))

    def grad(p, b):
        return torch.func.grad(mlp_loss)(p, b)

    p, u = mlp_params(), None
    for t in range(2 * k):
        b = mlp_batch(seed=t)
        g = grad(p, b)
        g_norm = tree.norm(g)
        if t % k == 0:
            d, _ = gamfunc.gam(rho, alpha)(p, b, mlp_loss)
            c = tree.sub(d, g)
            g_hat = tree.scale(g, 1 / g_norm)
            u = tree.scale(tree.axpy(-tree.vdot(c, g_hat), g_hat, c), 1 / g_norm)
        else:
            d = tree.axpy(g_norm, u, g)
        p = tree.axpy(-lr, d, p)
        assert rel_err(ours[t], flatten(p)) <= 1e-6, t


def test_look_gam_reuse_steps_take_one_gradient():
    calls = []

    def counted(p, b):
        calls.append(1)
        return mlp_loss(p, b)

    step = gamfunc.make_step(gamfunc.look_gam(0.05, 0.1, 3), gamfunc.sgd(lr=0.1), counted)
    params = mlp_params()
    state = step.init(params)
    per_step = []
    for t in range(6):
        n = len(calls)
        params, state, _ = step(params, state, mlp_batch(seed=t))
        per_step.append(len(calls) - n)
    assert per_step[1] == per_step[2] == per_step[4] == per_step[5] == 1
    assert per_step[0] == per_step[3] > 1


@pytest.mark.parametrize("name", ["looksam", "friendly_sam", "look_gam"])
def test_local_perturbation_refuses_a_stateful_estimator(name):
    with pytest.raises(ValueError, match="estimator: '"):
        gamfunc.distributed.local(FACTORIES[name]())
