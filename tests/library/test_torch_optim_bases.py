"""The torch.optim facade over any base optimiser: the three ways to give it, torch's, gamfunc's and a
third party's, each equal to the functional step (or to the direction fed to the optimiser's own
step) over 20 float64 steps; and the one-line errors for the habits that cannot work."""

import copy

import pytest
import torch
from torch import nn

import gamfunc
from gamfunc.torch_optim import GAM, SAM, FlatnessOptimizer, TorchBase

TIGHT = {"rtol": 1e-10, "atol": 1e-12}
STEPS = 20


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).double()


def batches(n=STEPS, size=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(size, 4, generator=g, dtype=torch.float64),
            torch.randint(0, 3, (size,), generator=g),
        )
        for _ in range(n)
    ]


def pure(estimator, optimizer, data, model=None, wrap=lambda f: f, **options):
    """The reference: make_step with a gamfunc optimiser on gamfunc.nn.functionalize."""
    loss_fn, params, buffers = gamfunc.nn.functionalize(model or mlp())
    step = gamfunc.make_step(estimator, optimizer, wrap(loss_fn), **options)
    state = step.init(params, buffers)
    for b in data:
        params, state, _ = step(params, state, b)
    return params, state


def run(opt, data):
    for b in data:
        opt.step(b)


def params_of(model):
    return {k: p.detach() for k, p in model.named_parameters()}


ESTIMATORS = {
    "gam": (lambda: gamfunc.gam(0.05, 0.2), {"rho": 0.05, "alpha": 0.2}, GAM),
    "sam": (lambda: gamfunc.sam(0.05), {"rho": 0.05}, SAM),
}
BASES = {
    "sgd": (
        lambda: gamfunc.sgd(lr=0.1, momentum=0.9, weight_decay=1e-3),
        torch.optim.SGD,
        {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-3},
    ),
    "adamw": (
        lambda: gamfunc.adamw(lr=1e-2, weight_decay=0.1),
        torch.optim.AdamW,
        {"lr": 1e-2, "weight_decay": 0.1},
    ),
}


@pytest.mark.parametrize("form", ["positional", "keyword", "class"])
@pytest.mark.parametrize("base", list(BASES))
@pytest.mark.parametrize("est", list(ESTIMATORS))
def test_a_torch_base_in_each_form_equals_the_functional_step(form, base, est):
    make_est, hp, cls = ESTIMATORS[est]
    make_opt, torch_cls, kwargs = BASES[base]
    data = batches()
    want, _ = pure(make_est(), make_opt(), data)
    model = mlp()
    if form == "positional":
        opt = cls(model, torch_cls(model.parameters(), **kwargs), **hp)
    elif form == "keyword":
        opt = cls(model, base_optimizer=torch_cls(model.parameters(), **kwargs), **hp)
    else:
        opt = cls(model, torch_cls, **kwargs, **hp)
    run(opt, data)
    torch.testing.assert_close(params_of(model), want, **TIGHT)
    assert int(opt.state_dict()["state"]["step"]) == STEPS


@pytest.mark.parametrize("form", ["instance", "factory"])
def test_a_gamfunc_base_as_an_instance_or_a_factory_with_its_arguments(form):
    data = batches()
    want, _ = pure(gamfunc.gam(0.05, 0.2), gamfunc.sgd(lr=0.1, momentum=0.9), data)
    model = mlp()
    if form == "instance":
        opt = GAM(model, gamfunc.sgd(lr=0.1, momentum=0.9), rho=0.05, alpha=0.2)
    else:
        opt = GAM(model, gamfunc.sgd, lr=0.1, momentum=0.9, rho=0.05, alpha=0.2)
    run(opt, data)
    torch.testing.assert_close(params_of(model), want, **TIGHT)


def manual(model, estimator, base, data):
    """davda54's loop, the reference for an optimiser gamfunc has no twin of: the estimator's
    direction (the functional one) into each .grad, then the optimiser's own step()."""
    loss_fn, _, buffers = gamfunc.nn.functionalize(model)
    for b in data:
        every = params_of(model)
        params = {k: p.detach() for k, p in model.named_parameters() if p.requires_grad}
        direction, _ = estimator(
            params, b, lambda p, x, every=every: loss_fn(every | p, x, buffers)
        )
        for k, p in model.named_parameters():
            p.grad = direction[k].clone() if k in direction else None
        base.step()


@pytest.mark.parametrize("name", ["Lamb", "AdaBelief"])
def test_a_third_party_optimiser_steps_as_it_does_on_the_direction(name):
    po = pytest.importorskip("pytorch_optimizer")
    cls = getattr(po, name)
    data = batches()
    ref = mlp()
    manual(ref, gamfunc.gam(0.05, 0.2), cls(ref.parameters(), lr=1e-2), data)
    model = mlp()
    opt = GAM(model, cls, lr=1e-2, rho=0.05, alpha=0.2)
    run(opt, data)
    torch.testing.assert_close(params_of(model), params_of(ref), **TIGHT)
    assert opt.state_dict()["base"]["state"]  # its own state, formed by its own step


def test_torch_base_is_the_facade_over_a_torch_optimiser():
    data = batches(5)
    want, _ = pure(gamfunc.sam(0.05), gamfunc.sgd(lr=0.1), data)
    model = mlp()
    opt = TorchBase(model, gamfunc.sam(0.05), torch.optim.SGD(model.parameters(), lr=0.1))
    run(opt, data)
    torch.testing.assert_close(params_of(model), want, **TIGHT)
    # the step is FlatnessOptimizer's, make_step's (torch.optim registers it on each subclass)
    assert TorchBase.step.__qualname__ == "FlatnessOptimizer.step"


# ---- one-line errors ----------------------------------------------------------------------------


def _one_line(excinfo):
    assert "\n" not in str(excinfo.value)


def test_a_parameter_generator_where_the_model_is_needed():
    model = mlp()
    with pytest.raises(
        TypeError, match=r"model itself, not its parameters.*GAM\(model, \.\.\.\)"
    ) as e:
        GAM(model.parameters(), base_optimizer=torch.optim.SGD, lr=0.1, rho=0.05, alpha=0.1)
    _one_line(e)
    with pytest.raises(TypeError, match=r"model itself.*write SAM\(model, \.\.\.\)"):
        SAM(list(model.parameters()), gamfunc.sgd(lr=0.1), rho=0.05)
    with pytest.raises(TypeError, match=r"not FlatnessOptimizer\(model\.parameters\(\)"):
        FlatnessOptimizer(model.parameters(), gamfunc.sam(0.05), gamfunc.sgd(lr=0.1))


@pytest.mark.parametrize("facade", ["GAM", "SAM", "FlatnessOptimizer"])
def test_a_compiled_module_is_refused_naming_orig_mod_and_compile_true(facade):
    """torch.compile(model) runs eagerly under torch.func after a first compile: refused, before
    any compile, in one line that names the module inside and compile=True."""
    compiled = torch.compile(mlp())
    make = {
        "GAM": lambda m: GAM(m, torch.optim.SGD, lr=0.1, rho=0.05, alpha=0.1),
        "SAM": lambda m: SAM(m, torch.optim.SGD, lr=0.1, rho=0.05),
        "FlatnessOptimizer": lambda m: FlatnessOptimizer(m, gamfunc.sam(0.05), gamfunc.sgd(lr=0.1)),
    }[facade]
    with pytest.raises(TypeError, match=rf"{facade}\(model._orig_mod, \.\.\., compile=True\)") as e:
        make(compiled)
    _one_line(e)
    make(compiled._orig_mod).step(batches(1)[0])  # the module inside trains


def test_a_closure_that_calls_backward_with_precision_bf16():
    model = mlp()
    opt = SAM(model, torch.optim.SGD, lr=0.1, rho=0.05, precision="bf16")
    x, y = batches(1)[0]

    def closure():
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss

    with pytest.raises(RuntimeError, match=r"calls backward\(\).*precision='fp32'") as e:
        opt.step(closure)
    _one_line(e)


def test_a_base_optimiser_built_on_other_parameters():
    model = mlp()
    other = nn.Linear(2, 2)
    with pytest.raises(
        ValueError, match=r"not the model's parameters.*SGD\(model.parameters\(\)"
    ) as e:
        GAM(model, torch.optim.SGD(other.parameters(), lr=0.1), rho=0.05, alpha=0.1)
    _one_line(e)


def test_an_optimiser_whose_step_needs_a_closure_is_refused():
    model = mlp()
    with pytest.raises(TypeError, match=r"LBFGS.step needs a closure.*torch.optim.SGD") as e:
        GAM(model, torch.optim.LBFGS(model.parameters()), rho=0.05, alpha=0.1)
    _one_line(e)
    with pytest.raises(TypeError, match=r"LBFGS\.step needs a closure"):
        SAM(model, torch.optim.LBFGS, lr=1.0, rho=0.05)


def test_grad_scaler_is_answered_with_the_facade_s_own_fp16():
    model = mlp()
    opt = SAM(model, torch.optim.SGD, lr=0.1, rho=0.05)
    scaler = torch.amp.GradScaler("cpu")
    x, y = batches(1)[0]
    scaler.scale(nn.functional.cross_entropy(model(x), y)).backward()
    with pytest.raises(TypeError, match=r"GradScaler.*precision='fp16'") as e:
        scaler.step(opt)
    _one_line(e)


def test_base_options_given_with_an_optimiser_instance():
    model = mlp()
    with pytest.raises(TypeError, match=r"takes no lr=.*torch.optim.SGD, lr=0.1"):
        GAM(model, gamfunc.sgd(lr=0.1), lr=0.1, rho=0.05, alpha=0.1)
    with pytest.raises(TypeError, match="needs a base optimiser"):
        GAM(model, rho=0.05, alpha=0.1)
    with pytest.raises(TypeError, match="once"):
        FlatnessOptimizer(
            model,
            gamfunc.sam(0.05),
            gamfunc.sgd(),
            base_optimizer=torch.optim.SGD(model.parameters()),
        )
    with pytest.raises(ValueError, match="accumulate"):
        SAM(model, torch.optim.SGD, lr=0.1, rho=0.05, accumulate=0)
    with pytest.raises(ValueError, match="precision"):
        SAM(model, torch.optim.SGD, lr=0.1, rho=0.05, precision="fp8")
    with pytest.raises(ValueError, match=r"^max_grad_norm must be a finite number > 0"):
        SAM(model, torch.optim.SGD, lr=0.1, rho=0.05, max_grad_norm=-1.0)


def test_the_base_optimiser_is_left_as_it_was_between_steps():
    """The torch optimiser's parameters keep their identity and data between steps; copies
    of them take its step."""
    model = mlp()
    base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = SAM(model, base, rho=0.05)
    weight = model[0].weight
    ref = copy.deepcopy(model)
    opt.step(batches(1)[0])
    assert model[0].weight is weight and base.param_groups[0]["params"][0] is weight
    assert not torch.equal(model[0].weight, ref[0].weight)
    # .grad: the direction the base optimiser moved by, a tensor of the facade's (last_direction)
    assert all(p.grad is not None for p in model.parameters())


def test_each_parameter_keeps_its_storage_through_the_update():
    """The base optimiser moves its own parameters in place, and the facade's copy of the new
    parameters goes into them: each keeps its storage, shape and strides."""
    model = mlp()
    base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    before = {k: (p.data_ptr(), p.shape, p.stride()) for k, p in model.named_parameters()}
    run(SAM(model, base, rho=0.05), batches(3))
    after = {k: (p.data_ptr(), p.shape, p.stride()) for k, p in model.named_parameters()}
    assert after == before


def test_the_bridge_updates_from_its_snapshot_only():
    """The update runs on the values of the bridge's last snapshot: called without one, it says so
    rather than step from whatever the optimiser holds; with one, it gives the parameters as
    base.step() moved them (`Moved`, the model's own tensors, no difference formed) and leaves the
    snapshot's tensors as they were."""
    from gamfunc.optim.base import Moved
    from gamfunc.torch_optim.bridge import TorchBridge, TorchState

    model = mlp()
    base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    bridge = TorchBridge(base, {id(p): k for k, p in model.named_parameters()})
    params, tensors = bridge.snapshot()
    direction = {k: torch.ones_like(p) for k, p in params.items()}
    state = TorchState(torch.zeros((), dtype=torch.float64), tensors)
    seen = {k: v.clone() for k, v in params.items()}
    updates, _ = bridge.transform.update(direction, state, params)
    assert isinstance(updates, Moved)
    assert all(updates[k] is p for k, p in model.named_parameters())
    moved = gamfunc.apply_updates(params, updates)
    torch.testing.assert_close(moved["0.bias"], seen["0.bias"] - 0.1, rtol=0, atol=1e-15)
    for k, v in params.items():
        torch.testing.assert_close(v, seen[k], rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="snapshot"):
        bridge.transform.update(direction, state, params)


def test_the_state_copies_are_rewritten_in_place_and_a_skipped_step_still_restores_the_state():
    """Each snapshot writes the copies of the optimiser's state tensors into those of the last one
    (AdamW: no three new tensors per parameter at every step); a step skipped after that leaves the
    state bit for bit as it was, and a state tensor that changes shape gets a new copy."""
    model = mlp()
    base = torch.optim.AdamW(model.parameters(), lr=0.1)
    opt = SAM(model, base, rho=0.05)
    run(opt, batches(2))
    bridge = opt._bridge
    _, first = bridge.snapshot()
    _, second = bridge.snapshot()
    assert len(first) == len(second) == 3 * len(list(model.parameters()))
    assert all(a is b for a, b in zip(first, second, strict=True))
    before = {p: {k: v.clone() for k, v in s.items()} for p, s in base.state.items()}
    weights = {k: p.detach().clone() for k, p in model.named_parameters()}
    x, y = batches(1, seed=5)[0]
    opt.step((x * float("nan"), y))
    assert int(opt.metrics["skipped"]) == 1
    for p, s in base.state.items():
        assert all(torch.equal(v, before[p][k]) for k, v in s.items())
    assert all(torch.equal(p, weights[k]) for k, p in model.named_parameters())
    run(opt, batches(1, seed=6))  # and the next step moves on from there
    assert any(not torch.equal(p, weights[k]) for k, p in model.named_parameters())
    held = next(iter(base.state))
    base.state[held]["exp_avg"] = torch.zeros(held.numel(), dtype=held.dtype)  # another shape
    _, third = bridge.snapshot()
    assert any(a is not b for a, b in zip(second, third, strict=True))
    assert (held.numel(),) in [tuple(t.shape) for t in third]


class _Rebinding(torch.optim.Optimizer):
    """Plain gradient descent that puts a new tensor in each parameter's place and keeps that same
    tensor in its state (``p.data = state["last"]``), rather than moving ``p`` in place."""

    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                new = p - group["lr"] * p.grad
                self.state[p]["last"] = new
                p.data = new


def test_an_optimiser_that_puts_other_tensors_in_the_parameters_place():
    """The update is read from the tensors in the parameters' place after base.step(): here they
    are also the optimiser's state, which stays the new parameters."""
    data = batches(5)
    want, _ = pure(gamfunc.sam(0.05), gamfunc.sgd(lr=0.1), data)
    model = mlp()
    opt = SAM(model, _Rebinding, lr=0.1, rho=0.05)
    run(opt, data)
    torch.testing.assert_close(params_of(model), want, **TIGHT)
    for p in model.parameters():
        torch.testing.assert_close(opt.state[p]["last"], p.detach(), rtol=0, atol=0)


class _Counting(torch.optim.Optimizer):
    """Gradient descent with momentum whose state keeps a Python int besides its tensor, as some
    third-party optimisers keep their step count."""

    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    state["t"], state["buf"] = 0, torch.zeros_like(p)
                state["t"] += 1
                state["buf"].mul_(0.9).add_(p.grad)
                p.add_(state["buf"], alpha=-group["lr"])


def _base_state(opt):
    return copy.deepcopy(opt.state_dict()["base"]["state"])


def _same(a, b):
    assert a.keys() == b.keys()
    for i in a:
        assert a[i].keys() == b[i].keys()
        for k, v in a[i].items():
            assert torch.equal(v, b[i][k]) if isinstance(v, torch.Tensor) else v == b[i][k]


@pytest.mark.parametrize(
    "make",
    [
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        lambda p: torch.optim.Adam(p, lr=1e-2),
        lambda p: _Counting(p, lr=0.1),
    ],
    ids=["sgd", "adam", "int_state"],
)
def test_a_skipped_step_leaves_the_base_optimiser_s_state_as_it_was(make):
    """After two kept steps, a step whose batch is not finite moves neither the parameters nor any
    entry of the base optimiser's state (tensors moved in place by its step(), a Python int), and
    the next step continues from them as if the skipped one had not been."""
    data = batches(3)
    model, twin = mlp(), mlp()
    opt, ref = (
        SAM(model, make(model.parameters()), rho=0.05),
        SAM(twin, make(twin.parameters()), rho=0.05),
    )
    run(opt, data[:2])
    run(ref, data[:2])
    params, state = copy.deepcopy(params_of(model)), _base_state(opt)
    x, y = data[2]
    opt.step((torch.full_like(x, float("nan")), y))
    assert int(opt.metrics["skipped"]) == 1
    assert all(torch.equal(p, params[k]) for k, p in params_of(model).items())
    _same(_base_state(opt), state)
    opt.step(data[2])
    ref.step(data[2])
    torch.testing.assert_close(params_of(model), params_of(twin), rtol=0, atol=0)
    _same(_base_state(opt), _base_state(ref))


def test_a_step_that_raises_leaves_the_model_and_the_base_optimiser_as_they_were():
    """on_nonfinite="raise": the error comes after the base optimiser's step() moved its own
    tensors; the parameters and its state are put back."""
    data = batches(2)
    model = mlp()
    opt = SAM(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        rho=0.05,
        on_nonfinite="raise",
    )
    run(opt, data[:1])
    params, state = copy.deepcopy(params_of(model)), _base_state(opt)
    opt.param_groups[0]["lr"] = torch.tensor(float("inf"), dtype=torch.float64)  # not refused
    with pytest.raises(FloatingPointError):
        opt.step(data[1])
    assert all(torch.equal(p, params[k]) for k, p in params_of(model).items())
    _same(_base_state(opt), state)
    opt.param_groups[0]["lr"] = 0.1
    opt.step(data[1])
    assert int(opt.state_dict()["state"]["step"]) == 2


def test_a_kept_step_leaves_the_base_optimisers_result_bit_for_bit():
    """With the gradient as the direction, the facade over torch.optim.SGD is a torch.optim loop: a
    kept step leaves the parameters exactly as base.step() moved them (in float32, where forming
    θ + (θ_new − θ) after the step would round some of them differently)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 3))
    loop = copy.deepcopy(model)
    opt = FlatnessOptimizer(
        model, gamfunc.gradient(), torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9)
    )
    base = torch.optim.SGD(loop.parameters(), lr=0.3, momentum=0.9)
    for x, y in batches(6):
        x = x.float()
        opt.step((x, y))
        base.zero_grad()
        torch.nn.functional.cross_entropy(loop(x), y).backward()
        base.step()
        for (k, p), q in zip(model.named_parameters(), loop.parameters(), strict=True):
            assert torch.equal(p, q), k


def test_the_parameter_copies_are_rewritten_only_where_no_estimator_keeps_a_state():
    """Without an estimator state, each step's copies of the parameters are written into the last
    step's (no tensor to allocate per parameter); LookSAM keeps a state, so its copies are new
    tensors at every step. Both still equal a step from new copies."""
    for estimator, reused in (
        (gamfunc.sam(0.05), True),
        (gamfunc.looksam(0.05, k=2, alpha=0.7), False),
    ):
        model, fresh = mlp(), mlp()
        opt = FlatnessOptimizer(model, estimator, torch.optim.SGD(model.parameters(), lr=0.1))
        ref = FlatnessOptimizer(fresh, estimator, torch.optim.SGD(fresh.parameters(), lr=0.1))
        ref._bridge.keeps_inputs = True
        run(opt, batches(2))
        first, _ = opt._bridge.snapshot()
        second, _ = opt._bridge.snapshot()
        assert all((first[k] is second[k]) == reused for k in first)
        run(opt, batches(3, seed=1))
        run(ref, batches(2))
        run(ref, batches(3, seed=1))
        for (k, p), q in zip(model.named_parameters(), fresh.parameters(), strict=True):
            assert torch.equal(p, q), k


def test_each_pass_writes_into_the_buffers_of_the_last_step_and_moves_the_model_as_new_copies_do(
    monkeypatch,
):
    """The buffers each pass writes (BatchNorm's statistics) are the same tensors from step to step,
    one set per pass of a step (SAM: two), and the model moves bit for bit as with a new copy of the
    buffers at every pass, a skipped step and a closure step included."""

    def bn():
        torch.manual_seed(0)
        return nn.Sequential(
            nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 3)
        ).double()

    data = batches(4)
    x, y = data[1]
    data[1] = (x * float("nan"), y)  # skipped

    def train(opt, model):
        for b in data:
            opt.step(b)
        opt.step(lambda: nn.functional.cross_entropy(model(data[0][0]), data[0][1]))
        return {k: v.clone() for k, v in model.state_dict().items()}

    model = bn()
    opt = SAM(model, torch.optim.SGD, lr=0.1, momentum=0.9, rho=0.05)
    opt.step(data[0])
    sets = [list(s) for s in opt._pass_buffers._sets]
    assert len(sets) == 2 and all(len(s) == 3 for s in sets)  # running mean, var, count
    got = train(opt, model)
    assert int(opt._state.skipped) == 1
    assert all(
        a is b
        for s, t in zip(sets, opt._pass_buffers._sets, strict=True)
        for a, b in zip(s, t, strict=True)
    )
    with monkeypatch.context() as m:  # the reference: new copies at every pass
        m.setattr("gamfunc.torch_optim.losses._reusable", lambda buffers: False)
        ref_model = bn()
        ref = SAM(ref_model, torch.optim.SGD, lr=0.1, momentum=0.9, rho=0.05)
        ref.step(data[0])
        want = train(ref, ref_model)
        assert ref._pass_buffers._sets == []
    for k, v in want.items():
        assert torch.equal(got[k], v), k
