"""reproduce/models/: every network builds, has the published size, and runs under torch.func."""

import models
import pytest
import torch
import torch.nn.functional as F
import torchvision

import gamfunc
from reproduce.models import CifarResNet, ViT, build_model, count_parameters
from reproduce.models.resnets import _Basic

VECTOR = {"mlp": 40, "cnn1d": 40}


# Parameter counts against references: torchvision's own models, the Wide-ResNet paper (36.5M, 1.5M),
# He et al. (0.46M) and MNIST-1D's models. Built on the meta device: no memory, no initialisation time.
def _tv(name: str) -> int:
    with torch.device("meta"):
        return count_parameters(getattr(torchvision.models, name)(weights=None))


REFERENCE_SIZES = {
    ("resnet18", 10, 32): lambda: 11_173_962,
    ("resnet32", 10, 32): lambda: 464_154,
    ("wrn28_2", 10, 32): lambda: 1_467_610,
    ("wrn28_10", 10, 32): lambda: 36_479_194,
    # The authors' PyramidNet-110 (github.com/xxgege/GAM, commit 694133d): pyramidnet110_c(num_classes)
    # = PyramidNet('cifar10', 110, 270, num_classes, bottleneck=True), models/pyramidnet_cifar.py
    # l.241-242, instantiated from their file (torch 2.14.1) and its trainable parameters counted.
    ("pyramidnet110", 10, 32): lambda: 18_323_787,
    ("pyramidnet110", 100, 32): lambda: 18_426_837,
    # Their PyramidNet('cifar10', 110, 270, 10, bottleneck=False): basic blocks (l.123-125), counted so.
    ("pyramidnet110_basic", 10, 32): lambda: 28_485_477,
    ("resnet50", 1000, 224): lambda: _tv("resnet50"),
    ("resnet101", 1000, 224): lambda: _tv("resnet101"),
    ("vit_b32", 1000, 224): lambda: _tv("vit_b_32"),
    ("mlp", 10, 40): lambda: 40 * 100 + 100 + 100 * 100 + 100 + 100 * 10 + 10,
    ("cnn1d", 10, 40): lambda: (25 * 5 + 25) + 2 * (25 * 25 * 3 + 25) + (125 * 10 + 10),
}


@pytest.mark.parametrize("name", sorted(VECTOR))
def test_mnist1d_models_classify(name):
    net = build_model(name, 7, 40, seed=0)
    assert net(torch.randn(2, 40)).shape == (2, 7)


@pytest.mark.parametrize("key", sorted(REFERENCE_SIZES), ids=lambda k: f"{k[0]}-{k[1]}")
def test_parameter_counts_match_references(key):
    with torch.device("meta"):
        net = build_model(*key)
    assert count_parameters(net) == REFERENCE_SIZES[key]()


def test_seed_makes_init_reproducible_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a, b = build_model("resnet32", 10, 32, seed=5), build_model("resnet32", 10, 32, seed=5)
    assert torch.equal(torch.get_rng_state(), before)
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert ka == kb and torch.equal(va, vb)


@pytest.mark.parametrize(
    ("args", "word"), [(("nope", 10, 32), "model"), (("mlp", 0, 40), "num_classes")]
)
def test_bad_arguments_name_themselves(args, word):
    with pytest.raises(ValueError, match=word):
        build_model(*args)


def test_vit_equals_torchvision_vit_with_the_same_weights():
    """Our einops ViT is torchvision's VisionTransformer, written with matmul + softmax attention."""
    cfg = dict(image_size=64, patch=32, dim=16, depth=2, heads=2, mlp_dim=32, num_classes=5)
    ours = ViT(**cfg).double().eval()
    ref = torchvision.models.VisionTransformer(
        image_size=64,
        patch_size=32,
        num_layers=2,
        num_heads=2,
        hidden_dim=16,
        mlp_dim=32,
        num_classes=5,
    )
    ref = ref.double().eval()
    sd = {
        "embed.weight": ref.conv_proj.weight.permute(0, 2, 3, 1).reshape(16, -1),
        "embed.bias": ref.conv_proj.bias,
        "cls": ref.class_token,
        "pos": ref.encoder.pos_embedding,
        "norm.weight": ref.encoder.ln.weight,
        "norm.bias": ref.encoder.ln.bias,
        "head.weight": ref.heads.head.weight,
        "head.bias": ref.heads.head.bias,
    }
    for i in range(2):
        layer = getattr(ref.encoder.layers, f"encoder_layer_{i}")
        sd |= {
            f"blocks.{i}.norm1.weight": layer.ln_1.weight,
            f"blocks.{i}.norm1.bias": layer.ln_1.bias,
            f"blocks.{i}.attn.qkv.weight": layer.self_attention.in_proj_weight,
            f"blocks.{i}.attn.qkv.bias": layer.self_attention.in_proj_bias,
            f"blocks.{i}.attn.proj.weight": layer.self_attention.out_proj.weight,
            f"blocks.{i}.attn.proj.bias": layer.self_attention.out_proj.bias,
            f"blocks.{i}.norm2.weight": layer.ln_2.weight,
            f"blocks.{i}.norm2.bias": layer.ln_2.bias,
            f"blocks.{i}.mlp.0.weight": layer.mlp[0].weight,
            f"blocks.{i}.mlp.0.bias": layer.mlp[0].bias,
            f"blocks.{i}.mlp.2.weight": layer.mlp[3].weight,
            f"blocks.{i}.mlp.2.bias": layer.mlp[3].bias,
        }
    ours.load_state_dict({k: v.detach().clone() for k, v in sd.items()})
    x = torch.randn(3, 3, 64, 64, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), rtol=1e-10, atol=1e-10)


def test_vit_attention_supports_forward_mode_and_double_backward():
    """Exact GAM needs jvp(grad) and grad(grad): both H·v products agree with each other."""
    net = ViT(32, 32, 8, 1, 2, 16, 3).double()
    loss_fn, params, buffers = gamfunc.nn.functionalize(net)
    batch = (torch.randn(4, 3, 32, 32, dtype=torch.float64), torch.tensor([0, 1, 2, 0]))

    def loss(p, b):
        return loss_fn(p, b, buffers)[0]

    v = {k: torch.randn_like(t) for k, t in params.items()}
    hv_fwd, _ = gamfunc.hvps.exact()(loss, params, batch, v)
    hv_rev, _ = gamfunc.hvps.reverse()(loss, params, batch, v)
    for k in params:
        torch.testing.assert_close(hv_fwd[k], hv_rev[k], rtol=1e-9, atol=1e-11)
    assert gamfunc.tree.norm(hv_fwd) > 0


def test_resnet32_shortcut_is_zero_padded_identity():
    """He et al.'s option A: the shortcut of a widening block is x subsampled, with zero channels added."""
    block = build_model("resnet32", 10, 32).blocks[5]  # first block of stage 2: 16 -> 32, stride 2
    x = torch.randn(1, 16, 8, 8)
    for m in (block.conv1, block.conv2):
        torch.nn.init.zeros_(m.weight)
    block.eval()
    with torch.no_grad():
        out = block(x)
    expected = F.relu(F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, 8, 8)))
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize(
    ("name", "width"), [("pyramidnet110", 4 * 24), ("pyramidnet110_basic", 16 + 5)]
)
def test_pyramidnet_shortcut_is_pooled_and_zero_padded(name, width):
    """The first block of stage 2 (stride 2): with its last BatchNorm's output at zero, the block
    returns x average-pooled 2×2 with zero channels appended (Han et al. 2017, the authors' block)."""
    net = build_model(name, 10, 32)
    n = len(net.blocks) // 3
    block = net.blocks[n]
    last = block.bn4 if name == "pyramidnet110" else block.bn3
    torch.nn.init.zeros_(last.weight)
    block.eval()
    cin = block.bn1.num_features
    x = torch.randn(2, cin, 8, 8)
    with torch.no_grad():
        out = block(x)
    pooled = F.avg_pool2d(x, 2, ceil_mode=True)
    assert out.shape[1] > cin and (name != "pyramidnet110" or out.shape[1] % 4 == 0)
    torch.testing.assert_close(out, F.pad(pooled, (0, 0, 0, 0, 0, out.shape[1] - cin)))
    assert net.blocks[0].bn1.num_features == 16 and net.fc.in_features == (
        4 * 286 if name == "pyramidnet110" else 286
    )
    assert n == (12 if name == "pyramidnet110" else 18)
    assert net.blocks[0](torch.randn(1, 16, 4, 4)).shape[1] == width


def test_vector_models_are_those_that_take_vectors():
    """reproduce.models.VECTOR_MODELS, which train.py checks the data against, lists exactly the
    networks that run on a batch of vectors."""
    from reproduce.models import MODELS, VECTOR_MODELS, build_model

    for name in ("mlp", "mlp_gelu", "mlp_tanh", "cnn1d", "resnet18", "resnet32", "vit_s32"):
        net = build_model(name, 10, 40 if name in VECTOR_MODELS else 32)
        try:
            net(torch.randn(2, 40))
            takes_vectors = True
        except (RuntimeError, ValueError, IndexError):
            takes_vectors = False
        assert takes_vectors == (name in VECTOR_MODELS), name
    assert set(MODELS) >= VECTOR_MODELS


def test_relu_models_are_those_whose_forward_has_a_kink():
    """reproduce.models.RELU_MODELS, which train.py's finite-difference GAM warning reads, lists
    exactly the networks whose forward pass calls a ReLU or a max-pool (recorded on the meta device)."""
    from torch.overrides import TorchFunctionMode

    from reproduce.models import MODELS, RELU_MODELS, VECTOR_MODELS

    class Calls(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.names = set()

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.names.add(getattr(func, "__name__", ""))
            return func(*args, **(kwargs or {}))

    for name in sorted(MODELS):
        size = 40 if name in VECTOR_MODELS else 32
        with torch.device("meta"):
            net = build_model(name, 10, size)
            x = torch.randn(2, size) if name in VECTOR_MODELS else torch.randn(2, 3, size, size)
        with Calls() as calls, torch.no_grad():
            net(x)
        kinked = any("relu" in n or "max_pool" in n for n in calls.names)
        assert kinked == (name in RELU_MODELS), name


@pytest.mark.parametrize(
    "ours, theirs, shape",
    [
        (
            lambda: models.CifarResNet([1, 1], 10, act=F.gelu),
            lambda: CifarResNet(_Basic, [1, 1], 10, act=F.gelu),
            (2, 3, 16, 16),
        ),
        (
            lambda: models.CifarResNet([2, 2, 2, 2], 10),
            lambda: build_model("resnet18", 10, 32),
            (2, 3, 32, 32),
        ),
        (
            lambda: models.ViT(16, 4, 64, 2, 4, 128, 10),
            lambda: ViT(16, 4, 64, 2, 4, 128, 10),
            (2, 3, 16, 16),
        ),
    ],
    ids=["resnet-gelu", "resnet18", "vit"],
)
def test_the_library_tests_networks_are_reproduce_s(ours, theirs, shape):
    """tests/models.py writes the CIFAR ResNet and the ViT again, without einops, for the GPU check
    and the compile tests: from one seed, the same parameters and the same outputs."""
    torch.manual_seed(0)
    a = ours()
    torch.manual_seed(0)
    b = theirs()
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(a(x), b(x), rtol=0, atol=0)
