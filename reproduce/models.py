"""The networks of the paper's experiments, built from scratch: ``build_model(name, num_classes, image_size)``.

| name | network | used in |
|---|---|---|
| ``resnet18`` | ResNet-18 for 32×32 inputs (3×3 stem, no max-pool) | CIFAR, Table 1 |
| ``resnet101_cifar`` | ResNet-101 (bottleneck) with the same 3×3 stem | CIFAR, Table 1 |
| ``resnet32`` | ResNet-32 of He et al. §4.2 (16/32/64 channels, identity shortcuts) | label noise, App. C.2 |
| ``resnet50``, ``resnet101`` | ``torchvision.models.resnet50/101(weights=None)`` | ImageNet, Table 2 |
| ``wrn28_2``, ``wrn28_10`` | Wide-ResNet-28-k, pre-activation, no dropout | CIFAR, Table 1 |
| ``pyramidnet110`` | PyramidNet-110, α = 270, bottleneck blocks: the authors' ``pyramidnet110_c`` | CIFAR, Table 1 |
| ``pyramidnet110_basic`` | PyramidNet-110, α = 270, basic blocks (28.5M parameters for 10 classes) | – |
| ``densenet121`` | torchvision DenseNet-121 with a 3×3 stride-1 stem and no max-pool | CIFAR, App. Table |
| ``resnext29`` | ResNeXt-29 (32×4d) | CIFAR, App. Table |
| ``vit_s32``, ``vit_b32`` | ViT-S/32 and ViT-B/32 (einops; attention as matmul + softmax) | ImageNet, Table 2 |
| ``vit_s16`` | ViT-S/16 (the same ViT, 16-pixel patches) | CIFAR, appendix table |
| ``efficientnet_b0``, ``swin_t`` | ``torchvision.models.efficientnet_b0/swin_t(weights=None)``, fine-tuned from ``--weights`` (:func:`new_head`) | transfer table |
| ``mlp`` | MLP 40-100-100-10 of MNIST-1D (input length ``image_size``) | built-in default |
| ``mlp_gelu``, ``mlp_tanh`` | the same MLP with GELU or tanh: smooth, so finite-difference H·v → exact | built-in |
| ``cnn1d`` | MNIST-1D's ConvBase: three 1-D convolutions of 25 channels and a linear layer | built-in |

Every network is a plain ``nn.Module`` whose forward works under ``torch.func.grad``, ``jvp``, ``vjp`` and
``torch.compile``: no in-place activations on tensors autograd needs, and the ViT attention is written
out as ``softmax(q·kᵀ/√d)·v`` so that forward-mode AD and double backward (exact GAM) run through it.

Example:
    >>> from reproduce.models import build_model
    >>> net = build_model("resnet18", num_classes=10, image_size=32)
    >>> sum(p.numel() for p in net.parameters())
    11173962

References:
    He, Zhang, Ren, Sun, "Deep Residual Learning for Image Recognition", CVPR 2016, https://arxiv.org/abs/1512.03385.
    Zagoruyko, Komodakis, "Wide Residual Networks", BMVC 2016, https://arxiv.org/abs/1605.07146.
    Han, Kim, Kim, "Deep Pyramidal Residual Networks", CVPR 2017, https://arxiv.org/abs/1610.02915.
    Huang et al., "Densely Connected Convolutional Networks", CVPR 2017, https://arxiv.org/abs/1608.06993.
    Xie et al., "Aggregated Residual Transformations for Deep Neural Networks", CVPR 2017, https://arxiv.org/abs/1611.05431.
    Dosovitskiy et al., "An Image is Worth 16x16 Words", ICLR 2021, https://arxiv.org/abs/2010.11929.
    Greydanus, "Scaling down Deep Learning" (MNIST-1D), 2020, https://arxiv.org/abs/2011.14439.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

import gamfunc

__all__ = ["MODELS", "RELU_MODELS", "VECTOR_MODELS", "build_model", "count_parameters"]


Activation = Callable[[Tensor], Tensor]


def _conv3x3(cin: int, cout: int, stride: int = 1, groups: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, groups=groups, bias=False)


# ---------------------------------------------------------------- ResNets for 32×32 inputs


class _Basic(nn.Module):
    """Post-activation basic block: conv-BN-ReLU-conv-BN, plus a 1×1 projection when the shape changes."""

    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int = 1, act: Activation = F.relu):
        super().__init__()
        self.act = act
        self.conv1, self.bn1 = _conv3x3(cin, planes, stride), nn.BatchNorm2d(planes)
        self.conv2, self.bn2 = _conv3x3(planes, planes), nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: Tensor) -> Tensor:
        out = self.act(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.act(out + self.shortcut(x))


class _Bottleneck(nn.Module):
    """Post-activation bottleneck block (1×1, 3×3, 1×1; expansion 4)."""

    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int = 1, act: Activation = F.relu):
        super().__init__()
        self.act = act
        out = planes * self.expansion
        self.conv1, self.bn1 = nn.Conv2d(cin, planes, 1, bias=False), nn.BatchNorm2d(planes)
        self.conv2, self.bn2 = _conv3x3(planes, planes, stride), nn.BatchNorm2d(planes)
        self.conv3, self.bn3 = nn.Conv2d(planes, out, 1, bias=False), nn.BatchNorm2d(out)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out)
            )

    def forward(self, x: Tensor) -> Tensor:
        out = self.act(self.bn1(self.conv1(x)))
        out = self.act(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.act(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet with a 3×3 stride-1 stem and no max-pool, four stages of 64·2^i planes (for 32×32 inputs).

    ``act`` is the activation (ReLU; a smooth one such as ``F.gelu`` makes ∇L continuous, so that
    finite differences and low-precision steps can be compared with float64 at rounding tolerance).
    """

    def __init__(self, block, layers: list[int], num_classes: int, act: Activation = F.relu):
        super().__init__()
        self.act = act
        self.conv1, self.bn1 = _conv3x3(3, 64), nn.BatchNorm2d(64)
        stages, cin = [], 64
        for i, n in enumerate(layers):
            planes = 64 * 2**i
            blocks = []
            for j in range(n):
                blocks.append(block(cin, planes, stride=2 if (i > 0 and j == 0) else 1, act=act))
                cin = planes * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.layers = nn.Sequential(*stages)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        out = self.layers(self.act(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(out, 1), 1))


class _ResNet32Block(nn.Module):
    """He et al. §4.2 block: identity shortcut, zero-padded and subsampled when the shape changes (option A)."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1, self.bn1 = _conv3x3(cin, cout, stride), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = _conv3x3(cout, cout), nn.BatchNorm2d(cout)
        self.stride, self.pad = stride, cout - cin

    def forward(self, x: Tensor) -> Tensor:
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        short = x[:, :, :: self.stride, :: self.stride] if self.stride > 1 else x
        if self.pad:
            short = F.pad(short, (0, 0, 0, 0, self.pad // 2, self.pad - self.pad // 2))
        return F.relu(out + short)


class ResNet32(nn.Module):
    """ResNet-6n+2 for CIFAR (He et al. 2016, §4.2) with n = 5: three stages of 16, 32, 64 channels."""

    def __init__(self, num_classes: int, n: int = 5):
        super().__init__()
        self.conv1, self.bn1 = _conv3x3(3, 16), nn.BatchNorm2d(16)
        blocks, cin = [], 16
        for i, cout in enumerate((16, 32, 64)):
            for j in range(n):
                blocks.append(_ResNet32Block(cin, cout, 2 if (i > 0 and j == 0) else 1))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(64, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d | nn.Linear):
                nn.init.kaiming_normal_(m.weight)

    def forward(self, x: Tensor) -> Tensor:
        out = self.blocks(F.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(out, 1), 1))


# ---------------------------------------------------------------- Wide-ResNet


class _WideBlock(nn.Module):
    """Pre-activation block BN-ReLU-conv-BN-ReLU-conv (Zagoruyko and Komodakis, no dropout)."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.bn1, self.conv1 = nn.BatchNorm2d(cin), _conv3x3(cin, cout, stride)
        self.bn2, self.conv2 = nn.BatchNorm2d(cout), _conv3x3(cout, cout)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Conv2d(cin, cout, 1, stride=stride, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        pre = F.relu(self.bn1(x))
        out = self.conv2(F.relu(self.bn2(self.conv1(pre))))
        return out + (x if self.shortcut is None else self.shortcut(pre))


class WideResNet(nn.Module):
    """WRN-depth-k: a 16-channel stem and three groups of (depth − 4)/6 blocks of 16k, 32k, 64k channels."""

    def __init__(self, depth: int, k: int, num_classes: int):
        super().__init__()
        if (depth - 4) % 6:
            raise ValueError(f"depth must be 6n+4; got {depth}")
        n = (depth - 4) // 6
        self.conv1 = _conv3x3(3, 16)
        blocks, cin = [], 16
        for i, width in enumerate((16 * k, 32 * k, 64 * k)):
            for j in range(n):
                blocks.append(_WideBlock(cin, width, 2 if (i > 0 and j == 0) else 1))
                cin = width
        self.blocks = nn.Sequential(*blocks)
        self.bn = nn.BatchNorm2d(cin)
        self.fc = nn.Linear(cin, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn(self.blocks(self.conv1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(out, 1), 1))


# ---------------------------------------------------------------- PyramidNet


def _pyramid_shortcut(x: Tensor, stride: int, pad: int) -> Tensor:
    """PyramidNet's shortcut: x, average-pooled 2×2 (ceil mode) when the block is strided, with ``pad``
    zero channels appended (Han et al. 2017; the authors' ``pyramidnet_cifar.py`` l.48-54, l.192)."""
    short = F.avg_pool2d(x, 2, ceil_mode=True) if stride > 1 else x
    return F.pad(short, (0, 0, 0, 0, 0, pad)) if pad else short


class _PyramidBlock(nn.Module):
    """Basic block BN-conv3×3-BN-ReLU-conv3×3-BN, ``planes`` output channels, :func:`_pyramid_shortcut`."""

    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int):
        super().__init__()
        self.bn1, self.conv1 = nn.BatchNorm2d(cin), _conv3x3(cin, planes, stride)
        self.bn2, self.conv2 = nn.BatchNorm2d(planes), _conv3x3(planes, planes)
        self.bn3 = nn.BatchNorm2d(planes)
        self.stride, self.pad = stride, planes - cin

    def forward(self, x: Tensor) -> Tensor:
        out = self.bn3(self.conv2(F.relu(self.bn2(self.conv1(self.bn1(x))))))
        return out + _pyramid_shortcut(x, self.stride, self.pad)


class _PyramidBottleneck(nn.Module):
    """Bottleneck block BN-conv1×1-BN-ReLU-conv3×3(stride)-BN-ReLU-conv1×1-BN with 4·``planes`` output
    channels and :func:`_pyramid_shortcut` (the authors' ``Bottleneck``, ``pyramidnet_cifar.py`` l.59-110)."""

    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int):
        super().__init__()
        out = planes * self.expansion
        self.bn1, self.conv1 = nn.BatchNorm2d(cin), nn.Conv2d(cin, planes, 1, bias=False)
        self.bn2, self.conv2 = nn.BatchNorm2d(planes), _conv3x3(planes, planes, stride)
        self.bn3, self.conv3 = nn.BatchNorm2d(planes), nn.Conv2d(planes, out, 1, bias=False)
        self.bn4 = nn.BatchNorm2d(out)
        self.stride, self.pad = stride, out - cin

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn2(self.conv1(self.bn1(x))))
        out = self.bn4(self.conv3(F.relu(self.bn3(self.conv2(out)))))
        return out + _pyramid_shortcut(x, self.stride, self.pad)


class PyramidNet(nn.Module):
    """PyramidNet for 32×32 inputs (Han et al. 2017): a 16-channel stem, three stages of n blocks, the
    block's ``planes`` growing by α/(3n) per block, from 16 to 16 + α, rounded to an integer.

    Basic blocks: n = (depth − 2)/6, each block outputs ``planes`` channels. ``bottleneck=True``:
    n = (depth − 2)/9, each block outputs 4·``planes`` channels, the next block's input. The widths
    follow the authors' ``pyramidal_make_layer`` (github.com/xxgege/GAM, commit 694133d,
    ``models/pyramidnet_cifar.py`` l.189-204): width_k = 16 + k·α/(3n) summed in floating point,
    planes = Python's ``round`` of it (halves to even), Conv2d weights N(0, 2/(k²·out)) (l.181-184).
    """

    def __init__(self, depth: int, alpha: float, num_classes: int, bottleneck: bool = False):
        super().__init__()
        per = 9 if bottleneck else 6
        if (depth - 2) % per:
            raise ValueError(f"depth must be {per}n+2; got {depth}")
        n = (depth - 2) // per
        block = _PyramidBottleneck if bottleneck else _PyramidBlock
        add = alpha / (3 * n)
        self.conv1, self.bn1 = _conv3x3(3, 16), nn.BatchNorm2d(16)
        blocks, width, cin = [], 16.0, 16
        for i in range(3):
            for j in range(n):
                width += add
                planes = round(width)
                blocks.append(block(cin, planes, 2 if (i > 0 and j == 0) else 1))
                cin = planes * block.expansion
        self.blocks = nn.Sequential(*blocks)
        self.bn_final = nn.BatchNorm2d(cin)
        self.fc = nn.Linear(cin, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: Tensor) -> Tensor:
        out = self.blocks(self.bn1(self.conv1(x)))
        out = F.relu(self.bn_final(out))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(out, 1), 1))


# ---------------------------------------------------------------- ResNeXt


class _NeXtBlock(nn.Module):
    """ResNeXt bottleneck: 1×1 to width D, grouped 3×3 (C groups), 1×1 to the output, projection shortcut."""

    def __init__(self, cin: int, width: int, cout: int, cardinality: int, stride: int):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2 = _conv3x3(width, width, stride, groups=cardinality)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        return F.relu(self.bn3(self.conv3(out)) + self.shortcut(x))


class ResNeXt29(nn.Module):
    """ResNeXt-29 (C×d) for CIFAR: a 64-channel stem, three stages of three blocks, outputs 256/512/1024."""

    def __init__(self, num_classes: int, cardinality: int = 32, base_width: int = 4):
        super().__init__()
        self.conv1, self.bn1 = _conv3x3(3, 64), nn.BatchNorm2d(64)
        blocks, cin = [], 64
        for i in range(3):
            width, cout = cardinality * base_width * 2**i, 256 * 2**i
            for j in range(3):
                stride = 2 if (i > 0 and j == 0) else 1
                blocks.append(_NeXtBlock(cin, width, cout, cardinality, stride))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        out = self.blocks(F.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(out, 1), 1))


def _densenet121_cifar(num_classes: int) -> nn.Module:
    """torchvision's DenseNet-121 (growth 32, blocks 6/12/24/16) with a 3×3 stride-1 stem and no max-pool."""
    from torchvision.models import densenet121

    net = densenet121(weights=None, num_classes=num_classes)
    net.features.conv0 = _conv3x3(3, 64)
    nn.init.kaiming_normal_(net.features.conv0.weight)
    net.features.pool0 = nn.Identity()
    return net


# ---------------------------------------------------------------- ViT


class _Attention(nn.Module):
    """Multi-head self-attention written as softmax(q·kᵀ/√d)·v.

    ``F.scaled_dot_product_attention`` dispatches to fused kernels that have neither forward-mode AD
    nor double backward; the explicit form supports ``jvp`` and ``grad`` of ``grad`` (exact GAM). The
    softmax is written out too (:func:`gamfunc.nn.elementary_softmax`), so that a compiled exact-GAM
    point shares its gradient pass with the primal of its forward-over-reverse H·v.
    """

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = rearrange(self.qkv(x), "b n (three h d) -> three b h n d", three=3, h=self.heads)
        attn = gamfunc.nn.elementary_softmax((q @ k.transpose(-2, -1)) * self.scale, dim=-1)
        return self.proj(rearrange(attn @ v, "b h n d -> b n (h d)"))


class _ViTBlock(nn.Module):
    """Pre-norm transformer block: x + MHSA(LN(x)), then x + MLP(LN(x)) with GELU."""

    def __init__(self, dim: int, heads: int, mlp_dim: int):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim, eps=1e-6), _Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Linear(mlp_dim, dim))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """Vision Transformer: linear patch embedding, class token, learned positions, pre-norm blocks."""

    def __init__(
        self,
        image_size: int,
        patch: int,
        dim: int,
        depth: int,
        heads: int,
        mlp_dim: int,
        num_classes: int,
    ):
        super().__init__()
        if image_size % patch:
            raise ValueError(
                f"image_size must be a multiple of the patch size {patch}; got {image_size}"
            )
        self.patch = patch
        n = (image_size // patch) ** 2
        self.embed = nn.Linear(3 * patch * patch, dim)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.zeros(1, n + 1, dim))
        self.blocks = nn.Sequential(*[_ViTBlock(dim, heads, mlp_dim) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes)
        nn.init.trunc_normal_(self.pos, std=0.02)
        nn.init.trunc_normal_(self.cls, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        p = self.patch
        tokens = self.embed(rearrange(x, "b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=p, p2=p))
        cls = self.cls.expand(tokens.shape[0], -1, -1)
        tokens = torch.cat([cls, tokens], dim=1) + self.pos
        return self.head(self.norm(self.blocks(tokens))[:, 0])


# ---------------------------------------------------------------- MNIST-1D


ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "tanh": nn.Tanh,
}


class MLP(nn.Module):
    """MNIST-1D's MLP: inputs → 100 → 100 → classes with ReLU (or ``activation``: gelu, tanh)."""

    def __init__(self, inputs: int, num_classes: int, hidden: int = 100, activation: str = "relu"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}; got {activation!r}")
        act = ACTIVATIONS[activation]
        self.net = nn.Sequential(
            nn.Linear(inputs, hidden),
            act(),
            nn.Linear(hidden, hidden),
            act(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x.flatten(1))


class ConvBase(nn.Module):
    """MNIST-1D's ConvBase: conv(1→25, k5, s2) → conv(25→25, k3, s2) → conv(25→25, k3, s2) → linear, ReLU."""

    def __init__(self, length: int, num_classes: int, channels: int = 25):
        super().__init__()
        self.conv1 = nn.Conv1d(1, channels, 5, stride=2, padding=1)
        self.conv2 = nn.Conv1d(channels, channels, 3, stride=2, padding=1)
        self.conv3 = nn.Conv1d(channels, channels, 3, stride=2, padding=1)
        out = length
        for k in (5, 3, 3):
            out = (out + 2 - k) // 2 + 1
        self.linear = nn.Linear(channels * out, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        h = x.reshape(x.shape[0], 1, -1)
        h = F.relu(self.conv3(F.relu(self.conv2(F.relu(self.conv1(h))))))
        return self.linear(h.flatten(1))


# ---------------------------------------------------------------- registry


def _torchvision(name: str) -> Callable[[int, int], nn.Module]:
    def build(num_classes: int, image_size: int) -> nn.Module:
        import torchvision

        return getattr(torchvision.models, name)(weights=None, num_classes=num_classes)

    return build


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
    }
)


def build_model(
    name: str, num_classes: int, image_size: int, *, seed: int | None = None
) -> nn.Module:
    """The network ``name`` (see :data:`MODELS`), freshly initialised, in train mode.

    Args:
        name: a key of :data:`MODELS`.
        num_classes: outputs of the classifier.
        image_size: side of the square input images (ViTs need a multiple of 32); for ``mlp`` and
            ``cnn1d`` the length of the input vector (40 for MNIST-1D, 64 for digits).
        seed: if given, the initialisation draws from ``torch.manual_seed(seed)`` inside a forked RNG,
            so the global RNG is left as it was; otherwise from the global RNG.

    Raises:
        ValueError: unknown ``name``, or ``num_classes``/``image_size`` < 1.
    """
    if name not in MODELS:
        raise ValueError(f"model must be one of {sorted(MODELS)}; got {name!r}")
    for arg, v in (("num_classes", num_classes), ("image_size", image_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{arg} must be an integer >= 1; got {v!r}")
    ctx = torch.random.fork_rng(devices=[]) if seed is not None else contextlib.nullcontext()
    with ctx:
        if seed is not None:
            torch.manual_seed(seed)
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
