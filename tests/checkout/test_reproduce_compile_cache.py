"""A compile paid once per model: ``train.py --compile`` keeps its compiled artifacts in
``--compile_cache`` (by default ``<logdir>/.compile_cache``), and a later run and a ``--resume`` load
them before their first step; a corrupt or foreign artifacts file is ignored with one line.

What is asserted is what the caches say (artifacts loaded and saved, inductor's cache hits and
misses of the first steps, kept in summary.json), never a wall time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from reproduce.run import checkpoint as ckpt
from reproduce.run import compile_cache
from reproduce.run.compile_cache import FORMAT, CompileCache

ROOT = Path(__file__).resolve().parents[2]
QUICK = ["--estimator=sgd", "--progress=false", "--landscape=false"]
QUICK += ["--eig_iters=0", "--trace_samples=0", "--r1_steps=0", "--threads=1"]


def test_the_folder_is_beside_the_runs_unless_named_or_off(tmp_path):
    assert compile_cache.folder("auto", tmp_path) == tmp_path / ".compile_cache"
    assert compile_cache.folder(" off ", tmp_path) is None
    assert compile_cache.folder(str(tmp_path / "c"), "runs") == tmp_path / "c"
    assert compile_cache.folder("~/c", "runs") == Path("~/c").expanduser()


def test_inductor_is_pointed_at_the_folder_until_closed(tmp_path, monkeypatch):
    monkeypatch.setenv(compile_cache.ENV, "/before")
    cache = CompileCache(tmp_path, torch.device("cpu"), 1, print).open()
    assert os.environ[compile_cache.ENV] == str((tmp_path / "inductor").resolve())
    assert cache.path == tmp_path / "artifacts" / "rank1_cpu.pt"
    cache.close()
    assert os.environ[compile_cache.ENV] == "/before"
    monkeypatch.delenv(compile_cache.ENV)
    CompileCache(tmp_path, torch.device("cpu"), 0, print).open().close()
    assert compile_cache.ENV not in os.environ


@pytest.mark.parametrize(
    ("write", "why"),
    [
        (lambda p: p.write_bytes(b"\x00not a torch file"), "corrupt"),
        (
            lambda p: ckpt.save(p, {"kind": "something else", "torch": str(torch.__version__)}),
            "not a",
        ),
        (
            lambda p: ckpt.save(
                p, {"kind": FORMAT, "torch": "0.0", "artifacts": torch.zeros(3, dtype=torch.uint8)}
            ),
            "torch 0.0",
        ),
        (
            lambda p: ckpt.save(
                p,
                {
                    "kind": FORMAT,
                    "torch": str(torch.__version__),
                    "artifacts": torch.arange(64, dtype=torch.uint8),
                },
            ),
            "cannot read",
        ),
    ],
)
def test_a_corrupt_or_foreign_artifacts_file_is_ignored_with_one_line(tmp_path, write, why):
    lines = []
    cache = CompileCache(tmp_path, torch.device("cpu"), 0, lines.append)
    assert cache.load() == 0 and lines == []  # no file: nothing to say
    cache.path.parent.mkdir(parents=True)
    write(cache.path)
    try:
        cache.open()
        assert cache.load() == 0
    finally:
        cache.close()
    assert len(lines) == 1 and lines[0].startswith("compile cache: ignoring") and why in lines[0]


def test_the_runs_end_saves_again_only_what_was_compiled_after_the_first_save(
    tmp_path, monkeypatch
):
    """A branch whose first step comes later (``--when=late``'s flat steps) compiles after the
    first save: the run's end saves once more then, and not where nothing was compiled since; a
    run of fewer steps than a cycle saves there for the first time. ``first`` stays the first
    steps' counts."""
    counts = {"fxgraph_cache_miss": 2}
    writes = []
    monkeypatch.setattr(compile_cache, "cache_counts", lambda: dict(counts))
    monkeypatch.setattr(
        torch.compiler,
        "save_cache_artifacts",
        lambda: writes.append(dict(counts)) or (b"blob", type("Info", (), {"artifacts": {}})()),
    )
    cache = CompileCache(tmp_path, torch.device("cpu"), 0, lambda line: None)
    cache.path.parent.mkdir(parents=True)
    cache.save()  # after the first steps of the branches that ran
    assert cache.save_at_end() == 0 and len(writes) == 1  # nothing compiled since
    counts["fxgraph_cache_miss"] = 5  # the late branch compiled
    cache.save_at_end()
    assert writes == [{"fxgraph_cache_miss": 2}, {"fxgraph_cache_miss": 5}]
    assert cache.first == {"fxgraph_cache_miss": 2}
    short = CompileCache(tmp_path / "short", torch.device("cpu"), 0, lambda line: None)
    short.path.parent.mkdir(parents=True)
    short.save_at_end()  # never saved: a run shorter than a cycle
    assert short.done and len(writes) == 3


def train(logdir: Path, *args: str) -> tuple[dict, str]:
    proc = subprocess.run(
        [sys.executable, "reproduce/train.py", f"--logdir={logdir}", *QUICK, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    name = next((a.split("=", 1)[1] for a in args if a.startswith("--name=")), "mnist1d")
    summary = json.loads((logdir / name / "sgd" / "summary.json").read_text())
    return summary["compile_cache"], proc.stdout


@pytest.mark.slow
def test_a_compiled_run_keeps_its_artifacts_and_later_runs_and_resumes_load_them(tmp_path):
    # compiled by pass, the quicker compile on the CPU; the cache is the same for a whole step.
    # A corrupt or foreign file is the unit test's above, with no training around it.
    compiled = ("--compile", "--compile_scope=pass")
    # the first run compiles (its caches are empty) and keeps what it compiled
    cold, out = train(tmp_path, *compiled, "--max_steps=3")
    assert cold["folder"] == str(tmp_path / ".compile_cache")
    assert cold["loaded"] == 0 and cold["saved"] > 0
    assert cold["fxgraph_cache_miss"] > 0 and cold["fxgraph_cache_hit"] == 0
    files = list((tmp_path / ".compile_cache" / "artifacts").iterdir())
    assert [f.name for f in files] == ["rank0_cpu.pt"] and "saved" in out
    # another run of the logdir loads them and compiles nothing afresh
    warm, out = train(tmp_path, *compiled, "--max_steps=3", "--name=again")
    assert warm["loaded"] > 0 and "compile cache: loaded" in out
    assert warm["fxgraph_cache_hit"] > 0 and warm["fxgraph_cache_miss"] == 0
    assert warm["autograd_cache_hit"] > 0 and warm["autograd_cache_bypass"] == 0
    # so does the first run resumed
    resumed, _ = train(tmp_path, *compiled, "--max_steps=5", "--resume")
    assert resumed["loaded"] > 0
    assert resumed["fxgraph_cache_hit"] > 0 and resumed["fxgraph_cache_miss"] == 0
    # an eager run uses no cache
    eager, _ = train(tmp_path, "--max_steps=1", "--name=eager")
    assert eager is None


@pytest.mark.parametrize("where", ["file", "missing_parent", "read_only"])
def test_a_folder_that_cannot_be_written_is_refused_in_one_line_naming_the_flag(
    tmp_path, monkeypatch, where
):
    """A file, a folder that cannot be made (/proc/x) or a read-only mount: inductor writes its
    locks there even for a warm cache (Errno 30 mid-compile), so the folder is refused at open."""
    import errno
    import tempfile

    root = tmp_path / "c"
    if where == "file":
        root.write_text("")
    elif where == "missing_parent":
        root = Path("/proc/gamfunc-no-such-folder")
    else:
        (root / "inductor").mkdir(parents=True)

        def read_only(*a, dir=None, **k):
            raise OSError(errno.EROFS, "Read-only file system", str(dir))

        monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    cache = CompileCache(root, torch.device("cpu"), 0, print)
    with pytest.raises(compile_cache.CacheError, match=r"^--compile_cache: cannot write") as e:
        cache.open()
    assert str(root) in str(e.value) and "--compile_cache=off" in str(e.value)
    assert compile_cache.ENV not in os.environ or os.environ[compile_cache.ENV] != str(root)


def test_train_py_names_the_flag_of_a_compile_cache_it_cannot_write(tmp_path, capsys):
    """Not "cannot read the data": the line names --compile_cache, exit 2, before any step."""
    from train_cli import DIGITS, main, one_line_error

    (tmp_path / "a_file").write_text("")
    args = [*DIGITS, "--epochs=1", "--max_steps=1", "--mode=compile"]
    assert main(tmp_path, *args, f"--compile_cache={tmp_path / 'a_file'}") == 2
    err = one_line_error(capsys)
    assert err.startswith("error: --compile_cache: cannot write") and "a_file" in err, err


def test_an_error_naming_a_file_of_the_folder_sets_the_folder_aside(tmp_path):
    lines = []
    cache = CompileCache(tmp_path, torch.device("cpu"), 0, lines.append).open()
    try:
        bad = (tmp_path / "inductor" / "fs" / "c0.py").resolve()
        bad.parent.mkdir()
        bad.write_bytes(b"x = 1\0\0")
        error = RuntimeError(
            f"backend='inductor' raised:\nRuntimeError: Failed to import {bad}\n"
            "SyntaxError: source code string cannot contain null bytes\n\nSet TORCHDYNAMO_VERBOSE=1"
        )
        assert not cache.damaged_by(RuntimeError("an error of the model"))
        assert cache.damaged_by(RuntimeError("compiling failed")) is False
        wrapped = RuntimeError("the step failed")
        wrapped.__cause__ = error
        assert cache.damaged_by(wrapped)
        aside = cache.set_aside(wrapped)
    finally:
        cache.close()
    assert (aside / "fs" / "c0.py").exists() and not bad.exists()
    assert (tmp_path / "inductor").is_dir() and not list((tmp_path / "inductor").iterdir())
    (line,) = lines
    assert "holds a damaged entry (RuntimeError: Failed to import" in line, line
    assert "null bytes" in line and "compiling afresh" in line


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["null_bytes", "cut_short"])
def test_a_damaged_inductor_folder_is_set_aside_and_the_run_compiles_afresh(tmp_path, damage):
    """Null bytes in a generated module, or its libraries cut short (a machine lost mid-write, a
    full disk), failed every later compiled run with InductorError; now the run says so in one
    line, sets the folder aside and compiles afresh, and the runs after it are warm again."""
    compiled = ("--compile", "--compile_scope=pass")
    train(tmp_path, *compiled, "--max_steps=2")
    inductor = tmp_path / ".compile_cache" / "inductor"
    if damage == "null_bytes":
        for f in inductor.rglob("*.py"):
            f.write_bytes(f.read_bytes()[:100] + b"\0" * 50)
    else:
        for f in inductor.rglob("*.so"):
            f.write_bytes(f.read_bytes()[:100])
    _, out = train(tmp_path, *compiled, "--max_steps=2", "--name=again")
    assert out.count("holds a damaged entry") == 1 and "compiling afresh" in out, out
    assert len(list((tmp_path / ".compile_cache").glob("inductor.damaged-*"))) == 1
    warm, out = train(tmp_path, *compiled, "--max_steps=2", "--name=third")
    assert "holds a damaged entry" not in out and warm["fxgraph_cache_miss"] == 0
