"""Keywords to `train` flags: the Python side of one set of options (the C++ parser validates them)."""

from __future__ import annotations

from typing import Any


def flags(**options: Any) -> list[str]:
    """The `train` flags these keywords stand for, in order: `from_scratch=True` is `--from-scratch`,
    `learning_rate=3e-4` is `--learning-rate=0.0003`, a list is comma-separated; False or None leaves
    a flag out. `--continue` is the keyword `continue_` (or `**{"continue": True}`)."""
    out = []
    for key, value in options.items():
        if key == "continue_":
            key = "continue"
        name = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            out.append(name)
        elif isinstance(value, (list, tuple)):
            out.append(f"{name}={','.join(str(v) for v in value)}")
        else:
            out.append(f"{name}={value}")
    return out
