"""The weight decay of the optimisers' chains: one [`gamfunc.add_decayed_weights`][gamfunc.add_decayed_weights] for all."""

from __future__ import annotations

from gamfunc.optim import transforms
from gamfunc.optim.base import Mask, Transform

__all__ = ["decayed", "given"]


def given(weight_decay) -> dict:
    """``{"weight_decay": λ}`` to inject, or ``{}`` for a constant 0 (no decay, nothing to set)."""
    return {"weight_decay": weight_decay} if callable(weight_decay) or weight_decay != 0 else {}


def decayed(weight_decay, mask: Mask) -> list[Transform]:
    """The decay element of an optimiser's chain: none without λ and mask; with a mask alone, one
    of λ = 0, so that ``init`` still checks the mask against the parameters.

    Args:
        weight_decay: λ (a number, a 0-d tensor or a schedule), or None where none was given.
        mask: the optimiser's ``weight_decay_mask``.

    Returns:
        ``[]`` or ``[add_decayed_weights(λ, mask)]``.
    """
    if weight_decay is None and mask is None:
        return []
    lam = 0.0 if weight_decay is None else weight_decay
    return [transforms.add_decayed_weights(lam, mask, mask_name="weight_decay_mask")]
