"""The torch.optim facade keeps every option of make_step whatever the base optimiser, param groups
as in torch, the ecosystem's schedulers, exact state_dict round trips and make_step's one guard:
each against the functional step or davda54's loop, 20 float64 steps."""

import copy
import functools
import io

import pytest
import torch
from test_torch_optim_bases import STEPS, TIGHT, batches, manual, mlp, params_of, pure, run
from torch import nn

import gamfunc
from gamfunc.torch_optim import GAM, SAM, FlatnessOptimizer
from gamfunc.wrappers.accumulate import accumulate
from gamfunc.wrappers.precision import mixed

# ---- param groups -------------------------------------------------------------------------------


def test_torch_param_groups_each_move_with_their_own_lr_and_weight_decay():
    data = batches()
    groups = {"0.*": {"lr": 0.0}, "2.bias": {"weight_decay": 0.1}}
    want, _ = pure(gamfunc.gam(0.05, 0.2), gamfunc.param_groups(groups, gamfunc.sgd, lr=0.5), data)
    model = mlp()
    base = torch.optim.SGD(
        [
            {"params": model[0].parameters(), "lr": 0.0},
            {"params": [model[2].weight]},
            {"params": [model[2].bias], "weight_decay": 0.1},
        ],
        lr=0.5,
    )
    run(GAM(model, base, rho=0.05, alpha=0.2), data)
    torch.testing.assert_close(params_of(model), want, **TIGHT)


def test_gamfunc_param_groups_move_each_group_with_its_own_lr_when_the_first_is_zero():
    data = batches()
    make = lambda: gamfunc.param_groups({"0.*": {"lr": 0.0}}, gamfunc.sgd, lr=0.5)  # noqa: E731
    want, _ = pure(gamfunc.gam(0.05, 0.2), make(), data)
    model = mlp()
    start = copy.deepcopy(model)
    opt = GAM(model, make(), rho=0.05, alpha=0.2)
    assert [g["lr"] for g in opt.param_groups] == [0.0, 0.5]
    assert [len(g["params"]) for g in opt.param_groups] == [2, 2]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1.0)
    for b in data:
        opt.step(b)
        sched.step()
    torch.testing.assert_close(params_of(model), want, **TIGHT)
    assert torch.equal(model[0].weight, start[0].weight)
    assert not torch.equal(model[2].weight, start[2].weight)


def test_a_scheduler_drives_each_gamfunc_group_with_its_own_base_lr():
    data = batches()
    make = lambda: gamfunc.param_groups({"0.*": {"lr": 0.05}}, gamfunc.sgd, lr=0.5)  # noqa: E731
    model = mlp()
    opt = SAM(model, make(), rho=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1.0 / (1 + t))
    loss_fn, params, buffers = gamfunc.nn.functionalize(mlp())
    step = gamfunc.make_step(gamfunc.sam(0.05), make(), loss_fn)
    state = step.init(params, buffers)
    for t, b in enumerate(data):
        opt.step(b)
        sched.step()
        states = tuple(
            gamfunc.set_hyperparams(s, lr=lr / (1 + t))
            for s, lr in zip(state.opt.states, (0.05, 0.5), strict=True)
        )
        state = state._replace(opt=state.opt._replace(states=states))
        params, state, _ = step(params, state, b)
    torch.testing.assert_close(params_of(model), params, **TIGHT)


def test_add_param_group_to_a_torch_base_moves_the_new_parameters():
    data = batches()
    ref, model = mlp(), mlp()
    for m in (ref, model):
        m[0].requires_grad_(False)  # the body frozen at first, as when fine-tuning
    ref_base = torch.optim.SGD(ref[2].parameters(), lr=0.1, momentum=0.9)
    opt = SAM(model, torch.optim.SGD(model[2].parameters(), lr=0.1, momentum=0.9), rho=0.05)
    body = copy.deepcopy(model[0])
    manual(ref, gamfunc.sam(0.05), ref_base, data[:10])
    run(opt, data[:10])
    for m, o in ((ref, ref_base), (model, opt)):
        m[0].requires_grad_(True)
        o.add_param_group({"params": list(m[0].parameters()), "lr": 0.05})
    manual(ref, gamfunc.sam(0.05), ref_base, data[10:])
    run(opt, data[10:])
    assert not torch.equal(model[0].weight, body.weight)
    torch.testing.assert_close(params_of(model), params_of(ref), **TIGHT)
    assert len(opt.param_groups) == 2


def test_add_param_group_with_a_gamfunc_base_says_how_to_give_groups():
    opt = SAM(mlp(), gamfunc.sgd(lr=0.1), rho=0.05)
    with pytest.raises(TypeError, match=r"gamfunc\.param_groups"):
        opt.add_param_group({"params": [torch.zeros(1, requires_grad=True)]})


# ---- every option of make_step, whatever the base optimiser ---------------------------------------

OPTIONS = {
    "every": ({"every": 3}, {"every": 3}, lambda f: f, lambda o: o),
    "adaptive": ({"adaptive": True}, {}, lambda f: f, lambda o: o),
    "accumulate": ({"accumulate": 2}, {}, lambda f: accumulate(f, 2), lambda o: o),
    "bf16": ({"precision": "bf16"}, {}, lambda f: mixed(f, "bf16"), lambda o: o),
    "fp16": ({"precision": "fp16"}, {}, lambda f: mixed(f, "fp16"), lambda o: o),
    "max_grad_norm": (
        {"max_grad_norm": 0.05},
        {},
        lambda f: f,
        lambda o: gamfunc.chain(gamfunc.clip_by_global_norm(0.05), o),
    ),
}


ESTIMATORS = {
    "gam": lambda adaptive: gamfunc.gam(0.05, 0.2, adaptive=adaptive),
    "gam-fd": lambda adaptive: gamfunc.gam(0.05, 0.2, hvp="fd", adaptive=adaptive),
    "gam_accelerated": lambda adaptive: gamfunc.gam_accelerated(
        0.05, 0.02, 0.6, 0.5, 0.03, adaptive=adaptive
    ),
    "sam": lambda adaptive: gamfunc.sam(0.05),
}


@pytest.mark.parametrize("base", ["torch", "gamfunc"])
@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("estimator", list(ESTIMATORS))
def test_each_option_equals_the_functional_step(estimator, option, base):
    facade_options, step_options, wrap, chained = OPTIONS[option]
    if option == "adaptive" and estimator == "sam":
        pytest.skip("sam has no adaptive form (gamfunc.asam is the adaptive ascent)")
    options = {k: v for k, v in facade_options.items() if k != "adaptive"}
    make = functools.partial(ESTIMATORS[estimator], facade_options.get("adaptive", False))
    data = batches()
    want, state = pure(
        make(), chained(gamfunc.sgd(lr=0.1, momentum=0.9)), data, wrap=wrap, **step_options
    )
    model = mlp()
    opt = (
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        if base == "torch"
        else gamfunc.sgd(lr=0.1, momentum=0.9)
    )
    facade = FlatnessOptimizer(model, make(), opt, **options)
    run(facade, data)
    torch.testing.assert_close(params_of(model), want, **TIGHT)
    assert int(facade.state_dict()["state"]["step"]) == int(state.step)
    if option == "fp16":
        assert "loss_scale" in facade.metrics


@pytest.mark.slow
@pytest.mark.parametrize("base", ["torch", "gamfunc"])
def test_compiled_equals_the_functional_step(base):
    data = batches()
    want, _ = pure(gamfunc.sam(0.05), gamfunc.sgd(lr=0.1, momentum=0.9), data, every=2)
    model = mlp()
    opt = (
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        if base == "torch"
        else gamfunc.sgd(lr=0.1, momentum=0.9)
    )
    torch._dynamo.reset()
    # the facade's compiled branches, captured and replayed (inductor's lowering is test_contract's)
    options = {"backend": "aot_eager"}
    run(SAM(model, opt, rho=0.05, every=2, compile=True, compile_options=options), data)
    torch.testing.assert_close(params_of(model), want, **TIGHT)


# ---- schedulers ---------------------------------------------------------------------------------

SCHEDULERS = {
    "StepLR": lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5),
    "LambdaLR": lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda t: 1 / (1 + t)),
    "CosineAnnealingLR": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=STEPS),
    "OneCycleLR": lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.3, total_steps=STEPS),
    "CyclicLR": lambda o: torch.optim.lr_scheduler.CyclicLR(o, 0.01, 0.2, step_size_up=4),
    "LinearLR+ExponentialLR": lambda o: torch.optim.lr_scheduler.SequentialLR(
        o,
        [
            torch.optim.lr_scheduler.LinearLR(o, 0.1, total_iters=5),
            torch.optim.lr_scheduler.ExponentialLR(o, 0.9),
        ],
        milestones=[5],
    ),
    "ReduceLROnPlateau": lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(
        o, factor=0.5, patience=0, threshold=0.5
    ),
}


def _schedule_step(sched, loss):
    if isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
        sched.step(float(loss))
    else:
        sched.step()


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_every_scheduler_takes_effect_on_the_next_step(name):
    """Against davda54's loop with the same scheduler on the plain torch optimiser: the lr (and
    OneCycleLR's momentum) a scheduler sets is the one the next step uses."""
    data = batches()
    ref = mlp()
    ref_base = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    ref_sched = SCHEDULERS[name](ref_base)
    loss_fn, _, buffers = gamfunc.nn.functionalize(ref)
    model = mlp()
    opt = SAM(model, torch.optim.SGD, lr=0.1, momentum=0.9, rho=0.05)
    sched = SCHEDULERS[name](opt)
    for b in data:
        used = ref_base.param_groups[0]["lr"]
        loss = loss_fn(params_of(ref), b, buffers)[0]
        manual(ref, gamfunc.sam(0.05), ref_base, [b])
        _schedule_step(ref_sched, loss)
        got = opt.step(b)
        assert float(opt.metrics["lr"]) == used
        _schedule_step(sched, got)
    torch.testing.assert_close(params_of(model), params_of(ref), **TIGHT)
    assert len({round(ref_base.param_groups[0]["lr"], 12), 0.1}) == 2  # the lr did move


def test_reduce_lr_on_plateau_reaches_a_gamfunc_base_on_the_next_step():
    data = batches()
    opt = SAM(mlp(), gamfunc.sgd(lr=0.1), rho=0.05)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0, threshold=0.5)
    for b in data:
        lr = opt.param_groups[0]["lr"]
        loss = opt.step(b)
        assert float(opt.metrics["lr"]) == lr
        sched.step(float(loss))
    assert opt.param_groups[0]["lr"] < 0.1


def test_one_cycle_lr_cycles_the_momentum_of_a_torch_base():
    model = mlp()
    opt = SAM(model, torch.optim.SGD, lr=0.1, momentum=0.9, rho=0.05)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.3, total_steps=STEPS)
    momenta = []
    for b in batches(5):
        opt.step(b)
        sched.step()
        momenta.append(opt.param_groups[0]["momentum"])
    assert len(set(momenta)) == 5


@pytest.mark.parametrize("base", ["torch-adamw", "gamfunc-adamw"])
def test_state_dict_round_trips_exactly_with_the_base_optimiser_state(base):
    data = batches()

    def make(model):
        opt = (
            torch.optim.AdamW(model.parameters(), lr=1e-2)
            if base.startswith("torch")
            else gamfunc.adamw(lr=1e-2)
        )
        return GAM(model, opt, rho=0.05, alpha=0.2, every=3)

    straight = mlp()
    run(make(straight), data)
    model = mlp()
    opt = make(model)
    run(opt, data[:7])
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    model = mlp()
    model.load_state_dict(saved["model"])
    opt = make(model)
    opt.load_state_dict(saved["opt"])
    again = opt.state_dict()
    torch.testing.assert_close(again["state"], saved["opt"]["state"], rtol=0, atol=0)
    if base.startswith("torch"):
        torch.testing.assert_close(again["base"], saved["opt"]["base"], rtol=0, atol=0)
    run(opt, data[7:])
    torch.testing.assert_close(params_of(model), params_of(straight), rtol=0, atol=0)


# ---- the one guard ------------------------------------------------------------------------------


class Unused(nn.Module):
    """An MLP with a parameter the loss never reaches: its direction is 0."""

    def __init__(self):
        super().__init__()
        self.net = mlp()
        self.spare = nn.Parameter(torch.ones(3, dtype=torch.float64))

    def forward(self, x):
        return self.net(x)


def test_adam_with_eps_zero_and_an_unused_parameter_is_skipped_and_counted():
    model = Unused()
    before = copy.deepcopy(model.state_dict())
    opt = GAM(model, torch.optim.Adam(model.parameters(), lr=1e-2, eps=0.0), rho=0.05, alpha=0.2)
    opt.step(batches(1)[0])
    assert int(opt.metrics["skipped"]) == 1
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert opt.state_dict()["base"]["state"] == {}  # no moment formed by the skipped step
    assert int(opt.state_dict()["state"]["skipped"]) == 1


@pytest.mark.parametrize("base", ["torch", "gamfunc"])
def test_a_nan_tensor_group_lr_is_skipped_and_counted(base):
    """A tensor lr is not read on the host: a NaN one reaches make_step's guard."""
    model = mlp()
    opt = (
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        if base == "torch"
        else gamfunc.sgd(lr=0.1, momentum=0.9)
    )
    opt = SAM(model, opt, rho=0.05)
    data = batches(3)
    opt.step(data[0])
    after_one = copy.deepcopy(model.state_dict())
    opt.param_groups[0]["lr"] = torch.tensor(float("nan"), dtype=torch.float64)
    opt.step(data[1])
    assert int(opt.metrics["skipped"]) == 1
    assert all(torch.equal(v, after_one[k]) for k, v in model.state_dict().items())
    opt.param_groups[0]["lr"] = 0.1
    opt.step(data[2])
    assert int(opt.metrics["skipped"]) == 0
    assert int(opt.state_dict()["state"]["skipped"]) == 1
    assert int(opt.state_dict()["state"]["step"]) == 2


def test_facade_options_reach_flatness_optimizer_too():
    model = mlp()
    opt = FlatnessOptimizer(
        model, gamfunc.sam(0.05), torch.optim.SGD, lr=0.1, every=2, max_grad_norm=1.0
    )
    run(opt, batches(2))
    assert int(opt.state_dict()["state"]["step"]) == 2


def test_a_closure_steps_as_the_batch_with_a_torch_base():
    data = batches()
    a, b = mlp(), mlp()
    opt_a = GAM(a, torch.optim.SGD, lr=0.1, momentum=0.9, rho=0.05, alpha=0.2)
    opt_b = GAM(b, torch.optim.SGD, lr=0.1, momentum=0.9, rho=0.05, alpha=0.2)
    for x, y in data:
        opt_a.step((x, y))
        opt_b.step(lambda x=x, y=y: nn.functional.cross_entropy(b(x), y))
    torch.testing.assert_close(params_of(b), params_of(a), **TIGHT)


def test_gam_adaptive_is_the_estimator_s_option():
    data = batches()
    want, _ = pure(gamfunc.gam(0.05, 0.2, adaptive=True), gamfunc.sgd(lr=0.1), data)
    model = mlp()
    run(GAM(model, torch.optim.SGD, lr=0.1, rho=0.05, alpha=0.2, adaptive=True), data)
    torch.testing.assert_close(params_of(model), want, **TIGHT)


def test_gamfunc_param_groups_show_each_groups_own_hyperparameters():
    """The facade's param_groups come from the names gamfunc.param_groups records: each group
    holds its own parameters and its own injected values (weight decay 0 on biases, the default
    elsewhere), and a value set in a group reaches that group's updates alone."""
    model = mlp()
    groups = gamfunc.param_groups(
        {"*.bias": {"weight_decay": 0.0}, "2.*": {"lr": 0.01}},
        gamfunc.adamw,
        lr=1e-3,
        weight_decay=0.5,
    )
    opt = SAM(model, groups, rho=0.05)
    names = {id(p): k for k, p in model.named_parameters()}
    seen = [
        ([names[id(p)] for p in g["params"]], round(g["lr"], 6), g["weight_decay"])
        for g in opt.param_groups
    ]
    assert seen == [
        (["0.weight"], 0.001, 0.5),
        (["0.bias"], 0.001, 0.0),
        (["2.weight"], 0.01, 0.5),
        (["2.bias"], 0.01, 0.0),
    ]
    opt.param_groups[2]["weight_decay"] = 0.25
    opt.step(batches()[0])
    injected = gamfunc.optim.lr_groups(opt._state.opt, list(names.values()))
    decay = [s.hyperparams.get("weight_decay") for _, s in injected]
    assert [None if d is None else round(float(d), 6) for d in decay] == [0.5, None, 0.25, None]
    # a group built without weight decay injects none: setting one there is refused, not ignored
    opt.param_groups[1]["weight_decay"] = 0.1
    with pytest.raises(RuntimeError, match=r"param_groups\[1\]\['weight_decay'\] was changed"):
        opt.step(batches()[0])


@pytest.mark.parametrize("hvp", ["exact", "fd"])
def test_autocast_around_the_step_is_precision_bf16_on_the_cpu(hvp):
    """torch.autocast around step((x, y)) covers every pass, backward ones included, as the
    facade's precision="bf16" does: the same steps bit for bit on the CPU (docs/migration.md),
    BatchNorm and exact H·v included."""

    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3))

    data = [(x.float(), y) for x, y in batches(3)]
    around, wrapped = model(), model()
    opts = [
        GAM(m, torch.optim.SGD, lr=0.1, rho=0.05, alpha=0.1, hvp=hvp, **kw)
        for m, kw in ((around, {}), (wrapped, {"precision": "bf16"}))
    ]
    for x, y in data:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            opts[0].step((x, y))
        opts[1].step((x, y))
    torch.testing.assert_close(around.state_dict(), wrapped.state_dict(), rtol=0, atol=0)
    assert not torch.equal(around[0].weight, model()[0].weight)


@pytest.mark.parametrize(
    ("key", "value"),
    [("momentum", 0.5), ("nesterov", True), ("dampening", 0.1), ("mommentum", 0.5)],
)
def test_a_group_value_a_gamfunc_base_does_not_read_is_refused_not_ignored(key, value):
    """sgd(momentum=0.9) fixes its momentum when built: a group that never showed ``momentum``
    (or any key a scheduler does not keep for itself) set by hand is refused at the next step,
    and the parameters stay where they were."""
    model = mlp()
    opt = SAM(model, gamfunc.sgd(0.1, momentum=0.9), rho=0.05)
    data = batches(2)
    opt.step(data[0])
    before = copy.deepcopy(model.state_dict())
    opt.param_groups[0][key] = value
    with pytest.raises(RuntimeError, match=rf"param_groups\[0\]\['{key}'\] was set"):
        opt.step(data[1])
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_a_scheduler_that_cycles_momentum_fails_at_once_on_a_gamfunc_base_and_its_keys_pass():
    """OneCycleLR(cycle_momentum=True) cycles a momentum the gamfunc base fixed when built: refused
    when it is made. Without cycling, the keys it keeps for itself (initial_lr, max_lr, min_lr) are
    free, and its lr reaches the step."""
    model = mlp()
    opt = SAM(model, gamfunc.sgd(0.1, momentum=0.9), rho=0.05)
    with pytest.raises(ValueError, match="momentum"):
        torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=4, cycle_momentum=True)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=0.1, total_steps=4, cycle_momentum=False
    )
    for b in batches(3):
        lr = opt.param_groups[0]["lr"]
        opt.step(b)
        assert float(opt.metrics["lr"]) == pytest.approx(lr, rel=1e-6)
        sched.step()
    assert {"initial_lr", "max_lr", "min_lr"} <= set(opt.param_groups[0])
