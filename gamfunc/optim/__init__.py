"""Base optimisers (how to move along a direction) and schedules."""

from gamfunc.optim import schedules
from gamfunc.optim.adamw import adamw
from gamfunc.optim.base import Optimizer
from gamfunc.optim.sgd import sgd

__all__ = ["Optimizer", "adamw", "schedules", "sgd"]
