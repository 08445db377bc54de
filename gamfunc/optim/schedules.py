"""The schedules' former home: :mod:`gamfunc.schedules` under the name ``gamfunc.optim.schedules``.

Schedules are read by the estimators (ρ, α) as well as the optimisers (lr), so they live below both.
"""

from gamfunc.schedules import Schedule, constant, cosine, inverse_sqrt, proportional, value

__all__ = ["Schedule", "constant", "cosine", "inverse_sqrt", "proportional", "value"]
