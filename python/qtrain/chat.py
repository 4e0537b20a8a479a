"""Chat conversations -> token ids, loss masks and document starts: the Python side of `tokenize --chat`.

The same renderer (chat_template.py, jinja2 configured as transformers configures it) and the same C++
tokenizer with byte offsets as the command line, so both give the same files; the trained-token rule is
chat_template.py's (and the README's).
"""

from __future__ import annotations

import json
import os
from typing import Iterable

from .chat_template import ChatRenderer, RecordError, special_tokens_of

END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>")


def _tokenizer_config(tokenizer_file: str) -> tuple[dict, str]:
    directory = tokenizer_file if os.path.isdir(tokenizer_file) else os.path.dirname(tokenizer_file)
    path = os.path.join(directory, "tokenizer_config.json")
    config = json.load(open(path, encoding="utf-8")) if os.path.exists(path) else {}
    return config, directory


def load_chat_template(tokenizer_file: str, chat_template: "str | None" = None) -> tuple[str, dict]:
    """(template source, special tokens) as `tokenize --chat` finds them: `chat_template` (a file), else
    chat_template.jinja beside the tokenizer, else tokenizer_config.json's chat_template ("default" of a list)."""
    config, directory = _tokenizer_config(tokenizer_file)
    special = special_tokens_of(config)
    if chat_template is not None:
        return open(chat_template, encoding="utf-8").read(), special
    jinja = os.path.join(directory, "chat_template.jinja")
    if os.path.exists(jinja):
        return open(jinja, encoding="utf-8").read(), special
    t = config.get("chat_template")
    if isinstance(t, list):
        t = next((x.get("template") for x in t if isinstance(x, dict) and x.get("name") == "default"), None)
    if not isinstance(t, str):
        raise ValueError(f"no chat template: neither {jinja} nor a chat_template in "
                         f"{os.path.join(directory, 'tokenizer_config.json')}; pass chat_template=FILE")
    return t, special


def tokenize_chat(records: Iterable, tok, tokenizer_file: str, chat_template: "str | None" = None,
                  train_on: str = "assistant", end_of_turn: "list[str] | None" = None, max_tokens: int = 0,
                  template_kwargs: "dict | None" = None):
    """(tokens int32, mask uint8, document_starts int64, stats) of chat records (dicts, or JSON strings).
    Records without an assistant message, or whose trained tokens all lie beyond max_tokens, are skipped
    and counted in stats; a bad record raises ValueError naming its index and what is wrong."""
    import numpy as np

    template, special = load_chat_template(tokenizer_file, chat_template)
    if end_of_turn is None:
        end_of_turn = [special["eos_token"]] if special.get("eos_token") else []
        end_of_turn += [t for t in END_OF_TURN if tok.token_id(t) is not None and t not in end_of_turn]
    renderer = ChatRenderer(template, special, end_of_turn, train_on, template_kwargs)
    tokens, masks, starts = [], [], []
    stats = {"conversations": 0, "skipped_no_assistant": 0, "skipped_cut": 0, "truncated": 0, "tokens": 0, "trained": 0}
    n = 0
    fmt = None
    for k, record in enumerate(records):
        try:
            answer = renderer.record(json.loads(record) if isinstance(record, str) else record)
        except RecordError as e:
            raise ValueError(f"record {k}: {e}") from None
        if fmt is None:
            fmt = answer["format"]
        elif answer["format"] != fmt:
            raise ValueError(f"record {k}: a {answer['format']} record among {fmt} records; one call takes one format")
        if "skip" in answer:  # no assistant message, or generation blocks that emit nothing
            stats["skipped_no_assistant" if answer["skip"] == "no assistant message" else "skipped_cut"] += 1
            continue
        ids, offsets = tok.encode_with_offsets(answer["text"])
        ids = np.asarray(ids, dtype=np.int32)
        offsets = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
        mask = np.zeros(len(ids), dtype=np.uint8)
        for begin, end in answer["spans"]:  # a token is trained iff it overlaps a trained span
            mask[(offsets[:, 0] < end) & (offsets[:, 1] > begin)] = 1
        cut = bool(max_tokens) and len(ids) > max_tokens
        if cut:
            ids, mask = ids[:max_tokens], mask[:max_tokens]
        if not mask.any():  # nothing left to train on
            stats["skipped_cut"] += 1
            continue
        stats["truncated"] += int(cut)
        starts.append(n)
        tokens.append(ids)
        masks.append(mask)
        n += len(ids)
        stats["conversations"] += 1
        stats["tokens"] += len(ids)
        stats["trained"] += int(mask.sum())
    cat = (lambda xs, t: np.concatenate(xs) if xs else np.zeros(0, dtype=t))
    return cat(tokens, np.int32), cat(masks, np.uint8), np.asarray(starts, dtype=np.int64), stats
