"""Base optimisers: how to move along a direction. ``schedules`` is :mod:`gamfunc.schedules`'s former name."""

from gamfunc.optim import schedules  # the name gamfunc.optim.schedules keeps working
from gamfunc.optim.adam import adam
from gamfunc.optim.adamw import AdamWState, adamw
from gamfunc.optim.base import Optimizer, with_hyper
from gamfunc.optim.lion import LionState, lion
from gamfunc.optim.sgd import SGDState, sgd

__all__ = [
    "AdamWState",
    "LionState",
    "Optimizer",
    "SGDState",
    "adam",
    "adamw",
    "lion",
    "schedules",
    "sgd",
    "with_hyper",
]
