"""The qtrain Python package (issue 23), installed from its wheel into a fresh virtual environment by
scripts/test_python.sh: keywords become `train` flags, validated by the same C++ code (the command
line's messages), a run from Python equals `build/train` with the same options bit for bit, and the
tokenizer encodes as its byte-level rules say."""

import base64
import json
import os
import random
import struct
import subprocess
from pathlib import Path

import pytest

import qtrain

REPO = Path(__file__).resolve().parents[2]
TRAIN_EXE = os.environ.get("QTRAIN_TRAIN_EXE", str(REPO / "build" / "train"))
TINY = REPO / "tests" / "reference" / "tiny-config"


def write_tokens(path: Path, tokens: list[int], vocab: int) -> None:
    """A BIN.TOK v2 file (src/io/token_file.h): a 1024-byte header of int32, then the tokens."""
    header = [0] * 256
    header[0], header[1] = struct.unpack("<ii", b"BIN.TOK\n")
    header[2], header[3], header[4], header[5], header[6] = 2, 4, len(tokens), vocab, 0
    path.write_bytes(struct.pack("<256i", *header) + struct.pack(f"<{len(tokens)}i", *tokens))


def step_losses(log: Path) -> list[float]:
    out = []
    for line in log.read_text().splitlines():
        event = json.loads(line)
        if event.get("log") == "step":
            out.append(event["loss"])
    return out


@pytest.fixture
def data(tmp_path: Path) -> Path:
    # a random 97-token phrase over and over: learnable, so the loss falls within a few steps
    rng = random.Random(7)
    phrase = [rng.randrange(1000) for _ in range(97)]
    path = tmp_path / "train.bin"
    write_tokens(path, (phrase * 420)[:40_000], 1000)
    return path


def test_keywords_become_flags():
    assert qtrain.flags(from_scratch=True, learning_rate=3e-4, eval_file=None, overwrite=False, gpu_ids=[0, 1]) == [
        "--from-scratch", "--learning-rate=0.0003", "--gpu-ids=0,1"]


def test_a_bad_option_raises_the_command_lines_message(tmp_path: Path):
    for bad in ({"zero_level": 4}, {"no_such_flag": 1}, {"checkpoint_dir": ""}):
        with pytest.raises(ValueError) as err:
            qtrain.check_options(**bad)
        cli = subprocess.run([TRAIN_EXE, *qtrain.flags(**bad)], capture_output=True, text=True)
        assert cli.returncode != 0
        message = str(err.value).strip()
        assert message and message in cli.stderr, (bad, message, cli.stderr)


def test_a_run_from_python_equals_the_command_line(tmp_path: Path, data: Path):
    options = dict(model=str(TINY), from_scratch=True, device="cpu", train_file=str(data), seq_len=64,
                   batch_size=2, grad_accumulation=2, steps=6, learning_rate=3e-3, eval_every_n_steps=0,
                   seed=11)
    code = qtrain.train(**options, out_dir=str(tmp_path / "py"), log_file=str(tmp_path / "py.jsonl"))
    assert code == 0
    cli = subprocess.run([TRAIN_EXE, *qtrain.flags(**options, out_dir=str(tmp_path / "cli"),
                                                   log_file=str(tmp_path / "cli.jsonl"))],
                         capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    py, ref = step_losses(tmp_path / "py.jsonl"), step_losses(tmp_path / "cli.jsonl")
    assert len(py) == 6
    assert py == ref  # the same floats as logged
    assert py[-1] < py[0]
    assert (tmp_path / "py" / "model.safetensors").read_bytes() == (tmp_path / "cli" / "model.safetensors").read_bytes()


def test_bad_input_raises_instead_of_ending_the_interpreter(tmp_path: Path):
    with pytest.raises(ValueError, match="train-file"):
        qtrain.train(model=str(TINY), from_scratch=True, device="cpu", train_file=str(tmp_path / "missing.bin"),
                     steps=1, out_dir=str(tmp_path / "o"))


def test_the_tokenizer_encodes_by_its_ranks(tmp_path: Path):
    # a tiktoken file of the 256 single bytes (rank = byte) and one merge, "hi" (rank 256)
    lines = [f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)]
    lines.append(f"{base64.b64encode(b'hi').decode()} 256")
    path = tmp_path / "tiny.tiktoken"
    path.write_text("\n".join(lines) + "\n")
    tok = qtrain.Tokenizer.load(str(path))
    assert tok.encode("hi") == [256]
    assert tok.encode("ha") == [ord("h"), ord("a")]
    text = "hi there, hh"
    assert tok.decode(tok.encode(text)) == text
    assert tok.vocab_size >= 257


def test_the_wheel_ships_type_stubs():
    package = Path(qtrain.__file__).parent
    assert (package / "py.typed").exists()
    stub = (package / "_qtrain.pyi").read_text()
    for name in ("def run_training", "def check_options", "class Tokenizer", "def encode"):
        assert name in stub, name


def test_the_cxx_runtime_is_global_after_import():
    """qtrain/__init__.py promotes libstdc++ to the global scope before its extension loads: loaded
    first in another extension's local scope (numpy's), it made the engine's first call crash on the
    GPU machine. dlsym over the global scope finds the runtime's symbols only when the promotion ran."""
    import ctypes

    assert hasattr(ctypes.CDLL(None), "_ZNSt6locale7classicEv")
