"""The models, batches and precisions of the step-cost table.

Models come from ``reproduce.models.build_model`` (the networks of the reproduce presets), with a
torchvision fallback where ``reproduce`` cannot be imported; the JSON says which. A precision is
``fp32`` or ``bf16``, with ``-cl`` for channels-last (``bf16-cl``); channels-last applies to the
convolutional networks only (``reproduce``'s ViT-S/32 embeds its patches linearly), and every row says
whether it ran channels-last.
"""

from __future__ import annotations

import argparse
import copy
from typing import NamedTuple

import torch
from torch import nn

import gamfunc
from gamfunc.wrappers import precision


class ModelSpec(NamedTuple):
    num_classes: int
    image_size: int
    batch: int  # default batch size
    convolutional: bool  # channels-last applies


MODELS = {
    "resnet18": ModelSpec(10, 32, 128, True),  # CIFAR ResNet-18
    "resnet50": ModelSpec(1000, 224, 64, True),
    "vit_s32": ModelSpec(1000, 224, 128, False),
    "tiny": ModelSpec(10, 8, 4, True),
}
DTYPES = ("fp32", "bf16")
CHANNELS_LAST = "-cl"


class TinyNet(nn.Module):
    """Two conv-BN-ReLU layers and a linear head: the ``--tiny`` model (8×8 inputs)."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1, bias=False),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1, bias=False),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(8, num_classes)

    def forward(self, x):
        return self.head(self.features(x))


def build_model(name: str) -> tuple[nn.Module, str]:
    """The network ``name`` and where it came from (``reproduce.models`` or a torchvision fallback)."""
    spec = MODELS[name]
    if name == "tiny":
        return TinyNet(spec.num_classes), "benchmarks.step_cost.models.TinyNet"
    try:
        from reproduce.models import build_model as reproduce_build
    except ImportError:
        reproduce_build = None
    if reproduce_build is not None:
        return reproduce_build(name, spec.num_classes, spec.image_size), "reproduce.models"
    import torchvision

    if name == "resnet18":  # CIFAR variant: 3×3 stride-1 stem, no max-pool
        net = torchvision.models.resnet18(num_classes=spec.num_classes)
        net.conv1 = nn.Conv2d(3, 64, 3, padding=1, bias=False)
        net.maxpool = nn.Identity()
    elif name == "resnet50":
        net = torchvision.models.resnet50(num_classes=spec.num_classes)
    else:  # ViT-S/32
        net = torchvision.models.VisionTransformer(
            image_size=spec.image_size,
            patch_size=32,
            num_layers=12,
            num_heads=6,
            hidden_dim=384,
            mlp_dim=1536,
            num_classes=spec.num_classes,
        )
    return net, "torchvision (fallback)"


def split_precision(token: str) -> tuple[str, bool]:
    """``(dtype, channels_last)`` of a ``--dtype`` entry: "bf16" -> ("bf16", False),
    "bf16-cl" -> ("bf16", True). Raises ValueError on anything else."""
    dtype = token.removesuffix(CHANNELS_LAST)
    if dtype not in DTYPES:
        raise ValueError(token)
    return dtype, token.endswith(CHANNELS_LAST)


def functional_loss(model: nn.Module, dtype: str):
    """``gamfunc.nn.functionalize(model)``'s ``(loss_fn, params, buffers)``, the loss under
    ``gamfunc.precision.bf16`` (autocast inside the loss, fp32 outside) for ``dtype="bf16"``."""
    loss_fn, params, buffers = gamfunc.nn.functionalize(model)
    if dtype == "bf16":
        loss_fn = precision.bf16(loss_fn)
    return loss_fn, params, buffers


def prepare(model_name: str, token: str, a, device) -> argparse.Namespace:
    """The model, one fixed random batch and the functional loss with its params and buffers, for
    the precision ``token``; ``--channels-last`` makes every convolutional model channels-last."""
    spec = MODELS[model_name]
    dtype, channels_last = split_precision(token)
    channels_last = (channels_last or a.channels_last) and spec.convolutional
    bs = a.batch_size or spec.batch
    torch.manual_seed(0)
    model, source = build_model(model_name)
    model = model.to(device).train()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(bs, 3, spec.image_size, spec.image_size, generator=gen)
    y = torch.randint(0, spec.num_classes, (bs,), generator=gen)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    batch = (x.to(device), y.to(device))
    # --elementary-norms: the gamfunc steps see BatchNorm and LayerNorm in elementary operations (a
    # compiled exact-GAM point then shares its gradient pass); the eager torch.optim row keeps torch's.
    functional_model = model
    if getattr(a, "elementary_norms", False):
        functional_model = gamfunc.nn.elementary_norms(copy.deepcopy(model))
    loss_fn, params, buffers = functional_loss(functional_model, dtype)
    return argparse.Namespace(
        model=model,
        source=source,
        dtype=dtype,
        channels_last=channels_last,
        batch=batch,
        loss_fn=loss_fn,
        params=params,
        buffers=buffers,
    )
