"""The one door to torch's private APIs: every use of one in gamfunc is a function here.

Each function reaches the internal it needs when it is called (`batched`, which Dynamo traces once
per tensor of every tree operation of a compiled step, finds it once, at import). Where torch has no
such internal (a release that renamed or moved it: ``AttributeError`` or ``ImportError``), it takes
the public path instead and says so in one logged line of ``logging.getLogger("gamfunc")``, once per
process and function. The public paths give the same numbers; what they may cost is speed or memory:

* `in_transform`, `batched`, `batched_at_any_level`, `in_forward_ad`
  (``torch._C._functorch``): without them gamfunc cannot tell whether it runs inside a
  ``torch.func`` transform, and assumes it does. Then gradients come from ``torch.func.grad``
  rather than ``torch.autograd.grad`` (more memory), tree math runs per tensor rather than through
  the ``torch._foreach_*`` kernels, compiled passes run eagerly, BatchNorm under autocast computes
  in float32, and the metrics' guard lets every input through.
* `mode_options` (``torch._inductor.list_mode_options``): the options of ``torch.compile``'s
  documented modes, written out.
* `cacheable_state_calls` (``torch._inductor.config.unsafe_marked_cacheable_functions``, and the
  names of the private functions by which Dynamo writes the attention kernel, forward-mode AD's
  levels and autocast into a graph): without it a compiled exact or reverse H·v pass skips
  AOTAutograd's cache, and a warm compile traces it again.
* `custom_graph_pass` (``torch._inductor.custom_graph_pass``): without it
  `gamfunc.graph_sharing` is off, and a compiled exact H·v recomputes ∇L.
* `mutates` (``OpOverload._schema``): without it every aten operation counts as one that
  mutates its inputs, so `gamfunc.graph_sharing` merges nothing.
* `load_jvp_decompositions` (``torch.autograd.forward_ad._maybe_load_decompositions``):
  without it the first ``torch.func.jvp`` loads them itself, and torch's own warning may show.
* `flag_nonfinite` and `nonfinite_check_runs` (``torch._amp_foreach_non_finite_check_and_unscale_``,
  the check of ``torch.amp.GradScaler``), `overlaps` (``torch._debug_has_internal_overlap``): without
  them the step's non-finite guard checks its tensors by one ``_foreach_norm`` per group and a stack
  of their maxima, more host time per tensor.
* `group_by_device_and_dtype` (``torch.utils._foreach_utils._group_tensors_by_device_and_dtype``,
  the grouping of ``torch.optim``'s foreach steps, in C++): without it `gamfunc.tree.grouped`
  groups tensors by a Python loop, more host time per tensor.

Two private names stay where they are used, as the rest of the ecosystem uses them:
``torch._foreach_*`` (the multi-tensor kernels: the documented fast path of ``torch.optim``'s
``foreach=True``, with public tests and no public alias) and ``torch.utils._pytree`` (the pytree of
``torch.func``, ``torch.compile`` and torch's optimisers alike). ``tests/library/test_compat.py`` checks
that no other module of gamfunc names a private torch API.
"""

from __future__ import annotations

import functools
import logging
import sys
import warnings
from collections.abc import Callable

import torch

__all__ = [
    "batched",
    "batched_at_any_level",
    "cacheable_state_calls",
    "check_uncompiled",
    "custom_graph_pass",
    "flag_nonfinite",
    "group_by_device_and_dtype",
    "in_forward_ad",
    "in_transform",
    "load_jvp_decompositions",
    "mode_options",
    "mutates",
    "nonfinite_check_runs",
    "overlaps",
]

log = logging.getLogger("gamfunc")
_fallen_back: set[str] = set()


def _fall_back(name: str, internal: str, public: str) -> None:
    """One logged line per process and door: ``name`` takes ``public`` since torch lacks ``internal``."""
    if name in _fallen_back:
        return
    _fallen_back.add(name)
    log.warning(
        "gamfunc: this torch (%s) has no %s; %s falls back to %s",
        torch.__version__,
        internal,
        name,
        public,
    )


def _functorch(attr: str):
    """``torch._C._functorch.<attr>``, or None where torch has no such function."""
    return getattr(getattr(torch._C, "_functorch", None), attr, None)


def check_uncompiled(model, where: str, instead: str) -> None:
    """One line, unless ``model`` is not the wrapper that ``torch.compile(module)`` returns.

    The passes of a step run the module under ``torch.func``'s transforms (``grad``, ``jvp``),
    where a compiled module's frames do not match the guards of its first compile: Dynamo
    recompiles and falls back to eager for every frame. The first step pays a whole compile, the
    others run at the eager speed, and nothing says so. gamfunc compiles the step instead
    (``step.compile()``, the facade's ``compile=True``) with the module itself, which
    ``torch.compile(module)`` keeps as ``_orig_mod`` and shares its tensors with.

    Args:
        model: what was given as the model.
        where: the call as the user wrote it, e.g. ``"GAM(model, ...)"``.
        instead: what to write instead, e.g. ``"GAM(model._orig_mod, ..., compile=True)"``.

    Raises:
        TypeError: ``model`` is ``torch.compile(module)`` (Dynamo's ``OptimizedModule``).

    Example:
        >>> import torch
        >>> from gamfunc.nn import check_uncompiled
        >>> check_uncompiled(torch.nn.Linear(2, 1), "f(model)", "f(model._orig_mod)")  # a module: nothing
    """
    # Dynamo's OptimizedModule, which torch does not name publicly; where Dynamo is not loaded,
    # no module has been compiled (and the check does not load it)
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    if eval_frame is None or not isinstance(model, eval_frame.OptimizedModule):
        return
    raise TypeError(
        f"{where}: model is torch.compile(module), which runs eagerly under torch.func's "
        f"transforms after a first compile (Dynamo falls back): write {instead}, the module "
        "itself with gamfunc compiling the step"
    )


def in_transform() -> bool:
    """Whether the caller runs inside a ``torch.func`` transform (grad, vjp, jvp, vmap).

    Returns:
        True inside one, and where torch cannot say (the paths that work inside a transform work
            outside too).
    """
    level = _functorch("maybe_current_level")
    if level is None:
        _fall_back("in_transform", "torch._C._functorch.maybe_current_level", "True")
        return True
    return level() is not None


TORCH_VERSION = tuple(int(x) for x in torch.__version__.split(".")[:2])
# torch.compile traces torch._C._functorch.is_batchedtensor from torch 2.5 on; before, it stops the
# graph ("torch.* op returned non-Tensor bool").
_TRACES_IS_BATCHED = TORCH_VERSION >= (2, 5)
# Dynamo folds torch._C._functorch.get_dynamic_layer_stack_depth to a constant, with a guard, and
# enters the torch.func transforms it traces on that stack (torch 2.14); torch 2.11's Dynamo skips
# the function ("marked as skipped"), and neither traces maybe_current_level.
_TRACES_LAYER_DEPTH = TORCH_VERSION >= (2, 14)
_LAYER_DEPTH = _functorch("get_dynamic_layer_stack_depth")


def traced_outside_transforms() -> bool:
    """Whether ``torch.compile`` traces the caller outside every ``torch.func`` transform, where no
    tensor is batched and no question need be asked of each one.

    Returns:
        True only while tracing, outside every transform, on a torch whose tracer can say so; False
            where torch cannot say (the tensors are then asked one by one).
    """
    if not (_TRACES_LAYER_DEPTH and torch.compiler.is_compiling()):
        return False
    if _LAYER_DEPTH is None:
        _fall_back(
            "traced_outside_transforms",
            "torch._C._functorch.get_dynamic_layer_stack_depth",
            "False",
        )
        return False
    return _LAYER_DEPTH() == 0


_IS_BATCHED = _functorch("is_batchedtensor")


def batched(tensors) -> bool:
    """Whether any of ``tensors`` is batched by ``torch.func.vmap`` at its outermost level (values
    that are not tensors are passed over), asked of the tensors at once: ``torch.compile`` traces
    the question once per tensor of every tree operation in a step.

    Returns:
        True where one is, and where torch cannot say; False while ``torch.compile`` traces on
            torch < 2.5, which cannot trace the question (there a vmapped step cannot be compiled
            whole).
    """
    if not _TRACES_IS_BATCHED and torch.compiler.is_compiling():
        return False
    if _IS_BATCHED is None:
        _fall_back("batched", "torch._C._functorch.is_batchedtensor", "True")
        return True
    for t in tensors:  # noqa: SIM110 (traced, a generator costs Dynamo a third more steps)
        if isinstance(t, torch.Tensor) and _IS_BATCHED(t):
            return True
    return False


def batched_at_any_level(t) -> bool:
    """Whether the tensor ``t`` is batched at any level of the transforms that wrap it (a gradient
    taken inside ``vmap`` is a batched tensor under a grad-tracking wrapper).

    Returns:
        True for such a tensor, and where torch cannot say.
    """
    wrapped, is_batched, unwrap = (
        _functorch(a) for a in ("is_functorch_wrapped_tensor", "is_batchedtensor", "get_unwrapped")
    )
    if wrapped is None or is_batched is None or unwrap is None:
        _fall_back("batched_at_any_level", "torch._C._functorch's tensor wrappers", "True")
        return True
    while wrapped(t):
        if is_batched(t):
            return True
        t = unwrap(t)
    return False


def in_forward_ad() -> bool:
    """Whether a ``torch.func.jvp`` (forward-mode AD) transform is active.

    Returns:
        True inside one, and where torch cannot say.
    """
    stack_fn, kinds = _functorch("get_interpreter_stack"), _functorch("TransformType")
    jvp = getattr(kinds, "Jvp", None)
    if stack_fn is None or jvp is None:
        _fall_back("in_forward_ad", "torch._C._functorch.get_interpreter_stack", "True")
        return True
    return any(i.key() == jvp for i in stack_fn() or ())


# torch.compile's modes as its documentation describes them: CUDA graphs, autotuning, both.
_MODES = {
    "default": {},
    "reduce-overhead": {"triton.cudagraphs": True},
    "max-autotune-no-cudagraphs": {"max_autotune": True, "coordinate_descent_tuning": True},
    "max-autotune": {
        "max_autotune": True,
        "triton.cudagraphs": True,
        "coordinate_descent_tuning": True,
    },
}


def mode_options(mode: str) -> dict:
    """The inductor options that ``torch.compile(mode=mode)`` sets, so that a caller can add its own
    (``torch.compile`` takes a mode or options, not both).

    Args:
        mode: a mode of ``torch.compile``.

    Returns:
        A new dict of inductor options.

    Raises:
        ValueError: ``mode`` is not a mode of ``torch.compile``.
    """
    try:
        list_mode_options = torch._inductor.list_mode_options
    except (AttributeError, ImportError):
        _fall_back("mode_options", "torch._inductor.list_mode_options", "torch.compile's modes")
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {tuple(_MODES)}; got {mode!r}") from None
        return dict(_MODES[mode])
    try:
        return dict(list_mode_options(mode))
    except RuntimeError as e:
        raise ValueError(f"mode must be a mode of torch.compile; got {mode!r} ({e})") from None


# The calls by which Dynamo writes into a graph the state that a pass sets around its operations: the
# attention kernel (`gamfunc.hvps.math_attention`), forward-mode AD's levels (``torch.func.jvp``)
# and autocast (`gamfunc.precision.bf16`). Module, then the names of its functions.
_STATE_CALLS = (
    ("torch.nn.attention", ("_backend_from_string", "_sdpa_kernel")),
    (
        "torch._functorch.predispatch",
        (
            "_jvp_increment_nesting",
            "_jvp_decrement_nesting",
            "_enter_dual_level",
            "_exit_dual_level",
        ),
    ),
    ("torch.amp.autocast_mode", ("_enter_autocast", "_exit_autocast")),
)


def cacheable_state_calls() -> dict:
    """The inductor options under which AOTAutograd's cache keeps the graph of an H·v pass.

    Dynamo writes the state that an H·v pass sets around its operations into the graph, as calls
    with constant arguments: the attention kernel (``sdpa_kernel``, which
    `gamfunc.hvps.math_attention` enters around every exact and reverse H·v), the levels of
    ``torch.func.jvp`` (forward-over-reverse H·v) and autocast. AOTAutograd's cache refuses a graph
    that calls a function it does not know, so without this it traces such a graph again in every
    process: the larger part of a warm compile of exact GAM. What each of these calls does is set
    by its arguments, which the graph, and so the cache's key, holds (the reasoning by which torch
    admits autocast's own calls from 2.12 on): naming them in inductor's
    ``unsafe_marked_cacheable_functions`` (keyed by torch's version) lets the cache keep the graph.
    Nothing else changes: a graph that is cached holds the same operations.

    Returns:
        ``{"unsafe_marked_cacheable_functions": {name: torch version}}`` for the functions this torch
            has, or ``{}`` where it has no such option (its cache then skips these graphs).
    """
    import importlib

    try:
        import torch._inductor.config as inductor_config

        inductor_config.unsafe_marked_cacheable_functions  # noqa: B018 - on this torch?
    except (AttributeError, ImportError):
        _fall_back(
            "cacheable_state_calls",
            "torch._inductor.config.unsafe_marked_cacheable_functions",
            "AOTAutograd's cache skipping H·v passes",
        )
        return {}
    names = {}
    for module, functions in _STATE_CALLS:
        try:
            found = importlib.import_module(module)
        except ImportError:
            continue
        for name in functions:
            if (fn := getattr(found, name, None)) is not None:
                names[f"{fn.__module__}.{fn.__name__}"] = str(torch.__version__)
    return {"unsafe_marked_cacheable_functions": names}


def custom_graph_pass(fn: Callable, source: str):
    """``fn(graph)`` as a pass that inductor's ``post_grad_custom_pre_pass`` option takes and its
    FX-graph cache can key (by the contents of the file ``source``).

    Args:
        fn: the pass, ``fn(graph: torch.fx.Graph) -> None``, changing the graph in place.
        source: the file that defines ``fn``.

    Returns:
        The pass, or None where torch has no ``CustomGraphPass`` (then no pass is installed).
    """
    try:
        from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files
    except ImportError:
        _fall_back(
            "custom_graph_pass", "torch._inductor.custom_graph_pass", "no pass (graph sharing off)"
        )
        return None

    class Pass(CustomGraphPass):
        def __call__(self, graph) -> None:
            fn(graph)

        def uuid(self):
            return get_hash_for_files((source,))

    return Pass()


def mutates(op) -> bool:
    """Whether the operation ``op`` (an fx node's target) may mutate its inputs, by its schema.

    Returns:
        For an aten or prims operation, whether its schema is mutable, and True where torch cannot
            say; False for anything else (``operator.getitem``, Python functions).
    """
    if not isinstance(op, type(torch.ops.aten.add.Tensor)):
        return False
    schema = getattr(op, "_schema", None)
    if schema is None:
        _fall_back("mutates", "OpOverload._schema", "True")
        return True
    return schema.is_mutable


@functools.cache
def load_jvp_decompositions() -> None:
    """Load torch's forward-mode decompositions now, which the first ``torch.func.jvp`` of a process
    loads otherwise, with the one warning that gives silenced: on recent torch it calls
    ``torch.jit.script``, which warns ``torch.jit.script is deprecated`` (a ``DeprecationWarning`` on
    torch 2.13, a ``FutureWarning`` from 2.14) about code that is torch's, not the user's. Where torch
    has no such loader, the first jvp loads them."""
    load = getattr(torch.autograd.forward_ad, "_maybe_load_decompositions", None)
    if load is None:
        _fall_back(
            "load_jvp_decompositions",
            "torch.autograd.forward_ad._maybe_load_decompositions",
            "the first jvp's own loading",
        )
        return
    with warnings.catch_warnings():
        for category in (DeprecationWarning, FutureWarning):
            warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*", category=category)
        load()


def flag_nonfinite(tensors: list, found: torch.Tensor) -> None:
    """Set ``found`` (a 1-element float32 tensor on the device of ``tensors``) to 1 where any element
    of ``tensors`` (of one dtype and device, none two elements at one address) is inf or nan, leaving
    it as it is otherwise: ``torch.amp.GradScaler``'s check, one multi-tensor kernel, with an inverse
    scale of 1, so that each element it writes back is itself, bit for bit (a nan stays a nan). Call
    it only where `nonfinite_check_runs` says it runs."""
    one = torch.ones(1, dtype=torch.float32, device=found.device)
    torch._amp_foreach_non_finite_check_and_unscale_(tensors, found, one)


@functools.cache
def nonfinite_check_runs(device_type: str) -> bool:
    """Whether `flag_nonfinite` runs on ``device_type``: on CUDA, and on the CPU where this torch has
    a kernel for it; False where it has none there, or none at all."""
    if not hasattr(torch, "_amp_foreach_non_finite_check_and_unscale_"):
        _fall_back(
            "flag_nonfinite",
            "torch._amp_foreach_non_finite_check_and_unscale_",
            "one _foreach_norm per group",
        )
        return False
    try:
        flag_nonfinite([torch.ones(1, device=device_type)], torch.zeros(1, device=device_type))
    except (RuntimeError, NotImplementedError):
        return False
    return True


def overlaps(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` may sit at one address (an expanded tensor): True where torch
    cannot say."""
    check = getattr(torch, "_debug_has_internal_overlap", None)
    if check is None:
        _fall_back("overlaps", "torch._debug_has_internal_overlap", "True")
        return True
    return check(t) != 0


def group_by_device_and_dtype(lists: list[list]) -> dict | None:
    """``lists`` (of tensors, one length) grouped by the device and dtype of the first list's
    tensors, by ``torch.optim``'s own grouping in C++: ``(device, dtype) -> (lists, indices)``.
    None where this torch lacks it (the caller groups them itself)."""
    try:
        from torch.utils._foreach_utils import _group_tensors_by_device_and_dtype
    except ImportError:
        _fall_back(
            "group_by_device_and_dtype",
            "torch.utils._foreach_utils._group_tensors_by_device_and_dtype",
            "a Python loop",
        )
        return None
    return dict(_group_tensors_by_device_and_dtype(lists, with_indices=True))


@functools.cache
def dtensor_type() -> type | None:
    """``DTensor``, the tensor of ``fully_shard``'s parameters (``torch.distributed.tensor`` from
    torch 2.5, ``torch.distributed._tensor`` before), or None where torch has no distributed
    package."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        try:
            from torch.distributed._tensor import DTensor  # torch 2.4
        except ImportError:
            return None
    return DTensor


def local_pairs(dst: list, src: list) -> tuple[list, list]:
    """``dst`` and ``src`` with each pair of DTensors of one layout replaced by their local shards,
    which an in-place kernel without a sharding rule (``_foreach_copy_``) then writes; other
    tensors as they are."""
    cls = dtensor_type()
    if cls is None or not any(isinstance(t, cls) for t in dst):
        return dst, src
    local = lambda d, s: (  # noqa: E731
        isinstance(d, cls) and isinstance(s, cls) and d.placements == s.placements  # type: ignore[attr-defined]
    )
    pairs = [
        (d.to_local(), s.to_local()) if local(d, s) else (d, s)
        for d, s in zip(dst, src, strict=True)
    ]
    return [d for d, _ in pairs], [s for _, s in pairs]


def any_dtensor(tensors) -> bool:
    """Whether any of ``tensors`` is a DTensor (a ``fully_shard`` model's parameter, its gradient,
    its optimiser state)."""
    cls = dtensor_type()
    return cls is not None and any(isinstance(t, cls) for t in tensors)


@functools.cache
def _hook_types() -> tuple[tuple[type, str], ...]:
    """The module types that carry distributed hooks around their autograd, with their names."""
    found: list[tuple[type, str]] = [
        (torch.nn.parallel.DistributedDataParallel, "DistributedDataParallel")
    ]
    fsdp2: type | None
    try:
        from torch.distributed.fsdp import FSDPModule as fsdp2  # torch 2.6
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import FSDPModule as fsdp2  # torch 2.4, 2.5
        except ImportError:
            fsdp2 = None
    if fsdp2 is not None:
        found.append((fsdp2, "fully_shard (FSDP2)"))
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:
        pass
    else:
        found.append((FullyShardedDataParallel, "FullyShardedDataParallel"))
    return tuple(found)


def distributed_hooks(model) -> str | None:
    """The wrapper whose hooks run around ``model``'s autograd (``fully_shard``'s all-gathers and
    reduce-scatters, ``DistributedDataParallel``'s all-reduces), by name, or None."""
    if not torch.distributed.is_available():
        return None
    types = _hook_types()
    for m in model.modules():
        for cls, name in types:
            if isinstance(m, cls):
                return name
    return None


def check_unhooked(model, where: str) -> None:
    """One line, unless ``model`` carries no distributed hooks (`distributed_hooks`).

    ``torch.func.functional_call`` runs a module with other tensors in its parameters' place and
    differentiates them by ``torch.func``, outside the hooks of ``fully_shard`` and
    ``DistributedDataParallel``, which act on the module's own parameters in its autograd: the
    gradients come out wrong (under ``fully_shard``, by 0.12 on a small MLP) and nothing says so.

    Args:
        model: the module given.
        where: the call as the user wrote it, e.g. ``"functionalize(model)"``.

    Raises:
        TypeError: ``model`` or a submodule of it carries such hooks.
    """
    hooks = distributed_hooks(model)
    if hooks is None:
        return
    raise TypeError(
        f"{where}: model carries {hooks}'s hooks, which torch.func's functional_call bypasses "
        "(its gradients would be wrong, without an error): train it with gamfunc.torch_optim "
        "(GAM(model, ..., hvp='fd'), SAM(model, ...)), which runs each pass through the module's "
        "own autograd, or functionalize the unwrapped module with gamfunc.distributed"
    )
