"""Base optimisers: how to move along a direction. ``schedules`` is :mod:`gamfunc.schedules`'s former name."""

from gamfunc.optim import schedules  # the name gamfunc.optim.schedules keeps working
from gamfunc.optim.adam import adam
from gamfunc.optim.adamw import AdamWState, ScheduledAdamWState, adamw
from gamfunc.optim.base import Optimizer, ScheduledLR, lr_scheduled, with_hyper
from gamfunc.optim.lion import LionState, ScheduledLionState, lion
from gamfunc.optim.sgd import ScheduledSGDState, SGDState, sgd

__all__ = [
    "AdamWState",
    "LionState",
    "Optimizer",
    "SGDState",
    "ScheduledAdamWState",
    "ScheduledLR",
    "ScheduledLionState",
    "ScheduledSGDState",
    "adam",
    "adamw",
    "lion",
    "lr_scheduled",
    "schedules",
    "sgd",
    "with_hyper",
]
