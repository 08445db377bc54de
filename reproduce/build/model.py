"""The run's network: built for the data (`model_of`), loaded from ``--weights``
(`load_weights`), laid out channels-last (`channels_last`); `SetupError` when it cannot be."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from reproduce.build.loss import CORRECT, TOP5
from reproduce.config import Config
from reproduce.models import build_model

__all__ = ["IMAGENET_CLASSES", "SetupError", "channels_last", "load_weights", "model_of"]

IMAGENET_CLASSES = 1000  # the classifier of the pretrained weights that --pretrained starts from


class SetupError(Exception):
    """The run cannot start as configured (model, weights, processes); the message says why."""


def model_of(cfg: Config, classes: int, data) -> nn.Module:
    """``cfg.model`` with ``classes`` outputs for ``data``'s inputs (size, channels), initialised
    from ``cfg.seed``; a model that cannot take them is a `SetupError` in one line."""
    try:
        return build_model(
            cfg.model, classes, data.image_size, channels=data.channels, seed=cfg.seed
        )
    except ValueError as e:
        raise SetupError(str(e)) from None


def load_weights(model: nn.Module, weights: dict[str, Tensor], source: str) -> None:
    """Load ``weights``, a state dict read from the file ``source`` (``--weights``), into ``model``.

    Args:
        model: the network built for the run.
        weights: parameter and buffer names to tensors (`reproduce.run.checkpoint.state_dict`
            reads them from a file).
        source: the file they were read from, named in the errors.

    Raises:
        SetupError: a tensor differs in shape from the model's, or a name is missing or unexpected.
    """
    obj = {k: v for k, v in weights.items() if k not in (CORRECT, TOP5)}
    own = model.state_dict()
    shapes = [k for k, v in obj.items() if k in own and own[k].shape != v.shape]
    if shapes:
        k = shapes[0]
        raise SetupError(
            f"--weights {source!r} does not fit the model {type(model).__name__}: {len(shapes)} "
            f"tensor(s) differ in shape, e.g. {k} {tuple(obj[k].shape)} vs {tuple(own[k].shape)}"
        )
    missing, unexpected = model.load_state_dict(obj, strict=False)
    if missing or unexpected:
        raise SetupError(
            f"--weights {source!r} does not fit the model: missing {missing}, unexpected {unexpected}"
        )


def channels_last(model: nn.Module) -> None:
    """Give every 4-d parameter and buffer of ``model`` (convolution kernels) the ``torch.channels_last``
    layout, in place; tensors of other ranks keep theirs. The values are unchanged."""
    for t in (*model.parameters(), *model.buffers()):
        if t.dim() == 4:
            t.data = t.data.contiguous(memory_format=torch.channels_last)
