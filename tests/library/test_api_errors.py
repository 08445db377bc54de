"""One clear error, naming the argument and what to do, for the API mistakes users make: a loss that
returns three things, an lr schedule that returns a Python number, params on two devices, and a
learning rate given to the torch.optim-style facade instead of its base optimiser."""

from __future__ import annotations

import pytest
import torch

import gamfunc
from gamfunc.torch_optim import GAM, SAM


def params():
    return {"w": torch.zeros(3), "b": torch.zeros(())}


def batch():
    return torch.randn(8, 3), torch.randn(8)


def mse(p, b):
    return ((b[0] @ p["w"] + p["b"] - b[1]) ** 2).mean()


def test_a_loss_returning_three_values_is_named():
    def three(p, b):
        return mse(p, b), 1, 2

    step = gamfunc.make_step(gamfunc.sam(0.05), gamfunc.sgd(lr=0.1), three)
    with pytest.raises(TypeError, match=r"loss_fn must return .* pair \(loss, aux\).*tuple of 3"):
        step(params(), step.init(params()), batch())


def test_an_lr_schedule_returning_a_python_number_is_named():
    opt = gamfunc.sgd(lr=lambda t: 0.1)
    with pytest.raises(TypeError, match=r"a schedule must return a tensor.*returned float"):
        gamfunc.make_step(gamfunc.gradient(), opt, mse).init(params())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device: CUDA")
def test_params_on_two_devices_are_named():
    p = {"w": torch.zeros(3), "b": torch.zeros((), device="cuda")}
    with pytest.raises(
        ValueError, match=r"one device: params\['w'\] is on cpu, params\['b'\] on cuda"
    ):
        gamfunc.make_step(gamfunc.gradient(), gamfunc.sgd(lr=0.1), mse).init(p)


def test_params_on_two_devices_are_named_with_the_meta_device():
    p = {"w": torch.zeros(3), "b": torch.zeros((), device="meta")}
    with pytest.raises(
        ValueError, match=r"one device: params\['w'\] is on cpu, params\['b'\] on meta"
    ):
        gamfunc.make_step(gamfunc.gradient(), gamfunc.sgd(lr=0.1), mse).init(p)


@pytest.mark.parametrize("cls", [GAM, SAM])
def test_the_facade_names_itself_and_where_lr_goes(cls):
    model = torch.nn.Linear(3, 2)
    kw = {"rho": 0.05} | ({"alpha": 0.1} if cls is GAM else {})
    name = cls.__name__
    with pytest.raises(
        TypeError, match=rf"^{name}\(\) takes no lr=: it belongs to the base optimiser"
    ):
        cls(model, gamfunc.sgd(lr=0.1), lr=0.1, **kw)
    with pytest.raises(TypeError, match=rf"^{name}\(\) needs a base optimiser as its second"):
        cls(model, lr=0.1, **kw)  # lr= with no base optimiser to give it to
    with pytest.raises(TypeError, match=rf"^{name}\(\) needs a base optimiser"):
        cls(model, **kw)
    # beside a built optimiser, an unknown keyword is one for the base optimiser's class
    with pytest.raises(TypeError, match=rf"^{name}\(\) takes no foo=: it belongs to the base"):
        cls(model, gamfunc.sgd(lr=0.1), foo=1, **kw)
    cls(model, gamfunc.sgd(lr=0.1), every=2, **kw)  # its own options still pass


def test_raise_on_a_non_finite_step_cannot_be_compiled_whole_and_says_what_works():
    step = gamfunc.make_step(gamfunc.sam(0.05), gamfunc.sgd(lr=0.1), mse, on_nonfinite="raise")
    with pytest.raises(
        ValueError, match=r"on_nonfinite='raise'.*on_nonfinite='skip'.*scope='pass'"
    ):
        step.compile()
    fast = step.compile(scope="pass", backend="eager")  # the passes compiled, the guard eager
    p = params()
    with pytest.raises(FloatingPointError, match="non-finite"):
        fast(p, fast.init(p), (torch.full((8, 3), float("nan")), torch.randn(8)))


def test_another_optimisers_state_is_a_one_line_error_naming_it():
    loss_fn = lambda p, b: ((b @ p["w"]) ** 2).mean()  # noqa: E731
    params, batch = {"w": torch.ones(3)}, torch.randn(4, 3)
    adamw_state = gamfunc.make_step(gamfunc.gradient(), gamfunc.adamw(0.1), loss_fn).init(params)
    step = gamfunc.make_step(gamfunc.gradient(), gamfunc.sgd(0.1), loss_fn)
    with pytest.raises(
        TypeError, match=r"InjectState keeping \['lr', 'weight_decay'\] for \['lr'\]"
    ):
        step(params, adamw_state, batch)


def test_gam_step_names_an_unhashable_argument():
    loss_fn = lambda p, b: ((b @ p["w"]) ** 2).mean()  # noqa: E731
    with pytest.raises(TypeError, match="gam_step's hvp must be"):
        gamfunc.gam_step(
            {"w": torch.ones(3)}, torch.randn(4, 3), loss_fn, rho=0.05, alpha=0.1, hvp=["exact"]
        )


@pytest.mark.parametrize(
    "estimator", [gamfunc.gam(1e308, 0.1), gamfunc.sam(1e308)], ids=["gam", "sam"]
)
def test_a_radius_beyond_float32_skips_the_step_as_a_huge_lr_does(estimator):
    loss_fn = lambda p, b: ((b @ p["w"]) ** 2).mean()  # noqa: E731
    params = {"w": torch.ones(3)}
    step = gamfunc.make_step(estimator, gamfunc.sgd(0.1), loss_fn)
    new, state, metrics = step(params, step.init(params), torch.randn(4, 3))
    assert int(state.step) == 0
    assert int(metrics["skipped"]) == 1 and torch.equal(new["w"], params["w"])
