"""The facade's base optimiser: built from what the caller gave (an instance, a class and its
keyword arguments, a gamfunc optimiser or factory), and the model's parameters it holds."""

from __future__ import annotations

import inspect

import torch
from torch import Tensor

from gamfunc.optim import Transform

__all__ = ["built", "held", "is_torch", "torch_state_dict"]


def is_torch(opt) -> bool:
    """Whether ``opt`` is a ``torch.optim`` optimiser or its class."""
    return isinstance(opt, torch.optim.Optimizer) or (
        isinstance(opt, type) and issubclass(opt, torch.optim.Optimizer)
    )


def built(opt, trainable: dict[str, Tensor], kwargs: dict):
    """The base optimiser: ``opt`` itself, or ``opt(**kwargs)`` built here from a class (over the
    trainable parameters, or over ``kwargs["params"]``: param groups as ``torch.optim`` takes them)
    or a gamfunc factory."""
    if opt is None:
        raise TypeError(
            "a base optimiser is needed, e.g. GAM(model, torch.optim.SGD, lr=0.1, rho=0.05, "
            "alpha=0.1) or GAM(model, gamfunc.sgd(lr=0.1), rho=0.05, alpha=0.1)"
        )
    if isinstance(opt, type) and issubclass(opt, torch.optim.Optimizer):
        kwargs = dict(kwargs)
        params = kwargs.pop("params", None)
        opt = opt(list(trainable.values()) if params is None else params, **kwargs)
    elif "params" in kwargs and callable(opt) and not isinstance(opt, Transform):
        raise TypeError(
            "params= gives torch.optim param groups to a torch.optim class; a gamfunc optimiser "
            "takes its groups by name: gamfunc.param_groups({'*.bias': {'weight_decay': 0.0}}, "
            "gamfunc.adamw, lr=...)"
        )
    elif kwargs and callable(opt) and not isinstance(opt, Transform | torch.optim.Optimizer):
        opt = opt(**kwargs)
    elif kwargs:
        raise TypeError(
            f"{', '.join(kwargs)}= belong to the base optimiser: give them to it "
            f"(torch.optim.SGD(model.parameters(), lr=0.1) or gamfunc.sgd(lr=0.1)), or pass its "
            f"class with them: GAM(model, torch.optim.SGD, lr=0.1, ...)"
        )
    if isinstance(opt, torch.optim.Optimizer):
        closure = inspect.signature(type(opt).step).parameters.get("closure")
        if closure is not None and closure.default is inspect.Parameter.empty:
            raise TypeError(
                f"{type(opt).__name__}.step needs a closure that re-evaluates the loss, which a "
                "flatness step cannot give it: use an optimiser whose step takes the gradient "
                "(torch.optim.SGD, AdamW, ...)"
            )
        return opt
    if not isinstance(opt, Transform):
        raise TypeError(
            "the base optimiser must be a torch.optim.Optimizer (or its class) or a gamfunc "
            f"optimizer such as gamfunc.sgd(lr=0.1); got {getattr(opt, '__name__', type(opt).__name__)}"
        )
    return opt


def torch_state_dict(state_dict) -> bool:
    """Whether ``state_dict`` is a ``torch.optim`` optimiser's own: ``{"state", "param_groups"}``
    whose groups list their params as integers (the facade's own name its parameters)."""
    if not isinstance(state_dict, dict) or set(state_dict) != {"state", "param_groups"}:
        return False
    groups = state_dict["param_groups"]
    return (
        isinstance(groups, list)
        and all(
            isinstance(g, dict) and all(isinstance(i, int) for i in g.get("params", ()))
            for g in groups
        )
        and any(g.get("params") for g in groups)
    )


def held(base: torch.optim.Optimizer, named: dict[str, Tensor]) -> dict[str, Tensor]:
    """The model's parameters that ``base`` holds, by name in the model's order; a ValueError
    when it holds other tensors."""
    held = {id(p) for g in base.param_groups for p in g["params"]}
    mine = {k: p for k, p in named.items() if id(p) in held}
    if len(mine) != len(held):
        raise ValueError(
            f"the base optimiser holds tensors that are not the model's parameters: build it on "
            f"them, {type(base).__name__}(model.parameters(), ...)"
        )
    return mine
