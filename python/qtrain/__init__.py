"""qtrain from Python: the C++/CUDA engine with the command line's options as keywords.

    import qtrain
    qtrain.train(model="Qwen2.5-0.5B", from_scratch=True, train_file="data/*.bin", steps=100)

Every keyword is a `train` flag (`from_scratch=True` is `--from-scratch`, `learning_rate=3e-4` is
`--learning-rate=3e-4`; False or None leaves a flag out), validated by the same C++ code: a bad one
raises ValueError with the command line's message.
"""

from __future__ import annotations

from typing import Any

from . import _qtrain
from ._qtrain import Tokenizer

__all__ = ["Tokenizer", "train", "check_options", "flags"]
__version__ = "0.1.0"


def flags(**options: Any) -> list[str]:
    """The `train` flags these keywords stand for, in order."""
    out = []
    for key, value in options.items():
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


def check_options(**options: Any) -> None:
    """Raises ValueError when `train` would refuse these options (nothing runs)."""
    _qtrain.check_options(flags(**options))


def train(**options: Any) -> int:
    """Runs a whole training job, as `train` with these flags would; returns its exit code (0, or 130
    after Ctrl-C with a checkpoint written). Raises ValueError on bad options or inputs."""
    return _qtrain.run_training(flags(**options))
