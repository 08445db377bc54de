"""The old paths of the modules that moved into the layers' folders still import the same objects,
for one release (``gamfunc._moved``)."""

import importlib
import importlib.util

import pytest

import gamfunc
from gamfunc._moved import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_imports_the_module_at_its_new_one(old):
    home = MOVED[old].split(".", 1)[0]
    if home != "gamfunc" and importlib.util.find_spec(home) is None:
        pytest.skip(f"{old} moved out of the library, to {MOVED[old]}: a checkout's")
    new = importlib.import_module(MOVED[old])
    assert importlib.import_module(old) is new
    assert getattr(gamfunc, old.split(".", 1)[1]) is new
    for name in getattr(new, "__all__", []):
        assert getattr(importlib.import_module(old), name) is getattr(new, name)


def test_the_old_forms_of_import():
    import gamfunc.step
    from gamfunc.precision import bf16
    from gamfunc.state import StepState

    assert gamfunc.step.make_step is gamfunc.make_step
    assert bf16 is gamfunc.wrappers.precision.bf16 and StepState is gamfunc.StepState


def test_a_name_that_never_was_still_raises():
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        gamfunc.nothing  # noqa: B018
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("gamfunc.nothing")
