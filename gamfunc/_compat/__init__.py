"""The one door to torch's private APIs: every use of one in gamfunc is a function here.

Each function reaches the internal it needs when it is called (`batched`, which Dynamo traces once
per tensor of every tree operation of a compiled step, finds it once, at import). Where torch has no
such internal (a release that renamed or moved it: ``AttributeError`` or ``ImportError``), it takes
the public path instead and says so in one logged line of ``logging.getLogger("gamfunc")``, once per
process and function. The public paths give the same numbers; what they may cost is speed or memory.
One module per part of torch, each listing its doors and what their public paths cost:

* `gamfunc._compat.base`: torch's version and the one logged line of a fallback, shared by all.
* `gamfunc._compat.functorch`: whether the caller runs inside a ``torch.func`` transform
  (``torch._C._functorch``), and the forward-mode decompositions of ``torch.func.jvp``.
* `gamfunc._compat.compiler`: inductor's modes, options and custom passes, the schema of an
  operation, and Dynamo's compiled module.
* `gamfunc._compat.kernels`: the non-finite check of ``torch.amp.GradScaler`` and the grouping of
  ``torch.optim``'s foreach steps.
* `gamfunc._compat.distributed`: DTensor and the wrappers whose hooks run around a module's
  autograd, where torch moved them between releases.

This package re-exports every door, so that the rest of gamfunc imports them from
``gamfunc._compat``.

Two private names stay where they are used, as the rest of the ecosystem uses them:
``torch._foreach_*`` (the multi-tensor kernels: the documented fast path of ``torch.optim``'s
``foreach=True``, with public tests and no public alias) and ``torch.utils._pytree`` (the pytree of
``torch.func``, ``torch.compile`` and torch's optimisers alike). ``tests/library/test_compat.py`` checks
that no other module of gamfunc names a private torch API.
"""

from __future__ import annotations

from gamfunc._compat.base import TORCH_VERSION
from gamfunc._compat.compiler import (
    cacheable_state_calls,
    check_uncompiled,
    custom_graph_pass,
    mode_options,
    mutates,
)
from gamfunc._compat.distributed import (
    any_dtensor,
    check_unhooked,
    distributed_hooks,
    dtensor_type,
    local_pairs,
)
from gamfunc._compat.functorch import (
    batched,
    batched_at_any_level,
    in_forward_ad,
    in_transform,
    load_jvp_decompositions,
    traced_outside_transforms,
)
from gamfunc._compat.kernels import (
    flag_nonfinite,
    group_by_device_and_dtype,
    nonfinite_check_runs,
    overlaps,
)

__all__ = [
    "TORCH_VERSION",
    "any_dtensor",
    "batched",
    "batched_at_any_level",
    "cacheable_state_calls",
    "check_uncompiled",
    "check_unhooked",
    "custom_graph_pass",
    "distributed_hooks",
    "dtensor_type",
    "flag_nonfinite",
    "group_by_device_and_dtype",
    "in_forward_ad",
    "in_transform",
    "load_jvp_decompositions",
    "local_pairs",
    "mode_options",
    "mutates",
    "nonfinite_check_runs",
    "overlaps",
    "traced_outside_transforms",
]
