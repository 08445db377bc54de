"""MkDocs hook: the API reference's pages, generated from ``__all__`` when the site is built.

One page for ``gamfunc`` (reference/index.md) and one for every module it exports; each name is
rendered from the module that defines it (``::: path``, which mkdocstrings fills from the docstring),
so that a function and the submodule of the same name (``gamfunc.estimators.gam``) never hide one
another. No page is written to docs/: the site holds them as generated files, and mkdocs.yml's nav
lists them (tests/checkout/test_docs_site.py checks both).
"""

from __future__ import annotations

import inspect
import types

from mkdocs.structure.files import File

import gamfunc

FOLDER = "reference"
OPTIONS = "    options:\n      show_root_heading: {}\n"


def _modules(module: types.ModuleType) -> list[str]:
    return [n for n in module.__all__ if isinstance(getattr(module, n), types.ModuleType)]


def _path(module: types.ModuleType, name: str) -> str:
    """Where ``module.name`` is defined (an alias such as ``ScheduledLR = Callable[...]``: where made)."""
    obj = getattr(module, name)
    where = f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"
    if not where.startswith("gamfunc.") or not (inspect.isclass(obj) or inspect.isfunction(obj)):
        where = f"{module.__name__}.{name}"
    return where


def _on_module_pages() -> set[str]:
    """The definitions that the pages of the exported modules render."""
    out = set()
    pending = [getattr(gamfunc, m) for m in [*_modules(gamfunc), "estimators", "optim"]]
    while pending:
        module = pending.pop()
        if hasattr(module, "__all__"):  # a page renders the submodules its module exports
            pending += [getattr(module, n) for n in _modules(module)]
        names = getattr(module, "__all__", None) or [
            n
            for n, o in vars(module).items()
            if not n.startswith("_")
            and (inspect.isclass(o) or inspect.isfunction(o))
            and o.__module__ == module.__name__
        ]
        out |= {_path(module, n) for n in names}
    return out


def _names(module: types.ModuleType, elsewhere: set[str] = frozenset()) -> str:
    """``::: path`` of every name of ``module.__all__`` that is no module, at its definition; a name
    in ``elsewhere`` (rendered on another page) as a cross-reference to it."""
    out, links = [], []
    for name in module.__all__:
        obj = getattr(module, name)
        if isinstance(obj, types.ModuleType):
            continue
        if _path(module, name) in elsewhere:
            links.append(f"- [`{module.__name__}.{name}`][{_path(module, name)}]\n")
            continue
        out.append(f"::: {_path(module, name)}\n" + OPTIONS.format("true") + "\n")
    if links:
        out.append("## Exported from their modules\n\n" + "".join(links))
    return "".join(out)


def _home(path: str, pages: list[str]) -> str | None:
    """The page that renders the definition at ``path``: that of the deepest exported module whose
    name begins it (``gamfunc.optim.base.Transform``: ``optim``), None if no page's does."""
    found = [m for m in pages if path.startswith(f"gamfunc.{m}.")]
    return max(found, key=len) if found else None


def _module_page(module: types.ModuleType, level: str = "#", page: str = "") -> str:
    head = f"{level} `{module.__name__}`\n\n"
    if not hasattr(module, "__all__"):
        return head + f"::: {module.__name__}\n" + OPTIONS.format("false")
    text = head + f"::: {module.__name__}\n" + OPTIONS.format("false") + "      members: false\n\n"
    mods = [*_modules(gamfunc), "estimators", "optim"]
    # a definition re-exported here from another page's module (gamfunc.optim.transforms.Transform, made
    # in gamfunc.optim.base) is rendered once, there, and linked here
    foreign = {p for p in _on_module_pages() if _home(p, mods) not in (None, page)}
    text += _names(module, foreign)
    for sub in _modules(module):
        text += "\n" + _module_page(getattr(module, sub), "##", page)
    return text


def pages() -> dict[str, str]:
    """File name under the site's reference/ -> its text."""
    mods = [*_modules(gamfunc), "estimators", "optim"]
    links = ", ".join(f"[`gamfunc.{m}`]({m}.md)" for m in mods)
    out = {
        "index.md": "# API reference\n\nGenerated from the docstrings: the names that "
        "`gamfunc/__init__.py` exports (its `__all__`), each from the module that defines it. "
        f"Each module it exports has its page: {links}.\n\n" + _names(gamfunc, _on_module_pages())
    }
    for m in mods:
        out[f"{m}.md"] = _module_page(getattr(gamfunc, m), page=m)
    return out


def on_files(files, config):
    """Add the reference pages to the site's files, as ``reference/<page>``."""
    for name, text in pages().items():
        files.append(File.generated(config, f"{FOLDER}/{name}", content=text))
    return files
