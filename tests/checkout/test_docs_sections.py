"""Every function of the API reference documents its arguments and its result.

The reference pages (generated from ``__all__`` when the site is built, mkdocs_reference.py) render
each public name with ``::: path``. A function among them has a Google-style docstring with an
``Args:`` section when it takes arguments and a ``Returns:`` section unless it returns None, so
that the site shows both.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

import mkdocs_reference

ROOT = Path(__file__).resolve().parents[2]

# Functions whose docstrings lack a section, as "path: sections": none do. The test fails on a
# rendered function that lacks a section not listed here, and on a listed name that has its sections.
MISSING: dict[str, str] = {}


def rendered() -> list[str]:
    """Every path that a reference page renders with ``::: path``."""
    pages = mkdocs_reference.pages().values()
    return sorted({p for page in pages for p in re.findall(r"^::: (\S+)", page, re.M)})


def resolve(path: str):
    """The object at a dotted path: the longest importable module, then attributes."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(path)


def missing_sections(fn) -> list[str]:
    """The sections that ``fn``'s docstring lacks: Args (if it takes any) and Returns (unless None)."""
    doc = inspect.getdoc(fn) or ""
    signature = inspect.signature(fn)
    out = []
    if any(n not in ("self", "cls") for n in signature.parameters) and "\nArgs:\n" not in doc:
        out.append("Args")
    returns = signature.return_annotation
    if returns not in (None, "None") and not re.search(r"\n(Returns|Yields):\n", doc):
        out.append("Returns")
    return out


def functions() -> list[str]:
    return [p for p in rendered() if inspect.isfunction(resolve(p))]


def test_the_reference_renders_functions():
    assert {"gamfunc.training.step.make_step", "gamfunc.estimators.gam.gam"} <= set(functions())


def test_sections_are_read():
    def documented(x, y=1):
        """Sum.

        Args:
            x: one.
            y: two.

        Returns:
            x + y.
        """

    def bare(x):
        """Sum."""

    def nothing() -> None:
        """Nothing."""

    assert missing_sections(documented) == []
    assert missing_sections(bare) == ["Args", "Returns"]
    assert missing_sections(nothing) == []


@pytest.mark.parametrize("path", functions())
def test_every_function_documents_args_and_returns(path):
    lacking = ", ".join(missing_sections(resolve(path)))
    assert lacking == MISSING.get(path, ""), (
        f"{path}: lacks {lacking or 'nothing'}; update MISSING in {Path(__file__).name}"
    )


def test_the_list_of_missing_sections_names_rendered_functions():
    gone = sorted(set(MISSING) - set(functions()))
    assert gone == [], f"no longer rendered: drop them from MISSING in {Path(__file__).name}"


def classes() -> list[str]:
    return [p for p in rendered() if inspect.isclass(resolve(p))]


def missing_class_sections(cls) -> list[str]:
    """What ``cls``'s docstring lacks: Args for the arguments its constructor takes; a record (a
    NamedTuple or a dataclass, whose constructor takes its fields) may list them as Attributes. A
    Protocol describes a shape and is built by nobody."""
    if getattr(cls, "_is_protocol", False):
        return []
    doc = "\n" + (inspect.getdoc(cls) or "")
    try:
        takes = [n for n in inspect.signature(cls).parameters if n not in ("self", "cls")]
    except (TypeError, ValueError):
        takes = []
    record = (issubclass(cls, tuple) and hasattr(cls, "_fields")) or hasattr(
        cls, "__dataclass_fields__"
    )
    if not takes or "\nArgs:\n" in doc or (record and "\nAttributes:\n" in doc):
        return []
    return ["Args"]


def test_class_sections_are_read():
    class Documented:
        """A thing.

        Args:
            x: one.
        """

        def __init__(self, x):
            self.x = x

    class Bare:
        """A thing."""

        def __init__(self, x):
            self.x = x

    assert missing_class_sections(Documented) == []
    assert missing_class_sections(Bare) == ["Args"]


@pytest.mark.parametrize("path", classes())
def test_every_class_documents_what_it_is_built_from(path):
    """A class of the reference, the facade's included, says what each argument of its
    constructor is (or, for a record, each field)."""
    assert missing_class_sections(resolve(path)) == [], f"{path}: lacks Args"
