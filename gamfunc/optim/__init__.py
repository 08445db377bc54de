"""Base optimisers: how to move along a direction, as Transforms whose updates are the step."""

from gamfunc.optim.adam import adam
from gamfunc.optim.adamw import AdamWState, ScheduledAdamWState, adamw
from gamfunc.optim.base import (
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
    "sgd",
    "with_hyper",
]
