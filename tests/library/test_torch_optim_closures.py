"""torch.optim's closure protocol in the facade: a closure that zeroes the gradients and calls
backward() drives every estimator built on gradients to the parameters of step((x, y)) (float64);
exact H·v with it is refused naming the fd backend; and the habits of a torch.optim loop that a
flatness step cannot follow are caught where they happen, each in one line."""

import copy
import warnings

import pytest
import torch
from test_torch_optim_bases import TIGHT, batches, mlp, params_of
from torch import nn

import gamfunc
from gamfunc.torch_optim import GAM, SAM, FlatnessOptimizer


def bn_mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 3)).double()


def torch_closure(opt, model, x, y, calls=None):
    """The closure of a torch.optim loop: zero_grad, forward, backward, return the loss."""

    def closure():
        if calls is not None:
            calls.append(1)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss

    return closure


def both(make_opt, make_model=mlp, steps=4):
    """The model after ``steps`` steps of step((x, y)) and of step(closure that calls backward)."""
    data = batches(steps)
    a, b = make_model(), make_model()
    opt_a, opt_b = make_opt(a), make_opt(b)
    for x, y in data:
        loss_a = opt_a.step((x, y))
        loss_b = opt_b.step(torch_closure(opt_b, b, x, y))
        torch.testing.assert_close(loss_b, loss_a, **TIGHT)
    return a, b


def assert_same_module(a, b):
    for (k, v), w in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        torch.testing.assert_close(w, v, **TIGHT, msg=k)


@pytest.mark.parametrize("base", ["torch", "gamfunc"])
@pytest.mark.parametrize("name", ["sam", "fd_gam"])
def test_a_torch_optim_closure_drives_sam_and_fd_gam_as_the_batch_does(name, base):
    def make(model):
        opt = (
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
            if base == "torch"
            else gamfunc.sgd(lr=0.1, momentum=0.9, weight_decay=1e-3)
        )
        if name == "sam":
            return SAM(model, opt, rho=0.05)
        return GAM(model, opt, rho=0.05, alpha=0.2, hvp=gamfunc.hvps.fd())

    a, b = both(make, bn_mlp)  # BatchNorm: its statistics from the pass at θ alone
    assert_same_module(a, b)


GRADIENT_ONLY = {
    "asam": lambda: gamfunc.asam(0.5),
    "gsam": lambda: gamfunc.gsam(0.05, 0.1),
    "wsam": lambda: gamfunc.wsam(0.05, 0.5),
    "wsam_decoupled": lambda: gamfunc.wsam(0.05, 0.5, decouple=True),
    "looksam": lambda: gamfunc.looksam(0.05, k=2, alpha=0.5),
    "friendly_sam": lambda: gamfunc.friendly_sam(0.05),
    "gam_accelerated": lambda: gamfunc.gam_accelerated(0.05, 0.05, 0.5, 0.5, 0.1),
    "gnp_fd": lambda: gamfunc.gnp(0.1),
    "sam_plus_fd_gam": lambda: gamfunc.gam(0.05, 0.2, hvp="fd", oracle=gamfunc.sam(0.05)),
}


@pytest.mark.parametrize("name", list(GRADIENT_ONLY))
def test_every_estimator_built_on_gradients_takes_the_closure(name):
    def make(model):
        return FlatnessOptimizer(model, GRADIENT_ONLY[name](), torch.optim.SGD, lr=0.1)

    a, b = both(make)
    assert_same_module(a, b)


def test_a_scheduler_drives_a_closure_step_as_a_batch_step():
    data = batches(4)
    a, b = mlp(), mlp()
    opts = [SAM(m, torch.optim.SGD, lr=0.1, momentum=0.9, rho=0.05) for m in (a, b)]
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, lambda t: 1.0 / (1.0 + t)) for o in opts]
    for x, y in data:
        opts[0].step((x, y))
        opts[1].step(torch_closure(opts[1], b, x, y))
        for sched in scheds:
            sched.step()
    assert opts[1].param_groups[0]["lr"] == pytest.approx(0.1 / 5)
    assert_same_module(a, b)


def test_the_closure_is_called_once_per_point_and_leaves_the_last_gradient():
    model = mlp()
    opt = GAM(model, torch.optim.SGD, lr=0.1, rho=0.05, alpha=0.2, hvp="fd")
    x, y = batches(1)[0]
    calls = []
    opt.step(torch_closure(opt, model, x, y, calls))
    assert len(calls) == 4  # fd GAM: ∇L at θ, θ + r·v, θ_adv and θ_adv + r·v
    assert all(p.grad is not None for p in model.parameters())


def test_a_closure_that_returns_the_loss_steps_as_one_that_calls_backward():
    data = batches(3)
    a, b = mlp(), mlp()
    opt_a = SAM(a, torch.optim.SGD, lr=0.1, momentum=0.9, rho=0.05)
    opt_b = SAM(b, torch.optim.SGD, lr=0.1, momentum=0.9, rho=0.05)
    for x, y in data:
        opt_a.step(torch_closure(opt_a, a, x, y))
        opt_b.step(lambda x=x, y=y: nn.functional.cross_entropy(b(x), y))
    torch.testing.assert_close(params_of(b), params_of(a), rtol=0, atol=0)


@pytest.mark.parametrize("hvp", ["exact", "reverse"])
def test_exact_hv_with_a_closure_that_calls_backward_is_refused_naming_fd(hvp):
    model = mlp()
    opt = GAM(model, torch.optim.SGD, lr=0.1, rho=0.05, alpha=0.2, hvp=hvp)
    x, y = batches(1)[0]
    before = copy.deepcopy(params_of(model))
    with pytest.raises(ValueError, match=r"hvp=gamfunc\.hvps\.fd\(\)") as e:
        opt.step(torch_closure(opt, model, x, y))
    assert "\n" not in str(e.value)
    assert all(torch.equal(p, before[k]) for k, p in params_of(model).items())


def test_gradients_filled_before_a_closure_step_are_refused_naming_the_backward_outside():
    """davda54/sam's loop: a forward-backward, then step(closure). The refusal names that
    backward(), not Lightning's accumulation (tests/library/test_torch_optim_lightning.py)."""
    model = mlp()
    opt = SAM(model, torch.optim.SGD, lr=0.1, rho=0.05)
    x, y = batches(1)[0]
    nn.functional.cross_entropy(model(x), y).backward()  # davda54/sam's first forward-backward
    with pytest.raises(ValueError, match=r"filled before the step by a backward\(\) outside") as e:
        opt.step(torch_closure(opt, model, x, y))
    assert "davda54/sam" in str(e.value) and "accumulate_grad_batches" not in str(e.value)
    opt.zero_grad()
    opt.step(torch_closure(opt, model, x, y))
    opt.step(torch_closure(opt, model, x, y))  # the step's own gradients are not "filled before"


# ---- old habits -----------------------------------------------------------------------------------


def test_a_gradient_clipped_by_hand_before_step_warns_once():
    model = mlp()
    opt = SAM(model, torch.optim.SGD, lr=0.1, rho=0.05)
    data = batches(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt.zero_grad()
        opt.step(data[0])  # no .grad at all
        nn.functional.cross_entropy(model(data[0][0]), data[0][1]).backward()
        opt.zero_grad(set_to_none=False)  # zeros in place: harmless
        opt.step(data[0])
    nn.functional.cross_entropy(model(data[1][0]), data[1][1]).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
    with pytest.warns(UserWarning, match=r"max_grad_norm=.*precision=") as record:
        opt.step(data[1])
    assert len(record) == 1 and "\n" not in str(record[0].message)
    for p in model.parameters():  # a manual scale, again: no second warning
        p.grad.mul_(0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt.step(data[2])


@pytest.mark.parametrize("base", ["torch", "gamfunc"])
@pytest.mark.parametrize("compile", [False, pytest.param("step", marks=pytest.mark.slow)])
def test_after_a_batch_step_grad_holds_the_direction_and_a_clip_of_it_warns(base, compile):
    """.grad after step((x, y)) is what the base optimiser moved by (the estimator's direction,
    clipped by max_grad_norm=), in tensors the next step writes again; clip_grad_norm_ of it
    before the next step is a write the habit check sees, where a .grad of None left it a no-op."""
    if compile == "step" and base == "torch":
        pytest.skip("compile='step' takes a gamfunc base optimiser")
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1) if base == "torch" else gamfunc.sgd(lr=0.1)
    opt = SAM(model, opt, rho=0.05, max_grad_norm=1e-3, compile=compile)
    data = batches(3)
    x, y = data[0]
    direction, _ = gamfunc.sam(0.05)(params_of(model), (x, y), loss_of(model))
    clip = gamfunc.clip_by_global_norm(1e-3)
    clipped, _ = clip.update(direction, clip.init(direction), params_of(model))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt.step((x, y))
        torch.testing.assert_close(
            {k: p.grad for k, p in model.named_parameters()}, clipped, **TIGHT
        )
        left = [p.grad for p in model.parameters()]
        opt.step(data[1])  # written into the same tensors, and not "set by hand"
        assert all(p.grad is g for p, g in zip(model.parameters(), left, strict=True))
        opt.zero_grad()  # frees them: the next step leaves new ones
        opt.step(data[1])
        assert all(
            p.grad is not None and p.grad is not g
            for p, g in zip(model.parameters(), left, strict=True)
        )
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-4)
    assert float(norm) > 0
    with pytest.warns(UserWarning, match=r"clip_grad_norm_.*max_grad_norm="):
        opt.step(data[2])


def loss_of(model):
    def loss_fn(params, batch):
        x, y = batch
        return nn.functional.cross_entropy(torch.func.functional_call(model, params, (x,)), y)

    return loss_fn


class HelperUnscale(torch.amp.GradScaler):
    """A GradScaler whose unscaling reads the param groups in a helper of its own, as FSDP's
    ShardedGradScaler, or a later torch, may: the refusal must not depend on who reads them."""

    def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16):
        grads = [p.grad for p in self._params(optimizer) if p.grad is not None]
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)
        return {found_inf.device: found_inf}

    @staticmethod
    def _params(optimizer):
        return [p for group in optimizer.param_groups for p in group["params"]]


def scaled_backward(scaler=torch.amp.GradScaler):
    """A SAM facade, and a GradScaler whose scaled loss has just been backpropagated into it."""
    model = mlp()
    opt = SAM(model, torch.optim.SGD, lr=0.1, rho=0.05)
    scaler = scaler("cpu")
    x, y = batches(1)[0]
    scaler.scale(nn.functional.cross_entropy(model(x), y)).backward()
    return model, opt, scaler


@pytest.mark.parametrize("scaler", [torch.amp.GradScaler, HelperUnscale])
def test_grad_scaler_is_refused_at_its_first_step_before_a_parameter_moves(scaler):
    """The AMP loop with clipping: unscale_ divides .grad (which the step does not read), and
    scaler.step is refused through the question it asks every optimiser first, whoever unscaled."""
    model, opt, scaler = scaled_backward(scaler)
    before = {k: v.clone() for k, v in params_of(model).items()}
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    with pytest.raises(TypeError, match=r"GradScaler.*precision='fp16'") as e:
        scaler.step(opt)
    assert "\n" not in str(e.value)
    assert all(torch.equal(before[k], v) for k, v in params_of(model).items())


def test_grad_scaler_step_is_refused_on_the_first_iteration_even_on_overflow():
    model, opt, scaler = scaled_backward()
    for p in model.parameters():  # an overflow: GradScaler would skip optimizer.step()
        p.grad.fill_(float("inf"))
    with pytest.raises(TypeError, match=r"GradScaler.*precision='fp16'") as e:
        scaler.step(opt)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["first_step", "second_step", "base_optimizer"])
def test_davda54_names_point_to_the_migration_guide(name):
    opt = SAM(mlp(), torch.optim.SGD, lr=0.1, rho=0.05)
    with pytest.raises(AttributeError, match=r"davda54/sam") as e:
        getattr(opt, name)
    assert "torch-optim.md" in str(e.value) and "\n" not in str(e.value)
    assert not hasattr(opt, name)


@pytest.mark.parametrize("adaptive", [False, True])
def test_sam_adaptive_points_to_asam(adaptive):
    """The message names the adaptive= given: True is ASAM, False is to be dropped."""
    with pytest.raises(TypeError, match=r"adaptive=.*gamfunc\.asam.*torch-optim\.md") as e:
        SAM(mlp(), torch.optim.SGD, rho=0.05, adaptive=adaptive, lr=0.1)
    message = str(e.value)
    assert "\n" not in message and f"SAM(..., adaptive={adaptive})" in message
    assert ("drop adaptive=False" in message) is (not adaptive)


def test_a_closure_with_accumulate_names_the_value_and_the_batch_form():
    model = mlp()
    opt = SAM(model, torch.optim.SGD, lr=0.1, rho=0.05, accumulate=2)
    x, y = batches(1)[0]
    with pytest.raises(ValueError, match=r"accumulate=2: .*one batch.*step\(\(inputs, targets\)\)"):
        opt.step(torch_closure(opt, model, x, y))


@pytest.mark.parametrize("base", ["torch", "gamfunc"])
@pytest.mark.parametrize("lr", [-1.0, float("nan"), float("inf")])
def test_a_scheduler_lr_below_zero_or_not_finite_is_refused_at_step(lr, base):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1) if base == "torch" else gamfunc.sgd(lr=0.1)
    opt = SAM(model, opt, rho=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1.0 if t == 0 else lr / 0.1)
    data = batches(2)
    opt.step(data[0])
    sched.step()
    before = copy.deepcopy(params_of(model))
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['lr'\] is .*lr must be") as e:
        opt.step(data[1])
    assert "\n" not in str(e.value)
    assert all(torch.equal(p, before[k]) for k, p in params_of(model).items())


def test_max_grad_norm_is_named():
    with pytest.raises(ValueError, match=r"^max_grad_norm must be a finite number > 0; got -1"):
        SAM(mlp(), torch.optim.SGD, lr=0.1, rho=0.05, max_grad_norm=-1)


# ---- groups and state_dict ------------------------------------------------------------------------


def test_the_class_form_takes_param_groups():
    """No weight decay on biases, neither an instance nor decay_mask: params= as torch.optim takes it."""
    data = batches(4)

    def groups(model):
        decay = [p for k, p in model.named_parameters() if k.endswith("weight")]
        rest = [p for k, p in model.named_parameters() if not k.endswith("weight")]
        return [{"params": decay}, {"params": rest, "weight_decay": 0.0}]

    a, b = mlp(), mlp()
    kwargs = {"lr": 1e-2, "weight_decay": 0.5}
    opt_a = GAM(a, torch.optim.AdamW(groups(a), **kwargs), rho=0.05, alpha=0.2)
    opt_b = GAM(b, torch.optim.AdamW, params=groups(b), **kwargs, rho=0.05, alpha=0.2)
    assert [g["weight_decay"] for g in opt_b.param_groups] == [0.5, 0.0]
    for x in data:
        opt_a.step(x)
        opt_b.step(x)
    torch.testing.assert_close(params_of(b), params_of(a), rtol=0, atol=0)
    with pytest.raises(TypeError, match=r"params=.*gamfunc\.param_groups"):
        GAM(mlp(), gamfunc.adamw, params=groups(a), lr=1e-3, rho=0.05, alpha=0.2)


def test_a_plain_torch_optim_state_dict_loads_into_the_facade():
    """A loop switched mid-run: SGD's momentum buffers and hyperparameters carry over, and the
    facade with the plain gradient goes on as the SGD loop does."""
    data = batches(4)
    model = mlp()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    for x, y in data[:2]:
        sgd.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        sgd.step()
    sgd.param_groups[0]["lr"] = 0.05  # as a scheduler left it
    twin = copy.deepcopy(model)
    saved = copy.deepcopy(sgd.state_dict())
    for x, y in data[2:]:
        sgd.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        sgd.step()
    opt = FlatnessOptimizer(twin, gamfunc.gradient(), torch.optim.SGD, lr=0.1, momentum=0.9)
    opt.load_state_dict(saved)
    assert opt.param_groups[0]["lr"] == 0.05 and opt.param_groups[0]["weight_decay"] == 1e-3
    for b in data[2:]:
        opt.step(b)
    torch.testing.assert_close(params_of(twin), params_of(model), **TIGHT)
    gamfunc_base = SAM(mlp(), gamfunc.sgd(lr=0.1), rho=0.05)
    with pytest.raises(ValueError, match=r"torch\.optim optimiser's"):
        gamfunc_base.load_state_dict(saved)


def test_gamfunc_param_groups_report_every_injected_value():
    """Each facade group holds every hyperparameter its injected state uses, with that value."""
    model = bn_mlp()
    groups = gamfunc.param_groups(
        {"*.bias": {"weight_decay": 0.0}, "1.*": {"lr": 0.01, "weight_decay": 0.0}},
        gamfunc.adamw,
        lr=1e-3,
        weight_decay=0.5,
        betas=(0.8, 0.9),
        eps=1e-6,
    )
    opt = SAM(model, groups, rho=0.05)
    opt.step(batches(1)[0])
    names = [k for k, p in model.named_parameters()]
    injected = gamfunc.optim.lr_groups(opt._state.opt, names)
    assert len(injected) == len(opt.param_groups)
    ids = {id(p): k for k, p in model.named_parameters()}
    checked = 0
    for group, (members, state) in zip(opt.param_groups, injected, strict=True):
        assert [ids[id(p)] for p in group["params"]] == list(members)
        for k, v in state.hyperparams.items():
            if v.ndim == 0:
                assert group[k] == pytest.approx(float(v), rel=1e-12), (members, k)
                checked += 1
        assert group["weight_decay"] == (0.0 if "weight_decay" not in state.hyperparams else 0.5)
    assert checked >= len(opt.param_groups)
