"""The plain gradient ∇L(θ): the estimator of SGD, AdamW and every oracle's default."""

from __future__ import annotations

from gamfunc.estimators.base import Estimate, Estimator, Summary
from gamfunc.loss import Pass, gradient_pass, with_grad_norm

__all__ = ["clean_info", "gradient"]

# its row of README's table of estimators
SUMMARY = Summary(
    call="gamfunc.gradient()",
    computes="g",
    passes="1",
)


def clean_info(clean: Pass) -> dict:
    """The info every estimator reports: L(θ) as ``loss`` and ‖∇L(θ)‖ as ``grad_norm`` (the pass's
    own where it carries one)."""
    return {"loss": clean.loss, "grad_norm": with_grad_norm(clean).grad_norm}


def gradient() -> Estimator:
    """The gradient of the loss, direction = ∇L(θ).

    Returns:
        An [`Estimator`][gamfunc.estimators.base.Estimator] named "gradient", with no
            hyperparameters.

    Example:
        >>> import torch, gamfunc
        >>> loss_fn = lambda p, x: (p["w"] * x).pow(2).sum()
        >>> d, info = gamfunc.gradient()({"w": torch.ones(2)}, torch.tensor([1.0, 2.0]), loss_fn)
        >>> d["w"]
        tensor([2., 8.])
    """

    def run(params, batch, loss_fn, clean, step):
        if clean is None:
            clean = gradient_pass(loss_fn, params, batch)
        clean = with_grad_norm(clean)  # shared with the step's finiteness check
        return Estimate(clean.grad, clean_info(clean), clean)

    return Estimator("gradient", run)
