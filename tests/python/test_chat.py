"""Chat data from Python (issue 31): qtrain.tokenize(records, chat=True) renders with the same jinja2
renderer and tokenizes with the same C++ tokenizer as `tokenize --chat`, so both write the same file;
masks train exactly the assistant turns through their end-of-turn token. (transformers equality of the
real templates: tests/reference/compare_chat.py.)"""

import base64
import json
import os
import random
import subprocess
import unicodedata
from pathlib import Path

import pytest

import qtrain

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "tests" / "tokenizer" / "data" / "tiny_chat.jinja"
TOKENIZE_EXE = Path(os.environ.get("QTRAIN_TRAIN_EXE", str(REPO / "build" / "train"))).with_name("tokenize")
WORDS = ["hello", "world", " ", "\n", "é", "e\u0301", "中文", "👋", "  ", "42", "<tool_call>"]


def byte_tokenizer(tmp_path: Path) -> Path:
    # every byte a token, then Qwen's added tokens (<|endoftext|>, <|im_start|>, ...)
    path = tmp_path / "t.tiktoken"
    path.write_text("\n".join(f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)) + "\n")
    return path


def records(rng: random.Random, n: int) -> list:
    out = []
    for _ in range(n):
        msgs = [{"role": "system", "content": "".join(rng.choices(WORDS, k=3))}] if rng.random() < 0.5 else []
        for _ in range(rng.randint(1, 3)):
            msgs.append({"role": "user", "content": "".join(rng.choices(WORDS, k=rng.randint(1, 6)))})
            msgs.append({"role": "assistant", "content": "".join(rng.choices(WORDS, k=rng.randint(1, 6)))})
        out.append({"messages": msgs})
    out.append({"messages": [{"role": "user", "content": "no reply"}]})  # skipped, counted
    return out


def test_chat_masks_train_the_assistant_turns(tmp_path: Path):
    rng = random.Random()
    recs = records(rng, 30)
    tok_path = byte_tokenizer(tmp_path)
    tokens, mask, starts, stats = qtrain.tokenize(recs, str(tok_path), chat=True, chat_template=str(TEMPLATE),
                                                  end_of_turn=["<|endoftext|>"])
    assert stats["conversations"] == 30 and stats["skipped_no_assistant"] == 1
    assert len(tokens) == len(mask) == stats["tokens"] and int(mask.sum()) == stats["trained"]
    tok = qtrain.Tokenizer.load(str(tok_path))
    bounds = list(starts) + [len(tokens)]
    for k in range(30):
        ids, m = tokens[bounds[k]:bounds[k + 1]].tolist(), mask[bounds[k]:bounds[k + 1]].tolist()
        # byte tokens: the trained ones spell each assistant content and its <|endoftext|> (NFC, as the
        # tokenizer normalizes: e + U+0301 is trained as one é)
        trained = b"".join(tok.decode([i]).encode() if i >= 256 else bytes([i]) for i, b in zip(ids, m) if b)
        want = "".join(msg["content"] + "<|endoftext|>" for msg in recs[k]["messages"] if msg["role"] == "assistant")
        assert trained.decode() == unicodedata.normalize("NFC", want)


def test_python_and_the_command_line_write_the_same_file(tmp_path: Path):
    if not TOKENIZE_EXE.exists():
        pytest.skip(f"no {TOKENIZE_EXE}")
    recs = records(random.Random(), 50)
    tok_path = byte_tokenizer(tmp_path)
    qtrain.tokenize(recs, str(tok_path), chat=True, chat_template=str(TEMPLATE), end_of_turn=["<|endoftext|>"],
                    max_tokens=40, out=str(tmp_path / "py.bin"))
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    run = subprocess.run([str(TOKENIZE_EXE), "--chat", f"--tokenizer={tok_path}", f"--chat-template={TEMPLATE}",
                          "--end-of-turn=<|endoftext|>", "--max-tokens=40", f"--input={tmp_path / 'c.jsonl'}",
                          f"--out-dir={tmp_path / 'out'}", "--no-progress"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "out" / "train.bin").read_bytes() == (tmp_path / "py.bin").read_bytes()


def test_bad_chat_records_raise(tmp_path: Path):
    tok_path = byte_tokenizer(tmp_path)
    good = {"prompt": "a", "completion": "b"}
    for bad, message in [({"text": "x"}, "record 1: the record has no 'messages'"),
                         ({"messages": [{"role": "robot", "content": "x"}]}, "record 1: messages\\[0\\] has role 'robot'"),
                         ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]},
                          "record 1: a messages record among prompt/completion records")]:
        with pytest.raises(ValueError, match=message):
            qtrain.tokenize([good, bad], str(tok_path), chat=True, chat_template=str(TEMPLATE))
