#!/usr/bin/env bash
# ctest BenchQtrainStops: bench/bench_qtrain.sh against a stand-in `train` that logs steps and then keeps
# running (as a real one does while it exports the HF model): by default the bench stops it after the
# timed steps and prints its JSON line; a `timeout` around the bench leaves no train behind (a survivor
# held the H200's memory in session 23); STOP_AFTER= (empty) waits for train to end by itself.
#   tests/scripts/bench_qtrain_stop_test.sh SOURCE_DIR
set -euo pipefail
src="${1:?usage: bench_qtrain_stop_test.sh SOURCE_DIR}"
tmp="$(mktemp -d)"
trap 'pkill -f "$tmp/bin/train" 2>/dev/null || true; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
mkdir -p "$tmp/bin" "$tmp/work"
# the stand-in: one step line a second; then it "exports" for $LINGER seconds
cat > "$tmp/bin/train" <<'SH'
#!/usr/bin/env bash
for a in "$@"; do case $a in --log-file=*) log=${a#--log-file=} ;; --steps=*) steps=${a#--steps=} ;; esac; done
echo '{"log": "allocator", "stats": [{"device": 1073741824}]}' > "$log"
echo '{"log": "sol", "flops_per_token": 1000}' >> "$log"
for ((i = 1; i <= steps; ++i)); do
  sleep 0.3
  echo '{"log": "step", "step_tokens": 1000, "duration_ms": 10, "loss": 1.5}' >> "$log"
done
# with the op timer on, its table comes a while after the steps (as train's finish() prints it)
if [ -n "${QTRAIN_TIME_BREAKDOWN:-}" ] && [ "$QTRAIN_TIME_BREAKDOWN" != 0 ]; then
  sleep 1.5; printf '[Time breakdown] GPU ms per step\n  gemm fwd  1.0 ms\n  idle or untimed  0.0 ms\n'
fi
sleep "${LINGER:-60}"
SH
chmod +x "$tmp/bin/train"
: > "$tmp/tokens.bin"
run() { BUILD_DIR="$tmp/bin" BENCH_DIR="$tmp/work" TOKENS="$tmp/tokens.bin" SKIP=0 "$@"; }
alive() { pgrep -f "$tmp/bin/train" >/dev/null; }

# 1. the default: stopped after STEPS steps, JSON printed, exit 0, nothing left running
start=$(date +%s)
out=$(run env STEPS=3 "$src/bench/bench_qtrain.sh" M 1 2>/dev/null) || fail "default run exited $?"
[ $(( $(date +%s) - start )) -lt 30 ] || fail "the bench waited for train's export"
echo "$out" | grep -q '"tokens_per_s": 100000' || fail "no JSON line with the steps' rate: $out"
sleep 0.5
alive && fail "train still running after the bench returned"

# 2. a timeout around the bench takes train with it
set +e
run env STEPS=100 timeout 2 "$src/bench/bench_qtrain.sh" M 1 >/dev/null 2>&1
rc=$?
set -e
[ $rc -eq 124 ] || fail "timeout gave exit $rc, expected 124"
sleep 0.5
alive && fail "train survived the timeout around the bench"

# 3. STOP_AFTER= (empty): the bench waits for train to end by itself
out=$(run env STEPS=2 STOP_AFTER= LINGER=1 "$src/bench/bench_qtrain.sh" M 1 2>/dev/null) || fail "run to the end exited $?"
echo "$out" | grep -q '"tokens_per_s"' || fail "no JSON line after a run to the end: $out"
# 4. FLOOR=1 runs no training: step_floor_bench gets the row's command (model, batch, seq, accumulation, the
# flags), its last line is printed and its whole output kept in floor.out
cat > "$tmp/bin/step_floor_bench" <<'SH'
#!/usr/bin/env bash
echo "table line"
echo "{\"args\": \"$*\"}"
SH
chmod +x "$tmp/bin/step_floor_bench"
out=$(run env FLOOR=1 GA=8 SEQ=2048 "$src/bench/bench_qtrain.sh" M 3 --extra-flag 2>/dev/null) || fail "FLOOR=1 exited $?"
for want in --model=M --batch-size=3 --seq-len=2048 --grad-accumulation=8 --extra-flag; do
  echo "$out" | grep -q -- "$want" || fail "FLOOR=1 did not pass $want: $out"
done
grep -q "table line" "$tmp/work/floor.out" || fail "floor.out lacks step_floor_bench's output"
alive && fail "FLOOR=1 started train"
# 5. QTRAIN_TIME_BREAKDOWN=1: the bench waits for the op timer's table (printed after the steps) before the
# stop, so train.out has it (session 24's breakdown runs lost it to the stop)
out=$(run env STEPS=2 QTRAIN_TIME_BREAKDOWN=1 "$src/bench/bench_qtrain.sh" M 1 2>/dev/null) || fail "breakdown run exited $?"
echo "$out" | grep -q '"tokens_per_s"' || fail "no JSON line after a breakdown run: $out"
grep -q "idle or untimed" "$tmp/work/train.out" || fail "the op timer's table was cut off: $(cat "$tmp/work/train.out")"
sleep 0.5
alive && fail "train still running after the breakdown run"
# 6. QTRAIN_TIME_BREAKDOWN=0 is the timer off (op_timer.cpp): no table comes, so the bench does not wait for one
start=$(date +%s)
out=$(run env STEPS=2 QTRAIN_TIME_BREAKDOWN=0 "$src/bench/bench_qtrain.sh" M 1 2>/dev/null) || fail "timer-off run exited $?"
[ $(( $(date +%s) - start )) -lt 30 ] || fail "the bench waited for a table with QTRAIN_TIME_BREAKDOWN=0"
# 7. nvidia-smi's samples: the peak memory, and the SM clock and power of the busy samples (>= half the highest
# power; the idle ones at the start and an unreadable field are left out)
cat > "$tmp/bin/nvidia-smi" <<'SH'
#!/usr/bin/env bash
case "$*" in *memory.used,clocks.sm,power.draw*) ;; *) exit 2 ;; esac
printf '600, 345, 70.10\n52000, 1980, 310.0\n61000, 1755, 690.5\n61000, 1740, 700.0\n60500, 1760, [N/A]\n61000, 1770, 650.0\n'
exec sleep 60
SH
chmod +x "$tmp/bin/nvidia-smi"
out=$(PATH="$tmp/bin:$PATH" run env STEPS=2 "$src/bench/bench_qtrain.sh" M 1 2>/dev/null) || fail "run with nvidia-smi exited $?"
echo "$out" | grep -q '"peak_mib": 61000' || fail "peak memory not the samples' highest: $out"
echo "$out" | grep -q '"sm_mhz": 1755, "power_w": 690' || fail "clock and power not the busy samples' medians: $out"
# 8. FLOOR_SUSTAIN: step_floor_bench gets --sustain first (it reads its own flags before train's)
out=$(run env FLOOR=1 FLOOR_SUSTAIN=20 "$src/bench/bench_qtrain.sh" M 3 2>/dev/null) || fail "FLOOR_SUSTAIN exited $?"
echo "$out" | grep -q '"args": "--sustain=20 --model=M' || fail "FLOOR_SUSTAIN did not pass --sustain first: $out"
echo "bench_qtrain.sh stops, times out, runs to the end and gives floors as documented"
