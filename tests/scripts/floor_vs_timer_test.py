#!/usr/bin/env python3
"""ctest FloorVsTimer: bench/floor_vs_timer.py against step_floor_bench's real outputs (the 2x LoRA row's and the 14B
FP8 row's, H200, session 25: tests/scripts/data/) and an op-timer table in train's format: the floor's
families sum to the bench's own floor (652.00 ms a micro-batch), the op timer's ms per step are divided by the
accumulation, and a missing or cut-off table is an error naming what to do."""
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

SRC = Path(sys.argv.pop(1)) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2]
sys.path.insert(0, str(SRC / "bench"))
import floor_vs_timer as fvt  # noqa: E402

FLOOR = (SRC / "tests/scripts/data/step_floor_bench_lora7b.out").read_text()
TABLE = """[T] step     3 [  0.2%] | time:   869 ms
[Time breakdown] GPU ms per step by op family (own time: nested scopes on the same stream are their own families)
  attention bwd             126.200 ms    7.3%
  fp8 quantize               90.000 ms    5.2%
  gemm fwd                  436.000 ms   25.2%
  lora gemm                 240.000 ms   13.9%
  sum of ops                892.200 ms  (side-stream scopes overlap the compute stream's)
  step span                1720.000 ms  (first scope's start to last scope's end)
  idle or untimed            24.000 ms    1.4% of the span (no timed op running on any stream)
[Setup] model exported in 60.0 s
"""


class FloorVsTimer(unittest.TestCase):
    def test_floor_families_sum_to_the_benchs_floor(self):
        fl = fvt.parse_floor(FLOOR)
        self.assertAlmostEqual(sum(fl["floor"].values()), 652.00, delta=0.05)  # its "652.00 ms = at most 37693"
        self.assertAlmostEqual(fl["floor"]["gemm fwd"], 213.34)
        self.assertAlmostEqual(fl["floor"]["attention bwd"], 2.239 * 28)
        self.assertAlmostEqual(fl["floor"]["fp8 quantize"], 30.042)
        self.assertNotIn("fwd lm head", fl["floor"])  # a GEMM's own line is not a family

    def test_per_step_lines_spread_over_the_accumulation(self):
        # the 14B FP8 row (offloaded optimizer, FP8 weights quantised once a step; H200, session 25)
        fl = fvt.parse_floor((SRC / "tests/scripts/data/step_floor_bench_14b_fp8.out").read_text())
        self.assertAlmostEqual(sum(fl["floor"].values()), 646.15, delta=0.05)  # its "646.15 ms = at most 12678"
        self.assertAlmostEqual(fl["floor"]["optimizer"], 2157.508 / 32)
        self.assertAlmostEqual(fl["floor"]["fp8 quantize"], 21.934 + 9.812 / 32)  # timed under one name

    def test_recomputed_attention_forward_is_the_recompute_family(self):
        fl = fvt.parse_floor(FLOOR.replace("forward 0.609 ms (x1)", "forward 0.609 ms (x2)"))
        self.assertAlmostEqual(fl["floor"]["attention fwd"], 0.609 * 28)
        self.assertAlmostEqual(fl["floor"]["recompute"], 0.609 * 28)

    def test_timer_per_step_divided_by_the_accumulation(self):
        rows = {f: (m, fm) for f, m, fm in fvt.compare(fvt.parse_timer(TABLE), fvt.parse_floor(FLOOR)["floor"], 2)}
        self.assertAlmostEqual(rows["gemm fwd"][0], 218.0)
        self.assertAlmostEqual(rows["gemm fwd"][1], 213.34)
        self.assertIsNone(rows["lora gemm"][1])      # no floor for the adapters here
        self.assertIsNone(rows["rope"][0])           # a floor with no timed family
        self.assertAlmostEqual(rows["idle or untimed"][0], 12.0)

    def run_script(self, table: str, *extra):
        with tempfile.TemporaryDirectory() as d:
            t, f = Path(d) / "train.out", Path(d) / "floor.out"
            t.write_text(table)
            f.write_text(FLOOR)
            return subprocess.run([sys.executable, str(SRC / "bench/floor_vs_timer.py"), str(t), str(f), *extra],
                                  capture_output=True, text=True)

    def test_the_table_and_its_errors(self):
        r = self.run_script(TABLE, "--timer-ga", "2")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("gemm fwd", r.stdout)
        self.assertIn("1.02", r.stdout)  # 218 / 213.34
        self.assertNotIn("held in sequence", r.stdout)  # an output without --sustain
        # with --sustain (session 26): the GEMMs and attention held in sequence take the burst sum's place
        # (this floor's 452.0 + 79.74 ms of GEMMs and attention; the whole floor is 652.00 ms)
        global FLOOR
        plain = FLOOR
        head, last = FLOOR.rstrip("\n").rsplit("\n", 1)
        FLOOR = head + "\n" + last[:-1] + ', "sustained_ms": 584.90, "sustained_sm_mhz": 1710, "sustained_w": 699}\n'
        try:
            r = self.run_script(TABLE, "--timer-ga", "2")
        finally:
            FLOOR = plain
        self.assertEqual(r.returncode, 0, r.stderr)
        fl = fvt.parse_floor(plain)
        burst = fl["summary"]["gemm_ms_best"] + fl["summary"]["attention_ms"]
        whole = sum(fl["floor"].values())  # 652.00
        self.assertIn(f"against their {burst:.2f} ms timed alone (x{584.90 / burst:.3f}; SM 1710 MHz, 699 W)", r.stdout)
        self.assertIn(f"the floor a long run holds is {whole - burst + 584.90:.2f} ms", r.stdout)
        r = self.run_script("[T] step 1\n")
        self.assertEqual(r.returncode, 1)
        self.assertIn("QTRAIN_TIME_BREAKDOWN=1", r.stderr)
        r = self.run_script(TABLE.split("  idle or untimed")[0])
        self.assertEqual(r.returncode, 1)
        self.assertIn("cut off", r.stderr)


if __name__ == "__main__":
    unittest.main()
