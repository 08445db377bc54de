"""reproduce/config.py: overrides, validation, and presets that carry the paper's numbers."""

import dataclasses

import pytest

from reproduce import train
from reproduce.config import (
    ESTIMATORS,
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
        names = {"gradient", "sam", "gnp", "gam", "sam+gam", "gam_accelerated", "gsam"}
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
        (["--lr_schedule_unit=week"], "lr_schedule_unit"),
        (["--lr_schedule_unit=epoch", "--warmup_epochs=0.5"], "warmup_epochs"),
        (["--rho=0.1", "--rho_min=0.2"], "rho_min"),
        (["--rho_min=-0.01"], "rho_min"),
        (["--eta=-0.1"], "--eta must be"),
        (["--gsam_alpha=-0.1"], "--gsam_alpha must be"),
        (["--wsam_gamma=1"], "--wsam_gamma must be"),
        (["--wsam_gamma=-0.5"], "--wsam_gamma must be"),
        (["--look_k=0"], "--look_k must be"),
        (["--looksam_alpha=-1"], "--looksam_alpha must be"),
        (["--fsam_sigma=-1"], "--fsam_sigma must be"),
        (["--fsam_lmbda=1.0"], "--fsam_lmbda must be"),
        (["--ascent_steps=0"], "--ascent_steps must be"),
        (["--gsam_alpha=nan"], "--gsam_alpha must be"),
        (["--wsam_max_norm=-1"], "--wsam_max_norm must be"),
        (["--wsam_max_norm=inf"], "--wsam_max_norm must be"),
        (["--wsam_decouple=maybe"], "--wsam_decouple takes"),
        (["--gsam_adaptive=2"], "--gsam_adaptive takes"),
        (["--asam_mask=biases"], "--asam_mask must be"),
        (["--fsam_convention=pytorch_optimizer"], "--fsam_convention must be"),
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


def test_a_checkpoint_older_than_a_field_resumes_under_its_default_only():
    saved = dataclasses.asdict(resolve([]))
    del saved["lr_schedule_unit"], saved["rho_min"]
    assert differences(saved, resolve([])) == {}
    assert differences(saved, resolve(["--lr_schedule_unit=epoch"])) == {
        "lr_schedule_unit": ("step", "epoch")
    }


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


def _authors_lr_per_step(lr: float, epochs: int, steps_per_epoch: int) -> list[float]:
    """The learning rate of every step of the authors' loop: CosineAnnealingLR(T_max=epochs)
    (gam/optimizer_helper.py l.18 of github.com/xxgege/GAM) stepped after each epoch (main_cifar.py
    l.291), read from the optimiser at each step."""
    import torch

    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs)
    out = []
    for _ in range(epochs):
        for _ in range(steps_per_epoch):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
        sched.step()
    return out


def test_the_authors_presets_step_the_cosine_once_per_epoch_like_their_loop():
    import torch

    c = resolve(["--preset=accelerated.cifar10.resnet18.authors", "--epochs=6"])
    assert c.lr_schedule_unit == "epoch" and resolve([]).lr_schedule_unit == "step"
    spe = 7
    lr = train.lr_schedule(c, spe)
    ours = [float(lr(torch.tensor(t))) for t in range(6 * spe)]
    torch.testing.assert_close(ours, _authors_lr_per_step(0.1, 6, spe), rtol=1e-12, atol=0.0)
    per_step = train.lr_schedule(dataclasses.replace(c, lr_schedule_unit="step"), spe)
    assert float(per_step(torch.tensor(spe - 1))) < ours[spe - 1]  # the step unit moves within


def test_epoch_unit_warm_up_and_total_steps_count_whole_epochs():
    import math

    import torch

    spe, peak = 5, 0.2
    c = resolve(["--lr_schedule_unit=epoch", "--epochs=6", "--warmup_epochs=2", f"--lr={peak}"])
    lr = train.lr_schedule(c, spe)
    for t in range(6 * spe):
        e = t // spe
        want = peak * (e + 1) / 2 if e < 2 else peak * (1 + math.cos(math.pi * (e - 2) / 4)) / 2
        assert math.isclose(float(lr(torch.tensor(t))), want, rel_tol=1e-12), t
    # --total_steps=12 of 5 a epoch: the cosine runs over the 3 epochs that hold them
    short = train.lr_schedule(resolve(["--lr_schedule_unit=epoch", "--total_steps=12"]), spe)
    three = _authors_lr_per_step(resolve([]).lr, 3, spe)[:12]
    assert [float(short(torch.tensor(t))) for t in range(12)] == pytest.approx(three, rel=1e-12)


def test_a_proportional_rho_follows_the_epoch_lr_down_to_its_floor():
    """The authors' ProportionScheduler (gam/util.py l.55-57): value = min_value + (max_value −
    min_value)·(lr − min_lr)/(max_lr − min_lr), with min_lr = 0 and max_lr = the peak lr
    (gam/optimizer_helper.py l.21-25), at every step of their loop."""
    import torch

    argv = ["--preset=accelerated.cifar100.resnet18.authors", "--epochs=5"]
    argv += ["--rho_schedule=proportional", "--rho_min=0.05"]
    c = resolve(argv)
    lr = train.lr_schedule(c, 4)
    estimator, _ = train.build_estimator(c, c.estimator, lr)
    rho = estimator.hparams["rho"]
    want = [0.05 + (c.rho - 0.05) * v / c.lr for v in _authors_lr_per_step(c.lr, 5, 4)]
    torch.testing.assert_close([float(rho(torch.tensor(t))) for t in range(20)], want)
    assert min(want) > 0.05 and float(rho(torch.tensor(10**6))) == pytest.approx(0.05)


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


def test_estimator_takes_every_method_of_the_registry_and_nothing_else():
    from reproduce.methods import METHODS

    assert set(ESTIMATORS) == set(METHODS)
    for name in METHODS:
        assert resolve([f"--estimator={name}"]).estimator == name
    assert resolve(["--estimator=sgd,gsam+gam,look_gam"]).estimator == "sgd,gsam+gam,look_gam"


def test_every_hyperparameter_of_the_registry_is_a_flag_with_help_and_hypers_default():
    """Config is built on methods.Flags, the one table of the methods' hyperparameters: each field
    that a run sets is a Config field of the same name and default (build reads it from there),
    with a --help line; the fields of Hyper beyond them are those the run chooses (CHOSEN)."""
    from reproduce.build import CHOSEN, hyperparameters
    from reproduce.methods import Flags, Hyper

    helps = field_help()
    flags = {f.name for f in dataclasses.fields(Flags)}
    assert {f.name for f in dataclasses.fields(Hyper)} - flags == CHOSEN == {"hvp", "theorem_norms"}
    assert set(hyperparameters(Config())) == flags
    for name in flags:
        assert name in helps, name
        assert getattr(Config(), name) == getattr(Hyper(), name), name
    assert Config().rho_prime == Hyper().rho_prime == 0.05  # the value train.py runs always had


def test_sam_rho_has_one_unset_value():
    """SAM's ρ is unset at 0 in the configuration and in the registry alike: it is then --rho."""
    from reproduce.methods import Hyper, estimator

    assert Config().sam_rho == Hyper().sam_rho == 0
    assert Hyper(rho=0.3).sam_radius == 0.3 and Hyper(rho=0.3, sam_rho=0.2).sam_radius == 0.2
    assert estimator("sam", rho=0.3).hparams["rho"] == 0.3


@pytest.mark.parametrize(
    "argv, name, hparams",
    [
        (["--estimator=gsam", "--gsam_alpha=0.2"], "gsam", {"alpha": 0.2}),
        (["--estimator=wsam", "--wsam_gamma=0.5"], "wsam", {"gamma": 0.5}),
        (
            ["--estimator=looksam", "--look_k=3", "--looksam_alpha=0.4"],
            "looksam",
            {"k": 3, "alpha": 0.4},
        ),
        (["--estimator=look_gam", "--look_k=4"], "look_gam", {"k": 4}),
        (
            ["--estimator=friendly_sam", "--fsam_sigma=0.5", "--fsam_lmbda=0.8"],
            "friendly_sam",
            {"sigma": 0.5, "lmbda": 0.8},
        ),
        (["--estimator=sam", "--ascent_steps=3"], "sam", {"ascent_steps": 3}),
        (["--estimator=asam", "--eta=0.02"], "asam", {"eta": 0.02}),
        (
            ["--estimator=wsam", "--wsam_decouple", "--wsam_max_norm=1"],
            "wsam",
            {"decouple": True, "max_norm": 1.0},
        ),
        (["--estimator=gsam", "--gsam_adaptive"], "gsam", {"adaptive": True, "eta": 0.0}),
        (["--estimator=gsam+gam", "--gsam_adaptive"], "gsam+gam", {"oracle": "gsam"}),
    ],
)
def test_each_new_flag_reaches_its_estimator(argv, name, hparams):
    c = resolve(argv)
    estimator, _ = train.build_estimator(c, c.estimator, c.lr)
    assert estimator.name == name
    for key, value in hparams.items():
        assert estimator.hparams[key] == value, key


@pytest.mark.parametrize(
    "model, rho_max, rho_min, alpha",
    [
        ("resnet50", 0.04, 0.02, 0.01),
        ("resnet101", 0.04, 0.02, 0.01),
        ("vit_s32", 0.6, 0.0, 0.4),
        ("vit_b32", 0.6, 0.1, 0.6),
    ],
)
def test_gsam_presets_carry_table_4_of_the_gsam_paper_on_the_hp2_recipe(
    model, rho_max, rho_min, alpha
):
    """Zhuang et al. 2022, appendix Table 4: (ρ_max, ρ_min, α), ρ ∝ lr; the rest is hp2's."""
    c = resolve([f"--preset=gsam.imagenet.{model}"])
    assert (c.estimator, c.rho, c.rho_min, c.gsam_alpha) == ("gsam", rho_max, rho_min, alpha)
    assert c.rho_schedule == "proportional" and c.sam_rho == 0
    hp2 = resolve([f"--preset=hp2.imagenet.{model}"])
    same = ("base", "lr", "weight_decay", "epochs", "batch_size", "warmup_epochs", "clip_norm")
    assert [getattr(c, k) for k in same] == [getattr(hp2, k) for k in same]


def test_gsam_under_the_proportional_schedule_follows_the_lr_down_to_rho_min():
    """GSAM's ρ_t = ρ_min + (ρ_max − ρ_min)·lr_t/lr_0 (Zhuang et al. 2022), with --rho as ρ_max."""
    import torch

    argv = ["--estimator=gsam", "--rho=0.6", "--rho_min=0.1", "--rho_schedule=proportional"]
    c = resolve([*argv, "--sam_rho=0"])  # a SAM ρ of its own (the mnist1d preset's) stays fixed
    lr = train.lr_schedule(c, 40)
    estimator, _ = train.build_estimator(c, c.estimator, lr)
    rho = estimator.hparams["rho"]
    total = c.epochs * 40
    for t in (0, total // 2, total):
        step = torch.tensor(t)
        expected = 0.1 + 0.5 * float(lr(step)) / c.lr
        assert float(rho(step)) == pytest.approx(expected)
    assert float(rho(torch.tensor(total))) == pytest.approx(0.1)


@pytest.mark.parametrize("name", ["sam", "gsam", "wsam", "looksam", "friendly_sam", "asam"])
def test_every_sam_like_method_reads_sam_rho_and_its_row_shows_that_radius_alone(name):
    """--sam_rho is the radius of every SAM-like method (asam ignored it and read --rho), and the
    table's label shows that ρ with no α of GAM, which none of them has."""
    from reproduce.run import report

    c = resolve([f"--estimator={name}", "--rho=0.05", "--alpha=0.1", "--sam_rho=0.3"])
    est, _ = train.build_estimator(c, name, c.lr)
    assert est.hparams["rho"] == 0.3
    s = {"estimator": name, "config": dataclasses.asdict(c), "final": None}
    s |= {"best_val": None, "images_per_s": 0.0, "train_seconds": 0.0}
    row = report.table([s]).splitlines()[2]
    assert row.startswith(f"{name} ρ=0.3 ") and "α" not in row, row
    c = resolve([f"--estimator={name}", "--rho=0.5", "--sam_rho=0"])  # sam_rho 0: --rho
    assert train.build_estimator(c, name, c.lr)[0].hparams["rho"] == 0.5


def test_the_authors_forms_are_off_by_default_and_each_flag_turns_one_on():
    """By default wsam is coupled and unclipped, gsam's ascent plain, asam's T on every parameter
    (gamfunc's defaults); the flags give the authors' released forms."""
    from reproduce.methods import weights

    c = resolve(["--estimator=wsam"])
    wsam, _ = train.build_estimator(c, "wsam", c.lr)
    assert not wsam.decoupled and "max_norm" not in wsam.hparams
    asam, _ = train.build_estimator(resolve(["--estimator=asam"]), "asam", 0.1)
    assert "mask" not in asam.hparams
    c = resolve(["--estimator=asam", "--asam_mask=weights"])
    asam, _ = train.build_estimator(c, "asam", c.lr)
    assert asam.hparams["mask"] is weights
    c = resolve(["--estimator=gsam+gam", "--gsam_adaptive"])
    _, base = train.build_estimator(c, "gsam+gam", c.lr)
    assert base.hparams["adaptive"] is True  # the steps between GAM steps take the same oracle
