#!/usr/bin/env python3
"""Throughput of HF `tokenizers` on a text file, to compare with build/tokenize.

    bible -f 'gen1:1-rev22:21' > /tmp/kjv.txt
    RAYON_NUM_THREADS=2 python3 scripts/tokenizer_bench_hf.py --tokenizer TOKENIZER.json /tmp/kjv.txt
    build/tokenize --tokenizer=TOKENIZER.json --input=/tmp/kjv.txt --out-dir=/tmp/kjv --threads=2

encode_batch parallelizes over the batch only, so the file is cut into pieces first (at line ends,
about --chunk-bytes each; lines: --chunk-bytes=0), which, like build/tokenize's own cuts, gives the
ids of the whole file. With --check DIR/train.bin it also checks that file equals HF's ids of the
whole text plus <|endoftext|>.
"""
import argparse
import os
import struct
import sys
import time

from tokenizers import Tokenizer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--chunk-bytes", type=int, default=1 << 20)
    ap.add_argument("--repeat", type=int, default=3, help="best of N runs")
    ap.add_argument("--check", help="a train.bin written by build/tokenize from the same file")
    ap.add_argument("file")
    args = ap.parse_args()

    tok = Tokenizer.from_file(args.tokenizer)
    tok.encode_special_tokens = True
    with open(args.file, "rb") as f:
        data = f.read()
    text = data.decode("utf-8", errors="replace")
    lines = text.splitlines(keepends=True)
    pieces, cur, size = [], [], 0
    for line in lines:
        # cut only before a line that starts with a letter: the Qwen2 pre-tokenizer never joins a
        # newline run with a following letter, so the pieces' ids concatenate to the whole text's
        # (cutting inside a blank line would turn one "\n\n" token into two "\n" tokens)
        if size >= args.chunk_bytes and line[:1].isalpha():
            pieces.append("".join(cur))
            cur, size = [], 0
        cur.append(line)
        size += len(line)
    if cur:
        pieces.append("".join(cur))

    best = None
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        out = tok.encode_batch(pieces, add_special_tokens=False)
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    ntok = sum(len(e.ids) for e in out)
    threads = os.environ.get("RAYON_NUM_THREADS", "all")
    print(f"HF tokenizers encode_batch: {len(pieces)} pieces, {len(data) / 1e6:.2f} MB, {ntok} tokens "
          f"in {best:.3f} s: {len(data) / 1e6 / best:.2f} MB/s ({threads} threads, best of {args.repeat})")

    if args.check:
        # reference: the whole text in one encode (not the pieces), plus the document's EOS
        ids = tok.encode(text, add_special_tokens=False).ids + [tok.token_to_id("<|endoftext|>")]
        with open(args.check, "rb") as f:
            header = f.read(1024)
            n = struct.unpack("<i", header[16:20])[0]
            got = list(struct.unpack(f"<{n}i", f.read(4 * n)))
        if got != ids:
            sys.exit(f"MISMATCH: {args.check} has {len(got)} tokens, HF gives {len(ids)}")
        print(f"{args.check}: identical to HF ({n} tokens)")


if __name__ == "__main__":
    main()
