"""The door to torch's private APIs: each function on this torch, and its public fallback where the
internal is taken away (as a torch that moved it would have it), with its one logged line."""

import importlib
import logging
import operator
import re
import sys
from pathlib import Path

import pytest
import torch
from helpers import flatten, mlp_batch, mlp_loss, mlp_params, rel_err

import gamfunc
from gamfunc import _compat
from gamfunc._compat import base
from gamfunc._compat import functorch as functorch_doors

PACKAGE = Path(gamfunc.__file__).resolve().parent  # the gamfunc under test, installed or not
functorch = torch._C._functorch


@pytest.fixture(autouse=True)
def fresh_log(monkeypatch):
    """Each test sees every door not yet fallen back, and the loader of decompositions not yet run."""
    # the set lives where it is read: in base, by fall_back, which every door calls
    monkeypatch.setattr(base, "_fallen_back", set())
    _compat.load_jvp_decompositions.cache_clear()
    _compat.nonfinite_check_runs.cache_clear()
    yield
    _compat.load_jvp_decompositions.cache_clear()
    _compat.nonfinite_check_runs.cache_clear()


def fell_back(caplog, name: str) -> None:
    """Exactly one logged line, of the logger "gamfunc", says that ``name`` fell back."""
    lines = [
        r for r in caplog.records if r.name == "gamfunc" and f"; {name} falls back" in r.message
    ]
    assert len(lines) == 1, [r.message for r in caplog.records]


def test_in_transform():
    x = torch.ones(3)
    assert not _compat.in_transform()
    assert torch.func.vmap(lambda t: torch.tensor(_compat.in_transform()))(x).all()
    seen = []
    torch.func.grad(lambda t: seen.append(_compat.in_transform()) or t.sum())(x)
    assert seen == [True]


def test_in_transform_falls_back_to_true(monkeypatch, caplog):
    monkeypatch.delattr(functorch, "maybe_current_level")
    assert _compat.in_transform() and _compat.in_transform()
    fell_back(caplog, "in_transform")


def test_batched():
    x = torch.ones(2, 3)
    assert not _compat.batched([x]) and not _compat.batched_at_any_level(x)
    seen = []

    def record(t):
        seen.append((_compat.batched([1.0, t]), _compat.batched_at_any_level(t)))
        return t

    torch.func.vmap(record)(x)
    # a gradient taken inside vmap: batched under a grad-tracking wrapper, not at the outermost level
    torch.func.vmap(torch.func.grad(lambda t: record(t).sum()))(x)
    assert seen == [(True, True), (False, True)]


@pytest.mark.parametrize(
    ("name", "removed"),
    [
        ("batched", "is_batchedtensor"),
        ("batched_at_any_level", "get_unwrapped"),
        ("batched_at_any_level", "is_functorch_wrapped_tensor"),
    ],
)
def test_batched_falls_back_to_true(monkeypatch, caplog, name, removed):
    monkeypatch.delattr(functorch, removed)
    if name == "batched":  # looked up at import: what a torch without it finds
        monkeypatch.setattr(functorch_doors, "_IS_BATCHED", None)
    assert getattr(_compat, name)([torch.ones(2)] if name == "batched" else torch.ones(2))
    fell_back(caplog, name)


@pytest.mark.skipif(
    not functorch_doors._TRACES_LAYER_DEPTH, reason="traced by Dynamo from torch 2.14"
)
def test_traced_outside_transforms():
    def flagged(t):  # the answer, as a factor the graph keeps
        return t * (2.0 if _compat.traced_outside_transforms() else 3.0)

    def f(x):
        return (
            flagged(x),
            torch.func.vmap(flagged)(x),
            torch.func.grad(lambda t: flagged(t).sum())(x),
            torch.func.jvp(flagged, (x,), (x,))[1],
        )

    x = torch.ones(2, 3)
    assert [float(o[0, 0]) for o in f(x)] == [3.0] * 4  # eager: never
    compiled = torch.compile(f, fullgraph=True, backend="eager")
    assert [float(o[0, 0]) for o in compiled(x)] == [2.0, 3.0, 3.0, 3.0]


def test_traced_outside_transforms_falls_back_to_false(monkeypatch, caplog):
    monkeypatch.setattr(functorch_doors, "_LAYER_DEPTH", None)  # looked up at import
    monkeypatch.setattr(functorch_doors, "_TRACES_LAYER_DEPTH", True)  # a torch that would trace it
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not _compat.traced_outside_transforms()
    fell_back(caplog, "traced_outside_transforms")


def test_in_forward_ad():
    x = torch.ones(3)
    seen = []

    def record(t):
        seen.append(_compat.in_forward_ad())
        return t * 2

    record(x)
    torch.func.jvp(record, (x,), (x,))
    torch.func.vmap(record)(x)
    torch.func.grad(lambda t: record(t).sum())(x)
    assert seen == [False, True, False, False]


@pytest.mark.parametrize("removed", ["get_interpreter_stack", "TransformType"])
def test_in_forward_ad_falls_back_to_true(monkeypatch, caplog, removed):
    monkeypatch.delattr(functorch, removed)
    assert _compat.in_forward_ad()
    fell_back(caplog, "in_forward_ad")


MODES = ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]


@pytest.mark.parametrize("mode", MODES)
def test_mode_options_are_inductors(mode):
    assert _compat.mode_options(mode) == torch._inductor.list_mode_options(mode)
    with pytest.raises(ValueError, match="mode"):
        _compat.mode_options("fastest")


def test_mode_options_fall_back_to_the_documented_modes(monkeypatch, caplog):
    inductor = {m: torch._inductor.list_mode_options(m) for m in MODES}
    monkeypatch.delattr(torch._inductor, "list_mode_options")
    # where the options of this torch and the written-out ones differ, one of them has moved on
    assert {m: _compat.mode_options(m) for m in MODES} == inductor
    with pytest.raises(ValueError, match="mode"):
        _compat.mode_options("fastest")
    fell_back(caplog, "mode_options")


def test_custom_graph_pass_runs_the_function_and_keys_the_cache_by_its_file():
    CustomGraphPass = pytest.importorskip("torch._inductor.custom_graph_pass").CustomGraphPass

    graphs = []
    p = _compat.custom_graph_pass(graphs.append, __file__)
    assert isinstance(p, CustomGraphPass)
    g = torch.fx.Graph()
    p(g)
    assert graphs == [g]
    assert p.uuid() == _compat.custom_graph_pass(print, __file__).uuid()
    assert p.uuid() != _compat.custom_graph_pass(print, _compat.__file__).uuid()


def test_graph_sharing_is_off_where_inductor_takes_no_custom_pass(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "torch._inductor.custom_graph_pass", None)
    assert _compat.custom_graph_pass(print, __file__) is None
    fell_back(caplog, "custom_graph_pass")
    sharing = importlib.import_module("gamfunc.graph_sharing")
    try:
        assert importlib.reload(sharing).share_equal_work_pass() is None
        options = compiled_options(monkeypatch, importlib.reload(gamfunc.compile))
        assert "post_grad_custom_pre_pass" not in options
    finally:
        monkeypatch.undo()
        importlib.reload(sharing)
        importlib.reload(gamfunc.compile)
    assert sharing.share_equal_work_pass() is not None
    options = compiled_options(pytest.MonkeyPatch(), gamfunc.compile)
    assert options["post_grad_custom_pre_pass"] is sharing.share_equal_work_pass()


def compiled_options(monkeypatch, compile_module) -> dict:
    """The inductor options ``compile_with`` hands to ``torch.compile``."""
    seen = {}
    with monkeypatch.context() as m:
        m.setattr(torch, "compile", lambda fn, **kw: seen.update(kw) or fn)
        compile_module.compile_with(True, None, {})(print)
    return seen["options"]


def test_mutates():
    aten = torch.ops.aten
    assert _compat.mutates(aten.add_.Tensor) and _compat.mutates(aten.copy_.default)
    assert not _compat.mutates(aten.add.Tensor) and not _compat.mutates(operator.getitem)


def test_mutates_falls_back_to_true(monkeypatch, caplog):
    op = torch.ops.aten.mul.Tensor
    monkeypatch.delattr(op, "_schema")
    assert _compat.mutates(op)
    assert not _compat.mutates(operator.getitem)
    fell_back(caplog, "mutates")


def test_load_jvp_decompositions_runs_torchs_loader_once_and_silences_its_warning(monkeypatch):
    import warnings

    calls = []

    def load():
        calls.append(1)
        warnings.warn("torch.jit.script is deprecated", FutureWarning, stacklevel=1)

    monkeypatch.setattr(torch.autograd.forward_ad, "_maybe_load_decompositions", load)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _compat.load_jvp_decompositions()
        _compat.load_jvp_decompositions()
    assert calls == [1]


def test_load_jvp_decompositions_falls_back_to_the_first_jvp(monkeypatch, caplog):
    # torch's own jvp calls the loader too, so nothing here runs a jvp while it is away
    monkeypatch.delattr(torch.autograd.forward_ad, "_maybe_load_decompositions")
    assert _compat.load_jvp_decompositions() is None
    fell_back(caplog, "load_jvp_decompositions")


def test_flag_nonfinite_raises_its_flag_and_keeps_every_value():
    assert _compat.nonfinite_check_runs("cpu")
    t = torch.tensor([1.0, -0.0, 3.0])
    found = torch.zeros(1)
    _compat.flag_nonfinite([t, t[:1]], found)
    assert found.item() == 0 and torch.equal(t, torch.tensor([1.0, -0.0, 3.0]))
    _compat.flag_nonfinite([torch.tensor([float("inf")]), t], found)
    assert found.item() == 1


def test_the_nonfinite_check_falls_back_to_the_norms_of_the_guard(monkeypatch, caplog):
    # Without GradScaler's kernel the step's guard takes _foreach_norm: the same skips, the same step.
    from gamfunc.training import guard

    monkeypatch.delattr(torch, "_amp_foreach_non_finite_check_and_unscale_")
    assert not _compat.nonfinite_check_runs("cpu")
    fell_back(caplog, "flag_nonfinite")
    params = {"w": torch.ones(3), "b": torch.zeros(2, dtype=torch.float64)}
    with torch.no_grad():
        assert bool(guard.all_finite(params))
        assert not bool(guard.all_finite({**params, "b": torch.tensor([0.0, float("nan")])}))


def test_overlaps():
    assert _compat.overlaps(torch.zeros(3)[:, None].expand(3, 2))
    assert not _compat.overlaps(torch.zeros(3, 2).t())


def test_overlaps_falls_back_to_true(monkeypatch, caplog):
    monkeypatch.delattr(torch, "_debug_has_internal_overlap")
    assert _compat.overlaps(torch.zeros(3, 2).t())
    fell_back(caplog, "overlaps")


def test_every_fallback_at_once_gives_the_same_gam_direction(monkeypatch, caplog):
    params, batch = mlp_params(), mlp_batch()
    est = gamfunc.gam(0.05, 0.1)
    want, _ = est(params, batch, mlp_loss)
    for name in ("maybe_current_level", "is_batchedtensor", "get_interpreter_stack"):
        monkeypatch.delattr(functorch, name)
    caplog.set_level(logging.WARNING, logger="gamfunc")
    got, _ = est(params, batch, mlp_loss)
    assert rel_err(flatten(got), flatten(want)) < 1e-14
    for name in ("in_transform", "batched_at_any_level"):
        fell_back(caplog, name)


# A private torch name: ``torch._x``, ``torch.a.b._x`` or ``from torch... import _x``; the two that
# stay where they are used are the foreach kernels and the pytree (see gamfunc._compat).
PRIVATE = re.compile(r"(?<![\w.])torch(\.\w+)*\._(?!foreach)[A-Za-z]|from torch[\w.]* import _\w")
ALLOWED = re.compile(r"torch\.utils\._pytree|from torch\.utils import _pytree")


def test_no_module_but_the_door_names_a_private_torch_api():
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{i}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] != "_compat"
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if PRIVATE.search(ALLOWED.sub("", line))
    ]
    assert found == []


def test_the_pattern_finds_private_names():
    for line in (
        "torch._C._functorch.maybe_current_level()",
        "from torch._inductor.custom_graph_pass import CustomGraphPass",
        "torch.autograd.forward_ad._maybe_load_decompositions",
        "from torch.nn.modules.batchnorm import _BatchNorm",
    ):
        assert PRIVATE.search(ALLOWED.sub("", line)), line
    for line in ("torch._foreach_add(a, b)", "torch.utils._pytree.tree_map", "gamfunc._compat"):
        assert not PRIVATE.search(ALLOWED.sub("", line)), line


def test_grouping_falls_back_to_a_python_loop(monkeypatch, caplog):
    """Without torch.optim's grouping in C++, gamfunc.tree groups tensors itself: the same groups."""
    import torch.utils._foreach_utils as foreach_utils

    from gamfunc import tree

    ts = [
        torch.zeros(2),
        torch.zeros(3, dtype=torch.float64),
        torch.ones(2),
        torch.zeros(1, dtype=torch.int64),
    ]
    want = {
        k: ([list(m) for m in members], list(at)) for k, (members, at) in tree.grouped(ts).items()
    }
    monkeypatch.delattr(foreach_utils, "_group_tensors_by_device_and_dtype")
    got = {
        k: ([list(m) for m in members], list(at)) for k, (members, at) in tree.grouped(ts).items()
    }
    fell_back(caplog, "group_by_device_and_dtype")
    assert got.keys() == want.keys()
    for k in want:
        assert got[k][1] == want[k][1]
        assert all(a is b for a, b in zip(got[k][0][0], want[k][0][0], strict=True))
    copies = tree.copies(ts)
    assert all(torch.equal(a, b) and a is not b for a, b in zip(copies, ts, strict=True))


def refused_calls(step, params, state, batch, **patch) -> set[str]:
    """The calls of ``step``'s compiled passes that AOTAutograd's cache refuses, under inductor's
    options ``patch``: the graphs are Dynamo's, handed to a backend that asks the cache's check."""
    autograd_cache = pytest.importorskip("torch._functorch._aot_autograd.autograd_cache")
    refused = set()

    def backend(gm, inputs):
        for node in gm.graph.nodes:
            try:
                autograd_cache.check_node_safe(node)
            except autograd_cache.BypassAOTAutogradCache:
                refused.add(f"{node.target.__module__}.{node.target.__name__}")
        return gm.forward

    torch._dynamo.reset()
    with torch._inductor.config.patch(**patch):
        step.compile(scope="pass", backend=backend)(params, state, batch)
    torch._dynamo.reset()
    return refused


@pytest.mark.slow
def test_cacheable_state_calls_let_the_cache_keep_every_h_v_pass():
    options = _compat.cacheable_state_calls()
    names = options["unsafe_marked_cacheable_functions"]
    assert all(v == str(torch.__version__) for v in names.values())
    params, batch = mlp_params(torch.float32), mlp_batch(dtype=torch.float32)
    bf16 = gamfunc.precision.bf16(mlp_loss)
    for loss_fn, hvp in ((mlp_loss, "exact"), (mlp_loss, "reverse"), (bf16, "exact")):
        step = gamfunc.make_step(
            gamfunc.gam(0.05, 0.1, hvp=getattr(gamfunc.hvps, hvp)()), gamfunc.sgd(0.1), loss_fn
        )
        state = step.init(params)
        if hvp == "exact" and loss_fn is mlp_loss:  # without the option, the cache refuses it
            without = refused_calls(step, params, state, batch)
            assert "torch.nn.attention._sdpa_kernel" in without
            assert without <= set(names), without - set(names)
        assert refused_calls(step, params, state, batch, **options) == set()


def test_cacheable_state_calls_fall_back_to_none(monkeypatch, caplog):
    monkeypatch.delattr(torch._inductor.config, "unsafe_marked_cacheable_functions")
    assert _compat.cacheable_state_calls() == {}
    fell_back(caplog, "cacheable_state_calls")
    assert "unsafe_marked_cacheable_functions" not in compiled_options(monkeypatch, gamfunc.compile)


def test_compile_keeps_the_users_own_cacheable_functions(monkeypatch):
    seen = {}
    mine = {"unsafe_marked_cacheable_functions": {"torch.ops.mine.f": "1"}}
    with monkeypatch.context() as m:
        m.setattr(torch, "compile", lambda fn, **kw: seen.update(kw) or fn)
        gamfunc.compile.compile_with(True, None, {"options": mine})(print)
    names = seen["options"]["unsafe_marked_cacheable_functions"]
    want = _compat.cacheable_state_calls()["unsafe_marked_cacheable_functions"]
    assert names == {**want, "torch.ops.mine.f": "1"}
