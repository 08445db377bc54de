"""reproduce.evidence: every subcommand's --quick mode writes its table, JSON and figures, all finite."""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# reproduce/ needs the "reproduce" extra: skip, naming the package, where it is not installed
for _name in ("einops", "torchvision", "tensorboard", "matplotlib"):
    pytest.importorskip(_name, reason=f'reproduce/ needs {_name}: pip install -e ".[reproduce]"')

from reproduce import evidence  # noqa: E402
from reproduce.models import build_model  # noqa: E402

# subcommand -> the PNG files it must write in --quick mode
FIGURES = {
    "spectra": [
        f"spectra_{evidence.png(m)}_{p}.png" for m in evidence.METHODS for p in ("mid", "end")
    ],
    "accuracy": [],
    "noise": [],
    "minima": ["minima_sgd.png", "minima_sgd_gam.png"],
    "landscape": [f"landscape_{evidence.png(m)}.png" for m in evidence.FOUR],
    "ablation": [],
    "variants": [],
    "fd": [],
    "family": [],
    "reuse": [],
}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def numbers(obj):
    """Every int or float inside a JSON value."""
    if isinstance(obj, bool):
        return
    if isinstance(obj, int | float):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from numbers(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from numbers(v)


def table_cells(md: str) -> list[str]:
    """The body cells of every markdown table in ``md`` (not the header or the rule)."""
    cells = []
    for block in re.split(r"\n\s*\n", md):
        rows = [r for r in block.splitlines() if r.startswith("|")]
        for row in rows[2:]:
            cells += [c.strip() for c in row.strip("|").split("|")][1:]
    return cells


# --quick modes that take more than a few seconds: family trains and times all 17 methods (20 s)
SLOW = {"family"}


@pytest.mark.parametrize(
    "command",
    [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in evidence.SUBCOMMANDS],
)
def test_quick_writes_finite_table_json_and_figures(command, tmp_path):
    assert evidence.main([command, "--quick", "--threads=1", f"--out={tmp_path}"]) == 0
    md = (tmp_path / f"{command}.md").read_text()
    record = json.loads((tmp_path / f"{command}.json").read_text())

    values = list(numbers(record))
    assert values, "the JSON holds no numbers"
    assert all(math.isfinite(v) for v in values)
    assert record["seconds"] > 0 and record["settings"]["quick"] is True
    assert record["command"].startswith(f"python -m reproduce.evidence {command} --quick")

    cells = table_cells(md)
    assert cells, "the markdown holds no table"
    for cell in cells:
        for text in re.findall(r"-?\d+(?:\.\d+)?|nan|inf", cell):
            assert math.isfinite(float(text)), (command, cell)

    if (
        command in evidence.TABLES
    ):  # the table that tests/checkout/test_docs.py recomputes from the JSON
        assert evidence.TABLES[command](record) in md

    for name in FIGURES[command]:
        data = (tmp_path / name).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 1000, name


def test_accuracy_reuses_the_runs_of_spectra(tmp_path):
    spectra = {"runs": {"SGD": [dict(train_acc=100.0, test_acc=60.0, gap=40.0, step_ms=1.0)]}}
    (tmp_path / "spectra.json").write_text(json.dumps(spectra))
    out = tmp_path / "acc"
    evidence.main(["accuracy", f"--reuse={tmp_path / 'spectra.json'}", f"--out={out}"])
    md = (out / "accuracy.md").read_text()
    assert "| SGD | 100.00 ± 0.00 | 60.00 ± 0.00 | 40.00 ± 0.00 | 1.0 |" in md


def test_unknown_subcommand_is_refused():
    with pytest.raises(SystemExit):
        evidence.main(["nonsense"])


def test_help_prints_percent_signs(capsys):
    with pytest.raises(SystemExit):
        evidence.main(["--help"])
    out = capsys.readouterr().out
    assert "20/40/60/80% label noise" in out and "option_strings" not in out
    for command in evidence.SUBCOMMANDS:
        with pytest.raises(SystemExit):
            evidence.main([command, "--help"])
        assert "option_strings" not in capsys.readouterr().out


def test_runs_as_a_module():
    """``python -m reproduce.evidence`` is the command line (the package's ``__main__``)."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-m", "reproduce.evidence", "--help"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,  # only keeps a broken command from hanging the suite
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: python -m reproduce.evidence")
    assert all(command in out.stdout for command in evidence.SUBCOMMANDS)


def test_sam_gam_takes_its_own_rho_and_alpha():
    base = evidence.base_config(argparse.Namespace(model="mlp", epochs=1))
    name, cfg = evidence.method_config(base, "SAM+GAM", 3, 0.1, (0.1, 0.3))
    assert (name, cfg.rho, cfg.alpha, cfg.sam_rho, cfg.seed) == ("sam+gam", 0.1, 0.3, 0.2, 3)
    _, plain = evidence.method_config(base, "SGD+GAM", 0, 0.1, (0.1, 0.3))
    assert (plain.rho, plain.alpha) == (0.5, 1.0)  # only SAM+GAM changes
    _, gam = evidence.method_config(base, "SGD+GAM", 0, 0.1, (0.1, 0.3), (0.05, 2.0))
    _, sam_gam = evidence.method_config(base, "SAM+GAM", 0, 0.1, None, (0.05, 2.0))
    assert (gam.rho, gam.alpha, sam_gam.rho, sam_gam.alpha) == (0.05, 2.0, 0.5, 1.0)


def test_ablation_with_a_sam_oracle_and_spectra_of_one_method(tmp_path):
    args = ["--quick", "--threads=1", "--rhos=0.1", "--alphas=0.3", "--sam-rho=0.2"]
    assert evidence.main(["ablation", *args, f"--out={tmp_path}"]) == 0
    assert "SAM ρ = 0.2 oracle" in (tmp_path / "ablation.md").read_text()
    out = tmp_path / "spectra"
    evidence.main(
        [
            "spectra",
            "--quick",
            "--threads=1",
            "--methods=SAM+GAM",
            "--sam-gam=0.1,0.3",
            f"--out={out}",
        ]
    )
    record = json.loads((out / "spectra.json").read_text())
    assert list(record["runs"]) == ["SAM+GAM"] and record["settings"]["sam_gam"] == [0.1, 0.3]


def test_ablation_vmapped_gives_the_looped_table_for_one_seed(tmp_path):
    """--vmap trains every seed on seed 0's data: with one seed its runs are the looped ones."""
    args = ["ablation", "--quick", "--threads=1"]
    assert evidence.main([*args, f"--out={tmp_path / 'loop'}"]) == 0
    assert evidence.main([*args, "--vmap", f"--out={tmp_path / 'vmap'}"]) == 0
    loop, vmap = (
        json.loads((tmp_path / k / "ablation.json").read_text()) for k in ("loop", "vmap")
    )
    assert vmap["settings"]["vmap"] is True and list(vmap["grid"]) == list(loop["grid"])
    for key, cell in loop["grid"].items():  # accuracies in %: 400 validation, 1000 test examples
        assert vmap["grid"][key]["val"] == pytest.approx(cell["val"], abs=0.3)
        assert vmap["grid"][key]["test"] == pytest.approx(cell["test"], abs=0.15)
    assert "one vmapped step per estimator" in (tmp_path / "vmap" / "ablation.md").read_text()
    with pytest.raises(SystemExit):  # spectra measures each run mid-training: no --vmap there
        evidence.main(["spectra", "--quick", "--vmap", f"--out={tmp_path}"])


@pytest.mark.parametrize(
    ("argv", "word"),
    [
        (["ablation", "--quick", "--rhos=0,0.5", "--sam-rho=0.2"], "rhos"),
        (["ablation", "--quick", "--sam-rho=-1"], "sam-rho"),
        (["spectra", "--quick", "--methods=SGD,Adam"], "methods"),
        (["spectra", "--quick", "--sam-gam=0.1"], "sam-gam"),
        (["spectra", "--quick", "--gam=0.1,-1"], "gam"),
        (["fd", "--quick", "--radii=0.01,0"], "radii"),
    ],
)
def test_bad_options_raise_naming_themselves(argv, word, tmp_path, capsys):
    assert evidence.main([*argv, f"--out={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and word in err


@pytest.mark.parametrize(
    ("argv", "word"),
    [
        (["accuracy", "--methods=sgd"], "methods"),
        (["accuracy", "--epochs=0"], "epochs"),
        (["accuracy", "--epochs=abc"], "epochs"),
        (["accuracy", "--seeds=0"], "seeds"),
        (["accuracy", "--gam=abc"], "gam"),
        (["accuracy", "--gam=inf,1"], "gam"),
        (["accuracy", "--gam=1,2,3"], "gam"),
        (["noise", "--levels=1.5"], "levels"),
        (["noise", "--levels=x"], "levels"),
        (["ablation", "--alphas=nan"], "alphas"),
        (["minima", "--radius=0"], "radius"),
        (["minima", "--directions=0"], "directions"),
        (["landscape", "--points=1"], "points"),
        (["spectra", "--k=0"], "k"),
        (["spectra", "--threads=100000"], "threads"),
        (["spectra", "--model=nope"], "model"),
        (["spectra", "--gnp-alpha=-1"], "gnp-alpha"),
    ],
)
def test_every_bad_value_is_one_line_and_exit_2_before_training(argv, word, tmp_path, capsys,
                                                                 monkeypatch):  # fmt: skip
    monkeypatch.setitem(evidence.SUBCOMMANDS, argv[0], lambda opt: pytest.fail("it trained"))
    try:
        code = evidence.main([*argv, "--quick", f"--out={tmp_path}"])
    except SystemExit as e:  # argparse's refusal of a value of the wrong type
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1 and word in err, err


def test_an_output_folder_that_cannot_be_made_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert evidence.main(["accuracy", "--quick", f"--out={tmp_path / 'file' / 'sub'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--out" in err


def test_a_disk_that_fills_while_a_figure_is_saved_is_one_line_naming_the_figure(
    tmp_path, capsys, monkeypatch
):
    """The image writer's error on a full disk names no file: the line names the figure, exit 2,
    as train.py's does."""
    import errno

    from matplotlib.figure import Figure

    def full(self, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", full)
    argv = ["minima", "--quick", "--threads=1", f"--out={tmp_path}"]
    assert evidence.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith(f"error: cannot write '{tmp_path / 'minima_sgd.png'}'"), err
    assert "No space left on device" in err


def test_a_run_of_evidence_that_did_not_train_exits_3_naming_it(tmp_path, capsys):
    """SGD+GAM at ρ = 1e30: every step skipped. No table, exit 3, a line naming the run."""
    argv = ["accuracy", "--epochs=1", "--seeds=1", "--methods=SGD,SGD+GAM", "--gam=1e30,1e30"]
    assert evidence.main([*argv, "--reuse=", f"--out={tmp_path}"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gam" in err[0] and "did not train" in err[0], err
    assert not (tmp_path / "accuracy.json").exists()


@pytest.mark.parametrize("model", ["mlp", "mlp_gelu"])
def test_hidden_preactivations_match_the_module(model):
    net = build_model(model, 10, 40, seed=0)
    x = torch.randn(7, 40)
    seen = []
    for i in (0, 2):
        net.net[i].register_forward_hook(lambda m, a, out: seen.append(out))
    net(x)
    params = dict(net.named_parameters())
    z = evidence.hidden_preactivations(model, params, x)
    for mine, ref in zip(z, seen, strict=True):
        torch.testing.assert_close(mine, ref)
    dead = evidence.dead_units(model, params, x)
    assert dead == [100 * float((r <= 0).all(0).float().mean()) for r in seen]


def test_fd_hvp_matches_exact_on_gelu_but_not_on_relu():
    """On a smooth net the finite difference tends to the exact H·v; on ReLU kinks break it."""
    x, y = torch.randn(100, 40), torch.randint(0, 10, (100,))
    for model in ("mlp_gelu", "mlp"):
        net = build_model(model, 10, 40, seed=0)
        params = {k: v.detach() for k, v in net.named_parameters()}

        def loss(p, b, net=net):
            return torch.nn.functional.cross_entropy(torch.func.functional_call(net, p, b[0]), b[1])

        err = evidence.hvp_error(model, params, (x, y), loss, 0.5, [1e-1, 1e-3])
        if model == "mlp_gelu":
            assert err[1e-3]["cos"] > 0.999 and abs(err[1e-3]["ratio"] - 1) < 0.01
            assert abs(err[1e-3]["push"]) < 0.01
        else:  # at r = 0.1 hundreds of pre-activations change sign and fd leaves exact
            assert err[1e-1]["flips"] > 50 and err[1e-1]["cos"] < 0.99


@pytest.mark.parametrize(
    ("command", "seeds"),
    [("spectra", 5), ("ablation", 3), ("noise", 3), ("fd", 3), ("family", 2), ("reuse", 3)],
)
def test_full_settings_per_subcommand(command, seeds, monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setitem(evidence.SUBCOMMANDS, command, lambda opt: seen.update(vars(opt)))
    evidence.main([command, f"--out={tmp_path}"])
    assert (seen["seeds"], seen["epochs"]) == (seeds, 100)
    evidence.main([command, "--quick", f"--out={tmp_path}"])
    assert (seen["seeds"], seen["epochs"]) == (1, 2)


def test_family_names_every_method_of_the_registry():
    """The all-estimators table covers each method of reproduce.methods but the second routes to
    the same estimator (reverse-mode H·v, the authors' convention of accelerated GAM) and the
    one-pass estimators, whose table is "Flatness at SGD's price" (reproduce.evidence.cheap)."""
    from reproduce.evidence.cheap import GROUPS
    from reproduce.methods import METHODS

    same = {"gam_reverse", "gam_accelerated_official"}
    one_pass = {"msam", "rwp"}
    assert one_pass <= {e for _, names, _ in GROUPS.values() for e in names}
    named = {name for name, _ in evidence.FAMILY.values()}
    assert named == set(METHODS) - same - one_pass


def test_reuse_gives_full_gam_the_passes_of_lookgam():
    """Equal cost: LookGAM's (4 + k − 1)/k passes per step over E epochs, GAM's 4 over fewer."""
    from reproduce.evidence import reuse

    rows = reuse.rows(100, 5)
    look, every, equal = (rows[k] for k in list(rows)[:3])
    assert look[2] == every[2] == pytest.approx(8 / 5)
    assert equal[1]["epochs"] * equal[2] == pytest.approx(100 * look[2])


# ---------------------------------------------------------------- options a command does not use


def _flag_argv(command: str, key: str) -> list[str]:
    flag = f"--{key.replace('_', '-')}"
    return [command, flag] if key in ("quick", "vmap") else [command, f"{flag}=1"]


def test_each_subcommand_takes_its_own_options_and_refuses_every_other(capsys):
    """Generally, not case by case: an option is on a subcommand's parser iff the subcommand reads
    it (evidence.cli.OPTIONS); any other is refused in one line naming the subcommands it is for."""
    every = {k for keys in evidence.cli.OPTIONS.values() for k in keys} | set(evidence.cli.COMMON)
    for command in evidence.SUBCOMMANDS:
        mine = {*evidence.cli.COMMON, *evidence.cli.OPTIONS[command]}
        for key in sorted(every):
            argv = _flag_argv(command, key)
            if key in mine:
                assert evidence.parser().parse_known_args(argv)[1] == [], argv
                continue
            with pytest.raises(SystemExit) as e:
                evidence.main(argv)
            err = capsys.readouterr().err.strip()
            assert e.value.code == 2 and len(err.splitlines()) == 1, (argv, err)
            assert err.startswith(f"error: {command} does not use --{key.replace('_', '-')} ")


@pytest.mark.parametrize(
    ("argv", "word"),
    [
        (["reuse", "--quick", "--gam=1e30,1e30"], "reuse does not use --gam"),
        (["accuracy", "--methods=SAM", "--sam-rho=1e30"], "accuracy does not use --sam-rho"),
        (["minima", "--sam-gam=0.1,1"], "minima does not use --sam-gam"),  # no SAM+GAM there
        (["landscape", "--seeds=3"], "landscape does not use --seeds"),  # seed 0 only
        (["fd", "--model=cnn1d"], "fd does not use --model"),  # both MLPs, always
        (["accuracy", "--methods=SAM", "--gam=0.1,1"], "--gam sets SGD+GAM"),
        (["spectra", "--methods=SGD", "--sam-gam=0.1,1"], "--sam-gam sets SAM+GAM"),
        (["spectra", "--methods=SGD,SAM", "--gnp-alpha=0.2"], "--gnp-alpha sets GNP"),
    ],
)
def test_an_option_a_command_does_not_use_is_refused(argv, word, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(evidence.SUBCOMMANDS, argv[0], lambda opt: pytest.fail("it ran"))
    try:
        code = evidence.main([*argv, f"--out={tmp_path}"])
    except SystemExit as e:  # refused by the parser
        code = e.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and word in err, err


@pytest.mark.parametrize("option", ["--epochs=3", "--methods=SAM", "--quick", "--seeds=2"])
def test_accuracy_reading_a_spectra_json_refuses_the_options_of_training(option, tmp_path, capsys):
    spectra = {"runs": {"SGD": [dict(train_acc=100.0, test_acc=60.0, gap=40.0, step_ms=1.0)]}}
    (tmp_path / "spectra.json").write_text(json.dumps(spectra))
    argv = ["accuracy", f"--reuse={tmp_path / 'spectra.json'}", option, f"--out={tmp_path}"]
    assert evidence.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not used: accuracy reads the runs" in err
    assert not (tmp_path / "accuracy.json").exists()


@pytest.mark.parametrize(
    "text",
    [
        '{"runs": {"SGD": [{"train_acc": 1',  # truncated
        '{"runs": 5}',
        "[]",
        "null",
        '{"runs": {}}',
        '{"runs": {"SGD": []}}',
        '{"runs": {"SGD": [{"train_acc": null, "test_acc": 60, "gap": 40, "step_ms": 1}]}}',
        '{"runs": {"SGD": [{"train_acc": NaN, "test_acc": 60, "gap": 40, "step_ms": 1}]}}',
        '{"runs": {"SGD": [{"test_acc": 60, "gap": 40, "step_ms": 1}]}}',
        '{"runs": {"SGD": [5]}}',
    ],
)
def test_a_bad_reused_json_is_one_line_and_exit_2(text, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(evidence.accuracy, "run_grid", lambda *a, **k: pytest.fail("it trained"))
    (tmp_path / "spectra.json").write_text(text)
    argv = ["accuracy", f"--reuse={tmp_path / 'spectra.json'}", f"--out={tmp_path / 'out'}"]
    assert evidence.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: --reuse=") and "Trace" not in err


# ---------------------------------------------------------------- counts get bounds


@pytest.mark.parametrize(
    ("argv", "word"),
    [
        (["landscape", "--points=100000"], "--points must be at most 201"),
        (["spectra", "--iters=3"], "--k=50 eigenvalues take at least k Lanczos products"),
        (["family", "--quick", "--k=30"], "give --iters >= 30"),
        (["minima", "--probe=5000"], "--probe must be at most the 4000 probe examples"),
        (["minima", "--directions=10001"], "--directions must be at most 10_000"),
        (["reuse", "--seeds=101"], "--seeds must be at most 100"),
        (["variants", "--iters=10001"], "--iters must be at most 10_000"),
        (["spectra", "--trace-samples=10001"], "--trace-samples must be at most 10_000"),
        (["ablation", "--epochs=10001"], "--epochs must be at most 10_000"),
    ],
)
def test_counts_have_bounds_checked_before_training(argv, word, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(evidence.SUBCOMMANDS, argv[0], lambda opt: pytest.fail("it trained"))
    assert evidence.main([*argv, f"--out={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and word in err, err


# ---------------------------------------------------------------- probe losses that are not finite


def test_minima_whose_probe_losses_are_not_finite_exit_3_naming_them(tmp_path, capsys):
    """At ρ = 1e308 the probes overflow: no count of 0 extrema (which would read as flat), no table."""
    argv = ["minima", "--quick", "--threads=1", "--radius=1e308", f"--out={tmp_path}"]
    assert evidence.main(argv) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "SGD (seed 0)" in err, err
    assert "of its 110 probe losses are not finite; give a smaller --radius" in err
    assert not (tmp_path / "minima.json").exists() and not (tmp_path / "minima.md").exists()


def test_check_finite_counts_the_losses_that_are_not():
    evidence.common.check_finite(torch.ones(3), "x", "run", "hint")
    losses = torch.tensor([1.0, float("inf"), float("nan"), 2.0])
    with pytest.raises(evidence.common.NotMeasured, match="x of run: 2 of its 4 probe losses"):
        evidence.common.check_finite(losses, "x", "run", "hint")
