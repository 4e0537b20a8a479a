"""qtrain-demo, the console script the wheel installs: tokenize a corpus, train on it, export, report."""

import base64
import json
import subprocess
import sys
from pathlib import Path


def test_the_demo_trains_and_exports(tmp_path: Path):
    lines = [f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)]
    (tmp_path / "bytes.tiktoken").write_text("\n".join(lines) + "\n")
    docs = [f"In the beginning {i} was the word and the word was {i}. " * 30 for i in range(6)]
    (tmp_path / "corpus.txt").write_text("\n\n".join(docs) + "\n")
    demo = Path(sys.executable).parent / "qtrain-demo"
    run = subprocess.run([str(demo), "--text", str(tmp_path / "corpus.txt"), "--tokenizer",
                          str(tmp_path / "bytes.tiktoken"), "--device", "cpu", "--steps", "3",
                          "--out-dir", str(tmp_path / "run")], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "== tokenized 6 documents" in run.stdout
    assert "final eval loss" in run.stdout
    out = tmp_path / "run" / "output"
    assert (out / "model.safetensors").stat().st_size > 0
    assert json.loads((out / "config.json").read_text())["hidden_size"] == 128
    steps = [json.loads(l) for l in (out / "log.jsonl").read_text().splitlines() if '"step"' in l]
    assert len([s for s in steps if s["log"] == "step"]) == 3
