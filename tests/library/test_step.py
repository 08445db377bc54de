"""make_step and gam_step: composition, GAM on a fraction of steps, BatchNorm, convergence, non-finite."""

import pytest
import torch
from helpers import (
    as_flat,
    flatten,
    mlp_batch,
    mlp_loss,
    mlp_params,
    quadratic,
    rel_err,
    split,
)
from models import TinyResNet, image_batch

import gamfunc
from gamfunc import schedules, tree


def run(step, params, batches, state=None):
    state = step.init(params) if state is None else state
    for b in batches:
        params, state, metrics = step(params, state, b)
    return params, state, metrics


def test_step_is_estimator_then_optimizer():
    params, batch = mlp_params(), mlp_batch()
    est, opt = gamfunc.gam(0.05, 0.1), gamfunc.sgd(lr=0.1, momentum=0.9)
    new, state, metrics = gamfunc.make_step(est, opt, mlp_loss)(
        params, gamfunc.make_step(est, opt, mlp_loss).init(params), batch
    )
    d, _info = est(params, batch, mlp_loss)
    u, _ = gamfunc.optim.call_update(opt, d, opt.init(params), params, torch.tensor(0))
    ref = gamfunc.apply_updates(params, u)
    assert all(torch.equal(new[k], ref[k]) for k in params)
    for key in ("loss", "grad_norm", "f_norm", "adv_grad_norm", "lr", "rho", "skipped"):
        assert key in metrics and metrics[key].ndim == 0
    assert int(state.step) == 1 and int(metrics["skipped"]) == 0


def test_gam_step_one_call_form_equals_make_step():
    params, data = mlp_params(), [mlp_batch(seed=i) for i in range(3)]
    p1, s1 = params, None
    for b in data:
        p1, s1, _m1 = gamfunc.gam_step(
            p1, b, mlp_loss, s1, rho=0.05, alpha=0.1, lr=0.05, momentum=0.9
        )
    step = gamfunc.make_step(gamfunc.gam(0.05, 0.1), gamfunc.sgd(lr=0.05, momentum=0.9), mlp_loss)
    p2, _, _ = run(step, params, data)
    assert all(torch.equal(p1[k], p2[k]) for k in params)
    with pytest.raises(TypeError, match="unexpected"):
        gamfunc.gam_step(params, data[0], mlp_loss, rho=0.05, alpha=0.1, betas=(0.9, 0.9))


def test_every_k_uses_gam_on_every_kth_step_only():
    params, data = mlp_params(), [mlp_batch(seed=i) for i in range(7)]
    gam, grad, opt = gamfunc.gam(0.1, 0.5), gamfunc.gradient(), gamfunc.sgd(lr=0.1, momentum=0.9)
    p, _, _ = run(gamfunc.make_step(gam, opt, mlp_loss, every=3), params, data)
    ref, state = params, opt.init(params)
    for i, b in enumerate(data):
        d, _ = (gam if i % 3 == 0 else grad)(ref, b, mlp_loss)
        u, state = gamfunc.optim.call_update(opt, d, state, ref, torch.tensor(i))
        ref = gamfunc.apply_updates(ref, u)
    assert all(torch.equal(p[k], ref[k]) for k in params)


def test_batchnorm_running_stats_come_from_the_clean_pass_only():
    torch.manual_seed(0)
    model = TinyResNet()
    loss_fn, params, buffers = gamfunc.nn.functionalize(model)
    batch = image_batch()
    before = tree.clone(buffers)
    for est in (gamfunc.gam(0.1, 0.5), gamfunc.gam(0.1, 0.5, hvp="fd"), gamfunc.sam(0.1)):
        step = gamfunc.make_step(est, gamfunc.sgd(lr=0.1), loss_fn)
        _, state, _ = step(params, step.init(params, buffers), batch)
        reference = TinyResNet()
        reference.load_state_dict(model.state_dict())
        reference.train()
        reference(batch[0])
        for k, v in reference.named_buffers():
            assert torch.equal(state.buffers[k], v), (est.name, k)
        assert all(torch.equal(before[k], buffers[k]) for k in buffers)  # inputs untouched


def harmonic(initial):
    """ρ_t = ρ₀/(t+1): a radius that vanishes fast enough for 300 steps to reach the minimum."""
    return lambda t: initial / (t.to(torch.float64) + 1)


@pytest.mark.parametrize(
    "estimator",
    [
        gamfunc.gradient(),
        gamfunc.sam(harmonic(0.05)),
        gamfunc.gnp(harmonic(0.01), hvp="exact"),
        gamfunc.gam(harmonic(0.05), 0.1),
        gamfunc.gam(harmonic(0.05), 0.1, hvp="fd"),
        gamfunc.gam(harmonic(0.05), 0.1, oracle=gamfunc.sam(harmonic(0.05))),
        gamfunc.gam_accelerated(harmonic(0.05), harmonic(0.01), 0.5, 0.5, 0.1),
    ],
    ids=lambda e: e.name,
)
def test_every_estimator_reaches_the_minimum_of_a_convex_quadratic(estimator):
    """Each estimator's bias vanishes with its radius: 300 steps of SGD along it, with ρ_t → 0, end
    at θ* (the error left is O(ρ_300) ≈ 2·10⁻⁴)."""
    loss_fn, _A, theta_star = quadratic(cond=5.0)
    params = split(theta_star + 1.0)
    step = gamfunc.make_step(estimator, gamfunc.sgd(lr=0.1), loss_fn)
    params, _, _ = run(step, params, [None] * 300)
    assert (as_flat(params) - theta_star).norm() < 2e-3


def test_nonfinite_loss_skips_the_step_and_keeps_everything():
    params, batch = mlp_params(), mlp_batch()
    step = gamfunc.make_step(gamfunc.gam(0.05, 0.1), gamfunc.sgd(lr=0.1, momentum=0.9), mlp_loss)
    params, state, _ = run(step, params, [batch])
    bad = (batch[0] * float("nan"), batch[1])
    new, new_state, metrics = step(params, state, bad)
    assert int(metrics["skipped"]) == 1 and int(new_state.skipped) == 1
    assert all(torch.equal(new[k], params[k]) for k in params)
    assert torch.equal(new_state.step, state.step)
    buf = state.opt.inner.states[0].momentum_buffer
    new_buf = new_state.opt.inner.states[0].momentum_buffer
    assert all(torch.equal(buf[k], new_buf[k]) for k in buf)
    new, new_state, metrics = step(new, new_state, batch)
    assert int(metrics["skipped"]) == 0 and int(new_state.skipped) == 1


def test_nonfinite_raise_mode():
    params, batch = mlp_params(), mlp_batch()
    step = gamfunc.make_step(
        gamfunc.gradient(), gamfunc.sgd(lr=0.1), mlp_loss, on_nonfinite="raise"
    )
    with pytest.raises(FloatingPointError):
        step(params, step.init(params), (batch[0] * float("inf"), batch[1]))


def test_make_step_validates_its_arguments():
    est, opt = gamfunc.gradient(), gamfunc.sgd(lr=0.1)
    with pytest.raises(ValueError, match="every"):
        gamfunc.make_step(est, opt, mlp_loss, every=0)
    with pytest.raises(ValueError, match="on_nonfinite"):
        gamfunc.make_step(est, opt, mlp_loss, on_nonfinite="warn")
    with pytest.raises(TypeError, match="estimator"):
        gamfunc.make_step(lambda *a: None, opt, mlp_loss)
    with pytest.raises(TypeError, match="optimizer"):
        gamfunc.make_step(est, torch.optim.SGD, mlp_loss)


def test_gam_with_zero_alpha_reproduces_sgd_trajectory():
    params, data = mlp_params(), [mlp_batch(seed=i) for i in range(5)]
    opt = gamfunc.sgd(lr=0.1, momentum=0.9)
    p_gam, _, _ = run(gamfunc.make_step(gamfunc.gam(0.05, 0.0), opt, mlp_loss), params, data)
    p_sgd, _, _ = run(gamfunc.make_step(gamfunc.gradient(), opt, mlp_loss), params, data)
    assert rel_err(flatten(p_gam), flatten(p_sgd)) == 0.0


# ---- one step counter, the guard over the update, state checked against params -------------------


def test_rho_and_lr_stay_in_proportion_after_skipped_steps():
    """Estimators and optimisers read one step counter: skipped steps move neither ρ nor lr."""
    lr = schedules.cosine(0.1, total_steps=10)
    rho = schedules.proportional(0.05, lr, 0.1)
    step = gamfunc.make_step(gamfunc.sam(rho), gamfunc.sgd(lr=lr), mlp_loss)
    params, batch = mlp_params(), mlp_batch()
    bad = (batch[0] * float("nan"), batch[1])
    state = step.init(params)
    for b in (batch, bad, bad, bad, batch):
        params, state, metrics = step(params, state, b)
    assert int(state.skipped) == 3
    assert int(state.step) == 2
    assert float(metrics["rho"] / metrics["lr"]) == pytest.approx(0.5, rel=1e-12)


def test_one_step_counter_through_skipped_steps_and_every_k():
    """The step's counter is the only one: a skipped step moves it not, ``every=k`` moves it on
    both branches, and the lr and ρ schedules see it; ``cycle`` counts every call."""
    lr = schedules.cosine(0.1, total_steps=10, warmup_steps=4)
    rho = schedules.proportional(0.05, lr, 0.1)
    opt = gamfunc.chain(gamfunc.clip_by_global_norm(10.0), gamfunc.sgd(lr=lr, momentum=0.9))
    step = gamfunc.make_step(gamfunc.sam(rho), opt, mlp_loss, every=2)
    params, batch = mlp_params(), mlp_batch()
    bad = (batch[0] * float("nan"), batch[1])
    state = step.init(params)
    taken = 0
    for b in (batch, batch, bad, batch, bad, bad, batch, batch):
        params, state, metrics = step(params, state, b)
        taken += 1 - int(metrics["skipped"])
        assert int(state.step) == taken
        assert float(metrics["lr"]) == float(lr(torch.tensor(taken - 1))) or int(metrics["skipped"])
        assert float(gamfunc.optim.learning_rate(state.opt)) == float(lr(torch.tensor(taken - 1)))
        if not int(metrics["skipped"]) and not metrics["rho"].isnan():
            assert float(metrics["rho"]) == float(rho(torch.tensor(taken - 1)))
    assert (taken, int(state.skipped), int(state.cycle)) == (5, 3, 8)
    plain = gamfunc.state.as_dict(state)
    counters = [path for path, _ in torch.utils._pytree.tree_flatten_with_path(plain)[0]]
    assert [p for p in counters if "step" in str(p)] == [counters[0]]  # one: plain["step"]


def test_a_nan_learning_rate_is_skipped_not_written_into_params():
    params, batch = mlp_params(), mlp_batch()
    nan_lr = lambda t: torch.full((), float("nan"), dtype=torch.float64)  # noqa: E731
    step = gamfunc.make_step(gamfunc.gradient(), gamfunc.sgd(lr=nan_lr), mlp_loss)
    state = step.init(params)
    new, new_state, metrics = step(params, state, batch)
    assert int(metrics["skipped"]) == 1 and int(new_state.skipped) == 1
    assert all(torch.equal(new[k], params[k]) for k in params)
    assert torch.equal(new_state.step, state.step)


def test_adamw_with_zero_eps_at_a_zero_gradient_is_skipped():
    loss_fn, _, theta_star = quadratic()
    params = split(theta_star.clone())
    step = gamfunc.make_step(gamfunc.gradient(), gamfunc.adamw(lr=0.1, eps=0.0), loss_fn)
    state = step.init(params)
    new, new_state, metrics = step(params, state, None)
    assert int(metrics["skipped"]) == 1
    assert all(torch.equal(new[k], params[k]) for k in params)
    moments = new_state.opt.inner.states[0]
    for k in ("exp_avg", "exp_avg_sq"):
        assert all(torch.isfinite(v).all() for v in getattr(moments, k).values())


def test_state_is_checked_against_params():
    params, batch = mlp_params(), mlp_batch()
    step = gamfunc.make_step(gamfunc.gradient(), gamfunc.sgd(lr=0.1, momentum=0.9), mlp_loss)
    with pytest.raises(TypeError, match=r"state.*step\.init"):
        step(params, None, batch)
    other = {**params, "b1": torch.zeros(1, dtype=torch.float64)}
    with pytest.raises(ValueError, match="b1"):
        step(other, step.init(params), batch)  # a state built for other shapes
    fewer = {k: v for k, v in params.items() if k != "b2"}
    with pytest.raises(ValueError, match="b2"):
        step(fewer, step.init(params), batch)
    with pytest.raises(ValueError, match="params"):
        step.init({})
    with pytest.raises(TypeError, match="loss_fn"):
        gamfunc.make_step(gamfunc.gradient(), gamfunc.sgd(lr=0.1), "mse")


def test_the_state_is_a_typed_pytree():
    params, batch = mlp_params(), mlp_batch()
    step = gamfunc.make_step(gamfunc.sam(0.05), gamfunc.adamw(1e-3), mlp_loss)
    state = step.init(params)
    assert type(state) is gamfunc.StepState and type(state.opt) is gamfunc.InjectState
    assert state._fields == ("step", "opt", "skipped", "buffers", "cycle", "loss", "est", "policy")
    assert (state.buffers, state.cycle, state.loss) == ((), (), ())
    assert state.opt.inner.states[0].exp_avg.keys() == params.keys()
    _, new_state, _ = step(params, state, batch)
    assert type(new_state) is gamfunc.StepState and int(new_state.step) == 1
    # a pytree of tensors only: step, skipped, lr, weight decay and the two moments
    leaves, spec = torch.utils._pytree.tree_flatten(new_state)
    assert all(isinstance(v, torch.Tensor) for v in leaves) and len(leaves) == 4 + 2 * len(params)
    assert torch.utils._pytree.tree_unflatten(leaves, spec)._fields == state._fields
    buffered = gamfunc.make_step(gamfunc.sam(0.05), gamfunc.sgd(0.1), mlp_loss, every=2)
    state = buffered.init(params, {"m": torch.zeros(2)})
    assert state.buffers.keys() == {"m"} and state.cycle.device.type == "cpu"


def test_a_wrong_state_gets_a_one_line_error_naming_the_field():
    params, batch = mlp_params(), mlp_batch()
    step = gamfunc.make_step(gamfunc.gradient(), gamfunc.sgd(lr=0.1, momentum=0.9), mlp_loss)
    state = step.init(params)
    with pytest.raises(TypeError, match=r"StepState.*got dict.*as_dict gives its plain-dict form"):
        step(params, dict(state._asdict()), batch)
    with pytest.raises(
        TypeError, match=r"state\.step must be an int64 tensor; got a torch.float32"
    ):
        step(params, state._replace(step=torch.tensor(0.0)), batch)
    with pytest.raises(TypeError, match=r"state\.skipped must be an int64 tensor; got int"):
        step(params, state._replace(skipped=0), batch)
    with pytest.raises(TypeError, match=r"state\.buffers must be a dict"):
        step(params, state._replace(buffers=[torch.zeros(1)]), batch)
    trace, lr = state.opt.inner.states
    where = r"state\.opt\.inner\.states\[0\]\.momentum_buffer\['w1'\] has shape"
    with pytest.raises(ValueError, match=where):
        bad = {**trace.momentum_buffer, "w1": torch.zeros(2, 2, dtype=torch.float64)}
        inner = gamfunc.ChainState((trace._replace(momentum_buffer=bad), lr))
        step(params, state._replace(opt=state.opt._replace(inner=inner)), batch)
    every = gamfunc.make_step(gamfunc.sam(0.05), gamfunc.sgd(lr=0.1), mlp_loss, every=2)
    with pytest.raises(ValueError, match=r"state\.cycle is \(\), but a step with every=2"):
        every(params, step.init(params), batch)
    with pytest.raises(ValueError, match=r"state\.cycle is set, but this step has every=1"):
        step(params, every.init(params), batch)
    with pytest.raises(TypeError, match="buffers must be a dict"):
        step.init(params, [torch.zeros(1)])


def test_as_dict_and_from_dict_round_trip_a_state_through_weights_only_torch_load(tmp_path):
    from gamfunc.training.state import as_dict, from_dict
    from gamfunc.wrappers.precision import LossScale, fp16

    params, batch = mlp_params(), mlp_batch()
    opt = gamfunc.chain(gamfunc.clip_by_global_norm(1.0), gamfunc.sgd(lr=0.1, momentum=0.9))
    step = gamfunc.make_step(gamfunc.sam(0.05), opt, fp16(mlp_loss), every=2)
    state = step.init(params)
    for i in range(3):
        params, state, _ = step(params, state, mlp_batch(seed=i))
    plain = as_dict(state)
    assert set(plain) == {"step", "opt", "skipped", "cycle", "loss"}  # no "buffers": ()
    assert set(plain["opt"]) == {"states"} and set(plain["loss"]) == set(LossScale._fields)
    torch.save(plain, tmp_path / "state.pt")
    loaded = torch.load(tmp_path / "state.pt", weights_only=True)
    restored = from_dict(loaded, like=step.init(params))
    assert type(restored) is gamfunc.StepState and type(restored.loss) is LossScale
    (got, got_spec), (want, want_spec) = (
        torch.utils._pytree.tree_flatten(t) for t in (restored, state)
    )
    assert got_spec == want_spec and all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    # the restored state steps on exactly as the original
    p1, s1, _ = step(params, restored, batch)
    p2, s2, _ = step(params, state, batch)
    assert all(torch.equal(p1[k], p2[k]) for k in p1) and int(s1.cycle) == int(s2.cycle) == 4


def test_from_dict_names_the_field_that_does_not_match():
    from gamfunc.training.state import as_dict, from_dict

    params = mlp_params()
    step = gamfunc.make_step(gamfunc.sam(0.05), gamfunc.sgd(lr=0.1, momentum=0.9), mlp_loss)
    like = step.init(params)
    plain = as_dict(like)
    with pytest.raises(ValueError, match=r"state has no entry 'opt', which StepState needs"):
        from_dict({k: v for k, v in plain.items() if k != "opt"}, like)
    with pytest.raises(ValueError, match=r"state has entries \['loss_scale'\] that StepState"):
        from_dict({**plain, "loss_scale": torch.ones(())}, like)
    trace, lr = plain["opt"]["inner"]["states"]
    wrong = {**trace["momentum_buffer"], "w1": torch.zeros(3)}
    inner = {"states": [{"momentum_buffer": wrong}, lr]}
    where = r"state\.opt\.inner\.states\[0\]\.momentum_buffer\['w1'\] has shape \(3,\)"
    with pytest.raises(ValueError, match=where):
        from_dict({**plain, "opt": {**plain["opt"], "inner": inner}}, like)
    with pytest.raises(ValueError, match=r"state\.opt must be a dict of the fields of InjectState"):
        from_dict({**plain, "opt": [1, 2]}, like)


def test_make_step_returns_a_step():
    step = gamfunc.make_step(gamfunc.sam(0.05), gamfunc.sgd(lr=0.1), mlp_loss)
    assert isinstance(step, gamfunc.Step)
    assert isinstance(step.compile(backend="eager"), gamfunc.Step)
    assert isinstance(step.compile(backend="eager", scope="pass"), gamfunc.Step)


def test_the_metrics_schema_stays_fixed_under_every_k_with_a_skipped_step():
    """every=3: GAM on steps 0 and 3, the plain gradient on the others, and step 4 skipped (a NaN
    batch). Every step returns the same keys and dtypes; what a branch did not compute is NaN."""
    loss_fn = lambda p, b: ((b @ p["w"]) ** 2).mean()  # noqa: E731
    params = {"w": torch.ones(3)}
    step = gamfunc.make_step(gamfunc.gam(0.05, 0.1), gamfunc.sgd(0.1), loss_fn, every=3)
    state = step.init(params)
    seen = []
    for i in range(6):
        batch = torch.full((4, 3), float("nan")) if i == 4 else torch.randn(4, 3)
        params, state, metrics = step(params, state, batch)
        seen.append(metrics)
    schema = [(k, v.dtype) for k, v in seen[0].items()]
    assert {"f_norm", "adv_loss", "rho"} <= dict(schema).keys()
    assert all([(k, v.dtype) for k, v in m.items()] == schema for m in seen)
    assert torch.isnan(seen[1]["f_norm"]) and torch.isfinite(seen[3]["f_norm"])
    assert [int(m["skipped"]) for m in seen] == [0, 0, 0, 0, 1, 0]
    assert torch.stack([m["loss"] for m in seen]).shape == (6,)


def hand_written_sgd(lr: float) -> gamfunc.Transform:
    """Plain SGD as a user writes it: two functions, the three-argument update of optax."""

    def init(params):
        return ()

    def update(direction, state, params):
        return {k: -lr * d for k, d in direction.items()}, state

    return gamfunc.Transform(init, update)


def test_a_users_own_two_function_transform_drives_make_step_compiled_too():
    params, data = mlp_params(), [mlp_batch(seed=i) for i in range(4)]
    mine = gamfunc.make_step(gamfunc.sam(0.05), hand_written_sgd(0.1), mlp_loss)
    ours = gamfunc.make_step(gamfunc.sam(0.05), gamfunc.sgd(lr=0.1), mlp_loss)
    p1, s1, m1 = run(mine, params, data)
    p2, _, m2 = run(ours, params, data)
    assert all(torch.equal(p1[k], p2[k]) for k in params)
    assert int(s1.step) == 4 and s1.opt == () and "lr" not in m1 and "lr" in m2
    compiled = torch.compile(mine, fullgraph=True, backend="eager")
    p3, s3 = params, mine.init(params)
    for b in data:
        p3, s3, _ = compiled(p3, s3, b)
    assert all(torch.equal(p3[k], p1[k]) for k in params) and int(s3.step) == 4


def test_a_bare_chain_drives_make_step_and_gets_the_step_count():
    lr = schedules.cosine(0.1, total_steps=10, warmup_steps=3)
    params, data = mlp_params(), [mlp_batch(seed=i) for i in range(4)]
    bare = gamfunc.chain(gamfunc.trace(0.9, dampening=0.1), gamfunc.scale_by_learning_rate(lr))
    p1, s1, m1 = run(gamfunc.make_step(gamfunc.gradient(), bare, mlp_loss), params, data)
    opt = gamfunc.sgd(lr=lr, momentum=0.9, dampening=0.1)
    p2, _, m2 = run(gamfunc.make_step(gamfunc.gradient(), opt, mlp_loss), params, data)
    assert all(torch.equal(p1[k], p2[k]) for k in params)
    assert int(s1.step) == 4 and "lr" not in m1 and float(m2["lr"]) == float(lr(torch.tensor(3)))
