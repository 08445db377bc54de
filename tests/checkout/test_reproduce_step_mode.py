"""How train.py's step runs (``--mode``): a pure function of the device's type, the estimator and the
flags. By default a first step within seconds: on a GPU the eager step replayed as one CUDA graph, on
the CPU the eager step; compiled only when asked; ``--compile`` and ``--cuda_graph`` keep their
meaning."""

from __future__ import annotations

import pytest
import torch

from reproduce import build
from reproduce.config import MODES, RESUME_FREE, resolve
from reproduce.methods import estimator

GAM_EXACT = estimator("gam", rho=0.05, alpha=0.1)
GAM_FD = estimator("gam_fd", rho=0.05, alpha=0.1)


def mode(device, *flags, est=None):
    m = build.step_mode(device, resolve(list(flags)), est)
    return m.compile, m.graph


@pytest.mark.parametrize(
    ("device", "flags", "want"),
    [
        ("cpu", [], (False, False)),  # auto on the CPU: eager
        ("cuda", [], (False, True)),  # auto on a GPU: the eager step as one CUDA graph
        ("cuda", ["--compile"], (True, False)),  # the old flags, as they were
        ("cuda", ["--cuda_graph"], (False, True)),
        ("cuda", ["--compile", "--cuda_graph"], (True, True)),
        ("cpu", ["--compile"], (True, False)),
        ("cuda", ["--mode=eager"], (False, False)),  # a mode forces its path
        ("cuda", ["--mode=compile"], (True, False)),
        ("cuda", ["--mode=compile-graph"], (True, True)),
        ("cpu", ["--mode=graph"], (False, True)),  # setup refuses it on the CPU (below)
        ("cuda", ["--mode=compile", "--compile"], (True, False)),  # flags that agree
        ("cuda", ["--mode=compile-graph", "--cuda_graph", "--compile"], (True, True)),
        ("cuda", ["--when=adaptive"], (False, True)),  # auto: its probe and branches as graphs
        ("cuda", ["--when=late:0.75"], (False, True)),
    ],
)
def test_the_mode_follows_device_and_flags(device, flags, want):
    for est in (None, GAM_FD, GAM_EXACT):  # the choice is the same for every estimator
        assert mode(device, *flags, est=est) == want


def test_exact_hvp_run_eagerly_on_a_gpu_gets_a_note_and_nothing_else_does():
    notes = build.step_mode("cuda", resolve([]), GAM_EXACT).notes
    assert len(notes) == 1 and "--mode=compile-graph" in notes[0] and "forward-mode" in notes[0]
    for device, flags, est in (
        ("cuda", [], GAM_FD),
        ("cuda", ["--mode=compile-graph"], GAM_EXACT),
        ("cpu", [], GAM_EXACT),
        ("cuda", [], None),
    ):
        assert build.step_mode(device, resolve(flags), est).notes == ()


def test_the_methods_of_exact_hvp_are_those_whose_estimator_says_so():
    """The methods that take the run's exact H·v (its bf16 route, the norms in elementary operations
    of a compiled step) are asked of their estimators: GAM and the methods built on it, and GNP when
    its H·v is exact; not the finite-difference and reverse-mode GAMs, which choose their own."""
    from reproduce.methods import METHODS

    exact = {m for m in METHODS if build.uses_exact_hvp(resolve([]), m)}
    assert exact == {"gam", "sam+gam", "gsam+gam", "look_gam"}
    assert build.uses_exact_hvp(resolve(["--gnp_hvp=exact"]), "gnp")
    assert not build.uses_exact_hvp(resolve(["--gnp_hvp=reverse"]), "gnp")


@pytest.mark.parametrize(
    ("flags", "match"),
    [
        (["--mode=fast"], "--mode must be one of"),
        (["--mode=eager", "--compile"], "compile or compile-graph with --compile"),
        (["--mode=graph", "--compile"], "compile or compile-graph with --compile"),
        (["--mode=compile", "--cuda_graph"], "graph or compile-graph with --cuda_graph"),
        (["--compile_cache= "], "--compile_cache must be"),
    ],
)
def test_contradictory_or_unknown_modes_are_refused_naming_the_flag(flags, match):
    with pytest.raises(ValueError, match=match):
        resolve(flags)


def test_a_run_records_the_mode_it_chose_and_may_resume_under_another():
    assert set(MODES) == {"auto", "eager", "graph", "compile", "compile-graph"}
    for device, flags, name in (
        ("cpu", [], "eager"),
        ("cuda", [], "graph"),
        ("cuda", ["--compile"], "compile"),
        ("cuda", ["--compile", "--cuda_graph"], "compile-graph"),
        ("cpu", ["--mode=compile"], "compile"),
    ):
        cfg = build.with_step_mode(resolve(flags), device)
        assert cfg.mode == name, (device, flags)
        assert (cfg.compile, cfg.cuda_graph) == mode(device, *flags)
        assert build.with_step_mode(cfg, device) == cfg  # chosen once, kept
    assert {"mode", "compile", "cuda_graph", "compile_cache"} <= RESUME_FREE


def test_setup_compiles_and_graphs_as_the_mode_says():
    from reproduce.data import sets as D

    cfg = resolve(["--max_steps=1"])

    def built(*flags):
        c = resolve(["--max_steps=1", *flags])
        return build.setup(c, "gam", D.load(c), torch.device("cpu"))

    assert not any("compile" in n for n in built().notes)
    assert any("compile: the whole step" in n for n in built("--mode=compile").notes)
    with pytest.raises(build.SetupError, match="needs a GPU"):
        built("--mode=graph")
    assert cfg.mode == "auto"
