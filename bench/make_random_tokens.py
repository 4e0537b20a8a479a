#!/usr/bin/env python3
"""Writes a BIN.TOK v2 file of uniformly random tokens (for throughput benchmarks).

usage: python3 bench/make_random_tokens.py OUT.bin --tokens 20000000 --vocab 151643 [--seed 0]
Needs only numpy (present on the GPU machine).
"""
import argparse

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--tokens", type=int, default=20_000_000)
    ap.add_argument("--vocab", type=int, default=151643)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    tokens = rng.integers(0, a.vocab, size=a.tokens, dtype=np.int32)
    header = np.zeros(256, dtype=np.int32)
    header[:2] = np.frombuffer(b"BIN.TOK\n", dtype=np.int32)
    header[2], header[3], header[4], header[5], header[6] = 2, 4, a.tokens, a.vocab, 0
    with open(a.out, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())
    print(f"{a.out}: {a.tokens} random tokens, vocab {a.vocab}")


if __name__ == "__main__":
    main()
