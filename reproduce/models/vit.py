"""The Vision Transformer (ViT-S/16, S/32, B/32), its attention written out as softmax(q·kᵀ/√d)·v so
that forward-mode AD and double backward (exact GAM) run through it."""

from __future__ import annotations

import torch
from einops import rearrange
from torch import Tensor, nn

import gamfunc

__all__ = ["ViT"]


class _Attention(nn.Module):
    """Multi-head self-attention written as softmax(q·kᵀ/√d)·v.

    ``F.scaled_dot_product_attention`` dispatches to fused kernels that have neither forward-mode AD
    nor double backward; the explicit form supports ``jvp`` and ``grad`` of ``grad`` (exact GAM). The
    softmax is written out too ([`gamfunc.nn.elementary_softmax`][gamfunc.nn.elementary_softmax]), so that a compiled exact-GAM
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
