"""HVP backends against the dense torch.func.hessian, and finite differences against exact."""

import dataclasses
import itertools
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import (
    dense_hessian,
    flatten,
    mlp_batch,
    mlp_loss,
    mlp_params,
    rel_err,
    relu_mlp_loss,
)

import gamfunc
from gamfunc import hvps, tree
from gamfunc.loss import Pass, gradient_pass


@pytest.mark.parametrize("backend", [hvps.exact(), hvps.reverse()])
def test_hvp_equals_dense_hessian_product(backend):
    params, batch = mlp_params(), mlp_batch()
    v = {k: torch.randn_like(t) for k, t in params.items()}
    H = dense_hessian(mlp_loss, params, batch)
    hv, clean = backend(mlp_loss, params, batch, v)
    assert rel_err(flatten(hv), H @ flatten(v)) < 1e-12
    ref = gradient_pass(mlp_loss, params, batch)
    assert rel_err(clean.grad, ref.grad) < 1e-14
    assert torch.equal(clean.loss, ref.loss)


# Each backend, the finite difference at a radius small enough to compare with the exact products.
SMALL_RADIUS = {"exact": hvps.exact(), "reverse": hvps.reverse(), "fd": hvps.fd(radius=1e-6)}


@pytest.mark.parametrize("name", ["exact", "reverse", "fd"])
def test_callable_vector_receives_the_gradient(name):
    params, batch = mlp_params(), mlp_batch()
    H = dense_hessian(mlp_loss, params, batch)
    g = flatten(gradient_pass(mlp_loss, params, batch).grad)
    hv, _ = SMALL_RADIUS[name](mlp_loss, params, batch, lambda grad: grad)
    tol = 1e-5 if name == "fd" else 1e-12
    assert rel_err(flatten(hv), H @ g) < tol


@pytest.mark.parametrize("name", ["exact", "reverse", "fd"])
def test_grad_norm_grad_is_gradient_of_gradient_norm(name):
    params, batch = mlp_params(), mlp_batch()

    def grad_norm(p):
        return tree.norm(torch.func.grad(mlp_loss)(p, batch))

    ref = torch.func.grad(grad_norm)(params)
    f, _clean = hvps.grad_norm_grad(mlp_loss, params, batch, SMALL_RADIUS[name], eps=0.0)
    assert rel_err(f, ref) < (1e-5 if name == "fd" else 1e-12)


def test_finite_difference_error_is_linear_in_radius_on_a_smooth_model():
    params, batch = mlp_params(), mlp_batch()
    v = tree.normalize(mlp_params(seed=7))[0]
    exact, _ = hvps.exact()(mlp_loss, params, batch, v)
    errors = [
        rel_err(hvps.fd(radius=r)(mlp_loss, params, batch, v)[0], exact) for r in (1e-2, 1e-3, 1e-4)
    ]
    # O(r): each tenfold smaller radius gives a roughly tenfold smaller error.
    for big, small in itertools.pairwise(errors):
        assert 5 < big / small < 20
    assert errors[-1] < 1e-3  # and the constant of O(r) is of order one


def test_finite_difference_differs_from_exact_across_relu_kinks():
    """On ReLU nets autodiff's Hessian ignores kinks, so fd need not converge to exact (documented)."""
    params, batch = mlp_params(), mlp_batch(n=64)
    v = tree.normalize({k: torch.randn_like(t) for k, t in params.items()})[0]
    exact, _ = hvps.exact()(relu_mlp_loss, params, batch, v)
    reverse, _ = hvps.reverse()(relu_mlp_loss, params, batch, v)
    assert rel_err(reverse, exact) < 1e-12
    fd = hvps.fd(0.5)(relu_mlp_loss, params, batch, v)[0]
    assert rel_err(fd, exact) > 1e-3


def test_fd_reuses_the_clean_pass_it_is_given():
    params, batch = mlp_params(), mlp_batch()
    calls = []

    def counted(p, b):
        calls.append(1)
        return mlp_loss(p, b)

    clean = gradient_pass(mlp_loss, params, batch)
    hvps.fd(1e-3)(counted, params, batch, lambda g: g, clean=clean)
    assert len(calls) == 1


def test_unknown_backend_names_the_argument():
    with pytest.raises(ValueError, match="hvp"):
        hvps.get("dense")
    with pytest.raises(ValueError, match="hvp"):
        hvps.get(0.001)


def test_backends_are_values_that_read_as_the_call_that_builds_them():
    assert [repr(b) for b in (hvps.exact(), hvps.reverse(), hvps.fd(radius=1e-3))] == [
        "exact()",
        "reverse()",
        "fd(radius=0.001)",
    ]
    assert hvps.fd() == hvps.fd(radius=hvps.DEFAULT_RADIUS) == hvps.fd(1e-3)
    assert hvps.fd(radius=1) == hvps.fd(radius=1.0) and hvps.fd(1e-2) != hvps.fd(1e-3)
    assert hvps.exact() == hvps.exact() != hvps.reverse()
    assert len({hvps.exact(), hvps.exact(), hvps.fd(1e-3), hvps.fd(1e-3)}) == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        hvps.fd(1e-3).radius = 1.0


def test_names_are_shorthands_for_the_default_values():
    assert hvps.get("exact") == hvps.exact() and hvps.get("reverse") == hvps.reverse()
    assert hvps.get("fd") == hvps.fd() == hvps.fd(radius=hvps.DEFAULT_RADIUS)
    fd = hvps.fd(radius=1e-2)  # another radius: only through hvps.fd
    assert hvps.get(fd) is fd
    assert hvps.get(mlp_loss) is mlp_loss  # any function of the backends' signature


@pytest.mark.parametrize("radius", [0, -1e-3, float("nan"), float("inf"), "1e-3", True, None])
def test_a_bad_radius_names_radius(radius):
    with pytest.raises(ValueError, match="radius"):
        hvps.fd(radius=radius)


@pytest.mark.parametrize(
    ("name", "value"),
    [("exact", hvps.exact()), ("reverse", hvps.reverse()), ("fd", hvps.fd())],
)
def test_metrics_and_grad_norm_grad_take_a_value_as_its_name(name, value):
    params, batch = mlp_params(), mlp_batch()
    f_name, _ = hvps.grad_norm_grad(mlp_loss, params, batch, name)
    f_value, _ = hvps.grad_norm_grad(mlp_loss, params, batch, value)
    assert all(torch.equal(f_name[k], f_value[k]) for k in params)
    gen = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    top = gamfunc.metrics.top_eigenvalues
    a = top(params, batch, mlp_loss, k=1, iters=5, hvp=name, generator=gen())
    b = top(params, batch, mlp_loss, k=1, iters=5, hvp=value, generator=gen())
    assert torch.equal(a, b)


def test_math_attention_backend_makes_second_order_work_through_sdpa():
    torch.manual_seed(0)
    q = torch.randn(2, 2, 5, 4, dtype=torch.float64)
    params = {
        "wq": torch.randn(4, 4, dtype=torch.float64),
        "wk": torch.randn(4, 4, dtype=torch.float64),
    }

    def loss_fn(p, x):
        a = torch.nn.functional.scaled_dot_product_attention(x @ p["wq"], x @ p["wk"], x)
        return a.pow(2).sum()

    v = {k: torch.randn_like(t) for k, t in params.items()}
    e, _ = hvps.exact()(loss_fn, params, q, v)
    r, _ = hvps.reverse()(loss_fn, params, q, v)
    assert rel_err(e, r) < 1e-12


def test_one_vector_protocol_resolves_fixed_vectors_and_functions_of_the_gradient():
    g = {"a": torch.tensor([3.0, 4.0], dtype=torch.float64)}
    p = Pass(g, torch.tensor(1.0, dtype=torch.float64), ())
    fixed = {"a": torch.tensor([1.0, 2.0], dtype=torch.float64)}
    assert not hvps.of_gradient(fixed) and hvps.of_gradient(hvps.Normalized(0.0))
    assert hvps.resolve(fixed, p) == (fixed, p)
    v, q = hvps.resolve(hvps.Normalized(1.0), p)
    torch.testing.assert_close(v["a"], g["a"] / 6.0)  # g/(‖g‖ + ξ), ‖g‖ = 5, ξ = 1
    torch.testing.assert_close(q.grad_norm, torch.tensor(5.0, dtype=torch.float64))
    double = hvps.read_through(lambda x: {"a": x["a"] + 1}, lambda x: {"a": 2 * x["a"]})
    torch.testing.assert_close(hvps.resolve(double, p)[0]["a"], 2 * g["a"] + 1)
    assert hvps.read_through(fixed, lambda x: x) is fixed


def test_the_wrappers_use_the_one_vector_protocol():
    # Every wrapper tells a fixed v from v(g) through gamfunc.hvps, never by its own test.
    root = Path(gamfunc.__file__).parent
    for name in ("accumulate.py", "precision.py", "regional.py", "distributed.py"):
        source = (root / "wrappers" / name).read_text()
        assert "isinstance(v, dict)" not in source and "v(clean.grad)" not in source, name


@pytest.mark.parametrize("compiled", [False, True])
def test_the_first_exact_hvp_of_a_process_warns_nothing(compiled):
    """torch imports its forward-mode decompositions at a process's first jvp, and on recent torch
    that import warns that ``torch.jit.script`` is deprecated; gamfunc's first exact GAM step, in a
    fresh process with every warning an error, eager or compiled by pass (where the jvp is first
    traced), must not pass that warning on to the user."""
    compile_ = ".compile(scope='pass', backend='eager')" if compiled else ""
    code = (
        "import warnings, torch, gamfunc\n"
        "warnings.simplefilter('error')\n"
        "loss = lambda p, b: ((b[0] @ p['w']).tanh() - b[1]).pow(2).mean()\n"
        "params = {'w': torch.randn(3, 2)}\n"
        f"step = gamfunc.make_step(gamfunc.gam(0.05, 0.1), gamfunc.sgd(0.1), loss){compile_}\n"
        "step(params, step.init(params), (torch.randn(4, 3), torch.randn(4, 2)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Warning" not in done.stderr, done.stderr[-2000:]


def test_the_class_checks_its_radius_as_fd_does():
    assert hvps.FiniteDifference(1e-2) == hvps.fd(radius=1e-2)
    assert hvps.FiniteDifference(1).radius == 1.0 and isinstance(hvps.fd(1).radius, float)
    with pytest.raises(ValueError, match="radius"):
        hvps.FiniteDifference(-1e-3)


def test_forward_mode_names_the_backend_that_differentiates_forward():
    assert hvps.forward_mode(hvps.exact()) and hvps.forward_mode("exact")
    for other in (hvps.reverse(), hvps.fd(), "reverse", "fd", None, lambda *a, **k: None):
        assert not hvps.forward_mode(other)
    assert hvps.forward_mode(gamfunc.gam(0.05, 0.1, hvp="exact").hparams["hvp"])
    assert not hvps.forward_mode(gamfunc.gam(0.05, 0.1, hvp="fd").hparams["hvp"])
