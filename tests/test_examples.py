"""The worked examples under examples/ run and train. Each is loaded with runpy (no process start-up
or second torch import) and its ``main(argv)`` is called on tiny data, from an empty temporary folder
(anything an example writes lands there, never in the checkout)."""

import re
import runpy
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
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


@pytest.mark.filterwarnings("ignore::UserWarning")  # Lightning's advice (idle GPU, few workers)
def test_lightning_manual_optimisation_snippet(capsys):
    pytest.importorskip("lightning")
    assert final(run(capsys, "lightning_manual.py"))["train_loss"] < 1.0


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
