"""Out-of-range hyperparameters never reach a step: through schedules (checked by their bounds when
given, or on the device at each step), tensors, the dtype a state keeps them in, its counts, or a
direction of other shapes; estimators with a reusing branch report which steps were full."""

from __future__ import annotations

import pytest
import torch

import gamfunc
from gamfunc import schedules
from gamfunc.ranges import GuardedSchedule
from gamfunc.training.state import as_dict, from_dict


def loss_fn(p, b):
    return ((b[0] @ p["w"] - b[1]) ** 2).mean()


def batch():
    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 3, generator=g), torch.randn(8, generator=g)


PARAMS = {"w": torch.zeros(3)}


def negative(t):  # a schedule of the user's own, which states no bounds
    return torch.full((), -1.0, dtype=torch.float64, device=t.device)


def half(t):
    return torch.full((), 0.5, dtype=torch.float64, device=t.device)


# every factory argument that takes a schedule, and must be >= 0
CONSUMERS = [
    (lambda v: gamfunc.sgd(lr=v), "lr"),
    (lambda v: gamfunc.sgd(0.1, weight_decay=v), "weight_decay"),
    (lambda v: gamfunc.adam(lr=v), "lr"),
    (lambda v: gamfunc.adamw(lr=v), "lr"),
    (lambda v: gamfunc.lion(lr=v), "lr"),
    (lambda v: gamfunc.sam(rho=v), "rho"),
    (lambda v: gamfunc.gam(v, 0.1), "rho"),
    (lambda v: gamfunc.gam(0.05, v), "alpha"),
    (lambda v: gamfunc.looksam(v, 5, 0.7), "rho"),
    (lambda v: gamfunc.look_gam(v, 0.1, 5), "rho"),
    (lambda v: gamfunc.gsam(v, 0.1), "rho"),
    (lambda v: gamfunc.asam(v), "rho"),
    (lambda v: gamfunc.gnp(v), "alpha"),
]


IDS = [f"{i}-{name}" for i, (_, name) in enumerate(CONSUMERS)]


@pytest.mark.parametrize("make, name", CONSUMERS, ids=IDS)
@pytest.mark.parametrize(
    "schedule",
    [
        schedules.constant(-1.0),
        schedules.cosine(-1.0, 10),
        schedules.cosine(0.1, 10, final=-0.01),
        schedules.inverse_sqrt(-0.1),
    ],
    ids=["constant", "cosine_peak", "cosine_final", "inverse_sqrt"],
)
def test_a_schedule_whose_bounds_leave_the_range_is_refused_when_given(make, name, schedule):
    with pytest.raises(ValueError, match=f"^{name} must be .*got a schedule whose values reach"):
        make(schedule)


@pytest.mark.parametrize("make, name", CONSUMERS, ids=IDS)
def test_a_tensor_must_hold_one_finite_value_in_range(make, name):
    with pytest.raises(ValueError, match=f"^{name} must be .*shape \\(3,\\)"):
        make(torch.ones(3))
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=f"^{name} must be"):
            make(torch.tensor(bad))
    make(torch.tensor([0.1]))  # one element: taken as a 0-d tensor


def test_a_tensor_of_one_element_is_its_number():
    params, b = PARAMS, batch()
    out = []
    for lr in (0.1, torch.tensor([0.1])):
        step = gamfunc.make_step(gamfunc.sam(0.05), gamfunc.sgd(lr=lr), loss_fn)
        out.append(step(params, step.init(params), b)[0]["w"])
    assert torch.equal(out[0], out[1])


def test_schedules_refuse_values_that_are_not_finite():
    nan = float("nan")
    for make, name in (
        (lambda: schedules.constant(nan), "v"),
        (lambda: schedules.inverse_sqrt(nan), "initial"),
        (lambda: schedules.cosine(nan, 10), "peak"),
        (lambda: schedules.proportional(nan, schedules.constant(0.1), 0.1), "initial"),
        (lambda: schedules.proportional(0.1, schedules.constant(0.1), nan), "lr_initial"),
    ):
        with pytest.raises(ValueError, match=f"^{name} must be a finite number"):
            make()
    with pytest.raises(ValueError, match=r"^lr must be a schedule"):
        schedules.proportional(0.1, 0.1, 0.1)


def test_schedules_state_their_bounds_and_keep_them_below_step_zero():
    assert schedules.constant(0.3).bounds == (0.3, 0.3)
    assert schedules.cosine(1.0, 100, 10, final=0.5).bounds == (0.1, 1.0)
    assert schedules.inverse_sqrt(0.2).bounds == (0.0, 0.2)
    lr = schedules.cosine(0.1, 100, 10)
    rho = schedules.proportional(0.05, lr, 0.1, floor=0.01)
    assert rho.bounds == pytest.approx((0.01, 0.05))
    for s in (lr, schedules.cosine(0.1, 100), schedules.inverse_sqrt(0.2), rho):
        lo, hi = s.bounds
        values = [float(s(torch.tensor(t))) for t in (-5, -1, 0, 3, 10, 50, 200)]
        assert all(lo - 1e-12 <= v <= hi + 1e-12 for v in values), values
        assert values[0] == values[2]  # a count below 0 reads as 0
    # the warm-up of a negative count: the issue's -0.08, now the value at 0
    assert float(lr(torch.tensor(-5))) == float(lr(torch.tensor(0))) == pytest.approx(0.01)


def test_a_schedule_without_bounds_is_guarded_and_its_step_skipped():
    assert isinstance(gamfunc.sam(negative).hparams["rho"], GuardedSchedule)
    params, b = PARAMS, batch()
    for est, opt in (
        (gamfunc.sam(0.05), gamfunc.sgd(lr=negative)),
        (gamfunc.sam(negative), gamfunc.sgd(lr=0.1)),
        (gamfunc.gam(0.05, negative), gamfunc.sgd(lr=0.1)),
        (gamfunc.sam(0.05), gamfunc.sgd(0.1, weight_decay=negative)),
        (gamfunc.sam(0.05), gamfunc.adamw(lr=negative)),
        (
            gamfunc.sam(lambda t: torch.full((), float("nan"), dtype=torch.float64)),
            gamfunc.sgd(0.1),
        ),
    ):
        step = gamfunc.make_step(est, opt, loss_fn)
        state = step.init(params)
        new, new_state, m = step(params, state, b)
        assert int(m["skipped"]) == 1 and int(m["out_of_range"]) == 1
        assert torch.equal(new["w"], params["w"]) and int(new_state.step) == 0
        assert int(new_state.skipped) == 1


def test_a_guarded_schedule_in_range_changes_nothing():
    params, b = PARAMS, batch()
    out = []
    for lr in (0.5, half):
        step = gamfunc.make_step(gamfunc.sam(0.05), gamfunc.sgd(lr=lr, momentum=0.9), loss_fn)
        p, s = params, step.init(params)
        for _ in range(3):
            p, s, m = step(p, s, b)
        out.append(p["w"])
        assert int(m["skipped"]) == 0
    assert int(m["out_of_range"]) == 0
    assert torch.equal(out[0], out[1])


def test_a_compiled_step_skips_an_out_of_range_schedule_without_a_read():
    params, b = PARAMS, batch()
    step = gamfunc.make_step(gamfunc.sam(negative), gamfunc.sgd(lr=0.1), loss_fn)
    new, _, m = torch.compile(step, backend="eager", fullgraph=False)(params, step.init(params), b)
    assert int(m["skipped"]) == 1 and int(m["out_of_range"]) == 1
    assert torch.equal(new["w"], params["w"])


def test_the_optimisers_lr_is_checked_at_each_update_whoever_set_it():
    """The state's lr set by hand (as a torch.optim facade writes a scheduler's value into it):
    the update guards it on the device, the step is skipped."""
    params, b = PARAMS, batch()
    for opt in (gamfunc.sgd(0.1), gamfunc.adamw(1e-3), gamfunc.lion(1e-4)):
        step = gamfunc.make_step(gamfunc.sam(0.05), opt, loss_fn)
        state = step.init(params)
        for lr in (-1.0, float("nan")):
            hp = dict(state.opt.hyperparams, lr=torch.tensor(lr))
            bad = state._replace(opt=state.opt._replace(hyperparams=hp))
            new, _, m = step(params, bad, b)
            assert int(m["skipped"]) == 1, (opt, lr)
            assert torch.equal(new["w"], params["w"])
    with pytest.raises(ValueError, match=r"^lr must be a finite number >= 0"):
        gamfunc.set_hyperparams(state.opt, lr=-1.0)


def test_a_value_not_finite_in_the_dtype_of_the_state_is_refused():
    with pytest.raises(ValueError, match=r"^lr=1e\+40 is not finite in torch.float32"):
        gamfunc.sgd(1e40).init(PARAMS)
    with pytest.raises(ValueError, match=r"^lr=1e\+40 is not finite in torch.float32"):
        gamfunc.sgd(schedules.constant(1e40)).init(PARAMS)
    state = gamfunc.sgd(0.1).init(PARAMS)
    with pytest.raises(ValueError, match=r"^lr=1e\+40 is not finite in torch.float32"):
        gamfunc.set_hyperparams(state, lr=1e40)
    with pytest.raises(ValueError, match=r"^weight_decay=1e\+40 is not finite"):
        gamfunc.adamw(weight_decay=1e40).init(PARAMS)
    # float64 parameters keep their hyperparameters in float64, where 1e40 is finite
    state = gamfunc.sgd(1e40).init({"w": torch.zeros(3, dtype=torch.float64)})
    assert float(state.hyperparams["lr"]) == 1e40


def test_a_negative_step_count_is_refused_on_load_and_at_an_eager_step_and_read_as_0():
    schedule = schedules.cosine(0.1, 100, 10)
    step = gamfunc.make_step(gamfunc.sam(0.05), gamfunc.sgd(schedule), loss_fn)
    state = step.init(PARAMS)
    for field in ("step", "skipped"):
        with pytest.raises(ValueError, match=f"^state.{field} is -5, but a count"):
            from_dict({**as_dict(state), field: torch.tensor(-5)}, like=state)
        # an eager step on the CPU reads the counts (no wait): a negative one is refused there too
        with pytest.raises(ValueError, match=f"^state.{field} is -5, but a count"):
            step(PARAMS, state._replace(**{field: torch.tensor(-5)}), batch())
    # where a step reads no count (compiled, on a GPU), the schedules read one below 0 as 0, so a
    # warm-up never gives a negative lr
    assert torch.equal(schedule(torch.tensor(-5)), schedule(torch.tensor(0)))
    assert float(schedule(torch.tensor(-5))) > 0
    cyc = gamfunc.make_step(gamfunc.sam(0.05), gamfunc.sgd(0.1), loss_fn, every=2)
    state = cyc.init(PARAMS)
    with pytest.raises(ValueError, match=r"^state.cycle is -1"):
        cyc(PARAMS, state._replace(cycle=torch.tensor(-1)), batch())


@pytest.mark.parametrize(
    "opt",
    [
        gamfunc.sgd(0.1, momentum=0.9),
        gamfunc.adam(),
        gamfunc.adamw(),
        gamfunc.lion(),
        gamfunc.chain(gamfunc.clip_by_global_norm(1.0), gamfunc.sgd(0.1)),
    ],
    ids=["sgd", "adam", "adamw", "lion", "chain"],
)
def test_an_update_refuses_a_direction_of_other_shapes(opt):
    params = {"w": torch.zeros(3)}
    state = opt.init(params)
    with pytest.raises(ValueError, match=r"^direction\['w'\] has shape \(3, 3\) but params"):
        opt.update({"w": torch.ones(3, 3)}, state, params, step=torch.tensor(0))
    with pytest.raises(ValueError, match=r"^direction must have the names of params"):
        opt.update({"v": torch.ones(3)}, state, params, step=torch.tensor(0))


def test_make_step_refuses_a_base_that_is_no_estimator():
    with pytest.raises(TypeError, match=r"^base must be a gamfunc estimator"):
        gamfunc.make_step(gamfunc.sam(0.05), gamfunc.sgd(0.1), loss_fn, every=2, base="sgd")
    with pytest.raises(ValueError, match=r"^base 'looksam' cycles itself"):
        gamfunc.make_step(
            gamfunc.sam(0.05),
            gamfunc.sgd(0.1),
            loss_fn,
            every=2,
            base=gamfunc.looksam(0.05, 2, 0.7),
        )


def test_a_lookgam_state_is_not_taken_for_a_looksam_one():
    looksam = gamfunc.make_step(gamfunc.looksam(0.05, 2, 0.7), gamfunc.sgd(0.1), loss_fn)
    lookgam = gamfunc.make_step(gamfunc.look_gam(0.05, 0.1, 2), gamfunc.sgd(0.1), loss_fn)
    with pytest.raises(ValueError, match=r"^state.est is a LookGAMState, but estimator 'looksam'"):
        looksam(PARAMS, lookgam.init(PARAMS), batch())
    with pytest.raises(ValueError, match=r"^state.est is a LookSAMState, but estimator 'look_gam'"):
        lookgam(PARAMS, looksam.init(PARAMS), batch())


@pytest.mark.parametrize(
    "est",
    [gamfunc.looksam(1e308, 3, 0.7), gamfunc.look_gam(1e308, 0.1, 3)],
    ids=["looksam", "look_gam"],
)
def test_a_reusing_estimator_says_which_steps_were_full(est):
    """Every full step skipped (ρ = 1e308): the steps between still train, from a stored part that
    never was; the metrics count the full steps, so that a caller can tell."""
    step = gamfunc.make_step(est, gamfunc.sgd(0.1), loss_fn)
    params, state, b = PARAMS, step.init(PARAMS), batch()
    full = skipped_full = 0
    for _ in range(7):
        params, state, m = step(params, state, b)
        full += int(m["full_step"])
        skipped_full += int(m["full_step"] * m["skipped"])
    assert (full, skipped_full) == (3, 3)  # steps 0, 3, 6
    assert int(state.skipped) == 3 and int(state.step) == 4
