"""Base optimisers against torch.optim trajectories in float64, and the schedules."""

import math

import pytest
import torch
from helpers import flatten, mlp_batch, mlp_loss, mlp_params, rel_err

import gamfunc
from gamfunc import schedules

STEPS = 50


def torch_trajectory(opt_cls, kwargs, params, batches, scheduler=None):
    tensors = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    opt = opt_cls(list(tensors.values()), **kwargs)
    sched = scheduler(opt) if scheduler else None
    for batch in batches:
        opt.zero_grad()
        mlp_loss(tensors, batch).backward()
        opt.step()
        if sched:
            sched.step()
    return {k: v.detach() for k, v in tensors.items()}


def gamfunc_trajectory(opt, params, batches):
    """The trajectory of ``opt`` alone, the step count given as a make_step gives it."""
    state = opt.init(params)
    for t, batch in enumerate(batches):
        g = torch.func.grad(mlp_loss)(params, batch)
        updates, state = gamfunc.optim.call_update(opt, g, state, params, torch.tensor(t))
        params = gamfunc.apply_updates(params, updates)
    return params, state


def batches(n=STEPS):
    return [mlp_batch(seed=i) for i in range(n)]


SGD_CASES = [
    {"lr": 0.1},
    {"lr": 0.1, "momentum": 0.9},
    {"lr": 0.05, "momentum": 0.9, "dampening": 0.1},
    {"lr": 0.05, "momentum": 0.9, "nesterov": True},
    {"lr": 0.05, "momentum": 0.8, "nesterov": True, "weight_decay": 1e-2},
    {"lr": 0.1, "momentum": 0.9, "dampening": 0.5, "weight_decay": 5e-4},
]


@pytest.mark.parametrize(
    "kwargs", SGD_CASES, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items())
)
def test_sgd_equals_torch_optim(kwargs):
    params, data = mlp_params(), batches()
    ref = torch_trajectory(torch.optim.SGD, kwargs, params, data)
    ours, _ = gamfunc_trajectory(gamfunc.sgd(**kwargs), params, data)
    assert rel_err(flatten(ours), flatten(ref)) < 1e-12


ADAMW_CASES = [
    {"lr": 1e-2},
    {"lr": 3e-3, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.3},
    {"lr": 1e-2, "weight_decay": 0.0},
]


@pytest.mark.parametrize(
    "kwargs", ADAMW_CASES, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items())
)
def test_adamw_equals_torch_optim(kwargs):
    params, data = mlp_params(), batches()
    ref = torch_trajectory(torch.optim.AdamW, kwargs, params, data)
    ours, _ = gamfunc_trajectory(gamfunc.adamw(**kwargs), params, data)
    assert rel_err(flatten(ours), flatten(ref)) < 1e-10


ADAM_CASES = [
    {"lr": 1e-2},
    {"lr": 3e-3, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.05},
]


@pytest.mark.parametrize(
    "kwargs", ADAM_CASES, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items())
)
def test_adam_equals_torch_optim(kwargs):
    params, data = mlp_params(), batches()
    ref = torch_trajectory(torch.optim.Adam, kwargs, params, data)
    ours, _ = gamfunc_trajectory(gamfunc.adam(**kwargs), params, data)
    assert rel_err(flatten(ours), flatten(ref)) < 1e-10


def test_adam_with_a_schedule_equals_torch_lambda_lr():
    params, data = mlp_params(), batches()
    sched = schedules.cosine(1e-2, total_steps=STEPS, warmup_steps=5)

    def factor(t):
        return float(sched(torch.tensor(t))) / 1e-2

    ref = torch_trajectory(
        torch.optim.Adam,
        {"lr": 1e-2, "weight_decay": 0.01},
        params,
        data,
        scheduler=lambda o: torch.optim.lr_scheduler.LambdaLR(o, factor),
    )
    ours, _ = gamfunc_trajectory(gamfunc.adam(lr=sched, weight_decay=0.01), params, data)
    assert rel_err(flatten(ours), flatten(ref)) < 1e-10


def lion_loop(params, data, lr, betas, weight_decay):
    """Lion written out from Chen et al. 2023, Algorithm 2, one tensor at a time."""
    theta = {k: v.clone() for k, v in params.items()}
    m = {k: torch.zeros_like(v) for k, v in params.items()}
    b1, b2 = betas
    for batch in data:
        g = torch.func.grad(mlp_loss)(theta, batch)
        for k in theta:
            c = b1 * m[k] + (1 - b1) * g[k]
            theta[k] = theta[k] - lr * (torch.sign(c) + weight_decay * theta[k])
            m[k] = b2 * m[k] + (1 - b2) * g[k]
    return theta


@pytest.mark.parametrize(
    ("lr", "betas", "weight_decay"), [(1e-3, (0.9, 0.99), 0.0), (3e-4, (0.95, 0.98), 1.0)]
)
def test_lion_equals_its_paper_loop(lr, betas, weight_decay):
    params, data = mlp_params(), batches()
    want = lion_loop(params, data, lr, betas, weight_decay)
    opt = gamfunc.lion(lr=lr, betas=betas, weight_decay=weight_decay)
    ours, state = gamfunc_trajectory(opt, params, data)
    assert rel_err(flatten(ours), flatten(want)) < 1e-12
    assert isinstance(state.inner.states[0], gamfunc.optim.transforms.ScaleByLionState)


def test_gam_trains_with_adam_and_lion():
    params, data = mlp_params(), batches(20)
    for opt in (gamfunc.adam(lr=1e-2), gamfunc.lion(lr=1e-3)):
        step = gamfunc.make_step(gamfunc.gam(0.05, 0.1), opt, mlp_loss)
        p, state = params, step.init(params)
        first = float(mlp_loss(p, data[0]))
        for b in data:
            p, state, _ = step(p, state, b)
        assert float(mlp_loss(p, data[0])) < first


def test_scheduled_lr_equals_torch_lambda_lr():
    params, data = mlp_params(), batches()
    sched = schedules.cosine(0.1, total_steps=STEPS, warmup_steps=5)

    def factor(t):
        return float(sched(torch.tensor(t))) / 0.1

    ref = torch_trajectory(
        torch.optim.SGD,
        {"lr": 0.1, "momentum": 0.9},
        params,
        data,
        scheduler=lambda o: torch.optim.lr_scheduler.LambdaLR(o, factor),
    )
    ours, state = gamfunc_trajectory(gamfunc.sgd(lr=sched, momentum=0.9), params, data)
    assert rel_err(flatten(ours), flatten(ref)) < 1e-12
    assert torch.allclose(gamfunc.optim.learning_rate(state), sched(torch.tensor(STEPS - 1)))


def test_lr_written_into_state_takes_effect():
    params, data = mlp_params(), batches(2)
    opt = gamfunc.sgd(lr=0.1)
    state = opt.init(params)
    state = state._replace(hyperparams={"lr": torch.tensor(0.0, dtype=torch.float64)})
    u, _ = opt.update(torch.func.grad(mlp_loss)(params, data[0]), state, params)
    new = gamfunc.apply_updates(params, u)
    assert all(torch.equal(new[k], params[k]) for k in params)


def test_optimiser_states_hold_their_statistics_and_injected_hyperparameters():
    params = {"w": torch.ones(3), "b": torch.zeros(2)}
    sgd, momentum, adamw = gamfunc.sgd(0.1), gamfunc.sgd(0.1, momentum=0.9), gamfunc.adamw(1e-3)
    state = sgd.init(params)
    assert type(state) is gamfunc.InjectState and set(state.hyperparams) == {"lr"}
    assert state.inner.states == ((),)  # scale_by_learning_rate: no state
    (trace, _) = momentum.init(params).inner.states
    assert type(trace) is gamfunc.optim.transforms.TraceState
    assert trace.momentum_buffer.keys() == params.keys()
    state = adamw.init(params)
    assert set(state.hyperparams) == {"lr", "weight_decay"}
    adam_state, decay, lr = state.inner.states
    assert type(adam_state) is gamfunc.optim.transforms.ScaleByAdamState and decay == lr == ()
    assert adam_state._fields == ("exp_avg", "exp_avg_sq")
    chained = gamfunc.chain(gamfunc.clip_by_global_norm(1.0), adamw)
    chain = chained.init(params)
    assert type(chain) is gamfunc.ChainState and type(chain.states[1]) is gamfunc.InjectState
    for opt in (sgd, momentum, adamw, chained):
        _, new = gamfunc.optim.call_update(opt, params, opt.init(params), params, torch.tensor(0))
        assert type(new) is type(opt.init(params))


@pytest.mark.parametrize(
    "dtypes, want",
    [
        ((torch.float32,), torch.float32),
        ((torch.bfloat16, torch.float16), torch.float32),
        ((torch.float32, torch.float64), torch.float64),
    ],
)
def test_hyperparameters_live_in_the_widest_dtype_of_the_params_at_least_float32(dtypes, want):
    # A 0-d float64 tensor on the CPU is what torch.compile turns into a symbolic float (and a
    # second trace of the step): a step on float32 params carries none in its state.
    params = {f"w{i}": torch.ones(3, dtype=d) for i, d in enumerate(dtypes)}
    params["count"] = torch.zeros(2, dtype=torch.int64)  # not floating: no say in the dtype
    assert gamfunc.optim.hyperparam_dtype(params) == want
    lr = schedules.cosine(0.1, total_steps=10, warmup_steps=2)
    opt = gamfunc.chain(gamfunc.sgd(lr=lr, momentum=0.9), gamfunc.adamw(lr=1e-3))
    step = gamfunc.make_step(
        gamfunc.sam(rho=0.05), opt, lambda p, b: sum(v.sum() for v in p.values())
    )
    floats = {k: v for k, v in params.items() if v.is_floating_point()}
    state = step.init(floats)
    scalars = [
        t for t in torch.utils._pytree.tree_leaves(state) if t.ndim == 0 and t.is_floating_point()
    ]
    assert scalars and {t.dtype for t in scalars} == {want}
    for s in gamfunc.optim.injected(state):  # a schedule's kept value too, after an update
        assert all(v.dtype == want for v in (*s.hyperparams.values(), *s.scheduled.values()))
    _, new, _ = step(floats, state, None)
    assert {t.dtype for s in gamfunc.optim.injected(new.opt) for t in s.scheduled.values()} == {
        want
    }


def test_set_hyperparams_sets_a_constant_through_a_chain_and_refuses_a_schedule():
    params = {"w": torch.ones(3)}
    lr = torch.tensor(0.5)  # in the state's dtype (float32 for float32 params): kept as given
    state = gamfunc.chain(gamfunc.clip_by_global_norm(1.0), gamfunc.sgd(0.1)).init(params)
    changed = gamfunc.set_hyperparams(state, lr=lr)
    assert changed.states[1].hyperparams["lr"] is lr and gamfunc.optim.learning_rate(changed) is lr
    # the state given is not changed
    assert gamfunc.optim.learning_rate(state).item() == torch.tensor(0.1).item()
    wide = gamfunc.set_hyperparams(state, lr=torch.tensor(0.25, dtype=torch.float64))
    assert gamfunc.optim.learning_rate(wide).dtype == torch.float32  # taken in the state's dtype
    assert float(gamfunc.optim.learning_rate(wide)) == 0.25
    with pytest.raises(ValueError, match="momentum is not a hyperparameter"):
        gamfunc.set_hyperparams(state, momentum=lr)
    schedule = schedules.cosine(0.1, total_steps=10)
    five = torch.tensor(5.0)
    for make in (gamfunc.sgd, gamfunc.adamw, gamfunc.adam, gamfunc.lion):
        for state in (
            make(lr=schedule).init(params),
            gamfunc.chain(make(lr=schedule)).init(params),
        ):
            with pytest.raises(ValueError, match=r"lr cannot be set.*schedule.*constant lr"):
                gamfunc.set_hyperparams(state, lr=five)
        opt = make(lr=0.1)
        state = gamfunc.set_hyperparams(opt.init(params), lr=five)
        u, state = gamfunc.optim.call_update(opt, params, state, params, torch.tensor(0))
        new = gamfunc.apply_updates(params, u)
        assert state.hyperparams["lr"] is five and not torch.equal(new["w"], params["w"])


def test_state_lr_is_the_lr_of_the_last_update():
    """The injected lr after an update is the schedule's value at the step that update took,
    η_{t−1} for t updates taken, for every optimiser and through a chain; init holds the first."""
    params, data = mlp_params(), batches(6)
    lr = schedules.cosine(0.1, total_steps=6, warmup_steps=3)
    factories = (gamfunc.sgd, gamfunc.adamw, gamfunc.adam, gamfunc.lion)
    for opt in [make(lr=lr) for make in factories] + [gamfunc.chain(gamfunc.sgd(lr=lr))]:
        p, state = params, opt.init(params)
        assert float(gamfunc.optim.learning_rate(state)) == float(lr(torch.tensor(0)))
        for t, b in enumerate(data):
            g = torch.func.grad(mlp_loss)(p, b)
            u, state = gamfunc.optim.call_update(opt, g, state, p, torch.tensor(t))
            p = gamfunc.apply_updates(p, u)
            assert float(gamfunc.optim.learning_rate(state)) == float(lr(torch.tensor(t)))
    # the same through a step, with a skipped step between: the lr of the last step taken
    step = gamfunc.make_step(gamfunc.sam(0.05), gamfunc.sgd(lr=lr), mlp_loss)
    p, state = params, step.init(params)
    bad = (data[0][0] * float("nan"), data[0][1])
    for b in (data[0], data[1], bad, data[2]):
        p, state, metrics = step(p, state, b)
        taken = int(state.step) - 1
        assert float(gamfunc.optim.learning_rate(state.opt)) == float(lr(torch.tensor(taken)))
        if not int(metrics["skipped"]):
            assert float(metrics["lr"]) == float(gamfunc.optim.learning_rate(state.opt))
    assert int(state.skipped) == 1 and lr(torch.tensor(1)) != lr(torch.tensor(2))


def test_an_update_that_reads_the_step_count_says_so_without_one():
    params = {"w": torch.ones(3)}
    for opt, who in (
        (gamfunc.adam(1e-3), "scale_by_adam"),
        (gamfunc.sgd(lr=schedules.cosine(0.1, total_steps=10)), "schedule of lr"),
        (gamfunc.sgd(0.1, momentum=0.9, dampening=0.5), "trace with dampening"),
    ):
        with pytest.raises(ValueError, match=f"{who}.*step=t"):
            opt.update(params, opt.init(params), params)


def test_optimisers_keep_float32():
    params = mlp_params(dtype=torch.float32)
    for opt in (gamfunc.sgd(lr=0.1, momentum=0.9, weight_decay=1e-4), gamfunc.adamw(lr=1e-3)):
        u, _state = opt.update(params, opt.init(params), params, step=torch.tensor(0))
        new = gamfunc.apply_updates(params, u)
        assert all(v.dtype == torch.float32 for v in new.values())


def test_optimisers_keep_float32_for_a_0d_parameter():
    # A 0-d float64 factor (lr, bias correction) must not promote a 0-d float32 leaf to float64.
    params = {"w": torch.ones(3), "temperature": torch.tensor(2.0)}
    for opt in (gamfunc.sgd(lr=0.1, momentum=0.9, weight_decay=1e-4), gamfunc.adamw(lr=1e-3)):
        p, state = params, opt.init(params)
        for _ in range(2):
            u, state = opt.update(params, state, p, step=torch.tensor(0))
            p = gamfunc.apply_updates(p, u)
        assert all(v.dtype == torch.float32 for v in p.values())
        stats = [b for s in state.inner.states for b in s if isinstance(b, dict)]
        buffers = [v for b in stats for v in b.values()]
        assert buffers and all(v.dtype == torch.float32 for v in buffers)


def test_cosine_schedule_values():
    s = schedules.cosine(1.0, total_steps=110, warmup_steps=10, final=0.1)
    assert math.isclose(float(s(torch.tensor(0))), 0.1)
    assert math.isclose(float(s(torch.tensor(9))), 1.0)
    assert math.isclose(float(s(torch.tensor(10))), 1.0)
    assert math.isclose(float(s(torch.tensor(60))), 0.55)
    assert math.isclose(float(s(torch.tensor(110))), 0.1)
    assert math.isclose(float(s(torch.tensor(500))), 0.1)


def test_inverse_sqrt_and_proportional_schedules():
    inv = schedules.inverse_sqrt(0.5)
    assert math.isclose(float(inv(torch.tensor(0))), 0.5)
    assert math.isclose(float(inv(torch.tensor(3))), 0.25)
    lr = schedules.cosine(0.1, total_steps=100)
    rho = schedules.proportional(0.05, lr, 0.1)
    for t in (0, 30, 99):
        assert math.isclose(float(rho(torch.tensor(t))), 0.5 * float(lr(torch.tensor(t))))
    assert float(schedules.constant(0.3)(torch.tensor(7))) == 0.3


def test_proportional_schedule_has_the_authors_floor():
    """ρ(t) = ρ_min + (ρ₀ − ρ_min)·lr(t)/lr₀: the authors' ProportionScheduler with min_lr = 0
    (github.com/xxgege/GAM gam/util.py l.55-57), written out step by step here."""
    lr = schedules.cosine(0.1, total_steps=50)
    rho = schedules.proportional(0.2, lr, 0.1, floor=0.05)
    for t in range(0, 60, 7):
        lr_t = 0.1 * (1 + math.cos(math.pi * min(t, 50) / 50)) / 2
        want = 0.05 + (0.2 - 0.05) * (lr_t - 0.0) / (0.1 - 0.0)
        assert math.isclose(float(rho(torch.tensor(t))), want, rel_tol=1e-12, abs_tol=1e-15)
    flat = schedules.proportional(0.2, lr, 0.1, floor=0.2)  # min_value = max_value: constant
    assert all(float(flat(torch.tensor(t))) == pytest.approx(0.2) for t in (0, 25, 50))
    for floor in (-0.01, 0.3):
        with pytest.raises(ValueError, match="floor"):
            schedules.proportional(0.2, lr, 0.1, floor=floor)


@pytest.mark.parametrize(
    ("factory", "kwargs", "name"),
    [
        (gamfunc.sgd, {"lr": -0.1}, "lr"),
        (gamfunc.sgd, {"lr": 0.1, "momentum": -0.9}, "momentum"),
        (gamfunc.sgd, {"lr": 0.1, "dampening": float("nan")}, "dampening"),
        (gamfunc.sgd, {"lr": 0.1, "weight_decay": -1.0}, "weight_decay"),
        (gamfunc.sgd, {"lr": 0.1, "nesterov": True}, "nesterov"),
        (gamfunc.adamw, {"lr": float("inf")}, "lr"),
        (gamfunc.adamw, {"betas": (0.9, 1.0)}, "betas"),
        (gamfunc.adamw, {"eps": -1e-8}, "eps"),
        (gamfunc.adamw, {"weight_decay": -0.1}, "weight_decay"),
        (gamfunc.adam, {"weight_decay": -0.1}, "weight_decay"),
        (gamfunc.adam, {"betas": (1.0, 0.9)}, "betas"),
        (gamfunc.lion, {"lr": -1.0}, "lr"),
        (gamfunc.lion, {"betas": (0.9,)}, "betas"),
        (gamfunc.lion, {"weight_decay": float("nan")}, "weight_decay"),
        (schedules.cosine, {"peak": 0.1, "total_steps": 0}, "total_steps"),
        (schedules.cosine, {"peak": 0.1, "total_steps": 5, "warmup_steps": 9}, "warmup_steps"),
    ],
)
def test_invalid_hyperparameters_name_the_argument(factory, kwargs, name):
    with pytest.raises(ValueError, match=name):
        factory(**kwargs)


# ---- the one contract: updates, apply_updates, and the deprecated params-returning form ------------


def test_apply_updates_adds_keeps_dtype_and_checks_names():
    params = {"w": torch.tensor([1.0, 2.0]), "t": torch.tensor(3.0, dtype=torch.float64)}
    updates = {"w": torch.tensor([0.5, -2.0]), "t": torch.tensor(-1.0, dtype=torch.float64)}
    before = {k: v.clone() for k, v in params.items()}
    new = gamfunc.apply_updates(params, updates)
    assert new["w"].tolist() == [1.5, 0.0] and float(new["t"]) == 2.0
    assert all(torch.equal(params[k], before[k]) for k in params)
    wide = gamfunc.apply_updates(params, {**updates, "w": updates["w"].double()})
    assert wide["w"].dtype == torch.float32
    with pytest.raises(ValueError, match=r"missing \['t'\]"):
        gamfunc.apply_updates(params, {"w": updates["w"]})


def test_apply_updates_takes_moved_parameters_as_they_are():
    """A transform that moved its parameters itself returns them (Moved): apply_updates gives those
    very tensors, in the order of params, and still checks the names."""
    from gamfunc.optim.base import Moved

    params = {"a": torch.zeros(2), "b": torch.zeros(3)}
    moved = Moved(b=torch.ones(3), a=torch.full((2,), 2.0))
    new = gamfunc.apply_updates(params, moved)
    assert list(new) == ["a", "b"] and new["a"] is moved["a"] and new["b"] is moved["b"]
    assert type(new) is dict
    with pytest.raises(ValueError, match=r"missing \['b'\]"):
        gamfunc.apply_updates(params, Moved(a=moved["a"]))


def test_sgd_updates_are_minus_lr_times_the_direction_bit_for_bit():
    params, g = mlp_params(), mlp_params(seed=4)
    u, _ = gamfunc.sgd(lr=0.1).update(g, gamfunc.sgd(lr=0.1).init(params), params)
    assert all(torch.equal(u[k], -(0.1 * g[k])) for k in params)
    new = gamfunc.apply_updates(params, u)
    assert all(torch.equal(new[k], params[k] - 0.1 * g[k]) for k in params)
