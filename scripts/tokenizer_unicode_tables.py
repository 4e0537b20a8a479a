#!/usr/bin/env python3
"""Generates src/tokenizer/unicode_tables.cpp: the Unicode data the tokenizer needs.

Why the data comes from the reference encoder and not from one Unicode version: qtrain must give
exactly the ids of HF `tokenizers`, and that library mixes versions. Its regex engine (Oniguruma)
classifies \\p{L}, \\p{N} and \\s with Unicode 16.0 data, while its NFC normalizer (the
`unicode-normalization-alignments` crate) has older data: the combining classes of Unicode 9.0 and
the decompositions of Unicode 9.0-12.1 (Python's unicodedata of any version differs). So this script
asks `tokenizers` itself, code point by code point, and uses `unicodedata2` (Unicode 16.0, from
PyPI) only to list candidates and to cross-check (the differences it prints are expected).

Usage (needs `pip install tokenizers==0.23.3 unicodedata2==16.0.0`; takes about ten seconds):
    python3 scripts/tokenizer_unicode_tables.py > src/tokenizer/unicode_tables.cpp
"""
import sys

import tokenizers
import unicodedata2 as ud
from tokenizers import Regex, normalizers, pre_tokenizers

MAX_CP = 0x110000
ALL_CPS = [cp for cp in range(MAX_CP) if not 0xD800 <= cp < 0xE000]
HANGUL_BASE, HANGUL_COUNT = 0xAC00, 11172


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def regex_class(pattern):
    """Code points that the single-character `pattern` matches in HF's regex engine."""
    split = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    found = set()
    for cp in ALL_CPS:
        c = chr(cp)
        # \x01 is none of L, N, \s: the piece equals c only when the pattern matched it.
        if any(piece == c for piece, _ in split.pre_tokenize_str("\x01" + c + "\x01")):
            found.add(cp)
    return found


def main():
    nfd = normalizers.NFD()
    nfc = normalizers.NFC()

    letters, numbers, spaces = regex_class(r"\p{L}"), regex_class(r"\p{N}"), regex_class(r"\s")
    ud_letters = {cp for cp in ALL_CPS if ud.category(chr(cp))[0] == "L"}
    ud_numbers = {cp for cp in ALL_CPS if ud.category(chr(cp))[0] == "N"}
    log(f"\\p{{L}}: {len(letters)} (differs from unicodedata2 {ud.unidata_version} in "
        f"{len(letters ^ ud_letters)}), \\p{{N}}: {len(numbers)} (differs in "
        f"{len(numbers ^ ud_numbers)}), \\s: {len(spaces)}")

    # Full canonical decompositions as the reference computes them (Hangul is algorithmic in C++).
    decomp = {}
    for cp in ALL_CPS:
        if HANGUL_BASE <= cp < HANGUL_BASE + HANGUL_COUNT:
            continue
        d = nfd.normalize_str(chr(cp))
        if d != chr(cp):
            decomp[cp] = [ord(x) for x in d]
    log(f"decompositions: {len(decomp)}")

    # Combining classes: values are stable across Unicode versions, so take them from unicodedata2,
    # but only for marks the reference knows (a mark newer than its tables has class 0 there).
    def swaps(first, second):
        return nfd.normalize_str(first + second) == second + first

    ccc = {}
    for cp in ALL_CPS:
        value = ud.combining(chr(cp))
        if value == 0 or cp in decomp:
            continue
        c = chr(cp)
        known = swaps(c, "\u0334") if value > 1 else swaps("\u0301", c)  # U+0334: 1, U+0301: 230
        if known:
            ccc[cp] = value
    # Cross-check the relative order against one representative per class, both ways round.
    reps = {}
    for cp, value in sorted(ccc.items()):
        reps.setdefault(value, cp)
    for cp, value in ccc.items():
        for rvalue, rep in reps.items():
            if rep != cp and swaps(chr(cp), chr(rep)) != (value > rvalue):
                raise SystemExit(f"combining class order of U+{cp:04X} disagrees with U+{rep:04X}")
    log(f"combining classes: {len(ccc)} nonzero")

    # Primary composites: pairs the reference composes (candidates: two-element canonical
    # decompositions of unicodedata2).
    compose = {}
    for cp in ALL_CPS:
        d = ud.decomposition(chr(cp))
        if not d or d.startswith("<"):
            continue
        parts = [int(x, 16) for x in d.split()]
        if len(parts) == 2 and nfc.normalize_str(chr(parts[0]) + chr(parts[1])) == chr(cp):
            compose[(parts[0], parts[1])] = cp
    second_elements = {b for (_, b) in compose}
    # Hangul V and T jamo are second elements of the algorithmic compositions.
    second_elements |= set(range(0x1161, 0x1176)) | set(range(0x11A8, 0x11C3))
    log(f"compositions: {len(compose)}")

    # An NFC boundary: a character that nothing before it can change and that needs no change
    # itself unless something follows it, so NFC may restart there.
    def boundary(cp):
        c = chr(cp)
        return cp not in ccc and cp not in second_elements and nfc.normalize_str(c) == c

    props = bytearray(MAX_CP)
    for cp in ALL_CPS:
        p = 0
        if cp in letters:
            p |= 1
        if cp in numbers:
            p |= 2
        if cp in spaces:
            p |= 4
        if boundary(cp):
            p |= 8
        props[cp] = p
    for cp in range(0xD800, 0xE000):
        props[cp] = 8  # never reached: decoding replaces surrogates with U+FFFD

    # Two-stage table: stage 1 maps cp >> 8 to a block of 256 property bytes in stage 2.
    blocks, index = [], []
    seen = {}
    for hi in range(MAX_CP >> 8):
        block = bytes(props[hi << 8:(hi + 1) << 8])
        if block not in seen:
            seen[block] = len(blocks)
            blocks.append(block)
        index.append(seen[block])
    log(f"property blocks: {len(blocks)}")

    out = sys.stdout
    out.write("// GENERATED by scripts/tokenizer_unicode_tables.py from tokenizers "
              f"{tokenizers.__version__} and unicodedata2 {ud.unidata_version}. Do not edit.\n")
    out.write("// See that script for why the data is taken from the reference encoder.\n")
    out.write('#include "tokenizer/unicode_tables.h"\n\nnamespace qtrain::unicode {\n\n')
    out.write(f"const uint16_t kPropertyIndex[{len(index)}] = {{\n")
    for i in range(0, len(index), 16):
        out.write("    " + ", ".join(str(x) for x in index[i:i + 16]) + ",\n")
    out.write("};\n\n")
    out.write(f"const uint8_t kPropertyBlocks[{len(blocks) * 256}] = {{\n")
    for block in blocks:
        for i in range(0, 256, 32):
            out.write("    " + ",".join(str(x) for x in block[i:i + 32]) + ",\n")
    out.write("};\n\n")

    out.write(f"const CombiningClass kCombiningClasses[{len(ccc)}] = {{\n")
    items = sorted(ccc.items())
    for i in range(0, len(items), 6):
        out.write("    " + " ".join(f"{{0x{cp:X}, {v}}}," for cp, v in items[i:i + 6]) + "\n")
    out.write("};\n")
    out.write(f"const int kNumCombiningClasses = {len(ccc)};\n\n")

    pool = []
    entries = []
    for cp, seq in sorted(decomp.items()):
        entries.append((cp, len(pool), len(seq)))
        pool.extend(seq)
    out.write(f"const char32_t kDecompositionPool[{len(pool)}] = {{\n")
    for i in range(0, len(pool), 12):
        out.write("    " + ", ".join(f"0x{x:X}" for x in pool[i:i + 12]) + ",\n")
    out.write("};\n")
    out.write(f"const Decomposition kDecompositions[{len(entries)}] = {{\n")
    for i in range(0, len(entries), 4):
        out.write("    " + " ".join(f"{{0x{cp:X}, {off}, {n}}}," for cp, off, n in entries[i:i + 4])
                  + "\n")
    out.write("};\n")
    out.write(f"const int kNumDecompositions = {len(entries)};\n\n")

    pairs = sorted(compose.items())
    out.write(f"const Composition kCompositions[{len(pairs)}] = {{\n")
    for i in range(0, len(pairs), 4):
        out.write("    " + " ".join(f"{{0x{a:X}, 0x{b:X}, 0x{c:X}}}," for (a, b), c in pairs[i:i + 4])
                  + "\n")
    out.write("};\n")
    out.write(f"const int kNumCompositions = {len(pairs)};\n\n")
    out.write("}  // namespace qtrain::unicode\n")


if __name__ == "__main__":
    main()
