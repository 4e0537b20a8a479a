"""qtrain.Trainer with LoRA adapters (issue 33): the lora_* keywords are `train`'s --lora-* flags, a
LoRA run from Python equals `build/train` with the same options bit for bit (per-step and evaluation
losses, the PEFT adapter files), the adapters are the trainable tensors (PEFT names) while the frozen
base stays readable, has no gradient and never changes, compute_gradients() shows the gradients a
step would apply (A's are zero while B is, non-zero once B is not) and leaves the run as it was,
checkpoints and lora_from continue the adapters, and merge_lora exports W + alpha/rank B A of the
tensors the Trainer shows."""

import json
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

import qtrain
from test_package import TRAIN_EXE, step_losses
from test_trainer import data, options  # noqa: F401 (data is a fixture)

LAYERS = 2
MODULES = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj"]


def adapter_name(layer: int, module: str, which: str) -> str:
    return f"base_model.model.model.layers.{layer}.{module}.{which}.weight"


def read_safetensors(path: Path) -> dict:
    """The F32 tensors of a safetensors file (8-byte header length, JSON header, raw data)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", name
        begin, end = info["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + begin:8 + n + end], dtype="<f4").reshape(info["shape"])
    return out


def eval_losses(log: Path) -> list:
    return [e["loss"] for e in map(json.loads, log.read_text().splitlines()) if e.get("log") == "eval"]


def random_tokens(t: "qtrain.Trainer", seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, t.vocab_size, (t.rows_per_step, t.seq_len + 1))


def lora_options(tmp_path: Path, data: Path, name: str, **extra):  # noqa: F811
    return options(tmp_path, data, name, lora_rank=4, lora_alpha=12, **extra)


def test_a_lora_run_from_python_equals_the_command_line(tmp_path: Path, data: Path):  # noqa: F811
    extra = dict(steps=8, eval_file=str(data), eval_num_steps=2, eval_every_n_steps=4, lora_dropout=0.1,
                 lora_targets="q,v,down", lora_init="gaussian")
    with qtrain.Trainer(**lora_options(tmp_path, data, "py", **extra)) as t:
        assert t.options()["lora-rank"] == 4 and t.options()["lora-targets"] == "q,v,down"
        losses = [t.step().loss for _ in range(8)]
        assert t.run() == 0  # the final evaluation (none: step 8 made one) and the export to out_dir
    cli_opts = lora_options(tmp_path, data, "cli", **extra)
    cli = subprocess.run([TRAIN_EXE, *qtrain.flags(**cli_opts)], capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    assert f"adapter written to {tmp_path / 'cli'}/adapter_model.safetensors" in cli.stdout  # the done line
    ref = step_losses(tmp_path / "cli.jsonl")
    assert len(ref) == 8 and losses == ref and step_losses(tmp_path / "py.jsonl") == ref
    assert len(eval_losses(tmp_path / "cli.jsonl")) == 2
    assert eval_losses(tmp_path / "py.jsonl") == eval_losses(tmp_path / "cli.jsonl")
    for f in ("adapter_model.safetensors", "adapter_config.json"):
        assert (tmp_path / "py" / f).read_bytes() == (tmp_path / "cli" / f).read_bytes(), f
    assert not (tmp_path / "py" / "model.safetensors").exists()  # the adapter, not the model
    adapter = read_safetensors(tmp_path / "py" / "adapter_model.safetensors")
    assert sorted(adapter) == sorted(adapter_name(l, m, w) for l in range(LAYERS)
                                     for m in ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj")
                                     for w in ("lora_A", "lora_B"))


def test_the_adapters_train_and_the_base_is_frozen(tmp_path: Path, data: Path):  # noqa: F811
    with qtrain.Trainer(**lora_options(tmp_path, data, "run"), steps=4) as t:
        base = [n for n in t.parameter_names() if not n.startswith("base_model.")]
        adapters = t.trainable_parameter_names()
        # every parameter of the model, then the adapters by PEFT's names: A before B, in target order
        assert base == [n for n in t.parameter_names() if n not in adapters]
        assert "model.layers.0.self_attn.q_proj.weight" in base and "model.embed_tokens.weight" in base
        assert adapters == [adapter_name(l, m, w) for l in range(LAYERS) for m in MODULES for w in ("lora_A", "lora_B")]
        assert t.parameter_names() == base + adapters
        assert t.parameter(adapter_name(0, "self_attn.q_proj", "lora_A")).shape == (4, 256)
        assert t.parameter(adapter_name(1, "mlp.down_proj", "lora_B")).shape == (256, 4)
        # the frozen base has no gradient: a clear error, and the Trainer goes on
        with pytest.raises(ValueError, match=r"'model.layers.0.self_attn.q_proj.weight' is frozen under LoRA "
                                             r"\(--lora-rank=4\): it has no gradient"):
            t.gradient("model.layers.0.self_attn.q_proj.weight")
        assert set(t.gradients()) == set(adapters)
        assert not any(np.any(g) for g in t.gradients().values())  # nothing accumulated yet

        frozen = {n: t.parameter(n) for n in base}
        start = {n: t.parameter(n) for n in adapters}
        assert not any(np.any(v) for n, v in start.items() if n.endswith("lora_B.weight"))  # PEFT's B = 0
        assert all(np.any(v) for n, v in start.items() if n.endswith("lora_A.weight"))
        for _ in range(3):
            t.step()
        for n in base:
            assert np.array_equal(t.parameter(n), frozen[n]), n
        for n in adapters:  # every adapter moved (A too, once B was no longer zero)
            assert not np.array_equal(t.parameter(n), start[n]), n


def test_train_also_tensors_are_trainable_under_their_peft_names(tmp_path: Path, data: Path):  # noqa: F811
    with qtrain.Trainer(**lora_options(tmp_path, data, "run", train_also="norms"), steps=4) as t:
        extra = [n for n in t.trainable_parameter_names() if not ".lora_" in n]
        assert "base_model.model.model.norm.weight" in extra
        assert "base_model.model.model.layers.1.post_attention_layernorm.weight" in extra
        assert all(n.endswith("norm.weight") for n in extra)
        before = t.parameter("base_model.model.model.norm.weight")
        assert np.array_equal(before, t.parameter("model.norm.weight"))  # one copy: the base's
        t.compute_gradients(tokens=random_tokens(t, 3))
        assert np.any(t.gradient("base_model.model.model.norm.weight"))
        t.step()
        after = t.parameter("base_model.model.model.norm.weight")
        assert not np.array_equal(after, before)
        assert np.array_equal(after, t.parameter("model.norm.weight"))


def test_compute_gradients_shows_the_adapter_gradients(tmp_path: Path, data: Path):  # noqa: F811
    with qtrain.Trainer(**lora_options(tmp_path, data, "run"), steps=4) as t:
        tokens = random_tokens(t, 1)
        # B = 0: the gradient reaches B only (dA = s (dy B)^T x = 0)
        t.compute_gradients(tokens=tokens)
        grads = t.gradients()
        assert all(np.any(g) for n, g in grads.items() if n.endswith("lora_B.weight"))
        assert not any(np.any(g) for n, g in grads.items() if n.endswith("lora_A.weight"))
        assert t.next_step == 0  # no step taken
        t.step()
        assert not any(np.any(g) for g in t.gradients().values())  # the step cleared them
        # B != 0 now: A's gradients are non-zero, and a second call gives the same (not accumulated)
        t.compute_gradients(tokens[:, :-1], tokens[:, 1:])
        first = t.gradients()
        assert all(np.any(g) for g in first.values())
        t.compute_gradients(tokens=tokens)
        for n, g in t.gradients().items():
            assert np.array_equal(g, first[n]), n
        with pytest.raises(ValueError, match="compute_gradients"):
            t.compute_gradients(tokens=tokens[:2])


def test_compute_gradients_leaves_the_run_as_it_was(tmp_path: Path, data: Path):  # noqa: F811
    # also for the full model (no LoRA): a run that reads gradients between its steps equals one that does not
    for kind, extra in (("lora", dict(lora_rank=4)), ("full", {})):
        with qtrain.Trainer(**options(tmp_path, data, f"plain-{kind}", **extra), steps=5) as t:
            plain = [t.step().loss for _ in range(5)]
        with qtrain.Trainer(**options(tmp_path, data, f"probed-{kind}", **extra), steps=5) as t:
            probed = []
            for s in range(5):
                t.compute_gradients(tokens=random_tokens(t, 100 + s))
                name = t.trainable_parameter_names()[-1]
                assert np.any(t.gradient(name)), name
                probed.append(t.step().loss)
        assert probed == plain, kind


def test_a_lora_checkpoint_reloads_and_continues_bit_identically(tmp_path: Path, data: Path):  # noqa: F811
    with qtrain.Trainer(**lora_options(tmp_path, data, "straight"), steps=8) as t:
        straight = [t.step().loss for _ in range(8)]
        final = {n: t.parameter(n) for n in t.trainable_parameter_names()}
    with qtrain.Trainer(**lora_options(tmp_path, data, "first"), steps=8) as t:
        head = [t.step().loss for _ in range(3)]
        ckpt = t.save_checkpoint()
    # the checkpoint holds the adapters and their moments, nothing of the frozen base
    assert (Path(ckpt) / "adapter_model.safetensors").exists() and not (Path(ckpt) / "model.safetensors").exists()
    with qtrain.Trainer(**lora_options(tmp_path, data, "second"), steps=8) as t:
        t.load_checkpoint(ckpt)
        assert t.next_step == 3
        tail = [t.step().loss for _ in range(5)]
        for n, v in final.items():
            assert np.array_equal(t.parameter(n), v), n
    assert head + tail == straight


def test_lora_from_starts_from_a_saved_adapter(tmp_path: Path, data: Path):  # noqa: F811
    with qtrain.Trainer(**lora_options(tmp_path, data, "src"), steps=2) as t:
        t.step()
        t.step()
        t.export(str(tmp_path / "adapter"))
    saved = read_safetensors(tmp_path / "adapter" / "adapter_model.safetensors")
    with qtrain.Trainer(**lora_options(tmp_path, data, "dst", lora_from=str(tmp_path / "adapter")), steps=2) as t:
        assert sorted(t.trainable_parameter_names()) == sorted(saved)
        for n, v in saved.items():
            assert np.array_equal(t.parameter(n), v), n
        t.compute_gradients(tokens=random_tokens(t, 3))  # B != 0 from the file: A has gradients at once
        assert all(np.any(g) for g in t.gradients().values())
    with pytest.raises(ValueError, match="--lora-from="):  # another rank than the adapter's
        qtrain.Trainer(**dict(lora_options(tmp_path, data, "bad", lora_from=str(tmp_path / "adapter")), lora_rank=8),
                       steps=2)


def test_merge_lora_exports_the_base_plus_the_scaled_adapters_the_trainer_shows(tmp_path: Path, data: Path):  # noqa: F811
    with qtrain.Trainer(**lora_options(tmp_path, data, "merged", merge_lora=True), steps=2) as t:
        t.step()
        t.step()
        t.export(str(tmp_path / "export"))
        views = t.parameters()
    merged = read_safetensors(tmp_path / "export" / "model.safetensors")
    assert not (tmp_path / "export" / "adapter_model.safetensors").exists()
    scale = 12 / 4  # lora_alpha / lora_rank
    for l in range(LAYERS):
        for m in MODULES:
            base = f"model.layers.{l}.{m}.weight"
            a, b = views[adapter_name(l, m, "lora_A")], views[adapter_name(l, m, "lora_B")]
            assert np.any(b), base
            expected = views[base].astype(np.float64) + scale * (b.astype(np.float64) @ a.astype(np.float64))
            np.testing.assert_allclose(merged[base], expected, rtol=1e-5, atol=1e-6, err_msg=base)
    for name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):  # not adapted: the base
        assert np.array_equal(merged[name], views[name]), name
