"""The estimators by name: one table from a method's name to the gamfunc estimator it builds.

Every caller in the repository that names an estimator builds it here: ``reproduce/train.py
--estimator=NAME`` (through `reproduce.build.build_estimator`), the vmapped sweeps, the evidence
commands and the benchmarks. The library's own tests build theirs with gamfunc's factories
(``tests/registry.py``), and ``tests/checkout/test_reproduce_methods.py`` checks that they are these. A name
and its hyperparameters give one estimator:

```text
>>> from reproduce.methods import METHODS, estimator
>>> gam = estimator("gam", rho=0.05, alpha=0.1)  # gamfunc.gam(0.05, 0.1, hvp="exact")
>>> sorted(METHODS)[:3]
['asam', 'gam', 'gam_accelerated']
```

A method reads the fields of `Hyper` it needs and ignores the others, so one set of
hyperparameters (a run's configuration) builds any method. `base` is the estimator of the
steps a method skips under ``make_step(..., every=k)``: the oracle for ``sam+gam`` and
``gsam+gam``, the gradient for the others.

A new estimator of ``gamfunc.estimators`` gets one entry in `METHODS` (and, if it reads a
new hyperparameter, a field of `Flags`, which is then its ``--flag`` of `reproduce.config.Config`,
built on `Flags`);
``--estimator`` then takes its name; the contract tests run it once ``tests/registry.py`` builds
it and ``tests/checkout/test_reproduce_methods.py`` names it (that test fails until both do).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gamfunc

__all__ = ["ASAM_MASKS", "METHODS", "SAM_LIKE", "Flags", "Hyper", "base", "estimator", "weights"]


@dataclass(frozen=True)
class Flags:
    """The hyperparameters of the methods that a run's configuration sets, one ``--flag`` each: the
    one table of their names, defaults and ``--help`` lines. `reproduce.config.Config` is built on
    it, and `Hyper` adds what a run chooses for itself.

    SAM's ρ has one "unset" value: ``sam_rho`` 0 means ``rho`` (`Hyper.sam_radius`).
    """

    rho: float = 0.05  # ρ: radius of the ascent (SAM, GAM)
    alpha: float = 0.1  # α: weight of the first-order flatness term (GAM, GNP)
    sam_rho: float = 0.0  # SAM's ρ (sam, gsam, wsam, looksam, friendly_sam, asam, msam, and the oracles of sam+gam, gsam+gam); 0: the same as rho
    gnp_hvp: str = "fd"  # H·v of gnp: fd (Zhao et al.) | exact | reverse
    fd_radius: float = 1e-3  # r of the finite-difference H·v of gam_fd: gamfunc.hvps.fd(radius=r)
    gnp_radius: float = 1e-2  # r of gnp's fd (Zhao et al.'s form): gamfunc.hvps.fd(radius=r)
    rho_prime: float = 0.05  # ρ' of gam_accelerated (the SAM-like finite differences)
    beta: float = 0.5  # β of gam_accelerated
    gamma: float = 0.1  # γ of gam_accelerated
    eta: float = 0.01  # η of asam (Kwon et al. 2021)
    adaptive: bool = False  # gam, look_gam and gam_accelerated in ASAM's scale-invariant geometry
    ascent_steps: int = 1  # normalised ascent steps of sam (and sam+gam's SAM oracle), at most 100
    gsam_alpha: float = 0.3  # α of gsam (and gsam+gam's oracle): share of ∇L's part ⟂ ∇f_p removed
    wsam_gamma: float = 0.9  # γ of wsam, the weight of sharpness, in [0, 1) (Yue et al. 2023: 0.9)
    wsam_decouple: bool = False  # wsam: the authors' decoupled form (the sharpness step after the update, times its lr)
    wsam_max_norm: float = 0.0  # wsam: clip ∇L and the perturbed gradient each to this global norm (0: never, the authors' default)
    gsam_adaptive: bool = False  # gsam (and gsam+gam's oracle): the ascent in ASAM's geometry, T = |θ| (the authors' adaptive=True)
    asam_mask: str = "all"  # asam: all (T = |θ| + η on every parameter, Eq. 8) | weights (on those named weight, the authors' code)
    look_k: int = 5  # k of looksam and look_gam: the full step every k steps
    looksam_alpha: float = 0.7  # α of looksam: the weight of the reused component (Liu et al. 2022)
    fsam_sigma: float = 1.0  # σ of friendly_sam: the share of the running mean removed
    fsam_lmbda: float = 0.9  # λ of friendly_sam: the running mean's decay, in [0, 1)
    fsam_convention: str = "paper"  # friendly_sam: paper (the paper's order) | authors (nblt/F-SAM's order: m₁ = g₁, d before m takes in g)
    msam_momentum: float = 0.9  # μ of msam's own momentum, in [0, 1) (Becker et al. 2024: 0.9)
    rwp_sigma: float = 0.01  # σ of rwp: the noise's scale relative to each filter's norm
    rwp_mix: float = 0.0  # λ of rwp in [0, 1): the weight of ∇L(θ) (0: one gradient; > 0: m-RWP)
    rwp_seed: int = 0  # the key of rwp's noise, in [0, 2**32)


@dataclass(frozen=True)
class Hyper(Flags):
    """The hyperparameters the methods read, each with the value a method gets when it is not given:
    the fields of `Flags` and two that a run chooses for itself (`reproduce.build.build_estimator`).

    A field that an estimator of gamfunc takes as a schedule (ρ, ρ', α of GAM and GNP, SAM's ρ, and
    the others its factory documents) may be a schedule of the step count here too; the annotations
    are the types a ``--flag`` parses.
    """

    hvp: str = "exact"  # the H·v backend of gam and sam+gam: "exact" or "reverse"
    theorem_norms: bool = False  # GAM's info adds Theorem 4.3's two squared norms

    @property
    def sam_radius(self):
        """SAM's ρ: ``sam_rho``, or ``rho`` where it is 0 (unset)."""
        return self.sam_rho or self.rho


def _gam(h: Hyper, **kw) -> gamfunc.Estimator:
    kw = {"hvp": h.hvp, **kw}
    return gamfunc.gam(h.rho, h.alpha, theorem_norms=h.theorem_norms, adaptive=h.adaptive, **kw)


def _accelerated(convention: str) -> Callable[[Hyper], gamfunc.Estimator]:
    def build(h: Hyper) -> gamfunc.Estimator:
        return gamfunc.gam_accelerated(
            h.rho, h.rho_prime, h.alpha, h.beta, h.gamma, convention=convention, adaptive=h.adaptive
        )

    return build


def _gnp(h: Hyper) -> gamfunc.Estimator:
    hvp = gamfunc.hvps.fd(radius=h.gnp_radius) if h.gnp_hvp == "fd" else h.gnp_hvp
    return gamfunc.gnp(h.alpha, hvp=hvp)


def _sam(h: Hyper) -> gamfunc.Estimator:
    return gamfunc.sam(h.sam_radius, ascent_steps=h.ascent_steps)


def _gsam(h: Hyper) -> gamfunc.Estimator:
    return gamfunc.gsam(h.sam_radius, h.gsam_alpha, adaptive=h.gsam_adaptive)


def _wsam(h: Hyper) -> gamfunc.Estimator:
    max_norm = h.wsam_max_norm or None
    return gamfunc.wsam(h.sam_radius, h.wsam_gamma, decouple=h.wsam_decouple, max_norm=max_norm)


def weights(name: str, tensor) -> bool:
    """SamsungLabs/ASAM's rule: T scales the parameters whose name contains ``weight``."""
    return "weight" in name


ASAM_MASKS = {"all": None, "weights": weights}
"""``asam_mask`` -> the ``mask`` of ``gamfunc.asam``."""


def _asam(h: Hyper) -> gamfunc.Estimator:
    if h.asam_mask not in ASAM_MASKS:
        raise ValueError(f"asam_mask must be one of {tuple(ASAM_MASKS)}; got {h.asam_mask!r}")
    return gamfunc.asam(h.sam_radius, eta=h.eta, mask=ASAM_MASKS[h.asam_mask])


SAM_LIKE = ("sam", "gsam", "wsam", "looksam", "friendly_sam", "asam", "msam")
"""The methods whose radius is SAM's ρ (`Hyper.sam_radius`: ``sam_rho``, or ``rho``) and that read
no α of GAM; the oracles of ``sam+gam`` and ``gsam+gam`` read it too."""

METHODS: dict[str, Callable[[Hyper], gamfunc.Estimator]] = {
    "sgd": lambda h: gamfunc.gradient(),
    "sam": _sam,
    "gsam": _gsam,
    "wsam": _wsam,
    "looksam": lambda h: gamfunc.looksam(h.sam_radius, h.look_k, h.looksam_alpha),
    "look_gam": lambda h: gamfunc.look_gam(
        h.rho, h.alpha, h.look_k, hvp=h.hvp, theorem_norms=h.theorem_norms, adaptive=h.adaptive
    ),
    "friendly_sam": lambda h: gamfunc.friendly_sam(
        h.sam_radius, h.fsam_sigma, h.fsam_lmbda, convention=h.fsam_convention
    ),
    "asam": _asam,
    "msam": lambda h: gamfunc.msam(h.sam_radius, momentum=h.msam_momentum),
    "rwp": lambda h: gamfunc.rwp(h.rwp_sigma, mix=h.rwp_mix, seed=h.rwp_seed),
    "gnp": _gnp,
    "gam": _gam,
    "gam_fd": lambda h: _gam(h, hvp=gamfunc.hvps.fd(radius=h.fd_radius)),
    "gam_reverse": lambda h: _gam(h, hvp="reverse"),
    "sam+gam": lambda h: _gam(h, oracle=_sam(h)),
    "gsam+gam": lambda h: _gam(h, oracle=_gsam(h)),
    "gam_accelerated": _accelerated("paper"),
    "gam_accelerated_official": _accelerated("official"),
}
"""name -> the function of a `Hyper` that builds the method's estimator."""


def _hyper(hparams: dict[str, Any]) -> Hyper:
    fields = {f.name for f in dataclasses.fields(Hyper)}
    for key in hparams:
        if key not in fields:
            raise ValueError(f"{key}: not a hyperparameter of any method; one of {sorted(fields)}")
    return Hyper(**hparams)


def _method(name: str) -> Callable[[Hyper], gamfunc.Estimator]:
    if name not in METHODS:
        raise ValueError(f"name: no method {name!r}; one of {', '.join(METHODS)}")
    return METHODS[name]


def estimator(name: str, **hparams) -> gamfunc.Estimator:
    """The estimator of the method ``name`` with the hyperparameters ``hparams``.

    Args:
        name: a key of `METHODS` (``"sgd"``, ``"sam"``, ``"gam"``, ``"sam+gam"``, ...).
        **hparams: fields of `Hyper`; those not given keep its defaults.

    Returns:
        A [`gamfunc.Estimator`][gamfunc.Estimator].

    Raises:
        ValueError: ``name`` is no method, a keyword is no field of `Hyper`, or the
            estimator refuses a value (each message names the argument).
    """
    return _method(name)(_hyper(hparams))


def base(name: str, **hparams) -> gamfunc.Estimator:
    """The estimator of the steps that the method ``name`` skips under ``make_step(every=k)``: the
    oracle for ``sam+gam`` and ``gsam+gam`` (SAM or GSAM steps between the GAM steps); the gradient
    for every other method. A method that cycles by itself (``looksam``, ``look_gam``: its
    estimator's ``every`` > 1) brings its own base, which `reproduce.build` gives to the step
    instead.

    Args:
        name: a key of `METHODS`.
        **hparams: fields of `Hyper`, as for `estimator`.

    Returns:
        A [`gamfunc.Estimator`][gamfunc.Estimator].

    Raises:
        ValueError: as `estimator`.
    """
    _method(name)
    h = _hyper(hparams)
    oracles = {"sam+gam": _sam, "gsam+gam": _gsam}
    return oracles[name](h) if name in oracles else gamfunc.gradient()
