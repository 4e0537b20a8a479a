"""The Weights & Biases export (python/qtrain/wandb_logging.py, scripts/export_wandb.py), offline: no
account, no network. `build/train` trains the tiny CPU model for 10 steps with evaluations and
checkpoints, the log is exported to an offline run (WANDB_MODE=offline, the run directory under
tmp_path), and the run's records (wandb/offline-run-*/run-*.wandb) are read back and compared with the
log: every step's loss, grad norm and learning rate, every eval loss, the options in the config.
Then the same for a log that holds a resumed run appended (a --force-resume with another learning
rate, so the repeated steps differ) and for the logger used as a live callback in this process."""

import json
import os
import random
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import wandb
from wandb.proto import wandb_internal_pb2

import qtrain.wandb_logging as wl

from test_package import REPO, TINY, TRAIN_EXE, write_tokens  # the token-file writer and paths, shared
EXPORT = REPO / "scripts" / "export_wandb.py"


def events(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


# -- reading an offline run back --------------------------------------------------------------
# A .wandb file is a LevelDB-style log (what wandb's own datastore wrote; wandb 0.31 has no Python
# reader of it any more): a 7-byte header (":W&B", 0xBEE1, version), then 32 KiB blocks of chunks,
# each with a 7-byte header (CRC-32 of type + data, length, type: 1 full, 2 first, 3 middle, 4 last);
# a block's tail shorter than a header is padding. Each record is a wandb_internal_pb2.Record.

BLOCK = 32768


def wandb_records(path: Path) -> list:
    data = path.read_bytes()
    assert data[:4] == b":W&B" and data[4:6] == b"\xe1\xbe", data[:7]
    records, pos, pending = [], 7, b""
    while True:
        if BLOCK - pos % BLOCK < 7:
            pos += BLOCK - pos % BLOCK
        if pos + 7 > len(data):
            break
        crc, length, kind = struct.unpack_from("<IHB", data, pos)
        chunk = data[pos + 7:pos + 7 + length]
        assert len(chunk) == length and zlib.crc32(chunk, zlib.crc32(bytes([kind]))) == crc, (path, pos)
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending + chunk)
            records.append(record)
            pending = b""
        elif kind in (2, 3):
            pending += chunk
        else:
            raise AssertionError(f"{path}: chunk type {kind} at {pos}")
    return records


def item_key(item) -> str:
    return item.key or "/".join(item.nested_key)


def read_offline_run(wandb_dir: Path) -> dict:
    """The one offline run under wandb_dir: its history rows by _step, config, summary and exit code."""
    files = list((wandb_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, files
    history, config, summary, exit_code = {}, {}, {}, None
    for record in wandb_records(files[0]):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = {item_key(i): json.loads(i.value_json) for i in record.history.item}
            assert row["_step"] not in history, row  # one row per step
            history[row["_step"]] = row
        elif kind in ("run", "config"):
            for u in (record.run.config if kind == "run" else record.config).update:
                config[item_key(u)] = json.loads(u.value_json)
        elif kind == "summary":
            for u in record.summary.update:
                summary[item_key(u)] = json.loads(u.value_json)
        elif kind == "exit":
            exit_code = record.exit.exit_code
    return {"history": history, "config": config, "summary": summary, "exit_code": exit_code,
            "dir": files[0].parent}


@pytest.fixture(autouse=True)
def wandb_home(tmp_path: Path, monkeypatch) -> None:
    """wandb's own directories (cache, artifact staging, settings) in tmp_path, not in $HOME; no key."""
    for var, sub in (("WANDB_CACHE_DIR", "cache"), ("WANDB_DATA_DIR", "data"), ("WANDB_CONFIG_DIR", "config")):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / sub))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")


def export(log: Path, wandb_dir: Path, *extra: str, script: Path = EXPORT) -> dict:
    """scripts/export_wandb.py to an offline run; the run read back, and the module the script used."""
    env = dict(os.environ, WANDB_MODE="offline", WANDB_DIR=str(wandb_dir))
    out = subprocess.run([sys.executable, str(script), "--log-file", str(log), "--project", "qtrain-test",
                          "--mode", "offline", *extra], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    run = read_offline_run(wandb_dir)
    run["module"] = Path(next(line for line in out.stdout.splitlines() if line.startswith("with "))[5:])
    return run


# -- what the history must be ----------------------------------------------------------------


def expected_history(log_events: list[dict]) -> tuple[dict, dict]:
    """{completed steps: step event} and {step: eval event}, a later line of a step replacing an
    earlier one (a resumed run appends to the log and repeats the steps after its checkpoint)."""
    steps, evals = {}, {}
    for e in log_events:
        if e["log"] == "step":
            steps[e["step"] + 1] = e  # "step" is the step's 0-based index; wandb's counts completed steps
        elif e["log"] == "eval":
            evals[e["step"]] = e
    return steps, evals


def assert_history_is_the_log(run: dict, steps: dict, evals: dict) -> None:
    history = run["history"]
    assert set(history) == set(steps) | set(evals)
    for step, e in steps.items():
        row = history[step]
        assert row["train/loss"] == e["loss"], step
        assert row["train/grad_norm"] == e["norm"], step
        assert row["train/lr"] == e["lr"], step
        assert row["train/step_tokens"] == e["step_tokens"], step
        assert row["train/tokens_per_s"] == pytest.approx(1000.0 * e["step_tokens"] / e["duration_ms"]), step
    for step, e in evals.items():
        assert history[step]["eval/loss"] == e["loss"], step
        assert history[step]["eval/tokens"] == e["eval_tokens"], step
    assert not [s for s, row in history.items() if "eval/loss" in row and s not in evals]


# -- the runs ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> dict:
    """A 10-step run (evals after steps 5 and 10, checkpoints after 4 and 8) and, appended to a copy
    of its log, that run resumed from its step-4 checkpoint with another learning rate."""
    d = tmp_path_factory.mktemp("runs")
    rng = random.Random(5)
    phrase = [rng.randrange(1000) for _ in range(89)]
    write_tokens(d / "train.bin", (phrase * 300)[:24_000], 1000)
    write_tokens(d / "eval.bin", (phrase * 30)[7:2_007], 1000)
    flags = [f"--model={TINY}", "--from-scratch", "--device=cpu", f"--train-file={d / 'train.bin'}",
             f"--eval-file={d / 'eval.bin'}", "--seq-len=32", "--batch-size=2", "--grad-accumulation=1",
             "--steps=10", "--eval-every-n-steps=5", "--eval-num-steps=2", "--ckpt-interval=4",
             f"--checkpoint-dir={d / 'ckpt'}", f"--out-dir={d / 'out'}", f"--log-file={d / 'log.jsonl'}", "--seed=3"]
    first = subprocess.run([TRAIN_EXE, *flags, "--learning-rate=3e-3"], capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    shutil.copy(d / "log.jsonl", d / "single.jsonl")
    # as if the run had died after step 8 before its checkpoint was complete: --continue resumes at 4
    shutil.rmtree(d / "ckpt" / "step_00000008")
    second = subprocess.run([TRAIN_EXE, *flags, "--learning-rate=1e-3", "--continue", "--force-resume"],
                            capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    return {"single": d / "single.jsonl", "resumed": d / "log.jsonl"}


def test_an_exported_run_is_its_log(logs, tmp_path: Path):
    log = events(logs["single"])
    run = export(logs["single"], tmp_path, "--name", "tiny")
    assert run["module"] == REPO / "python" / "qtrain" / "wandb_logging.py"  # the checkout's, by path
    steps, evals = expected_history(log)
    assert sorted(steps) == list(range(1, 11)) and sorted(evals) == [5, 10]
    assert_history_is_the_log(run, steps, evals)

    options = next(e for e in log if e["log"] == "options")
    assert run["config"]["options"] == options["options"]
    assert run["config"]["options"]["learning-rate"] == pytest.approx(3e-3)
    assert run["config"]["cmd"] == options["cmd"]
    model = next(e for e in log if e["log"] == "model")
    assert run["config"]["model"]["parameters"] == model["parameters"]
    assert run["config"]["model"]["config"] == model["config"]
    assert run["config"]["dataset"]["eval"]["tokens"] == 2000
    assert run["config"]["memory"]["Weights"]["device"] > 0

    s = run["summary"]
    assert (s["checkpoint/step"], s["checkpoint/count"], s["done/step"], s["log/runs"]) == (8, 2, 10, 1)
    assert "resume/step" not in s
    assert run["exit_code"] == 0
    # every event that is not a step or an eval is in the events table, in order
    table = json.loads((run["dir"] / "files" / s["events"]["path"]).read_text())
    kept = [[e["log"], e["step"]] for e in log if e["log"] not in ("step", "eval")]
    assert [row[:2] for row in table["data"]] == kept
    assert json.loads(table["data"][kept.index(["checkpoint", 4])][3])["path"].endswith("step_00000004")


def test_a_resumed_run_exports_its_final_history(logs, tmp_path: Path):
    """A log with a resumed run appended is exported as its final history, here by a copy of the
    script outside the checkout, which then uses the installed qtrain.wandb_logging."""
    log = events(logs["resumed"])
    resume = log.index(next(e for e in log if e["log"] == "resume"))
    assert log[resume]["step"] == 4
    first_steps, first_evals = expected_history(log[:resume])
    steps, evals = expected_history(log)
    # the resumed run repeated steps 5..10 with another learning rate: the later values differ
    assert sorted(steps) == list(range(1, 11)) and sorted(evals) == [5, 10]
    assert all(steps[s]["lr"] != first_steps[s]["lr"] for s in range(5, 11))
    assert all(steps[s] is first_steps[s] for s in range(1, 5))
    assert all(evals[s]["loss"] != first_evals[s]["loss"] for s in (5, 10))

    script = tmp_path / "export_wandb.py"
    shutil.copy(EXPORT, script)
    run = export(logs["resumed"], tmp_path, script=script)
    assert run["module"] == Path(wl.__file__).resolve() and "site-packages" in run["module"].parts
    assert_history_is_the_log(run, steps, evals)
    assert run["history"][4]["train/lr"] == pytest.approx(3e-3) and run["history"][5]["train/lr"] == pytest.approx(1e-3)
    assert run["config"]["options"]["learning-rate"] == pytest.approx(1e-3)  # the later run's options
    s = run["summary"]
    assert (s["resume/step"], s["resume/count"], s["log/runs"], s["done/step"]) == (4, 1, 2, 10)
    assert s["resume/changes"] == ["--learning-rate: 0.003 -> 0.001"]
    assert s["log/replaced_events"] == 6 + 2  # steps 5..10 and the evals after 5 and 10 of the first run
    assert run["exit_code"] == 0


def test_the_logger_as_a_live_callback(logs, tmp_path: Path):
    """The installed qtrain.wandb_logging, called per event in this process as a training loop would:
    the same history; fed the appended log raw, it keeps what it logged first (wandb's steps only go
    forward) and counts the replayed events it skipped."""
    for name, wandb_dir in (("single", tmp_path / "single"), ("resumed", tmp_path / "resumed")):
        wandb_dir.mkdir()
        logger = wl.WandbLogger(project="qtrain-test", mode="offline", dir=str(wandb_dir), config={"note": name})
        for event in events(logs[name]):
            logger(dict(event))
        logger.finish()
        wandb.teardown()  # finish() returns before the run's file is written out; ending the service writes it
        run = read_offline_run(wandb_dir)
        steps, evals = expected_history(events(logs["single"]))  # the first run's values, both times
        assert_history_is_the_log(run, steps, evals)
        assert run["config"]["note"] == name
        assert run["summary"].get("log/replayed_steps_skipped", 0) == (0 if name == "single" else 8)


def test_final_events_restart_without_a_checkpoint():
    """A --continue before the first checkpoint restarts from step 0 and appends, with no resume
    event: the restart's steps and evals replace all of the earlier ones."""
    def step(i, loss):
        return {"log": "step", "step": i, "loss": loss}

    log = [{"log": "options"}, step(0, 9), step(1, 8), {"log": "eval", "step": 2, "loss": 7}, step(2, 6),
           {"log": "options"}, step(0, 5), step(1, 4), {"log": "eval", "step": 2, "loss": 3}]
    kept, replaced = wl.final_events(log)
    assert replaced == 4
    assert [(e["log"], e.get("loss")) for e in kept] == [
        ("options", None), ("options", None), ("step", 5), ("step", 4), ("eval", 3)]
    # a resume at 1 keeps the steps up to 1 and the eval after step 2 is replaced by the new one
    log = [step(0, 9), step(1, 8), {"log": "eval", "step": 2, "loss": 7}, step(2, 6),
           {"log": "resume", "step": 1}, step(1, 5), {"log": "eval", "step": 2, "loss": 4}]
    kept, replaced = wl.final_events(log)
    assert [(e["log"], e["step"], e.get("loss")) for e in kept] == [
        ("step", 0, 9), ("resume", 1, None), ("step", 1, 5), ("eval", 2, 4)]
    assert replaced == 3
    # a resumed run that ended before its first step: the steps after its checkpoint were undone
    kept, replaced = wl.final_events(log[:4] + [{"log": "resume", "step": 1}])
    assert [(e["log"], e["step"]) for e in kept] == [("step", 0), ("resume", 1)] and replaced == 3
    assert wl.wandb_step({"log": "step", "step": 4}) == 5 and wl.wandb_step({"log": "eval", "step": 5}) == 5


def test_the_python_trainer_logs_live_to_wandb(tmp_path: Path):
    """qtrain.Trainer(callback=WandbLogger(...)): the offline run's history is the run's own log."""
    import qtrain

    data = tmp_path / "train.bin"
    rng = random.Random(3)
    phrase = [rng.randrange(1000) for _ in range(71)]
    write_tokens(data, (phrase * 300)[:20_000], 1000)
    wandb_dir = tmp_path / "live"
    wandb_dir.mkdir()
    logger = wl.WandbLogger(project="qtrain-test", mode="offline", dir=str(wandb_dir))
    log = tmp_path / "live.jsonl"
    with qtrain.Trainer(model=str(TINY), from_scratch=True, device="cpu", train_file=str(data), eval_file=str(data),
                        seq_len=32, batch_size=2, grad_accumulation=1, steps=6, eval_every_n_steps=3,
                        eval_num_steps=2, learning_rate=3e-3, out_dir=str(tmp_path / "out"), log_file=str(log),
                        checkpoint_dir=str(tmp_path / "ckpt"), callback=logger) as t:
        for s in range(t.steps):
            t.step(lr=3e-3 / (1 + s))
    logger.finish()
    wandb.teardown()
    run = read_offline_run(wandb_dir)
    steps, evals = expected_history(events(log))
    assert len(steps) == 6 and len(evals) == 2
    assert_history_is_the_log(run, steps, evals)
    assert run["history"][4]["train/lr"] == pytest.approx(3e-3 / 4)
    assert run["config"]["options"]["seq-len"] == 32
