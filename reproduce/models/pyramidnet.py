"""PyramidNet for 32×32 inputs (Han et al. 2017), basic or bottleneck blocks, widths and
initialisation as in the GAM authors' ``pyramidnet_cifar.py``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from reproduce.models.resnets import conv3x3

__all__ = ["PyramidNet"]


def _pyramid_shortcut(x: Tensor, stride: int, pad: int) -> Tensor:
    """PyramidNet's shortcut: x, average-pooled 2×2 (ceil mode) when the block is strided, with ``pad``
    zero channels appended (Han et al. 2017; the authors' ``pyramidnet_cifar.py`` l.48-54, l.192)."""
    short = F.avg_pool2d(x, 2, ceil_mode=True) if stride > 1 else x
    return F.pad(short, (0, 0, 0, 0, 0, pad)) if pad else short


class _PyramidBlock(nn.Module):
    """Basic block BN-conv3×3-BN-ReLU-conv3×3-BN, ``planes`` output channels, `_pyramid_shortcut`."""

    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int):
        super().__init__()
        self.bn1, self.conv1 = nn.BatchNorm2d(cin), conv3x3(cin, planes, stride)
        self.bn2, self.conv2 = nn.BatchNorm2d(planes), conv3x3(planes, planes)
        self.bn3 = nn.BatchNorm2d(planes)
        self.stride, self.pad = stride, planes - cin

    def forward(self, x: Tensor) -> Tensor:
        out = self.bn3(self.conv2(F.relu(self.bn2(self.conv1(self.bn1(x))))))
        return out + _pyramid_shortcut(x, self.stride, self.pad)


class _PyramidBottleneck(nn.Module):
    """Bottleneck block BN-conv1×1-BN-ReLU-conv3×3(stride)-BN-ReLU-conv1×1-BN with 4·``planes`` output
    channels and `_pyramid_shortcut` (the authors' ``Bottleneck``, ``pyramidnet_cifar.py`` l.59-110)."""

    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int):
        super().__init__()
        out = planes * self.expansion
        self.bn1, self.conv1 = nn.BatchNorm2d(cin), nn.Conv2d(cin, planes, 1, bias=False)
        self.bn2, self.conv2 = nn.BatchNorm2d(planes), conv3x3(planes, planes, stride)
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
        self.conv1, self.bn1 = conv3x3(3, 16), nn.BatchNorm2d(16)
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
