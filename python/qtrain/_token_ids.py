"""Token-id arrays from Python, checked before they reach the engine (which takes C-contiguous int32).

Everything is checked on the array as given, before any conversion: numpy's astype(np.int32) wraps
2**32 + 5 to 5 and truncates 2.7 to 2, so a range check after it would pass ids the caller never
meant. The messages follow the command line's form: what, the expected value, `got` the value."""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Union

import numpy as np

# what to say about a refused dtype, by numpy's kind letter
_KIND_HINTS = {
    "b": " (True/False are not token ids)",
    "f": " (ids are never rounded or truncated: convert whole numbers with .astype(np.int64) first)",
    "O": " (a list that numpy could not make an integer array of: ids beyond int64, None, or mixed types?)",
}


def checked_token_ids(value, name: str, *, where: str, shape: Sequence[Optional[int]],
                      shape_text: Union[str, Callable[[], str]], high: int, high_text: str,
                      lowest: Union[int, np.ndarray] = 0) -> np.ndarray:
    """`value` as a C-contiguous int32 array, after checking, in its own dtype:
    - an integer dtype (signed or unsigned; not bool, float or object): else TypeError;
    - the shape: len(shape) dimensions, each the given size (None: any): else ValueError naming
      shape_text (a string, or a function giving it, called only for the message);
    - every id in [lowest, high): else ValueError naming the first one outside, its position and value.
      lowest is a number, or an array over the last axis (a bound per column).
    `where` and `name` begin the messages (e.g. "step(): tokens")."""
    arr = np.asarray(value)
    if arr.dtype.kind not in "iu":  # (bool is kind "b", not an integer here)
        raise TypeError(f"{where}: {name} must be an array of integer token ids, got dtype {arr.dtype}"
                        + _KIND_HINTS.get(arr.dtype.kind, ""))
    if arr.ndim != len(shape) or any(want is not None and got != want for got, want in zip(arr.shape, shape)):
        text = shape_text() if callable(shape_text) else shape_text
        raise ValueError(f"{where}: {name} must have shape {text}, got shape {list(arr.shape)}")
    # compared in the array's own dtype, nothing narrowed yet (uint64 against an int64 bound goes through
    # float64, exact for the bounds, which are small: an id near 2**64 is still far above `high`)
    outside = (arr < lowest) | (arr >= high)
    if outside.any():
        pos = tuple(int(i) for i in np.argwhere(outside)[0])
        low = int(lowest if np.ndim(lowest) == 0 else lowest[pos[-1]])
        note = f"{high_text}; -1 = no loss" if low < 0 else high_text
        raise ValueError(f"{where}: {name}[{', '.join(map(str, pos))}] = {arr[pos]} is outside [{low}, {high}) ({note})")
    return np.ascontiguousarray(arr, dtype=np.int32)
