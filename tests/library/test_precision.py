"""gamfunc.precision: bf16/fp16 autocast steps against fp32, the dynamic loss scale against GradScaler."""

import pytest
import torch
from torch import nn

import gamfunc
from gamfunc import tree
from gamfunc.wrappers.accumulate import accumulate
from gamfunc.wrappers.precision import LossScale, autocast, bf16, fp16, mixed, update_scale

# Unit roundoff of each format; a step's update stays within TOL·u of fp32's (relative, in norm).
# Measured on these models: 1-2 u for every estimator, 3-5 u for finite-difference GAM (its r = 1e-2
# divides the rounding error of a gradient difference).
UNIT_ROUNDOFF = {"bf16": 2.0**-8, "fp16": 2.0**-11}
TOL = 8

ESTIMATORS = {
    "gradient": lambda h: gamfunc.gradient(),
    "sam": lambda h: gamfunc.sam(0.05),
    "gnp": lambda h: gamfunc.gnp(0.1, hvp=h),
    "gam": lambda h: gamfunc.gam(0.05, 0.5, hvp=h),
    "gam_fd": lambda h: gamfunc.gam(0.05, 0.5, hvp=gamfunc.hvps.fd(radius=1e-2)),
    "gam_accelerated": lambda h: gamfunc.gam_accelerated(0.05, 0.02, 0.6, 0.4, 0.3),
    "gsam": lambda h: gamfunc.gsam(0.05, 0.3),
    # γ = 0.3: at γ = 0.9 the direction −8·g + 9·g_adv carries about 9 units of roundoff of its
    # two gradients by construction (measured 9.4u in bf16 against 1.2u for SAM), above TOL
    "wsam": lambda h: gamfunc.wsam(0.05, 0.3),
    "sam_3_steps": lambda h: gamfunc.sam(0.05, ascent_steps=3),
}


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4)
    )


def bn_mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.Tanh(), nn.Linear(32, 4))


def batch(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 8, generator=g), torch.randint(0, 4, (n,), generator=g)


def rel(a, b):
    return float(tree.norm(tree.sub(a, b)).detach() / tree.norm(b).detach())


def one_step(estimator, loss_fn, params, buffers, b, optimizer=None):
    step = gamfunc.make_step(estimator, optimizer or gamfunc.sgd(lr=0.1), loss_fn)
    return step(params, step.init(params, buffers), b)


SECOND_ORDER = [(n, "exact") for n in ESTIMATORS] + [("gnp", "reverse"), ("gam", "reverse")]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize(("name", "hvp"), SECOND_ORDER)
@pytest.mark.parametrize("model", ["mlp", "bn_mlp", "bn_mlp_float32"])
def test_low_precision_step_stays_within_tolerance_of_fp32(precision, name, hvp, model):
    # Every backend runs through BatchNorm under autocast (the wrappers run exact H·v's backward
    # pass under autocast); float32_batchnorm changes nothing in the fp32 reference.
    net = {"mlp": mlp, "bn_mlp": bn_mlp}.get(model, lambda: gamfunc.nn.float32_batchnorm(bn_mlp()))
    loss_fn, params, buffers = gamfunc.nn.functionalize(net())
    b = batch()
    ref, ref_state, ref_m = one_step(ESTIMATORS[name](hvp), loss_fn, params, buffers, b)
    new, state, m = one_step(ESTIMATORS[name](hvp), mixed(loss_fn, precision), params, buffers, b)
    u = UNIT_ROUNDOFF[precision]
    assert all(new[k].dtype == torch.float32 for k in new)
    assert int(m["skipped"]) == 0
    assert rel(tree.sub(new, params), tree.sub(ref, params)) < TOL * u
    assert abs(float(m["loss"] - ref_m["loss"])) < TOL * u * float(ref_m["loss"])
    if buffers:
        assert all(state.buffers[k].dtype == ref_state.buffers[k].dtype for k in buffers)
        stats = [k for k in buffers if buffers[k].is_floating_point()]
        got, want = ({k: s.buffers[k] for k in stats} for s in (state, ref_state))
        start = {k: buffers[k] for k in stats}
        assert rel(tree.sub(got, start), tree.sub(want, start)) < TOL * u
        assert torch.equal(state.buffers["1.num_batches_tracked"], torch.tensor(1))


def ln_mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 4))


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("net", [bn_mlp, ln_mlp])
def test_exact_hvp_under_autocast_equals_the_fp32_product(precision, net):
    # Forward-mode AD through BatchNorm's and LayerNorm's backward returns float32 tangents for
    # low-precision values; the wrappers run that backward pass under autocast, so H·v runs and
    # stays within the format's rounding of the fp32 product (and of reverse-over-reverse).
    loss_fn, params, buffers = gamfunc.nn.functionalize(net())
    plain = lambda p, b: loss_fn(p, b, buffers)  # noqa: E731
    v = {k: torch.randn_like(t) for k, t in params.items()}
    v = tree.scale(v, 1 / tree.norm(v))  # a unit vector, as GAM's: S·H·v stays within fp16's range
    want, _ = gamfunc.hvps.exact()(plain, params, batch(), v)
    low = mixed(plain, precision)
    for backend in (gamfunc.hvps.exact(), gamfunc.hvps.reverse()):
        got, clean = backend(low, params, batch(), v)
        assert all(got[k].dtype == torch.float32 for k in got)
        assert rel(got, want) < TOL * UNIT_ROUNDOFF[precision]
        assert torch.isfinite(clean.loss)


def test_autocast_inside_a_plain_loss_fails_naming_the_wrappers():
    # torch.autocast inside loss_fn covers the forward pass but not the backward pass that exact
    # H·v differentiates (LayerNorm's tangent is float32 there on the CPU): the step raises before
    # it returns, naming the way out, and the caller's params stay.
    loss_fn, params, buffers = gamfunc.nn.functionalize(ln_mlp())

    def inner_autocast(p, b):
        with torch.autocast("cpu", torch.bfloat16):
            return loss_fn(p, b, buffers)

    before = {k: v.clone() for k, v in params.items()}
    step = gamfunc.make_step(ESTIMATORS["gam"]("exact"), gamfunc.sgd(lr=0.1), inner_autocast)
    with pytest.raises(RuntimeError, match=r"gamfunc\.precision\.bf16 or fp16") as info:
        step(params, step.init(params), batch())
    assert "dtype" in str(info.value.__cause__)
    assert all(torch.equal(params[k], before[k]) for k in params)


class ConvBN(nn.Module):
    """A residual block of two convolutions, each with BatchNorm: the layers of a ResNet."""

    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.c2, self.b2 = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.b1(self.c1(x)))
        h = torch.relu(h + self.b2(self.c2(h)))
        return self.fc(h.mean((2, 3)))


def conv_bn():
    torch.manual_seed(0)
    return ConvBN()


def conv_batch():
    g = torch.Generator().manual_seed(0)
    return torch.randn(16, 3, 6, 6, generator=g), torch.randint(0, 4, (16,), generator=g)


@pytest.mark.parametrize(
    ("net", "make_batch"), [(mlp, batch), (bn_mlp, batch), (conv_bn, conv_batch)]
)
def test_cpu_autocast_inside_the_loss_gives_the_wrappers_exact_hvp(net, make_batch):
    # On the CPU, where every forward-mode tangent keeps its value's dtype (Linear, Conv2d, ReLU,
    # cross-entropy, and BatchNorm made safe by functionalize), a torch.autocast inside loss_fn runs
    # exact H·v and gives the product of gamfunc.precision.bf16 bit for bit: the wrapper's autocast
    # around the backward pass changes no operation there. A whole exact-GAM step agrees too.
    loss_fn, params, buffers = gamfunc.nn.functionalize(net())
    plain = lambda p, b: loss_fn(p, b, buffers)  # noqa: E731

    def inner(p, b):
        with torch.autocast("cpu", torch.bfloat16):
            return plain(p, b)

    b = make_batch()
    v = tree.scale(params, 1 / tree.norm(params))
    got, _ = gamfunc.hvps.exact()(inner, params, b, v)
    wrapped, _ = gamfunc.hvps.exact()(mixed(plain, "bf16"), params, b, v)
    fp32, _ = gamfunc.hvps.exact()(plain, params, b, v)
    assert all(torch.equal(got[k], wrapped[k]) for k in got)
    assert rel(got, fp32) > 0  # low precision indeed
    new_inner, _, _ = one_step(gamfunc.gam(0.05, 0.5, hvp="exact"), inner, params, None, b)
    new_bf16, _, _ = one_step(gamfunc.gam(0.05, 0.5), mixed(plain, "bf16"), params, None, b)
    assert all(torch.equal(new_inner[k], new_bf16[k]) for k in params)


def test_cpu_autocast_inside_the_loss_stops_exact_hvp_at_a_float32_tangent():
    # BatchNorm that functionalize did not make safe returns a float32 tangent (of its float32
    # weight) for a bfloat16 value: exact H·v with autocast inside the loss stops, naming the
    # wrappers, where the wrapper and reverse-over-reverse run. (LayerNorm: the test above.)
    torch.manual_seed(0)
    model = bn_mlp()
    params = {k: v.detach() for k, v in model.named_parameters()}

    def plain(p, b):  # a loss written by hand, through functional_call, with BatchNorm as torch's
        buffers = {k: t.clone() for k, t in model.named_buffers()}
        out = torch.func.functional_call(model, (p, buffers), (b[0],))
        return torch.nn.functional.cross_entropy(out, b[1])

    def inner(p, b):
        with torch.autocast("cpu", torch.bfloat16):
            return plain(p, b)

    v = tree.scale(params, 1 / tree.norm(params))
    with pytest.raises(RuntimeError, match=r"gamfunc\.precision\.bf16 or fp16"):
        gamfunc.hvps.exact()(inner, params, batch(), v)
    wrapped, _ = gamfunc.hvps.exact()(mixed(plain, "bf16"), params, batch(), v)
    reverse, _ = gamfunc.hvps.reverse()(inner, params, batch(), v)
    fp32, _ = gamfunc.hvps.exact()(plain, params, batch(), v)
    assert rel(wrapped, fp32) < TOL * UNIT_ROUNDOFF["bf16"]
    assert rel(reverse, fp32) < TOL * UNIT_ROUNDOFF["bf16"]


@pytest.mark.gpu
def test_cuda_autocast_inside_the_loss_stops_exact_hvp_of_a_classifier():
    # CUDA autocast runs cross-entropy's log_softmax in float32: its tangent meets the bfloat16
    # head in the backward pass, and exact H·v with autocast inside the loss stops, naming the
    # wrappers; gamfunc.precision.bf16 runs the backward pass under autocast and stays within
    # bf16's rounding of the fp32 product.
    torch.manual_seed(0)
    loss_fn, params, buffers = gamfunc.nn.functionalize(ConvBN().cuda())
    plain = lambda p, b: loss_fn(p, b, buffers)  # noqa: E731

    def inner(p, b):
        with torch.autocast("cuda", torch.bfloat16):
            return plain(p, b)

    b = tuple(t.cuda() for t in conv_batch())
    v = tree.scale(params, 1 / tree.norm(params))
    with pytest.raises(RuntimeError, match=r"gamfunc\.precision\.bf16 or fp16"):
        gamfunc.hvps.exact()(inner, params, b, v)
    wrapped, _ = gamfunc.hvps.exact()(mixed(plain, "bf16"), params, b, v)
    fp32, _ = gamfunc.hvps.exact()(plain, params, b, v)
    assert rel(wrapped, fp32) < TOL * UNIT_ROUNDOFF["bf16"]


def test_float32_batchnorm_changes_no_name_and_nothing_without_autocast():
    net, converted = bn_mlp(), gamfunc.nn.float32_batchnorm(bn_mlp())
    assert type(converted[1]).__name__ == "Float32BatchNorm1d"
    assert isinstance(converted[1], nn.BatchNorm1d)
    assert list(net.state_dict()) == list(converted.state_dict())
    x, _ = batch()
    assert torch.equal(net(x), converted(x))
    with torch.autocast("cpu", torch.bfloat16):
        assert converted(x).dtype == torch.bfloat16  # the last Linear is autocast's
        assert converted[1](converted[0](x)).dtype == torch.float32
    assert type(gamfunc.nn.float32_batchnorm(converted)[1]) is type(converted[1])


def test_low_precision_is_really_low():
    loss_fn, params, buffers = gamfunc.nn.functionalize(mlp())
    d32, _ = gamfunc.gradient()(params, batch(), lambda p, b: loss_fn(p, b, buffers))
    d16, _ = gamfunc.gradient()(params, batch(), bf16(lambda p, b: loss_fn(p, b, buffers)))
    assert rel(d16, d32) > 1e-4  # bf16 arithmetic happened


def test_autocast_keeps_the_loss_in_the_params_dtype_and_validates_dtype():
    def loss_fn(p, x):
        return (x @ p["w"]).pow(2).mean()  # matmul and pow: bf16 under autocast

    out = autocast(loss_fn, torch.bfloat16)({"w": torch.ones(3)}, torch.ones(2, 3))
    assert out.dtype == torch.float32
    with pytest.raises(ValueError, match="dtype"):
        autocast(loss_fn, torch.float64)
    with pytest.raises(ValueError, match="precision"):
        mixed(loss_fn, "fp8")
    assert mixed(loss_fn, "fp32") is loss_fn


def test_fp16_loss_scale_rescues_gradients_that_underflow_without_it():
    loss_fn, params, buffers = gamfunc.nn.functionalize(mlp())

    def tiny(p, b):  # a loss whose backward activations lie below fp16's smallest normal
        return 1e-6 * loss_fn(p, b, buffers)[0]

    ref, _ = gamfunc.gradient()(params, batch(), tiny)
    unscaled, _ = gamfunc.gradient()(params, batch(), autocast(tiny, torch.float16))
    scaled, _ = gamfunc.gradient()(params, batch(), fp16(tiny))
    assert rel(unscaled, ref) > 0.05
    assert rel(scaled, ref) < TOL * UNIT_ROUNDOFF["fp16"]


def overflowing_batch():
    x, y = batch()
    x = x.clone()
    x[3] = 1e5  # |x·W| far beyond fp16's 65504: inf in the forward pass
    return x, y


@pytest.mark.parametrize("name", ["sam", "gam", "gam_accelerated"])
def test_fp16_overflow_skips_the_step_and_halves_the_scale(name):
    loss_fn, params, buffers = gamfunc.nn.functionalize(bn_mlp())
    step = gamfunc.make_step(
        ESTIMATORS[name]("reverse"), gamfunc.adamw(lr=0.1), fp16(loss_fn, init_scale=1024.0)
    )
    state = step.init(params, buffers)
    params, state, _ = step(params, state, batch(seed=1))  # a taken step: adam state is non-zero
    new, new_state, m = step(params, state, overflowing_batch())
    assert int(m["skipped"]) == 1 and int(new_state.skipped) == 1
    assert all(torch.equal(new[k], params[k]) for k in params)
    for part in ("buffers", "opt"):
        flat_old, flat_new = _leaves(getattr(state, part)), _leaves(getattr(new_state, part))
        assert all(torch.equal(a, b) for a, b in zip(flat_old, flat_new, strict=True))
    assert float(state.loss.scale) == 1024.0
    assert float(new_state.loss.scale) == 512.0 == float(m["loss_scale"])
    assert int(new_state.loss.growth_tracker) == 0


def _leaves(d):
    return torch.utils._pytree.tree_leaves(d)


def test_fp16_scale_backs_off_from_a_scale_that_overflows_the_backward_pass():
    loss_fn, params, buffers = gamfunc.nn.functionalize(mlp())
    step = gamfunc.make_step(
        gamfunc.sam(0.05), gamfunc.sgd(lr=0.1), fp16(loss_fn, init_scale=2.0**40)
    )
    state = step.init(params, buffers)
    scales, skipped = [], []
    for _ in range(40):
        params, state, m = step(params, state, batch())
        scales.append(float(m["loss_scale"]))
        skipped.append(int(m["skipped"]))
    first_taken = skipped.index(0)
    assert 0 < first_taken < 39 and not any(skipped[first_taken:])
    assert scales[:first_taken] == [2.0 ** (39 - i) for i in range(first_taken)]
    assert int(state.skipped) == first_taken


def test_fp16_scale_grows_after_growth_interval_taken_steps():
    loss_fn, params, buffers = gamfunc.nn.functionalize(mlp())
    lf = accumulate(fp16(loss_fn, init_scale=8.0, growth_interval=3), 2)
    step = gamfunc.make_step(gamfunc.gam(0.05, 0.1), gamfunc.sgd(lr=0.01), lf)
    state = step.init(params, buffers)
    scales = []
    for i in range(7):
        params, state, m = step(params, state, batch(seed=i))
        scales.append(float(m["loss_scale"]))
    assert scales == [8.0, 8.0, 16.0, 16.0, 16.0, 32.0, 32.0]


def test_update_scale_matches_torch_amp_update_scale():
    g = torch.Generator().manual_seed(0)
    found = torch.rand(60, generator=g) < 0.2
    ours = LossScale(torch.tensor(2.0**10), torch.tensor(0, dtype=torch.int32))
    scale, tracker = torch.tensor([2.0**10]), torch.zeros(1, dtype=torch.int32)
    for inf in found:
        ours = update_scale(ours, ~inf, 2.0, 0.5, 4)
        torch._amp_update_scale_(scale, tracker, inf.float().reshape(1), 2.0, 0.5, 4)
        assert float(ours.scale) == float(scale) and int(ours.growth_tracker) == int(tracker)
    assert ours.scale.dtype == torch.float32 and ours.growth_tracker.dtype == torch.int32


def test_fp16_needs_skip_and_validates_its_arguments():
    loss_fn = fp16(lambda p, b: (p["w"] * b).sum())
    step = gamfunc.make_step(
        gamfunc.gradient(), gamfunc.sgd(lr=0.1), loss_fn, on_nonfinite="ignore"
    )
    with pytest.raises(ValueError, match="on_nonfinite"):
        step.init({"w": torch.ones(2)})
    for kw, name in (
        ({"init_scale": 0.0}, "init_scale"),
        ({"growth_factor": 1.0}, "growth_factor"),
        ({"backoff_factor": 1.0}, "backoff_factor"),
        ({"growth_interval": 0}, "growth_interval"),
    ):
        with pytest.raises(ValueError, match=name):
            fp16(lambda p, b: p["w"].sum(), **kw)
    for wrap in (fp16, bf16):
        with pytest.raises(TypeError, match="plain loss_fn"):
            wrap(accumulate(lambda p, b: p["w"].sum(), 2))
