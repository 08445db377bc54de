"""MSAM and RWP, the estimators of one gradient a step: against naive float64 loops written from
the papers, the passes counted, RWP's noise (filter-wise scale, its moments, pure in its key)."""

import importlib
import math

import pytest
import torch
from helpers import flatten, mlp_batch, mlp_loss, mlp_params, rel_err
from torch.utils._python_dispatch import TorchDispatchMode

import gamfunc

rwp_module = importlib.import_module("gamfunc.estimators.rwp")
RHO, LR, MU = 0.3, 0.2, 0.9


def grad(params, batch):
    p = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    g = torch.autograd.grad(mlp_loss(p, batch), list(p.values()))
    return dict(zip(p, g, strict=True))


def trajectory(step, params, n):
    state = step.init(params)
    for t in range(n):
        params, state, _ = step(params, state, mlp_batch(seed=t))
    return params, state


def test_msam_with_sgd_momentum_is_the_papers_algorithm():
    """Becker et al. (2024): θ̃ = θ − ρ·v/‖v‖, v ← μ·v + ∇L(θ̃), θ ← θ − η·v (v = 0 at first)."""
    params = mlp_params()
    step = gamfunc.make_step(gamfunc.msam(RHO, MU), gamfunc.sgd(lr=LR, momentum=MU), mlp_loss)
    got, state = trajectory(step, params, 8)
    theta = dict(params)
    v = {k: torch.zeros_like(x) for k, x in theta.items()}
    for t in range(8):
        n = math.sqrt(sum(float((x * x).sum()) for x in v.values()))
        scale = RHO / n if n > 0 else 0.0
        g = grad({k: theta[k] - scale * v[k] for k in theta}, mlp_batch(seed=t))
        v = {k: MU * v[k] + g[k] for k in v}
        theta = {k: theta[k] - LR * v[k] for k in theta}
    assert rel_err(flatten(got), flatten(theta)) < 1e-12
    assert rel_err(flatten(state.est.m), flatten(v)) < 1e-12


def test_msam_works_beside_any_base_optimiser():
    """Its momentum is its own: under AdamW the perturbation still follows m = Σ μ^k·g̃."""
    step = gamfunc.make_step(gamfunc.msam(RHO, 0.5), gamfunc.adamw(lr=1e-2), mlp_loss)
    _, state = trajectory(step, mlp_params(), 3)
    assert torch.isfinite(flatten(state.est.m)).all() and float(flatten(state.est.m).norm()) > 0


def test_msam_first_step_needs_a_positive_eps():
    """m = 0 at the first step: ρ·m/(‖m‖ + ξ) is 0/0 at ξ = 0, so ξ must be > 0."""
    with pytest.raises(ValueError, match="eps"):
        gamfunc.msam(RHO, eps=0.0)
    step = gamfunc.make_step(gamfunc.msam(RHO, eps=1e-30), gamfunc.sgd(lr=LR), mlp_loss)
    params = mlp_params()
    state = step.init(params)
    got, state, metrics = step(params, state, mlp_batch(seed=0))
    assert int(state.step) == 1 and int(metrics["skipped"]) == 0
    assert (
        rel_err(
            flatten(got),
            flatten({k: params[k] - LR * g for k, g in grad(params, mlp_batch(seed=0)).items()}),
        )
        < 1e-12
    )


def naive_noise(params, sigma, key, t):
    """RWP's ε from the authors' rule: σ·‖W_j‖·z per filter j (a slice along dim 0, of any rank),
    σ·(‖W‖ + 1e-16)·z for a vector, z drawn from the same counter-based normal numbers at each
    tensor's offset."""
    out, offset = {}, 0
    for k, w in params.items():
        z = rwp_module.gaussian(key, t, offset, w.shape, w.dtype, w.device)
        offset += w.numel()
        if w.dim() > 1:
            s = torch.stack([w[j].norm() for j in range(w.shape[0])])
            s = s.reshape((-1,) + (1,) * (w.dim() - 1))
        else:
            s = w.norm() + 1e-16
        out[k] = sigma * s * z
    return out


def test_rwp_noise_of_a_convolution_is_per_output_channel():
    g = torch.Generator().manual_seed(1)
    params = {
        "conv": torch.randn(6, 3, 3, 3, generator=g, dtype=torch.float64),
        "bias": torch.randn(6, generator=g, dtype=torch.float64),
    }
    key, t = torch.tensor(5), torch.tensor(9)
    got = rwp_module.noise(params, 0.1, key, t)
    want = naive_noise(params, 0.1, key, t)
    for k in params:
        assert rel_err(got[k], want[k]) < 1e-14


def test_rwp_noise_of_bf16_parameters_is_the_float32_noise_within_two_roundings():
    """Norms and numbers in float32; z rounded to bf16 (`normals` keeps each tensor's dtype), then
    σ·‖W_j‖·z rounded once more: within two bf16 roundings (2 · 2⁻⁸) of the float32 noise."""
    g = torch.Generator().manual_seed(2)
    w = torch.randn(8, 16, generator=g).to(torch.bfloat16)
    key, t = torch.tensor(3), torch.tensor(4)
    got = rwp_module.noise({"w": w}, 0.05, key, t)["w"]
    want = rwp_module.noise({"w": w.float()}, 0.05, key, t)["w"]
    assert got.dtype == torch.bfloat16
    assert ((got.float() - want).abs() <= 2 * 2**-8 * want.abs()).all()
    assert not torch.equal(got.float(), want)  # rounded, not float32 carried


def test_gaussian_counters_past_two_to_the_31_draw_their_own_numbers():
    """2c wraps past 32 bits from counter 2³¹: the high word re-keys the hash there, and the
    numbers below are unchanged by a draw that crosses it."""
    key, t = torch.tensor(7), torch.tensor(3)
    low = rwp_module.gaussian(key, t, 0, (4,), torch.float32, "cpu")
    high = rwp_module.gaussian(key, t, 2**31, (4,), torch.float32, "cpu")
    far = rwp_module.gaussian(key, t, 2**32, (4,), torch.float32, "cpu")
    assert not torch.isclose(low, high).any() and not torch.isclose(high, far).any()
    across = rwp_module.gaussian(key, t, 2**31 - 2, (4,), torch.float32, "cpu")
    below = rwp_module.gaussian(key, t, 2**31 - 2, (2,), torch.float32, "cpu")
    assert torch.equal(across[:2], below) and torch.equal(across[2:], high[:2])


@pytest.mark.parametrize("mix", [0.0, 0.5])
def test_rwp_is_the_gradient_at_a_filter_wise_gaussian_neighbour(mix):
    sigma, key = 0.05, torch.tensor(7)
    params = mlp_params()
    step = gamfunc.make_step(gamfunc.rwp(sigma, mix=mix, seed=7), gamfunc.sgd(lr=LR), mlp_loss)
    got, _ = trajectory(step, params, 5)
    theta = dict(params)
    for t in range(5):
        b = mlp_batch(seed=t)
        eps = naive_noise(theta, sigma, key, torch.tensor(t))
        g_adv = grad({k: theta[k] + eps[k] for k in theta}, b)
        g = grad(theta, b)
        d = {k: mix * g[k] + (1 - mix) * g_adv[k] for k in theta}
        theta = {k: theta[k] - LR * d[k] for k in theta}
    assert rel_err(flatten(got), flatten(theta)) < 1e-12


def test_rwp_noise_is_standard_normal_scaled_by_each_filters_norm():
    w = torch.randn(4, 20000, dtype=torch.float64) * torch.tensor([[0.1], [1.0], [3.0], [10.0]])
    eps = rwp_module.noise({"w": w}, 0.5, torch.tensor(3), torch.tensor(11))["w"]
    z = eps / (0.5 * w.norm(dim=1, keepdim=True))
    assert z.mean().abs() < 0.02 and (z.std(dim=1) - 1).abs().max() < 0.02
    assert ((z**4).mean() - 3).abs() < 0.1  # a normal's kurtosis
    again = rwp_module.noise({"w": w}, 0.5, torch.tensor(3), torch.tensor(11))["w"]
    other_step = rwp_module.noise({"w": w}, 0.5, torch.tensor(3), torch.tensor(12))["w"]
    other_key = rwp_module.noise({"w": w}, 0.5, torch.tensor(4), torch.tensor(11))["w"]
    assert torch.equal(eps, again)
    for other in (other_step, other_key):
        assert (
            abs(float(torch.corrcoef(torch.stack([eps.flatten(), other.flatten()]))[0, 1])) < 0.02
        )


@pytest.mark.parametrize("run", [1 << 22, 7])
def test_normals_are_each_tensors_own_draw_bit_for_bit(monkeypatch, run):
    """Tensors drawn together (one device, one wide dtype, within a run of counters) get the numbers
    of a draw of their own at their offset: across a bf16 tensor, a float64 one that breaks the
    run, and a tensor larger than the run."""
    monkeypatch.setattr(rwp_module, "_RUN", run)
    g = torch.Generator().manual_seed(0)
    params = {
        "a": torch.randn(5, 3, generator=g),
        "b": torch.randn(4, generator=g),
        "c": torch.randn(3, 2, generator=g).to(torch.bfloat16),
        "d": torch.randn(6, generator=g, dtype=torch.float64),
        "e": torch.randn(2, 3, generator=g),
        "f": torch.randn((), generator=g),
    }
    key, t = torch.tensor(7), torch.tensor(2)
    offset = 0
    for z, w in zip(rwp_module.normals(params, key, t), params.values(), strict=True):
        want = rwp_module.gaussian(key, t, offset, w.shape, w.dtype, w.device)
        assert z.dtype == w.dtype and torch.equal(z, want)
        offset += w.numel()


class _CountOps(TorchDispatchMode):
    """The number of ATen operations run under it."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def test_noise_draws_a_model_in_one_pass_not_one_per_tensor():
    """26 tensors (a small CNN's count) cost one draw and a few operations each for their scales:
    a draw a tensor would be about 130 operations each."""

    def ops(n):
        params = {f"w{i}": torch.randn(4, 3) if i % 2 else torch.randn(4) for i in range(n)}
        with _CountOps() as count:
            rwp_module.noise(params, 0.1, torch.tensor(3), torch.tensor(5))
        return count.n

    assert ops(26) - ops(1) <= 10 * 25


@pytest.mark.parametrize(
    ("make", "passes"),
    [
        (lambda: gamfunc.msam(RHO), 1),
        (lambda: gamfunc.rwp(0.05), 1),
        (lambda: gamfunc.rwp(0.05, mix=0.5), 2),
        (lambda: gamfunc.sam(RHO), 2),  # the count can tell
    ],
    ids=["msam", "rwp", "m-rwp", "sam"],
)
def test_passes_per_step_are_counted(make, passes):
    calls = []

    def counted(p, b):
        calls.append(1)
        return mlp_loss(p, b)

    step = gamfunc.make_step(make(), gamfunc.sgd(lr=LR, momentum=MU), counted)
    params = mlp_params()
    state = step.init(params)
    per_step = []
    for t in range(4):
        n = len(calls)
        params, state, _ = step(params, state, mlp_batch(seed=t))
        per_step.append(len(calls) - n)
    assert per_step == [passes] * 4


def test_bad_hyperparameters_name_the_argument():
    for call, arg in [
        (lambda: gamfunc.msam(-0.1), "rho"),
        (lambda: gamfunc.msam(0.1, momentum=1.0), "momentum"),
        (lambda: gamfunc.msam(0.1, eps=-1.0), "eps"),
        (lambda: gamfunc.rwp(-0.01), "sigma"),
        (lambda: gamfunc.rwp(float("nan")), "sigma"),
        (lambda: gamfunc.msam(0.1, eps=0.0), "eps"),
        (lambda: gamfunc.rwp(0.01, mix=1.5), "mix"),
        (lambda: gamfunc.rwp(0.01, mix=1.0), "mix"),
        (lambda: gamfunc.rwp(0.01, seed=-1), "seed"),
        (lambda: gamfunc.rwp(0.01, seed=2**32), "seed"),
    ]:
        with pytest.raises(ValueError, match=arg):
            call()
