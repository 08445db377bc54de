"""gamfunc: Gradient norm Aware Minimization, SAM and GNP as pure, composable torch.func functions.

Estimators say what to descend along, optimisers how to move; [`make_step`][gamfunc.make_step] joins them into one
pure, compilable step. See README.md and https://arxiv.org/abs/2303.03108.
"""

from gamfunc import (
    accumulate,
    checks,
    cuda_graphs,
    distributed,
    ensemble,
    hvps,
    m_sharpness,
    metrics,
    nn,
    precision,
    regional,
    schedules,
    torch_optim,
    transforms,
    tree,
)
from gamfunc.convenience import gam_step
from gamfunc.cuda_graphs import cuda_graph
from gamfunc.estimators import (
    Estimator,
    asam,
    friendly_sam,
    gam,
    gam_accelerated,
    gnp,
    gradient,
    gsam,
    looksam,
    sam,
    wsam,
)
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
from gamfunc.state import StepState
from gamfunc.step import Step, make_step
from gamfunc.transforms import (
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

__version__ = "0.1.0"

__all__ = [
    "ChainState",
    "Estimator",
    "InjectState",
    "Step",
    "StepState",
    "Transform",
    "accumulate",
    "adam",
    "adamw",
    "add_decayed_weights",
    "apply_updates",
    "asam",
    "chain",
    "checks",
    "clip_by_global_norm",
    "cuda_graph",
    "cuda_graphs",
    "decay_mask",
    "distributed",
    "ensemble",
    "friendly_sam",
    "gam",
    "gam_accelerated",
    "gam_step",
    "gnp",
    "gradient",
    "gsam",
    "hvps",
    "inject_hyperparams",
    "lion",
    "looksam",
    "m_sharpness",
    "make_step",
    "metrics",
    "nn",
    "param_groups",
    "precision",
    "regional",
    "sam",
    "scale_by_adam",
    "scale_by_learning_rate",
    "scale_by_lion",
    "schedules",
    "set_hyperparams",
    "sgd",
    "torch_optim",
    "trace",
    "transforms",
    "tree",
    "wsam",
]
