"""MkDocs hooks: the README is the site's front page, and links keep working on GitHub and in the site.

The Markdown files are written for GitHub, where a link is a path relative to the file that holds it
(README.md links to ``docs/guides/...``, a guide to ``../../reproduce/RESULTS.md``). Here every relative
link is resolved against the file's place in the repository: a target under ``docs/`` becomes the path
the site knows; a target outside ``docs/`` (reproduce/README.md, benchmarks/RESULTS.md, ...) is added
to the site under ``repo/`` and linked there. A target that does not exist stops the build, so
``mkdocs build --strict`` fails on broken links whichever side of ``docs/`` they point to; a page
generated into the site (the API reference's, mkdocs_reference.py, a hook listed before this one)
exists there.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent
LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)(\))")
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|#|/)", re.I)


def _prose(markdown: str) -> list[tuple[bool, str]]:
    """``(is_code, text)`` pieces of ``markdown``: fenced blocks are code and keep their links as text."""
    pieces, fenced, current = [], False, []
    for line in markdown.splitlines(keepends=True):
        if line.lstrip().startswith("```"):
            if not fenced:
                pieces.append((False, "".join(current)))
                current = []
            current.append(line)
            if fenced:
                pieces.append((True, "".join(current)))
                current = []
            fenced = not fenced
            continue
        current.append(line)
    pieces.append((fenced, "".join(current)))
    return pieces


def _targets(source: Path, markdown: str) -> list[tuple[str, Path, str]]:
    """``(link, file it points to, #anchor)`` for every relative link of the prose of ``markdown``."""
    out = []
    for code, text in _prose(markdown):
        if code:
            continue
        for m in LINK.finditer(text):
            target = m.group(2)
            if EXTERNAL.match(target):
                continue
            path, _, anchor = target.partition("#")
            out.append((target, (source.parent / path).resolve(), anchor))
    return out


def _site_path(real: Path, docs: Path) -> str:
    """Where the file at ``real`` sits in the site's tree of sources."""
    if real == ROOT / "README.md":
        return "index.md"
    if real.is_relative_to(docs):
        return real.relative_to(docs).as_posix()
    return "repo/" + real.relative_to(ROOT).as_posix()


def on_files(files, config):
    docs = Path(config["docs_dir"]).resolve()
    files.append(File.generated(config, "index.md", abs_src_path=str(ROOT / "README.md")))
    seen = {f.abs_src_path for f in files if f.abs_src_path}
    generated = {f.src_uri for f in files if not f.abs_src_path}
    todo = [Path(f.abs_src_path) for f in files if f.src_uri.endswith(".md") and f.abs_src_path]
    while todo:
        source = todo.pop()
        for link, real, _ in _targets(source, source.read_text(encoding="utf-8")):
            if real.is_relative_to(docs) and _site_path(real, docs) in generated:
                continue
            if not real.is_file():
                raise PluginError(f"{source.relative_to(ROOT)}: link to a missing file: {link}")
            if real.is_relative_to(docs) or str(real) in seen:
                continue
            seen.add(str(real))
            files.append(File.generated(config, _site_path(real, docs), abs_src_path=str(real)))
            if real.suffix == ".md":
                todo.append(real)
    return files


def on_page_markdown(markdown, page, config, files):
    if not page.file.abs_src_path:  # generated in the site: its links are the site's already
        return markdown
    docs = Path(config["docs_dir"]).resolve()
    source = Path(page.file.abs_src_path)
    here = Path(page.file.src_uri).parent

    def fix(m):
        target = m.group(2)
        if EXTERNAL.match(target):
            return m.group(0)
        path, hash_, anchor = target.partition("#")
        real = (source.parent / path).resolve()
        new = os.path.relpath(_site_path(real, docs), here.as_posix() or ".")
        return f"{m.group(1)}{Path(new).as_posix()}{hash_}{anchor}{m.group(3)}"

    return "".join(t if code else LINK.sub(fix, t) for code, t in _prose(markdown))
