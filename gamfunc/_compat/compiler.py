"""The doors into ``torch.compile``'s internals: inductor's options and passes, Dynamo's compiled
module.

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
* `check_uncompiled` (Dynamo's ``OptimizedModule``, looked up only where Dynamo is loaded).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch

from gamfunc._compat.base import fall_back

__all__ = [
    "cacheable_state_calls",
    "check_uncompiled",
    "custom_graph_pass",
    "mode_options",
    "mutates",
]


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
        fall_back("mode_options", "torch._inductor.list_mode_options", "torch.compile's modes")
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
        fall_back(
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
        fall_back(
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
        fall_back("mutates", "OpOverload._schema", "True")
        return True
    return schema.is_mutable
