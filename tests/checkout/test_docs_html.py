"""The built site reads as documentation: no raw reST markup, links for cross-references, math as math.

The site is built once (``mkdocs build --strict``) into a temporary folder. Its prose, the text of every
page outside code (``<code>``, ``<pre>``, scripts), must hold no Sphinx role (``:func:`` and its
kind) and no ``::`` (a reST literal-block marker); equations of the docstrings are arithmatex blocks,
which MathJax typesets in the browser.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROLE = re.compile(r":(?:py:)?(?:func|mod|class|meth|attr|data|exc|obj):")
CODE = {"code", "pre", "script", "style", "kbd", "samp"}


class _Prose(HTMLParser):
    """The text of a page outside code elements."""

    def __init__(self):
        super().__init__()
        self.inside, self.parts = 0, []

    def handle_starttag(self, tag, attrs):
        self.inside += tag in CODE

    def handle_endtag(self, tag):
        self.inside -= tag in CODE and self.inside > 0

    def handle_data(self, data):
        if not self.inside:
            self.parts.append(data)


def prose(html: str) -> str:
    parser = _Prose()
    parser.feed(html)
    return "".join(parser.parts)


def raw_markup(html: str) -> list[str]:
    """Each leftover Sphinx role or ``::`` in the prose of ``html``, with some text around it."""
    text = prose(html)
    return [
        text[max(m.start() - 40, 0) : m.end() + 40].replace("\n", " ")
        for m in re.finditer(rf"{ROLE.pattern}|::", text)
    ]


def test_raw_markup_is_found_in_prose_only():
    page = (
        "<p>See :func:`gamfunc.sgd` and :mod:`gamfunc.hvps`; the update::</p>"
        "<pre><code>a::b  :class:`X`</code></pre><p>inline <code>torch::jit</code></p>"
    )
    found = raw_markup(page)
    assert len(found) == 3 and "the update::" in found[2]
    assert raw_markup("<p>plain [<code>x</code>] text: fine</p>") == []


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None:
        pytest.skip('needs mkdocs: pip install -e ".[docs]"')
    tmp = tmp_path_factory.mktemp("site")
    out = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(tmp / "site")],
        cwd=ROOT,
        env={
            "NO_MKDOCS_2_WARNING": "1",
            "PATH": str(Path(sys.executable).parent),
            "HOME": str(tmp),
            "PYTHONPATH": str(ROOT),
        },
        capture_output=True,
        text=True,
        timeout=600,
    )
    # strict: a broken link, anchor or cross-reference fails the build
    assert out.returncode == 0, out.stderr[-4000:]
    assert (tmp / "site" / "reference" / "index.html").is_file()
    return tmp / "site"


def pages(site: Path) -> dict[str, str]:
    return {p.relative_to(site).as_posix(): p.read_text() for p in sorted(site.rglob("*.html"))}


@pytest.mark.slow
def test_no_page_shows_raw_roles_or_literal_markers(site):
    found = {name: hits for name, html in pages(site).items() if (hits := raw_markup(html))}
    assert found == {}


@pytest.mark.slow
def test_the_reference_links_its_cross_references(site):
    optim = (site / "reference" / "optim" / "index.html").read_text()
    links = re.findall(r'<a class="autorefs autorefs-internal"[^>]*href="([^"]+)"', optim)
    assert any(href.endswith("#gamfunc.schedules") for href in links)
    assert any(href.endswith("#gamfunc.optim.base.Transform") for href in links)
    for name, html in pages(site).items():
        # an autorefs reference that did not resolve stays as its Markdown source
        assert not re.search(r"\]\[gamfunc\.", prose(html)), name


@pytest.mark.slow
def test_equations_are_rendered_as_math(site):
    optim = (site / "reference" / "optim" / "index.html").read_text()
    blocks = re.findall(r'<div class="arithmatex">(.*?)</div>', optim, flags=re.S)
    assert any(r"\begin{aligned}" in b and r"\leftarrow" in b for b in blocks)
    for name, html in pages(site).items():
        assert "$$" not in prose(html), name
    assert (site / "javascripts" / "mathjax.js").is_file()
    assert "mathjax" in optim
