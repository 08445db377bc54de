"""The ResNets for 32×32 inputs: CIFAR ResNet-18/101 (3×3 stem, no max-pool), ResNet-32 of He et al.
§4.2, Wide-ResNet-28-k, ResNeXt-29 and the fast ResNet-9, with the 3×3 convolution the other CIFAR
networks share."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["CifarResNet", "ResNeXt29", "ResNet9", "ResNet32", "WideResNet", "conv3x3"]


Activation = Callable[[Tensor], Tensor]


def conv3x3(cin: int, cout: int, stride: int = 1, groups: int = 1) -> nn.Conv2d:
    """A 3×3 convolution, padding 1, no bias (a BatchNorm follows it everywhere)."""
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, groups=groups, bias=False)


# ---------------------------------------------------------------- ResNets for 32×32 inputs


class _Basic(nn.Module):
    """Post-activation basic block: conv-BN-ReLU-conv-BN, plus a 1×1 projection when the shape changes."""

    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int = 1, act: Activation = F.relu):
        super().__init__()
        self.act = act
        self.conv1, self.bn1 = conv3x3(cin, planes, stride), nn.BatchNorm2d(planes)
        self.conv2, self.bn2 = conv3x3(planes, planes), nn.BatchNorm2d(planes)
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
        self.conv2, self.bn2 = conv3x3(planes, planes, stride), nn.BatchNorm2d(planes)
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

    def __init__(
        self,
        block,
        layers: list[int],
        num_classes: int,
        act: Activation = F.relu,
        channels: int = 3,
    ):
        super().__init__()
        self.act = act
        self.conv1, self.bn1 = conv3x3(channels, 64), nn.BatchNorm2d(64)
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
        self.conv1, self.bn1 = conv3x3(cin, cout, stride), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = conv3x3(cout, cout), nn.BatchNorm2d(cout)
        self.stride, self.pad = stride, cout - cin

    def forward(self, x: Tensor) -> Tensor:
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        short = x[:, :, :: self.stride, :: self.stride] if self.stride > 1 else x
        if self.pad:
            short = F.pad(short, (0, 0, 0, 0, self.pad // 2, self.pad - self.pad // 2))
        return F.relu(out + short)


class ResNet32(nn.Module):
    """ResNet-6n+2 for CIFAR (He et al. 2016, §4.2) with n = 5: three stages of 16, 32, 64 channels."""

    def __init__(self, num_classes: int, n: int = 5, channels: int = 3):
        super().__init__()
        self.conv1, self.bn1 = conv3x3(channels, 16), nn.BatchNorm2d(16)
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


class _ConvBN(nn.Module):
    """conv3x3-BN-ReLU, then a 2×2 max-pool when ``pool``."""

    def __init__(self, cin: int, cout: int, pool: bool = False):
        super().__init__()
        self.conv, self.bn, self.pool = conv3x3(cin, cout), nn.BatchNorm2d(cout), pool

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn(self.conv(x)))
        return F.max_pool2d(out, 2) if self.pool else out


class _Residual(nn.Module):
    """x + (conv-BN-ReLU)²(x)."""

    def __init__(self, c: int):
        super().__init__()
        self.a, self.b = _ConvBN(c, c), _ConvBN(c, c)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.b(self.a(x))


class ResNet9(nn.Module):
    """The fast ResNet-9 of Page's DAWNBench entry: a stem of w channels, three stages of 2w, 4w, 8w
    channels, each a convolution and a 2×2 max-pool, the first and last followed by a residual pair of
    convolutions, then a global max-pool and a linear classifier whose outputs are scaled by 1/8.

    Eight convolutions and the classifier; every convolution is conv-BN-ReLU. With ``width=64``,
    6.6M parameters. ``channels`` is the input's (Fashion-MNIST: 1).

    References:
        Page, "How to Train Your ResNet" (2018), https://myrtle.ai/learn/how-to-train-your-resnet/;
        the DAWNBench CIFAR-10 entry of that name.
    """

    def __init__(self, num_classes: int, width: int = 64, channels: int = 3, scale: float = 0.125):
        super().__init__()
        w = width
        self.body = nn.Sequential(
            _ConvBN(channels, w),
            _ConvBN(w, 2 * w, pool=True),
            _Residual(2 * w),
            _ConvBN(2 * w, 4 * w, pool=True),
            _ConvBN(4 * w, 8 * w, pool=True),
            _Residual(8 * w),
        )
        self.fc, self.scale = nn.Linear(8 * w, num_classes), scale

    def forward(self, x: Tensor) -> Tensor:
        out = torch.flatten(F.adaptive_max_pool2d(self.body(x), 1), 1)
        return self.fc(out) * self.scale


# ---------------------------------------------------------------- Wide-ResNet


class _WideBlock(nn.Module):
    """Pre-activation block BN-ReLU-conv-BN-ReLU-conv (Zagoruyko and Komodakis, no dropout)."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.bn1, self.conv1 = nn.BatchNorm2d(cin), conv3x3(cin, cout, stride)
        self.bn2, self.conv2 = nn.BatchNorm2d(cout), conv3x3(cout, cout)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Conv2d(cin, cout, 1, stride=stride, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        pre = F.relu(self.bn1(x))
        out = self.conv2(F.relu(self.bn2(self.conv1(pre))))
        return out + (x if self.shortcut is None else self.shortcut(pre))


class WideResNet(nn.Module):
    """WRN-depth-k: a 16-channel stem and three groups of (depth − 4)/6 blocks of 16k, 32k, 64k channels."""

    def __init__(self, depth: int, k: int, num_classes: int, channels: int = 3):
        super().__init__()
        if (depth - 4) % 6:
            raise ValueError(f"depth must be 6n+4; got {depth}")
        n = (depth - 4) // 6
        self.conv1 = conv3x3(channels, 16)
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


# ---------------------------------------------------------------- ResNeXt


class _NeXtBlock(nn.Module):
    """ResNeXt bottleneck: 1×1 to width D, grouped 3×3 (C groups), 1×1 to the output, projection shortcut."""

    def __init__(self, cin: int, width: int, cout: int, cardinality: int, stride: int):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2 = conv3x3(width, width, stride, groups=cardinality)
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
        self.conv1, self.bn1 = conv3x3(3, 64), nn.BatchNorm2d(64)
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
