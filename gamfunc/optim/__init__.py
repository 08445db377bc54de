"""Base optimisers: how to move along a direction, as Transforms whose updates are the step. ``schedules`` is :mod:`gamfunc.schedules`'s former name."""

from gamfunc.optim import schedules  # the name gamfunc.optim.schedules keeps working
from gamfunc.optim.adam import adam
from gamfunc.optim.adamw import AdamWState, ScheduledAdamWState, adamw
from gamfunc.optim.base import (
    Optimizer,
    ScheduledLR,
    Transform,
    apply_updates,
    lr_scheduled,
    with_hyper,
)
from gamfunc.optim.groups import GroupsState, param_groups
from gamfunc.optim.lion import LionState, ScheduledLionState, lion
from gamfunc.optim.sgd import ScheduledSGDState, SGDState, sgd

__all__ = [
    "AdamWState",
    "GroupsState",
    "LionState",
    "Optimizer",
    "SGDState",
    "ScheduledAdamWState",
    "ScheduledLR",
    "ScheduledLionState",
    "ScheduledSGDState",
    "Transform",
    "adam",
    "adamw",
    "apply_updates",
    "lion",
    "lr_scheduled",
    "param_groups",
    "schedules",
    "sgd",
    "with_hyper",
]
