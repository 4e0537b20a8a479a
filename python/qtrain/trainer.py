"""qtrain.Trainer: a training run driven step by step from Python, on the engine's own session (the
same calls the `train` command line's loop makes, so the same options give the same bits)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from . import _qtrain
from .options import flags

Callback = Callable[[dict], None]


@dataclass(frozen=True)
class StepResult:
    step: int            # the step's index (0-based)
    loss: float
    grad_norm: float     # before clipping
    lr: float            # the learning rate the update used
    ms: float            # wall time of the step
    tokens: int          # tokens of the step, all ranks
    tokens_per_s: float
    applied: bool        # False: the step had no unmasked target, no update
    evaluated: bool      # eval_every_n_steps evaluated after it


@dataclass(frozen=True)
class EvalResult:
    loss: float
    tokens: int


class Trainer:
    """A training run: every keyword is a `train` flag (see qtrain.flags), validated by the same C++
    code, so a bad one raises ValueError with the command line's message. Opening plans, allocates and
    loads, initialises or (continue_from_checkpoint=True, the command line's --continue) resumes.

    callback: a callable (or a list of them) given every JSONL log event as a dict, as it is written
    (options, system, model, dataset, memory, step, eval, checkpoint, ...): e.g.
    qtrain.wandb_logging.WandbLogger(project=...).

    train_file may be left out when every step() is given its tokens.
    """

    def __init__(self, callback: Optional[Callback | Iterable[Callback]] = None, **options: Any):
        if callback is None:
            self._callbacks: list[Callback] = []
        elif callable(callback):
            self._callbacks = [callback]
        else:
            self._callbacks = list(callback)
        callbacks = self._callbacks

        # (a closure over the list, not a bound method: the session holds it, and a reference back to
        # this Trainer would make a cycle that nanobind's objects keep alive)
        def on_line(line: str) -> None:
            event = json.loads(line)
            for cb in callbacks:
                cb(event)

        self._session = _qtrain.Session(flags(**options), on_line if callbacks else None)
        self._session.check_listener()

    # ---- the run ----
    @property
    def next_step(self) -> int:
        """Optimizer steps completed (the index of the next one)."""
        return self._session.next_step

    @property
    def steps(self) -> int:
        """The run's --steps (what run() trains to and the built-in schedule spans)."""
        return self._session.steps

    @property
    def world(self) -> int:
        return self._session.world

    @property
    def device(self) -> str:
        return self._session.device

    @property
    def rows_per_step(self) -> int:
        """Rows of seq_len tokens one step takes: grad_accumulation x ranks x batch_size."""
        return self._session.rows_per_step

    @property
    def seq_len(self) -> int:
        """The run's --seq-len: a row's tokens (step() takes rows of seq_len inputs, or seq_len + 1 tokens)."""
        return self._session.seq_len

    @property
    def vocab_size(self) -> int:
        """The model's vocab_size: token ids are in [0, vocab_size)."""
        return self._session.vocab_size

    def options(self) -> dict:
        """Every option of this run, by flag name (what the log and checkpoints record)."""
        return json.loads(self._session.options_json())

    def step(self, inputs=None, targets=None, *, tokens=None, lr: Optional[float] = None) -> StepResult:
        """One optimizer step on the next batches of train_file, or on the tokens given: `inputs` and
        `targets` integer arrays of shape [rows_per_step, seq_len] (targets -1: no loss), or `tokens` of
        shape [rows_per_step, seq_len + 1] (inputs tokens[:, :-1], targets tokens[:, 1:]). Row block m
        of rank r is micro-batch m * ranks + r, the data loader's global order. `lr` overrides the
        built-in schedule for this step (Python schedules; a finite number >= 0). Evaluation and
        checkpoints follow eval_every_n_steps and ckpt_interval as in the command line.

        The arrays are checked as given, before their conversion to int32: an integer dtype (any width,
        signed or unsigned; not float or bool: TypeError), the shape and every id in [0, vocab_size)
        (ValueError naming the first one outside and its position); the engine refuses a bad lr. A
        refused call takes no step."""
        if tokens is not None:
            import numpy as np  # (numpy is imported when first needed, as before)

            if inputs is not None or targets is not None:
                raise ValueError("step(): give tokens=, or inputs and targets, not both")
            # the last column is only ever a target, so it may be -1 (no loss) as targets may
            lowest = np.zeros(self.seq_len + 1, dtype=np.int64)
            lowest[-1] = -1
            tokens = self._token_ids(tokens, "tokens", 1, lowest)
            inputs = np.ascontiguousarray(tokens[:, :-1])
            targets = np.ascontiguousarray(tokens[:, 1:])
        elif inputs is not None or targets is not None:
            if inputs is None or targets is None:
                raise ValueError("step(): give both inputs and targets, or neither")
            inputs = self._token_ids(inputs, "inputs", 0, 0)
            targets = self._token_ids(targets, "targets", 0, -1)
        r = self._session.step(inputs, targets, lr)
        return StepResult(**r)

    def _token_ids(self, value, name: str, extra_column: int, lowest, where: str = "step()"):
        """A step's array, checked (_token_ids.py): [rows_per_step, seq_len + extra_column] ids in
        [lowest, vocab_size); returned as C-contiguous int32."""
        from ._token_ids import checked_token_ids

        rows, cols = self.rows_per_step, self.seq_len + extra_column

        def shape_text() -> str:
            o = self.options()
            return (f"[rows, seq_len{' + 1' if extra_column else ''}] = [{rows}, {cols}] (rows = grad_accumulation x "
                    f"ranks x batch_size = {o['grad-accumulation']} x {self.world} x {o['batch-size']})")

        return checked_token_ids(value, name, where=where, shape=(rows, cols), shape_text=shape_text,
                                 high=self.vocab_size, high_text="the model's vocab_size", lowest=lowest)

    def evaluate(self) -> EvalResult:
        """The loss on eval_file now (eval_num_steps batches; 0 = all)."""
        return EvalResult(**self._session.evaluate())

    def run(self) -> int:
        """The command line's loop from here: steps up to `steps`, then the final evaluation (unless
        the last step made one), the export to out_dir and the done line. Ctrl-C stops after the
        current step; with a checkpoint_dir a checkpoint is written first, then KeyboardInterrupt is
        raised."""
        try:
            while self.next_step < self.steps:
                self.step()
        except KeyboardInterrupt:
            self.save_checkpoint()
            raise
        return self._session.finish()

    def save_checkpoint(self) -> str:
        """A checkpoint of the state now, into checkpoint_dir; returns its directory."""
        return self._session.save_checkpoint()

    def load_checkpoint(self, path: str) -> None:
        """Loads a checkpoint directory (a step_XXXXXXXX): verified against its checksums and refused
        when its run differs in options that change the math (unless force_resume), as --continue."""
        self._session.load_checkpoint(str(path))

    def export(self, path: str) -> None:
        """Writes the model as a Hugging Face directory (model.safetensors, config.json, tokenizer files);
        with LoRA (lora_rank > 0) the PEFT adapter instead of model.safetensors (adapter_config.json +
        adapter_model.safetensors, as `train` writes to out_dir), or with merge_lora=True the merged model."""
        self._session.export_model(str(path))

    def memory_plan(self) -> dict:
        """The memory plan this run allocated by (per rank): entries of category, device and pinned bytes."""
        return self._session.memory_plan()

    # ---- tensors, for debugging ----
    # Every parameter by its HF name; with LoRA (lora_rank > 0) also the adapters by the names PEFT
    # saves them under ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"). Under LoRA
    # the base is frozen: readable, but it has no gradient and never changes; the adapters are the
    # trainable tensors.
    def parameter_names(self) -> list[str]:
        """Every readable tensor: the model's parameters, then (LoRA) the adapters."""
        return [name for name, _, _ in self._session.tensors()]

    def trainable_parameter_names(self) -> list[str]:
        """The tensors the optimizer updates (with LoRA: the adapters; else every parameter)."""
        return [name for name, _, trainable in self._session.tensors() if trainable]

    def parameter(self, name: str):
        """The weights the forward pass uses, as a float32 numpy array (a copy)."""
        return self._session.read(name, False)

    def gradient(self, name: str):
        """The gradient accumulated since the last optimizer step on rank 0 (zero right after a step;
        compute_gradients() fills it). A frozen tensor (the base under LoRA) has none: ValueError."""
        return self._session.read(name, True)

    def parameters(self) -> dict:
        return {name: self.parameter(name) for name in self.parameter_names()}

    def gradients(self) -> dict:
        """gradient() of every trainable tensor."""
        return {name: self.gradient(name) for name in self.trainable_parameter_names()}

    def compute_gradients(self, inputs=None, targets=None, *, tokens=None) -> None:
        """The gradients step() would apply for these tokens (the arrays as step() takes and checks
        them), accumulated and left to read with gradient()/gradients(): no update, no step counted,
        nothing logged, train_file's position untouched. The next step() clears them first, so the
        run goes on as if this call never was (except lora_dropout's masks, drawn per training pass).
        On the GPU only LoRA runs support it."""
        if tokens is not None:
            import numpy as np

            if inputs is not None or targets is not None:
                raise ValueError("compute_gradients(): give tokens=, or inputs and targets, not both")
            lowest = np.zeros(self.seq_len + 1, dtype=np.int64)
            lowest[-1] = -1
            tokens = self._token_ids(tokens, "tokens", 1, lowest, "compute_gradients()")
            inputs = np.ascontiguousarray(tokens[:, :-1])
            targets = np.ascontiguousarray(tokens[:, 1:])
        elif inputs is None or targets is None:
            raise ValueError("compute_gradients(): give inputs and targets (or tokens=)")
        else:
            inputs = self._token_ids(inputs, "inputs", 0, 0, "compute_gradients()")
            targets = self._token_ids(targets, "targets", 0, -1, "compute_gradients()")
        self._session.compute_gradients(inputs, targets)

    # ---- lifetime ----
    def close(self) -> None:
        """Releases the model and its memory (also on leaving a `with` block)."""
        self._session.close()

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
