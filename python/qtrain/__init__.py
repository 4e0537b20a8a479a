"""qtrain from Python: the C++/CUDA engine with the command line's options as keywords.

    import qtrain
    with qtrain.Trainer(model="Qwen2.5-0.5B", from_scratch=True, train_file="data/*.bin", steps=100) as t:
        for _ in range(t.steps):
            r = t.step()                     # or t.step(lr=my_schedule(t.next_step))
            print(r.step, r.loss, r.tokens_per_s)
        t.export("output")

    qtrain.train(model=..., train_file=..., steps=100)   # a whole `train` job

Every keyword is a `train` flag (`from_scratch=True` is `--from-scratch`, `learning_rate=3e-4` is
`--learning-rate=3e-4`; False or None leaves a flag out), validated by the same C++ code: a bad one
raises ValueError with the command line's message.
"""

from __future__ import annotations

import operator
import sys
from typing import Any


def _cxx_runtime_in_global_scope() -> None:
    """Makes the C++ runtime (libstdc++) global before the extension loads. When another extension
    loaded it first (numpy does: its C++ parts link it), it sits in that extension's local scope, and
    the extension's libraries (libfmt, ...) then crash in their first use of the runtime's shared
    state — seen on the GPU machine as a segmentation fault in the first call into the engine after
    `import numpy; import qtrain`. dlopen with RTLD_GLOBAL on the loaded library promotes it."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL)
        except OSError:
            pass  # a static or another C++ runtime: nothing to promote


_cxx_runtime_in_global_scope()

from . import _qtrain  # noqa: E402
from ._qtrain import DataLoader, Tokenizer  # noqa: E402
from .options import describe as describe_options
from .options import flags
from .trainer import EvalResult, StepResult, Trainer

__all__ = ["DataLoader", "EvalResult", "StepResult", "Tokenizer", "Trainer", "check_options", "describe_options", "flags",
           "memory_plan", "tokenize", "train", "write_tokens"]
__version__ = "0.1.0"


def check_options(**options: Any) -> None:
    """Raises ValueError when `train` would refuse these options (nothing runs)."""
    _qtrain.check_options(flags(**options))


def memory_plan(**options: Any) -> dict:
    """The memory plan (per rank) these options would train with, checked against the limits (raises
    ValueError when it does not fit, naming what would); allocates nothing. Works without a GPU."""
    return _qtrain.memory_plan(flags(**options))


def train(**options: Any) -> int:
    """Runs a whole training job, as `train` with these flags would; returns its exit code (0, or 130
    after Ctrl-C with a checkpoint written). Raises ValueError on bad options or inputs."""
    return _qtrain.run_training(flags(**options))


def write_tokens(path: str, tokens, vocab_size: int) -> None:
    """Writes a 1-D array of token ids as a BIN.TOK file (what `tokenize` writes and `train` reads).
    `vocab_size` is the tokenizer's (the header's; 0 = unknown). The array is checked as given, before
    its conversion to int32: an integer dtype (TypeError for float or bool), one dimension, and every id
    in [0, vocab_size) (or [0, 2**31) with vocab_size 0), else ValueError naming the first one outside."""
    try:
        vocab_size = operator.index(vocab_size)  # an int or a numpy integer, never a truncated float
    except TypeError:
        raise TypeError(f"write_tokens(): vocab_size must be an integer, got {vocab_size!r}") from None
    if vocab_size < 0:
        raise ValueError(f"write_tokens(): vocab_size must be >= 0 (0 = unknown), got {vocab_size}")
    from ._token_ids import checked_token_ids

    high, high_text = (vocab_size, "the file's vocab_size") if vocab_size > 0 else (2**31, "int32; vocab_size 0 = unknown")
    ids = checked_token_ids(tokens, "tokens", where="write_tokens()", shape=(None,), shape_text="[n] (1-D)",
                            high=high, high_text=high_text)
    _qtrain.write_tokens(str(path), ids, vocab_size)


def tokenize(texts, tokenizer: "str | Tokenizer", out: "str | None" = None, vocab_size: "int | None" = None,
             eos: "str | None" = "auto", bos: "str | None" = "auto", chat: bool = False,
             chat_template: "str | None" = None, train_on: str = "assistant", end_of_turn: "list[str] | None" = None,
             max_tokens: int = 0, chat_template_kwargs: "dict | None" = None):
    """Token ids of `texts` (a string, or a list of documents) with a tokenizer.json / tiktoken file or
    a loaded Tokenizer, as `tokenize --bos --eos` writes them: the `bos` token before each document
    ("auto": the one the tokenizer's post-processor adds, Llama 3's <|begin_of_text|>; Qwen's adds none)
    and the `eos` token after it ("auto": <|endoftext|>, else Llama 3's <|end_of_text|>); None: nothing.
    With `out`, also writes them as a BIN.TOK file (`vocab_size`: the model's, default the tokenizer's).
    Returns a 1-D int32 numpy array.

    chat=True, as `tokenize --chat`: `texts` are chat records (dicts or JSON strings: `messages`, or
    `prompt`/`completion`), rendered with the tokenizer directory's chat template (or the file
    `chat_template`) exactly as transformers' apply_chat_template(..., tokenize=True); `train_on`,
    `end_of_turn`, `max_tokens` and `chat_template_kwargs` (e.g. {"enable_thinking": False}) as the flags. Returns (tokens int32, mask uint8, document_starts int64,
    stats dict); `out` gets a file with masks and document starts. bos/eos do not apply (the template's)."""
    import numpy as np

    tok = tokenizer if isinstance(tokenizer, Tokenizer) else Tokenizer.load(str(tokenizer))
    if chat:
        from .chat import tokenize_chat

        tokens, mask, starts, stats = tokenize_chat(texts, tok, str(tokenizer) if not isinstance(tokenizer, Tokenizer)
                                                    else tok.source, chat_template, train_on, end_of_turn, max_tokens,
                                                    chat_template_kwargs)
        if out is not None:
            _qtrain.write_token_file(str(out), tokens, int(vocab_size or tok.vocab_size), mask, starts.tolist())
        return tokens, mask, starts, stats

    def token(name: str, value: "str | None", auto: "str | None") -> "int | None":
        if value == "auto":
            value = auto
            if value is None:
                return None
        if value is None:
            return None
        token_id = tok.token_id(value)
        if token_id is None:
            raise ValueError(f"{name}: {value!r} is not a token of this tokenizer (give {name}=None to add nothing)")
        return token_id

    bos_id = tok.bos_id if bos == "auto" else token("bos", bos, None)
    if eos == "auto" and tok.end_of_text is None:
        raise ValueError("eos='auto': the tokenizer has neither <|endoftext|> nor <|end_of_text|> "
                         "(give eos=TOKEN, or eos=None to append nothing)")
    eos_id = token("eos", eos, tok.end_of_text)
    ids: list = []
    for doc in [texts] if isinstance(texts, str) else texts:
        if bos_id is not None:
            ids.append(bos_id)
        ids.extend(tok.encode(doc))
        if eos_id is not None:
            ids.append(eos_id)
    arr = np.asarray(ids, dtype=np.int32)
    if out is not None:
        write_tokens(str(out), arr, int(vocab_size or tok.vocab_size))
    return arr
