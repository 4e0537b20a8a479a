"""Prints how long the conversations of chat JSON Lines files are in a model's tokens, as its chat
template renders them: min, median, p90, p99, max and total per file and over all files, plus a
histogram. The figures describe the data for packing benchmarks (docs/benchmarks.md).

    uv run --no-project --with tokenizers==0.23.3 --with jinja2==3.1.6 \
        python3 scripts/chat_lengths.py TOKENIZER_DIR FILE.jsonl...

TOKENIZER_DIR holds tokenizer.json and tokenizer_config.json (its "chat_template"). The template
is rendered with jinja2 as transformers renders it (sandboxed, trim_blocks, lstrip_blocks), with
no generation prompt; a record is the text of its whole conversation, the template's default
system prompt included where the record has none. The count is rough only in that it ignores
whatever a trainer adds around a document (BOS, EOS): a few tokens. Records whose "id" reads
SOURCE/... (as scripts/chat_dataset.py writes them) are also summed per SOURCE over all files.
"""
import collections
import json
import os
import sys

import jinja2.sandbox
from tokenizers import Tokenizer


def percentile(sorted_values, p):
    """Nearest-rank percentile: the smallest value with at least p% of the values at or below it."""
    rank = max(1, -(-len(sorted_values) * p // 100))
    return sorted_values[rank - 1]


def describe(name, lengths):
    lengths = sorted(lengths)
    print(f"{name}: {len(lengths)} conversations, min {lengths[0]}, median {percentile(lengths, 50)}, "
          f"p90 {percentile(lengths, 90)}, p99 {percentile(lengths, 99)}, max {lengths[-1]}, "
          f"total {sum(lengths)} tokens")


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: chat_lengths.py TOKENIZER_DIR FILE.jsonl...")
    tokenizer_dir, files = sys.argv[1], sys.argv[2:]
    tokenizer = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))
    with open(os.path.join(tokenizer_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        source = json.load(f)["chat_template"]
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    template = env.from_string(source)
    everything = []
    by_source = collections.defaultdict(list)
    for path in files:
        with open(path, encoding="utf-8") as f:
            records = [json.loads(line) for line in f]
        texts = [template.render(messages=r["messages"], add_generation_prompt=False) for r in records]
        lengths = [len(e.ids) for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
        describe(path, lengths)
        everything += lengths
        for record, n in zip(records, lengths):
            if "/" in str(record.get("id", "")):
                by_source[record["id"].split("/")[0]].append(n)
    if len(files) > 1:
        describe("all", everything)
    if len(by_source) > 1:
        for source, lengths in sorted(by_source.items()):
            describe(f"  {source}", lengths)
    edges = [64, 128, 256, 512, 1024, 2048, 4096, 8192]
    lower = 0
    for edge in edges + [None]:
        n = sum(1 for x in everything if x > lower and (edge is None or x <= edge))
        label = f"{lower + 1}-{edge}" if edge else f">{lower}"
        print(f"  {label:>11} tokens: {n:6d} ({100 * n / len(everything):5.1f}%)")
        lower = edge


if __name__ == "__main__":
    main()
