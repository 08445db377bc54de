"""A compile paid once per model: a compiled run keeps what it compiled for the next run and its resume.

With ``--compile``, a run points inductor's on-disk caches (``TORCHINDUCTOR_CACHE_DIR``, Triton's
kernels inside it) at ``<cache>/inductor``, and after the first steps of each compiled branch it
saves ``torch.compiler.save_cache_artifacts()`` (the compiled graphs, AOTAutograd's entries, the
autotuning results) atomically to ``<cache>/artifacts/rank<local rank>_<device>.pt``, and once more
at the run's end where a graph was compiled after that (a branch whose first step came later:
``--when=late``'s flat steps, an adaptive policy's first plain or flat one); a later run, and
a ``--resume``, loads that file (``torch.compiler.load_cache_artifacts``) before its first step, and
its compile finds what it needs in the caches. ``<cache>`` is ``--compile_cache``: by default
``<logdir>/.compile_cache``, shared by every run of that logdir (inductor names each entry by the
hash of what it compiled: the graph, the shapes, the device, torch's version and settings, so runs of
other models or settings only add entries). A torch without the artifact functions keeps the folder
alone.

Under ``torchrun`` every rank of a node uses the same folder, each loading and saving its own
artifacts file; nothing waits on another rank. A rank cannot compile alone while the others wait:
the first step of a data-parallel run is itself collective (its all-reduces run between the compiled
passes). And inductor keys its entries by the device's index, so what the rank on ``cuda:0``
compiles is not what the rank on ``cuda:3`` needs: each rank's entries serve that rank in the next
run of the job and in its resume. Inductor writes each entry atomically, so ranks that write at once
are safe.

An artifacts file that is corrupt, of another torch version, or that torch cannot load is ignored
with one line; the run then compiles as without it. A damaged file in the inductor folder (a
generated module or library with null bytes or cut short: a machine lost mid-write, a full disk)
fails the first compiled step naming that file: the run sets the folder aside
(``inductor.damaged-<pid>``) with one line, starts an empty one and compiles afresh
(`CompileCache.damaged_by`, `CompileCache.set_aside`). A folder that cannot be written (a file, a
read-only mount: inductor takes its locks there even for a warm cache) is refused in one line naming
``--compile_cache`` (`CacheError`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from reproduce.run import checkpoint as ckpt

__all__ = ["FORMAT", "CacheError", "CompileCache", "cache_counts", "folder"]

FORMAT = "gamfunc-reproduce-compile-artifacts/1"
ENV = "TORCHINDUCTOR_CACHE_DIR"
# inductor's compiled graphs and AOTAutograd's entries: hits, misses and bypasses (a graph AOTAutograd's
# cache refused) in this process
COUNTERS = (
    ("inductor", "fxgraph_cache_hit"),
    ("inductor", "fxgraph_cache_miss"),
    ("aot_autograd", "autograd_cache_hit"),
    ("aot_autograd", "autograd_cache_miss"),
    ("aot_autograd", "autograd_cache_bypass"),
)


class CacheError(Exception):
    """``--compile_cache`` names a folder that cannot be made or written (one line; exit 2)."""


def folder(setting: str, logdir: str | os.PathLike) -> Path | None:
    """The cache folder ``--compile_cache`` names.

    Args:
        setting: ``auto`` (``<logdir>/.compile_cache``), ``off`` (None: inductor's own settings), or
            a folder (``~`` expanded).
        logdir: the run's ``--logdir``.

    Returns:
        The folder, or None for ``off``.
    """
    setting = setting.strip()
    if setting == "off":
        return None
    if setting == "auto":
        return Path(logdir).expanduser() / ".compile_cache"
    return Path(setting).expanduser()


def cache_counts() -> dict[str, int]:
    """This process's inductor and AOTAutograd cache hits, misses and bypasses so far (:data:`COUNTERS`)."""
    from torch._dynamo.utils import counters

    return {name: int(counters[group][name]) for group, name in COUNTERS}


def _artifacts_supported() -> bool:
    return hasattr(torch.compiler, "save_cache_artifacts") and hasattr(
        torch.compiler, "load_cache_artifacts"
    )


def _count(info) -> int:
    """The artifacts a ``torch.compiler.CacheInfo`` lists."""
    artifacts = getattr(info, "artifacts", None) or {}
    return sum(len(keys) for keys in artifacts.values())


class CompileCache:
    """One process's use of a cache folder over one run: `open`, `load` before the first step,
    `save` once the compiled branches have run, `close` at the end.

    Args:
        root: the cache folder (`folder`).
        device: this process's device.
        local_rank: its index on its node (0 without torchrun).
        say: prints one line (the run's ``say``: rank 0 alone prints).
    """

    def __init__(
        self, root: Path, device: torch.device, local_rank: int, say: Callable[[str], None]
    ):
        self.root, self.say = Path(root), say
        where = f"{device.type}{device.index if device.index is not None else ''}"
        self.path = self.root / "artifacts" / f"rank{local_rank}_{where}.pt"
        self.loaded = 0  # artifacts loaded from the file before the first step
        self.saved = 0  # artifacts in the file this run wrote
        self.before: dict[str, int] = {}
        self.first: dict[str, int] = {}  # cache hits and misses of the first compiled steps
        self.done = False  # save was called
        self._at_save: dict[str, int] = {}  # the counts when it was last called
        self._previous: str | None = None
        self._open = False

    def open(self) -> CompileCache:
        """Point inductor's caches at ``<root>/inductor`` (Triton's inside it, unless
        ``TRITON_CACHE_DIR`` is set) until `close`; the counts start here.

        Raises:
            CacheError: the folder cannot be made or written (a file, a read-only mount): inductor
                writes its locks and entries there, a warm cache too.
        """
        inductor = self.root / "inductor"
        try:
            for where in (inductor, self.path.parent):
                where.mkdir(parents=True, exist_ok=True)
                with tempfile.TemporaryFile(dir=where):  # inductor writes here, warm or cold
                    pass
        except OSError as e:
            what = e.strerror or type(e).__name__
            raise CacheError(
                f"--compile_cache: cannot write the compile cache {str(e.filename or where)!r} "
                f"({what}); name a folder this process can write, or --compile_cache=off"
            ) from None
        self._previous = os.environ.get(ENV)
        os.environ[ENV] = str(inductor.resolve())
        self._open = True
        self.before = cache_counts()
        return self

    def close(self) -> None:
        """Give inductor back the cache folder it had before `open`."""
        if not self._open:
            return
        if self._previous is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = self._previous
        self._open = False

    def damaged_by(self, error: BaseException) -> bool:
        """Whether ``error`` (of a compiled step), or an error it came from, names a file in this
        cache's inductor folder: a damaged entry there (null bytes, cut short) fails every later
        compile that reads it.

        Args:
            error: the exception.

        Returns:
            True where a file of the folder is named.
        """
        return self._naming(error) is not None

    def _naming(self, error: BaseException) -> BaseException | None:
        """The first of ``error`` and the errors it came from that names a file of the folder."""
        inductor = str((self.root / "inductor").resolve())
        seen: set[int] = set()
        e: BaseException | None = error
        while e is not None and id(e) not in seen:
            if inductor in str(e):
                return e
            seen.add(id(e))
            e = e.__cause__ or e.__context__
        return None

    def set_aside(self, error: BaseException) -> Path:
        """Move the inductor folder aside (``inductor.damaged-<pid>``) with one line, start an
        empty one, and forget what this process compiled or loaded from it, so that the next
        compile starts afresh.

        Args:
            error: the error that named a file of the folder (`damaged_by`), for the line.

        Returns:
            Where the folder went.
        """
        import torch._dynamo
        from torch._inductor.utils import clear_caches

        inductor = self.root / "inductor"
        aside = self.root / f"inductor.damaged-{os.getpid()}"
        with contextlib.suppress(FileNotFoundError):  # another rank of the node moved it
            inductor.rename(aside)
        inductor.mkdir(parents=True, exist_ok=True)
        torch._dynamo.reset()
        clear_caches()
        self.say(
            f"compile cache: {str(inductor)!r} holds a damaged entry ({self._named(error)}); "
            f"moved it to {str(aside)!r} and compiling afresh"
        )
        return aside

    def _named(self, error: BaseException) -> str:
        """The lines of ``error`` that name the folder's file and say what is wrong with it."""
        inductor = str((self.root / "inductor").resolve())
        error = self._naming(error) or error
        lines = [ln.strip() for ln in str(error).splitlines()]
        named = [i for i, ln in enumerate(lines) if inductor in ln]
        if not named:
            return _reason(error) if isinstance(error, Exception) else type(error).__name__
        i = named[0]
        why = [ln for ln in lines[i + 1 : i + 2] if ln.split(":")[0].endswith("Error")]
        return _reason(Exception("; ".join([lines[i], *why])))

    def load(self) -> int:
        """Load this process's artifacts file, if there is one, into inductor's caches.

        Returns:
            The number of artifacts loaded (0: no file, a torch without the artifact functions, or a
                file ignored with one line: corrupt, foreign or refused by torch).
        """
        if not self.path.is_file() or not _artifacts_supported():
            return 0
        try:
            body = ckpt.load(self.path)  # the format and the digest checked: CheckpointError
            if body.get("kind") != FORMAT:
                raise ValueError(f"not a compile cache ({body.get('kind')!r})")
            if body.get("torch") != str(torch.__version__):
                raise ValueError(f"written by torch {body.get('torch')}, not {torch.__version__}")
            blob = body["artifacts"].numpy().tobytes()
            # torch logs a traceback where it cannot read them; the one line below says it
            with _quiet():
                info = torch.compiler.load_cache_artifacts(blob)
            if info is None:
                raise ValueError("torch cannot read the artifacts it holds")
        except Exception as e:  # a bad file never stops a run: it compiles without it
            self.say(f"compile cache: ignoring {self.path}: {_reason(e)}")
            return 0
        self.loaded = _count(info)
        self.say(f"compile cache: loaded {self.loaded} compiled artifacts from {self.path}")
        return self.loaded

    def save(self) -> int:
        """Save what this process compiled or loaded so far, atomically (`reproduce.run.checkpoint.save`);
        the first call also keeps the cache hits and misses since `open` (``first``).

        Returns:
            The number of artifacts saved (0 where torch has nothing to save, or the write failed,
                said in one line).
        """
        now = cache_counts()
        if not self.done:
            self.first = {k: now[k] - self.before.get(k, 0) for k in now}
        self.done, self._at_save = True, now
        if not _artifacts_supported():
            return 0
        try:
            got = torch.compiler.save_cache_artifacts()
            if got is None:
                return 0
            blob, info = got
            data = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
            body = {"kind": FORMAT, "torch": str(torch.__version__), "artifacts": data}
            ckpt.save(self.path, body)
        except Exception as e:  # a cache that cannot be written costs the next run a compile
            self.say(f"compile cache: could not save {self.path}: {_reason(e)}")
            return 0
        self.saved = _count(info)
        self.say(f"compile cache: saved {self.saved} compiled artifacts to {self.path}")
        return self.saved

    def save_at_end(self) -> int:
        """At the run's end: `save` where it was never called (a run of fewer steps than a cycle)
        or where this process compiled or loaded a graph since (a branch first run later), else
        nothing.

        Returns:
            The number of artifacts saved (0: nothing new, or as `save`).
        """
        if self.done and cache_counts() == self._at_save:
            return 0
        return self.save()

    def record(self) -> dict:
        """What the summary keeps: the folder, the artifacts loaded and saved, and the cache hits and
        misses of the first compiled steps."""
        return {"folder": str(self.root), "loaded": self.loaded, "saved": self.saved, **self.first}


@contextlib.contextmanager
def _quiet():
    """torch's compile-cache loggers silenced below errors."""
    loggers = [logging.getLogger(n) for n in ("torch.compiler._cache", "torch._inductor.codecache")]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for log, level in zip(loggers, levels, strict=True):
            log.setLevel(level)


def _reason(e: Exception) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 200 else text[:199] + "…"
