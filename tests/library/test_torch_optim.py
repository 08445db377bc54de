"""The torch.optim-style facade: equal to the pure make_step and to torch.optim, schedulers, BatchNorm,
closures, state_dict round trips, argument checks."""

import copy
import io

import pytest
import torch
import torch.nn.functional as F
from models import tiny_bn_mlp
from torch import nn

import gamfunc
from gamfunc import schedules
from gamfunc.torch_optim import GAM, SAM, FlatnessOptimizer
from gamfunc.training.state import as_dict

TIGHT = {"rtol": 1e-12, "atol": 1e-14}


def tanh_mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).double()


def batches(n, size=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(size, 4, generator=g, dtype=torch.float64),
            torch.randint(0, 3, (size,), generator=g),
        )
        for _ in range(n)
    ]


def lr_at(t):
    """The LambdaLR factor used below: a different lr at every step."""
    return 1.0 / (1.0 + 0.5 * t)


def pure_run(model, estimator, optimizer, data, base_lr, **options):
    """The reference: make_step on gamfunc.nn.functionalize, lr written into the state at every step."""
    loss_fn, params, buffers = gamfunc.nn.functionalize(model)
    step = gamfunc.make_step(estimator, optimizer, loss_fn, **options)
    state, losses = step.init(params, buffers), []
    for t, b in enumerate(data):
        lr = torch.tensor(base_lr * lr_at(t), dtype=torch.float64)
        state = state._replace(opt=gamfunc.set_hyperparams(state.opt, lr=lr))
        params, state, metrics = step(params, state, b)
        losses.append(metrics["loss"])
    return params, state, losses


def facade_run(opt, data):
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    losses = []
    for b in data:
        losses.append(opt.step(b))
        sched.step()
    return losses


def assert_module_equals(model, params, buffers=None):
    """The module's parameters (and buffers, when given) equal the dicts, to rounding."""
    torch.testing.assert_close(
        {k: p.detach() for k, p in model.named_parameters()}, params, **TIGHT
    )
    if buffers is not None:
        torch.testing.assert_close(dict(model.named_buffers()), buffers, **TIGHT)


CASES = {
    "sgd+gam": (lambda: gamfunc.gam(0.1, 0.5), lambda: gamfunc.sgd(lr=0.2, momentum=0.9), 0.2),
    "adamw+sam": (lambda: gamfunc.sam(0.1), lambda: gamfunc.adamw(lr=0.05, weight_decay=0.1), 0.05),
    "sgd+gam_accelerated": (
        lambda: gamfunc.gam_accelerated(0.2, 0.02, 0.6, 0.5, 0.03, convention="official"),
        lambda: gamfunc.sgd(lr=0.1, momentum=0.9, nesterov=True),
        0.1,
    ),
    "sgd+looksam": (
        lambda: gamfunc.looksam(0.1, 2, 0.7),
        lambda: gamfunc.sgd(lr=0.2, momentum=0.9),
        0.2,
    ),
    "adamw+friendly_sam": (
        lambda: gamfunc.friendly_sam(0.1, 1.0, 0.6),
        lambda: gamfunc.adamw(lr=0.05, weight_decay=0.1),
        0.05,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize(
    "model_fn", [tanh_mlp, lambda: tiny_bn_mlp(torch.float64)], ids=["mlp", "bn"]
)
def test_equals_pure_make_step_with_an_lr_scheduler(case, model_fn):
    est, opt, base_lr = CASES[case]
    data = batches(5)
    model = model_fn()
    ref_params, ref_state, ref_losses = pure_run(copy.deepcopy(model), est(), opt(), data, base_lr)
    facade = FlatnessOptimizer(model, est(), opt())
    losses = facade_run(facade, data)
    assert_module_equals(model, ref_params, ref_state.buffers)
    torch.testing.assert_close(torch.stack(losses), torch.stack(ref_losses), **TIGHT)
    plain = as_dict(ref_state._replace(buffers=()))  # the buffers live in the module
    torch.testing.assert_close(facade.state_dict()["state"], plain, **TIGHT)
    # The lr used at the last step is the scheduler's, not the optimiser's initial one.
    assert float(facade.metrics["lr"]) == pytest.approx(base_lr * lr_at(len(data) - 1), rel=1e-15)


def test_every_kth_step_and_its_state_round_trip_equal_the_pure_step():
    data = batches(5)
    est, opt = (lambda: gamfunc.sam(0.1)), (lambda: gamfunc.sgd(lr=0.1, momentum=0.9))

    def make(model):
        facade = FlatnessOptimizer(model, est(), opt(), every=2)
        return facade, torch.optim.lr_scheduler.LambdaLR(facade, lr_at)

    model = tiny_bn_mlp(torch.float64)
    ref_params, ref_state, _ = pure_run(copy.deepcopy(model), est(), opt(), data, 0.1, every=2)
    facade, sched = make(model)
    for i, b in enumerate(data):
        if i == 3:  # mid-cycle: step 3 is a plain one; a lost cycle counter would run SAM
            ckpt = copy.deepcopy((model.state_dict(), facade.state_dict(), sched.state_dict()))
        facade.step(b)
        sched.step()
    assert_module_equals(model, ref_params, ref_state.buffers)

    resumed = tiny_bn_mlp(torch.float64)
    facade2, sched2 = make(resumed)
    resumed.load_state_dict(ckpt[0])
    facade2.load_state_dict(ckpt[1])
    sched2.load_state_dict(ckpt[2])
    for b in data[3:]:
        facade2.step(b)
        sched2.step()
    assert_module_equals(resumed, ref_params, ref_state.buffers)


def test_batchnorm_running_stats_are_those_of_the_pure_step():
    model = tiny_bn_mlp(torch.float64)
    before = {k: b.clone() for k, b in model.named_buffers()}
    data = batches(3)
    _, ref_state, _ = pure_run(
        copy.deepcopy(model), gamfunc.gam(0.1, 0.5), gamfunc.sgd(lr=0.1), data, 0.1
    )
    facade_run(FlatnessOptimizer(model, gamfunc.gam(0.1, 0.5), gamfunc.sgd(lr=0.1)), data)
    for k, b in model.named_buffers():
        torch.testing.assert_close(b, ref_state.buffers[k], **TIGHT)
    # Once per step, from the clean pass: three steps, three updates of the counter.
    assert int(model[1].num_batches_tracked) == 3
    assert not torch.equal(model[1].running_mean, before["1.running_mean"])


def test_a_buffer_the_module_replaces_after_the_optimiser_is_built_is_the_one_stepped():
    model = tiny_bn_mlp(torch.float64)
    opt = FlatnessOptimizer(model, gamfunc.sam(0.05), gamfunc.sgd(lr=0.1))
    model[1].running_mean = torch.full_like(model[1].running_mean, 3.0)  # a new tensor object
    replaced = model[1].running_mean
    batch = batches(1)[0]
    with torch.no_grad():
        hidden = model[0](batch[0])
    opt.step(batch)
    assert model[1].running_mean is replaced
    torch.testing.assert_close(replaced, 0.9 * 3.0 + 0.1 * hidden.mean(0), **TIGHT)


def test_eval_mode_module_keeps_its_running_stats():
    model = tiny_bn_mlp(torch.float64).eval()
    before = {k: b.clone() for k, b in model.named_buffers()}
    FlatnessOptimizer(model, gamfunc.sam(0.05), gamfunc.sgd(lr=0.1)).step(batches(1)[0])
    assert all(torch.equal(b, before[k]) for k, b in model.named_buffers())
    assert not model.training


@pytest.mark.parametrize(
    "make",
    [
        (
            lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3),
            lambda: gamfunc.sgd(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3),
            lambda: tiny_bn_mlp(torch.float64),
        ),
        # No BatchNorm here: the bias before a BatchNorm has a gradient of pure rounding noise, which
        # Adam's m/(√v + ε) blows up to ~1e-11, so two correct autodiffs would differ there.
        (
            lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.05),
            lambda: gamfunc.adamw(lr=0.01, weight_decay=0.05),
            tanh_mlp,
        ),
    ],
    ids=["sgd-bn", "adamw-mlp"],
)
def test_gradient_estimator_equals_torch_optim_on_the_same_module(make):
    torch_opt, gam_opt, model_fn = make
    model = model_fn()
    twin = copy.deepcopy(model)
    reference = torch_opt(twin.parameters())
    facade = FlatnessOptimizer(model, gamfunc.gradient(), gam_opt())
    scheds = [
        torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5) for o in (reference, facade)
    ]
    for x, y in batches(6):
        reference.zero_grad()
        F.cross_entropy(twin(x), y).backward()
        reference.step()
        facade.step((x, y))
        for s in scheds:
            s.step()
    assert facade.param_groups[0]["lr"] == reference.param_groups[0]["lr"]
    assert float(facade.metrics["lr"]) == reference.param_groups[0]["lr"] * 2  # halved after it
    assert_module_equals(model, dict(twin.named_parameters()), dict(twin.named_buffers()))


def test_state_dict_round_trip_continues_identically():
    def make(seed):
        torch.manual_seed(seed)
        model = nn.Sequential(
            nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 3)
        ).double()
        opt = GAM(model, gamfunc.sgd(lr=0.1, momentum=0.9), rho=0.1, alpha=0.5)
        return model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lr_at)

    data = batches(6)
    model, opt, sched = make(0)
    for b in data[:3]:
        opt.step(b)
        sched.step()
    buf = io.BytesIO()
    torch.save(
        {"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()}, buf
    )
    saved = opt.state_dict()
    assert int(saved["state"]["step"]) == 3 and "step" not in saved["state"]["opt"]
    trace, _ = saved["state"]["opt"]["inner"]["states"]
    assert set(trace["momentum_buffer"]) == {k for k, _ in model.named_parameters()}
    for b in data[3:]:
        opt.step(b)
        sched.step()

    model2, opt2, sched2 = make(
        1
    )  # other initial weights: everything must come from the checkpoint
    buf.seek(0)
    ckpt = torch.load(buf)
    model2.load_state_dict(ckpt["model"])
    opt2.load_state_dict(ckpt["opt"])
    sched2.load_state_dict(ckpt["sched"])
    for b in data[3:]:
        opt2.step(b)
        sched2.step()
    assert_module_equals(model2, dict(model.named_parameters()), dict(model.named_buffers()))
    s1, s2 = (o.state_dict()["state"] for o in (opt, opt2))
    assert torch.equal(s2["skipped"], s1["skipped"])
    assert torch.equal(s2["step"], s1["step"])
    mb, mb2 = (s["opt"]["inner"]["states"][0]["momentum_buffer"] for s in (s1, s2))
    assert all(torch.equal(mb[k], mb2[k]) for k in mb)
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]


@pytest.mark.parametrize("field", ["skipped", "step"])
def test_load_state_dict_refuses_a_count_that_is_no_integer(field):
    """state.skipped = tensor(1.5) loaded silently as 1; a float count is refused naming it, and
    the optimiser keeps its state."""
    model = tanh_mlp()
    opt = FlatnessOptimizer(model, gamfunc.gradient(), gamfunc.sgd(lr=0.1, momentum=0.9))
    opt.step(batches(1)[0])
    bad = copy.deepcopy(opt.state_dict())
    bad["state"][field] = torch.tensor(1.5)
    with pytest.raises(
        ValueError, match=rf"^state_dict state\.{field} is float32 \(1.5\), where the step keeps"
    ):
        opt.load_state_dict(bad)
    assert int(opt.state_dict()["state"]["step"]) == 1
    assert int(opt.state_dict()["state"]["skipped"]) == 0


def test_load_state_dict_rejects_a_mismatched_state():
    model = tanh_mlp()
    opt = FlatnessOptimizer(model, gamfunc.gradient(), gamfunc.sgd(lr=0.1, momentum=0.9))
    opt.step(batches(1)[0])
    good = opt.state_dict()
    other = FlatnessOptimizer(nn.Linear(4, 3).double(), gamfunc.gradient(), gamfunc.sgd(lr=0.1))
    with pytest.raises(ValueError, match="other parameters"):
        other.load_state_dict(good)
    adam = FlatnessOptimizer(model, gamfunc.gradient(), gamfunc.adamw(lr=0.1))
    with pytest.raises(
        ValueError, match=r"state\.opt\.hyperparams has keys \['lr'\]; expected \['lr', 'weight"
    ):
        adam.load_state_dict(good)
    bad = copy.deepcopy(good)
    bad["state"]["opt"]["inner"]["states"][0]["momentum_buffer"]["0.weight"] = torch.zeros(2)
    with pytest.raises(ValueError, match="shape"):
        opt.load_state_dict(bad)
    with pytest.raises(ValueError, match="'state' and 'param_groups'"):
        opt.load_state_dict({"state": {}})
    fresh = FlatnessOptimizer(tanh_mlp(), gamfunc.gradient(), gamfunc.sgd(lr=0.1, momentum=0.9))
    fresh.load_state_dict(
        FlatnessOptimizer(tanh_mlp(), gamfunc.gradient(), gamfunc.sgd(lr=0.3)).state_dict()
    )
    assert fresh.param_groups[0]["lr"] == 0.3 and fresh.state_dict()["state"] == {}


def test_closure_step_equals_batch_step():
    data = batches(3)
    model_a = tiny_bn_mlp(torch.float64)
    model_b = copy.deepcopy(model_a)
    a = GAM(model_a, gamfunc.sgd(lr=0.1, momentum=0.9), rho=0.1, alpha=0.5)
    b = GAM(model_b, gamfunc.sgd(lr=0.1, momentum=0.9), rho=0.1, alpha=0.5)
    for x, y in data:
        loss_a = a.step((x, y))
        loss_b = b.step(lambda x=x, y=y: F.cross_entropy(model_b(x), y))
        torch.testing.assert_close(loss_b, loss_a, **TIGHT)
    assert_module_equals(model_b, dict(model_a.named_parameters()), dict(model_a.named_buffers()))


def test_closure_that_calls_backward_gets_a_clear_error_where_the_estimator_needs_exact_hv():
    model = tanh_mlp()
    x, y = batches(1)[0]
    opt = GAM(model, gamfunc.sgd(lr=0.1), rho=0.05, alpha=0.1, hvp="exact")

    def closure():
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    with pytest.raises(ValueError, match=r"calls backward\(\).*hvp=gamfunc\.hvps\.fd\(\)"):
        opt.step(closure)


def test_trainer_closure_with_a_batch_is_called_once_and_the_batch_drives_the_step():
    data = batches(2)
    model_a = tanh_mlp()
    model_b = copy.deepcopy(model_a)
    a = SAM(model_a, gamfunc.sgd(lr=0.1), rho=0.05)
    b = SAM(model_b, gamfunc.sgd(lr=0.1), rho=0.05)
    calls = []

    def hook_closure():  # what a trainer such as Lightning passes: hooks, no loss
        calls.append(torch.is_grad_enabled())

    for batch in data:
        a.step(batch)
        b.step(hook_closure, batch=batch)
    assert calls == [True, True]
    assert_module_equals(model_b, dict(model_a.named_parameters()))


def test_behaves_like_a_torch_optimizer():
    model = tanh_mlp()
    opt = FlatnessOptimizer(model, gamfunc.gradient(), gamfunc.sgd(lr=0.1))
    assert isinstance(opt, torch.optim.Optimizer)
    assert opt.param_groups[0]["params"] == list(model.parameters())
    F.cross_entropy(model(batches(1)[0][0]), batches(1)[0][1]).backward()
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    weight = model[0].weight
    opt.step(batches(1)[0])
    assert model[0].weight is weight  # updated in place: references held elsewhere stay valid
    assert "gradient" in repr(opt) and "lr=0.1" in repr(opt)


def test_frozen_parameters_are_left_alone():
    model = tanh_mlp()
    model[0].weight.requires_grad_(False)
    frozen = model[0].weight.clone()
    opt = FlatnessOptimizer(model, gamfunc.gam(0.05, 0.1), gamfunc.sgd(lr=0.5))
    bias = model[0].bias.clone()
    opt.step(batches(1)[0])
    assert torch.equal(model[0].weight, frozen)
    assert not torch.equal(model[0].bias, bias)
    assert len(opt.param_groups[0]["params"]) == 3


def test_gamfunc_lr_schedule_reports_its_lr_and_refuses_a_torch_scheduler():
    model = tanh_mlp()
    lr = schedules.cosine(0.1, total_steps=4)
    opt = FlatnessOptimizer(model, gamfunc.gradient(), gamfunc.sgd(lr=lr))
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)
    data = batches(3)
    opt.step(data[0])
    opt.step(data[1])
    assert opt.param_groups[0]["lr"] == pytest.approx(float(lr(torch.tensor(1))), rel=1e-15)
    opt.param_groups[0]["lr"] = 0.5
    with pytest.raises(RuntimeError, match="schedule"):
        opt.step(data[2])


def test_a_scheduled_lr_through_a_chain_is_reported_as_the_lr_of_the_step_taken():
    """The facade reads the lr used from the state (no probe update): param_groups' lr and
    metrics["lr"] are the schedule's value at the step just taken, through a chain too."""
    model = tanh_mlp()
    lr = schedules.cosine(0.1, total_steps=6, warmup_steps=3)
    chained = gamfunc.chain(gamfunc.clip_by_global_norm(1.0), gamfunc.sgd(lr=lr))
    opt = FlatnessOptimizer(model, gamfunc.sam(0.05), chained)
    assert opt.param_groups[0]["lr"] == float(lr(torch.tensor(0)))
    for t, b in enumerate(batches(4)):
        opt.step(b)
        assert opt.param_groups[0]["lr"] == float(opt.metrics["lr"]) == float(lr(torch.tensor(t)))
    opt.param_groups[0]["lr"] = 0.5
    with pytest.raises(RuntimeError, match="schedule"):
        opt.step(batches(1)[0])


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"model": "net"}, TypeError, "model must be a torch.nn.Module"),
        ({"optimizer": "sgd"}, TypeError, "torch.optim.Optimizer .*or a gamfunc optimizer"),
        ({"estimator": torch.optim.SGD}, TypeError, "estimator must be a gamfunc estimator"),
        ({"criterion": "ce"}, TypeError, "criterion must be callable"),
        ({"compile": "yes"}, ValueError, "compile must be False, True"),
        ({"compile_options": {"fullgraph": True}}, ValueError, "compile=False"),
        ({"every": 0}, ValueError, "every must be"),
        ({"on_nonfinite": "nan"}, ValueError, "on_nonfinite"),
        ({"model": nn.Linear(2, 2).requires_grad_(False)}, ValueError, "no parameter"),
    ],
)
def test_invalid_arguments_raise_clear_errors(kwargs, error, match):
    args = {"model": tanh_mlp(), "estimator": gamfunc.gradient(), "optimizer": gamfunc.sgd(lr=0.1)}
    with pytest.raises(error, match=match):
        FlatnessOptimizer(**(args | kwargs))


def test_invalid_step_calls_and_hyperparameters_raise():
    model = tanh_mlp()
    opt = FlatnessOptimizer(model, gamfunc.gradient(), gamfunc.sgd(lr=0.1))
    with pytest.raises(
        TypeError, match=r"step\(\) was called without an argument.*step\(\(inputs"
    ) as e:
        opt.step()
    assert "GradScaler" not in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"pair \(inputs, targets\)"):
        opt.step(batch=torch.randn(3, 4))
    with pytest.raises(TypeError, match="add_param_group"):
        opt.add_param_group({"params": [torch.zeros(1, requires_grad=True)]})
    with pytest.raises(ValueError, match="rho"):
        GAM(model, gamfunc.sgd(lr=0.1), rho=-1.0, alpha=0.1)
    with pytest.raises(TypeError, match="closure must return the loss"):
        opt.step(lambda: 1.0)


@pytest.mark.slow
@pytest.mark.parametrize("compile", [True, "step"])
def test_compiled_facade_equals_eager_without_recompiling_as_lr_changes(compile):
    data = batches(4)
    model_a = tanh_mlp()
    model_b = copy.deepcopy(model_a)
    eager = SAM(model_a, gamfunc.sgd(lr=0.2, momentum=0.9), rho=0.1)
    compiled = SAM(
        model_b,
        gamfunc.sgd(lr=0.2, momentum=0.9),
        rho=0.1,
        compile=compile,
        # Dynamo decides what recompiles; aot_eager runs its graphs without inductor's C++ build
        compile_options={"fullgraph": True, "backend": "aot_eager"},
    )
    facade_run(eager, data)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        facade_run(compiled, data)
    for (k, p), q in zip(model_a.named_parameters(), model_b.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-10, atol=1e-12, msg=k)


# ---- any torch.optim optimiser as the base (davda54/sam's form) -------------------------------------


class SignSGD(torch.optim.Optimizer):
    """An optimiser from outside torch and gamfunc, built on torch.optim.Optimizer: p ← p − lr·sign(g)."""

    def __init__(self, params, lr=1e-2):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(torch.sign(p.grad), alpha=-group["lr"])


@pytest.mark.parametrize("model_fn", [tanh_mlp, lambda: tiny_bn_mlp().double()], ids=["mlp", "bn"])
def test_a_torch_sgd_base_equals_the_pure_sam_step_with_a_scheduler(model_fn):
    """SAM(model, base_optimizer=torch.optim.SGD(...)) steps as make_step(sam, gamfunc.sgd) does,
    with a LambdaLR moving the base's lr at every step, BatchNorm buffers included."""
    data = batches(8)
    want, state, losses = pure_run(
        model_fn(), gamfunc.sam(0.05), gamfunc.sgd(lr=0.1, momentum=0.9), data, 0.1
    )
    model = model_fn()
    base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = SAM(model, base_optimizer=base, rho=0.05)
    got = facade_run(opt, data)
    assert_module_equals(model, want, state.buffers)
    torch.testing.assert_close(torch.stack(got), torch.stack(losses), **TIGHT)
    assert base.param_groups[0]["lr"] == pytest.approx(0.1 * lr_at(8))


def test_gam_with_adam_and_a_third_party_optimiser_as_the_base():
    """GAM's direction through torch.optim.Adam equals the pure step with gamfunc.adam; a plain
    torch.optim.Optimizer subclass takes the same direction into its own step."""
    data = batches(6)
    want, _, _ = pure_run(tanh_mlp(), gamfunc.gam(0.05, 0.2), gamfunc.adam(lr=1e-2), data, 1e-2)
    model = tanh_mlp()
    opt = GAM(
        model, base_optimizer=torch.optim.Adam(model.parameters(), lr=1e-2), rho=0.05, alpha=0.2
    )
    facade_run(opt, data)
    assert_module_equals(model, want)
    model = tanh_mlp()
    start = {k: p.detach().clone() for k, p in model.named_parameters()}
    opt = GAM(model, base_optimizer=SignSGD(model.parameters(), lr=1e-2), rho=0.05, alpha=0.2)
    opt.step(data[0])
    direction, _ = gamfunc.gam(0.05, 0.2)(start, data[0], _loss_of(tanh_mlp()))
    for k, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), start[k] - 1e-2 * torch.sign(direction[k]), **TIGHT)


def _loss_of(model):
    loss_fn, _, buffers = gamfunc.nn.functionalize(model)
    return lambda p, b: loss_fn(p, b, buffers)


def test_a_torch_base_saves_and_loads_with_its_state_dict():
    data = batches(8)
    model = tanh_mlp()
    opt = GAM(
        model, base_optimizer=torch.optim.Adam(model.parameters(), lr=1e-2), rho=0.05, alpha=0.2
    )
    for b in data:
        opt.step(b)
    straight = {k: p.detach().clone() for k, p in model.named_parameters()}

    model = tanh_mlp()
    opt = GAM(
        model, base_optimizer=torch.optim.Adam(model.parameters(), lr=1e-2), rho=0.05, alpha=0.2
    )
    for b in data[:4]:
        opt.step(b)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    model = tanh_mlp()
    model.load_state_dict(saved["model"])
    opt = GAM(
        model, base_optimizer=torch.optim.Adam(model.parameters(), lr=1e-2), rho=0.05, alpha=0.2
    )
    opt.load_state_dict(saved["opt"])
    for b in data[4:]:
        opt.step(b)
    assert_module_equals(model, straight)


def test_a_torch_base_skips_a_non_finite_step_and_refuses_foreign_parameters():
    model = tanh_mlp()
    opt = SAM(
        model, base_optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), rho=0.05
    )
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    x, y = batches(1)[0]
    opt.step((torch.full_like(x, float("nan")), y))
    assert int(opt.metrics["skipped"]) == 1
    assert all(torch.equal(p, before[k]) for k, p in model.named_parameters())
    assert opt.state_dict()["base"]["state"] == {}  # no momentum was formed
    other = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="not the model's parameters: build it on them"):
        SAM(model, base_optimizer=torch.optim.SGD(other.parameters(), lr=0.1), rho=0.05)


def test_a_torch_base_undoes_an_update_that_is_not_finite():
    """The guard of make_step: an lr of inf (a tensor, which the facade does not read on the host)
    makes the parameters non-finite; the step is skipped and the parameters stay."""
    model = tanh_mlp()
    inf = torch.tensor(float("inf"), dtype=torch.float64)
    opt = SAM(model, base_optimizer=torch.optim.SGD(model.parameters(), lr=inf), rho=0.05)
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    opt.step(batches(1)[0])
    assert int(opt.metrics["skipped"]) == 1 and int(opt.state_dict()["state"]["step"]) == 0
    assert all(torch.equal(p, before[k]) for k, p in model.named_parameters())


def test_compile_true_compiles_the_passes_and_step_the_whole_step():
    """compile=True and "pass" compile the estimator's passes (the loss becomes compiled passes,
    the step stays eager around them); "step" compiles the whole step, which needs a gamfunc base."""
    from gamfunc.wrappers.regional import CompiledPasses

    for compile in (True, "pass"):
        opt = SAM(tanh_mlp(), gamfunc.sgd(lr=0.1), rho=0.05, compile=compile)
        assert isinstance(opt._batch_step.loss_fn, CompiledPasses)
    whole = SAM(tanh_mlp(), gamfunc.sgd(lr=0.1), rho=0.05, compile="step")
    assert not isinstance(whole._batch_step.loss_fn, CompiledPasses)
    assert all(b is not None for b in whole._batch_step.branches)
    model = tanh_mlp()
    torch_base = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"compile='step'.*gamfunc base"):
        SAM(model, torch_base, rho=0.05, compile="step")
