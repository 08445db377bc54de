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
| ``efficientnet_b0``, ``swin_t`` | ``torchvision.models.efficientnet_b0/swin_t(weights=None)``, fine-tuned from ``--weights`` (`new_head`) | transfer table |
| ``mlp`` | MLP 40-100-100-10 of MNIST-1D (input length ``image_size``) | built-in default |
| ``mlp_gelu``, ``mlp_tanh`` | the same MLP with GELU or tanh: smooth, so finite-difference H·v → exact | built-in |
| ``cnn1d`` | MNIST-1D's ConvBase: three 1-D convolutions of 25 channels and a linear layer | built-in |
| ``resnet9``, ``resnet9_w32``, ``resnet9_w16`` | the fast ResNet-9 of Page's DAWNBench entry at width 64, 32, 16 (any number of input channels) | Fashion-MNIST |

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

The package is one module per family: `resnets` (CIFAR ResNets, ResNet-32,
Wide-ResNet, ResNeXt-29), `pyramidnet`, `vit`,
`mnist1d` (MLP, ConvBase), and `registry`, which names
them for `build_model` (DenseNet-121 and the torchvision networks are built there).
"""

from reproduce.models.mnist1d import ACTIVATIONS, MLP, ConvBase
from reproduce.models.pyramidnet import PyramidNet
from reproduce.models.registry import (
    ANY_CHANNELS,
    MODELS,
    RELU_MODELS,
    VECTOR_MODELS,
    build_model,
    count_parameters,
    new_head,
)
from reproduce.models.resnets import CifarResNet, ResNet9, ResNet32, ResNeXt29, WideResNet
from reproduce.models.vit import ViT

__all__ = [
    "ACTIVATIONS",
    "ANY_CHANNELS",
    "MLP",
    "MODELS",
    "RELU_MODELS",
    "VECTOR_MODELS",
    "CifarResNet",
    "ConvBase",
    "PyramidNet",
    "ResNeXt29",
    "ResNet9",
    "ResNet32",
    "ViT",
    "WideResNet",
    "build_model",
    "count_parameters",
    "new_head",
]
