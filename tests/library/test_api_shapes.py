"""A tree of the wrong kind or shape is refused where it enters, in one line naming it: an update is
never broadcast onto a parameter, and a schedule never starts from a value that is not a number."""

from __future__ import annotations

import pytest
import torch

import gamfunc

P = {"w": torch.zeros(3), "b": torch.zeros(())}


def test_an_update_of_another_shape_is_refused_naming_the_key_and_both_shapes():
    with pytest.raises(
        ValueError, match=r"updates\['w'\] has shape \(3, 3\) but params\['w'\] has \(3,\)"
    ):
        gamfunc.apply_updates(P, {"w": torch.zeros(3, 3), "b": torch.zeros(())})


@pytest.mark.parametrize("bad", [[torch.zeros(3)], None, {"w": {"nested": torch.zeros(3)}}])
def test_updates_that_are_not_a_flat_dict_of_tensors_are_a_type_error(bad):
    with pytest.raises(TypeError, match="updates must be a flat dict"):
        gamfunc.apply_updates(P, bad)
    with pytest.raises(TypeError, match="params must be a flat dict"):
        gamfunc.apply_updates(bad, P)


@pytest.mark.parametrize(
    "opt", [gamfunc.sgd(lr=0.1), gamfunc.adamw(), gamfunc.adam(), gamfunc.lion()]
)
def test_a_step_whose_optimiser_gets_a_direction_of_another_shape_leaves_the_shapes(opt):
    def transform_init(params):
        return ()

    def wrong(direction, state, params):  # a transform that returns (2, *shape)
        return {k: torch.stack([v, v]) for k, v in direction.items()}, state

    loss = lambda p, b: (p["w"] ** 2).sum() + p["b"] ** 2  # noqa: E731
    step = gamfunc.make_step(
        gamfunc.gradient(), gamfunc.chain(gamfunc.Transform(transform_init, wrong), opt), loss
    )
    with pytest.raises(ValueError, match=r"has shape \(2, 3\)|shape \(2, 3\)"):
        step(P, step.init(P), None)


def test_a_schedule_from_a_value_that_is_not_a_number_is_refused_naming_it():
    with pytest.raises(ValueError, match="peak"):
        gamfunc.schedules.cosine(float("nan"), 10)
    with pytest.raises(ValueError, match="final"):
        gamfunc.schedules.cosine(0.1, 10, final=float("inf"))
    with pytest.raises(ValueError, match="total_steps"):
        gamfunc.schedules.cosine(0.1, 0)
    with pytest.raises(ValueError, match="warmup_steps"):
        gamfunc.schedules.cosine(0.1, 10, warmup_steps=-1)


@pytest.mark.parametrize(
    "value, why",
    [
        (-1.0, "lr must be a finite number >= 0"),
        (float("nan"), "lr must be a finite number >= 0"),
        (torch.tensor(-1.0, dtype=torch.float64), "lr must be a finite number >= 0"),
        (torch.zeros(3, dtype=torch.float64), r"lr must be a number or a 0-d floating tensor"),
    ],
)
def test_set_hyperparams_takes_what_the_constructor_takes(value, why):
    state = gamfunc.sgd(lr=0.1).init(P)
    with pytest.raises(ValueError, match=why):
        gamfunc.set_hyperparams(state, lr=value)
    lr = gamfunc.optim.learning_rate(gamfunc.set_hyperparams(state, lr=0.2))
    assert lr.dtype == torch.float32 and lr.item() == torch.tensor(0.2).item()  # P is float32
