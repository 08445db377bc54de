"""GSAM, WSAM and multi-step SAM against independent implementations: pytorch_optimizer's GSAM and
WSAM on a torch.nn MLP, and the multi-step ascent written as a loop with torch.autograd; 20 steps of
training in float64, compared step by step."""

import pytest
import torch
import torch.nn.functional as F
from helpers import Naive, flatten, mlp_batch, mlp_loss, mlp_params, rel_err, unflatten
from torch import nn

import gamfunc
from gamfunc import schedules

STEPS = 20
TOL = 1e-6


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).to(torch.float64)


def batches():
    return [mlp_batch(n=16, seed=100 + t) for t in range(STEPS)]


def module_loss(model):
    names = [k for k, _ in model.named_parameters()]

    def loss_fn(params, batch):
        x, y = batch
        out = torch.func.functional_call(model, {k: params[k] for k in names}, (x,))
        return F.cross_entropy(out, y)

    return loss_fn


def gamfunc_trajectory(estimator, optimizer, model):
    """θ_1..θ_T of gamfunc's step, from the module's initial parameters."""
    loss_fn = module_loss(model)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    step = gamfunc.make_step(estimator, optimizer, loss_fn)
    state = step.init(params)
    out = []
    for batch in batches():
        params, state, _ = step(params, state, batch)
        out.append(flatten(params))
    return out


def module_params(model):
    return flatten({k: v.detach().clone() for k, v in model.named_parameters()})


def assert_same_trajectory(ours, theirs):
    assert len(ours) == len(theirs) == STEPS
    for t, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert rel_err(a, b) <= TOL, f"step {t + 1}: relative error {rel_err(a, b):.3g}"
    assert rel_err(ours[-1], ours[0]) > 1e-3  # the parameters moved


def linear_lr(lr0, lr_end):
    """lr(t) = lr0 + (lr_end − lr0)·t/T, the same numbers as a LambdaLR of factor lr(t)/lr0."""
    slope = (lr_end - lr0) / STEPS

    def schedule(t):
        return lr0 + slope * t.to(torch.float64)

    return schedule, lambda t: (lr0 + slope * t) / lr0


# ---- GSAM ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("scheduled", [False, True], ids=["constant_rho", "rho_follows_lr"])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_gsam_equals_pytorch_optimizer(scheduled, momentum):
    po = pytest.importorskip("pytorch_optimizer")
    lr0, lr_min, rho_max, rho_min, alpha = 0.5, 0.05, 0.2, 0.02, 0.3
    lr, factor = linear_lr(lr0, lr_min) if scheduled else (lr0, lambda t: 1.0)
    rho = (
        schedules.proportional(rho_max, lr, lr0, floor=rho_min, lr_min=lr_min)
        if scheduled
        else rho_max
    )
    ours = gamfunc_trajectory(
        gamfunc.gsam(rho, alpha), gamfunc.sgd(lr=lr, momentum=momentum), mlp()
    )

    model = mlp()
    base = torch.optim.SGD(model.parameters(), lr=lr0, momentum=momentum)
    lr_sched = torch.optim.lr_scheduler.LambdaLR(base, factor)
    rho_sched = po.ProportionScheduler(
        lr_sched,
        max_lr=lr0,
        min_lr=lr_min if scheduled else 0.0,
        max_value=rho_max,
        min_value=rho_min if scheduled else rho_max,
    )
    opt = po.GSAM(model.parameters(), base, model, rho_sched, alpha=alpha)
    theirs = []
    for x, y in batches():
        opt.set_closure(F.cross_entropy, x, y)
        opt.step()
        lr_sched.step()
        opt.update_rho_t()
        theirs.append(module_params(model))
    assert_same_trajectory(ours, theirs)


def test_gsam_removes_alpha_times_the_orthogonal_component():
    """d − ∇f_p = −α·∇f_⊥ is orthogonal to ∇f_p, and ∇f_p + ∇f_∥ + … rebuilds g: checked on flat
    vectors with torch.autograd."""
    params, batch = mlp_params(), mlp_batch()
    rho, alpha = 0.1, 0.3
    naive = Naive(mlp_loss, params, batch)
    theta = flatten(params)
    g = naive.grad(theta)
    gp = naive.grad(theta + rho * g / g.norm())
    g_perp = g - (g @ gp) / (gp @ gp) * gp
    d, info = gamfunc.gsam(rho, alpha)(params, batch, mlp_loss)
    assert rel_err(flatten(d), gp - alpha * g_perp) <= 1e-10
    assert abs(float((flatten(d) - gp) @ gp)) <= 1e-10 * float(gp @ gp)
    torch.testing.assert_close(info["surrogate_gap"], info["perturbed_loss"] - info["loss"])


def test_gsam_with_zero_alpha_is_sam():
    params, batch = mlp_params(), mlp_batch()
    d, _ = gamfunc.gsam(0.1, 0.0)(params, batch, mlp_loss)
    s, _ = gamfunc.sam(0.1)(params, batch, mlp_loss)
    assert all(torch.equal(d[k], s[k]) for k in d)


def test_proportional_maps_lr_min_to_the_floor():
    lr, _ = linear_lr(0.5, 0.05)
    rho = schedules.proportional(0.2, lr, 0.5, floor=0.02, lr_min=0.05)
    assert float(rho(torch.tensor(0))) == pytest.approx(0.2, rel=1e-12)
    assert float(rho(torch.tensor(STEPS))) == pytest.approx(0.02, rel=1e-12)
    with pytest.raises(ValueError, match="lr_min"):
        schedules.proportional(0.2, lr, 0.5, lr_min=0.5)


# ---- WSAM ----------------------------------------------------------------------------------------


def wsam_reference(po, model, gamma, decouple, **sgd):
    opt = po.WSAM(
        model, model.parameters(), torch.optim.SGD, rho=0.1, gamma=gamma, decouple=decouple, **sgd
    )
    out = []
    for x, y in batches():

        def closure(x=x, y=y):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            return loss

        opt.step(closure)
        out.append(module_params(model))
    return out


@pytest.mark.parametrize("gamma", [0.3, 0.9])
def test_wsam_equals_pytorch_optimizer_coupled(gamma):
    po = pytest.importorskip("pytorch_optimizer")
    sgd = {"lr": 0.2, "momentum": 0.9, "weight_decay": 1e-3}
    ours = gamfunc_trajectory(gamfunc.wsam(0.1, gamma), gamfunc.sgd(**sgd), mlp())
    assert_same_trajectory(ours, wsam_reference(po, mlp(), gamma, decouple=False, **sgd))


def test_wsam_equals_pytorch_optimizer_decoupled_under_plain_sgd():
    """The decoupled form (the reference's default) is the same update when the base optimiser is
    plain SGD: θ − η·g − η·a·(g_adv − g)."""
    po = pytest.importorskip("pytorch_optimizer")
    ours = gamfunc_trajectory(gamfunc.wsam(0.1, 0.9), gamfunc.sgd(lr=0.2), mlp())
    assert_same_trajectory(ours, wsam_reference(po, mlp(), 0.9, decouple=True, lr=0.2))


def test_wsam_at_gamma_zero_and_one_half_is_the_gradient_and_sam():
    params, batch = mlp_params(), mlp_batch()
    g, _ = gamfunc.gradient()(params, batch, mlp_loss)
    s, _ = gamfunc.sam(0.1)(params, batch, mlp_loss)
    w0, _ = gamfunc.wsam(0.1, 0.0)(params, batch, mlp_loss)
    w_half, _ = gamfunc.wsam(0.1, 0.5)(params, batch, mlp_loss)
    assert rel_err(w0, g) <= 1e-15 and rel_err(w_half, s) <= 1e-15


# ---- multi-step SAM ------------------------------------------------------------------------------


def naive_multistep_sam(theta, batch, rho, n, eps=1e-12):
    """∇L at θ + ε_n, ε_{k+1} = ε_k + (ρ/n)·∇L(θ + ε_k)/(‖∇L(θ + ε_k)‖ + ξ), with torch.autograd."""

    def grad(point):
        point = point.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(mlp_loss(unflatten(point, like), batch), point)
        return g

    like = mlp_params()
    e = torch.zeros_like(theta)
    for _ in range(n):
        g = grad(theta + e)
        e = e + rho / n * g / (g.norm() + eps)
    return grad(theta + e), e


@pytest.mark.parametrize("n", [2, 3, 5])
def test_multistep_sam_equals_the_naive_loop_over_training(n):
    rho, lr = 0.2, 0.3
    params = mlp_params()
    step = gamfunc.make_step(gamfunc.sam(rho, ascent_steps=n), gamfunc.sgd(lr=lr), mlp_loss)
    state = step.init(params)
    theta = flatten(params)
    for t in range(STEPS):
        batch = mlp_batch(seed=100 + t)
        params, state, _ = step(params, state, batch)
        d, e = naive_multistep_sam(theta, batch, rho, n)
        assert float(e.norm()) <= rho * (1 + 1e-12)  # the iterates stay in the ρ-ball
        theta = theta - lr * d
        assert rel_err(flatten(params), theta) <= TOL, f"step {t + 1}"


def test_one_ascent_step_is_sam_exactly():
    params, batch = mlp_params(), mlp_batch()
    d1, i1 = gamfunc.sam(0.1, ascent_steps=1)(params, batch, mlp_loss)
    d, i = gamfunc.sam(0.1)(params, batch, mlp_loss)
    assert all(torch.equal(d1[k], d[k]) for k in d)
    assert all(torch.equal(i1[k], i[k]) for k in i)
    assert "ascent_steps" not in gamfunc.sam(0.1).hparams


def test_more_ascent_steps_find_a_higher_loss_in_the_ball():
    """On the MLP, the multi-step ascent ends at a higher loss than one step of the same radius."""
    params, batch = mlp_params(), mlp_batch()
    _, one = gamfunc.sam(0.5)(params, batch, mlp_loss)
    _, five = gamfunc.sam(0.5, ascent_steps=5)(params, batch, mlp_loss)
    assert float(five["perturbed_loss"]) > float(one["perturbed_loss"])
