"""The one-call form of the design card: [`gam_step`][gamfunc.training.convenience.gam_step], ``make_step(gam(...), sgd(...), loss_fn)``
built once per set of arguments and called."""

from __future__ import annotations

import functools

from gamfunc.estimators import gam
from gamfunc.optim import Transform, sgd
from gamfunc.training.step import make_step

__all__ = ["gam_step"]

_GAM_KEYS = {"oracle", "eps"}
_SGD_KEYS = {"lr", "momentum", "dampening", "nesterov", "weight_decay"}


@functools.lru_cache(maxsize=32)
def _cached_step(loss_fn, rho, alpha, hvp, optimizer, gam_kw, sgd_kw):
    opt = optimizer if optimizer is not None else sgd(**dict(sgd_kw))
    return make_step(gam(rho, alpha, hvp=hvp, **dict(gam_kw)), opt, loss_fn)


def gam_step(
    params,
    batch,
    loss_fn,
    state=None,
    *,
    rho,
    alpha,
    hvp="exact",
    optimizer: Transform | None = None,
    buffers=None,
    **kw,
):
    """One GAM step in one call: ``make_step(gam(rho, alpha, hvp, ...), optimizer or sgd(...), loss_fn)``.

    The step built for the same arguments is reused, so a compiled caller does not recompile.

    Args:
        params: the parameters θ, a flat dict of tensors.
        batch: the batch ``loss_fn`` takes.
        loss_fn: ``loss_fn(params, batch) -> loss``, or ``-> (loss, new_buffers)`` with ``buffers``.
        state: the state returned by the previous call; None initialises it (with ``buffers`` for a
            buffered ``loss_fn``).
        rho: ρ of [`gamfunc.gam`][gamfunc.estimators.gam.gam] (float >= 0 or a schedule).
        alpha: α of [`gamfunc.gam`][gamfunc.estimators.gam.gam] (float >= 0 or a schedule).
        hvp: the H·v backend of [`gamfunc.gam`][gamfunc.estimators.gam.gam]: "exact" (the
            default), "reverse", "fd" (``hvps.fd()``, r = 1e-3) or a backend value such as
            ``gamfunc.hvps.fd(radius=r)``.
        optimizer: the Transform that applies the direction; None builds
            [`gamfunc.sgd`][gamfunc.optim.sgd.sgd] from the sgd keywords.
        buffers: the initial buffers, read only when ``state`` is None.
        **kw: ``oracle`` and ``eps`` go to [`gamfunc.gam`][gamfunc.estimators.gam.gam];
            ``lr`` (default 0.1), ``momentum``, ``dampening``, ``nesterov`` and ``weight_decay`` to
            the default [`gamfunc.sgd`][gamfunc.optim.sgd.sgd].

    Returns:
        ``(new_params, new_state, metrics)``.

    Raises:
        TypeError: an unknown keyword, ``optimizer`` together with sgd keywords, or an argument that
            is not hashable (a number, a string, a schedule function or a backend of
            [`gamfunc.hvps`][gamfunc.hvps] is).
        ValueError: an invalid hyperparameter, naming it (from [`gamfunc.gam`][gamfunc.estimators.gam.gam]
            or [`gamfunc.sgd`][gamfunc.optim.sgd.sgd]).

    Example:
        >>> import torch, gamfunc
        >>> loss_fn = lambda p, b: ((b[0] @ p["w"] - b[1]) ** 2).mean()
        >>> params, batch = {"w": torch.zeros(3)}, (torch.randn(8, 3), torch.randn(8))
        >>> params, state, metrics = gamfunc.gam_step(params, batch, loss_fn, rho=0.05, alpha=0.1)
        >>> params, state, metrics = gamfunc.gam_step(params, batch, loss_fn, state, rho=0.05, alpha=0.1)
    """
    unknown = set(kw) - _GAM_KEYS - _SGD_KEYS
    if unknown:
        raise TypeError(f"gam_step got unexpected keyword arguments {sorted(unknown)}")
    if optimizer is not None and set(kw) & _SGD_KEYS:
        raise TypeError("pass either optimizer or the sgd arguments (lr, momentum, ...), not both")
    gam_kw = tuple(sorted((k, v) for k, v in kw.items() if k in _GAM_KEYS))
    sgd_kw = tuple(sorted({"lr": 0.1, **{k: v for k, v in kw.items() if k in _SGD_KEYS}}.items()))
    for name, value in (("rho", rho), ("alpha", alpha), ("hvp", hvp), *gam_kw, *sgd_kw):
        try:
            hash(value)
        except TypeError:
            raise TypeError(
                f"gam_step's {name} must be a number, a string, a schedule function or an H·v "
                f"backend; got {type(value).__name__} {value!r}"
            ) from None
    step = _cached_step(loss_fn, rho, alpha, hvp, optimizer, gam_kw, sgd_kw)
    if state is None:
        state = step.init(params, buffers)
    return step(params, state, batch)
