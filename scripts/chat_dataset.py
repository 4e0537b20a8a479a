"""Turns two real dialog corpora that PyPI wheels ship into chat JSON Lines ({"id", "messages"}).

Called by scripts/chat_dataset.sh (which downloads the pinned wheels and checks their sha256):
    python3 scripts/chat_dataset.py CHITCHAT_WHEEL CHATTERBOT_WHEEL OUT_DIR
Writes OUT_DIR/train.jsonl and OUT_DIR/eval.jsonl and prints what it kept and dropped.

Sources (no instruction/assistant data set ships in a PyPI, npm or Debian package with a licence
that allows it; these are the real conversation corpora that do):
  chitchat-dataset 0.9.0 (MIT, BYU PCC lab's Chit-Chat Challenge, 2018): 7,168 English
    conversations between two people; chitchat_dataset/dataset.json maps a UUID to
    {"prompt", "messages": [[{"text", "sender", ...}, ...], ...]}, one inner list per turn (the
    messages one person sent in a row).
  chatterbot-corpus 1.3.3 (BSD-3-Clause): hand-written exchanges in 28 languages;
    chatterbot_corpus/data/LANG/TOPIC.yml holds "conversations": a list of statement lists in which
    the speakers alternate.

Rules (deterministic; the input order is the order in the pinned files):
  chitchat: the person who writes first is "user", the other "assistant" (the assistant answers);
    the messages of one turn are joined with "\n"; the conversation starter both people were shown
    ("prompt") becomes a system message "Casual chat between two strangers. Conversation starter:
    PROMPT" (none where the record has no prompt); a trailing user turn is dropped, so every
    conversation ends with the assistant; conversations with one participant only are dropped.
  chatterbot: statements alternate user, assistant, user, ...; a trailing user statement is
    dropped; exchanges shorter than one user + one assistant statement and exact repeats (same
    language, same statements) are dropped. No system message.
  Both: text is stripped of surrounding whitespace; a conversation with an empty message is dropped.
  Split: chitchat records first, then chatterbot (files in sorted path order); every 20th record
    (index % 20 == 19) goes to eval.jsonl, the rest to train.jsonl.
"""
import collections
import json
import os
import sys
import zipfile

import yaml  # PyYAML: chatterbot-corpus is YAML; chat_dataset.sh runs this with a pinned PyYAML

CHITCHAT_MEMBER = "chitchat_dataset/dataset.json"
CHATTERBOT_PREFIX = "chatterbot_corpus/data/"
EVAL_EVERY = 20


def alternate(texts):
    """Roles for alternating speakers, the first being the user; ends on an assistant turn."""
    if len(texts) % 2 == 1:
        texts = texts[:-1]
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(texts)]


def chitchat_records(wheel, dropped):
    data = json.loads(zipfile.ZipFile(wheel).read(CHITCHAT_MEMBER))
    for uuid, conv in data.items():
        turns = ["\n".join(m["text"].strip() for m in turn if m["text"].strip()) for turn in conv["messages"]]
        if len(turns) < 2:
            dropped["chitchat: one participant only"] += 1
            continue
        if any(not t for t in turns):
            dropped["chitchat: empty turn"] += 1
            continue
        messages = alternate(turns)
        prompt = (conv.get("prompt") or "").strip()
        if prompt:
            content = f"Casual chat between two strangers. Conversation starter: {prompt}"
            messages.insert(0, {"role": "system", "content": content})
        yield {"id": f"chitchat/{uuid}", "messages": messages}


def chatterbot_records(wheel, dropped):
    archive = zipfile.ZipFile(wheel)
    names = sorted(n for n in archive.namelist() if n.startswith(CHATTERBOT_PREFIX) and n.endswith(".yml"))
    seen = set()
    for name in names:
        lang, topic = name[len(CHATTERBOT_PREFIX):-len(".yml")].split("/", 1)
        # BaseLoader keeps every scalar a string ("yes", "42" stay text, not True or 42).
        doc = yaml.load(archive.read(name).decode("utf-8"), Loader=yaml.BaseLoader)
        for n, statements in enumerate(doc.get("conversations") or []):
            if not isinstance(statements, list) or not all(isinstance(s, str) for s in statements):
                dropped["chatterbot: not a list of statements"] += 1
                continue
            texts = [s.strip() for s in statements]
            if len(texts) < 2:
                dropped["chatterbot: fewer than 2 statements"] += 1
                continue
            if any(not t for t in texts):
                dropped["chatterbot: empty statement"] += 1
                continue
            key = (lang, tuple(texts))
            if key in seen:
                dropped["chatterbot: exact repeat"] += 1
                continue
            seen.add(key)
            yield {"id": f"chatterbot/{lang}/{topic}/{n}", "messages": alternate(texts)}


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: chat_dataset.py CHITCHAT_WHEEL CHATTERBOT_WHEEL OUT_DIR")
    chitchat_wheel, chatterbot_wheel, out_dir = sys.argv[1:]
    dropped = collections.Counter()
    records = list(chitchat_records(chitchat_wheel, dropped)) + list(chatterbot_records(chatterbot_wheel, dropped))
    counts = collections.Counter()
    splits = {"train": [], "eval": []}
    for i, record in enumerate(records):
        split = "eval" if i % EVAL_EVERY == EVAL_EVERY - 1 else "train"
        splits[split].append(record)
        counts[split, record["id"].split("/")[0]] += 1
        counts[split, "messages"] += len(record["messages"])
    paths = {split: os.path.join(out_dir, f"{split}.jsonl") for split in splits}
    for split, path in paths.items():
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            for record in splits[split]:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
        os.replace(path + ".tmp", path)
    for split, path in paths.items():
        n = counts[split, "chitchat"] + counts[split, "chatterbot"]
        print(f"wrote {path}: {n} conversations ({counts[split, 'chitchat']} chitchat, "
              f"{counts[split, 'chatterbot']} chatterbot), {counts[split, 'messages']} messages")
    languages = collections.Counter(r["id"].split("/")[1] for r in records if r["id"].startswith("chatterbot/"))
    print(f"chatterbot languages ({len(languages)}): " + ", ".join(f"{k} {v}" for k, v in languages.most_common()))
    for reason, n in sorted(dropped.items()):
        print(f"dropped {n}: {reason}")


if __name__ == "__main__":
    main()
