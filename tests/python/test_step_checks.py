"""Issue 29: what Python hands the engine is checked as the command line checks its flags, before any
conversion. Trainer.step's token arrays: an integer dtype (floats and bools were truncated / made 0
and 1 and trained on), the shape [rows, seq_len + 1] or [rows, seq_len] (a wrong one raised a bare
IndexError), every id in [0, vocab_size) in the array's own dtype (int64 ids beyond int32 wrapped and
trained on other ids); its lr finite and >= 0 (-1 trained by gradient ascent, inf ruined the weights).
The same for write_tokens and DataLoader's sizes, and a closed Trainer's properties (they crashed).
Valid arrays of any integer dtype train bit-identically to int32 ones, as before."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import qtrain
from test_package import TINY, write_tokens

BASE = dict(model=str(TINY), from_scratch=True, device="cpu", seq_len=64, batch_size=2, grad_accumulation=2,
            learning_rate=3e-3, warmup=3, eval_every_n_steps=0, seed=11, lmhead_chunks=2, steps=10)
ROWS, COLS = 4, 65  # grad_accumulation x ranks x batch_size = 2 x 1 x 2 rows of seq_len + 1 tokens
SHAPE = r"\[rows, seq_len \+ 1\] = \[4, 65\] \(rows = grad_accumulation x ranks x batch_size = 2 x 1 x 2\)"


@pytest.fixture
def opts(tmp_path: Path) -> dict:
    return dict(BASE, out_dir=str(tmp_path / "out"), log_file=str(tmp_path / "log.jsonl"),
                checkpoint_dir=str(tmp_path / "ckpt"))


def batch(seed: int = 3) -> np.ndarray:
    """A step's tokens, int64 (numpy's default integer), all in [0, 1000)."""
    return np.random.default_rng(seed).integers(0, 1000, (ROWS, COLS))


def run_python(code: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter: a crash (as before these checks) fails its test, not the session."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_int64_ids_beyond_int32_are_refused_not_wrapped(opts: dict):
    with qtrain.Trainer(**opts) as t:
        tokens = batch()
        tokens[1, 5] = 2**32 + 7  # was cast to int32 first: id 7, and trained on
        with pytest.raises(ValueError, match=r"^step\(\): tokens\[1, 5\] = 4294967303 is outside \[0, 1000\) "
                                             r"\(the model's vocab_size\)$"):
            t.step(tokens=tokens)
        inputs, targets = batch()[:, :-1], batch()[:, 1:]
        masked = targets.copy()
        masked[2, 9] = -(2**32) - 1  # wrapped to -1: silently "no loss"
        with pytest.raises(ValueError, match=r"targets\[2, 9\] = -4294967297 is outside \[-1, 1000\)"):
            t.step(inputs, masked)
        huge = targets.astype(np.uint64)
        huge[0, 0] = 2**64 - 1  # also wrapped to -1
        with pytest.raises(ValueError, match=r"targets\[0, 0\] = 18446744073709551615 is outside \[-1, 1000\)"):
            t.step(inputs, huge)
        assert t.next_step == 0  # nothing trained


def test_ids_outside_the_vocabulary_name_their_position(opts: dict):
    with qtrain.Trainer(**opts) as t:
        inputs, targets = batch()[:, :-1], batch()[:, 1:]
        bad = inputs.copy()
        bad[2, 0] = -1  # -1 is a target's "no loss", never an input
        with pytest.raises(ValueError, match=r"^step\(\): inputs\[2, 0\] = -1 is outside \[0, 1000\) \(the model's vocab_size\)$"):
            t.step(bad, targets)
        bad = targets.copy()
        bad[3, 63] = -2
        with pytest.raises(ValueError, match=r"targets\[3, 63\] = -2 is outside \[-1, 1000\) \(the model's vocab_size; -1 = no loss\)"):
            t.step(inputs, bad)
        tokens = batch()
        tokens[0, 64] = 1000
        with pytest.raises(ValueError, match=r"tokens\[0, 64\] = 1000 is outside \[-1, 1000\)"):
            t.step(tokens=tokens)
        tokens = batch()
        tokens[3, 10] = -1  # an input too: only the last column is a target alone
        with pytest.raises(ValueError, match=r"tokens\[3, 10\] = -1 is outside \[0, 1000\)"):
            t.step(tokens=tokens)
        assert t.next_step == 0


def test_float_tokens_are_refused_not_truncated(opts: dict):
    with qtrain.Trainer(**opts) as t:
        with pytest.raises(TypeError, match=r"^step\(\): tokens must be an array of integer token ids, got dtype "
                                            r"float64 \(ids are never rounded or truncated"):
            t.step(tokens=batch() + 0.5)
        with pytest.raises(TypeError, match=r"got dtype float64"):
            t.step(tokens=batch().astype(np.float64))  # whole numbers too: the dtype decides
        with pytest.raises(TypeError, match=r"step\(\): inputs must be .* got dtype float32"):
            t.step(batch()[:, :-1].astype(np.float32), batch()[:, 1:])
        with pytest.raises(TypeError, match=r"step\(\): targets must be .* got dtype float16"):
            t.step(batch()[:, :-1], batch()[:, 1:].astype(np.float16))
        assert t.next_step == 0


def test_bool_tokens_are_refused(opts: dict):
    with qtrain.Trainer(**opts) as t:
        with pytest.raises(TypeError, match=r"^step\(\): tokens must be an array of integer token ids, got dtype bool"):
            t.step(tokens=batch() > 500)
        assert t.next_step == 0


def test_wrong_shapes_raise_value_errors_that_say_the_shape(opts: dict):
    with qtrain.Trainer(**opts) as t:
        tokens = batch()
        for bad, got in ((tokens.ravel(), r"\[260\]"),             # 1-D: was a bare IndexError
                         (tokens[None], r"\[1, 4, 65\]"),          # 3-D: was nanobind's TypeError
                         (np.int64(5), r"\[\]"),                   # a scalar: IndexError
                         (tokens[:, :64], r"\[4, 64\]"),           # seq_len columns, not seq_len + 1
                         (tokens[:2], r"\[2, 65\]")):              # rows of one micro-batch only
            with pytest.raises(ValueError, match=rf"^step\(\): tokens must have shape {SHAPE}, got shape {got}$"):
                t.step(tokens=bad)
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        with pytest.raises(ValueError, match=r"^step\(\): targets must have shape \[rows, seq_len\] = \[4, 64\] .* "
                                             r"got shape \[4, 65\]$"):
            t.step(inputs, tokens)
        with pytest.raises(ValueError, match=r"give tokens=, or inputs and targets, not both"):
            t.step(inputs, targets, tokens=tokens)  # (tokens won silently)
        with pytest.raises(ValueError, match=r"give both inputs and targets"):
            t.step(inputs)
        assert t.next_step == 0


@pytest.mark.parametrize("lr, text", [(-1.0, "-1"), (-1e-9, "-1e-09"), (float("inf"), "inf"), (float("-inf"), "-inf"),
                                      (float("nan"), "nan")])
def test_a_bad_learning_rate_is_refused_and_the_run_goes_on(opts: dict, lr: float, text: str):
    with qtrain.Trainer(**opts) as t:
        tokens = batch()
        with pytest.raises(ValueError, match=rf"^step\(\): lr must be a finite number >= 0 \(as --learning-rate\), "
                                             rf"got {text}$"):
            t.step(tokens=tokens, lr=lr)
        assert t.next_step == 0
        r = t.step(tokens=tokens, lr=1e-3)  # the session is still open, and its weights untouched
        assert r.applied and r.step == 0 and np.isfinite(r.loss)
        assert t.step(tokens=tokens, lr=0.0).lr == 0.0  # 0 is a learning rate (as --learning-rate=0)


def test_valid_integer_arrays_of_any_dtype_train_bit_identically(tmp_path: Path, opts: dict):
    """int32 was always taken as it is; int64 (numpy's default), unsigned and nested lists train to the
    same bits (losses and weights), and targets keep their -1 (no loss) in every form."""
    steps = [batch(s) for s in range(3)]
    for b in steps:
        b[1, 7:20] = 999  # the top id of the vocabulary
        b[2, 0] = 0
    masked_targets = [b[:, 1:].copy() for b in steps]
    for m in masked_targets:
        m[0, :30] = -1

    def train(name: str, form) -> tuple:
        with qtrain.Trainer(**dict(opts, out_dir=str(tmp_path / name), log_file=str(tmp_path / f"{name}.jsonl"))) as t:
            losses = [form(t, i).loss for i in range(len(steps))]
            return losses, t.parameters()

    ref_losses, ref_weights = train("int32", lambda t, i: t.step(tokens=steps[i].astype(np.int32)))
    assert ref_losses[-1] != ref_losses[0]
    for name, form in (("int64", lambda t, i: t.step(tokens=steps[i])),
                       ("uint16", lambda t, i: t.step(tokens=steps[i].astype(np.uint16))),
                       ("list", lambda t, i: t.step(tokens=steps[i].tolist())),
                       ("fortran", lambda t, i: t.step(tokens=np.asfortranarray(steps[i])))):
        losses, weights = train(name, form)
        assert losses == ref_losses, name
        assert all(np.array_equal(weights[k], ref_weights[k]) for k in ref_weights), name

    # inputs and targets, targets -1 where there is no loss: int64 = int32 (and != unmasked)
    masked32, _ = train("m32", lambda t, i: t.step(steps[i][:, :-1].astype(np.int32), masked_targets[i].astype(np.int32)))
    masked64, _ = train("m64", lambda t, i: t.step(steps[i][:, :-1], masked_targets[i]))
    assert masked64 == masked32 and masked32 != ref_losses
    # a -1 in tokens' last column (a target only) is "no loss" too, as it always was
    last = [b.copy() for b in steps]
    for b in last:
        b[:, -1] = -1
    assert train("last", lambda t, i: t.step(tokens=last[i]))[0][0] != ref_losses[0]


def test_write_tokens_checks_before_converting(tmp_path: Path):
    path = tmp_path / "t.bin"
    with pytest.raises(ValueError, match=r"^write_tokens\(\): tokens\[1\] = 4294967303 is outside \[0, 1000\) "
                                         r"\(the file's vocab_size\)$"):
        qtrain.write_tokens(str(path), np.array([1, 2**32 + 7, 3]), 1000)  # was written as 7
    with pytest.raises(TypeError, match=r"^write_tokens\(\): tokens must be .* got dtype float64"):
        qtrain.write_tokens(str(path), np.array([1.7, 2.2]), 1000)  # was written as 1, 2
    with pytest.raises(TypeError, match=r"got dtype bool"):
        qtrain.write_tokens(str(path), np.array([True, False]), 1000)
    with pytest.raises(ValueError, match=r"tokens\[0\] = -5 is outside \[0, 2147483648\) \(int32; vocab_size 0 = unknown\)"):
        qtrain.write_tokens(str(path), np.array([-5, 2]), 0)  # was written, and refused by train later
    with pytest.raises(ValueError, match=r"tokens must have shape \[n\] \(1-D\), got shape \[1, 2\]"):
        qtrain.write_tokens(str(path), np.array([[1, 2]]), 1000)
    with pytest.raises(TypeError, match=r"vocab_size must be an integer, got 1000.5"):
        qtrain.write_tokens(str(path), np.array([1, 2]), 1000.5)
    assert not path.exists()
    # valid ids of any integer dtype write the same bytes as int32 (and as the tests' own writer)
    ids = [0, 5, 999, 17, 999]
    write_tokens(tmp_path / "ref.bin", ids, 1000)
    for i, value in enumerate((np.array(ids, np.int32), np.array(ids), np.array(ids, np.uint16), ids,
                               np.repeat(ids, 2)[::2])):  # the last: strided, not contiguous
        qtrain.write_tokens(str(tmp_path / f"{i}.bin"), value, 1000)
        assert (tmp_path / f"{i}.bin").read_bytes() == (tmp_path / "ref.bin").read_bytes(), i


def test_data_loader_sizes_are_checked(tmp_path: Path):
    path = tmp_path / "t.bin"
    write_tokens(path, list(range(1000)) * 3, 1000)
    # (in a fresh interpreter: seq_len=0 used to end it with SIGFPE)
    for args, message in (("batch_size=0, seq_len=8", "DataLoader: batch_size must be positive, got 0"),
                          ("batch_size=-1, seq_len=8", "DataLoader: batch_size must be positive, got -1"),
                          ("batch_size=2, seq_len=0", "DataLoader: seq_len must be positive, got 0"),
                          ("batch_size=2, seq_len=-3", "DataLoader: seq_len must be positive, got -3")):
        r = run_python("import qtrain\n"
                       "try:\n"
                       f"    qtrain.DataLoader({str(path)!r}, {args}, vocab_size=1000)\n"
                       "except ValueError as e:\n"
                       "    print('ValueError:', e)\n")
        assert r.returncode == 0 and r.stdout.strip() == f"ValueError: {message}", (args, r.returncode, r.stdout, r.stderr)
    inputs, targets = qtrain.DataLoader(str(path), batch_size=1, seq_len=1, shuffle=False, vocab_size=1000).next_batch()
    assert inputs.tolist() == [[0]] and targets.tolist() == [[1]]  # the smallest sizes still load


def test_a_closed_trainer_raises_instead_of_crashing(tmp_path: Path):
    opts = dict(BASE, out_dir=str(tmp_path / "o"), log_file=str(tmp_path / "l.jsonl"))
    r = run_python("import qtrain\n"
                   f"t = qtrain.Trainer(**{opts!r})\n"
                   "t.close()\n"
                   "for name in ('next_step', 'steps', 'world', 'device', 'rows_per_step', 'seq_len', 'vocab_size',\n"
                   "             'options', 'memory_plan', 'parameter_names', 'step', 'evaluate'):\n"
                   "    try:\n"
                   "        value = getattr(t, name)\n"
                   "        value() if callable(value) else None\n"
                   "        print('closed:', name, 'no error')\n"
                   "    except ValueError as e:\n"
                   "        print('closed:', name, e)\n")
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr[-2000:])  # (was a segmentation fault)
    lines = [line for line in r.stdout.splitlines() if line.startswith("closed: ")]  # (not the run's own lines)
    assert len(lines) == 12 and all(line.endswith(" the Trainer is closed") for line in lines), lines


def test_data_loader_packs_documents_as_train_does(tmp_path: Path):
    """document_masking=True: documents of 5, 3 and 7 tokens in rows of 8 slots are [5 3] and [7 + 1 of
    padding]; positions restart at each document, a document's last target and the padding are -1, and
    the mask's 0 bits are -1 too. packing='one-per-row' gives each document its own row."""
    path = tmp_path / "docs.bin"
    tokens = np.arange(10, 25, dtype=np.int32)
    mask = np.ones(15, dtype=np.uint8)
    mask[1] = 0  # token 11 is not trained: the target that predicts it is -1
    qtrain._qtrain.write_token_file(str(path), tokens, 100, mask, [0, 5, 8])
    loader = qtrain.DataLoader(str(path), batch_size=2, seq_len=8, shuffle=False, vocab_size=100, document_masking=True,
                               eos_token_id=99)
    inputs, targets, positions = loader.next_batch()
    assert inputs.tolist() == [[10, 11, 12, 13, 14, 15, 16, 17], [18, 19, 20, 21, 22, 23, 24, 99]]
    assert targets.tolist() == [[-1, 12, 13, 14, -1, 16, 17, -1], [19, 20, 21, 22, 23, 24, -1, -1]]
    assert positions.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2], [0, 1, 2, 3, 4, 5, 6, 0]]
    assert loader.fill_rate == 15 / 16
    one = qtrain.DataLoader(str(path), batch_size=3, seq_len=8, shuffle=False, vocab_size=100, document_masking=True,
                            packing="one-per-row")
    _, _, positions = one.next_batch()
    assert positions.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2], [0, 1, 2, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5, 6, 0]]
    assert len(qtrain.DataLoader(str(path), batch_size=1, seq_len=8, shuffle=False, vocab_size=100).next_batch()) == 2
