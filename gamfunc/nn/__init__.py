"""From an ``nn.Module`` to the functional contract: ``(loss_fn, params, buffers)``.

`convert`: the conversion (`functionalize`, `module_loss`, `Caller`, `load` and its checks);
`norms`: the rewrites of a module's norm layers that the transforms need (`autocast_batchnorm`,
`float32_batchnorm`, `elementary_norms`, `elementary_softmax`).
"""

from gamfunc.nn.convert import (
    Caller,
    check_loss_form,
    check_uncompiled,
    functionalize,
    load,
    mode,
    module_loss,
    places,
    tied,
)
from gamfunc.nn.norms import (
    autocast_batchnorm,
    elementary_norms,
    elementary_softmax,
    float32_batchnorm,
)

__all__ = [
    "Caller",
    "autocast_batchnorm",
    "check_loss_form",
    "check_uncompiled",
    "elementary_norms",
    "elementary_softmax",
    "float32_batchnorm",
    "functionalize",
    "load",
    "mode",
    "module_loss",
    "places",
    "tied",
]
