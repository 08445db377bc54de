"""The one registry of estimators (reproduce/methods.py): names, hyperparameters, refusals."""

from __future__ import annotations

import pytest
import registry
import torch
from helpers import mlp_batch, mlp_loss, mlp_params

import gamfunc
from reproduce import methods
from reproduce.config import ESTIMATORS


def test_train_py_offers_every_method():
    assert tuple(methods.METHODS) == ESTIMATORS


@pytest.mark.parametrize(
    "name, kwargs, expected",
    [
        ("sgd", {}, gamfunc.gradient()),
        ("sam", {"rho": 0.1}, gamfunc.sam(0.1)),
        ("sam", {"rho": 0.1, "sam_rho": 0.3}, gamfunc.sam(0.3)),
        ("asam", {"rho": 0.5, "eta": 0.02}, gamfunc.asam(0.5, eta=0.02)),
        ("gnp", {"alpha": 0.2}, gamfunc.gnp(0.2)),
        ("gnp", {"alpha": 0.2, "gnp_hvp": "exact"}, gamfunc.gnp(0.2, hvp="exact")),
        ("gam", {"rho": 0.1, "alpha": 0.3}, gamfunc.gam(0.1, 0.3)),
        ("gam_fd", {}, gamfunc.gam(0.05, 0.1, hvp="fd")),
        ("gam_fd", {"fd_radius": 1e-2}, gamfunc.gam(0.05, 0.1, hvp=gamfunc.hvps.fd(radius=1e-2))),
        ("gnp", {"gnp_radius": 0.1}, gamfunc.gnp(0.1, hvp=gamfunc.hvps.fd(radius=0.1))),
        ("gam_reverse", {}, gamfunc.gam(0.05, 0.1, hvp="reverse")),
        (
            "sam+gam",
            {"sam_rho": 0.2},
            gamfunc.gam(0.05, 0.1, oracle=gamfunc.sam(0.2)),
        ),
        ("sam", {"ascent_steps": 3}, gamfunc.sam(0.05, ascent_steps=3)),
        ("gsam", {"gsam_alpha": 0.2}, gamfunc.gsam(0.05, 0.2)),
        ("wsam", {"sam_rho": 0.1, "wsam_gamma": 0.5}, gamfunc.wsam(0.1, 0.5)),
        (
            "wsam",
            {"sam_rho": 0.1, "wsam_decouple": True, "wsam_max_norm": 1.0},
            gamfunc.wsam(0.1, 0.9, decouple=True, max_norm=1.0),
        ),
        ("gsam", {"gsam_adaptive": True}, gamfunc.gsam(0.05, 0.3, adaptive=True)),
        (
            "asam",
            {"rho": 0.5, "asam_mask": "weights"},
            gamfunc.asam(0.5, mask=methods.weights),
        ),
        (
            "gsam+gam",
            {"gsam_alpha": 0.2},
            gamfunc.gam(0.05, 0.1, oracle=gamfunc.gsam(0.05, 0.2)),
        ),
        (
            "gam_accelerated",
            {"alpha": 0.6, "beta": 0.4, "gamma": 0.3},
            gamfunc.gam_accelerated(0.05, 0.05, 0.6, 0.4, 0.3),
        ),
        (
            "gam_accelerated_official",
            {"alpha": 0.6},
            gamfunc.gam_accelerated(0.05, 0.05, 0.6, 0.5, 0.1, convention="official"),
        ),
    ],
)
def test_a_name_and_its_hyperparameters_give_the_estimator(name, kwargs, expected):
    got = methods.estimator(name, **kwargs)
    assert (got.name, got.hparams) == (expected.name, expected.hparams)


def test_the_base_of_an_oracle_and_gam_is_the_oracle_and_of_the_others_the_gradient():
    sam = methods.base("sam+gam", rho=0.1, sam_rho=0.2)
    assert (sam.name, sam.hparams) == ("sam", gamfunc.sam(0.2).hparams)
    gsam = methods.base("gsam+gam", gsam_alpha=0.2)
    assert (gsam.name, gsam.hparams) == ("gsam", gamfunc.gsam(0.05, 0.2).hparams)
    others = {n for n in methods.METHODS if not n.endswith("+gam")}
    assert {methods.base(n).name for n in others} == {"gradient"}


@pytest.mark.parametrize(
    "call, named",
    [
        (lambda: methods.estimator("adam"), "name"),
        (lambda: methods.base("adam"), "name"),
        (lambda: methods.estimator("gam", radius=1e-3), "radius"),
        (lambda: methods.estimator("gam", rho=-1.0), "rho"),
        (lambda: methods.estimator("asam", asam_mask="biases"), "asam_mask"),
        (lambda: methods.estimator("wsam", wsam_max_norm=-1.0), "max_norm"),
    ],
)
def test_a_wrong_name_or_value_raises_naming_it(call, named):
    with pytest.raises(ValueError, match=named):
        call()


def test_the_weights_mask_is_the_asam_authors_rule_on_a_module():
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    marked = {k: methods.weights(k, p) for k, p in model.named_parameters()}
    assert marked == {"0.weight": True, "0.bias": False, "1.weight": True, "1.bias": False}


@pytest.mark.parametrize("name", sorted(registry.AS_METHODS))
def test_the_contract_tests_estimator_is_the_one_reproduce_builds(name):
    """tests/registry.py builds its estimators with gamfunc's factories, not with reproduce/: each
    must be, by name and hyperparameters, what reproduce/'s method builds from the same values."""
    method, hparams = registry.AS_METHODS[name]
    got, want = registry.ESTIMATORS[name](), methods.estimator(method, **hparams)
    assert (got.name, got.hparams, got.every) == (want.name, want.hparams, want.every)
    # hparams name an oracle without its own hyperparameters: the step itself must agree too
    params, batch = mlp_params(), mlp_batch()
    (d_got, i_got), (d_want, i_want) = (e(params, batch, mlp_loss) for e in (got, want))
    assert all(torch.equal(d_got[k], d_want[k]) for k in params), name
    assert i_got.keys() == i_want.keys() and all(torch.equal(i_got[k], i_want[k]) for k in i_got)


def test_the_contract_tests_run_every_method_of_reproduce():
    """Every method of reproduce/methods.py is a row's of tests/registry.py; the row without one
    is ASAM with a mask on the tests' parameter names."""
    assert set(registry.AS_METHODS) == set(registry.ESTIMATORS) - {"asam_masked"}
    assert {method for method, _ in registry.AS_METHODS.values()} == set(methods.METHODS)


@pytest.mark.parametrize(
    "flags, expected",
    [
        ({}, None),
        ({"every": 3}, gamfunc.when.every(3)),
        ({"when": "every:4"}, gamfunc.when.every(4)),
        ({"when": "late:0.75"}, gamfunc.when.late(75)),  # the last quarter of 10 × 10 steps
        ({"when": "late:30"}, gamfunc.when.late(30)),
        ({"when": "adaptive"}, gamfunc.when.adaptive(100)),
    ],
)
def test_when_flags_give_the_policy_over_the_runs_steps(flags, expected):
    from reproduce.build import when_policy
    from reproduce.config import Config, validate

    cfg = Config(epochs=10, **flags)
    validate(cfg)
    assert when_policy(cfg, steps_per_epoch=10) == expected


@pytest.mark.parametrize(
    "flags",
    [
        {"when": "late:1.5"},
        {"when": "sometimes"},
        {"when": "every:2", "every": 2},
        {"when": "late:50", "total_steps": 50},  # the steps are 0 to 49: none flat
        {"when": "late:0.999", "total_steps": 100},  # ⌈99.9⌉ = 100
    ],
)
def test_bad_when_flags_are_refused_naming_when(flags):
    from reproduce.config import Config, validate

    with pytest.raises(ValueError, match="when"):
        validate(Config(**flags))


def test_the_flags_check_of_a_late_start_is_the_policys():
    """The check and the run read late:F alike: 0.55 of 100 steps is step 55, a decimal that
    rounds to 0.99 starts at 99 (accepted), as `gamfunc.when.late` takes them."""
    from reproduce.build import when_policy
    from reproduce.config import Config, validate

    for arg, first in [("0.55", 55), ("0.99000000000000001", 99)]:
        cfg = Config(when=f"late:{arg}", total_steps=100)
        validate(cfg)
        assert when_policy(cfg, steps_per_epoch=10) == gamfunc.when.late(first)


def test_adaptive_beside_local_perturbations_is_refused_saying_what_to_do():
    from reproduce.config import Config, validate

    with pytest.raises(ValueError, match=r"--when .*--perturbation=global"):
        validate(Config(when="adaptive", perturbation="local"))
    validate(Config(when="every:2", perturbation="local"))


def test_a_late_start_past_a_run_of_epochs_is_refused_naming_when():
    """With --epochs the run's steps are known once the data is: the policy refuses there."""
    from reproduce.build import SetupError, when_policy
    from reproduce.config import Config, validate

    cfg = Config(epochs=10, when="late:100")
    validate(cfg)
    with pytest.raises(SetupError, match="--when=late:100"):
        when_policy(cfg, steps_per_epoch=10)
    assert when_policy(cfg, steps_per_epoch=11) == gamfunc.when.late(100)
