"""The documentation site's API reference covers every public name (tests/checkout/test_docs_html.py builds it).

Its pages are generated from ``__all__`` of ``gamfunc`` and of every module it exports when the site
is built (mkdocs_reference.py, a hook of mkdocs.yml); none is written to docs/.
"""

from __future__ import annotations

import re
import types
from pathlib import Path

import gamfunc
import mkdocs_reference

ROOT = Path(__file__).resolve().parents[2]


def test_the_reference_pages_are_generated_not_kept():
    """A page kept under docs/reference/ would go stale beside the generated one of its name."""
    assert not (ROOT / "docs" / mkdocs_reference.FOLDER).exists()
    config = (ROOT / "mkdocs.yml").read_text()
    hooks = re.split(r"\n\S", config.split("\nhooks:", 1)[1], maxsplit=1)[0]
    assert re.findall(r"- (\S+\.py)", hooks)[:2] == ["mkdocs_reference.py", "mkdocs_hooks.py"]


def test_the_site_lists_every_reference_page():
    nav = (ROOT / "mkdocs.yml").read_text()
    assert all(f"reference/{name}" in nav for name in mkdocs_reference.pages())


def test_a_page_for_gamfunc_and_each_module_it_exports():
    exported = [n for n in gamfunc.__all__ if isinstance(getattr(gamfunc, n), types.ModuleType)]
    # gamfunc.estimators and gamfunc.optim: their names are exported one by one
    want = {"index.md", "estimators.md", "optim.md", *(f"{m}.md" for m in exported)}
    assert set(mkdocs_reference.pages()) == want


def test_every_public_name_is_rendered_or_linked():
    """Each name of ``gamfunc.__all__`` that is no module appears on the index page: rendered at
    its definition (``::: path``), or linked to the module page that renders it."""
    pages = mkdocs_reference.pages()
    index = pages["index.md"]
    rendered = {p for text in pages.values() for p in re.findall(r"^::: (\S+)", text, re.M)}
    for name in gamfunc.__all__:
        if isinstance(getattr(gamfunc, name), types.ModuleType):
            continue
        path = mkdocs_reference._path(gamfunc, name)
        assert path in rendered, name
        assert f"::: {path}\n" in index or f"[`gamfunc.{name}`][{path}]" in index, name
