#!/usr/bin/env python3
"""Issue 32's per-op accounting in one table: the op timer's GPU time of each op family in a step
(`QTRAIN_TIME_BREAKDOWN=1`, the table `train` prints after its steps) beside the floor
`bench/step_floor_bench` measured for the same command (its GEMMs under the op timer's names, attention,
the memory-bound ops' bytes at the measured read rate, the optimizer's), both per micro-batch.

usage: bench/floor_vs_timer.py TRAIN_OUT FLOOR_OUT [--timer-ga N] [--json]
  TRAIN_OUT   the train output holding the "[Time breakdown]" table (e.g. $BENCH_DIR/train.out)
  FLOOR_OUT   step_floor_bench's whole output (FLOOR=1 keeps it in $BENCH_DIR/floor.out)
  --timer-ga  the accumulation the timed run used (default: the floor's, from its JSON line): the op timer
              gives ms per optimizer step, the floor ms per micro-batch (the optimizer's per step, spread
              over the floor command's accumulation)
A family the floor does not count (recompute, LoRA's adapters, host copies, ...) shows no floor; "idle or
untimed" is the step span not covered by any timed op.
"""
import argparse
import json
import re
import sys

# attention's line: "forward 0.609 ms (x1), backward 2.239 ms: 79.74 ms per micro-batch over 28 layers"
ATTENTION = re.compile(r"forward ([\d.]+) ms \(x(\d+)\), backward ([\d.]+) ms: [\d.]+ ms per micro-batch over (\d+) layers")
# a memory-bound op's line: "fp8 quantize       135.744        0.000 |     30.042", and once per optimizer step:
# "fp8 quantize (weights, per step)   44.310   0.000 |   9.812 per optimizer step"
MEMORY = re.compile(r"^(\S.*?)\s+([\d.]+)\s+([\d.]+) \|\s+([\d.]+)( per optimizer step)?$")
# the op timer's lines: "  gemm fwd                 213.340 ms   24.1%"
TIMER = re.compile(r"^  (\S.*?)\s+([\d.]+) ms(?:\s+([\d.]+)%| )")


def parse_timer(text: str) -> dict:
    """The last "[Time breakdown]" table: family -> ms per step, plus span and idle."""
    at = text.rfind("[Time breakdown]")
    if at < 0:
        raise ValueError("no '[Time breakdown]' table (run with QTRAIN_TIME_BREAKDOWN=1; bench_qtrain.sh waits for it)")
    out = {}
    for line in text[at:].splitlines()[1:]:
        m = TIMER.match(line)
        if not m:
            break
        out[m.group(1)] = float(m.group(2))
    if "idle or untimed" not in out:
        raise ValueError("the '[Time breakdown]' table is cut off before its 'idle or untimed' line")
    return out


def parse_floor(text: str) -> dict:
    """step_floor_bench's output: family -> floor ms per micro-batch, and its JSON line."""
    lines = text.strip().splitlines()
    summary = json.loads(lines[-1])
    floor, per_step = {}, {}
    in_memory = False  # inside the memory-bound ops' table (after its header, until a non-row line)
    for line in lines:
        if line.startswith("memory-bound op"):
            in_memory = True
            continue
        if in_memory:
            if (m := MEMORY.match(line)):
                if m.group(5):  # per optimizer step: spread over the floor command's accumulation, under the
                    # op timer's name ("fp8 quantize (weights, per step)" is timed as "fp8 quantize")
                    per_step[m.group(1).split(" (")[0]] = per_step.get(m.group(1).split(" (")[0], 0.0) + float(m.group(4))
                else:
                    floor[m.group(1)] = float(m.group(4))
                continue
            in_memory = False
        if line.startswith("best per micro-batch under the op timer's names:"):
            for name, ms in re.findall(r"  ([a-z][a-z ]*?) ([\d.]+) ms", line.split(":", 1)[1]):
                floor[name] = float(ms)
        elif (m := ATTENTION.search(line)):
            fwd, calls, bwd, layers = float(m.group(1)), int(m.group(2)), float(m.group(3)), int(m.group(4))
            floor["attention fwd"] = fwd * layers
            floor["attention bwd"] = bwd * layers
            if calls > 1:  # the recompute's forward again: the op timer counts it under "recompute"
                floor["recompute"] = fwd * (calls - 1) * layers
    ga = max(1, summary.get("grad_accumulation", 1))
    if not per_step and summary.get("optimizer_ms_per_step"):  # (an output without the per-step lines)
        per_step["optimizer"] = summary["optimizer_ms_per_step"]
    for name, ms in per_step.items():
        floor[name] = floor.get(name, 0.0) + ms / ga
    return {"floor": floor, "summary": summary}


def compare(timer: dict, floor: dict, timer_ga: int) -> list:
    """Rows (family, measured ms per micro-batch, floor ms or None), measured families first by time."""
    per_mb = {k: v / timer_ga for k, v in timer.items()}
    rows = []
    skip = {"sum of ops", "step span", "idle or untimed"}
    for k in sorted((k for k in per_mb if k not in skip), key=lambda k: -per_mb[k]):
        rows.append((k, per_mb[k], floor.get(k)))
    for k in sorted(set(floor) - set(per_mb)):
        rows.append((k, None, floor[k]))  # a floor with no timed family of that name
    rows.append(("idle or untimed", per_mb["idle or untimed"], None))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("train_out")
    ap.add_argument("floor_out")
    ap.add_argument("--timer-ga", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    try:
        timer = parse_timer(open(a.train_out, encoding="utf-8", errors="replace").read())
        fl = parse_floor(open(a.floor_out, encoding="utf-8").read())
    except (OSError, ValueError, json.JSONDecodeError, IndexError) as e:
        print(f"floor_vs_timer.py: {e}", file=sys.stderr)
        return 1
    ga = a.timer_ga or fl["summary"].get("grad_accumulation", 1)
    rows = compare(timer, fl["floor"], ga)
    if a.json:
        print(json.dumps([{"family": f, "measured_ms": m, "floor_ms": fm} for f, m, fm in rows]))
        return 0
    s = fl["summary"]
    print(f"{s.get('model')} batch {s.get('batch')} x seq {s.get('seq')}: ms per micro-batch "
          f"(op timer over accumulation {ga}; floor from step_floor_bench)")
    print(f"{'family':<24} {'measured':>10} {'floor':>10} {'x floor':>8}")
    tm = tf = 0.0
    for f, m, fm in rows:
        ratio = f"{m / fm:8.2f}" if m is not None and fm else ""
        print(f"{f:<24} {'' if m is None else f'{m:10.2f}':>10} {'' if fm is None else f'{fm:10.2f}':>10} {ratio:>8}")
        tm += m or 0.0
        tf += fm or 0.0
    print(f"{'total':<24} {tm:10.2f} {tf:10.2f} {tm / tf if tf else 0:8.2f}")
    print(f"(step span {timer['step span'] / ga:.2f} ms a micro-batch; side-stream scopes overlap the compute stream's)")
    if s.get("sustained_ms"):  # step_floor_bench --sustain: the GEMMs and attention held in sequence for seconds
        burst = s["gemm_ms_best"] + s["attention_ms"]
        held = tf - burst + s["sustained_ms"]
        print(f"GEMMs + attention held in sequence (--sustain): {s['sustained_ms']:.2f} ms against their "
              f"{burst:.2f} ms timed alone (x{s['sustained_ms'] / burst:.3f}; SM {s.get('sustained_sm_mhz')} MHz, "
              f"{s.get('sustained_w')} W): the floor a long run holds is {held:.2f} ms, measured x{tm / held:.2f} of it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
