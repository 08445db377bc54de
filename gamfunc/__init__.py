"""gamfunc: Gradient norm Aware Minimization, SAM and GNP as pure, composable torch.func functions.

Estimators say what to descend along, optimisers how to move; [`make_step`][gamfunc.make_step] joins them into one
pure, compilable step. See README.md and https://arxiv.org/abs/2303.03108.
"""

from gamfunc import (
    checks,
    estimators,
    hvps,
    metrics,
    nn,
    schedules,
    torch_optim,
    tree,
)

# the old paths of the moved modules, for one release
from gamfunc._moved import __getattr__ as __getattr__

# every estimator factory (and its state's type), by the name it has in gamfunc.estimators
from gamfunc.estimators import *  # noqa: F403
from gamfunc.optim import (
    InjectState,
    adam,
    adamw,
    apply_updates,
    inject_hyperparams,
    lion,
    param_groups,
    set_hyperparams,
    sgd,
)
from gamfunc.optim.transforms import (
    ChainState,
    Transform,
    add_decayed_weights,
    chain,
    clip_by_global_norm,
    decay_mask,
    scale_by_adam,
    scale_by_learning_rate,
    scale_by_lion,
    trace,
)
from gamfunc.training import cuda_graphs, ensemble, guard, when
from gamfunc.training.convenience import gam_step
from gamfunc.training.cuda_graphs import cuda_graph
from gamfunc.training.state import StepState
from gamfunc.training.step import Step, make_step
from gamfunc.wrappers import accumulate, distributed, m_sharpness, precision, regional

__version__ = "0.2.0"

__all__ = [
    "ChainState",
    "InjectState",
    "Step",
    "StepState",
    "Transform",
    "accumulate",
    "adam",
    "adamw",
    "add_decayed_weights",
    "apply_updates",
    "chain",
    "checks",
    "clip_by_global_norm",
    "cuda_graph",
    "cuda_graphs",
    "decay_mask",
    "distributed",
    "ensemble",
    "estimators",
    "gam_step",
    "guard",
    "hvps",
    "inject_hyperparams",
    "lion",
    "m_sharpness",
    "make_step",
    "metrics",
    "nn",
    "param_groups",
    "precision",
    "regional",
    "scale_by_adam",
    "scale_by_learning_rate",
    "scale_by_lion",
    "schedules",
    "set_hyperparams",
    "sgd",
    "torch_optim",
    "trace",
    "tree",
    "when",
]
__all__ += estimators.__all__
