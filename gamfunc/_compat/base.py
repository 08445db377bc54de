"""What every door to torch's private APIs shares: torch's version, and the one logged line by
which a door says that it takes the public path.

Where torch lacks an internal (a release that renamed or moved it), a door takes the public path
instead and says so in one logged line of ``logging.getLogger("gamfunc")``, once per process and
door (`fall_back`).
"""

from __future__ import annotations

import logging

import torch

__all__ = ["TORCH_VERSION", "fall_back", "functorch_attr", "log"]

TORCH_VERSION = tuple(int(x) for x in torch.__version__.split(".")[:2])

log = logging.getLogger("gamfunc")
_fallen_back: set[str] = set()


def fall_back(name: str, internal: str, public: str) -> None:
    """One logged line per process and door: ``name`` takes ``public`` since torch lacks ``internal``."""
    if name in _fallen_back:
        return
    _fallen_back.add(name)
    log.warning(
        "gamfunc: this torch (%s) has no %s; %s falls back to %s",
        torch.__version__,
        internal,
        name,
        public,
    )


def functorch_attr(attr: str):
    """``torch._C._functorch.<attr>``, or None where torch has no such function."""
    return getattr(getattr(torch._C, "_functorch", None), attr, None)
