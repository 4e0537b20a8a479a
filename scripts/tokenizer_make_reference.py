#!/usr/bin/env python3
"""Builds a varied test corpus and the ids HF `tokenizers` gives for it, for the C++ tokenizer tests.

    python3 scripts/tokenizer_make_reference.py --tokenizer ../shared/data/qwen2.5-tokenizer/tokenizer.json \
        --out build/tokenizer-reference
    python3 scripts/tokenizer_make_reference.py --tokenizer build/tokenizer-reference/llama3.2/tokenizer.json \
        --out build/tokenizer-reference/llama3.2

(Llama 3's files: scripts/tokenizer_fetch_llama3.sh.)

Needs `pip install tokenizers==0.23.3` (the version the tests were checked against; any version
whose Qwen2 ids are unchanged works). A missing --tokenizer file is not an error: the script says
so and writes nothing, and the C++ tests that need the reference skip. Writes OUT/reference.bin (read by tests/tokenizer/reference_test.cpp,
which skips when it is missing). The corpus (about 2 MB) is generated from what is on the machine
and never committed: the KJV Bible (Debian's bible-kjv, when installed), Python's own source files,
text assembled from the tokenizer's own vocabulary in many scripts (Chinese, Japanese, Korean,
Cyrillic, Arabic, Devanagari, Thai, accented Latin...), and generated edge cases: emoji, digits,
whitespace runs, CRLF, NFD and scrambled combining marks, invalid UTF-8, added-token strings,
contractions, random code points and random mixes of all of these. Deterministic for a given
machine (fixed seed).

Also writes OUT/reference.json: {"bos_ids": the ids HF's post-processor puts before every document
(tokenizer(doc) = bos_ids + the kRecognize ids below, checked here on every document: [] for Qwen,
[128000] for Llama 3.2), "documents", "tokenizers" (the version)}.

reference.bin layout (little endian): b"QTOKREF1", u32 document count, then per document:
u32 n + n bytes (the raw document, possibly invalid UTF-8), u32 n + n bytes (the tokenizer's normalized
text of the document after errors="replace" decoding: NFC for Qwen, the text itself for Llama 3), then three id lists, each u32 n + n int32:
  ids with encode_special_tokens=True (qtrain's SpecialTokens::kAsText),
  ids with HF's default encode (kRecognize),
  ids with no added tokens at all (kNone).
"""
import argparse
import glob
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import unicodedata

from tokenizers import Tokenizer

SEED = 1234


# --------------------------------------------------------------------------------------------------
# Corpus sources
# --------------------------------------------------------------------------------------------------

def kjv_documents():
    if not shutil.which("bible"):
        print("note: `bible` (Debian bible-kjv) not found, corpus has no KJV text", file=sys.stderr)
        return []
    text = subprocess.run(["bible", "-f", "gen1:1-exo40:38", "ps1:1-ps150:6", "mt1:1-mr16:20"],
                          capture_output=True, check=True).stdout
    lines = text.split(b"\n")
    docs = [b"\n".join(lines[i:i + 40]) for i in range(0, len(lines), 40)]
    return docs


def python_source_documents(rng, budget=450_000):
    lib = os.path.dirname(os.__file__)
    files = sorted(glob.glob(os.path.join(lib, "*.py")))
    rng.shuffle(files)
    docs, total = [], 0
    for path in files:
        with open(path, "rb") as f:
            data = f.read()
        if len(data) > 60_000:
            continue
        docs.append(data)
        total += len(data)
        if total >= budget:
            break
    # CRLF and CR line endings, and tabs for indentation.
    docs += [d.replace(b"\n", b"\r\n") for d in docs[:4]]
    docs += [d.replace(b"\n", b"\r") for d in docs[4:6]]
    docs += [d.replace(b"    ", b"\t") for d in docs[6:8]]
    return docs


def cjk_file_documents():
    lib = os.path.dirname(os.__file__)
    docs = []
    for path in sorted(glob.glob(os.path.join(lib, "test", "cjkencodings", "*-utf8.txt"))):
        with open(path, "rb") as f:
            docs.append(f.read())
    return docs


def script_of(ch):
    name = unicodedata.name(ch, "")
    if not name:
        return None
    if name.startswith("CJK UNIFIED"):
        return "han"
    for prefix in ("HIRAGANA", "KATAKANA", "HANGUL", "CYRILLIC", "ARABIC", "DEVANAGARI", "THAI",
                   "GREEK", "HEBREW", "BENGALI", "TAMIL", "GEORGIAN", "ARMENIAN"):
        if name.startswith(prefix):
            return prefix.lower()
    if name.startswith("LATIN") and ord(ch) > 0x7F:
        return "latin-accented"
    return None


def vocab_text_documents(tok_json_vocab, rng):
    """Sentences assembled from the tokenizer's own tokens, script by script: realistic merges."""
    byte_decoder = {}
    n = 0
    for b in range(256):
        printable = 33 <= b <= 126 or 161 <= b <= 172 or b >= 174
        byte_decoder[chr(b) if printable else chr(256 + n)] = b
        if not printable:
            n += 1
    by_script = {}
    for spelled in tok_json_vocab:
        try:
            text = bytes(byte_decoder[c] for c in spelled).decode("utf-8")
        except (UnicodeDecodeError, KeyError):
            continue
        word = text.strip()
        if not word:
            continue
        scripts = {script_of(c) for c in word if not c.isascii()}
        if len(scripts) == 1 and None not in scripts:
            by_script.setdefault(scripts.pop(), []).append(text)
    punct = {
        "han": "，。！？：；、“”（）《》",
        "hiragana": "、。「」！？", "katakana": "、。「」・ー",
    }
    docs = []
    for script in sorted(by_script):
        words = sorted(by_script[script])
        marks = punct.get(script, ",.!?;:")
        for _ in range(12 if script in ("han", "latin-accented") else 4):
            parts = []
            for _ in range(rng.randint(200, 700)):
                parts.append(rng.choice(words))
                r = rng.random()
                if r < 0.08:
                    parts.append(rng.choice(marks))
                elif r < 0.10:
                    parts.append(str(rng.randint(0, 100000)))
                elif r < 0.12:
                    parts.append(rng.choice([" the ", " and ", "Python ", "\n", "\n\n", " "]))
                elif r < 0.30 and script not in ("han", "hiragana", "katakana", "thai"):
                    parts.append(" ")
            docs.append("".join(parts).encode())
    return docs


EMOJI_RANGES = [(0x1F300, 0x1F5FF), (0x1F600, 0x1F64F), (0x1F680, 0x1F6FF), (0x1F900, 0x1F9FF),
                (0x2600, 0x26FF), (0x2700, 0x27BF)]


def random_emoji(rng):
    r = rng.random()
    if r < 0.1:  # ZWJ family / profession sequences
        return "\u200d".join(rng.choice(["👨", "👩", "👧", "👦", "💻", "🔬", "❤️"]) for _ in range(rng.randint(2, 4)))
    if r < 0.2:  # skin tones
        return rng.choice(["👋", "👍", "🙏", "💪"]) + chr(rng.randint(0x1F3FB, 0x1F3FF))
    if r < 0.3:  # flags: regional indicator pairs
        return chr(0x1F1E6 + rng.randint(0, 25)) + chr(0x1F1E6 + rng.randint(0, 25))
    if r < 0.35:  # keycaps
        return rng.choice("0123456789#*") + "\ufe0f\u20e3"
    lo, hi = rng.choice(EMOJI_RANGES)
    return chr(rng.randint(lo, hi)) + ("\ufe0f" if rng.random() < 0.2 else "")


def emoji_documents(rng):
    docs = []
    for _ in range(60):
        parts = []
        for _ in range(rng.randint(10, 120)):
            parts.append(random_emoji(rng))
            parts.append(rng.choice(["", "", " ", " wow", "!", "\n", "好", " 123"]))
        docs.append("".join(parts).encode())
    return docs


def digit_documents(rng):
    docs = []
    for _ in range(60):
        parts = []
        for _ in range(rng.randint(20, 200)):
            r = rng.random()
            if r < 0.3:
                parts.append(str(rng.randint(0, 10 ** rng.randint(1, 30))))
            elif r < 0.4:
                parts.append(f"{rng.uniform(-1e6, 1e6):,.{rng.randint(0, 6)}f}")
            elif r < 0.5:
                parts.append(f"+1 ({rng.randint(100, 999)}) {rng.randint(100, 999)}-{rng.randint(1000, 9999)}")
            elif r < 0.6:
                parts.append("".join(chr(rng.choice([0x660, 0x6F0, 0x966, 0xFF10, 0x1D7CE, 0xE50])
                                         + rng.randint(0, 9)) for _ in range(rng.randint(1, 8))))
            elif r < 0.7:
                parts.append(rng.choice(["²", "³", "½", "Ⅻ", "ⅷ", "①", "⑳", "〇", "〥", "𝟙", "१२३"]))
            elif r < 0.8:
                parts.append(f"v{rng.randint(0, 9)}.{rng.randint(0, 99)}.{rng.randint(0, 999)}")
            else:
                parts.append(rng.choice(["abc", "x", "第", "年", "$", "%", "e", "E", "-", "0x"]))
            parts.append(rng.choice([" ", "", ", ", "\n", "\t"]))
        docs.append("".join(parts).encode())
    return docs


WHITESPACE = [" ", "\t", "\n", "\r\n", "\r", "\u3000", "\u00a0", "\u2028", "\u0085", "\x0b", "\x0c",
              "\u2003", "\u202f", "\u1680"]


def whitespace_documents(rng):
    docs = []
    for _ in range(150):
        parts = []
        for _ in range(rng.randint(1, 40)):
            run = "".join(rng.choice(WHITESPACE) for _ in range(rng.randint(1, 6)))
            if rng.random() < 0.5:
                run = " " * rng.randint(1, 40) + run
            parts.append(run)
            parts.append(rng.choice(["word", "x", "", "12", "!", "中文", "'s", "é", "(", "—", "🙂"]))
        docs.append("".join(parts).encode())
    docs += [b" " * n for n in (1, 2, 3, 17, 100, 5000)]
    docs += [b"\n" * 50, b"\r\n" * 30, b"\t" * 20 + b"x", b"   \n   \n", b" \n \n x", b"x \n"]
    docs += [b"line one\r\nline two\r\n\r\n  indented\r\n\ttab\r\n", b"a\rb\r\rc\r\n\n\r"]
    return docs


COMBINING_MARKS = [cp for cp in range(0x300, 0x2000) if unicodedata.combining(chr(cp))] + \
                  [0x20D0, 0x20E3, 0x302A, 0x3099, 0x309A, 0xFE20, 0x1D167, 0x1D16D]


def nfd_documents(rng, accented_docs):
    docs = []
    # Accented text fully decomposed (NFD) and compatibility-decomposed (NFKD).
    for d in accented_docs[:8]:
        text = d.decode()
        docs.append(unicodedata.normalize("NFD", text).encode())
        docs.append(unicodedata.normalize("NFKD", text).encode())
    samples = ["Café déjà vu, naïve façade, Ångström, Dvořák, São Paulo, Nguyễn Thị Minh Khai",
               "Ελληνικά: άλφα, έψιλον, ΐ, ΰ", "Ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３", "ﬁﬂ ligatures", "Å Ω K"]
    for s in samples:
        docs.append(unicodedata.normalize("NFD", s).encode())
        docs.append(s.encode())
    # Scrambled combining marks after letters, Hangul jamo, singletons, exclusions.
    bases = "aeiouAEIOUnNcCsSzZ가각αωΑ \tअकก1.'"
    for _ in range(200):
        parts = []
        for _ in range(rng.randint(1, 30)):
            parts.append(rng.choice(bases))
            for _ in range(rng.choice([0, 0, 1, 1, 2, 3, 5])):
                parts.append(chr(rng.choice(COMBINING_MARKS)))
        docs.append("".join(parts).encode())
    jamo = [chr(c) for c in list(range(0x1100, 0x1113)) + list(range(0x1161, 0x1176)) + list(range(0x11A8, 0x11C3))]
    for _ in range(40):
        docs.append("".join(rng.choice(jamo + ["가", "나", " ", "a"]) for _ in range(rng.randint(1, 60))).encode())
    docs.append("\u212b \u2126 \u0958 \u0344 \u0f73 \u1e9b\u0323 \u0374 \u037e \u2000 \uf900 \U0002f800".encode())
    docs.append("\u0915\u093c \u0b47\u0b3e \u0b47\u0b57 \u09c7\u09be \U00011935\U00011930 \U00011938".encode())
    return docs


def invalid_utf8_documents(rng, text_docs):
    docs = [
        b"\xff", b"\xc0\xaf", b"\xe0\x80\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xf5\x80",
        b"abc\xe4\xb8", b"\xe4\xb8\xad\xe6", b"\x80\x80\x80", b"ok \xc3 ok", b"\xf0\x9f\x98",
        b"\xf0\x9f\x98 smile", b"\xe2\x82\n\xe2\x82\xac", b"caf\xe9 na\xefve", b"\xc3\xa9\xcc",
        b"<|endoftext\xff|>", b"\xef\xbb\xbfBOM start", b"\xed\xbf\xbf\xee\x80\x80",
    ]
    for _ in range(150):
        docs.append(bytes(rng.randint(0, 255) for _ in range(rng.randint(1, 80))))
    for d in text_docs[:40]:
        b = bytearray(d[:3000])
        for _ in range(rng.randint(1, 10)):
            if b:
                b[rng.randrange(len(b))] = rng.randint(0x80, 0xFF)
        cut = rng.randint(1, len(b)) if b else 0
        docs.append(bytes(b[:cut]))
    return docs


def added_token_documents(rng, added):
    contents = [t["content"] for t in added]
    docs = []
    fillers = ["hello", " ", "", "\n", "x", "中文", " world ", "<", "|", ">", "<|", "|>", "'s"]
    for _ in range(200):
        parts = []
        for _ in range(rng.randint(1, 20)):
            r = rng.random()
            if r < 0.4:
                parts.append(rng.choice(contents))
            elif r < 0.55:
                c = rng.choice(contents)
                parts.append(c[:rng.randint(1, len(c) - 1)])  # partial
            elif r < 0.6:
                parts.append(rng.choice(contents).upper())
            else:
                parts.append(rng.choice(fillers))
        docs.append("".join(parts).encode())
    docs += [b"<|endoftext|>", b"<|<|endoftext|>|>", b"<tool_call>x</tool_call>",
             b"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", b" <|endoftext|> ",
             b"a<|fim_prefix|>b<|fim_suffix|>c<|fim_middle|>", b"<<tool_call>>",
             b"<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi 12345!<|eot_id|>"
             b"<|start_header_id|>assistant<|end_header_id|>\n\n", b"<|end_of_text|><|begin_of_text|>x"]
    return docs


def contraction_documents(rng):
    pieces = ["'s", "'S", "'t", "'T", "'re", "'RE", "'rE", "'Re", "'ve", "'VE", "'m", "'M", "'ll",
              "'LL", "'lL", "'d", "'D", "'ſ", "'ſt", "'K", "'x", "''", "'", "'sss", "'lll", "'red",
              "'\u212a", "'ﬅ", "'İ", "'ß"]
    words = ["don", "I", "we", "they", "she", "it", "O", "rock", "n", "y", "中", " ", "1", ".", "\n"]
    docs = []
    for _ in range(80):
        docs.append("".join(rng.choice(words) + rng.choice(pieces) + rng.choice(["", " ", "s", "x", "2"])
                            for _ in range(rng.randint(1, 30))).encode())
    return docs


FUZZ_ALPHABET = list("aZz09 '\t\r\n.,!?-_()[]{}<>|/\\\"#$%&*+=@^`~") + [
    "\u3000", "\u00a0", "\u2028", "\u0085", "\x0b", "\x00", "\x1c", "\x1f", "\x7f", "é", "e\u0301",
    "\u0301", "\u0323", "中", "文", "。", "，", "あ", "ア", "한", "ж", "ع", "क", "\u093f", "ก",
    "\u0e31", "😀", "\U0001f3fb", "\u200d", "\ufe0f", "ſ", "\u212a", "²", "٣", "①", "Ⅻ", "\u00ad",
    "\ufffd", "\U0010ffff", "\ue000", "ß", "İ", "ǅ", "ʰ", "々", "〇", "s", "t", "l", "r", "v", "e",
    "m", "d", "S", "L", "RE", "<|endoftext|>", "<tool_call>", "\r\n", "  ", "\u2003", "－"]


def fuzz_documents(rng, count):
    return ["".join(rng.choice(FUZZ_ALPHABET) for _ in range(rng.randint(1, 60))).encode()
            for _ in range(count)]


def random_codepoint_documents(rng, count):
    docs = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, 40)):
            cp = rng.randint(0, 0x10FFFF)
            if 0xD800 <= cp < 0xE000:
                cp = 0xFFFD
            parts.append(chr(cp))
            if rng.random() < 0.3:
                parts.append(rng.choice([" ", "a", "1", "'", "\n", "中"]))
        docs.append("".join(parts).encode())
    # Every code point below U+3400 once, in runs (dense coverage of alphabetic scripts).
    for start in range(0, 0x3400, 0x200):
        docs.append("".join(chr(c) for c in range(start, start + 0x200) if not 0xD800 <= c < 0xE000).encode())
    return docs


def long_piece_documents(rng, han_chars):
    docs = [b"a" * 3000, b"=" * 1000 + b"\n", b"1234567890" * 200, b" " * 2000 + b"x",
            b"-" * 500 + b" " + b"_" * 300, bytes(rng.choice(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdef0123456789+/")
                                                    for _ in range(4000)),
            "".join(rng.choice(han_chars) for _ in range(3000)).encode(),
            ("ab" * 1500).encode(), ("\u00e9" * 800).encode(), ("e\u0301" * 400).encode()]
    return docs


# --------------------------------------------------------------------------------------------------

def build_corpus(tokenizer_json, fuzz):
    rng = random.Random(SEED)
    with open(tokenizer_json, encoding="utf-8") as f:
        j = json.load(f)
    vocab = j["model"]["vocab"]
    vocab_docs = vocab_text_documents(vocab, rng)
    # Common Chinese characters (those of the vocabulary's Chinese words) for one long piece.
    han_chars = sorted({c for d in vocab_docs for c in d.decode() if 0x4E00 <= ord(c) <= 0x9FFF})
    accented = [d for d in vocab_docs if any(0xC0 <= ord(c) <= 0x24F for c in d.decode()[:200])]
    kjv = kjv_documents()
    code = python_source_documents(rng)
    docs = []
    docs += kjv
    docs += code
    docs += cjk_file_documents()
    docs += vocab_docs
    docs += emoji_documents(rng)
    docs += digit_documents(rng)
    docs += whitespace_documents(rng)
    docs += nfd_documents(rng, accented)
    docs += invalid_utf8_documents(rng, vocab_docs + kjv[:10])
    docs += added_token_documents(rng, j.get("added_tokens", []))
    docs += contraction_documents(rng)
    docs += fuzz_documents(rng, fuzz)
    docs += random_codepoint_documents(rng, max(1, fuzz // 10))
    docs += long_piece_documents(rng, han_chars)
    docs.append(b"")
    return docs, j


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", required=True, help="HF tokenizer.json (Qwen2.5's, Llama 3's)")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--fuzz", type=int, default=3000,
                    help="number of random short documents (more: a longer, deeper check)")
    args = ap.parse_args()
    if not os.path.exists(args.tokenizer):
        print(f"note: {args.tokenizer} not found, no tokenizer reference written", file=sys.stderr)
        return

    docs, j = build_corpus(args.tokenizer, args.fuzz)
    texts = [d.decode("utf-8", errors="replace") for d in docs]

    tok = Tokenizer.from_file(args.tokenizer)
    tok.encode_special_tokens = True
    as_text = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    tok.encode_special_tokens = False
    recognize = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    # What the post-processor adds: the same tokens before every document, nothing after.
    bos_ids = tok.encode("", add_special_tokens=True).ids
    with_special = [e.ids for e in tok.encode_batch(texts, add_special_tokens=True)]
    for i, ids in enumerate(with_special):
        if ids != bos_ids + recognize[i]:
            sys.exit(f"document {i}: tokenizer(doc) is not {bos_ids} + its ids; qtrain does not implement "
                     f"this post-processor")
    j["added_tokens"] = []
    bare = Tokenizer.from_str(json.dumps(j))
    none = [e.ids for e in bare.encode_batch(texts, add_special_tokens=False)]
    normalizer = tok.normalizer
    normalized = [(normalizer.normalize_str(t) if normalizer else t).encode() for t in texts]

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "reference.bin")
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(b"QTOKREF1")
        f.write(struct.pack("<I", len(docs)))
        for i, d in enumerate(docs):
            for blob in (d, normalized[i]):
                f.write(struct.pack("<I", len(blob)))
                f.write(blob)
            for ids in (as_text[i], recognize[i], none[i]):
                f.write(struct.pack("<I", len(ids)))
                f.write(struct.pack(f"<{len(ids)}i", *ids))
    os.replace(tmp, path)
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump({"bos_ids": bos_ids, "documents": len(docs),
                   "tokenizers": __import__("tokenizers").__version__}, f)
        f.write("\n")
    total = sum(len(d) for d in docs)
    print(f"wrote {path}: {len(docs)} documents, {total / 1e6:.2f} MB, "
          f"{sum(len(x) for x in as_text)} tokens (tokenizers {__import__('tokenizers').__version__})")


if __name__ == "__main__":
    main()
