"""Weights & Biases logging of qtrain runs: one call per event of the JSON Lines log (`--log-file`).

    logger = WandbLogger(project="my-project")   # wandb.init here: a login problem shows before training
    for event in events:                          # each a dict, exactly as one log line parses
        logger(event)
    logger.finish()

It is meant as the live callback of a Python training loop (called once per event as the event is
written) and is also what scripts/export_wandb.py feeds a finished log to. Pure Python: it imports
nothing of qtrain's extension, so it loads from a checkout by path (importlib) as well as installed
(`import qtrain.wandb_logging`); `wandb` is imported only when a run is created here.

Where each event goes:

* history, at wandb step = the number of completed optimizer steps: a `step` event (its "step" is the
  step's 0-based index, the console's `[T] step s`) is logged at s + 1 as train/loss, train/grad_norm,
  train/lr, train/tokens_per_s, train/step_time_ms, train/step_tokens, train/epoch and, once a `sol`
  event gave the speed of light, train/sol_percent (the console's `sol`); an `eval` event (its "step"
  counts completed steps already, the console's `[V] step`) as eval/loss, eval/tokens_per_s,
  eval/duration_ms, eval/tokens in the same row as the step it follows.
* config: `options` -> config["options"] (keyed by flag name, e.g. config["options"]["learning-rate"])
  and config["cmd"]; `system` -> config["system"]; `model` -> config["model"] (source, parameters,
  config = the model's config.json); `dataset` -> config["dataset"][split] (tokens, chunks, the number
  of files and the first 16 paths); `allocator` (the memory plan) -> config["memory"] (bytes per
  category, totals, limit); `sol` -> config["sol"]. A later event of a kind replaces the earlier
  values (a resumed run's options, e.g. a --force-resume with another learning rate).
* summary: the latest checkpoint (checkpoint/step, /path, /duration_ms, /count), resume (resume/count,
  /step, /path, /skipped, /verified, /changes), checkpoint_rejected and checkpoint_removed counts with
  the last path and error, stopped (stopped/step, /reason), done (done/step, /seconds, /out_dir), and
  log/runs (how many times training started in this log: options events).
* every event that is not a step or an eval, in full: the `events` table (columns log, step, time,
  detail = the rest of the event as JSON) in the summary, written by finish().

wandb's history only moves forward, so live the first value of a step stays: a step event at or below
the last step logged, or an eval at a step evaluated already (a resumed run replaying steps this logger
has seen, or a wandb run resumed by id behind its last step) is not logged again but counted in
summary["log/replayed_steps_skipped"]. A finished log that holds several runs appended (`--continue`
appends to the log) is reduced to its final history by `final_events` first, a later run's steps
replacing the earlier run's from its resume point on, as scripts/export_wandb.py does.

summary values are the log's own fields (checkpoint/step counts completed steps, stopped/step is the
broken step's 0-based index). History times (_timestamp, _runtime) are when the event reached wandb: an
exported run's are the export's (the log's "time" is only in the events table).
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable, Iterator, Mapping

__all__ = ["WandbLogger", "final_events", "read_log", "wandb_step"]

_CONFIG_KINDS = {"options", "system", "model", "dataset", "allocator", "sol"}
_MAX_PATHS = 16  # of a dataset's files in the config


def read_log(path: str) -> Iterator[dict]:
    """The events of a JSON Lines log, one dict per non-empty line."""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{number}: not a JSON line ({e})") from None
            if not isinstance(event, dict) or "log" not in event:
                raise ValueError(f"{path}:{number}: not a qtrain log event (no \"log\" key)")
            yield event


def wandb_step(event: Mapping[str, Any]) -> int:
    """The wandb step an event belongs to: completed optimizer steps. A step event's "step" is the
    0-based index of the step (the console's `[T] step s`), so it is s + 1; every other event's "step"
    counts completed steps already (an eval after the 5th step says 5)."""
    step = int(event.get("step", 0))
    return step + 1 if event.get("log") == "step" else step


def final_events(events: Iterable[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], int]:
    """A log's events with the step and eval events that a later run in the same log repeated left
    out, and how many were. `--continue` appends to the log: after a `resume` at step k (or, with no
    checkpoint yet, a restart from step 0) the steps after k come again, and the later values are the
    run's (they differ when e.g. --force-resume changed the learning rate). What is left has strictly
    increasing steps and evals that never go back behind a step, so wandb takes every one of it."""
    events = list(events)
    dropped: set[int] = set()
    steps: list[int] = []  # indices of kept step events, their wandb steps increasing
    evals: list[int] = []

    def cut(stack: list[int], first: int) -> None:  # drops the kept events at wandb step >= first
        while stack and wandb_step(events[stack[-1]]) >= first:
            dropped.add(stack.pop())

    for i, event in enumerate(events):
        kind = event.get("log")
        if kind == "resume":  # the state after k steps: what came after k before is replaced
            cut(steps, wandb_step(event) + 1)
            cut(evals, wandb_step(event) + 1)
        elif kind == "step":
            cut(steps, wandb_step(event))
            cut(evals, wandb_step(event))
            steps.append(i)
        elif kind == "eval":
            cut(evals, wandb_step(event))
            evals.append(i)
    return [e for i, e in enumerate(events) if i not in dropped], len(dropped)


def _number(value: Any) -> float:
    """A logged number; the log writes a non-finite float as null (nlohmann::json), which is NaN here."""
    return math.nan if value is None else value


class WandbLogger:
    """Sends qtrain log events to a W&B run; call it with each event (a dict as one log line parses).

    project, name, entity, mode ("online", "offline" or "disabled"; None: wandb's default or
    WANDB_MODE) and config (extra config entries) go to `wandb.init`, with any other keyword
    (`init_kwargs`, e.g. tags=[...], id=..., resume="allow", settings=...). Or pass an existing `run`:
    then nothing is initialised here and finish() leaves the run open (it is the caller's).
    """

    def __init__(self, project: str | None = None, name: str | None = None, entity: str | None = None,
                 mode: str | None = None, config: Mapping[str, Any] | None = None, run: Any = None,
                 **init_kwargs: Any) -> None:
        self._owns_run = run is None
        if run is None:
            import wandb

            run = wandb.init(project=project, name=name, entity=entity, mode=mode,
                             config=dict(config) if config else None, **init_kwargs)
        self.run = run
        self._config: dict[str, Any] = {}
        self._events: list[list[Any]] = []  # rows of the events table
        self._counts: dict[str, int] = {}
        self._peak_tps = 0.0  # the speed of light in tokens/s (sol event), for train/sol_percent
        self._last_step: int | None = None  # the highest wandb step logged
        self._eval_at_last = False  # whether an eval was logged at it
        try:  # a resumed wandb run (id=..., resume=...) goes on after its last step
            self._first_step = int(run.step)
        except Exception:  # a disabled run, or one without the property
            self._first_step = 0
        self._exit_code: int | None = None
        self._finished = False

    # -- the callback --------------------------------------------------------------------------

    def __call__(self, event: Mapping[str, Any]) -> None:
        if self._finished:
            raise RuntimeError("WandbLogger: an event after finish()")
        kind = event.get("log")
        if not kind:
            raise ValueError(f"WandbLogger: not a qtrain log event (no \"log\" key): {dict(event)!r}")
        if kind == "step":
            self._log_step(event)
            return
        if kind == "eval":
            self._log_eval(event)
            return
        self._count(kind)
        if kind in _CONFIG_KINDS:
            self._to_config(kind, event)
        else:
            self._to_summary(kind, event)
        detail = {k: v for k, v in event.items() if k not in ("log", "step", "time")}
        self._events.append([kind, int(event.get("step", 0)), str(event.get("time", "")),
                             json.dumps(detail, sort_keys=True)])

    def _may_log(self, step: int, eval_: bool) -> bool:
        """wandb's history only goes forward: a step event must be past the last step logged, an eval
        may also join the row of the step it follows (once)."""
        last = self._last_step
        ok = step >= self._first_step and (last is None or step > last or
                                           (eval_ and step == last and not self._eval_at_last))
        if not ok:
            self._count("replayed_steps_skipped")
            self.run.summary["log/replayed_steps_skipped"] = self._counts["replayed_steps_skipped"]
        return ok

    def _log_step(self, event: Mapping[str, Any]) -> None:
        step = wandb_step(event)
        if not self._may_log(step, eval_=False):
            return
        ms = float(_number(event.get("duration_ms", 0.0)))
        tokens = int(event.get("step_tokens", 0))
        row = {
            "train/loss": _number(event.get("loss")),
            "train/grad_norm": _number(event.get("norm")),
            "train/lr": _number(event.get("lr")),
            "train/step_time_ms": ms,
            "train/step_tokens": tokens,
            "train/epoch": _number(event.get("epoch")),
        }
        if ms > 0:
            row["train/tokens_per_s"] = 1000.0 * tokens / ms
            if self._peak_tps > 0:
                row["train/sol_percent"] = 100.0 * row["train/tokens_per_s"] / self._peak_tps
        self.run.log(row, step=step)
        self._last_step, self._eval_at_last = step, False

    def _log_eval(self, event: Mapping[str, Any]) -> None:
        step = wandb_step(event)
        if not self._may_log(step, eval_=True):
            return
        ms = float(_number(event.get("duration_ms", 0.0)))
        tokens = int(event.get("eval_tokens", 0))
        row = {"eval/loss": _number(event.get("loss")), "eval/duration_ms": ms, "eval/tokens": tokens}
        if ms > 0:
            row["eval/tokens_per_s"] = 1000.0 * tokens / ms
        self.run.log(row, step=step)
        self._last_step, self._eval_at_last = step, True

    def _to_config(self, kind: str, event: Mapping[str, Any]) -> None:
        if kind == "options":
            self._count("runs")
            self.run.summary["log/runs"] = self._counts["runs"]
            update = {"options": dict(event.get("options", {})), "cmd": event.get("cmd", "")}
        elif kind == "system":
            update = {"system": {k: event.get(k) for k in ("device", "description", "peak_flops")}}
        elif kind == "model":
            update = {"model": {k: event.get(k) for k in ("source", "parameters", "config")}}
        elif kind == "dataset":
            files = list(event.get("files", []))
            split = {"tokens": event.get("tokens"), "chunks": event.get("chunks"), "files": len(files),
                     "paths": [f.get("file") for f in files[:_MAX_PATHS]]}
            datasets = dict(self._config.get("dataset", {}))
            datasets[str(event.get("split", "train"))] = split
            update = {"dataset": datasets}
        elif kind == "allocator":
            stats = list(event.get("stats", []))
            memory: dict[str, Any] = {"device": event.get("device"), "limit": event.get("limit")}
            for s in stats:
                memory[str(s.get("name"))] = {"device": s.get("device"), "pinned": s.get("pinned")}
            memory["total_device"] = sum(int(s.get("device") or 0) for s in stats)
            memory["total_pinned"] = sum(int(s.get("pinned") or 0) for s in stats)
            update = {"memory": memory}
        else:  # sol
            self._peak_tps = float(event.get("tps") or 0.0)
            update = {"sol": {k: event.get(k) for k in ("flops_per_token", "peak_flops", "tps")}}
        self._config.update(update)
        self.run.config.update(update, allow_val_change=True)

    def _to_summary(self, kind: str, event: Mapping[str, Any]) -> None:
        n = self._counts[kind]
        get = event.get
        if kind == "checkpoint":
            s = {"checkpoint/step": get("step"), "checkpoint/path": get("path"),
                 "checkpoint/duration_ms": get("duration_ms"), "checkpoint/count": n}
        elif kind == "resume":
            s = {"resume/step": get("step"), "resume/path": get("path"), "resume/skipped": get("skipped"),
                 "resume/verified": get("verified"), "resume/count": n}
        elif kind == "resume_changes":
            s = {"resume/changes": [f"{c.get('flag')}: {c.get('before')} -> {c.get('after')}"
                                    for c in get("changes", [])]}
        elif kind == "checkpoint_rejected":
            s = {"checkpoint_rejected/count": n, "checkpoint_rejected/path": get("path"),
                 "checkpoint_rejected/error": get("error")}
        elif kind == "checkpoint_removed":
            self._count("checkpoint_removed_bytes", int(get("bytes") or 0))
            s = {"checkpoint_removed/count": n, "checkpoint_removed/path": get("path"),
                 "checkpoint_removed/reason": get("reason"),
                 "checkpoint_removed/bytes": self._counts["checkpoint_removed_bytes"]}
            if get("error"):
                s["checkpoint_removed/error"] = get("error")
        elif kind == "stopped":
            s = {"stopped/step": get("step"), "stopped/reason": get("reason")}
            self._exit_code = 1  # a broken step ended the run: wandb marks it failed
        elif kind == "done":
            s = {"done/step": get("step"), "done/seconds": get("seconds"), "done/out_dir": get("out_dir")}
            self._exit_code = 0
        else:  # any other kind is only in the events table
            return
        self.run.summary.update(s)

    def _count(self, key: str, by: int = 1) -> None:
        self._counts[key] = self._counts.get(key, 0) + by

    # -- the end -------------------------------------------------------------------------------

    def finish(self, exit_code: int | None = None) -> None:
        """Writes the events table into the summary and, when this logger created the run, finishes it
        (exit_code: given, else 1 after a `stopped` event, else 0). Calling it again does nothing."""
        if self._finished:
            return
        self._finished = True
        if self._events:
            import wandb

            self.run.summary["events"] = wandb.Table(columns=["log", "step", "time", "detail"], data=self._events)
        if self._owns_run:
            code = exit_code if exit_code is not None else (self._exit_code or 0)
            self.run.finish(exit_code=code)

    def __enter__(self) -> "WandbLogger":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.finish(exit_code=1 if exc_type is not None else None)
