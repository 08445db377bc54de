"""Transforms between estimator and optimiser: clipping against torch.nn.utils.clip_grad_norm_, chains
and masked weight decay against torch.optim trajectories in float64, compile, argument checks."""

import math
import warnings

import pytest
import torch
from helpers import flatten, mlp_batch, mlp_loss, mlp_params, rel_err
from torch import nn

import gamfunc
from gamfunc.optim.transforms import ClipState
from gamfunc.torch_optim import FlatnessOptimizer

STEPS = 30


def batches(n=STEPS):
    return [mlp_batch(seed=i) for i in range(n)]


def grads_of(params, batch):
    return torch.func.grad(mlp_loss)(params, batch)


def torch_clip(direction, max_norm):
    """``clip_grad_norm_`` on copies of ``direction`` put into ``.grad``: (clipped, total norm)."""
    ps = {k: torch.zeros_like(v, requires_grad=True) for k, v in direction.items()}
    for k, p in ps.items():
        p.grad = direction[k].clone()
    total = torch.nn.utils.clip_grad_norm_(list(ps.values()), max_norm)
    return {k: p.grad for k, p in ps.items()}, total


# ---- clip_by_global_norm ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("ratio", [0.1, 0.999, 1.5, 10.0])
def test_clip_equals_clip_grad_norm(dtype, ratio):
    """max_norm below the norm (clipped) and above it (the factor clamps to 1)."""
    d = mlp_params(dtype, seed=3)
    norm = math.sqrt(sum(float((v.double() ** 2).sum()) for v in d.values()))
    max_norm = ratio * norm
    clip = gamfunc.clip_by_global_norm(max_norm)
    ours, state = clip.update(d, clip.init(d), d)
    ref, total = torch_clip(d, max_norm)
    assert all(torch.equal(ours[k], ref[k]) for k in d)
    assert torch.equal(state.norm, total)
    assert all(ours[k].dtype == dtype for k in d)
    got = math.sqrt(sum(float((v.double() ** 2).sum()) for v in ours.values()))
    assert got == pytest.approx(min(norm, max_norm), rel=1e-5)


def test_clip_is_pure_and_keeps_the_norm_dtype_from_init():
    d = mlp_params(seed=3)
    before = {k: v.clone() for k, v in d.items()}
    clip = gamfunc.clip_by_global_norm(0.5)
    state = clip.init(d)
    assert state.norm.dtype == torch.float64 and float(state.norm) == 0.0
    _, new_state = clip.update(d, state, d)
    assert all(torch.equal(d[k], before[k]) for k in d)
    assert new_state.norm.dtype == state.norm.dtype and float(state.norm) == 0.0


def test_clip_of_bfloat16_computes_the_norm_in_float32():
    d = {k: v.to(torch.bfloat16) for k, v in mlp_params(torch.float32, seed=3).items()}
    clip = gamfunc.clip_by_global_norm(0.5)
    state = clip.init(d)
    ours, new_state = clip.update(d, state, d)
    exact = torch.linalg.vector_norm(torch.cat([v.double().reshape(-1) for v in d.values()]))
    assert state.norm.dtype == new_state.norm.dtype == torch.float32
    assert float(new_state.norm) == pytest.approx(float(exact), rel=1e-6)
    coef = 0.5 / (new_state.norm + 1e-6)
    for k in d:
        assert ours[k].dtype == torch.bfloat16
        assert torch.equal(ours[k], (d[k].float() * coef).to(torch.bfloat16))


def test_clip_of_mixed_dtypes_uses_the_widest():
    d = {
        "a": torch.tensor([3.0], dtype=torch.float16),
        "b": torch.tensor([4.0], dtype=torch.float64),
    }
    clip = gamfunc.clip_by_global_norm(1.0)
    state = clip.init(d)
    ours, new_state = clip.update(d, state, d)
    assert state.norm.dtype == new_state.norm.dtype == torch.float64
    assert float(new_state.norm) == 5.0
    assert ours["a"].dtype == torch.float16 and ours["b"].dtype == torch.float64
    assert float(ours["b"]) == pytest.approx(0.8, rel=1e-6)


# ---- chains against torch.optim + clip_grad_norm_ -------------------------------------------------


def torch_trajectory(opt_cls, groups, params, data, *max_norms):
    """torch.optim over ``groups`` = [(names, options)], clip_grad_norm_ after each backward (once per
    max norm, in order); returns the final params and the total norms the first clip saw."""
    tensors = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    opt = opt_cls([{"params": [tensors[k] for k in names], **kw} for names, kw in groups])
    norms = []
    for batch in data:
        opt.zero_grad()
        mlp_loss(tensors, batch).backward()
        for i, max_norm in enumerate(max_norms):
            total = torch.nn.utils.clip_grad_norm_(list(tensors.values()), max_norm)
            if i == 0:
                norms.append(float(total))
        opt.step()
    return {k: v.detach() for k, v in tensors.items()}, norms


def gamfunc_trajectory(opt, params, data):
    """The trajectory of ``opt`` alone, the step count given as a make_step gives it."""
    state = opt.init(params)
    for t, batch in enumerate(data):
        g = grads_of(params, batch)
        updates, state = gamfunc.optim.call_update(opt, g, state, params, torch.tensor(t))
        params = gamfunc.apply_updates(params, updates)
    return params, state


ALL = list(mlp_params())
MAX_NORM = 0.8  # between the smallest and largest gradient norms of the trajectories below

CHAIN_CASES = [
    (torch.optim.SGD, gamfunc.sgd, {"lr": 0.2}),
    (torch.optim.SGD, gamfunc.sgd, {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-2}),
    (torch.optim.SGD, gamfunc.sgd, {"lr": 0.05, "momentum": 0.9, "nesterov": True}),
    (torch.optim.AdamW, gamfunc.adamw, {"lr": 1e-2}),
    (torch.optim.AdamW, gamfunc.adamw, {"lr": 3e-2, "betas": (0.8, 0.99), "weight_decay": 0.3}),
]


@pytest.mark.parametrize(
    ("torch_cls", "factory", "kwargs"),
    CHAIN_CASES,
    ids=[f"{f.__name__}-" + ",".join(f"{a}={b}" for a, b in k.items()) for _, f, k in CHAIN_CASES],
)
def test_chained_clip_equals_torch_optim_with_clip_grad_norm(torch_cls, factory, kwargs):
    params, data = mlp_params(), batches()
    ref, norms = torch_trajectory(torch_cls, [(ALL, kwargs)], params, data, MAX_NORM)
    assert min(norms) < MAX_NORM < max(norms)  # both branches of the clamp are exercised
    opt = gamfunc.chain(gamfunc.clip_by_global_norm(MAX_NORM), factory(**kwargs))
    ours, state = gamfunc_trajectory(opt, params, data)
    assert rel_err(flatten(ours), flatten(ref)) < 1e-12
    assert float(state.states[0].norm) == pytest.approx(norms[-1], rel=1e-12)


def test_chain_without_transforms_is_the_optimizer():
    params, data = mlp_params(), batches(10)
    plain, plain_state = gamfunc_trajectory(gamfunc.adamw(1e-2), params, data)
    chained, state = gamfunc_trajectory(gamfunc.chain(gamfunc.adamw(1e-2)), params, data)
    assert all(torch.equal(plain[k], chained[k]) for k in params)
    assert len(state.states) == 1 and type(state.states[0]) is type(plain_state)


def test_two_clips_in_order_and_nested_chains_compose():
    params, data = mlp_params(), batches(10)
    flat = gamfunc.chain(
        gamfunc.clip_by_global_norm(0.9), gamfunc.clip_by_global_norm(0.3), gamfunc.sgd(lr=0.1)
    )
    nested = gamfunc.chain(
        gamfunc.clip_by_global_norm(0.9),
        gamfunc.chain(gamfunc.clip_by_global_norm(0.3), gamfunc.sgd(lr=0.1)),
    )
    a, _ = gamfunc_trajectory(flat, params, data)
    b, sb = gamfunc_trajectory(nested, params, data)
    assert all(torch.equal(a[k], b[k]) for k in params)
    inner = sb.states[1]  # a chain is a Transform: nested, not flattened
    assert type(inner) is gamfunc.ChainState and type(inner.states[1]) is gamfunc.InjectState
    # the second clip sees the first one's output: a norm of at most 0.9
    assert float(inner.states[0].norm) <= 0.9 + 1e-12
    ref, _ = torch_trajectory(torch.optim.SGD, [(ALL, {"lr": 0.1})], params, data, 0.9, 0.3)
    assert rel_err(flatten(a), flatten(ref)) < 1e-12


def test_chain_keeps_the_optimizer_state_and_lr_written_into_state_takes_effect():
    params, data = mlp_params(), batches(2)
    opt = gamfunc.chain(gamfunc.clip_by_global_norm(1.0), gamfunc.sgd(lr=0.1, momentum=0.9))
    state = opt.init(params)
    assert type(state) is gamfunc.ChainState and type(state.states[1]) is gamfunc.InjectState
    assert state.states[1].inner.states[0].momentum_buffer.keys() == params.keys()
    assert type(state.states[0]) is ClipState
    state = gamfunc.set_hyperparams(state, lr=torch.tensor(0.0, dtype=torch.float64))
    u, new_state = opt.update(grads_of(params, data[0]), state, params)
    new = gamfunc.apply_updates(params, u)
    assert all(torch.equal(new[k], params[k]) for k in params)
    assert float(gamfunc.optim.learning_rate(new_state)) == 0.0


def test_make_step_with_chain_and_mask_equals_torch_optim():
    """The whole step: gradient, clip, AdamW with no decay on 1-d tensors."""
    params, data = mlp_params(), batches()
    mask = gamfunc.decay_mask(params)
    decay = [k for k in params if mask[k]]
    rest = [k for k in params if not mask[k]]
    assert decay and rest
    kw = {"lr": 2e-2, "weight_decay": 0.1}
    groups = [(decay, kw), (rest, {**kw, "weight_decay": 0.0})]
    ref, norms = torch_trajectory(torch.optim.AdamW, groups, params, data, MAX_NORM)
    assert min(norms) < MAX_NORM < max(norms)
    opt = gamfunc.chain(
        gamfunc.clip_by_global_norm(MAX_NORM), gamfunc.adamw(**kw, weight_decay_mask=mask)
    )
    step = gamfunc.make_step(gamfunc.gradient(), opt, mlp_loss)
    p, state = params, step.init(params)
    for batch in data:
        p, state, metrics = step(p, state, batch)
    assert rel_err(flatten(p), flatten(ref)) < 1e-12
    assert int(state.step) == STEPS and float(metrics["lr"]) == kw["lr"]


def test_a_skipped_step_keeps_the_transform_state():
    params = mlp_params()
    opt = gamfunc.chain(gamfunc.clip_by_global_norm(1.0), gamfunc.sgd(lr=0.1))
    step = gamfunc.make_step(gamfunc.gradient(), opt, mlp_loss)
    p, state, _ = step(params, step.init(params), mlp_batch())
    x, y = mlp_batch(seed=2)
    new_p, new_state, metrics = step(p, state, (x * float("nan"), y))
    assert int(metrics["skipped"]) == 1
    assert torch.equal(new_state.opt.states[0].norm, state.opt.states[0].norm)
    assert all(torch.equal(new_p[k], p[k]) for k in p)


def test_torch_optim_facade_takes_a_chain_and_round_trips_its_state():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).double()
    mask = gamfunc.decay_mask(model.named_parameters())
    inner = gamfunc.sgd(lr=0.1, momentum=0.9, weight_decay=1e-2, weight_decay_mask=mask)
    opt = FlatnessOptimizer(
        model, gamfunc.sam(0.05), gamfunc.chain(gamfunc.clip_by_global_norm(0.5), inner)
    )
    data = [mlp_batch(seed=i) for i in range(3)]
    for batch in data[:2]:
        opt.step(batch)
    saved = opt.state_dict()
    assert set(saved["state"]["opt"]["states"][0]) == {"norm"}
    assert set(saved["state"]["opt"]["states"][1]) == {"hyperparams", "scheduled", "inner"}
    assert set(saved["state"]["opt"]["states"][1]["hyperparams"]) == {"lr", "weight_decay"}
    assert set(saved["state"]["opt"]["states"][1]["inner"]["states"][1]) == {"momentum_buffer"}
    twin = FlatnessOptimizer(
        model, gamfunc.sam(0.05), gamfunc.chain(gamfunc.clip_by_global_norm(0.5), inner)
    )
    twin.load_state_dict(saved)
    restored = twin.state_dict()["state"]["opt"]
    assert torch.equal(restored["states"][0]["norm"], saved["state"]["opt"]["states"][0]["norm"])
    opt.param_groups[0]["lr"] = 0.05
    opt.step(data[2])
    assert float(opt.metrics["lr"]) == 0.05


# ---- masked weight decay against torch.optim param groups ------------------------------------------


def ndim_mask(name, tensor):
    return tensor.ndim >= 2


MASKS = {
    "decay_mask": lambda p: gamfunc.decay_mask(p),
    "callable": lambda p: ndim_mask,
    "custom_dict": lambda p: {"w1": True, "b1": True, "w2": False, "b2": False},
    "none_decays": lambda p: dict.fromkeys(p, False),
    "all_decay": lambda p: dict.fromkeys(p, True),
}


def resolve(mask, params):
    return {k: (mask[k] if isinstance(mask, dict) else mask(k, v)) for k, v in params.items()}


def groups_of(mask, params, kw):
    resolved = resolve(mask, params)
    decay = [k for k in params if resolved[k]]
    rest = [k for k in params if not resolved[k]]
    groups = [(decay, kw)] if decay else []
    return [*groups, (rest, {**kw, "weight_decay": 0.0})] if rest else groups


MASKED_CASES = [
    (torch.optim.SGD, gamfunc.sgd, {"lr": 0.1, "momentum": 0.9, "weight_decay": 5e-2}),
    (
        torch.optim.SGD,
        gamfunc.sgd,
        {"lr": 0.05, "momentum": 0.8, "nesterov": True, "weight_decay": 1e-1},
    ),
    (torch.optim.SGD, gamfunc.sgd, {"lr": 0.1, "weight_decay": 5e-2}),
    (torch.optim.AdamW, gamfunc.adamw, {"lr": 1e-2, "weight_decay": 0.5}),
    (torch.optim.AdamW, gamfunc.adamw, {"lr": 3e-3, "betas": (0.8, 0.99), "weight_decay": 0.3}),
]


@pytest.mark.parametrize("mask_name", MASKS)
@pytest.mark.parametrize(
    ("torch_cls", "factory", "kwargs"),
    MASKED_CASES,
    ids=[f"{f.__name__}-" + ",".join(f"{a}={b}" for a, b in k.items()) for _, f, k in MASKED_CASES],
)
def test_masked_weight_decay_equals_torch_param_groups(torch_cls, factory, kwargs, mask_name):
    params, data = mlp_params(), batches(50)
    mask = MASKS[mask_name](params)
    ref, _ = torch_trajectory(torch_cls, groups_of(mask, params, kwargs), params, data)
    ours, _ = gamfunc_trajectory(factory(**kwargs, weight_decay_mask=mask), params, data)
    tol = 1e-12 if factory is gamfunc.sgd else 1e-10
    assert rel_err(flatten(ours), flatten(ref)) < tol
    for k in params:  # each tensor, not only the whole: a wrong mask on a small bias would hide
        assert rel_err(ours[k], ref[k]) < tol
    # the mask matters: decaying everything moves the no-decay tensors elsewhere
    if mask_name in ("decay_mask", "custom_dict"):
        everything, _ = gamfunc_trajectory(factory(**kwargs), params, data)
        off = [k for k, decays in resolve(mask, params).items() if not decays]
        assert off and all(rel_err(everything[k], ref[k]) > 1e-6 for k in off)


def test_decay_mask_is_the_ndim_rule_and_takes_named_parameters():
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(8, 3))
    mask = gamfunc.decay_mask(model.named_parameters())
    assert mask == {
        "0.weight": True,
        "0.bias": False,
        "1.weight": False,
        "1.bias": False,
        "3.weight": True,
        "3.bias": False,
    }
    assert gamfunc.decay_mask(dict(model.named_parameters())) == mask
    assert gamfunc.optim.transforms.decay_mask is gamfunc.decay_mask


# ---- torch.compile ---------------------------------------------------------------------------------


def compiled_run(backend, steps=3):
    torch._dynamo.reset()
    params = mlp_params(torch.float32)
    opt = gamfunc.chain(
        gamfunc.clip_by_global_norm(0.5),
        gamfunc.adamw(1e-2, weight_decay=0.1, weight_decay_mask=gamfunc.decay_mask(params)),
    )
    step = gamfunc.make_step(gamfunc.sam(0.05), opt, mlp_loss)
    compiled = torch.compile(step, fullgraph=True, backend=backend)
    e_p, e_s = params, step.init(params)
    c_p, c_s = params, step.init(params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(steps):
            batch = mlp_batch(dtype=torch.float32, seed=i)
            e_p, e_s, _ = step(e_p, e_s, batch)
            c_p, c_s, _ = compiled(c_p, c_s, batch)
    for k in params:
        torch.testing.assert_close(c_p[k], e_p[k], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(c_s.opt.states[0].norm, e_s.opt.states[0].norm)


def test_chain_traces_as_one_graph():
    compiled_run("eager")


@pytest.mark.slow
def test_compiled_chain_step_equals_eager_with_inductor():
    compiled_run("inductor")


# ---- argument checks -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("factory", "kwargs", "name"),
    [
        (gamfunc.clip_by_global_norm, {"max_norm": 0.0}, "max_norm"),
        (gamfunc.clip_by_global_norm, {"max_norm": -1.0}, "max_norm"),
        (gamfunc.clip_by_global_norm, {"max_norm": float("nan")}, "max_norm"),
        (gamfunc.clip_by_global_norm, {"max_norm": float("inf")}, "max_norm"),
        (gamfunc.clip_by_global_norm, {"max_norm": True}, "max_norm"),
        (gamfunc.clip_by_global_norm, {"max_norm": "1"}, "max_norm"),
        (gamfunc.clip_by_global_norm, {"max_norm": 1.0, "eps": -1e-6}, "eps"),
        (gamfunc.sgd, {"lr": 0.1, "weight_decay_mask": ["w1"]}, "weight_decay_mask"),
        (gamfunc.sgd, {"lr": 0.1, "weight_decay_mask": {"w1": 1}}, "weight_decay_mask"),
        (gamfunc.adamw, {"weight_decay_mask": "w1"}, "weight_decay_mask"),
        (gamfunc.adamw, {"weight_decay_mask": {"w1": torch.tensor(True)}}, "weight_decay_mask"),
    ],
)
def test_invalid_arguments_name_the_argument(factory, kwargs, name):
    with pytest.raises(ValueError, match=name):
        factory(**kwargs)


@pytest.mark.parametrize("factory", [gamfunc.sgd, gamfunc.adamw])
def test_a_mask_that_does_not_fit_the_params_fails_at_init(factory):
    params = mlp_params()
    with pytest.raises(ValueError, match=r"weight_decay_mask.*b2"):
        factory(lr=0.1, weight_decay_mask={"w1": True, "b1": False, "w2": True}).init(params)
    by_value = factory(lr=0.1, weight_decay_mask=lambda name, t: t.sum() > 0)
    with pytest.raises(ValueError, match="weight_decay_mask"):
        by_value.init(params)


@pytest.mark.parametrize(
    ("args", "name"),
    [
        ((), "at least one element"),
        ((gamfunc.clip_by_global_norm(1.0), lambda d: d, gamfunc.sgd(lr=0.1)), r"elements\[1\]"),
        ((torch.optim.SGD,), r"elements\[0\]"),
    ],
)
def test_chain_rejects_bad_arguments(args, name):
    with pytest.raises(ValueError, match=name):
        gamfunc.chain(*args)


def test_chain_refuses_a_transform_after_one_that_moved_the_parameters():
    """A torch.optim base optimiser's step is taken when its update returns (Moved): a chain that
    puts a transform after it says so, naming the element, rather than transform parameters as if
    they were updates."""
    from gamfunc.optim.base import Moved

    moves = gamfunc.Transform(lambda p: (), lambda d, s, p: (Moved(p), s))
    params = {"w": torch.ones(2)}
    last = gamfunc.chain(gamfunc.clip_by_global_norm(1.0), moves)
    u, _ = last.update(params, last.init(params), params)
    assert isinstance(u, Moved) and u["w"] is params["w"]
    after = gamfunc.chain(moves, gamfunc.optim.transforms.scale(2.0))
    with pytest.raises(ValueError, match=r"elements\[0\] moves the parameters itself"):
        after.update(params, after.init(params), params)


# ---- transforms before, between and after the optimiser -------------------------------------------


def clipped(d, max_norm):
    """clip_grad_norm_'s arithmetic, written out on a dict."""
    n = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(v) for v in d.values()]))
    coef = torch.clamp(max_norm / (n + 1e-6), max=1.0)
    return {k: v * coef for k, v in d.items()}


def test_chain_with_transforms_before_between_and_after_the_optimizer_equals_a_loop():
    """clip the direction (before), SGD with momentum and lr 1, clip the step (between), scale by
    the learning rate (after), against the same arithmetic written out."""
    params, data = mlp_params(), batches()
    mu, eta, before, between = 0.9, 0.05, 0.8, 1.5
    opt = gamfunc.chain(
        gamfunc.clip_by_global_norm(before),
        gamfunc.sgd(lr=1.0, momentum=mu),
        gamfunc.clip_by_global_norm(between),
        gamfunc.optim.transforms.scale(eta),
    )
    ours, state = gamfunc_trajectory(opt, params, data)
    theta, buf, clipped_steps = dict(params), None, 0
    for batch in data:
        d = clipped(grads_of(theta, batch), before)
        buf = d if buf is None else {k: mu * buf[k] + d[k] for k in d}
        step = clipped({k: -b for k, b in buf.items()}, between)
        n = math.sqrt(sum(float((v**2).sum()) for v in buf.values()))
        clipped_steps += n > between
        theta = {k: theta[k] + eta * step[k] for k in theta}
    assert 0 < clipped_steps < STEPS  # the clip of the step acts on some steps only
    assert rel_err(flatten(ours), flatten(theta)) < 1e-12
    kinds = [type(s).__name__ for s in state.states]
    assert kinds == ["ClipState", "InjectState", "ClipState", "tuple"]


def test_weight_decay_as_a_transform_and_the_lr_at_the_end_equal_torch_sgd():
    """chain(clip, add_decayed_weights, scale_by_learning_rate) = torch.optim.SGD with
    clip_grad_norm_ and param groups; then the same with a scheduled lr through make_step."""
    params, data = mlp_params(), batches(50)
    mask = gamfunc.decay_mask(params)
    kw = {"lr": 0.1, "weight_decay": 5e-2}
    ref, _ = torch_trajectory(torch.optim.SGD, groups_of(mask, params, kw), params, data, MAX_NORM)
    opt = gamfunc.chain(
        gamfunc.clip_by_global_norm(MAX_NORM),
        gamfunc.add_decayed_weights(5e-2, mask),
        gamfunc.scale_by_learning_rate(0.1),
    )
    ours, state = gamfunc_trajectory(opt, params, data)
    assert rel_err(flatten(ours), flatten(ref)) < 1e-12
    assert gamfunc.optim.learning_rate(state) is None  # a bare chain keeps no lr
    # a schedule at the end, injected, in a step: η_t (d + λ θ) with η_t the schedule at t
    lr = gamfunc.schedules.cosine(0.1, total_steps=50, warmup_steps=5)
    opt = gamfunc.chain(
        gamfunc.add_decayed_weights(5e-2),
        gamfunc.inject_hyperparams(gamfunc.scale_by_learning_rate)(lr=lr),
    )
    step = gamfunc.make_step(gamfunc.gradient(), opt, mlp_loss)
    p, s = params, step.init(params)
    theta = dict(params)
    for t, batch in enumerate(data):
        p, s, metrics = step(p, s, batch)
        g = grads_of(theta, batch)
        eta = lr(torch.tensor(t))
        theta = {k: theta[k] - eta * (g[k] + 5e-2 * theta[k]) for k in theta}
        assert float(metrics["lr"]) == float(eta)
    assert rel_err(flatten(p), flatten(theta)) < 1e-12
    with pytest.raises(ValueError, match="lr cannot be set"):
        gamfunc.set_hyperparams(s.opt, lr=torch.tensor(0.1, dtype=torch.float64))


@pytest.mark.parametrize(
    ("factory", "kwargs", "arg"),
    [
        (gamfunc.add_decayed_weights, {"weight_decay": -1.0}, "weight_decay"),
        (gamfunc.add_decayed_weights, {"weight_decay": 0.1, "mask": 3}, "mask"),
        (gamfunc.scale_by_learning_rate, {"lr": -0.1}, "lr"),
        (gamfunc.optim.transforms.scale, {"factor": float("inf")}, "factor"),
        (gamfunc.optim.transforms.scale_by_adam, {"b1": 1.0}, "b1"),
        (gamfunc.optim.transforms.scale_by_adam, {"b2": 1.0}, "b2"),
        (gamfunc.optim.transforms.scale_by_adam, {"eps": -1.0}, "eps"),
        (gamfunc.optim.transforms.scale_by_lion, {"b1": -0.1}, "b1"),
        (gamfunc.optim.transforms.scale_by_lion, {"b2": 1.0}, "b2"),
    ],
)
def test_new_transforms_reject_bad_hyperparameters(factory, kwargs, arg):
    with pytest.raises(ValueError, match=arg):
        factory(**kwargs)


# ---- parameter groups against torch.optim param groups ---------------------------------------------


GROUP_CASES = [
    (torch.optim.SGD, gamfunc.sgd, {"lr": 0.1, "momentum": 0.9, "weight_decay": 5e-2}, 0.02),
    (torch.optim.AdamW, gamfunc.adamw, {"lr": 1e-2, "weight_decay": 0.3}, 3e-3),
    (torch.optim.Adam, gamfunc.adam, {"lr": 1e-2, "weight_decay": 0.05}, 3e-2),
]


@pytest.mark.parametrize(
    ("torch_cls", "factory", "kwargs", "head_lr"),
    GROUP_CASES,
    ids=[f.__name__ for _, f, _, _ in GROUP_CASES],
)
def test_param_groups_equal_torch_optim_param_groups(torch_cls, factory, kwargs, head_lr):
    params, data = mlp_params(), batches(50)
    groups = {"b*": {"weight_decay": 0.0}, "*2": {"lr": head_lr}}
    torch_groups = [
        (["w1"], kwargs),
        (["b1"], {**kwargs, "weight_decay": 0.0}),
        (["w2"], {**kwargs, "lr": head_lr}),
        (["b2"], {**kwargs, "weight_decay": 0.0, "lr": head_lr}),
    ]
    ref, _ = torch_trajectory(torch_cls, torch_groups, params, data)
    opt = gamfunc.param_groups(groups, factory, **kwargs)
    ours, state = gamfunc_trajectory(opt, params, data)
    tol = 1e-12 if factory is gamfunc.sgd else 1e-10
    for k in params:
        assert rel_err(ours[k], ref[k]) < tol
    assert type(state) is gamfunc.optim.GroupsState and len(state.states) == 4
    assert float(gamfunc.optim.learning_rate(state)) == kwargs["lr"]


def lrs(state) -> list[float]:
    return [float(gamfunc.optim.learning_rate(s)) for s in state.states]


def test_a_groups_lr_moves_its_own_group_only_also_through_the_facade_s_param_groups():
    params, data = mlp_params(), batches(3)
    opt = gamfunc.param_groups({"*2": {"lr": 0.02}}, gamfunc.sgd, lr=0.1, momentum=0.9)
    step = gamfunc.make_step(gamfunc.sam(0.05), opt, mlp_loss)
    p, state = params, step.init(params)
    for batch in data:
        p, state, metrics = step(p, state, batch)
    assert float(metrics["lr"]) == 0.1 and lrs(state.opt) == pytest.approx([0.1, 0.02])
    # one group's lr set in its own state: the other group's parameters move as before
    states = list(state.opt.states)
    states[1] = gamfunc.set_hyperparams(states[1], lr=0.0)
    changed = state._replace(opt=state.opt._replace(states=tuple(states)))
    p_same, _, _ = step(p, state, data[0])
    p_new, s_new, _ = step(p, changed, data[0])
    assert lrs(s_new.opt) == pytest.approx([0.1, 0.0])
    assert all(torch.equal(p_new[k], p[k]) for k in ("w2", "b2"))  # group "*2": lr 0
    assert all(torch.equal(p_new[k], p_same[k]) for k in ("w1", "b1"))
    # the facade gives each group a param group of its own: setting one lr leaves the other
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).double()
    facade = FlatnessOptimizer(
        model, gamfunc.sam(0.05), gamfunc.param_groups({"2.*": {"lr": 0.01}}, gamfunc.sgd, lr=0.1)
    )
    facade.step(mlp_batch(seed=0))
    facade.param_groups[0]["lr"] = 0.05
    facade.step(mlp_batch(seed=1))
    assert [g["lr"] for g in facade.param_groups] == [0.05, 0.01]
    assert lrs(facade._state.opt) == pytest.approx([0.05, 0.01])


def test_param_groups_reject_bad_options_naming_argument_and_pattern():
    with pytest.raises(ValueError, match=r"weight_decay.*'\*\.bias'"):
        gamfunc.param_groups({"*.bias": {"weight_decay": -1.0}}, gamfunc.adamw, lr=1e-3)
    with pytest.raises(ValueError, match="groups"):
        gamfunc.param_groups(["*.bias"], gamfunc.adamw)
    with pytest.raises(ValueError, match="lr"):
        gamfunc.param_groups({}, gamfunc.sgd, lr=-1.0)


def test_a_group_pattern_that_matches_no_parameter_is_refused_at_init_naming_it():
    """A typo ("*.bais") would leave its options off without a word: init names the pattern."""
    params = mlp_params()
    gamfunc.param_groups({"b*": {"lr": 0.1}}, gamfunc.sgd, lr=0.1).init(params)
    for groups in ({"nope": {"lr": 0.1}}, {"b*": {"lr": 0.1}, "*.bais": {"weight_decay": 0.0}}):
        opt = gamfunc.param_groups(groups, gamfunc.sgd, lr=0.1)
        with pytest.raises(
            ValueError, match=r"groups: the pattern\(s\) '(nope|\*\.bais)' match no"
        ):
            opt.init(params)


def test_groups_state_names_each_groups_parameters_outside_the_leaves():
    """GroupsState records its groups' names in the tree's structure: no leaf is a string, so a
    state goes through as_dict/from_dict, vmap and torch.compile as a pytree of tensors."""
    params = mlp_params()
    opt = gamfunc.param_groups(
        {"*2": {"lr": 0.02}, "b*": {"weight_decay": 0.0}}, gamfunc.sgd, lr=0.1
    )
    state = opt.init(params)
    assert state.members() == [["w1"], ["b1"], ["w2"], ["b2"]]
    assert all(isinstance(v, torch.Tensor) for v in torch.utils._pytree.tree_leaves(state))
    saved = gamfunc.state.as_dict(state)
    assert gamfunc.state.from_dict(saved, like=state).members() == state.members()
    _, new = opt.update(params, state, params)
    assert new.members() == state.members()


def test_lr_groups_and_learning_rates_name_each_parameters_lr():
    params = mlp_params()
    names = list(params)
    opt = gamfunc.chain(
        gamfunc.clip_by_global_norm(1.0),
        gamfunc.param_groups({"*2": {"lr": 0.02}}, gamfunc.sgd, lr=0.1, momentum=0.9),
    )
    state = opt.init(params)
    groups = gamfunc.optim.lr_groups(state, names)
    assert [ks for ks, _ in groups] == [["w1", "b1"], ["w2", "b2"]]
    rates = gamfunc.optim.learning_rates(state, names)
    assert {k: round(float(v), 6) for k, v in rates.items()} == {
        "w1": 0.1,
        "b1": 0.1,
        "w2": 0.02,
        "b2": 0.02,
    }
    # one optimiser: every parameter its lr; a schedule's value at the last update
    sched = gamfunc.sgd(lr=gamfunc.schedules.constant(0.3))
    rates = gamfunc.optim.learning_rates(sched.init(params), names)
    assert sorted({round(float(v), 6) for v in rates.values()}) == [0.3]
    # a transform that keeps no lr: None
    assert (
        gamfunc.optim.learning_rates(gamfunc.clip_by_global_norm(1.0).init(params), names) is None
    )
