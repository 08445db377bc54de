"""GSAM, WSAM, ASAM, Friendly-SAM and multi-step SAM against independent implementations:
pytorch_optimizer's GSAM and WSAM on a torch.nn MLP; the authors' released forms (WSAM decoupled and
clipped, GSAM adaptive, ASAM on the weights, Friendly-SAM's order) as loops of torch.autograd and
torch.optim on an MLP and a CNN with biases; the multi-step ascent as a loop with torch.autograd. 20
steps of training in float64, compared step by step. Then the decoupled part through the step's
options: every=, compile, param groups, the guard, accumulation, bf16, m-sharpness, GAM's oracle and
the facade."""

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


# ---- the authors' released forms, against references written from their algorithms --------------
#
# Each reference is a loop of torch.autograd over an nn.Module (an MLP and a small CNN, both with
# biases) stepped by torch.optim, written from the algorithm of the authors' code: WSAM's decoupled
# form and clipping (atorch's WeightedSAM), GSAM's adaptive ascent (juntang-zhuang/GSAM), ASAM on
# the parameters named weight (SamsungLabs/ASAM), Friendly-SAM's order (nblt/F-SAM). 20 float64
# steps; every step's parameters agree to 1e-10.

EXACT = 1e-10
XI = 1e-12  # ξ of every normalisation, the estimators' default


def cnn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 3, 3), nn.Tanh(), nn.Flatten(), nn.Linear(3 * 4 * 4, 3)).to(
        torch.float64
    )


MODELS = {"mlp": mlp, "cnn": cnn}


def data(kind):
    """The 20 batches of ``kind``: vectors of 4 for the MLP, 6×6 images for the CNN."""
    if kind == "mlp":
        return batches()
    out = []
    for t in range(STEPS):
        g = torch.Generator().manual_seed(100 + t)
        x = torch.randn(16, 1, 6, 6, generator=g, dtype=torch.float64)
        out.append((x, torch.randint(0, 3, (16,), generator=g)))
    return out


def ours(estimator, optimizer, kind, **step_options):
    """Every step's flat parameters under gamfunc's step, from the module's initial ones."""
    model = MODELS[kind]()
    loss_fn = module_loss(model)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    step = gamfunc.make_step(estimator, optimizer, loss_fn, **step_options)
    state = step.init(params)
    out = []
    for batch in data(kind):
        params, state, _ = step(params, state, batch)
        out.append(flatten(params))
    return out


def grads(model, batch, shift=None):
    """∇L at the module's parameters plus ``shift`` (one tensor per parameter, or None), by
    torch.autograd; the parameters are put back exactly afterwards."""
    params = list(model.parameters())
    saved = [p.detach().clone() for p in params]
    if shift is not None:
        with torch.no_grad():
            for p, e in zip(params, shift, strict=True):
                p.add_(e)
    x, y = batch
    g = torch.autograd.grad(F.cross_entropy(model(x), y), params)
    with torch.no_grad():
        for p, s in zip(params, saved, strict=True):
            p.copy_(s)
    return list(g)


def norm(vs):
    return torch.sqrt(sum((v * v).sum() for v in vs))


def clipped(vs, max_norm):
    """clip_grad_norm_'s rule, written out: v·min(1, c/(‖v‖ + 1e-6))."""
    c = min(1.0, max_norm / (float(norm(vs)) + 1e-6))
    return [v * c for v in vs]


def descend(model, opt, direction):
    for p, d in zip(model.parameters(), direction, strict=True):
        p.grad = d.clone()
    opt.step()


def reference(kind, update, make_opt):
    """Every step's flat parameters of ``update(model, opt, batch, t, memory)`` over the batches."""
    model = MODELS[kind]()
    opt = make_opt(model)
    memory, out = {}, []
    for t, batch in enumerate(data(kind)):
        update(model, opt, batch, t, memory)
        out.append(module_params(model))
    return out


def wsam_update(rho, gamma, decouple, max_norm=None, every=1):
    """WSAM as atorch's WeightedSAM computes it: the ascent along the unclipped g; g and g_adv each
    clipped; coupled, the optimiser steps with (1 − a)·g + a·g_adv; decoupled, with g, then each
    parameter moves by −lr·a·(g_adv − g), lr its param group's. With ``every`` = k the steps
    between are plain gradient steps."""
    a = gamma / (1 - gamma)

    def update(model, opt, batch, t, memory):
        g = grads(model, batch)
        if t % every:
            return descend(model, opt, g)
        n = norm(g)
        g_adv = grads(model, batch, [rho * gi / (n + XI) for gi in g])
        if max_norm is not None:
            g, g_adv = clipped(g, max_norm), clipped(g_adv, max_norm)
        if not decouple:
            return descend(
                model, opt, [(1 - a) * gi + a * hi for gi, hi in zip(g, g_adv, strict=True)]
            )
        descend(model, opt, g)
        lr = {p: group["lr"] for group in opt.param_groups for p in group["params"]}
        with torch.no_grad():
            for p, gi, hi in zip(model.parameters(), g, g_adv, strict=True):
                p.sub_(lr[p] * a * (hi - gi))

    return update


def gsam_adaptive_update(rho, alpha, eta=0.0):
    """GSAM's Algorithm 1 with the authors' adaptive ascent, θ + ρ·T²g/(‖T g‖ + ξ), T = |θ| + η."""

    def update(model, opt, batch, t, memory):
        g = grads(model, batch)
        scale = [p.detach().abs() + eta for p in model.parameters()]
        n = norm([s * gi for s, gi in zip(scale, g, strict=True)])
        gp = grads(
            model, batch, [rho * s * s * gi / (n + XI) for s, gi in zip(scale, g, strict=True)]
        )
        inner = sum((gi * hi).sum() for gi, hi in zip(g, gp, strict=True))
        g_perp = [gi - inner / norm(gp) ** 2 * hi for gi, hi in zip(g, gp, strict=True)]
        descend(model, opt, [hi - alpha * vi for hi, vi in zip(gp, g_perp, strict=True)])

    return update


def asam_weights_update(rho, eta):
    """ASAM with T = |w| + η on the parameters whose name contains "weight", T = 1 on the others."""

    def update(model, opt, batch, t, memory):
        g = grads(model, batch)
        scale = [
            p.detach().abs() + eta if "weight" in k else torch.ones_like(p)
            for k, p in model.named_parameters()
        ]
        n = norm([s * gi for s, gi in zip(scale, g, strict=True)])
        descend(
            model,
            opt,
            grads(
                model, batch, [rho * s * s * gi / (n + XI) for s, gi in zip(scale, g, strict=True)]
            ),
        )

    return update


def friendly_sam_authors_update(rho, sigma, lmbda):
    """Friendly-SAM in the authors' order: m₁ = g₁ and d₁ = g₁; then d_t = g_t − σ·m_{t−1} and
    m_t = λ·m_{t−1} + (1 − λ)·g_t."""

    def update(model, opt, batch, t, memory):
        g = grads(model, batch)
        if "m" not in memory:
            d, memory["m"] = g, g
        else:
            m = memory["m"]
            d = [gi - sigma * mi for gi, mi in zip(g, m, strict=True)]
            memory["m"] = [lmbda * mi + (1 - lmbda) * gi for mi, gi in zip(m, g, strict=True)]
        n = norm(d)
        descend(model, opt, grads(model, batch, [rho * di / (n + XI) for di in d]))

    return update


def assert_agree(got, want, tol=EXACT):
    """Every step within ``tol`` in every parameter; returns the largest difference."""
    worst = max(float((a - b).abs().max()) for a, b in zip(got, want, strict=True))
    assert worst <= tol, f"largest difference {worst:.3g} over {STEPS} steps"
    assert float((got[-1] - got[0]).abs().max()) > 1e-3  # the parameters moved
    return worst


def sgd(model, weight_decay, lr=0.2):
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=weight_decay)


KINDS = ["mlp", "cnn"]
DECAYS = pytest.mark.parametrize("wd", [0.0, 5e-4], ids=["no_decay", "decay"])


@DECAYS
@pytest.mark.parametrize("max_norm", [None, 1.0, 0.05], ids=["unclipped", "clip_1", "clip_0.05"])
@pytest.mark.parametrize("decouple", [True, False], ids=["decoupled", "coupled"])
@pytest.mark.parametrize("kind", KINDS)
def test_wsam_equals_the_authors_algorithm_with_momentum_sgd(kind, decouple, max_norm, wd):
    est = gamfunc.wsam(0.1, 0.9, decouple=decouple, max_norm=max_norm)
    got = ours(est, gamfunc.sgd(lr=0.2, momentum=0.9, weight_decay=wd), kind)
    want = reference(kind, wsam_update(0.1, 0.9, decouple, max_norm), lambda m: sgd(m, wd))
    assert_agree(got, want)


@pytest.mark.parametrize("decouple", [True, False], ids=["decoupled", "coupled"])
@pytest.mark.parametrize("kind", KINDS)
def test_wsam_equals_the_authors_algorithm_with_adamw(kind, decouple):
    est = gamfunc.wsam(0.1, 0.9, decouple=decouple, max_norm=1.0)
    got = ours(est, gamfunc.adamw(lr=1e-2, weight_decay=1e-2), kind)
    want = reference(
        kind,
        wsam_update(0.1, 0.9, decouple, 1.0),
        lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=1e-2),
    )
    assert_agree(got, want)


def test_wsam_decoupled_moves_each_parameter_by_its_own_groups_lr():
    """Two param groups, two learning rates: the sharpness step of each parameter takes its own."""
    opt = gamfunc.param_groups({"0.*": dict(lr=0.05)}, gamfunc.sgd, lr=0.2, momentum=0.9)
    got = ours(gamfunc.wsam(0.1, 0.9, decouple=True), opt, "mlp")

    def groups(model):
        first = list(model[0].parameters())
        rest = [p for p in model.parameters() if all(p is not q for q in first)]
        return torch.optim.SGD(
            [{"params": first, "lr": 0.05}, {"params": rest}], lr=0.2, momentum=0.9
        )

    assert_agree(got, reference("mlp", wsam_update(0.1, 0.9, True), groups))
    one_lr = ours(gamfunc.wsam(0.1, 0.9, decouple=True), gamfunc.sgd(lr=0.2, momentum=0.9), "mlp")
    assert float((got[-1] - one_lr[-1]).abs().max()) > 1e-3


def test_wsam_decoupled_under_every_two_steps():
    est = gamfunc.wsam(0.1, 0.9, decouple=True, max_norm=1.0)
    got = ours(est, gamfunc.sgd(lr=0.2, momentum=0.9), "mlp", every=2)
    want = reference("mlp", wsam_update(0.1, 0.9, True, 1.0, every=2), lambda m: sgd(m, 0.0))
    assert_agree(got, want)


def test_wsam_decoupled_and_coupled_differ_but_for_plain_sgd():
    dec, cou = (gamfunc.wsam(0.1, 0.9, decouple=d) for d in (True, False))
    momentum = gamfunc.sgd(lr=0.2, momentum=0.9)
    assert (
        float((ours(dec, momentum, "mlp")[-1] - ours(cou, momentum, "mlp")[-1]).abs().max()) > 1e-2
    )
    plain = gamfunc.sgd(lr=0.2)
    assert_agree(ours(dec, plain, "mlp"), ours(cou, plain, "mlp"), tol=1e-13)


@DECAYS
@pytest.mark.parametrize("kind", KINDS)
def test_gsam_adaptive_equals_the_authors_algorithm(kind, wd):
    got = ours(gamfunc.gsam(0.5, 0.3, adaptive=True), gamfunc.sgd(0.2, 0.9, weight_decay=wd), kind)
    want = reference(kind, gsam_adaptive_update(0.5, 0.3), lambda m: sgd(m, wd))
    assert_agree(got, want)
    plain = ours(gamfunc.gsam(0.5, 0.3), gamfunc.sgd(0.2, 0.9, weight_decay=wd), kind)
    assert float((got[-1] - plain[-1]).abs().max()) > 1e-2


@DECAYS
@pytest.mark.parametrize("kind", KINDS)
def test_asam_with_the_weights_mask_equals_the_authors_algorithm(kind, wd):
    mask = {k: "weight" in k for k, _ in MODELS[kind]().named_parameters()}
    got = ours(gamfunc.asam(0.5, 0.01, mask=mask), gamfunc.sgd(0.2, 0.9, weight_decay=wd), kind)
    want = reference(kind, asam_weights_update(0.5, 0.01), lambda m: sgd(m, wd))
    assert_agree(got, want)
    every = ours(gamfunc.asam(0.5, 0.01), gamfunc.sgd(0.2, 0.9, weight_decay=wd), kind)
    assert float((got[-1] - every[-1]).abs().max()) > 1e-2
    by_rule = gamfunc.asam(0.5, 0.01, mask=lambda name, p: "weight" in name)
    assert_agree(ours(by_rule, gamfunc.sgd(0.2, 0.9, weight_decay=wd), kind), got, tol=0.0)


def test_asam_with_every_parameter_marked_is_asam_and_with_none_is_sam():
    params, batch = mlp_params(), mlp_batch()
    full, _ = gamfunc.asam(0.5)(params, batch, mlp_loss)
    marked, _ = gamfunc.asam(0.5, mask=dict.fromkeys(params, True))(params, batch, mlp_loss)
    assert rel_err(flatten(marked), flatten(full)) <= 1e-15
    naive = Naive(mlp_loss, params, batch)
    theta = flatten(params)
    g = naive.grad(theta)
    none, _ = gamfunc.asam(0.5, eta=0.0, mask=dict.fromkeys(params, False))(params, batch, mlp_loss)
    assert rel_err(flatten(none), naive.grad(theta + 0.5 * g / (g.norm() + XI))) <= 1e-12
    with pytest.raises(ValueError, match="mask"):
        gamfunc.asam(0.5, mask={"w1": True})(params, batch, mlp_loss)


def test_an_asam_mask_naming_a_parameter_that_is_not_there_is_refused_naming_it():
    """A missing name was refused, an unknown one (a typo) accepted and its choice left unmade."""
    params, batch = mlp_params(), mlp_batch()
    typo = {**dict.fromkeys(params, True), "w1.wieght": False}
    with pytest.raises(ValueError, match=r"^mask names \['w1.wieght'\], which are not among"):
        gamfunc.asam(0.5, mask=typo)(params, batch, mlp_loss)


@DECAYS
@pytest.mark.parametrize("kind", KINDS)
def test_friendly_sam_authors_convention_equals_the_authors_algorithm(kind, wd):
    est = gamfunc.friendly_sam(0.2, 1.0, 0.6, convention="authors")
    got = ours(est, gamfunc.sgd(0.2, 0.9, weight_decay=wd), kind)
    want = reference(kind, friendly_sam_authors_update(0.2, 1.0, 0.6), lambda m: sgd(m, wd))
    assert_agree(got, want)
    paper = ours(gamfunc.friendly_sam(0.2, 1.0, 0.6), gamfunc.sgd(0.2, 0.9, weight_decay=wd), kind)
    assert float((got[-1] - paper[-1]).abs().max()) > 1e-3


# ---- the decoupled part through the step's options and wrappers ---------------------------------


def decoupled_wsam():
    return gamfunc.wsam(0.1, 0.9, decouple=True, max_norm=1.0)


def test_an_optimiser_without_an_lr_is_refused_naming_decouple():
    params = mlp_params()
    bare = gamfunc.chain(gamfunc.clip_by_global_norm(1.0))
    step = gamfunc.make_step(decoupled_wsam(), bare, mlp_loss)
    with pytest.raises(ValueError, match="decouple"):
        step.init(params)
    coupled = gamfunc.make_step(gamfunc.wsam(0.1, 0.9), bare, mlp_loss)
    coupled.init(params)  # the coupled form takes any optimiser


def test_calling_the_decoupled_estimator_gives_the_gradient_and_run_gives_the_part():
    params, batch = mlp_params(), mlp_batch()
    est = gamfunc.wsam(0.1, 0.9, decouple=True)
    d, _ = est(params, batch, mlp_loss)
    g, _ = gamfunc.gradient()(params, batch, mlp_loss)
    assert rel_err(flatten(d), flatten(g)) == 0
    with torch.no_grad():
        part = est.run(params, batch, mlp_loss).decoupled
    naive = Naive(mlp_loss, params, batch)
    theta = flatten(params)
    gf = naive.grad(theta)
    g_adv = naive.grad(theta + 0.1 * gf / (gf.norm() + XI))
    assert rel_err(flatten(part), 9.0 * (g_adv - gf)) <= 1e-12
    assert est.decoupled and not gamfunc.wsam(0.1, 0.9).decoupled


def nan_beyond_zero(params, batch):
    """Finite at θ (w > 0), NaN at SAM's ascent point, which crosses w = 0: only the perturbed
    gradient, and so only the decoupled part, is not finite."""
    return -torch.sqrt(params["w"]).sum() + (params["b"] * batch).pow(2).sum()


@pytest.mark.parametrize(
    "compiled", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["eager", "compiled"]
)
def test_a_non_finite_decoupled_part_skips_the_step(compiled):
    params = {
        "w": torch.full((2,), 0.01, dtype=torch.float64),
        "b": torch.ones(1, dtype=torch.float64),
    }
    batch = torch.ones(1, dtype=torch.float64)
    est = gamfunc.wsam(0.5, 0.9, decouple=True)
    step = gamfunc.make_step(est, gamfunc.sgd(lr=1e-4), nan_beyond_zero)
    if compiled:
        torch._dynamo.reset()
        step = step.compile(backend="eager")
    state = step.init(params)
    new, new_state, metrics = step(params, state, batch)
    assert int(metrics["skipped"]) == 1 and int(new_state.step) == 0
    assert all(torch.equal(new[k], params[k]) for k in params)
    ignored = gamfunc.make_step(est, gamfunc.sgd(lr=1e-4), nan_beyond_zero, on_nonfinite="ignore")
    moved, _, _ = ignored(params, ignored.init(params), batch)
    assert not torch.isfinite(moved["w"]).all()  # the part is applied, not dropped


@pytest.mark.slow
@pytest.mark.parametrize("scope", ["step", "pass"])
def test_the_decoupled_step_compiles_fullgraph_and_equals_eager(scope):
    torch._dynamo.reset()
    params = mlp_params()
    opt = gamfunc.param_groups({"b*": dict(lr=0.05)}, gamfunc.sgd, lr=0.2, momentum=0.9)
    step = gamfunc.make_step(decoupled_wsam(), opt, mlp_loss, every=2)
    compiled = step.compile(fullgraph=True, scope=scope)
    p_e, s_e, p_c, s_c = params, step.init(params), params, compiled.init(params)
    for t in range(4):
        batch = mlp_batch(seed=t)
        p_e, s_e, _ = step(p_e, s_e, batch)
        p_c, s_c, _ = compiled(p_c, s_c, batch)
    assert rel_err(flatten(p_c), flatten(p_e)) <= 1e-12


def test_accumulated_micro_batches_equal_the_whole_batch():
    from gamfunc.wrappers.accumulate import accumulate

    est, opt = decoupled_wsam(), gamfunc.sgd(lr=0.2, momentum=0.9, weight_decay=1e-3)
    whole = gamfunc.make_step(est, opt, mlp_loss)
    micro = gamfunc.make_step(est, opt, accumulate(mlp_loss, 3))
    p_w, s_w, p_m, s_m = (
        mlp_params(),
        whole.init(mlp_params()),
        mlp_params(),
        micro.init(mlp_params()),
    )
    for t in range(5):
        batch = mlp_batch(seed=t)
        p_w, s_w, _ = whole(p_w, s_w, batch)
        p_m, s_m, _ = micro(p_m, s_m, batch)
    assert rel_err(flatten(p_m), flatten(p_w)) <= 1e-12


def test_bf16_loss_keeps_the_decoupled_step_close_to_float32():
    from gamfunc.wrappers.precision import bf16

    params = mlp_params(dtype=torch.float32)
    batch = mlp_batch(dtype=torch.float32)
    steps = [
        gamfunc.make_step(decoupled_wsam(), gamfunc.sgd(0.2, 0.9), f)
        for f in (mlp_loss, bf16(mlp_loss))
    ]
    (p32, _, _), (p16, _, m16) = (s(params, s.init(params), batch) for s in steps)
    assert int(m16["skipped"]) == 0
    delta = {k: p32[k] - params[k] for k in params}
    assert rel_err(flatten({k: p16[k] - params[k] for k in params}), flatten(delta)) < 0.1


def test_m_sharpness_averages_the_decoupled_part_over_sub_batches():
    from gamfunc.wrappers.m_sharpness import m_sharpness

    params, batch = mlp_params(), mlp_batch(n=12)
    est = m_sharpness(gamfunc.wsam(0.1, 0.9, decouple=True), 3)
    assert est.decoupled
    with torch.no_grad():
        got = est.run(params, batch, mlp_loss)
    naive_parts = []
    for j in range(3):
        sub = tuple(t[4 * j : 4 * (j + 1)] for t in batch)
        naive = Naive(mlp_loss, params, sub)
        theta = flatten(params)
        g = naive.grad(theta)
        naive_parts.append(9.0 * (naive.grad(theta + 0.1 * g / (g.norm() + XI)) - g))
    assert rel_err(flatten(got.decoupled), sum(naive_parts) / 3) <= 1e-12


def test_gam_passes_its_oracles_decoupled_part_on():
    params, batch = mlp_params(), mlp_batch()
    est = gamfunc.gam(0.05, 0.1, oracle=gamfunc.wsam(0.1, 0.9, decouple=True))
    assert est.decoupled
    with torch.no_grad():
        got = est.run(params, batch, mlp_loss)
        oracle = gamfunc.wsam(0.1, 0.9, decouple=True).run(params, batch, mlp_loss)
    assert rel_err(flatten(got.decoupled), flatten(oracle.decoupled)) <= 1e-15


def test_the_facade_with_a_gamfunc_optimiser_takes_the_decoupled_step():
    from gamfunc.torch_optim import FlatnessOptimizer

    want = ours(decoupled_wsam(), gamfunc.sgd(lr=0.2, momentum=0.9), "mlp")
    model = mlp()
    opt = FlatnessOptimizer(model, decoupled_wsam(), gamfunc.sgd(lr=0.2, momentum=0.9))
    got = []
    for batch in data("mlp"):
        opt.step(batch)
        got.append(module_params(model))
    assert_agree(got, want, tol=1e-13)


def test_the_facade_with_a_torch_optimiser_takes_the_decoupled_step_with_each_groups_lr():
    """A torch.optim base reports its param groups' lrs to the step (TorchState.lrs), so the
    decoupled part moves each parameter by its own group's lr, as with gamfunc's param groups;
    a scheduler's change reaches it at the next step."""
    from gamfunc.torch_optim import FlatnessOptimizer

    def lam(t):
        return 1.0 / (1 + 0.1 * t)

    ours_opt = gamfunc.param_groups(
        {"2.*": {"lr": 0.05}}, gamfunc.sgd, lr=0.2, momentum=0.9, weight_decay=1e-3
    )
    models = [mlp(), mlp()]
    first, second = models[1][0], models[1][2]
    torch_opt = torch.optim.SGD(
        [{"params": first.parameters()}, {"params": second.parameters(), "lr": 0.05}],
        lr=0.2,
        momentum=0.9,
        weight_decay=1e-3,
    )
    opts = [
        FlatnessOptimizer(models[0], decoupled_wsam(), ours_opt),
        FlatnessOptimizer(models[1], decoupled_wsam(), torch_opt),
    ]
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, lam) for o in opts]
    runs: list[list] = [[], []]
    for batch in data("mlp"):
        for opt, sched, model, run in zip(opts, scheds, models, runs, strict=True):
            opt.step(batch)
            sched.step()
            run.append(module_params(model))
    assert_agree(runs[1], runs[0], tol=1e-13)
    # without the decoupled part's lr the trajectories would differ: the part moved them
    plain = FlatnessOptimizer(mlp(), gamfunc.wsam(0.1, 0.9, max_norm=1.0), gamfunc.sgd(0.2, 0.9))
    for batch in data("mlp"):
        plain.step(batch)
    assert float((module_params(plain._model) - runs[1][-1]).abs().max()) > 1e-3
