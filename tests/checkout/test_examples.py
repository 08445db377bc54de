"""The worked examples under examples/ run and train. Each is loaded with runpy (no process start-up
or second torch import) and its ``main(argv)`` is called on tiny data, from an empty temporary folder
(anything an example writes lands there, never in the checkout)."""

import re
import runpy
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CHANCE = 100 / 3  # three classes, accuracy in percent


@pytest.fixture(autouse=True)
def _in_a_temporary_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def test_every_example_is_run_here():
    here = Path(__file__).read_text()
    scripts = [p.name for p in EXAMPLES.glob("*.py") if p.name != "__init__.py"]
    assert scripts and all(f'"{name}"' in here for name in scripts), scripts


def run(capsys, script, *argv):
    main = runpy.run_path(str(EXAMPLES / script), run_name="example")["main"]
    main(list(argv))
    return capsys.readouterr().out


def final(stdout):
    """The numbers of the ``final: key=value ...`` line every example ends with."""
    line = stdout.strip().splitlines()[-1]
    assert line.startswith("final:"), stdout[-2000:]
    return {k: float(v) for k, v in re.findall(r"(\w+)=([-\d.e]+)", line)}


def first_loss(stdout):
    return float(re.search(r"loss=([-\d.e]+)", stdout).group(1))


@pytest.mark.parametrize("optimizer", ["gam", "sgd"])
def test_module_loop_trains_with_either_optimizer(capsys, optimizer):
    out = run(capsys, "module_loop.py", "--optimizer", optimizer, "--epochs", "2")
    result = final(out)
    assert result["test_acc"] > CHANCE + 30
    assert result["train_loss"] < first_loss(out)


def test_functional_loop_trains_eagerly(capsys):
    out = run(capsys, "functional_compile.py", "--no-compile", "--steps", "30")
    result = final(out)
    assert "eager:" in out
    assert result["test_acc"] > CHANCE + 30
    assert result["train_loss"] < first_loss(out)


@pytest.mark.slow
def test_functional_loop_compiles(capsys):
    out = run(capsys, "functional_compile.py", "--estimator", "gradient", "--steps", "20")
    assert "compiled:" in out
    assert final(out)["train_loss"] < first_loss(out)


def test_mixed_precision_loop_trains_in_fp16_with_no_step_skipped(capsys):
    out = run(capsys, "mixed_precision_loop.py", "--epochs", "2")
    result = final(out)
    assert "fp16" in out.splitlines()[0]
    assert result["skipped"] == 0 and result["loss_scale"] == 2.0**16  # GradScaler's start
    assert result["train_loss"] < 0.6 * result["first_loss"]
    assert result["test_acc"] > CHANCE + 30


@pytest.mark.slow
def test_mixed_precision_loop_trains_in_bf16_without_a_loss_scale(capsys):
    out = run(capsys, "mixed_precision_loop.py", "--precision", "bf16", "--epochs", "2")
    result = final(out)
    assert "loss_scale" not in result and result["skipped"] == 0
    assert result["train_loss"] < 0.6 * result["first_loss"]


def test_mixed_precision_loop_quotes_what_the_facade_tells_a_gradscaler_user():
    """The refusal quoted in the example's comment is the one ``scaler.step(optimizer)`` meets."""
    source = (EXAMPLES / "mixed_precision_loop.py").read_text()
    quoted = " ".join(re.findall(r"^#   (.*)$", source, flags=re.M))
    example = runpy.run_path(str(EXAMPLES / "mixed_precision_loop.py"), run_name="example")
    model = example["make_model"]()
    optimizer = example["GAM"](
        model, torch.optim.SGD(model.parameters(), lr=0.1), rho=0.05, alpha=0.1
    )
    scaler = torch.amp.GradScaler("cpu")
    x, y = torch.randn(8, 10), torch.randint(0, 3, (8,))
    scaler.scale(torch.nn.functional.cross_entropy(model(x), y)).backward()
    with pytest.raises(TypeError) as refused:
        scaler.step(optimizer)
    assert quoted == f"TypeError: {refused.value}"


@pytest.mark.filterwarnings("ignore::UserWarning")  # Lightning's advice (idle GPU, few workers)
@pytest.mark.filterwarnings("ignore:.*LeafSpec:FutureWarning")  # Lightning's use of torch's pytree
def test_lightning_manual_optimisation_trains_and_steps_the_scheduler_per_epoch(capsys):
    pytest.importorskip("lightning")
    result = final(run(capsys, "lightning_manual.py", "--epochs", "2"))
    assert result["train_loss"] < 0.6 * result["first_loss"]
    assert result["lr"] == pytest.approx(0.1 * 0.5**2)  # StepLR(gamma=0.5) after two epochs


def test_lightning_snippet_says_so_without_lightning(capsys):
    try:
        import lightning  # noqa: F401
    except ImportError:
        assert "lightning is not installed" in run(capsys, "lightning_manual.py")
    else:
        pytest.skip("lightning is installed; the snippet itself is tested above")


@pytest.mark.slow
def test_vmap_grid_trains_every_cell_as_one_model(capsys):
    pytest.importorskip("mnist1d")
    out = run(capsys, "vmap_grid.py", "--epochs", "1", "--seeds", "2", "--repeats", "1")
    result = final(out)
    assert result["cells"] == 9 and out.count("test acc") == 9
    assert result["best_test_acc"] > 10 + 15  # above chance (10 classes) after one epoch
    assert result["speedup"] > 0
    # a cell is marked where its training accuracy ends at chance (at most 1.5 × 10%): ρ = α = 1
    cells = re.findall(r"rho=(\S+)\s+alpha=(\S+)\s.*train acc ([\d.]+)( \(chance\))?", out)
    assert len(cells) == 9
    for rho, alpha, train, marked in cells:
        assert bool(marked) == (float(train) <= 15.0), (rho, alpha, train)
    chance = {(rho, alpha) for rho, alpha, _, marked in cells if marked}
    assert ("1.0", "1.0") in chance and result["chance_cells"] == len(chance) < 9


def test_vmap_grid_reads_the_data_and_chance_as_reproduce_does():
    """The grid example stands alone (no import of reproduce/): its MNIST-1D is the harness's, and
    its mark of a cell at chance is ``reproduce.run.report.at_chance`` for 10 classes."""
    pytest.importorskip("mnist1d")
    from reproduce.data.sets import _mnist1d
    from reproduce.run.report import at_chance

    example = runpy.run_path(str(EXAMPLES / "vmap_grid.py"), run_name="example")
    for own, theirs in zip(example["mnist1d"](), _mnist1d(), strict=True):
        assert torch.equal(own.x, theirs.x) and torch.equal(own.y, theirs.y)
    assert at_chance(example["CHANCE"], 10) and not at_chance(example["CHANCE"] + 1e-9, 10)
    assert "sys.path" not in (EXAMPLES / "vmap_grid.py").read_text()
