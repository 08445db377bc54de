"""Base optimisers: how to move along a direction, as Transforms whose updates are the step, and
the injection of their hyperparameters into their state."""

from gamfunc.optim.adam import adam
from gamfunc.optim.adamw import adamw
from gamfunc.optim.base import Moved, Transform, apply_updates, call_update
from gamfunc.optim.groups import GroupsState, learning_rates, lr_groups, param_groups
from gamfunc.optim.inject import (
    InjectState,
    hyperparam_dtype,
    inject_hyperparams,
    injected,
    learning_rate,
    map_injected,
    set_hyperparams,
)
from gamfunc.optim.lion import lion
from gamfunc.optim.sgd import sgd

__all__ = [
    "GroupsState",
    "InjectState",
    "Moved",
    "Transform",
    "adam",
    "adamw",
    "apply_updates",
    "call_update",
    "hyperparam_dtype",
    "inject_hyperparams",
    "injected",
    "learning_rate",
    "learning_rates",
    "lion",
    "lr_groups",
    "map_injected",
    "param_groups",
    "set_hyperparams",
    "sgd",
]
