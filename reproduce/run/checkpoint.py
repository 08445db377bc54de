"""Checkpoints that survive a crash: atomic writes, a content digest, and a refusal to mix configurations.

A checkpoint is a ``torch.save`` file (readable with ``torch.load(path, weights_only=True)``):

```text
{"format": FORMAT, "digest": sha256 of the body, "body": {...}}
```

``save`` serialises to memory, writes a temporary file in the same folder, flushes and fsyncs it, then
``os.replace``s it over the old checkpoint and fsyncs the folder: a reader sees either the old file or
the new one, never a partial one, even if the process dies mid-write. ``load`` re-computes the digest,
so a truncated or bit-flipped file gives `CheckpointError` instead of silently wrong weights.

Test hook: with the environment variable ``GAMFUNC_CHECKPOINT_TEST_PAUSE=<seconds>``, ``save`` sleeps
that long after writing half of the temporary file (the window in which the tests kill the process).
"""

from __future__ import annotations

import hashlib
import io
import os
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "FORMAT",
    "TEST_PAUSE_ENV",
    "CheckpointError",
    "ConfigMismatch",
    "check_config",
    "digest",
    "load",
    "read",
    "rng_state",
    "save",
    "set_rng_state",
    "state_dict",
]

FORMAT = "gamfunc-reproduce-checkpoint/1"
TEST_PAUSE_ENV = "GAMFUNC_CHECKPOINT_TEST_PAUSE"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable, corrupt, or not one of ours."""


class ConfigMismatch(CheckpointError):
    """A checkpoint was written by a run of another configuration."""


def _feed(h, obj: Any) -> None:
    if isinstance(obj, Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(obj, dict):
        h.update(b"{")
        for k in sorted(obj, key=repr):
            h.update(repr(k).encode() + b":")
            _feed(h, obj[k])
        h.update(b"}")
    elif isinstance(obj, list | tuple):
        h.update(b"[")
        for v in obj:
            _feed(h, v)
        h.update(b"]")
    else:
        h.update(f"{type(obj).__name__}:{obj!r};".encode())


def digest(obj: Any) -> str:
    """SHA-256 over a nested structure of dicts, lists, tensors (dtype, shape, bytes) and scalars."""
    h = hashlib.sha256()
    _feed(h, obj)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def save(path: str | os.PathLike, body: dict[str, Any]) -> None:
    """Write ``body`` to ``path`` atomically (temporary file in the same folder, fsync, ``os.replace``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    torch.save({"format": FORMAT, "digest": digest(body), "body": body}, buf)
    data = buf.getbuffer()
    for stale in path.parent.glob(f".{path.name}.tmp-*"):  # left by a process killed mid-write
        stale.unlink(missing_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            half = len(data) // 2
            f.write(data[:half])
            f.flush()
            pause = float(os.environ.get(TEST_PAUSE_ENV, "0") or 0)
            if pause > 0:
                time.sleep(pause)
            f.write(data[half:])
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.errno is not None and not e.filename:
            e.filename = str(path)  # a full disk: name the file (a failed write names none)
        raise
    _fsync_dir(path.parent)


def load(path: str | os.PathLike) -> dict[str, Any]:
    """The body of the checkpoint at ``path``, after checking its format and digest.

    Raises:
        CheckpointError: the file is missing, cannot be read, is not a checkpoint of
            ``reproduce/train.py``, or its content does not match its digest (corrupt or truncated).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {str(path)!r}")
    obj = read(path, "checkpoint", "Delete it (or restore a copy) and restart without --resume.")
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        found = obj.get("format") if isinstance(obj, dict) else type(obj).__name__
        raise CheckpointError(
            f"{str(path)!r} is not a reproduce/train.py checkpoint (format {found!r}, expected {FORMAT!r})"
        )
    if digest(obj["body"]) != obj.get("digest"):
        raise CheckpointError(
            f"checkpoint {str(path)!r} is corrupt: its content does not match its SHA-256 digest. "
            "Delete it (or restore a copy) and restart without --resume."
        )
    return obj["body"]


def read(path: str | os.PathLike, what: str = "file", advice: str = "") -> Any:
    """``torch.load(path, weights_only=True)``, with one sentence saying why a file cannot be read.

    A file that holds Python objects other than tensors and containers (a pickle payload) is refused,
    never executed; a truncated file, or one that is no torch file at all, is called so.

    Raises:
        CheckpointError: the file cannot be read as tensors.
    """
    import pickle

    tail = f" {advice}" if advice else ""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(
            f"{what} {str(path)!r} holds Python objects besides tensors, or is corrupt; it is not "
            f"loaded, since unpickling it could run code.{tail}"
        ) from None
    except Exception as e:
        raise CheckpointError(
            f"{what} {str(path)!r} is corrupt or truncated, or no torch file, and cannot be read "
            f"({type(e).__name__}).{tail}"
        ) from None


def state_dict(path: str | os.PathLike) -> dict[str, Tensor]:
    """The tensors of a ``--weights`` file: a local state dict (also under ``state_dict`` or
    ``model``), or the parameters and buffers of one of our checkpoints.

    Args:
        path: the file (``~`` expanded).

    Returns:
        Names of parameters and buffers to tensors, on the CPU.

    Raises:
        CheckpointError: there is no file, it cannot be read as tensors, one of ours is corrupt, or
            it holds no dict of tensors (the message names the file).
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise CheckpointError(f"--weights: no file at {str(p)!r}")
    obj = read(p, "--weights")
    if isinstance(obj, dict) and obj.get("format") == FORMAT:
        body = load(p)
        obj = {**body["params"], **body["state"].get("buffers", {})}
    if isinstance(obj, dict) and isinstance(obj.get("state_dict") or obj.get("model"), dict):
        obj = obj.get("state_dict") or obj["model"]
    if not isinstance(obj, dict) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise CheckpointError(f"--weights {str(p)!r} is not a state dict (a dict of tensors)")
    return obj


def check_config(saved: dict[str, Any], cfg, path: str | os.PathLike = "checkpoint") -> None:
    """Raise `ConfigMismatch` naming every field (outside ``RESUME_FREE``) where ``cfg`` differs
    from the configuration ``saved`` in a checkpoint."""
    from reproduce.config import differences

    diff = differences(saved, cfg)
    if diff:
        lines = "; ".join(f"{k}: checkpoint {a!r}, now {b!r}" for k, (a, b) in diff.items())
        raise ConfigMismatch(
            f"refusing to resume from {str(path)!r}: it was written by another configuration "
            f"(differing fields: {', '.join(diff)}). {lines}. "
            "Use the same settings, or --overwrite to start a new run."
        )


def rng_state() -> dict[str, Any]:
    """The global RNG states of torch (CPU and every CUDA device)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` returned."""
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
