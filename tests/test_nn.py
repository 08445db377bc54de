"""gamfunc.nn's names: ``functionalize`` and its former name ``functional``."""

import re
from pathlib import Path

import torch

import gamfunc

ROOT = Path(__file__).resolve().parents[1]
# a call of the former name, or an import of it, anywhere in the project's code and documents
FORMER = re.compile(r"gamfunc\.nn\.functional\(|from gamfunc\.nn import [^\n]*\bfunctional\b")


def test_former_name_is_the_same_function():
    assert gamfunc.nn.functional is gamfunc.nn.functionalize
    assert {"functional", "functionalize"} <= set(gamfunc.nn.__all__)


def test_former_name_runs_a_step():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8))
    loss_fn, params, buffers = gamfunc.nn.functional(model, lambda out, y: out.pow(2).mean())
    batch = (torch.randn(16, 4), None)
    loss, new_buffers = loss_fn(params, batch, buffers)
    assert loss.ndim == 0 and new_buffers.keys() == buffers.keys()


def test_the_project_uses_the_new_name():
    files = [ROOT / "README.md"] + [
        p
        for folder in ("gamfunc", "reproduce", "benchmarks", "examples", "tests", "docs")
        for p in (ROOT / folder).rglob("*")
        if p.suffix in (".py", ".md") and p != Path(__file__).resolve()
    ]
    assert [str(p.relative_to(ROOT)) for p in files if FORMER.search(p.read_text())] == []
