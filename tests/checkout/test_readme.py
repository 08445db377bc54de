"""Every ```python block of README.md and of the guides under docs/ runs.

A block is collected from its opening fence to the closing one and executed on its own, in a fresh
namespace, from an empty temporary folder (so nothing is written into the checkout). A block that cannot
run in CI says so on its first line, with the reason: a comment that starts ``# not run in tests``
(for example ``# not run in tests: needs torchrun``); it is skipped and reported with that reason.
"""

import re
from pathlib import Path

import pytest
from helpers import OPTIONAL

ROOT = Path(__file__).resolve().parents[2]
# PYPI.md: the long description of the package's index page (pyproject.toml's readme)
DOCS = [ROOT / "README.md", ROOT / "PYPI.md", *sorted((ROOT / "docs").rglob("*.md"))]
MARKER = "# not run in tests"


def blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), flags=re.S | re.M)


CASES = [(p, i) for p in DOCS for i in range(len(blocks(p)))]


def test_the_readme_and_the_guides_have_blocks_to_run():
    names = {p.relative_to(ROOT).as_posix() for p, _ in CASES}
    assert {"README.md", "docs/guides/concepts.md", "docs/migration.md"} <= names


@pytest.mark.parametrize(
    ("doc", "index"), CASES, ids=[f"{p.relative_to(ROOT).as_posix()}-{i}" for p, i in CASES]
)
def test_doc_example_runs(doc, index, tmp_path, monkeypatch):
    code = blocks(doc)[index]
    if code.startswith(MARKER):
        pytest.skip(code.splitlines()[0].removeprefix("# "))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs").mkdir()  # where the examples write their pictures
    name = f"{doc.relative_to(ROOT).as_posix()} block {index}"
    try:
        exec(compile(code, name, "exec"), {"__name__": "__readme__"})
    except ModuleNotFoundError as e:
        package = (e.name or "").split(".")[0]
        if package not in OPTIONAL:
            raise
        pytest.skip(f'needs {package}: pip install -e ".[reproduce]"')


def lightning_line(doc: Path) -> str:
    """The facade ``doc`` gives ``configure_optimizers`` to return: its ``GAM(self.net, ...)``."""
    text = " ".join(doc.read_text().split())
    (line,) = set(re.findall(r"(?:return |`)(GAM\(self\.net, [^`]*?\))(?:`| |$)", text))
    return line


# Lightning's own use of torch APIs that torch deprecates, and its advice on data loader workers
@pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")
@pytest.mark.filterwarnings("ignore:.*does not have many workers.*")
@pytest.mark.parametrize("doc", ["README.md", "docs/guides/torch-optim.md"])
def test_the_documented_lightning_line_trains_in_automatic_optimisation(doc):
    """The facade line the README and the torch.optim guide give a LightningModule runs as
    written in automatic optimisation (fd GAM: exact H·v cannot be driven by its closure)."""
    pytest.importorskip("lightning")
    import copy

    import torch
    from test_torch_optim_bases import batches, params_of
    from test_torch_optim_lightning import Classifier, trainer

    from gamfunc.torch_optim import GAM

    line = lightning_line(ROOT / doc)

    class AsWritten(Classifier):
        def configure_optimizers(self):
            return eval(line, {"torch": torch, "GAM": GAM, "self": self})

    module = AsWritten("gam", True)
    start = copy.deepcopy(params_of(module.net))
    trainer(1).fit(module, torch.utils.data.DataLoader(batches(1), batch_size=None))
    assert all(not torch.equal(p, start[k]) for k, p in params_of(module.net).items())


def printed(doc: Path, index: int, tmp_path, monkeypatch, capsys) -> tuple[str, str]:
    """What block ``index`` of ``doc`` prints, and the block itself."""
    code = blocks(doc)[index]
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    exec(compile(code, f"{doc.name} block {index}", "exec"), {"__name__": "__readme__"})
    return capsys.readouterr().out, code


def test_the_first_loops_comment_shows_what_it_prints(tmp_path, monkeypatch, capsys):
    """The README's first loop ends with a comment of its output, ``...`` for the numbers that
    depend on the platform: the rest is what it prints."""
    (index,) = [i for i, b in enumerate(blocks(ROOT / "README.md")) if "make_step" in b]
    out, code = printed(ROOT / "README.md", index, tmp_path, monkeypatch, capsys)
    comment = code.rstrip().splitlines()[-1].removeprefix("# ")
    pattern = ".*?".join(map(re.escape, comment.split("...")))
    assert re.fullmatch(pattern, out.strip()), (comment, out)


def test_the_concepts_estimators_print_names_that_tell_them_apart(tmp_path, monkeypatch, capsys):
    (index,) = [
        i for i, b in enumerate(blocks(ROOT / "docs/guides/concepts.md")) if "for est in" in b
    ]
    out, code = printed(ROOT / "docs/guides/concepts.md", index, tmp_path, monkeypatch, capsys)
    names = [line.rsplit(" [", 1)[0] for line in out.strip().splitlines()]
    assert len(names) == code.count("\n    gamfunc.")  # one line for each estimator of the list
    assert len(set(names)) == len(names), sorted(n for n in names if names.count(n) > 1)


@pytest.mark.parametrize(
    "doc",
    [p for p in DOCS if "reference" not in p.parts],
    ids=lambda p: p.relative_to(ROOT).as_posix(),
)
def test_links_read_as_links_outside_the_site(doc):
    """A reference-style link to an object, ``[`x`][gamfunc.x]``, resolves in the site only (mkdocs'
    autorefs) and reads as brackets on GitHub or in an editor: the guides link to the reference
    page instead, ``[`x`](../reference/page.md#gamfunc.x)``."""
    prose = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.S | re.M)
    assert not re.findall(r"\]\[gamfunc\.[\w.]+\]", prose)
