"""qtrain's `tokenize --chat` against transformers, on random conversations (issue 31).

For each template family (Qwen2.5, Qwen3, Llama 3.1, Llama 3.2) it generates --n random conversations
(system prompt or not, multi-turn, tool calls with tool results and a `tools` list, non-ASCII text with
combining characters and emoji, whitespace edge cases), runs qtrain's `tokenize --chat` on them and checks:
  - ids == transformers' apply_chat_template(messages, tools=tools, tokenize=True);
  - masks == the trained-token rule (README) computed here independently: transformers' own renders,
    the spans from render(messages[:i], add_generation_prompt=True) to the first end-of-turn token, and
    the `tokenizers` offsets (a token is trained iff it overlaps a span);
  - with a copy of the template that has {% generation %} blocks around the assistant output: masks ==
    transformers' return_assistant_tokens_mask=True;
  - records without an assistant message are skipped and counted; a conversation the template renders
    differently as a prefix (Qwen3's reasoning before a later user turn) is refused, naming file and line.
Needs no torch:
  uv run --no-project --with transformers --with jinja2 --with tokenizers python3 tests/reference/compare_chat.py
(scripts/chat_templates_fetch.sh and scripts/tokenizer_fetch_llama3.sh put the templates and the Llama
tokenizer into build/tokenizer-reference first.)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import struct
import subprocess
import sys
import tempfile

WORDS = ["hello", "world", "the", "model", "answer", "Qwen", "Llama", "data", "x", "42", "3.14", "foo_bar", "if",
         "naïve", "café", "über", "Straße", "中文", "日本語", "Русский", "עברית", "العربية", "ελληνικά",
         "e\u0301", "a\u0308", "o\u0302\u0323", "\u0301", "\u0308x", "n\u0303o", "👋", "👋🏽", "👨‍👩‍👧", "🇩🇪",
         "😀😀", "<b>", "{\"k\": 1}", "don't", "it's", "...", "!?", "$", "€", "ℌ", "ﬁ", "Å", "Ω", "<tool_call>"]
SPACES = [" ", " ", " ", "  ", "\n", "\n\n", "\t", " \n", "   ", "\r\n", "\u00a0", "\u3000"]


def text(rng: random.Random, lo=0, hi=12) -> str:
    parts = []
    for _ in range(rng.randint(lo, hi)):
        parts.append(rng.choice(WORDS))
        parts.append(rng.choice(SPACES))
    s = "".join(parts)
    if rng.random() < 0.3:
        s = s.strip()
    if rng.random() < 0.1:
        s = rng.choice(SPACES) + s
    return s


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "description": "Adds numbers",
                                      "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                                                      "b": {"type": "number"}}}}},
]


def conversation(rng: random.Random, family: str) -> dict:
    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": text(rng, 1)})
    use_tools = rng.random() < 0.35
    for _ in range(rng.randint(1, 4)):
        msgs.append({"role": "user", "content": text(rng, 1)})
        if use_tools and rng.random() < 0.6:
            n = 1 if family.startswith("llama") else rng.randint(1, 2)
            calls = []
            for _ in range(n):
                tool = rng.choice(TOOLS)["function"]["name"]
                args = {"city": text(rng, 1, 3)} if tool == "get_weather" else {"a": rng.randint(-9, 99), "b": 0.5}
                calls.append({"type": "function", "function": {"name": tool, "arguments": args}})
            m = {"role": "assistant", "content": text(rng, 0, 3) if rng.random() < 0.5 else "", "tool_calls": calls}
            if family == "qwen3" and rng.random() < 0.3:
                m["reasoning_content"] = text(rng, 1, 4)
            msgs.append(m)
            for _ in calls:
                msgs.append({"role": "tool", "content": text(rng, 1, 5)})
        m = {"role": "assistant", "content": text(rng, 0 if rng.random() < 0.05 else 1)}
        if family == "qwen3" and rng.random() < 0.2:
            m["reasoning_content"] = text(rng, 1, 4)
        msgs.append(m)
    record = {"messages": msgs}
    if use_tools:
        record["tools"] = TOOLS
    if family == "qwen3" and rng.random() < 0.3:  # template variables: Qwen3 without thinking
        record["chat_template_kwargs"] = {"enable_thinking": False}
    return record


def end_of_turn(tok) -> list[str]:
    out = [tok.eos_token] if tok.eos_token else []
    added = {t.content for t in tok.added_tokens_decoder.values()}
    out += [t for t in ("<|im_end|>", "<|eot_id|>", "<|eom_id|>") if t in added and t not in out]
    return out


def expected(tok, template, record, eot):
    """(ids, mask) by the README's rule, from transformers' renders and `tokenizers` offsets; None when the
    template is not prefix-stable for this record."""
    msgs, tools = record["messages"], record.get("tools")
    kw = dict(tools=tools, chat_template=template, **record.get("chat_template_kwargs", {}))
    ids = tok.apply_chat_template(msgs, tokenize=True, return_dict=True, **kw)["input_ids"]
    full = tok.apply_chat_template(msgs, tokenize=False, **kw)
    spans = []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        prefix = tok.apply_chat_template(msgs[:i], tokenize=False, add_generation_prompt=True, **kw)
        if not full.startswith(prefix):
            return None
        start = len(prefix)
        ends = [full.find(t, start) + len(t) for t in eot if full.find(t, start) >= 0]
        spans.append((start, min(ends) if ends else len(full)))
    enc = tok(full, add_special_tokens=False, return_offsets_mapping=True)
    assert enc["input_ids"] == ids, "transformers: tokenizing the render differs from tokenize=True"
    mask = [int(any(b < se and sb < e for sb, se in spans)) for b, e in enc["offset_mapping"]]
    return ids, mask


def expected_generation(tok, template, record):
    out = tok.apply_chat_template(record["messages"], tools=record.get("tools"), chat_template=template,
                                  tokenize=True, return_dict=True, return_assistant_tokens_mask=True,
                                  **record.get("chat_template_kwargs", {}))
    return out["input_ids"], list(out["assistant_masks"])


def with_generation_blocks(template: str, family: str) -> str:
    """A copy of the template with {% generation %} around each assistant message's output."""
    t = template
    # assistant branches of their own: wrap the whole body (up to the next branch)
    heads = {"qwen2.5": '{%- elif message.role == "assistant" %}', "qwen3": '{%- elif message.role == "assistant" %}',
             "llama3.1": "{%- elif 'tool_calls' in message %}", "llama3.2": "{%- elif 'tool_calls' in message %}"}
    head = heads[family]
    a = t.index(head) + len(head)
    b = t.index("{%- elif", a)
    t = t[:a] + "{%- generation %}" + t[a:b] + "{%- endgeneration %}\n    " + t[b:]
    # assistant messages sharing the user's branch: their emit line, under a generation block
    shared = {"qwen2.5": "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}",
              "llama3.1": "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}",
              "llama3.2": "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}"}
    if family in shared:
        line = shared[family]
        assert t.count(line) == 1, f"{family}: the shared emit line is not in the template once"
        t = t.replace(line, "{%- if message['role'] == 'assistant' %}{%- generation %}" + line
                      + "{%- endgeneration %}{%- else %}" + line + "{%- endif %}")
    assert re.search(r"\{\%-?\s*generation\s*-?\%\}", t)
    return t


def read_token_file(path):
    data = open(path, "rb").read()
    h = struct.unpack("<256i", data[:1024])
    n = h[4]
    tokens = list(struct.unpack(f"<{n}i", data[1024:1024 + 4 * n]))
    mbytes = (n + 7) // 8
    off = 1024 + 4 * n
    masks = [(data[off + (i >> 3)] >> (i & 7)) & 1 for i in range(n)] if h[6] else None
    off += mbytes if h[6] else 0
    starts = [(data[off + (i >> 3)] >> (i & 7)) & 1 for i in range(n)] if h[7] else None
    docs, cur = [], None
    for i in range(n):
        if starts[i]:
            cur = ([], [])
            docs.append(cur)
        cur[0].append(tokens[i])
        cur[1].append(masks[i])
    return docs


def run_qtrain(exe, tokdir, jsonl, out, extra=()):
    cmd = [exe, "--chat", f"--tokenizer={tokdir}", f"--input={jsonl}", f"--out-dir={out}", "--no-progress",
           "--threads=2", *extra]
    return subprocess.run(cmd, capture_output=True, text=True)


def check_family(args, family, tokdir, template, rng, tmp):
    from transformers import AutoTokenizer

    # the tokenizer directory both sides load, with this template in its tokenizer_config.json
    d = os.path.join(tmp, family)
    os.makedirs(d, exist_ok=True)
    cfg = json.load(open(os.path.join(tokdir, "tokenizer_config.json"), encoding="utf-8"))
    cfg["chat_template"] = template
    json.dump(cfg, open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8"))
    with open(os.path.join(tokdir, "tokenizer.json"), "rb") as f, open(os.path.join(d, "tokenizer.json"), "wb") as g:
        g.write(f.read())
    tok = AutoTokenizer.from_pretrained(d)
    eot = end_of_turn(tok)

    records, want, unstable, no_assistant = [], [], [], 0
    while len(want) < args.n:
        r = conversation(rng, family)
        if rng.random() < 0.02:
            r["messages"] = [m for m in r["messages"] if m["role"] == "user"]
            records.append(r)
            no_assistant += 1
            continue
        e = expected(tok, template, r, eot)
        if e is None:
            unstable.append(r)
            continue
        records.append(r)
        want.append((r, e))
    path = os.path.join(tmp, f"{family}.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=rng.random() < 0.5) + "\n")
    out = os.path.join(tmp, f"{family}-out")
    p = run_qtrain(args.tokenize, d, path, out)
    assert p.returncode == 0, f"{family}: tokenize failed:\n{p.stderr}"
    docs = read_token_file(os.path.join(out, "train.bin"))
    assert len(docs) == len(want), f"{family}: {len(docs)} conversations written, {len(want)} expected"
    assert f"skipped: {no_assistant} without an assistant message" in p.stdout, p.stdout
    bad_ids = bad_masks = 0
    for k, ((r, (ids, mask)), (got_ids, got_mask)) in enumerate(zip(want, docs)):
        if got_ids != ids:
            bad_ids += 1
            if bad_ids <= 3:
                print(f"  {family} #{k}: ids differ\n    record {json.dumps(r)[:300]}\n    hf    {ids[:60]}\n    qtrain {got_ids[:60]}")
        elif got_mask != mask:
            bad_masks += 1
            if bad_masks <= 3:
                diff = [i for i in range(len(mask)) if mask[i] != got_mask[i]]
                print(f"  {family} #{k}: masks differ at {diff[:10]}: tokens {[tok.decode([ids[i]]) for i in diff[:5]]}")
    trained = sum(sum(m) for _, (_, m) in want)
    total = sum(len(i) for _, (i, _) in want)
    print(f"{family}: {len(want)} conversations ({sum('tools' in r for r, _ in want)} with tools, "
          f"{sum('chat_template_kwargs' in r for r, _ in want)} with chat_template_kwargs, "
          f"{no_assistant} without an assistant turn skipped): ids differ in {bad_ids}, masks differ in {bad_masks}; "
          f"{total} tokens, {trained} trained")
    ok = bad_ids == 0 and bad_masks == 0

    if unstable:
        bad = os.path.join(tmp, f"{family}-unstable.jsonl")
        with open(bad, "w", encoding="utf-8") as f:
            f.write(json.dumps(want[0][0]) + "\n" + json.dumps(unstable[0]) + "\n")
        p = run_qtrain(args.tokenize, d, bad, out + "-unstable")
        refused = p.returncode != 0 and f"{bad}:2:" in p.stderr and "not prefix-stable" in p.stderr
        print(f"{family}: {len(unstable)} generated conversations are not prefix-stable; qtrain refuses one "
              f"naming file:line: {refused}")
        ok &= refused

    # prompt/completion records: a user and an assistant message
    pairs = [{"prompt": text(rng, 1), "completion": text(rng, 1)} for _ in range(max(10, args.n // 10))]
    ppath = os.path.join(tmp, f"{family}-pc.jsonl")
    with open(ppath, "w", encoding="utf-8") as f:
        for r in pairs:
            f.write(json.dumps(r) + "\n")
    p = run_qtrain(args.tokenize, d, ppath, out + "-pc")
    assert p.returncode == 0, f"{family} prompt/completion: tokenize failed:\n{p.stderr}"
    got = read_token_file(os.path.join(out + "-pc", "train.bin"))
    pwant = [expected(tok, template, {"messages": [{"role": "user", "content": r["prompt"]},
                                                   {"role": "assistant", "content": r["completion"]}]}, eot) for r in pairs]
    pbad = sum(1 for w, g in zip(pwant, got) if w is None or list(w) != list(g)) + abs(len(got) - len(pwant))
    print(f"{family} prompt/completion: {len(pairs)} records, differ in {pbad}")
    ok &= pbad == 0

    # {% generation %} blocks: against transformers' return_assistant_tokens_mask directly
    gen_template = with_generation_blocks(template, family)
    gen_file = os.path.join(tmp, f"{family}-generation.jinja")
    open(gen_file, "w", encoding="utf-8").write(gen_template)
    # the prefix-unstable conversations too: generation blocks need no prefix rule
    gen_records = [r for r in records if any(m["role"] == "assistant" for m in r["messages"])] + unstable
    gen_want = [expected_generation(tok, gen_template, r) for r in gen_records]
    gpath = os.path.join(tmp, f"{family}-gen.jsonl")
    with open(gpath, "w", encoding="utf-8") as f:
        for r in gen_records:
            f.write(json.dumps(r) + "\n")
    p = run_qtrain(args.tokenize, d, gpath, out + "-gen", [f"--chat-template={gen_file}"])
    assert p.returncode == 0, f"{family} generation: tokenize failed:\n{p.stderr}"
    got = read_token_file(os.path.join(out + "-gen", "train.bin"))
    keep = [w for w in gen_want if sum(w[1]) > 0]
    assert len(got) == len(keep), f"{family} generation: {len(got)} written, {len(keep)} expected"
    gbad = sum(1 for (ids, mask), (gi, gm) in zip(keep, got) if ids != gi or mask != gm)
    print(f"{family} with {{% generation %}} blocks: {len(keep)} conversations, differ from "
          f"return_assistant_tokens_mask in {gbad}")
    return ok and gbad == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenize", default="build/tokenize")
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=None, help="default: a fresh one (printed)")
    ap.add_argument("--ref", default="build/tokenizer-reference")
    ap.add_argument("--qwen", default=None, help="Qwen2.5 tokenizer dir (default: shared/data/qwen2.5-tokenizer)")
    ap.add_argument("--families", default="qwen2.5,qwen3,llama3.1,llama3.2")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    import jinja2
    import tokenizers
    import transformers

    print(f"seed {seed}; transformers {transformers.__version__}, tokenizers {tokenizers.__version__}, "
          f"jinja2 {jinja2.__version__}")
    rng = random.Random(seed)
    qwen = args.qwen or next((p for p in ("../shared/data/qwen2.5-tokenizer", "/work/shared/data/qwen2.5-tokenizer")
                              if os.path.isdir(p)), None)
    tpl = os.path.join(args.ref, "chat-templates")
    families = {
        "qwen2.5": (qwen, lambda: json.load(open(os.path.join(qwen, "tokenizer_config.json")))["chat_template"]),
        "qwen3": (os.path.join(tpl, "qwen3-tokenizer"), lambda: open(os.path.join(tpl, "qwen3.jinja")).read()),
        "llama3.1": (os.path.join(args.ref, "llama3.2"), lambda: open(os.path.join(tpl, "llama3.1.jinja")).read()),
        "llama3.2": (os.path.join(args.ref, "llama3.2"), lambda: open(os.path.join(tpl, "llama3.2.jinja")).read()),
    }
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.families.split(","):
            tokdir, template = families[family]
            ok &= check_family(args, family, tokdir, template(), rng, tmp)
    print("compare_chat: " + ("all equal" if ok else "DIFFERENCES"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
