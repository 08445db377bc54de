"""gradient_pass against torch.func.grad, and the gradient norm a Pass carries for the estimators."""

import functools

import pytest
import torch
from helpers import mlp_batch, mlp_loss, mlp_params
from models import TinyResNet, image_batch

import gamfunc
from gamfunc import loss as loss_mod
from gamfunc import tree
from gamfunc.loss import Pass, gradient_pass, unit_grad, with_grad_norm


def bn_problem():
    torch.manual_seed(0)
    loss_fn, params, buffers = gamfunc.nn.functionalize(TinyResNet())
    return functools.partial(_bound, loss_fn, buffers), params, image_batch()


def _bound(loss_fn, buffers, params, batch):
    return loss_fn(params, batch, buffers)


def func_grad_pass(loss_fn, params, batch):
    g, (loss, aux) = loss_mod.grad_fn(loss_fn, batch)(params)
    return Pass(g, loss, aux)


@pytest.mark.parametrize("grad_mode", [False, True])
def test_eager_pass_equals_torch_func_grad_bit_for_bit_with_batchnorm_aux(grad_mode):
    loss_fn, params, batch = bn_problem()
    ref = func_grad_pass(loss_fn, params, batch)
    with torch.set_grad_enabled(grad_mode):
        got = gradient_pass(loss_fn, params, batch)
    assert got.grad.keys() == params.keys()
    for k in params:
        assert torch.equal(got.grad[k], ref.grad[k]), k
        assert not got.grad[k].requires_grad
    assert torch.equal(got.loss, ref.loss) and not got.loss.requires_grad
    for k, v in ref.aux.items():  # the new BatchNorm statistics, detached
        assert torch.equal(got.aux[k], v) and not got.aux[k].requires_grad, k


def test_eager_pass_does_not_use_torch_func_grad(monkeypatch):
    """Eager, outside transforms, the pass is a plain backward (torch.func.grad differentiates with
    create_graph=True and keeps every activation gradient alive until it returns)."""

    def fail(*args, **kwargs):
        raise AssertionError("torch.func.grad used for an eager first-order pass")

    monkeypatch.setattr(loss_mod, "grad_fn", fail)
    params, batch = mlp_params(), mlp_batch()
    gradient_pass(mlp_loss, params, batch)
    with torch.no_grad():
        gradient_pass(mlp_loss, params, batch)


def test_pass_inside_a_transform_and_with_differentiable_params_is_torch_func_grad():
    params, batch = mlp_params(), mlp_batch()
    ref = func_grad_pass(mlp_loss, params, batch)
    # Under vmap: one pass per batch of perturbed parameters.
    shifts = torch.linspace(0, 1, 3, dtype=torch.float64)
    batched = torch.func.vmap(
        lambda s: gradient_pass(mlp_loss, tree.map(lambda v: v + s, params), batch).grad
    )(shifts)
    for k in params:  # batched kernels: the same gradient up to float64 rounding
        assert torch.allclose(batched[k][0], ref.grad[k], rtol=1e-12, atol=1e-15)
    # Parameters that require grad, grad mode on: the gradient stays differentiable (2nd order).
    w = {k: v.clone().requires_grad_() for k, v in params.items()}
    g = gradient_pass(mlp_loss, w, batch).grad
    assert g["w1"].requires_grad
    (hess_row,) = torch.autograd.grad(g["w1"][0, 0], [w["w1"]])
    ref_row = torch.func.hessian(lambda w1: mlp_loss({**params, "w1": w1}, batch))(params["w1"])[
        0, 0
    ]
    assert torch.allclose(hess_row, ref_row, rtol=1e-12, atol=1e-14)


def test_unused_parameters_and_constant_losses_get_zero_gradients():
    params = {"w": torch.ones(3), "unused": torch.ones(2)}
    got = gradient_pass(lambda p, b: (p["w"] * b).sum(), params, torch.arange(3.0))
    assert torch.equal(got.grad["w"], torch.arange(3.0))
    assert torch.equal(got.grad["unused"], torch.zeros(2))
    const = gradient_pass(lambda p, b: b.sum(), params, torch.arange(3.0))
    assert all(torch.equal(v, torch.zeros_like(params[k])) for k, v in const.grad.items())
    assert float(const.loss) == 3.0


def test_unit_grad_equals_tree_normalize_and_reuses_the_carried_norm(monkeypatch):
    params, batch = mlp_params(), mlp_batch()
    p = gradient_pass(mlp_loss, params, batch)
    assert p.grad_norm == ()
    ref, ref_norm = tree.normalize(p.grad, 1e-12)
    g_hat, q = unit_grad(p, 1e-12)
    assert torch.equal(q.grad_norm, ref_norm)
    assert all(torch.equal(g_hat[k], ref[k]) for k in ref)
    calls = []
    monkeypatch.setattr(tree, "norm", lambda a: calls.append(a) or torch.tensor(-1.0))
    assert with_grad_norm(q) is q and unit_grad(q, 1e-12)[1] is q
    assert calls == []


def test_ascent_point_is_davda54s_perturbation_bit_for_bit_and_reuses_the_carried_norm():
    """θ + ρ·g/(‖g‖ + ξ) formed as davda54/sam forms it, p + g·(ρ/(‖g‖ + ξ)), for a number or a
    tensor ρ and in bfloat16 (the product in float32, rounded once), from the pass's norm."""
    params, batch = mlp_params(), mlp_batch()
    p = gradient_pass(mlp_loss, params, batch)
    for rho in (0.05, torch.tensor(0.05)):
        point, q = loss_mod.ascent_point(params, p, rho, 1e-12)
        scale = rho / (q.grad_norm + 1e-12)
        assert torch.equal(q.grad_norm, tree.norm(p.grad))
        assert all(torch.equal(point[k], params[k] + p.grad[k] * scale) for k in params)
    half = {k: v.bfloat16() for k, v in params.items()}
    hp = Pass({k: v.bfloat16() for k, v in p.grad.items()}, p.loss, (), q.grad_norm)
    point, same = loss_mod.ascent_point(half, hp, torch.tensor(0.05), 1e-12)
    assert same is hp
    for k, v in half.items():
        want = (hp.grad[k].float() * (0.05 / (q.grad_norm + 1e-12))).bfloat16() + v
        assert point[k].dtype == torch.bfloat16 and torch.equal(point[k], want), k


# Tree norms per step: one per vector normalised, and ‖∇L(θ)‖ and ‖∇L(θ_adv)‖ once each. The step's
# finiteness check takes none: it reuses ‖∇L(θ)‖ for the plain gradient step and otherwise looks at
# the direction's entries in the kernels that look at the new parameters'.
NORMS_PER_STEP = {
    "gradient": (gamfunc.gradient(), 1),
    "sam": (gamfunc.sam(0.05), 1),  # ‖g‖
    "gnp": (gamfunc.gnp(0.1), 2),  # ‖g‖, ‖f‖ (info)
    "gam_fd": (gamfunc.gam(0.05, 0.1, hvp="fd"), 3),  # ‖g‖, ‖f‖, ‖g_adv‖
    "gam_exact": (gamfunc.gam(0.05, 0.1), 3),
    "gam_reverse": (gamfunc.gam(0.05, 0.1, hvp="reverse"), 3),
    "sam_gam": (gamfunc.gam(0.05, 0.1, hvp="fd", oracle=gamfunc.sam(0.05)), 3),
    "gam_accelerated": (gamfunc.gam_accelerated(0.05, 0.05, 0.5, 0.5, 0.1), 4),  # g0 h0 g2 h+
}


@pytest.mark.parametrize("name", sorted(NORMS_PER_STEP))
def test_each_norm_is_computed_once_per_step(name, monkeypatch):
    est, expected = NORMS_PER_STEP[name]
    params, batch = mlp_params(), mlp_batch()
    step = gamfunc.make_step(est, gamfunc.sgd(lr=0.1, momentum=0.9), mlp_loss)
    state = step.init(params)
    _, _, ref = step(params, state, batch)
    norm, calls = tree.norm, []
    monkeypatch.setattr(tree, "norm", lambda a: calls.append(1) or norm(a))
    _, _, metrics = step(params, state, batch)
    assert len(calls) == expected
    for k, v in ref.items():  # the shared norms are the very values computed before
        assert torch.equal(metrics[k], v), k
    g = gradient_pass(mlp_loss, params, batch).grad
    assert torch.equal(metrics["grad_norm"], norm(g))
