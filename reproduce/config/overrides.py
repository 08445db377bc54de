"""``--key=value`` overrides: parsed against `Config`'s fields, applied in order (``--preset``
first sets the preset's values), and each field's comment as its ``--help`` text."""

from __future__ import annotations

import difflib
import inspect
import re
import typing
from dataclasses import fields, replace
from typing import Any

from reproduce.config.fields import Config
from reproduce.methods import Flags
from reproduce.presets import PRESETS, closest_presets

__all__ = ["apply", "field_help", "parse_overrides"]


def field_help() -> dict[str, str]:
    """Each field's comment in the source of `Config` (and of `reproduce.methods.Flags`, whose
    fields it takes), in the order of the fields: the ``--help`` text."""
    pattern = re.compile(r"^\s+(\w+): [^=]+ = .*?  # (.*)$")
    found = {}
    for cls in (Flags, Config):
        for line in inspect.getsource(cls).splitlines():
            m = pattern.match(line)
            if m:
                found[m.group(1)] = m.group(2)
    return {f.name: found[f.name] for f in fields(Config) if f.name in found}


def _field_types() -> dict[str, type]:
    hints = typing.get_type_hints(Config)
    return {f.name: hints[f.name] for f in fields(Config)}


def _convert(key: str, text: str, kind: type) -> Any:
    if kind is bool:
        low = text.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"--{key} takes true or false; got {text!r}")
    try:
        return kind(text)
    except ValueError:
        what = "an integer" if kind is int else f"a {kind.__name__}"
        raise ValueError(f"--{key} takes {what}; got {text!r}") from None


def parse_overrides(argv: list[str]) -> list[tuple[str, Any]]:
    """``["--lr=0.1", "--bf16", "--val-fraction", "0.1"]`` → ``[("lr", 0.1), ("bf16", True), ...]``.

    Raises ValueError naming an unknown key (with the closest known ones) or a value of the wrong type.
    """
    types = _field_types()
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            raise ValueError(f"arguments are --key=value; got {arg!r}")
        key, eq, text = arg[2:].partition("=")
        key = key.replace("-", "_")
        if key not in types:
            near = difflib.get_close_matches(key, list(types), n=3)
            hint = f"; did you mean {', '.join('--' + n for n in near)}?" if near else ""
            raise ValueError(f"unknown option --{key}{hint}")
        if not eq:
            if types[key] is bool:
                text = "true"
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                i += 1
                text = argv[i]
            else:
                raise ValueError(f"--{key} needs a value")
        out.append((key, _convert(key, text, types[key])))
        i += 1
    return out


def apply(cfg: Config, overrides: list[tuple[str, Any]] | dict[str, Any]) -> Config:
    """``cfg`` with the overrides applied in order; ``preset`` first sets the preset's values."""
    items = list(overrides.items()) if isinstance(overrides, dict) else list(overrides)
    for key, value in items:
        if key == "preset":
            if value not in PRESETS:
                near = closest_presets(value)
                hint = f"did you mean {', '.join(near)}? " if near else ""
                raise ValueError(f"unknown preset {value!r}; {hint}--help lists all {len(PRESETS)}")
            cfg = replace(cfg, **PRESETS[value], preset=value)
        else:
            cfg = replace(cfg, **{key: value})
    return cfg
