"""Small modules with BatchNorm for step and contract tests, and the CIFAR ResNet and ViT of the GPU
check."""

import torch
import torch.nn.functional as F
from torch import nn

import gamfunc


class TinyResNet(nn.Module):
    """conv-BN-ReLU stem, one residual block with BatchNorm, pooled linear head (CIFAR-like, tiny)."""

    def __init__(self, width=4, classes=3):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU()
        )
        self.block = nn.Sequential(
            nn.Conv2d(width, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1),
            nn.BatchNorm2d(width),
        )
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        h = self.stem(x)
        h = torch.relu(h + self.block(h))
        return self.head(h.mean(dim=(2, 3)))


def tiny_bn_mlp(dtype=torch.float32):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 3)).to(dtype)


def image_batch(n=8, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 6, 6, generator=g, dtype=dtype), torch.randint(0, 3, (n,), generator=g)


def vector_batch(n=8, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=g, dtype=dtype), torch.randint(0, 3, (n,), generator=g)


def tiny_conv_bn() -> nn.Module:
    """Parameters of four shapes (4-d conv, 1-d BatchNorm, 2-d and 1-d linear)."""
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1, bias=False),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(16, 5),
    )


# ---- the CIFAR ResNet and the ViT of reproduce/models/, for the GPU check and the compile tests ----
# Written again here, without einops, so that the library's tests need no checkout; the same modules
# in the same order, so the same seed initialises them alike (tests/checkout/test_reproduce_models.py checks
# that they compute what reproduce/'s networks compute).


def conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    """A 3×3 convolution, padding 1, no bias (a BatchNorm follows it)."""
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    """Post-activation basic block: conv-BN-act-conv-BN, plus a 1×1 projection when the shape changes."""

    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int = 1, act=F.relu):
        super().__init__()
        self.act = act
        self.conv1, self.bn1 = conv3x3(cin, planes, stride), nn.BatchNorm2d(planes)
        self.conv2, self.bn2 = conv3x3(planes, planes), nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x):
        out = self.act(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.act(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet with a 3×3 stride-1 stem and no max-pool, stages of 64·2^i planes: ``layers=[2, 2, 2,
    2]`` is the CIFAR ResNet-18 of reproduce/ (``build_model("resnet18", ...)``); ``act`` the
    activation (GELU makes ∇L continuous)."""

    def __init__(self, layers, num_classes: int, act=F.relu):
        super().__init__()
        self.act = act
        self.conv1, self.bn1 = conv3x3(3, 64), nn.BatchNorm2d(64)
        stages, cin = [], 64
        for i, n in enumerate(layers):
            planes = 64 * 2**i
            blocks = []
            for j in range(n):
                stride = 2 if (i > 0 and j == 0) else 1
                blocks.append(BasicBlock(cin, planes, stride=stride, act=act))
                cin = planes
            stages.append(nn.Sequential(*blocks))
        self.layers = nn.Sequential(*stages)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        out = self.layers(self.act(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(out, 1), 1))


class _Attention(nn.Module):
    """Multi-head self-attention written as softmax(q·kᵀ/√d)·v, the softmax elementary (forward-mode
    AD and double backward run through it)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, dim = x.shape
        # b n (three h d) -> three b h n d
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        attn = gamfunc.nn.elementary_softmax((q @ k.transpose(-2, -1)) * self.scale, dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, dim))  # b h n d -> b n (h d)


class _ViTBlock(nn.Module):
    """Pre-norm transformer block: x + MHSA(LN(x)), then x + MLP(LN(x)) with GELU."""

    def __init__(self, dim: int, heads: int, mlp_dim: int):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim, eps=1e-6), _Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Linear(mlp_dim, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """Vision Transformer: linear patch embedding, class token, learned positions, pre-norm blocks."""

    def __init__(self, image_size, patch, dim, depth, heads, mlp_dim, num_classes):
        super().__init__()
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

    def forward(self, x):
        b, c, h, w = x.shape
        p = self.patch
        # b c (h p1) (w p2) -> b (h w) (p1 p2 c)
        patches = x.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 3, 5, 1)
        tokens = self.embed(patches.reshape(b, (h // p) * (w // p), p * p * c))
        cls = self.cls.expand(b, -1, -1)
        tokens = torch.cat([cls, tokens], dim=1) + self.pos
        return self.head(self.norm(self.blocks(tokens))[:, 0])
