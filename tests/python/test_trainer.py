"""qtrain.Trainer (issue 23): a run driven step by step from Python equals `build/train` with the same
options bit for bit (per-step losses and the exported bytes); a Python learning-rate schedule that
computes the built-in cosine gives the same losses; checkpoints reload and continue bit-identically;
tokens given as numpy arrays equal the data loader's; two ranks in threads mode equal one rank with
twice the accumulation; bad options, files and arrays raise ValueError with the engine's messages."""

import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest

import qtrain
from test_package import TINY, TRAIN_EXE, step_losses, write_tokens

BASE = dict(model=str(TINY), from_scratch=True, device="cpu", seq_len=64, batch_size=2, grad_accumulation=2,
            learning_rate=3e-3, warmup=3, final_lr_fraction=0.1, eval_every_n_steps=0, seed=11, lmhead_chunks=2)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    rng = np.random.default_rng(5)
    phrase = rng.integers(0, 1000, 89).tolist()
    path = tmp_path / "train.bin"
    write_tokens(path, (phrase * 500)[:40_000], 1000)
    return path


def options(tmp_path: Path, data: Path, name: str, **extra):
    return dict(BASE, train_file=str(data), out_dir=str(tmp_path / name), log_file=str(tmp_path / f"{name}.jsonl"),
                checkpoint_dir=str(tmp_path / f"{name}-ckpt"), **extra)


def python_losses(opts: dict, steps: int) -> list:
    with qtrain.Trainer(**opts, steps=steps) as t:
        return [t.step().loss for _ in range(steps)]


def test_twenty_steps_from_python_equal_the_command_line(tmp_path: Path, data: Path):
    opts = options(tmp_path, data, "py", steps=20, eval_file=str(data), eval_num_steps=2, eval_every_n_steps=10)
    events = []
    with qtrain.Trainer(**opts, callback=events.append) as t:
        assert t.next_step == 0 and t.steps == 20 and t.rows_per_step == 4 and t.world == 1
        results = [t.step() for _ in range(5)]
        while t.next_step < t.steps:
            results.append(t.step())
        assert t._session.finish() == 0
    cli_opts = options(tmp_path, data, "cli", steps=20, eval_file=str(data), eval_num_steps=2, eval_every_n_steps=10)
    cli = subprocess.run([TRAIN_EXE, *qtrain.flags(**cli_opts)], capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    ref = step_losses(tmp_path / "cli.jsonl")
    assert len(ref) == 20
    assert [r.loss for r in results] == ref  # the same floats, step by step
    assert step_losses(tmp_path / "py.jsonl") == ref
    assert ref[-1] < ref[0]
    assert all(r.tokens == 4 * 64 and r.tokens_per_s > 0 and r.applied for r in results)
    assert [r.step for r in results] == list(range(20))
    assert [r.evaluated for r in results].count(True) == 2
    assert (tmp_path / "py" / "model.safetensors").read_bytes() == (tmp_path / "cli" / "model.safetensors").read_bytes()
    # the callback saw every JSONL event as it was written
    logged = [json.loads(line) for line in (tmp_path / "py.jsonl").read_text().splitlines()]
    assert events == logged
    assert [e["log"] for e in events].count("step") == 20


def builtin_cosine(step: int, peak: float, fraction: float, warmup: int, total: int) -> float:
    """train/lr_schedule.cpp's cosine, in double from the float flags, rounded to float32 as the engine does."""
    peak = float(np.float32(peak))
    final = peak * float(np.float32(fraction))
    if step < warmup:
        return float(np.float32(peak * (step + 1) / warmup))
    pos = min(max((step - warmup) / (total - warmup), 0.0), 1.0)
    return float(np.float32(final + (peak - final) * (0.5 * (1.0 + math.cos(math.pi * pos)))))


def test_a_python_schedule_equal_to_the_builtin_cosine_gives_the_same_losses(tmp_path: Path, data: Path):
    steps = 12
    builtin = python_losses(options(tmp_path, data, "a"), steps)
    with qtrain.Trainer(**options(tmp_path, data, "b"), steps=steps) as t:
        scheduled = [t.step(lr=builtin_cosine(s, 3e-3, 0.1, 3, steps)) for s in range(steps)]
    assert [r.loss for r in scheduled] == builtin
    # and the learning rate is really taken from Python: another schedule gives other losses
    with qtrain.Trainer(**options(tmp_path, data, "c"), steps=steps) as t:
        other = [t.step(lr=1e-3).loss for _ in range(steps)]
    assert other[1:] != builtin[1:]
    assert scheduled[5].lr == builtin_cosine(5, 3e-3, 0.1, 3, steps)


def test_a_checkpoint_reloads_and_continues_bit_identically(tmp_path: Path, data: Path):
    straight = python_losses(options(tmp_path, data, "straight"), 10)
    first = options(tmp_path, data, "first")
    with qtrain.Trainer(**first, steps=10) as t:
        head = [t.step().loss for _ in range(4)]
        ckpt = t.save_checkpoint()
    assert Path(ckpt).name == "step_00000004"
    # a new session of the same run (another out_dir and checkpoint_dir: only the state matters)
    with qtrain.Trainer(**options(tmp_path, data, "second"), steps=10) as t:
        t.load_checkpoint(ckpt)
        assert t.next_step == 4
        tail = [t.step().loss for _ in range(6)]
    assert head + tail == straight


def test_a_checkpoint_of_another_run_is_refused(tmp_path: Path, data: Path):
    with qtrain.Trainer(**options(tmp_path, data, "one"), steps=4) as t:
        t.step()
        ckpt = t.save_checkpoint()
    with qtrain.Trainer(**dict(options(tmp_path, data, "two"), seed=12), steps=4) as t:
        with pytest.raises(ValueError, match="seed"):
            t.load_checkpoint(ckpt)
    with qtrain.Trainer(**options(tmp_path, data, "three"), steps=4) as t:
        with pytest.raises(ValueError, match="not a directory"):
            t.load_checkpoint(str(tmp_path / "nothing"))


def test_the_export_loads_back(tmp_path: Path, data: Path):
    with qtrain.Trainer(**options(tmp_path, data, "src"), steps=3) as t:
        for _ in range(3):
            t.step()
        t.export(str(tmp_path / "exported"))
        trained = t.parameters()
    with qtrain.Trainer(**dict(options(tmp_path, data, "dst"), from_scratch=False, model=str(tmp_path / "exported")),
                        steps=1) as t:
        assert t.parameter_names() == list(trained)
        for name, value in trained.items():
            assert np.array_equal(t.parameter(name), value), name


def test_tokens_from_numpy_equal_the_data_loaders(tmp_path: Path, data: Path):
    steps = 4
    from_files = python_losses(options(tmp_path, data, "files"), steps)
    loader = qtrain.DataLoader(str(data), batch_size=2, seq_len=64, seed=11, shuffle=True, vocab_size=1000)
    opts = options(tmp_path, data, "arrays")
    del opts["train_file"]  # every step gets its tokens
    with qtrain.Trainer(**opts, steps=steps) as t:
        losses = []
        for _ in range(steps):
            batches = [loader.next_batch() for _ in range(2)]  # grad_accumulation micro-batches
            inputs = np.concatenate([b[0] for b in batches])
            targets = np.concatenate([b[1] for b in batches])
            assert inputs.shape == (t.rows_per_step, 64) and inputs.dtype == np.int32
            losses.append(t.step(inputs, targets).loss)
        with pytest.raises(ValueError, match="rows"):
            t.step(inputs[:2], targets[:2])
        bad = inputs.copy()
        bad[0, 3] = 1000
        with pytest.raises(ValueError, match=r"inputs\[0, 3\] = 1000 is outside \[0, 1000\)"):
            t.step(bad, targets)
        with pytest.raises(ValueError, match="no --train-file"):
            t.step()
        # tokens=[rows, seq_len + 1] is the shifted form of the same
        tokens = np.concatenate([inputs, targets[:, -1:]], axis=1)
        assert np.array_equal(tokens[:, 1:], targets)
    assert losses == from_files


def test_parameters_and_gradients_read_as_numpy(tmp_path: Path, data: Path):
    with qtrain.Trainer(**options(tmp_path, data, "tensors"), steps=3) as t:
        name = "model.layers.1.mlp.down_proj.weight"
        before = t.parameter(name)
        assert before.shape == (256, 512) and before.dtype == np.float32
        assert not np.any(t.gradient(name))  # nothing accumulated yet
        t.step()
        after = t.parameter(name)
        assert not np.array_equal(before, after)
        assert not np.any(t.gradient(name))  # the step cleared it
        assert t.parameter("model.embed_tokens.weight").shape == (1000, 256)
        with pytest.raises(ValueError, match="no parameter named"):
            t.parameter("model.nope")


def test_two_ranks_in_threads_mode_equal_one_rank_with_twice_the_accumulation(tmp_path: Path, data: Path):
    one = python_losses(options(tmp_path, data, "one"), 6)
    with qtrain.Trainer(**dict(options(tmp_path, data, "two"), gpus=2, grad_accumulation=1), steps=6) as t:
        assert t.world == 2 and t.rows_per_step == 4
        two = [t.step().loss for _ in range(6)]
    assert two == pytest.approx(one, rel=1e-5)


def test_memory_plan(tmp_path: Path, data: Path):
    plan = qtrain.memory_plan(**options(tmp_path, data, "plan"))
    assert plan["total_device_bytes"] > 0
    assert {e["category"] for e in plan["entries"]} >= {"Weights", "Gradients"}
    with qtrain.Trainer(**options(tmp_path, data, "plan2"), steps=1) as t:
        mine = t.memory_plan()
        assert mine["entries"] == plan["entries"] and mine["total_device_bytes"] == plan["total_device_bytes"]
    # a plan over the limit raises with the numbers, as the command line does
    with pytest.raises(ValueError, match="memory-limit"):
        qtrain.memory_plan(**options(tmp_path, data, "plan3"), memory_limit="1MiB")


def test_bad_options_and_files_raise(tmp_path: Path, data: Path):
    with pytest.raises(ValueError, match="--train-file"):
        qtrain.Trainer(**dict(options(tmp_path, data, "x"), train_file=str(tmp_path / "missing.bin")))
    with pytest.raises(ValueError, match="zero-level"):
        qtrain.Trainer(**options(tmp_path, data, "y"), zero_level=7)
    # a failing callback's exception reaches the caller
    def broken(event):
        raise RuntimeError("callback broke")
    with pytest.raises(RuntimeError, match="callback broke"):
        qtrain.Trainer(**options(tmp_path, data, "z"), callback=broken)


def test_tokenize_and_the_data_loader(tmp_path: Path):
    import base64
    lines = [f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)]
    (tmp_path / "t.tiktoken").write_text("\n".join(lines) + "\n")
    ids = qtrain.tokenize(["ab" * 100, "cd" * 100], str(tmp_path / "t.tiktoken"), out=str(tmp_path / "t.bin"),
                          vocab_size=300, eos=None)
    assert ids.tolist() == [ord("a"), ord("b")] * 100 + [ord("c"), ord("d")] * 100
    loader = qtrain.DataLoader(str(tmp_path / "t.bin"), batch_size=2, seq_len=9, shuffle=False, vocab_size=300)
    inputs, targets = loader.next_batch()
    assert inputs.shape == (2, 9)
    assert inputs[0].tolist() == ids[:9].tolist() and targets[0].tolist() == ids[1:10].tolist()
    with pytest.raises(ValueError, match="not a token"):
        qtrain.tokenize("x", str(tmp_path / "t.tiktoken"), eos="<|no such token|>")
    # Qwen's tokenizer (added tokens after the ranks): no BOS, <|endoftext|> by default
    tok = qtrain.Tokenizer.load(str(tmp_path / "t.tiktoken"))
    assert tok.bos_id is None and tok.end_of_text == "<|endoftext|>"
    assert qtrain.tokenize(["ab"], tok).tolist() == [ord("a"), ord("b"), tok.token_id("<|endoftext|>")]


def test_tokenize_puts_llama3s_bos_before_each_document(tmp_path: Path):
    """A tokenizer.json in Llama 3's format: its post-processor puts <|begin_of_text|> before each
    sequence, so tokenize() does, and ends documents with <|end_of_text|>."""
    byte = {}
    n = 0
    for b in range(256):  # GPT-2's byte-level spelling
        printable = 33 <= b <= 126 or 161 <= b <= 172 or b >= 174
        byte[b] = chr(b) if printable else chr(256 + n)
        n += 0 if printable else 1
    vocab = {byte[b]: b for b in range(256)}
    names = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    added = [{"id": 256 + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, c in enumerate(names)]
    regex = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
             r"\s*[\r\n]+|\s+(?!\S)|\s+")
    bos = {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}
    j = {"version": "1.0", "added_tokens": added, "normalizer": None,
         "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
             {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
             {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
         "post_processor": {"type": "TemplateProcessing", "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
                            "pair": [], "special_tokens": {"<|begin_of_text|>": {
                                "id": "<|begin_of_text|>", "ids": [256], "tokens": ["<|begin_of_text|>"]}}},
         "decoder": None,
         "model": {"type": "BPE", "ignore_merges": True, "vocab": vocab, "merges": []}}
    (tmp_path / "tokenizer.json").write_text(json.dumps(j))
    tok = qtrain.Tokenizer.load(str(tmp_path / "tokenizer.json"))
    assert tok.bos_id == 256 and tok.end_of_text == "<|end_of_text|>"
    assert qtrain.tokenize(["ab", "c"], tok).tolist() == [256, ord("a"), ord("b"), 257, 256, ord("c"), 257]
    assert qtrain.tokenize("ab", tok, bos=None, eos="<|eot_id|>").tolist() == [ord("a"), ord("b"), 258]
    with pytest.raises(ValueError, match=r"^bos: '<\|nope\|>' is not a token"):
        qtrain.tokenize("x", tok, bos="<|nope|>")


def test_the_options_come_from_the_engines_table():
    table = qtrain.describe_options()
    by_keyword = {o["keyword"]: o for o in table}
    assert by_keyword["learning_rate"]["flag"] == "learning-rate" and by_keyword["learning_rate"]["type"] == "float"
    assert by_keyword["continue_from_checkpoint"]["flag"] == "continue"
    assert qtrain.flags(continue_from_checkpoint=True, batch_size=3) == ["--continue", "--batch-size=3"]
    assert "cosine" in by_keyword["lr_schedule"]["default"]


def test_ctrl_c_stops_after_the_step_with_a_checkpoint(tmp_path: Path, data: Path):
    """SIGINT while Trainer.run() trains: the current step finishes, a checkpoint is written, and
    KeyboardInterrupt reaches the caller; the checkpoint then resumes."""
    import signal
    import sys

    opts = options(tmp_path, data, "sig", steps=400)
    script = tmp_path / "run.py"
    script.write_text(
        "import json, sys, qtrain\n"
        f"opts = json.loads({json.dumps(json.dumps(opts))})\n"
        "try:\n"
        "    qtrain.Trainer(**opts).run()\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', flush=True)\n"
        "    sys.exit(3)\n")
    # SIGINT back to its default in the child: a test run started in the background (nohup, `&` in a
    # script) inherits SIGINT ignored, and Python then never turns it into KeyboardInterrupt.
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    log = tmp_path / "sig.jsonl"
    import time
    deadline = time.time() + 120
    while time.time() < deadline and (not log.exists() or step_losses(log).__len__() < 3):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3 and "interrupted" in out, out[-2000:] + err[-2000:]
    done = len(step_losses(log))
    assert 3 <= done < 400
    ckpts = sorted((tmp_path / "sig-ckpt").glob("step_*"))
    assert [c.name for c in ckpts] == [f"step_{done:08d}"]
    with qtrain.Trainer(**dict(opts, out_dir=str(tmp_path / "sig2"), log_file=str(tmp_path / "sig2.jsonl"),
                               checkpoint_dir=str(tmp_path / "sig2-ckpt"))) as t:
        t.load_checkpoint(str(ckpts[0]))
        assert t.next_step == done
