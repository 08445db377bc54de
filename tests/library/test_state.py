"""gamfunc/state.py: a step's state refused in one line naming the field where it was not made for
the parameters or the step, and its plain-dict form, which round-trips through ``torch.save`` and
``torch.load(weights_only=True)``."""

from __future__ import annotations

import io

import pytest
import torch
from gamfunc.state import (
    StepState,
    as_dict,
    check_count,
    check_counts,
    check_cycle,
    check_est,
    check_state,
    from_dict,
)

import gamfunc


def loss_fn(params, batch):
    x, y = batch
    return ((x @ params["w"] + params["b"] - y) ** 2).mean()


def params(rows=3):
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(rows, 2, generator=g), "b": torch.zeros(2)}


def batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(8, 3, generator=g), torch.randn(8, 2, generator=g)


def momentum_step(**kw):
    return gamfunc.make_step(gamfunc.sam(0.05), gamfunc.sgd(lr=0.1, momentum=0.9), loss_fn, **kw)


def test_a_state_round_trips_through_its_plain_dict_and_torch_save():
    step = momentum_step(every=2)
    p = params()
    state = step.init(p)
    for _ in range(3):
        p, state, _ = step(p, state, batch())
    buf = io.BytesIO()
    torch.save(as_dict(state), buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    back = from_dict(saved, like=step.init(params()))
    assert isinstance(back, StepState) and type(back.opt) is type(state.opt)
    flat, spec = torch.utils._pytree.tree_flatten(state)
    flat_back, spec_back = torch.utils._pytree.tree_flatten(back)
    assert spec == spec_back and all(
        torch.equal(a, b) for a, b in zip(flat, flat_back, strict=True)
    )
    # the next step from the loaded state is the next step from the state itself
    (p1, s1, _), (p2, s2, _) = step(p, state, batch()), step(p, back, batch())
    assert all(torch.equal(p1[k], p2[k]) for k in p1) and int(s1.step) == int(s2.step) == 4


def test_as_dict_leaves_out_the_empty_fields():
    state = momentum_step().init(params())
    assert sorted(as_dict(state)) == ["opt", "skipped", "step"]
    assert sorted(as_dict(momentum_step(every=2).init(params()))) == [
        "cycle",
        "opt",
        "skipped",
        "step",
    ]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: {**d, "extra": 1}, r"^state has entries \['extra'\] that StepState has not"),
        (lambda d: {k: v for k, v in d.items() if k != "step"}, r"^state has no entry 'step'"),
        (lambda d: {**d, "step": torch.tensor(-5)}, r"^state.step is -5, but a count of steps"),
        (lambda d: [d], r"^state must be a dict of the fields of StepState"),
    ],
)
def test_from_dict_refuses_another_structure_naming_the_field(change, message):
    like = momentum_step().init(params())
    with pytest.raises(ValueError, match=message):
        from_dict(change(as_dict(like)), like=like)


def test_from_dict_refuses_other_names_or_shapes_naming_the_field():
    like = momentum_step().init(params())
    other_shapes = as_dict(momentum_step().init(params(rows=4)))
    with pytest.raises(ValueError, match=r"momentum_buffer\['w'\] has shape \(4, 2\); expected"):
        from_dict(other_shapes, like=like)
    other_names = as_dict(momentum_step().init({"v": torch.zeros(3, 2), "b": torch.zeros(2)}))
    with pytest.raises(ValueError, match=r"momentum_buffer has keys \['b', 'v'\]; expected"):
        from_dict(other_names, like=like)


def test_check_state_refuses_a_state_made_for_other_parameters_naming_the_field():
    state = momentum_step().init(params())
    check_state(state, params())
    with pytest.raises(ValueError, match=r"momentum_buffer\['w'\] has shape \(3, 2\) but"):
        check_state(state, params(rows=4))
    with pytest.raises(ValueError, match=r"momentum_buffer was made for other parameters"):
        check_state(state, {"v": torch.zeros(3, 2), "b": torch.zeros(2)})


def test_check_state_refuses_what_is_no_step_state_in_a_type_error():
    state = momentum_step().init(params())
    with pytest.raises(TypeError, match=r"^state must be the StepState .* as_dict gives"):
        check_state(as_dict(state), params())
    with pytest.raises(TypeError, match=r"^state.skipped must be an int64 tensor; got a torch"):
        check_state(state._replace(skipped=torch.tensor(0.0)), params())
    with pytest.raises(TypeError, match=r"^state.buffers must be a dict name -> tensor or \(\)"):
        check_state(state._replace(buffers=[1]), params())


def test_a_negative_count_is_refused_naming_it():
    check_count("state.step", torch.tensor(0))
    with pytest.raises(ValueError, match=r"^state.step is -1, but a count of steps is >= 0"):
        check_count("state.step", torch.tensor(-1))
    state = momentum_step().init(params())
    with pytest.raises(ValueError, match=r"^state.skipped is -2"):
        check_counts(state._replace(skipped=torch.tensor(-2)))


def test_the_cycle_and_the_estimators_state_must_fit_the_step():
    check_cycle((), None)
    check_cycle(torch.tensor(3), "every=2")
    with pytest.raises(ValueError, match=r"^state.cycle is \(\), but a step with every=2 needs"):
        check_cycle((), "every=2")
    with pytest.raises(ValueError, match=r"^state.cycle is set, but this step has every=1"):
        check_cycle(torch.tensor(0), None)
    with pytest.raises(ValueError, match=r"^state.cycle is -1"):
        check_cycle(torch.tensor(-1), "every=2")
    stateful, stateless = gamfunc.looksam(0.05, 3, 0.7), gamfunc.sam(0.05)
    own = stateful.init(params())
    check_est(own, stateful)
    check_est((), stateless)
    with pytest.raises(ValueError, match=r"^state.est is \(\), but estimator 'looksam' carries"):
        check_est((), stateful)
    with pytest.raises(ValueError, match=r"^state.est is set, but estimator 'sam' has no state"):
        check_est(own, stateless)
