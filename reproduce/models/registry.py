"""The names of `build_model`: ``MODELS`` maps each to its network (the table of
`reproduce.models`), with the sets of vector-input and ReLU networks and the helpers around a
built network (a fresh classifier head, the parameter count)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import nn

from reproduce.models.mnist1d import MLP, ConvBase
from reproduce.models.pyramidnet import PyramidNet
from reproduce.models.resnets import (
    CifarResNet,
    ResNet9,
    ResNet32,
    ResNeXt29,
    WideResNet,
    _Basic,
    _Bottleneck,
    conv3x3,
)
from reproduce.models.vit import ViT

__all__ = [
    "ANY_CHANNELS",
    "MODELS",
    "RELU_MODELS",
    "VECTOR_MODELS",
    "build_model",
    "count_parameters",
    "new_head",
]


def _torchvision(name: str) -> Callable[[int, int], nn.Module]:
    def build(num_classes: int, image_size: int) -> nn.Module:
        import torchvision

        return getattr(torchvision.models, name)(weights=None, num_classes=num_classes)

    return build


def _densenet121_cifar(num_classes: int) -> nn.Module:
    """torchvision's DenseNet-121 (growth 32, blocks 6/12/24/16) with a 3×3 stride-1 stem and no max-pool."""
    from torchvision.models import densenet121

    net = densenet121(weights=None, num_classes=num_classes)
    net.features.conv0 = conv3x3(3, 64)
    nn.init.kaiming_normal_(net.features.conv0.weight)
    net.features.pool0 = nn.Identity()
    return net


MODELS: dict[str, Callable[[int, int], nn.Module]] = {
    "resnet18": lambda c, s: CifarResNet(_Basic, [2, 2, 2, 2], c),
    "resnet101_cifar": lambda c, s: CifarResNet(_Bottleneck, [3, 4, 23, 3], c),
    "resnet32": lambda c, s: ResNet32(c),
    "resnet50": _torchvision("resnet50"),
    "resnet101": _torchvision("resnet101"),
    "efficientnet_b0": _torchvision("efficientnet_b0"),
    "swin_t": _torchvision("swin_t"),
    "wrn28_2": lambda c, s: WideResNet(28, 2, c),
    "wrn28_10": lambda c, s: WideResNet(28, 10, c),
    # the authors' pyramidnet110_c (models/pyramidnet_cifar.py l.241-242 of github.com/xxgege/GAM)
    "pyramidnet110": lambda c, s: PyramidNet(110, 270, c, bottleneck=True),
    "pyramidnet110_basic": lambda c, s: PyramidNet(110, 270, c),
    "densenet121": lambda c, s: _densenet121_cifar(c),
    "resnext29": lambda c, s: ResNeXt29(c),
    "vit_s16": lambda c, s: ViT(s, 16, 384, 12, 6, 1536, c),
    "vit_s32": lambda c, s: ViT(s, 32, 384, 12, 6, 1536, c),
    "vit_b32": lambda c, s: ViT(s, 32, 768, 12, 12, 3072, c),
    "mlp": lambda c, s: MLP(s, c),
    "mlp_gelu": lambda c, s: MLP(s, c, activation="gelu"),
    "mlp_tanh": lambda c, s: MLP(s, c, activation="tanh"),
    "cnn1d": lambda c, s: ConvBase(s, c),
    "resnet9": lambda c, s: ResNet9(c),
    "resnet9_w32": lambda c, s: ResNet9(c, width=32),
    "resnet9_w16": lambda c, s: ResNet9(c, width=16),
}

# The image networks that take images of any number of channels (Fashion-MNIST's one), and how: each
# builds from (classes, side, channels); every other image network takes 3 × H × W.
ANY_CHANNELS: dict[str, Callable[[int, int, int], nn.Module]] = {
    "resnet18": lambda c, s, ch: CifarResNet(_Basic, [2, 2, 2, 2], c, channels=ch),
    "resnet32": lambda c, s, ch: ResNet32(c, channels=ch),
    "wrn28_2": lambda c, s, ch: WideResNet(28, 2, c, channels=ch),
    "wrn28_10": lambda c, s, ch: WideResNet(28, 10, c, channels=ch),
    "resnet9": lambda c, s, ch: ResNet9(c, channels=ch),
    "resnet9_w32": lambda c, s, ch: ResNet9(c, width=32, channels=ch),
    "resnet9_w16": lambda c, s, ch: ResNet9(c, width=16, channels=ch),
}


# The networks of vector inputs (MNIST-1D, digits); every other network takes images (3 × H × W).
VECTOR_MODELS = frozenset({"mlp", "mlp_gelu", "mlp_tanh", "cnn1d"})

# The networks whose loss has kinks: ReLU (or max-pool) activations, where ∇L jumps as a
# pre-activation crosses zero. A finite-difference H·v adds those jumps divided by its radius;
# jvp's Hessian never sees them (docs/guides/concepts.md, "Exact vs finite-difference HVPs"). The others are smooth:
# GELU (ViTs, Swin-T, mlp_gelu), tanh, SiLU and sigmoid (EfficientNet-B0).
RELU_MODELS = frozenset(
    {
        "resnet18",
        "resnet101_cifar",
        "resnet32",
        "resnet50",
        "resnet101",
        "wrn28_2",
        "wrn28_10",
        "pyramidnet110",
        "pyramidnet110_basic",
        "densenet121",
        "resnext29",
        "mlp",
        "cnn1d",
        "resnet9",
        "resnet9_w32",
        "resnet9_w16",
    }
)


def build_model(
    name: str, num_classes: int, image_size: int, *, channels: int = 3, seed: int | None = None
) -> nn.Module:
    """The network ``name`` (see `MODELS`), freshly initialised, in train mode.

    Args:
        name: a key of `MODELS`.
        num_classes: outputs of the classifier.
        image_size: side of the square input images (ViTs need a multiple of 32); for ``mlp`` and
            ``cnn1d`` the length of the input vector (40 for MNIST-1D, 64 for digits).
        channels: of the input images; other than 3 only for the networks of `ANY_CHANNELS`.
        seed: if given, the initialisation draws from ``torch.manual_seed(seed)`` inside a forked RNG,
            so the global RNG is left as it was; otherwise from the global RNG.

    Raises:
        ValueError: unknown ``name``, ``num_classes``/``image_size``/``channels`` < 1, or
            ``channels`` other than 3 for a network outside `ANY_CHANNELS`.
    """
    if name not in MODELS:
        raise ValueError(f"model must be one of {sorted(MODELS)}; got {name!r}")
    for arg, v in (
        ("num_classes", num_classes),
        ("image_size", image_size),
        ("channels", channels),
    ):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{arg} must be an integer >= 1; got {v!r}")
    if channels != 3 and name not in ANY_CHANNELS:
        raise ValueError(
            f"model {name} takes images of 3 channels; for {channels}-channel images use one of "
            f"{', '.join(sorted(ANY_CHANNELS))}"
        )
    ctx = torch.random.fork_rng(devices=[]) if seed is not None else contextlib.nullcontext()
    with ctx:
        if seed is not None:
            torch.manual_seed(seed)
        if channels != 3:
            return ANY_CHANNELS[name](num_classes, image_size, channels)
        return MODELS[name](num_classes, image_size)


def new_head(model: nn.Module, num_classes: int, *, seed: int | None = None) -> nn.Module:
    """``model`` with its classifier, the last ``nn.Linear`` of the network, replaced by a fresh
    one of ``num_classes`` outputs (fine-tuning a pretrained network on another label set)."""
    name, last = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)][-1]
    ctx = torch.random.fork_rng(devices=[]) if seed is not None else contextlib.nullcontext()
    with ctx:
        if seed is not None:
            torch.manual_seed(seed)
        fresh = nn.Linear(last.in_features, num_classes, bias=last.bias is not None)
    parent, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, attr, fresh)
    return model


def count_parameters(model: nn.Module) -> int:
    """Number of trainable scalars."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
