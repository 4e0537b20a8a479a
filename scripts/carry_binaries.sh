#!/usr/bin/env bash
# Builds here and copies the binaries the GPU checks run into build-carry/ (git-ignored, ~17 MB),
# so the device tool can carry them (carry: [".devdeps", "build-carry"]) instead of building there:
#   PREBUILT=build-carry scripts/gpu_check.sh tests ref5 ...
# The whole build/ folder is larger than the device tool's 64 MiB carry limit.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
mkdir -p build-carry/tests
cp build/train build/tokenize build/qtrain_dump build/qtrain_lora_dump build/attention_bench build/pinned_alloc_bench build/gemm_algo_bench build/overlap_bench build/comm_bench build/dp_step_bench build-carry/
cp build/tests/qtrain_gpu_tests build-carry/tests/
du -sh build-carry
