#!/usr/bin/env bash
# Configures and builds qtrain into build/ (Release). Extra arguments go to cmake's configure step.
# The CUDA backend is built when nvcc is found (also in /usr/local/cuda/bin).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
BUILD_DIR=${BUILD_DIR:-build}
if [ ! -f "$BUILD_DIR/build.ninja" ] || [ $# -gt 0 ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
fi
cmake --build "$BUILD_DIR" --parallel "${JOBS:-$(nproc)}"
