#!/usr/bin/env bash
# Builds qtrain on the GPU test machine, which has CUDA, cmake and ninja but no Debian dev packages:
# stage them first on a Debian machine with `../shared/gpu/stage-deps.sh libxxhash-dev` (into .devdeps,
# git-ignored; libxxhash-dev must be named: its xxhash.h is not in the script's default list, and the
# checkpoint checksums need it, header-only) and carry .devdeps along.
# Usage: scripts/gpu_build.sh [build-dir]   (default build-gpu)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build-gpu}
DEPS="$PWD/.devdeps/usr"
[ -d "$DEPS" ] || { echo "gpu_build.sh: $DEPS missing; run ../shared/gpu/stage-deps.sh libxxhash-dev first" >&2; exit 1; }
export PATH="/usr/local/cuda/bin:$PATH"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$DEPS" \
      -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90} >/dev/null
cmake --build "$BUILD_DIR" --parallel "$(nproc)"
echo "export LD_LIBRARY_PATH=$DEPS/lib/x86_64-linux-gnu:\${LD_LIBRARY_PATH:-}"
