"""The facade's argument checks, each failing in one line that says what to change."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

from gamfunc.nn import check_uncompiled
from gamfunc.optim import Transform
from gamfunc.wrappers.precision import PRECISIONS

__all__ = [
    "COMPILE",
    "check_arguments",
    "check_batch",
    "check_capturable",
    "check_model",
    "check_options",
    "step_arguments",
]

# What compile= takes: False, True (the estimator's passes), or the scope by name.
COMPILE = (False, True, "pass", "step")


def check_model(model, cls: str = "GAM") -> None:
    """A one-line TypeError unless ``model`` is an ``nn.Module`` (its parameters are not) and not
    ``torch.compile(module)``, whose compiled forward torch.func's transforms run eagerly
    ([`gamfunc.nn.check_uncompiled`][gamfunc._compat.compiler.check_uncompiled]).

    Args:
        model: the facade's first argument.
        cls: the facade's class name, as the user wrote it (``GAM``, ``SAM``...).

    Raises:
        TypeError: as said.
    """
    if isinstance(model, nn.Module):
        check_uncompiled(model, f"{cls}(model, ...)", f"{cls}(model._orig_mod, ..., compile=True)")
        return
    if isinstance(model, Iterable) and not isinstance(model, str | bytes | dict):
        raise TypeError(
            "the first argument must be the model itself, not its parameters: write "
            f"{cls}(model, ...), not {cls}(model.parameters(), ...)"
        )
    raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")


def check_options(cls: str, optimizer, base_optimizer, base_kwargs: dict) -> None:
    """One clear error, naming ``cls``, for a missing base optimiser, or keyword arguments that
    belong to an optimiser already built.

    Raises:
        TypeError: as said.
    """
    opt = optimizer if optimizer is not None else base_optimizer
    example = f"{cls}(model, torch.optim.SGD, lr=0.1, momentum=0.9, ...)"
    if opt is None:
        raise TypeError(
            f"{cls}() needs a base optimiser as its second argument, e.g. {example}, "
            f"{cls}(model, gamfunc.sgd(lr=0.1), ...) or base_optimizer="
        )
    extra = list(base_kwargs)
    if extra and isinstance(opt, Transform | torch.optim.Optimizer):
        raise TypeError(
            f"{cls}() takes no {extra[0]}=: it belongs to the base optimiser; give it to the "
            f"optimiser, or pass the optimiser's class with it, e.g. {example}"
        )


def check_arguments(criterion, compile, compile_options, accumulate, precision) -> None:
    """The facade's options of the loss and of compiling.

    Raises:
        TypeError: ``criterion`` is not callable, ``compile_options`` not a dict.
        ValueError: ``compile`` is none of `COMPILE`, ``compile_options`` come without
            ``compile``, ``accumulate`` < 1, or ``precision`` is unknown.
    """
    if not callable(criterion):
        raise TypeError(
            f"criterion must be callable(outputs, targets); got {type(criterion).__name__}"
        )
    if not any(compile is c or (isinstance(c, str) and compile == c) for c in COMPILE):
        raise ValueError(
            f"compile must be False, True (the estimator's passes), 'pass' or 'step' (the whole "
            f"step); got {compile!r}"
        )
    if compile_options is not None and not isinstance(compile_options, dict):
        raise TypeError(f"compile_options must be a dict; got {type(compile_options).__name__}")
    if compile_options and not compile:
        raise ValueError("compile_options were given but compile=False")
    if isinstance(accumulate, bool) or not isinstance(accumulate, int) or accumulate < 1:
        raise ValueError(f"accumulate must be an integer >= 1; got {accumulate!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}; got {precision!r}")


def check_capturable(base: torch.optim.Optimizer | None, trainable: dict[str, Tensor]) -> None:
    """``cuda_graph=True`` needs the model on a CUDA device and a base optimiser whose step can be
    captured: one line saying what to change.

    Raises:
        ValueError: a base optimiser built with ``capturable=False``, or a model off the GPU.
    """
    if base is not None and any(g.get("capturable") is False for g in base.param_groups):
        raise ValueError(
            f"cuda_graph=True needs a base optimiser that can be captured: build it with "
            f"capturable=True, {type(base).__name__}(model.parameters(), ..., capturable=True)"
        )
    devices = {p.device.type for p in trainable.values()}
    if devices != {"cuda"}:
        raise ValueError(
            f"cuda_graph=True replays CUDA graphs: move the model to a CUDA device first (its "
            f"parameters are on {sorted(devices)})"
        )


def check_batch(batch) -> None:
    """A one-line ValueError unless ``batch`` is a pair ``(inputs, targets)``.

    Raises:
        ValueError: as said.
    """
    if not (isinstance(batch, tuple | list) and len(batch) == 2):
        raise ValueError(
            "batch must be a pair (inputs, targets) for criterion(model(inputs), targets); "
            f"got {type(batch).__name__}. For other batches build the optimiser with "
            "loss=lambda model, batch: ... (the loss of the model on the batch)."
        )


def step_arguments(closure, batch, *, any_batch: bool = False):
    """``(closure, batch)`` of a facade's ``step``: a non-callable first argument is the batch; a
    closure given with a batch is called once first (as ``torch.optim`` does). The batch must be a
    pair unless ``any_batch`` (an optimiser built with ``loss=``)."""
    if batch is None and closure is not None and not callable(closure):
        closure, batch = None, closure
    if batch is None and closure is None:
        raise TypeError(
            "step() was called without an argument: a flatness step computes its own gradients, "
            "so it needs the batch, step((inputs, targets)), or a closure returning the loss, "
            "step(closure)"
        )
    if batch is not None:
        if not any_batch:
            check_batch(batch)
        if closure is not None:
            with torch.enable_grad():
                closure()
        return None, batch
    return closure, None
