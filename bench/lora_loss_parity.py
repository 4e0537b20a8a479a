#!/usr/bin/env python3
"""The Python half of issue 33's loss-parity row (bench/lora_loss_parity.sh runs it): HF transformers + peft
fine-tune the same LoRA adapter qtrain fine-tunes, on the same batches, and both final adapters are
evaluated on the same held-out conversations through transformers + peft.

Subcommands:
  split    CHAT.bin OUT_DIR [--every 20]: a chat token file (tokenize --chat: masks + document starts) cut
           into OUT_DIR/train.bin and OUT_DIR/eval.bin, every 20th conversation to eval (scripts/chat_dataset.sh's
           rule), masks and document starts kept (BIN.TOK v2, src/io/token_file.h)
  adapter  BASE OUT: one PEFT adapter of BASE (rank 16, alpha 32, every target, dropout 0) with B non-zero,
           saved by peft: the starting point of both fine-tunes
  train    BASE ADAPTER TRAIN.bin OUT ...: the PEFT fine-tune (below)
  eval     BASE EVAL.bin --seq-len T NAME=ADAPTER_DIR ...: held-out loss of each adapter; with --qtrain-log and
           --torch-log also the per-step training losses of the two runs compared; prints one JSON line

The batches. qtrain's loader (src/train/data_loader.cpp, io/row_packing.h) with a chat file packs documents
greedily in file order into rows of --seq-len slots (a document longer than that cut into pieces of seq-len,
each its own document), then shuffles the rows per epoch with its own splitmix64 Fisher-Yates (seed, epoch);
a row's targets are each document's next tokens under the mask, none at a document's last token. `rows()`
and `epoch_order()` below reproduce that rule, so step s here takes exactly qtrain's rows of step s (one
rank, --grad-accumulation=1). The attention differs only in form: qtrain runs the packed row with document
masking and positions restarting per document; here every document (piece) of the step is its own padded
sequence (grouped by length into sub-batches whose gradients add up), which is the same function of the
same tokens. The loss is qtrain's --loss-normalization=tokens (the default with document masking): the sum
of the cross-entropies of the step's trained targets over their count. The first logged step of both runs
is the same loss of the same starting adapter on the same batch, so `eval`'s step comparison is the check
that the batches are the same.

The optimizer: torch.optim.AdamW on the adapters (betas, eps, decoupled weight decay as qtrain's flags),
the learning rate set each step to qtrain's schedule (src/train/lr_schedule.cpp: linear warmup, cosine to
final-lr-fraction x peak), gradients clipped as qtrain clips (scale clip / norm when the global norm is
above clip; torch's clip_grad_norm_ adds 1e-6 to the norm). What differs: the arithmetic. On the GPU qtrain
runs its bf16 base with bf16 adapter GEMMs (fp32 master and moments); the PEFT side loads the base in bf16,
keeps the adapters in fp32 (peft's autocast_adapter_dtype) and runs under torch.autocast(bfloat16). On the
CPU both are fp32. Dropout is 0, so there is no random draw to match.

The evaluation: every conversation of the eval file, cut into pieces of --seq-len as qtrain's loader cuts
them, each piece its own sequence; loss = sum of the trained targets' cross-entropies / their count, in
fp32 with the base in fp32, for every adapter alike (qtrain's output adapter through
PeftModel.from_pretrained, like PEFT's own).
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

M64 = (1 << 64) - 1
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


# ---- token files (BIN.TOK v2 with masks and document starts) ----

def read_token_file(path):
    raw = np.fromfile(path, dtype=np.uint8)
    assert bytes(raw[:8]) == b"BIN.TOK\n", f"{path}: not a BIN.TOK file"
    h = raw[:1024].view(np.int32)
    n, vocab, has_masks, has_starts = int(h[4]), int(h[5]), int(h[6]) == 1, int(h[7]) == 1
    assert int(h[3]) == 4, f"{path}: {h[3]} bytes per token (4 expected)"
    tokens = raw[1024:1024 + 4 * n].view(np.int32)
    nbytes = (n + 7) // 8
    off = 1024 + 4 * n
    mask = np.unpackbits(raw[off:off + nbytes], bitorder="little")[:n].astype(bool) if has_masks else np.ones(n, bool)
    off += nbytes if has_masks else 0
    if not has_starts:
        sys.exit(f"{path}: no document starts (write it with tokenize --chat)")
    starts = np.unpackbits(raw[off:off + nbytes], bitorder="little")[:n].astype(bool)
    return tokens, mask, starts, vocab


def write_token_file(path, tokens, mask, starts, vocab):
    n = len(tokens)
    h = np.zeros(256, np.int32)
    h[2], h[3], h[4], h[5], h[6], h[7] = 2, 4, n, vocab, 1, 1
    hb = bytearray(h.tobytes())
    hb[:8] = b"BIN.TOK\n"
    starts = starts.copy()
    starts[0] = True  # the file's first token begins a document
    with open(path + ".tmp", "wb") as f:
        f.write(bytes(hb))
        f.write(np.asarray(tokens, np.int32).tobytes())
        f.write(np.packbits(mask.astype(np.uint8), bitorder="little").tobytes())
        f.write(np.packbits(starts.astype(np.uint8), bitorder="little").tobytes())
    os.replace(path + ".tmp", path)


def documents(starts):
    """[(begin, end)] of each document of a file."""
    b = np.flatnonzero(starts)
    if len(b) == 0 or b[0] != 0:
        b = np.concatenate([[0], b])
    e = np.concatenate([b[1:], [len(starts)]])
    return list(zip(b.tolist(), e.tolist()))


def cmd_split(a):
    tokens, mask, starts, vocab = read_token_file(a.chat)
    docs = documents(starts)
    ev = [d for i, d in enumerate(docs) if i % a.every == a.every - 1]
    tr = [d for i, d in enumerate(docs) if i % a.every != a.every - 1]
    os.makedirs(a.out_dir, exist_ok=True)
    for name, part in (("train", tr), ("eval", ev)):
        idx = np.concatenate([np.arange(b, e) for b, e in part])
        st = np.zeros(len(idx), bool)
        st[np.cumsum([0] + [e - b for b, e in part[:-1]])] = True
        write_token_file(os.path.join(a.out_dir, f"{name}.bin"), tokens[idx], mask[idx], st, vocab)
    print(f"split {a.chat}: {len(tr)} train and {len(ev)} eval conversations -> {a.out_dir}")


# ---- qtrain's loader, reproduced (src/train/data_loader.cpp, src/io/row_packing.h) ----

def rows(starts, seq_len):
    """Rows of greedily packed documents: each a list of (begin, length) pieces, in file order."""
    out, used = [], seq_len
    for b, e in documents(starts):
        for off in range(0, e - b, seq_len):
            piece = min(seq_len, e - b - off)
            if used + piece > seq_len:
                out.append([])
                used = 0
            out[-1].append((b + off, piece))
            used += piece
    return out


def splitmix64(state):
    state = (state + 0x9e3779b97f4a7c15) & M64
    z = state
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M64
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M64
    return state, z ^ (z >> 31)


def epoch_order(n, seed, epoch):
    s = (seed ^ ((0x5eedda7a + epoch * 0x9e3779b97f4a7c15) & M64)) & M64
    _, rng = splitmix64(s)  # Rng(splitmix64(s)): the hash is the generator's state
    order = list(range(n))
    for i in range(n, 1, -1):
        rng, r = splitmix64(rng)
        j = r % i
        order[i - 1], order[j] = order[j], order[i - 1]
    return order


def step_rows(n_rows, seed, batch, steps):
    """The row indices of each step (one rank, no accumulation), wrapping into the next epoch as qtrain does."""
    epoch, pos, order, out = 0, 0, epoch_order(n_rows, seed, 0), []
    for _ in range(steps):
        pick = []
        for _ in range(batch):
            if pos >= n_rows:
                epoch, pos = epoch + 1, 0
                order = epoch_order(n_rows, seed, epoch)
            pick.append(order[pos])
            pos += 1
        out.append(pick)
    return out


def lr_at(step, peak, total, warmup, final_fraction):
    if step < warmup:
        return peak * (step + 1) / warmup
    span = total - warmup
    if span <= 0:
        return peak
    pos = min(max((step - warmup) / span, 0.0), 1.0)
    final = peak * final_fraction
    return final + (peak - final) * 0.5 * (1.0 + math.cos(math.pi * pos))


# ---- models ----

def load_base(path, dtype, device):
    from transformers import AutoModelForCausalLM
    try:
        m = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except TypeError:
        m = AutoModelForCausalLM.from_pretrained(path, torch_dtype=dtype)
    return m.to(device)


def pieces_loss_sum(pm, pieces, tokens, mask, device, token_budget, autocast, backward_scale=None):
    """Sum of the trained targets' cross-entropies over `pieces` [(begin, length)], each its own sequence,
    sub-batched by length (at most token_budget padded tokens each); with backward_scale, also backward of
    sum * scale per sub-batch. Returns (sum, count)."""
    inner = pm.base_model.model  # the *ForCausalLM with the LoRA layers in it
    pieces = sorted(pieces, key=lambda p: -p[1])
    total, count, i = 0.0, 0, 0
    while i < len(pieces):
        width = pieces[i][1]
        n = max(1, token_budget // width)
        group = pieces[i:i + n]
        i += n
        ids = np.zeros((len(group), width), np.int64)
        attn = np.zeros((len(group), width), np.int64)
        lab = np.full((len(group), width), -100, np.int64)
        for r, (b, L) in enumerate(group):
            ids[r, :L] = tokens[b:b + L]
            attn[r, :L] = 1
            # target of position j is token j+1 of the same piece, if its mask bit is set
            lab[r, :L - 1] = np.where(mask[b + 1:b + L], tokens[b + 1:b + L], -100)
        ids, attn, lab = (torch.from_numpy(x).to(device) for x in (ids, attn, lab))
        sel = lab >= 0
        c = int(sel.sum())
        if c == 0:
            continue
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=autocast):
            h = inner.model(input_ids=ids, attention_mask=attn).last_hidden_state[sel]
        y = lab[sel]
        if backward_scale is not None:
            with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=autocast):
                logits = inner.lm_head(h)
            loss = F.cross_entropy(logits.float(), y, reduction="sum")
            (loss * backward_scale).backward()
            total += float(loss.detach())
        else:  # evaluation: the LM head in chunks (the logits of a whole sub-batch are vocab x 4 bytes a token)
            for k in range(0, len(y), 2048):
                with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=autocast):
                    logits = inner.lm_head(h[k:k + 2048])
                total += float(F.cross_entropy(logits.float(), y[k:k + 2048], reduction="sum"))
        count += c
    return total, count


def cmd_adapter(a):
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(a.seed)
    base = load_base(a.base, torch.float32, "cpu")
    pm = get_peft_model(base, LoraConfig(r=a.rank, lora_alpha=a.alpha, lora_dropout=0.0, target_modules=TARGETS,
                                         bias="none", task_type="CAUSAL_LM"))
    with torch.no_grad():  # B non-zero: the starting adapter already changes the model
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, a.b_std)
    pm.save_pretrained(a.out)
    print(f"adapter: {a.out} (rank {a.rank}, alpha {a.alpha}, B ~ N(0, {a.b_std}))")


def cmd_train(a):
    from peft import PeftModel
    dev = a.device
    torch.manual_seed(0)
    if dev == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    bf16 = a.dtype == "bf16"
    base = load_base(a.base, torch.bfloat16 if bf16 else torch.float32, dev)
    pm = PeftModel.from_pretrained(base, a.adapter, is_trainable=True)
    pm.train()
    params = [p for p in pm.parameters() if p.requires_grad]
    assert all(p.dtype == torch.float32 for p in params), "adapters not fp32"
    tokens, mask, starts, _ = read_token_file(a.train)
    rs = rows(starts, a.seq_len)
    plan = step_rows(len(rs), a.seed, a.batch_size, a.steps)
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps, weight_decay=a.weight_decay)
    log = open(a.log, "w")
    for s, pick in enumerate(plan):
        pieces = [p for r in pick for p in rs[r]]
        count = sum(int(mask[b + 1:b + L].sum()) for b, L in pieces)
        total, c = pieces_loss_sum(pm, pieces, tokens, mask, dev, a.token_budget, bf16, 1.0 / max(count, 1))
        assert c == count
        norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params if p.grad is not None)).item()
        if a.grad_clip > 0 and norm > a.grad_clip:
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(a.grad_clip / norm)
        for g in opt.param_groups:
            g["lr"] = lr_at(s, a.lr, a.steps, a.warmup, a.final_lr_fraction)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = total / max(count, 1)
        log.write(json.dumps({"step": s + 1, "loss": loss, "grad_norm": norm, "tokens": count}) + "\n")
        log.flush()
        if s % max(1, a.steps // 10) == 0 or s + 1 == a.steps:
            print(f"[peft] step {s + 1}/{a.steps} loss {loss:.4f} norm {norm:.3f} lr {opt.param_groups[0]['lr']:.3g}",
                  flush=True)
    pm.save_pretrained(a.out)


def eval_loss(base_path, adapter, eval_file, seq_len, device, budget, max_pieces=0):
    from peft import PeftModel
    tokens, mask, starts, _ = read_token_file(eval_file)
    pieces = [p for r in rows(starts, seq_len) for p in r][:max_pieces or None]
    base = load_base(base_path, torch.float32, device)
    pm = PeftModel.from_pretrained(base, adapter)
    pm.eval()
    with torch.no_grad():
        total, count = pieces_loss_sum(pm, pieces, tokens, mask, device, budget, False)
    return total / count, count


def step_losses_qtrain(path):
    return [e["loss"] for e in map(json.loads, open(path)) if e.get("log") == "step"]


def cmd_eval(a):
    if a.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    res, raw = {"system": "lora-loss-parity"}, {}
    for item in a.adapters:
        name, path = item.split("=", 1)
        loss, count = eval_loss(a.base, path, a.eval, a.seq_len, a.device, a.token_budget, a.max_pieces)
        res[f"{name}_eval_loss"] = round(loss, 6)
        res["eval_tokens"] = count
        raw[name] = loss
    q, t = raw.get("qtrain"), raw.get("peft")
    if a.qtrain_log and a.torch_log:
        ql = step_losses_qtrain(a.qtrain_log)
        tl = [e["loss"] for e in map(json.loads, open(a.torch_log))]
        n = min(len(ql), len(tl))
        res["steps"] = n
        res["first_step_loss"] = {"qtrain": ql[0], "peft": tl[0], "rel": float(f"{abs(ql[0] - tl[0]) / tl[0]:.3g}")}
        res["last_step_loss"] = {"qtrain": ql[n - 1], "peft": tl[n - 1]}
        res["worst_step_loss_rel"] = float(f"{max(abs(x - y) / y for x, y in zip(ql[:n], tl[:n])):.3g}")
    if q is not None and t is not None:
        res["rel_diff"] = float(f"{abs(q - t) / t:.3g}")
        res["bound"] = a.bound
        res["result"] = "PASS" if res["rel_diff"] < a.bound else "FAIL"
    print(json.dumps(res))
    return 0 if res.get("result", "PASS") == "PASS" else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("split")
    p.add_argument("chat")
    p.add_argument("out_dir")
    p.add_argument("--every", type=int, default=20)
    p = sub.add_parser("adapter")
    p.add_argument("base")
    p.add_argument("out")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--alpha", type=int, default=32)
    p.add_argument("--b-std", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=1234)
    p = sub.add_parser("train")
    p.add_argument("base")
    p.add_argument("adapter")
    p.add_argument("train")
    p.add_argument("out")
    p.add_argument("--log", required=True)
    for name, typ in (("seq-len", int), ("batch-size", int), ("steps", int), ("warmup", int), ("seed", int),
                      ("lr", float), ("final-lr-fraction", float), ("weight-decay", float), ("grad-clip", float),
                      ("beta1", float), ("beta2", float), ("eps", float)):
        p.add_argument("--" + name, type=typ, required=True)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    for q in (p,):
        q.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
        q.add_argument("--token-budget", type=int, default=16384, help="padded tokens per sub-batch")
    p = sub.add_parser("eval")
    p.add_argument("base")
    p.add_argument("eval")
    p.add_argument("adapters", nargs="+", help="NAME=DIR (qtrain=..., peft=..., start=...)")
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--qtrain-log")
    p.add_argument("--torch-log")
    p.add_argument("--bound", type=float, default=0.01)
    p.add_argument("--max-pieces", type=int, default=0, help="evaluate only the first N documents (pieces); 0: all")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--token-budget", type=int, default=16384)
    a = ap.parse_args()
    return {"split": cmd_split, "adapter": cmd_adapter, "train": cmd_train, "eval": cmd_eval}[a.cmd](a) or 0


if __name__ == "__main__":
    sys.exit(main())
