#!/usr/bin/env python3
"""HF's own libraries load what `train --tokenizer=qwen.tiktoken` puts into output/, with qtrain's ids.

    python3 tests/scripts/hf_tokenizer_export_check.py --train build/train --tokenize build/tokenize \
        --reference-dir build/tokenizer-reference

Needs `tokenizers` and `transformers` (no torch); tests/scripts/hf_tokenizer_export_test.sh runs it
under `uv run` for ctest. On the varied reference corpus (reference.bin, the C++ tokenizer tests'
documents) it
  1. tokenizes with qtrain (`tokenize --tokenizer=qwen.tiktoken`, special tokens as text and recognized),
  2. trains a tiny Qwen2 model one step on those tokens with `train --tokenizer=qwen.tiktoken`,
  3. loads output/tokenizer.json with `tokenizers` and output/ with transformers' AutoTokenizer,
and checks that both give qtrain's ids for every document, in both special-token modes, and that
AutoTokenizer sees the Qwen2.5 base model's tokens (eos = pad = <|endoftext|> = 151643).
Where Llama 3.2's tokenizer.json and its reference are there too (REFERENCE_DIR/llama3.2/, see
scripts/tokenizer_fetch_llama3.sh), the same with that tokenizer.json alone as --tokenizer: qtrain's
documents are <|begin_of_text|> + ids + <|end_of_text|>, HF's tokenizer(doc) (its post-processor adds
the BOS) gives the same BOS + ids from the exported files, and so does AutoTokenizer on those files
beside a Llama config.json, with bos <|begin_of_text|> = 128000 and eos <|end_of_text|> = 128001 (the
tokenizer_config.json qtrain writes). (The model trained is the tiny Qwen2 one, whatever the
tokenizer: only the tokenizer files are under test.)
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

EOT = 151643


def reference_documents(path):
    """The raw documents of reference.bin (layout: scripts/tokenizer_make_reference.py)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"QTOKREF1", f"{path}: not a reference.bin"
    pos = 8

    def u32():
        nonlocal pos
        (v,) = struct.unpack_from("<I", data, pos)
        pos += 4
        return v

    def skip(item_bytes):  # `pos += 4 * u32()` would add to pos as it was before u32() moved it
        nonlocal pos
        n = u32()
        pos += item_bytes * n

    docs = []
    for _ in range(u32()):
        n = u32()
        docs.append(data[pos:pos + n])
        pos += n
        skip(1)  # the normalized text
        for _ in range(3):
            skip(4)  # the ids
    return docs


def token_file_ids(path):
    with open(path, "rb") as f:
        header = f.read(1024)
        assert header[:8] == b"BIN.TOK\n", f"{path}: not a BIN.TOK file"
        (n,) = struct.unpack_from("<i", header, 16)
        return list(struct.unpack(f"<{n}i", f.read(4 * n)))


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {r.returncode}:\n{r.stdout[-3000:]}")
    return r.stdout


def compare(what, docs, hf_ids, qtrain_stream, eos=EOT):
    """qtrain's stream is every document's ids followed by the end-of-text token."""
    expected = []
    for ids in hf_ids:
        expected += list(ids) + [eos]
    if expected == qtrain_stream:
        print(f"ok: {what}: {len(docs)} documents, {len(expected)} tokens equal")
        return True
    pos = 0
    for i, ids in enumerate(hf_ids):
        n = len(ids) + 1
        if qtrain_stream[pos:pos + n] != list(ids) + [eos]:
            print(f"FAIL: {what}: document {i} {docs[i][:80]!r}:\n  HF:     {list(ids)[:40]}\n"
                  f"  qtrain: {qtrain_stream[pos:pos + n][:40]}")
            return False
        pos += n
    print(f"FAIL: {what}: {len(expected)} HF tokens, {len(qtrain_stream)} qtrain tokens")
    return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", required=True)
    ap.add_argument("--tokenize", required=True)
    ap.add_argument("--reference-dir", required=True, help="holds qwen.tiktoken and reference.bin")
    args = ap.parse_args()
    import tokenizers
    import transformers

    ok = check_qwen(args, tokenizers, transformers)
    llama = os.path.join(args.reference_dir, "llama3.2")
    if all(os.path.exists(os.path.join(llama, f)) for f in ("tokenizer.json", "reference.bin")):
        ok &= check_llama3(args, llama, tokenizers, transformers)
    else:
        print(f"note: no {llama}/tokenizer.json and reference.bin: Llama 3 not checked "
              "(scripts/tokenizer_fetch_llama3.sh, scripts/tokenizer_make_reference.py)")
    sys.exit(0 if ok else 1)


def documents(reference_bin):
    """HF takes text, qtrain bytes: the documents as Python reads files with errors="replace", the
    same repair qtrain applies; empty ones dropped (nothing to compare)."""
    docs = [d.decode("utf-8", errors="replace") for d in reference_documents(reference_bin)]
    return [d for d in docs if d]


def tokenize_and_train(args, tmp, tokenizer, docs, vocab_size, bos_eos):
    """qtrain's token streams of `docs` in both special-token modes, and the output/ directory of a
    one-step training run with --tokenizer=`tokenizer`."""
    corpus = os.path.join(tmp, "corpus.jsonl")
    with open(corpus, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    streams = {}
    for mode in ("text", "recognize"):
        out = os.path.join(tmp, f"data-{mode}")
        run([args.tokenize, f"--tokenizer={tokenizer}", f"--input={corpus}", f"--out-dir={out}",
             f"--special-tokens={mode}", "--no-progress"])
        streams[mode] = token_file_ids(os.path.join(out, "train.bin"))

    model = os.path.join(tmp, "tiny-qwen")
    os.makedirs(model)
    with open(os.path.join(model, "config.json"), "w") as f:
        json.dump({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": vocab_size,
                   "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
                   "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
                   "bos_token_id": bos_eos[0], "eos_token_id": bos_eos[1], "hidden_act": "silu"}, f)
    output = os.path.join(tmp, "output")
    run([args.train, "--device=cpu", f"--model={model}", "--from-scratch", f"--tokenizer={tokenizer}",
         f"--train-file={os.path.join(tmp, 'data-text', 'train.bin')}", "--steps=1", "--batch-size=1",
         "--seq-len=32", "--grad-accumulation=1", f"--out-dir={output}", f"--checkpoint-dir={tmp}/ckpt"])
    return streams, output


def check_qwen(args, tokenizers, transformers):
    tiktoken = os.path.join(args.reference_dir, "qwen.tiktoken")
    docs = documents(os.path.join(args.reference_dir, "reference.bin"))
    with tempfile.TemporaryDirectory() as tmp:
        streams, output = tokenize_and_train(args, tmp, tiktoken, docs, 151936, (EOT, EOT))
        ok = True
        tok = tokenizers.Tokenizer.from_file(os.path.join(output, "tokenizer.json"))
        ok &= compare(f"tokenizers {tokenizers.__version__}, special tokens recognized", docs,
                      [e.ids for e in tok.encode_batch(docs, add_special_tokens=False)], streams["recognize"])
        tok.encode_special_tokens = True
        ok &= compare(f"tokenizers {tokenizers.__version__}, special tokens as text", docs,
                      [e.ids for e in tok.encode_batch(docs, add_special_tokens=False)], streams["text"])

        auto = transformers.AutoTokenizer.from_pretrained(output)
        what = f"transformers {transformers.__version__} AutoTokenizer ({type(auto).__name__})"
        ok &= compare(f"{what}, special tokens recognized", docs,
                      auto(docs, add_special_tokens=False)["input_ids"], streams["recognize"])
        ok &= compare(f"{what}, split_special_tokens", docs,
                      auto(docs, add_special_tokens=False, split_special_tokens=True)["input_ids"], streams["text"])
        facts = {"class": type(auto).__name__, "len": len(auto), "eos": (auto.eos_token, auto.eos_token_id),
                 "pad": (auto.pad_token, auto.pad_token_id), "im_start": auto.convert_tokens_to_ids("<|im_start|>")}
        want = {"class": "Qwen2Tokenizer",  # transformers 5's name (4.x: Qwen2TokenizerFast)
                "len": 151665, "eos": ("<|endoftext|>", EOT), "pad": ("<|endoftext|>", EOT), "im_start": 151644}
        if facts != want:
            print(f"FAIL: {what}: {facts}, expected {want}")
            ok = False
        else:
            print(f"ok: {what}: {facts}")
    return ok


def check_llama3(args, llama_dir, tokenizers, transformers):
    bos, eos = 128000, 128001
    docs = documents(os.path.join(llama_dir, "reference.bin"))
    with tempfile.TemporaryDirectory() as tmp:
        # tokenizer.json alone (no tokenizer_config.json beside it): output/ gets the one qtrain writes
        lone = os.path.join(tmp, "llama3.2-tokenizer.json")
        with open(os.path.join(llama_dir, "tokenizer.json"), "rb") as f, open(lone, "wb") as g:
            g.write(f.read())
        streams, output = tokenize_and_train(args, tmp, lone, docs, 128320, (bos, eos))
        ok = True
        with open(os.path.join(output, "tokenizer.json"), "rb") as f, open(lone, "rb") as g:
            if f.read() != g.read():
                print("FAIL: output/tokenizer.json is not Llama 3.2's tokenizer.json as it was")
                ok = False
        tok = tokenizers.Tokenizer.from_file(os.path.join(output, "tokenizer.json"))
        what = f"Llama 3.2, tokenizers {tokenizers.__version__}, tokenizer(doc)"
        ok &= compare(f"{what}, special tokens recognized", docs,
                      [e.ids for e in tok.encode_batch(docs)], streams["recognize"], eos)
        tok.encode_special_tokens = True
        ok &= compare(f"{what}, special tokens as text", docs,
                      [e.ids for e in tok.encode_batch(docs)], streams["text"], eos)

        # AutoTokenizer beside a Llama config.json, as a Llama model's output/ will have it: beside the
        # tiny Qwen2 model's, transformers 5 takes Qwen2Tokenizer, which replaces the file's split
        # regex with Qwen's own.
        llama_model = os.path.join(tmp, "llama-model")
        os.makedirs(llama_model)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            with open(os.path.join(output, name), "rb") as f, open(os.path.join(llama_model, name), "wb") as g:
                g.write(f.read())
        with open(os.path.join(llama_model, "config.json"), "w") as f:
            json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, f)
        auto = transformers.AutoTokenizer.from_pretrained(llama_model)
        what = f"Llama 3.2, transformers {transformers.__version__} AutoTokenizer ({type(auto).__name__})"
        ok &= compare(f"{what}, special tokens recognized", docs, auto(docs)["input_ids"], streams["recognize"], eos)
        ok &= compare(f"{what}, split_special_tokens", docs,
                      auto(docs, split_special_tokens=True)["input_ids"], streams["text"], eos)
        facts = {"class": type(auto).__name__, "len": len(auto), "bos": (auto.bos_token, auto.bos_token_id),
                 "eos": (auto.eos_token, auto.eos_token_id)}
        want = {"class": "TokenizersBackend",  # transformers 5's name (4.x: PreTrainedTokenizerFast)
                "len": 128257, "bos": ("<|begin_of_text|>", bos), "eos": ("<|end_of_text|>", eos)}
        if facts != want:
            print(f"FAIL: {what}: {facts}, expected {want}")
            ok = False
        else:
            print(f"ok: {what}: {facts}")
    return ok


if __name__ == "__main__":
    main()
