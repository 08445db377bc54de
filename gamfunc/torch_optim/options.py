"""The options every facade takes ([`FlatnessOptimizer`][gamfunc.torch_optim.FlatnessOptimizer],
[`GAM`][gamfunc.torch_optim.GAM], [`SAM`][gamfunc.torch_optim.SAM],
[`TorchBase`][gamfunc.torch_optim.TorchBase]), typed and documented once: [`Options`][gamfunc.torch_optim.Options]."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.nn.functional as F

from gamfunc.checks import check_positive
from gamfunc.estimators import Estimator
from gamfunc.nn import check_loss_form
from gamfunc.torch_optim.checks import check_arguments

__all__ = ["Options", "check_estimator"]


@dataclass(frozen=True)
class Options:
    """The keyword options of every facade, beside its model, estimator (or its hyperparameters)
    and base optimiser: ``GAM(model, base, rho=0.05, alpha=0.1, every=2, precision="bf16")``.

    A facade takes them as keyword arguments (``**options``); the keywords that are none of these
    are the base optimiser's (``GAM(model, torch.optim.SGD, lr=0.1, momentum=0.9, ...)``).

    Attributes:
        criterion: ``criterion(outputs, targets) -> scalar`` for ``step((inputs, targets))``;
            ``F.cross_entropy`` by default.
        loss: ``loss(model, batch) -> scalar`` for ``step(batch)`` with a batch of any form (a
            dict of tensors, a tuple of three...), in place of ``criterion``: e.g.
            ``loss=lambda model, b: F.cross_entropy(model(b["input_ids"]), b["labels"])``. It is
            evaluated as the pair form is, compiled with ``compile=`` and accumulated with
            ``accumulate=`` (see [`gamfunc.nn.functionalize`][gamfunc.nn.functionalize]).
        base_optimizer: the base optimiser by keyword (davda54/sam's name), instead of the
            facade's ``optimizer`` argument.
        when: which steps run the estimator (the others run ``base``): a policy of
            [`gamfunc.when`][gamfunc.training.when] (``every(k)``, ``late(start)``, ``adaptive(T)``), as
            [`gamfunc.make_step`][gamfunc.make_step]'s ``when``; None: every step. Its state is
            in the step state, so ``state_dict()`` saves it.
        every: the shorthand of ``when=gamfunc.when.every(every)``.
        base: the estimator of the other steps, ``gradient()`` by default.
        on_nonfinite: "skip" (default), "raise" or "ignore" (see [`gamfunc.make_step`][gamfunc.make_step]).
        compile: ``False`` (eager, the default), ``True`` or ``"pass"``: compile the estimator's
            differentiation passes (``step.compile(scope="pass")``), one graph for every
            estimator built on gradients, around which the update runs eagerly (a ``torch.optim``
            base optimiser's ``step()`` runs its own fused or foreach kernels); or ``"step"``:
            compile the whole step with a gamfunc base optimiser. The whole step is the slower
            cold compile by far, for a step a little faster (``docs/guides/torch-optim.md``);
            with ``cuda_graph=True`` the passes' compile runs at the whole step's speed.
        compile_options: keyword arguments of ``torch.compile``, e.g. ``{"fullgraph": True}``.
        accumulate: micro-batches per ``step((inputs, targets))`` ([`gamfunc.accumulate.accumulate`][gamfunc.wrappers.accumulate.accumulate]).
        precision: "fp32", "bf16" or "fp16" ([`gamfunc.precision.mixed`][gamfunc.wrappers.precision.mixed]; fp16 with a dynamic loss
            scale in the step state, in place of ``torch.amp.GradScaler``).
        max_grad_norm: clip the direction to this global norm before the base optimiser
            ([`gamfunc.clip_by_global_norm`][gamfunc.optim.transforms.clip_by_global_norm]).
        cuda_graph: replay each ``step((inputs, targets))`` as one CUDA graph
            ([`gamfunc.cuda_graph`][gamfunc.training.cuda_graphs.cuda_graph]: three eager steps, then a
            capture, then replays; compiled or not). The model must be on a CUDA device, and a
            ``torch.optim`` base optimiser capturable: built with ``capturable=True`` where it has
            that option. A number it reads from its param groups (a float ``lr``) is fixed in the
            graph, so a change of one (a scheduler's) drops the graphs and captures again; give it
            as a tensor (``lr=torch.tensor(0.1, device="cuda")``, which schedulers change in place)
            to keep them. ``step(closure)`` is not captured.

    Raises:
        TypeError: ``criterion`` not callable, ``compile_options`` not a dict, ``cuda_graph`` not
            a bool, or both ``criterion`` and ``loss`` given.
        ValueError: an invalid option, naming it.

    Example:
        >>> from gamfunc.torch_optim import Options
        >>> options, base_kwargs = Options.split({"every": 2, "lr": 0.1})
        >>> Options(**options).every, base_kwargs
        (2, {'lr': 0.1})
    """

    criterion: Callable = F.cross_entropy
    loss: Callable | None = None
    base_optimizer: Any = None
    when: Any = None
    every: int = 1
    base: Estimator | None = None
    on_nonfinite: str = "skip"
    compile: bool | str = False
    compile_options: dict[str, Any] | None = None
    accumulate: int = 1
    precision: str = "fp32"
    max_grad_norm: float | None = None
    cuda_graph: bool = False

    def __post_init__(self) -> None:
        check_arguments(
            self.criterion, self.compile, self.compile_options, self.accumulate, self.precision
        )
        if self.max_grad_norm is not None:
            check_positive("max_grad_norm", self.max_grad_norm)
        check_loss_form(self.criterion, self.loss)
        if not isinstance(self.cuda_graph, bool):
            raise TypeError(f"cuda_graph must be True or False; got {self.cuda_graph!r}")

    @classmethod
    def split(cls, keywords: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """``keywords`` parted into the facade's options and the rest, the base optimiser's
        keyword arguments; nothing is checked yet.

        Args:
            keywords: a facade's keyword arguments.

        Returns:
            ``(options, base_kwargs)``, two dicts.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        mine = {k: v for k, v in keywords.items() if k in names}
        return mine, {k: v for k, v in keywords.items() if k not in names}

    def step_options(self) -> dict[str, Any]:
        """The keyword arguments of [`gamfunc.make_step`][gamfunc.make_step] these options set.

        Returns:
            ``{"when", "every", "base", "on_nonfinite"}`` and their values.
        """
        return dict(
            when=self.when, every=self.every, base=self.base, on_nonfinite=self.on_nonfinite
        )


def check_estimator(estimator) -> None:
    """A one-line TypeError unless ``estimator`` is a gamfunc estimator.

    Args:
        estimator: the facade's estimator.

    Raises:
        TypeError: as said.
    """
    if not isinstance(estimator, Estimator):
        name = getattr(estimator, "__name__", type(estimator).__name__)
        raise TypeError(f"estimator must be a gamfunc estimator; got {name}")
