"""reproduce/config.py: overrides, validation, and presets that carry the paper's numbers."""

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # reproduce/ lives at the repository root
from reproduce import train
from reproduce.config import (
    PRESETS,
    RESUME_FREE,
    Config,
    differences,
    field_help,
    parse_overrides,
    resolve,
)

# Appendix Table app:tab:hp1 (lr, weight decay; SGD, 200 epochs, cosine, batch 128) and C.5's text
# (ρ = 0.04 on CIFAR-10, 0.1 on CIFAR-100; α = 0.3 for ResNet-18, 0.1 for the other models).
HP1 = {
    "resnet18": (0.1, 5e-4),
    "resnet101": (0.1, 5e-4),
    "wrn28_2": (0.1, 5e-4),
    "wrn28_10": (0.1, 5e-4),
    "pyramidnet110": (0.05, 5e-4),
    "densenet121": (0.1, 1e-3),
    "resnext29": (0.1, 5e-4),
}
# Table app:tab:hp2: (ρ, α, lr, weight decay, base, epochs).
HP2 = {
    "resnet50": (0.2, 0.1, 0.1, 1e-4, "sgd", 90),
    "resnet101": (0.2, 0.1, 0.1, 1e-4, "sgd", 90),
    "vit_s32": (0.3, 0.5, 3e-4, 0.3, "adamw", 300),
    "vit_b32": (0.3, 0.5, 3e-4, 0.3, "adamw", 300),
}


@pytest.mark.parametrize("dataset", ["cifar10", "cifar100"])
@pytest.mark.parametrize("model", sorted(HP1))
def test_hp1_presets_carry_table_values(dataset, model):
    c = resolve([f"--preset=hp1.{dataset}.{model}"])
    lr, wd = HP1[model]
    assert (c.lr, c.weight_decay, c.base, c.momentum) == (lr, wd, "sgd", 0.9)
    assert (c.epochs, c.schedule, c.batch_size, c.dataset) == (200, "cosine", 128, dataset)
    assert c.rho == (0.04 if dataset == "cifar10" else 0.1)
    assert c.alpha == (0.3 if model == "resnet18" else 0.1)
    assert c.model == ("resnet101_cifar" if model == "resnet101" else model)


@pytest.mark.parametrize("model", sorted(HP2))
def test_hp2_presets_carry_table_values(model):
    c = resolve([f"--preset=hp2.imagenet.{model}"])
    rho, alpha, lr, wd, base, epochs = HP2[model]
    assert (c.rho, c.alpha, c.lr, c.weight_decay, c.base, c.epochs) == (
        rho,
        alpha,
        lr,
        wd,
        base,
        epochs,
    )
    assert (c.model, c.dataset, c.image_size, c.schedule) == (model, "imagenet", 224, "cosine")
    assert (c.beta1, c.beta2) == (0.9, 0.999)


def test_label_noise_and_overhead_presets():
    for pct in (0, 20, 40, 60, 80):
        c = resolve([f"--preset=noise.cifar10.resnet32.p{pct}"])
        assert (c.model, c.dataset, c.label_noise, c.epochs) == (
            "resnet32",
            "cifar10",
            pct / 100,
            200,
        )
    for pct, every in ((5, 20), (10, 10), (50, 2), (100, 1)):
        c = resolve([f"--preset=time.cifar100.resnet18.gam{pct}pct"])
        assert (c.every, c.model, c.dataset) == (every, "resnet18", "cifar100")


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_builds_its_estimator_and_optimizer(preset):
    c = resolve([f"--preset={preset}"])
    for name in c.estimator.split(","):
        lr = train.lr_schedule(c, steps_per_epoch=10)
        estimator, _ = train.build_estimator(c, name, lr)
        names = {"gradient", "sam", "gnp", "gam", "sam+gam", "gam_accelerated"}
        assert estimator.name in names | {"gam_accelerated[official]"}
        train.build_optimizer(c, lr)


def test_default_is_the_mnist1d_comparison():
    c = resolve([])
    assert (c.preset, c.dataset, c.model, c.estimator) == ("mnist1d", "mnist1d", "mlp", "sgd,gam")
    assert c.threads == 1


def test_overrides_accept_dashes_bare_flags_and_separate_values():
    got = parse_overrides(["--val-fraction=0.1", "--bf16", "--lr", "0.5", "--compile=false"])
    assert got == [("val_fraction", 0.1), ("bf16", True), ("lr", 0.5), ("compile", False)]


def test_overrides_apply_after_the_preset_whatever_their_order():
    c = resolve(["--lr=0.3", "--preset=hp1.cifar10.resnet18"])
    assert (c.lr, c.model) == (0.3, "resnet18")


@pytest.mark.parametrize(
    ("argv", "word"),
    [
        (["--learning_rate=0.1"], "unknown option --learning_rate"),
        (["--lr=fast"], "--lr takes a float"),
        (["--bf16=maybe"], "--bf16 takes true or false"),
        (["--preset=hp1.cifar10.resnet19"], "unknown preset"),
        (["--estimator=adam"], "estimator"),
        (["--estimator=sgd,sgd"], "estimator"),
        (["--base=lion"], "base"),
        (["--val_fraction=1.0"], "val_fraction"),
        (["--label_noise=1.5"], "label_noise"),
        (["--every=0"], "every"),
        (["--estimator=gam_accelerated", "--alpha=2"], "alpha"),
        (["--device=tpu"], "device"),
        (["--lr"], "needs a value"),
    ],
)
def test_bad_values_name_the_field(argv, word):
    with pytest.raises(ValueError, match=word):
        resolve(argv)


def test_unknown_key_suggests_the_closest():
    with pytest.raises(ValueError, match="did you mean --val_fraction"):
        resolve(["--val_frac=0.1"])


def test_every_field_has_a_one_line_comment():
    helps = field_help()
    names = [f.name for f in dataclasses.fields(Config)]
    assert sorted(helps) == sorted(names)
    assert all(len(h) > 5 for h in helps.values())


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Config().lr = 1.0  # type: ignore[misc]


def test_differences_ignore_fields_that_do_not_change_the_trajectory():
    a = dataclasses.asdict(resolve([]))
    b = resolve(["--max-steps=10", "--logdir=/elsewhere", "--lr=0.2", "--seed=3"])
    assert set(differences(a, b)) == {"lr", "seed"}
    assert {"max_steps", "logdir", "device", "compile"} <= RESUME_FREE


def test_run_name_follows_the_preset_and_a_dataset_override():
    from reproduce.config import run_name

    assert run_name(resolve([])) == "mnist1d"
    assert run_name(resolve(["--dataset=digits"])) == "mnist1d.digits"
    assert run_name(resolve(["--preset=hp1.cifar10.resnet18", "--name=mine"])) == "mine"


def test_channels_last_is_an_off_by_default_speed_option():
    assert resolve([]).channels_last is False
    assert resolve(["--preset=hp1.cifar10.resnet18"]).channels_last is False
    assert parse_overrides(["--channels-last"]) == [("channels_last", True)]
    assert resolve(["--channels_last=false", "--channels_last"]).channels_last is True
    # it changes rounding, not the trajectory: a checkpoint resumes with it on or off
    assert "channels_last" in RESUME_FREE
    saved = dataclasses.asdict(resolve(["--channels_last"]))
    assert differences(saved, resolve([])) == {}
    assert "channels_last" in train._help()


@pytest.mark.parametrize(
    ("typo", "first", "also"),
    [
        (
            "hp2.cifar10.resnet81",
            "hp1.cifar10.resnet18",
            [],
        ),  # a swap and a family of another table
        ("hp1.cifar10.resent18", "hp1.cifar10.resnet18", []),
        ("cifar10.resnet18", "hp1.cifar10.resnet18", []),  # the presets that end with it
        ("resnet18", "hp1.cifar10.resnet18", ["hp1.cifar100.resnet18", "gnp.cifar100.resnet18"]),
        ("hp2.imagenet.resnet05", "hp2.imagenet.resnet50", []),
        ("mnist", "mnist1d", []),
        ("noise.cifar10.resnet32.p30", "noise.cifar10.resnet32.p0", ["noise.cifar10.resnet32.p40"]),
    ],
)
def test_an_unknown_preset_suggests_the_closest_of_its_family(typo, first, also):
    with pytest.raises(ValueError, match="unknown preset") as e:
        resolve([f"--preset={typo}"])
    near = str(e.value).split("did you mean ")[1].split("?")[0].split(", ")
    assert near[0] == first and set(also) <= set(near) and len(near) <= 5
    assert "hp2.imagenet.vit_b32" not in near


def test_an_unknown_preset_far_from_all_points_to_help():
    with pytest.raises(ValueError, match=r"unknown preset 'xyz'; --help lists all \d+"):
        resolve(["--preset=xyz"])
