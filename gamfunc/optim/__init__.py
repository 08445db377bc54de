"""Base optimisers: how to move along a direction.

The wing holds, from the bottom up, as optax's ``base``, ``transform`` and ``alias`` do: the contract
(`base`: [`Transform`][gamfunc.optim.base.Transform], [`apply_updates`][gamfunc.optim.base.apply_updates]),
the primitives and [`chain`][gamfunc.optim.transforms.chain] (`transforms`, with those that keep
running statistics in `moments`), the injection of
hyperparameters into the state (`inject`), parameter groups (`groups`), and the optimisers built
from them (`sgd`, `adam`, `adamw`, `lion`), whose updates are their whole signed step.
"""

from gamfunc.optim import transforms
from gamfunc.optim.adam import adam
from gamfunc.optim.adamw import adamw
from gamfunc.optim.base import Moved, Transform, apply_updates, call_update, check_like
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
    "check_like",
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
    "transforms",
]
