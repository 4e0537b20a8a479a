"""GPU checks of the Python Trainer beyond bench/python_vs_cli.py (run on the GPU machine with a CUDA
wheel): numpy tokens equal the data loader's bit for bit, parameters and gradients read back as numpy,
and two threads-mode ranks on one GPU (copy-engine communicator) equal one rank with twice the
accumulation to rounding, ZeRO-1 and ZeRO-3 bit-identical to each other.
    python3 bench/python_gpu_checks.py --tokens random.bin"""

import argparse
import sys

import numpy as np  # first, on purpose: qtrain/__init__.py's libstdc++ promotion is what makes this work

import qtrain


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--work", default="/tmp/pygpu")
    a = ap.parse_args()
    base = dict(model="Qwen2.5-0.5B", from_scratch=True, device="cuda", train_file=a.tokens, seq_len=512,
                batch_size=4, grad_accumulation=2, steps=8, eval_every_n_steps=0, learning_rate=3e-4, warmup=2,
                overwrite=True, matmul_dtype="e4m3", gradient_dtype="e5m2")

    def opts(tag, **kw):
        return dict(base, out_dir=f"{a.work}/{tag}", checkpoint_dir=f"{a.work}/{tag}-ckpt",
                    log_file=f"{a.work}/{tag}.jsonl", **kw)

    ok = True
    with qtrain.Trainer(**opts("loader")) as t:
        name = "model.layers.3.mlp.down_proj.weight"
        w0 = t.parameter(name)
        ref = [t.step().loss for _ in range(8)]
        moved = float(np.abs(t.parameter(name) - w0).max())
        zero_grad = not np.any(t.gradient(name))
    loader = qtrain.DataLoader(a.tokens, batch_size=4, seq_len=512, seed=42, vocab_size=151936)
    arrays_opts = opts("arrays")
    del arrays_opts["train_file"]
    with qtrain.Trainer(**arrays_opts) as t:
        arr = []
        for _ in range(8):
            b = [loader.next_batch() for _ in range(2)]
            arr.append(t.step(np.concatenate([x[0] for x in b]), np.concatenate([x[1] for x in b])).loss)
    print(f"numpy tokens vs data loader: {'bit-identical' if arr == ref else 'DIFFER'} ({ref[-1]:.6f} / {arr[-1]:.6f}); "
          f"{name} {w0.shape} {w0.dtype} moved by up to {moved:.3g}; gradient zero after the step: {zero_grad}")
    ok = ok and arr == ref and moved > 0 and zero_grad
    ranks = {}
    for z in (1, 3):
        with qtrain.Trainer(**opts(f"z{z}", gpus=2, gpu_ids="0,0", memcpy_all_gather=True, zero_level=z,
                                   grad_accumulation=1)) as t:
            assert t.world == 2
            ranks[z] = [t.step().loss for _ in range(8)]
    rel = max(abs(x - y) / abs(y) for x, y in zip(ranks[1], ref))
    print(f"2 ranks on one GPU (copy engines): ZeRO-1 vs ZeRO-3 {'bit-identical' if ranks[1] == ranks[3] else 'DIFFER'}; "
          f"vs 1 rank x 2 accumulation: worst relative loss difference {rel:.2e} over 8 steps")
    ok = ok and ranks[1] == ranks[3] and rel < 1e-2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
