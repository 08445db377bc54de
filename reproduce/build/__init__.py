"""What a run trains with: the model, its loss, the estimator, the base optimiser and the step.

`setup` turns a `Config` into a `Training`: the model (fresh, or
from ``--weights``) on the process's device, the cross-entropy loss through
``torch.func.functional_call``, the estimator named by ``--estimator`` made data parallel
([`gamfunc.distributed.data_parallel`][gamfunc.wrappers.distributed.data_parallel]) when the job has several processes, the base optimiser
with its schedule, gradient clipping and weight-decay mask, and ``make_step`` of them, compiled
with ``--compile``.

One module per part:

* `reproduce.build.model`: the network for the data, ``--weights``, channels-last; `SetupError`;
* `reproduce.build.loss`: the cross-entropy and its counts of correct predictions, in the run's precision;
* `reproduce.build.schedule`: the learning rate over the steps, and which steps are flat;
* `reproduce.build.estimator`: the estimator of ``--estimator``, its H·v backend, the base optimiser;
* `reproduce.build.mode`: how the step runs (eager, compiled, CUDA graph);
* `reproduce.build.training`: `setup`, which joins them into a `Training`.
"""

from reproduce.build.estimator import (
    CHOSEN,
    FD_RELU_RADIUS,
    build_estimator,
    build_optimizer,
    exact_hvp_backend,
    fd_gam_warning,
    hyperparameters,
    uses_exact_hvp,
)
from reproduce.build.loss import CORRECT, TOP5, classification_loss, training_loss
from reproduce.build.mode import StepMode, compile_scope, step_mode, with_step_mode
from reproduce.build.model import (
    IMAGENET_CLASSES,
    SetupError,
    channels_last,
    load_weights,
    model_of,
)
from reproduce.build.schedule import lr_schedule, run_steps, when_policy
from reproduce.build.training import Place, Training, setup

__all__ = [
    "CHOSEN",
    "CORRECT",
    "FD_RELU_RADIUS",
    "IMAGENET_CLASSES",
    "TOP5",
    "Place",
    "SetupError",
    "StepMode",
    "Training",
    "build_estimator",
    "build_optimizer",
    "channels_last",
    "classification_loss",
    "compile_scope",
    "exact_hvp_backend",
    "fd_gam_warning",
    "hyperparameters",
    "load_weights",
    "lr_schedule",
    "model_of",
    "run_steps",
    "setup",
    "step_mode",
    "training_loss",
    "uses_exact_hvp",
    "when_policy",
    "with_step_mode",
]
