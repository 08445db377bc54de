"""The documentation spells each flag of reproduce/train.py and reproduce/sweep.py as --help shows it.

Every command for either script in the READMEs and docs/ with its guides (fenced code, with its continuation lines,
and inline code) is split into its flags: those after ``train.py``, those after ``sweep.py`` up to
``--`` (the sweep's own) and after it (train.py's). Flags of other tools on the same line (torchrun,
python, pytest) come before the script and are not read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

from reproduce import sweep, train  # noqa: E402

DOCS = [
    ROOT / "README.md",
    ROOT / "reproduce" / "README.md",
    ROOT / "benchmarks" / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
]
SCRIPT = re.compile(r"(?:^|[\s/`])(train|sweep)\.py(?=\s|$|`)")
BETWEEN = ("|", "||", "&&", ";")  # the next command starts


def train_flags() -> set[str]:
    """The options train.py's --help lists (its Options section), and --help."""
    lines = train._help().split("Options (--key=value):")[1].splitlines()
    return {ln.split()[0] for ln in lines if ln.startswith("  --")} | {"--help"}


def sweep_flags() -> set[str]:
    """The options sweep.py's --help lists, each as its first spelling there."""
    return {a.option_strings[0] for a in sweep._parser()._actions if a.option_strings}


def commands(text: str, code: bool = False) -> list[str]:
    """The command lines of ``text`` that run train.py or sweep.py (continuations joined): in fenced
    code and inline code of Markdown, or on every line with ``code`` (a docstring)."""
    out, fenced, pending = [], code, ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced, pending = not fenced, ""
            continue
        if fenced:
            pending += line.rstrip().removesuffix("\\") + " "
            if not line.rstrip().endswith("\\"):
                out.append(pending)
                pending = ""
        else:
            out += re.findall(r"`([^`]+)`", line)
    return [c for c in out if SCRIPT.search(c)]


def flags_of(command: str) -> list[tuple[str, str]]:
    """``[(script, --flag), ...]`` of one command, each flag with the script that reads it."""
    found, script = [], None
    for token in command.split():
        if token.startswith("#"):
            break
        if token in BETWEEN:
            script = None
            continue
        m = SCRIPT.search(token)
        if m:
            script = m.group(1)
        elif token == "--" and script == "sweep":
            script = "train"
        elif script and re.match(r"--[A-Za-z]", token):
            found.append((script, token.split("=")[0].rstrip(",.`)")))
    return found


def test_the_parsers_are_read():
    assert {"--max_steps", "--val_fraction", "--preset"} <= train_flags()
    assert {"--grid", "--seeds", "--data_seed"} <= sweep_flags()


def test_commands_are_split_by_script():
    got = flags_of("torchrun --nproc_per_node=2 reproduce/train.py --preset=x --max_steps=3 # a")
    assert got == [("train", "--preset"), ("train", "--max_steps")]
    got = flags_of("python reproduce/sweep.py --grid=rho=1,2 --seeds=0 -- --epochs=1")
    assert got == [("sweep", "--grid"), ("sweep", "--seeds"), ("train", "--epochs")]
    assert flags_of("python reproduce/sweeps/vmap_grid.py --grid=x") == []
    assert flags_of("pip install --user x && python train.py --seed=1") == [("train", "--seed")]


def misspelled(lines: list[str]) -> list[str]:
    """The flags of these command lines that --help of their script does not list."""
    known = {"train": train_flags(), "sweep": sweep_flags()}
    found = {(s, f) for c in lines for s, f in flags_of(c) if f not in known[s]}
    return sorted(f"{script}.py {flag}" for script, flag in found)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_flag_in_the_docs_is_spelled_as_help_shows_it(doc):
    wrong = misspelled(commands(doc.read_text()))
    assert not wrong, f"{doc.name}: {wrong}"


@pytest.mark.parametrize("script", [train, sweep], ids=["train.py", "sweep.py"])
def test_the_commands_that_help_shows_are_spelled_as_it_lists_them(script):
    doc = script.__doc__
    # a docstring with fenced blocks reads as Markdown; one without, as code throughout
    wrong = misspelled(commands(doc, code="```" not in doc))
    assert not wrong, f"{script.__name__}: {wrong}"
