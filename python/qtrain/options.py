"""Keywords to `train` flags: the Python side of the engine's one table of options (the C++ parser
validates the values; this side only spells them)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any


@lru_cache(maxsize=1)
def _flag_of_keyword() -> dict:
    from . import _qtrain

    return {o["keyword"]: o["flag"] for o in _qtrain.describe_options()}


def describe() -> list:
    """Every `train` option from the engine's table: flag, keyword, type, default, help, group,
    choices and its rule on resume (must-match, may-change, ...)."""
    from . import _qtrain

    return _qtrain.describe_options()


def flags(**options: Any) -> list:
    """The `train` flags these keywords stand for, in order: `from_scratch=True` is `--from-scratch`,
    `learning_rate=3e-4` is `--learning-rate=0.0003`, a list is comma-separated; False or None leaves
    a flag out. `--continue` is the keyword `continue_from_checkpoint`. An unknown keyword becomes the
    flag it spells, which the parser then refuses with the command line's message."""
    known = _flag_of_keyword()
    out = []
    for key, value in options.items():
        name = "--" + known.get(key, key.replace("_", "-"))
        if value is None or value is False:
            continue
        if value is True:
            out.append(name)
        elif isinstance(value, (list, tuple)):
            out.append(f"{name}={','.join(str(v) for v in value)}")
        else:
            out.append(f"{name}={value}")
    return out
