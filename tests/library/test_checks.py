"""gamfunc/checks.py: each check returns the value to use or raises a ValueError naming the
argument; tensors are read once where they may be, guarded on the device where they may not."""

from __future__ import annotations

import math

import pytest
import torch

from gamfunc import checks, schedules


@pytest.mark.parametrize(
    "check, value, says",
    [
        (checks.check_number, math.nan, "a finite number"),
        (checks.check_number, True, "a finite number"),  # a bool is no number
        (checks.check_nonnegative, -0.1, "a finite number >= 0"),
        (checks.check_nonnegative, math.inf, "a finite number >= 0"),
        (checks.check_positive, 0.0, "a finite number > 0"),
        (checks.check_positive, "0.1", "a finite number > 0"),
        (checks.check_unit, 1.5, "a number in [0, 1]"),
        (checks.check_nonnegative, torch.tensor(-1.0), "a finite number >= 0"),
        (checks.check_number, torch.ones(2), "shape (2,)"),
        (checks.check_number, torch.tensor(True), "dtype torch.bool"),
    ],
)
def test_a_value_out_of_range_is_a_value_error_naming_the_argument(check, value, says):
    with pytest.raises(ValueError, match=r"^my_arg must be ") as e:
        check("my_arg", value)
    assert says in str(e.value)


def test_check_unit_below_one_refuses_one_itself():
    assert checks.check_unit("beta", 1.0) == 1.0
    with pytest.raises(ValueError, match=r"beta must be a number in \[0, 1\)"):
        checks.check_unit("beta", 1.0, below_one=True)


def test_a_number_is_returned_as_given_and_a_tensor_of_one_element_as_a_0d_tensor():
    assert checks.check_positive("lr", 3) == 3
    out = checks.check_positive("lr", torch.tensor([0.5]))
    assert out.shape == () and out.item() == 0.5
    step = torch.tensor(2)  # an integer tensor is a number too
    assert checks.check_number("t", step) is step


def test_an_unread_tensor_is_guarded_on_the_device_nan_where_out_of_range():
    good = checks.check_nonnegative("lr", torch.tensor(0.1), read=False)
    assert torch.equal(good, torch.tensor(0.1))
    bad = checks.check_nonnegative("lr", torch.tensor(-0.1), read=False)
    assert bad.isnan()
    # an infinity inside the range stays what it is: the step's non-finite guard skips it anyway
    assert checks.check_nonnegative("lr", torch.tensor(math.inf), read=False).isinf()


def test_a_schedule_with_bounds_is_checked_at_both_ends():
    s = schedules.constant(0.1)
    assert checks.check_positive("rho", s, schedule=True) is s
    with pytest.raises(ValueError, match=r"rho must be a finite number > 0 or a schedule; got a"):
        checks.check_positive("rho", schedules.constant(0.0), schedule=True)
    with pytest.raises(ValueError, match=r"^rho must be a finite number > 0; got"):
        checks.check_positive("rho", s)  # no schedule where none is allowed


def test_a_schedule_without_bounds_is_guarded_at_each_step():
    g = checks.check_nonnegative("lr", lambda t: 1.0 - t.to(torch.float32), schedule=True)
    assert isinstance(g, checks.GuardedSchedule) and "lr" in repr(g)
    assert g(torch.tensor(0)).item() == 1.0 and g(torch.tensor(2)).isnan()
    assert checks.check_nonnegative("lr", g, schedule=True) is g  # guarded once, not twice
    assert checks.check_positive("lr", g, schedule=True) is not g  # another rule, guarded again


@pytest.mark.parametrize(
    "rule, inside, outside",
    [
        (checks.FINITE, [-1e30, 0.0, 1e30], [math.nan, math.inf, -math.inf]),
        (checks.NONNEGATIVE, [0.0, 2.0], [-1e-12, math.inf]),
        (checks.POSITIVE, [1e-12, 2.0], [0.0, -1.0]),
    ],
)
def test_a_range_holds_alike_on_numbers_and_on_the_device(rule, inside, outside):
    for v in inside:
        assert rule.holds(v) and bool(rule.holds_on_device(torch.tensor(v))), v
    for v in outside:
        assert not rule.holds(v) and not bool(rule.holds_on_device(torch.tensor(v))), v


def test_check_int_refuses_bools_floats_and_small_integers_naming_the_argument():
    checks.check_int("k", 3)
    checks.check_int("k", 0, at_least=0)
    for bad in (True, 2.0, 0):
        with pytest.raises(ValueError, match=r"^k must be an integer >= 1; got"):
            checks.check_int("k", bad)


def test_check_betas_gives_floats_and_names_the_element_out_of_range():
    assert checks.check_betas("betas", [0, 0.999]) == (0.0, 0.999)
    with pytest.raises(ValueError, match=r"^betas must be a pair"):
        checks.check_betas("betas", (0.9,))
    with pytest.raises(ValueError, match=r"^betas\[1\] must be in \[0, 1\); got 1.0"):
        checks.check_betas("betas", (0.9, 1.0))


def test_check_mask_takes_none_a_callable_or_a_dict_of_bools():
    checks.check_mask("mask", None)
    checks.check_mask("mask", lambda name, p: p.ndim > 1)
    checks.check_mask("mask", {"w": True})
    with pytest.raises(ValueError, match=r"^mask must be None, a dict .* got list"):
        checks.check_mask("mask", ["w"])
    with pytest.raises(ValueError, match=r"^mask must map names to True or False; \['b'\]"):
        checks.check_mask("mask", {"w": True, "b": 1})


def test_masked_keys_keeps_the_parameters_order_and_names_what_is_wrong():
    params = {"w": torch.zeros(2, 2), "b": torch.zeros(2), "v": torch.zeros(3, 1)}
    assert checks.masked_keys(None, params, "mask") == ["w", "b", "v"]
    assert checks.masked_keys({"v": True, "b": False, "w": True}, params, "mask") == ["w", "v"]
    assert checks.masked_keys(lambda k, p: p.ndim == 2, params, "mask") == ["w", "v"]
    with pytest.raises(ValueError, match=r"^mask has no entry for the parameters \['b', 'v'\]"):
        checks.masked_keys({"w": True}, params, "mask")
    both = {"w": True, "b": True, "v": True, "u": False}
    assert checks.masked_keys(both, params, "mask") == ["w", "b", "v"]
    with pytest.raises(ValueError, match=r"^mask names \['u'\], which are not among"):
        checks.masked_keys(both, params, "mask", exact=True)
    with pytest.raises(ValueError, match=r"^mask must return a Python bool .* got Tensor for 'w'"):
        checks.masked_keys(lambda k, p: p.sum() == 0, params, "mask")
